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

fn main() {
    disable_transparent_huge_pages();
    raise_open_files_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| {
            eprintln!("store: starting the async runtime: {e}");
            std::process::exit(1);
        });
    runtime.block_on(run());
}

/// Ends the process with `code` without running exit handlers, as Go's
/// `os.Exit` (etcd's fatal log) does. The storage engine's background
/// threads may still run after a fatal storage error, and `exit` would run
/// C++ static destructors under them (RocksDB then aborts with `pthread
/// lock: Invalid argument`, SIGABRT instead of the exit status). Logs are
/// written unbuffered or line by line, so nothing is lost but stdout's
/// last partial line, flushed first. The data is as safe as after kill -9.
fn exit_now(code: i32) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit takes an integer and never returns.
    unsafe { libc::_exit(code) }
}

/// Opts the process out of transparent huge pages before anything
/// allocates much. mimalloc commits its arena up front, and where the
/// kernel backs such memory with 2 MiB pages (THP `always`, or `madvise`
/// as on this machine) every page touched takes 2 MiB: an idle member was
/// 82 MB resident, 55 MB of it huge pages, against 54 MB without them
/// (etcd 3.5.1: 28 MB). Failing only costs that memory, so it is ignored.
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes
    // a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime
/// does for every Go program since 1.19 (etcd included): the engine keeps
/// up to its table cache's worth of files open beside the Raft log, peers,
/// clients and watches, and a soft limit of 1024 (a login shell's default)
/// would fail them with `EMFILE` long before the hard limit. Failing
/// leaves the limit as it was.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

async fn run() {
    let parsed = match Config::from_args(std::env::args().collect()) {
        Ok(p) => p,
        Err(ArgsError::Flags(e)) => e.exit(),
        Err(ArgsError::Syntax(e)) => {
            // Go's flag package: the error, the usage, status 2.
            eprintln!("{e}");
            eprintln!("{}", store::etcd_flags::USAGE);
            std::process::exit(2);
        }
        Err(e @ (ArgsError::File(_) | ArgsError::Invalid(_))) => {
            eprintln!("store: failed to verify flags: {e}");
            std::process::exit(1);
        }
    };
    let config = parsed.config;
    if config.version {
        print!("{}", store::etcd_flags::version_text());
        return;
    }
    if let Err(e) = store::logging::init(&config.log_settings()) {
        eprintln!("store: failed to verify flags: {e}");
        std::process::exit(1);
    }
    if let Some(path) = &config.config_file {
        tracing::info!(path = %path.display(), "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided");
    }
    for warning in &parsed.deprecations {
        tracing::warn!("{warning}");
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
    let failed = tokio::select! {
        _ = wait_for_signal() => {
            tracing::info!("shutting down");
            false
        }
        reason = member.failed() => {
            // etcd's `failed to commit tx` / `failed to save Raft hard state
            // and entries` are fatal too: its supervisor restarts it.
            tracing::error!(error = %reason, "raft stopped on a storage error; exiting");
            true
        }
    };
    if failed {
        member.shutdown_failed().await;
        exit_now(1);
    }
    member.shutdown().await;
}
