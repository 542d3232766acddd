//! The `gateway` binary: parses flags, sets up logging and runs [`gateway::supervisor::run`].

use std::process::ExitCode;

use clap::Parser;
use gateway::cli::Cli;
use gateway::config::Config;
use gateway::supervisor::ConfigSource;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("GATEWAY_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let options = match cli.run_options() {
        Ok(options) => options,
        Err(error) => return fail(&error),
    };
    if cli.check_config {
        if let ConfigSource::File(path) = &options.source {
            if let Err(error) = Config::from_file(path) {
                return fail(&error);
            }
        }
        eprintln!("configuration is valid");
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.threads)
        .thread_name(gateway::cli::RELAY_THREAD_NAME)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => return fail(&error),
    };
    match runtime.block_on(gateway::supervisor::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error),
    }
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("gateway: {error}");
    ExitCode::FAILURE
}
