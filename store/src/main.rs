//! The `store` binary: an etcd-compatible member with etcd's flags.

use store::config::ArgsError;
use store::{Config, Member};

/// mimalloc instead of glibc's malloc (see docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[tokio::main]
async fn main() {
    let parsed = match Config::from_args(std::env::args().collect()) {
        Ok(p) => p,
        Err(ArgsError::Flags(e)) => e.exit(),
        Err(ArgsError::File(e)) => {
            eprintln!("store: failed to verify flags: {e}");
            std::process::exit(1);
        }
    };
    let config = parsed.config;
    if let Err(e) = store::logging::init(&config.log_settings()) {
        eprintln!("store: failed to verify flags: {e}");
        std::process::exit(1);
    }
    if let Some(path) = &config.config_file {
        tracing::info!(path = %path.display(), "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided");
    }
    if !parsed.ignored.is_empty() {
        tracing::warn!(flags = ?parsed.ignored, "ignoring etcd tuning flags that do not apply to this store");
    }
    if !parsed.unknown_keys.is_empty() {
        tracing::warn!(keys = ?parsed.unknown_keys, "ignoring config file keys etcd does not know");
    }
    let member = match Member::start(config).await {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "failed to start");
            eprintln!("store: {e:#}");
            std::process::exit(1);
        }
    };
    wait_for_signal().await;
    tracing::info!("shutting down");
    member.shutdown().await;
}
