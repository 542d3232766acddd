//! `bench`: load generator and comparison benchmarks for our etcd-API store
//! and L4 gateway against etcd 3.5 and HAProxy, all on loopback.
//!
//! Subcommands:
//! * `put`, `range`, `txn-put`, `txn-mixed`, `watch`, `lease-keepalive`: a
//!   load generator for any etcd-API endpoints (see [`load`], [`watch`]).
//! * `compare`: our 3-member cluster vs etcd 3.5, interleaved ([`compare`]).
//! * `failover`: kill -9 the leader under load ([`failover`]).
//! * `gateway`: direct vs our gateway vs HAProxy in front of nginx ([`gateway`]).
//! * `h2load`: raw gRPC from nghttp2's h2load, both systems ([`h2load`]).
//! * `apiserver`: a kube-apiserver-shaped workload ([`apiserver`]).
//! * `scale`: a large key space in both systems, then lists, snapshot,
//!   compaction, defragmentation and restarts ([`scale`]).
//! * `all`: every comparison, one report ([`all`]).
//!
//! Every run is bounded in operations and time, uses a printed seed, and
//! kills the processes it started on exit, panic or Ctrl-C ([`procs`]).

/// mimalloc instead of glibc's malloc: at 256 clients glibc's allocator
/// and its frees took ~9% of the generator's CPU, which on a small machine
/// the members under test share.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod all;
mod apiserver;
mod bins;
mod cli;
mod cluster;
mod compare;
mod failover;
mod gateway;
mod goals;
mod grpc_conn;
mod h2load;
mod https;
mod keys;
mod load;
mod pace;
mod plot;
mod procs;
mod report;
mod scale;
mod stats;
mod systems;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use cli::{Format, LoadArgs, DEFAULT_SEED};
use load::Workload;

#[derive(Parser, Debug)]
#[command(
    name = "bench",
    version,
    about = "Benchmarks for the store and gateway vs etcd 3.5 and HAProxy"
)]
struct Cli {
    /// Seed of every random choice (printed with the results).
    #[arg(long, global = true, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Do not draw progress bars.
    #[arg(long, global = true)]
    no_progress: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Put load.
    Put(LoadArgs),
    /// Single-key Range load over a pre-filled key space.
    Range(RangeArgs),
    /// Txns of --txn-ops Puts.
    TxnPut(TxnArgs),
    /// Read and write Txns mixed by --rw-ratio.
    TxnMixed(TxnMixedArgs),
    /// Watchers × events: delivery latency of every event to every watcher.
    Watch(WatchArgs),
    /// LeaseKeepAlive round trips, one lease per client.
    LeaseKeepalive(LoadArgs),
    /// Our 3-member cluster vs etcd 3.5, interleaved, with ratios.
    Compare(compare::CompareArgs),
    /// Kill -9 the leader under steady write load, for both systems.
    Failover(failover::FailoverArgs),
    /// Direct vs our gateway vs HAProxy in front of nginx HTTPS backends.
    Gateway(gateway::GatewayArgs),
    /// Raw gRPC load from h2load (an outside generator) on both systems.
    H2load(h2load::H2loadArgs),
    /// A kube-apiserver-shaped workload on both systems.
    Apiserver(apiserver::ApiserverArgs),
    /// Load N keys into each system, then restart, list, snapshot, compact and defrag, side by side.
    Scale(scale::ScaleArgs),
    /// compare + h2load + failover + gateway + apiserver into one report folder, opening with the goals table.
    All(all::AllArgs),
}

#[derive(Args, Debug)]
struct RangeArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// l = linearizable, s = serializable.
    #[arg(long, default_value = "l", value_parser = ["l", "s"])]
    consistency: String,
}

#[derive(Args, Debug)]
struct TxnArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Operations per transaction.
    #[arg(long, default_value_t = 1)]
    txn_ops: usize,
}

#[derive(Args, Debug)]
struct TxnMixedArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Operations per transaction.
    #[arg(long, default_value_t = 1)]
    txn_ops: usize,
    /// Read transactions per write transaction.
    #[arg(long, default_value_t = 1.0)]
    rw_ratio: f64,
}

#[derive(Args, Debug)]
struct WatchArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Watchers, all on the run's key prefix.
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// gRPC watch streams carrying the watchers.
    #[arg(long, default_value_t = 10)]
    streams: usize,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        procs::install_cleanup_handlers();
        let result = dispatch(cli).await;
        procs::kill_all();
        result
    })
}

async fn dispatch(cli: Cli) -> Result<()> {
    let progress = !cli.no_progress;
    let seed = cli.seed;
    eprintln!("bench: seed {seed}");
    let (args, workload) = match cli.cmd {
        Cmd::Compare(a) => return report::emit(&compare::run(&a, seed, progress).await?, &a.out),
        Cmd::Failover(a) => return report::emit(&failover::run(&a, seed, progress).await?, &a.out),
        Cmd::Gateway(a) => return report::emit(&gateway::run(&a, seed, progress).await?, &a.out),
        Cmd::H2load(a) => return report::emit(&h2load::run(&a).await?, &a.out),
        Cmd::Apiserver(a) => {
            return report::emit(&apiserver::run(&a, seed, progress).await?, &a.out)
        }
        Cmd::Scale(a) => {
            return report::emit(&scale::run(&a, seed, progress).await?, &a.out_args())
        }
        Cmd::All(a) => return all::run(&a, seed, progress).await,
        Cmd::Put(a) => (a, Workload::Put),
        Cmd::Range(a) => (
            a.load,
            Workload::Range {
                serializable: a.consistency == "s",
            },
        ),
        Cmd::TxnPut(a) => (a.load, Workload::TxnPut { ops: a.txn_ops }),
        Cmd::TxnMixed(a) => (
            a.load,
            Workload::TxnMixed {
                ops: a.txn_ops,
                rw_ratio: a.rw_ratio,
            },
        ),
        Cmd::Watch(a) => (
            a.load,
            Workload::Watch {
                watchers: a.watchers,
                streams: a.streams,
            },
        ),
        Cmd::LeaseKeepalive(a) => (a, Workload::LeaseKeepalive),
    };
    run_load(&args, &workload, seed, progress).await
}

async fn run_load(args: &LoadArgs, workload: &Workload, seed: u64, progress: bool) -> Result<()> {
    let cfg = args.config(seed, progress)?;
    eprintln!("bench: {} against {}", workload.name(), cfg.target);
    let result = load::run(&cfg, workload).await?;
    match args.output {
        Format::Text => print!("{}", result.to_text()),
        Format::Json => cli::print_json(&result)?,
    }
    if let Some(path) = &args.json_out {
        cli::write_json(path, &result)?;
    }
    Ok(())
}
