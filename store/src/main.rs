//! The `store` binary: an etcd-compatible member with etcd's flags.

use store::{Config, Member};
use tracing_subscriber::EnvFilter;

fn init_logging(level: &str) {
    let level = match level {
        "panic" | "fatal" => "error",
        other => other,
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},openraft=warn")));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

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
    let (config, ignored) = match Config::from_args(std::env::args().collect()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    init_logging(&config.log_level);
    if !ignored.is_empty() {
        tracing::warn!(flags = ?ignored, "ignoring etcd tuning flags that do not apply to this store");
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
