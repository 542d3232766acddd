//! The `gateway` binary: parses flags, sets up logging and runs [`gateway::supervisor::run`].

use std::process::ExitCode;

use clap::Parser;
use gateway::affinity;
use gateway::cli::Cli;
use gateway::config::Config;
use gateway::relays::{current_thread_runtime, relay_runtime, RelayPool, RelayThreads};
use gateway::supervisor::{self, ConfigSource, RunOptions};
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
    let result = if cli.threads == 1 {
        run_on_one_thread(options)
    } else {
        run_with_relay_threads(options, cli.threads, cli.cpu_affinity)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(&error),
    }
}

/// Everything on one relay thread (see `gateway::relays`).
fn run_on_one_thread(options: RunOptions) -> Result<(), String> {
    let thread = std::thread::Builder::new()
        .name(gateway::relays::RELAY_THREAD_NAME.to_string())
        .spawn(move || {
            let runtime = relay_runtime().map_err(|error| error.to_string())?;
            runtime
                .block_on(supervisor::run(options, RelayPool::local()))
                .map_err(|error| error.to_string())
        })
        .map_err(|error| format!("cannot start the relay thread: {error}"))?;
    thread
        .join()
        .unwrap_or_else(|_| Err("the relay thread panicked".to_string()))
}

/// The supervisor on this thread, connections on `threads` relay threads placed by `mode`.
fn run_with_relay_threads(
    options: RunOptions,
    threads: usize,
    mode: affinity::Mode,
) -> Result<(), String> {
    let runtime = current_thread_runtime().map_err(|error| error.to_string())?;
    let cpus = relay_cpus(mode, threads);
    let (relays, running) = RelayThreads::start(&cpus)
        .map_err(|error| format!("cannot start the relay threads: {error}"))?;
    let result = runtime.block_on(supervisor::run(options, relays));
    running.stop();
    result.map_err(|error| error.to_string())
}

/// Where each relay thread runs ([`affinity::plan`] over the CPUs this process may use).
fn relay_cpus(mode: affinity::Mode, threads: usize) -> Vec<Option<usize>> {
    let allowed = match affinity::allowed_cpus() {
        Ok(allowed) => allowed,
        Err(error) => {
            tracing::warn!(%error, "cannot read the CPU affinity; relay threads run unpinned");
            return vec![None; threads];
        }
    };
    let cpus = affinity::plan(mode, threads, &allowed);
    if cpus.iter().all(Option::is_some) {
        tracing::info!(?allowed, "relay threads pinned one per CPU");
    } else {
        tracing::info!(
            threads,
            allowed = allowed.len(),
            ?mode,
            "relay threads unpinned (pinned only with one per allowed CPU and --cpu-affinity auto)"
        );
    }
    cpus
}

fn fail(error: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("gateway: {error}");
    ExitCode::FAILURE
}
