//! `scale`: a large key space in each system, then the operations whose
//! cost grows with it, side by side.
//!
//! The systems run one after the other (ours, then etcd), each as a fresh
//! 3-member cluster that is killed before the other starts, so that neither
//! shares the machine with the other. On each, in order:
//!
//! 1. load: `--keys` Puts of distinct keys ([`KEY_SIZE`] bytes under
//!    [`KEY_PREFIX`]) with `--value-size`-byte values, from `--clients`
//!    closed-loop writers over [`crate::load::connect`] connections spread
//!    over the members. Values are random bytes from the run's seeded RNG:
//!    RocksDB compresses its blocks and bbolt does not, so repetitive values
//!    would flatter our sizes. Rate, put p50/p99.
//! 2. sizes after load: each member's data directory (the sum of its file
//!    lengths, so etcd's preallocated 64 MiB WAL segments count in full) and
//!    the leader's Status `dbSize` and `dbSizeInUse`.
//! 3. full list: one linearizable Range over the whole key space from the
//!    leader, on a connection whose client accepts answers up to
//!    [`MAX_ANSWER_BYTES`] (both servers send up to 2 GiB). Time, answer
//!    bytes (sum of key and value lengths), and the leader's RSS before and
//!    at its peak, sampled every [`RSS_SAMPLE_INTERVAL`] by a thread of its
//!    own during the call: growth and growth per answer byte. (A process
//!    that keeps freed memory, as Go's runtime does for a while, starts a
//!    later list from a higher RSS and shows less growth: compare the peaks.)
//!    Before it, the same keys through one RangeStream (etcd 3.7; etcd 3.5
//!    has none), each chunk dropped once counted: time and the leader's RSS
//!    growth, which a chunk or two should bound (first, so that memory the
//!    list freed and the process kept does not hide it).
//! 4. paginated list, as kube-apiserver lists: pages of [`PAGE_LIMIT`] keys,
//!    each next page from the last key + `"\0"`, every page after the first at
//!    the first page's revision, until `more` is false. Time and pages.
//! 5. count only: one `count_only` Range over the whole key space.
//! 6. snapshot save: the leader's Maintenance Snapshot stream into a
//!    temporary file, fsynced at the end. Time and bytes.
//! 7. compaction and defragmentation under a paced writer: open-loop Puts
//!    at `--paced-rate` of random existing keys from [`PACED_WRITERS`]
//!    writers; after [`PACED_BEFORE`] a physical Compact at the current
//!    revision, then Defragment of each member in turn; the writer goes on for
//!    [`PACED_AFTER`]. The writes' latencies (from their intended start, so
//!    stalls count in full) split by intended start into steady (before the
//!    Compact), during maintenance, and after; compaction and per-member
//!    defragmentation times. Then the members' data directories again.
//! 8. full list after compaction: step 3 again.
//! 9. restart one follower: SIGKILL it, start it again with the same
//!    command line and data directory, and time from the spawn until a
//!    linearizable Get through its own endpoint succeeds (probed every
//!    [`RESTART_POLL`], each probe bounded by [`PROBE_TIMEOUT`]).
//! 10. restart all: SIGKILL all three, start all three, and time from the
//!     first spawn until a linearizable Get succeeds through every member.
//! 11. learner join: MemberAdd of a learner, start it with an empty data
//!     directory (`--initial-cluster-state existing`), and time from the
//!     MemberAdd until a MemberPromote succeeds (both systems refuse it
//!     until the learner has caught up, from a snapshot of everything), then
//!     until a linearizable Get through it succeeds.
//!
//! `--system` runs one system only (its column alone, no ratio).
//!
//! Every step is bounded in time (the lists and the count by
//! `--list-timeout`, the others by the constants below). A step that fails or
//! runs out of time is reported in its row ("did not finish in 600 s") and
//! the run goes on with the next.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use etcd_client::{Client, CompactionOptions, GetOptions, KvClient};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::cluster::{control_client, leader_endpoint, Cluster, ClusterSpec, MEMBERS};
use crate::grpc_conn::connect_one;
use crate::keys::{client_rng, key_with_prefix, prefix_end, KeyGen};
use crate::load::{CONNECT_TIMEOUT, OP_TIMEOUT};
use crate::pace::{Pacer, Stop};
use crate::plot::{line_chart, Chart, Series};
use crate::report::{fmt_ratio, image, ratio, table, text_table, OutArgs, Outcome};
use crate::stats::{OpResult, Recorder};
use crate::systems::SystemArgs;

/// Default subnet of `scale`.
pub const DEFAULT_SUBNET: &str = "127.0.57";
/// Default keys loaded.
pub const DEFAULT_KEYS: u64 = 1_000_000;
/// Default value size, in bytes.
pub const DEFAULT_VALUE_SIZE: usize = 1024;
/// Default concurrent writers of the load.
pub const DEFAULT_CLIENTS: usize = 256;
/// Default rate of the paced writer, in Puts per second.
pub const DEFAULT_PACED_RATE: f64 = 200.0;
/// Default bound of each list and of the count.
pub const DEFAULT_LIST_TIMEOUT: &str = "600s";
/// Smoke mode: keys, value size (bytes), writers, paced writes per second,
/// paced writer time before and after the maintenance, list bound.
const SMOKE_KEYS: u64 = 20_000;
const SMOKE_VALUE_SIZE: usize = 256;
const SMOKE_CLIENTS: usize = 16;
const SMOKE_PACED_RATE: f64 = 50.0;
const SMOKE_PACED_BEFORE: Duration = Duration::from_secs(1);
const SMOKE_PACED_AFTER: Duration = Duration::from_secs(1);
const SMOKE_LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// Prefix of every key of the run.
pub const KEY_PREFIX: &str = "scale/";
/// Key size in bytes (prefix and zero-padded number).
pub const KEY_SIZE: usize = 32;
/// Load writers per gRPC connection.
const CLIENTS_PER_CONN: usize = 16;
/// Longest the load may issue Puts (each is bounded by [`OP_TIMEOUT`] on top).
const LOAD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Failed load Puts after which the writers stop and the load step fails:
/// the key space is then not the one the later steps are meant to measure,
/// and its rate not a rate of writes. A system past its quota answers every
/// Put with NOSPACE (etcd past its 2 GiB default spent 11 minutes answering
/// 6.4M of them, and the report showed their rate beside the keys written).
const MAX_LOAD_FAILURES: u64 = 1_000;
/// Bound of the size measurements (directory walks and a Status).
const SIZES_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest Range answer the list client accepts, in bytes (4 GiB; gRPC's
/// length prefix cannot say more).
pub const MAX_ANSWER_BYTES: usize = 4 << 30;
/// Interval of the leader's RSS samples during a full list.
pub const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(50);
/// Keys per page of the paginated list (kube-apiserver's default page).
pub const PAGE_LIMIT: i64 = 500;
/// Bound of the snapshot save.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Steady state of the paced writer before the Compact, and its run after the
/// last Defragment.
/// Ten seconds before give the steady p99 2,000 writes at the default rate
/// (three seconds gave 600, the p99 their sixth slowest).
pub const PACED_BEFORE: Duration = Duration::from_secs(10);
pub const PACED_AFTER: Duration = Duration::from_secs(3);
/// Width of the buckets of the paced writer's timeline.
pub const PACED_BUCKET: Duration = Duration::from_secs(1);
/// Width of one point of the load's timeline.
pub const LOAD_BUCKET: Duration = Duration::from_secs(10);
/// Slowest paced writes kept with their start times.
const SLOWEST_KEPT: usize = 10;
/// Failed probes of a promoted learner kept with their errors.
const FAILED_PROBES_KEPT: usize = 5;
/// Writers (and connections, one per member) of the paced writer.
pub const PACED_WRITERS: usize = 16;
const PACED_CONNS: usize = MEMBERS;
/// Bound of the physical Compact.
const COMPACT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Bound of each member's Defragment.
const DEFRAG_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Bound of a restart: from the spawn until the members answer.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound of the learner join (MemberAdd until promoted and serving).
const LEARNER_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Interval of the readiness probes after a restart.
pub const RESTART_POLL: Duration = Duration::from_millis(20);
/// Bound of one readiness probe (connect and linearizable Get).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Tick of the spinner naming the running step.
const SPINNER_TICK: Duration = Duration::from_millis(200);
/// Longest error message shown in a table cell, in characters (the JSON
/// keeps all of it).
const MAX_CELL_CHARS: usize = 60;
/// Bytes per MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// Groups of steps `--steps` can choose (the load always runs).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepGroup {
    /// Sizes after the load.
    Sizes,
    /// Full list, paginated list, count only.
    Lists,
    /// Snapshot save.
    Snapshot,
    /// Compaction and defrag under the paced writer, sizes and full list after.
    Maintenance,
    /// Restart one follower, then all.
    Restart,
    /// A learner from nothing until promoted.
    Learner,
}

impl StepGroup {
    const ALL: [StepGroup; 6] = [
        StepGroup::Sizes,
        StepGroup::Lists,
        StepGroup::Snapshot,
        StepGroup::Maintenance,
        StepGroup::Restart,
        StepGroup::Learner,
    ];
}

/// Which systems `bench scale` runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Both,
    /// Our store only.
    Ours,
    Etcd,
}

/// Options of `bench scale`.
#[derive(Args, Clone, Debug)]
pub struct ScaleArgs {
    #[command(flatten)]
    pub systems: SystemArgs,
    /// Run both systems, or one of them only.
    #[arg(long = "system", value_enum, default_value_t = Which::Both)]
    pub which: Which,
    /// Run only these groups of steps after the load (comma-separated; default all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub steps: Vec<StepGroup>,
    /// Keys to load into each system.
    #[arg(long, default_value_t = DEFAULT_KEYS)]
    pub keys: u64,
    /// Value size in bytes (random bytes).
    #[arg(long, default_value_t = DEFAULT_VALUE_SIZE)]
    pub value_size: usize,
    /// Concurrent writers of the load.
    #[arg(long, default_value_t = DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Puts per second of the writer running during compaction and defragmentation (open loop).
    #[arg(long, default_value_t = DEFAULT_PACED_RATE)]
    pub paced_rate: f64,
    /// Bound of each full list, the paginated list and the count.
    #[arg(long, default_value = DEFAULT_LIST_TIMEOUT, value_parser = crate::cli::parse_duration)]
    pub list_timeout: Duration,
    /// Tiny run (CI): 20,000 keys of 256 bytes, 16 writers, paced writer 50/s, lists bounded by 60 s.
    #[arg(long)]
    pub smoke: bool,
    /// Drop the kernel's page cache after each restart step's kill -9 (needs root), so the
    /// restarted members read their files from disk, as after a node's reboot.
    #[arg(long)]
    pub cold_restart: bool,
    /// Same as --report: write report.md and results.json into this folder.
    #[arg(long = "out", value_name = "DIR", conflicts_with = "report")]
    pub out_dir: Option<PathBuf>,
    #[command(flatten)]
    pub out: OutArgs,
}

impl ScaleArgs {
    /// The output options, `--out` standing for `--report`.
    pub fn out_args(&self) -> OutArgs {
        let mut out = self.out.clone();
        if let Some(dir) = &self.out_dir {
            out.report = Some(dir.clone());
        }
        out
    }
}

/// The result of one step, or why it has none.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step<T> {
    Ok(T),
    Failed(String),
    /// Left out by `--steps`.
    Skipped,
}

impl<T> From<Result<T>> for Step<T> {
    fn from(r: Result<T>) -> Self {
        match r {
            Ok(t) => Step::Ok(t),
            Err(e) => Step::Failed(format!("{e:#}")),
        }
    }
}

/// Step 1.
#[derive(Clone, Debug, Serialize)]
pub struct LoadStep {
    pub keys_written: u64,
    pub elapsed_s: f64,
    pub puts: OpResult,
    /// Per [`LOAD_BUCKET`] of intended starts: (bucket start s, p99 ms,
    /// max ms), to tell a latency that creeps up with the data's size from
    /// one held up by periodic stalls.
    pub timeline: Vec<(f64, f64, f64)>,
}

/// Steps 2 and 7 (after the defragmentation).
#[derive(Clone, Debug, Serialize)]
pub struct Sizes {
    /// Each member's data directory, in member order, in bytes.
    pub data_dir_bytes: Vec<u64>,
    pub leader: String,
    pub db_size_bytes: i64,
    pub db_size_in_use_bytes: i64,
}

/// Steps 3 and 8.
#[derive(Clone, Debug, Serialize)]
pub struct ListStep {
    pub leader: String,
    pub seconds: f64,
    pub keys: u64,
    pub answer_bytes: u64,
    pub rss_before_kib: u64,
    pub rss_peak_kib: u64,
    pub rss_growth_kib: u64,
    /// RSS growth per byte of answer.
    pub growth_per_answer_byte: f64,
}

/// Step 4.
#[derive(Clone, Debug, Serialize)]
pub struct PagedStep {
    pub seconds: f64,
    pub pages: u64,
    pub keys: u64,
}

/// Step 5.
#[derive(Clone, Debug, Serialize)]
pub struct CountStep {
    pub ms: f64,
    pub count: i64,
}

/// Step 6.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotStep {
    pub seconds: f64,
    pub bytes: u64,
}

/// Step 7.
#[derive(Clone, Debug, Serialize)]
pub struct MaintenanceStep {
    pub compacted_revision: i64,
    pub compaction_ms: f64,
    /// Each member's Defragment, in member order.
    pub defrag_ms: Vec<f64>,
    /// Paced writes meant to start before the Compact.
    pub steady: OpResult,
    /// Paced writes meant to start from the Compact to the last Defragment's end.
    pub during: OpResult,
    /// Paced writes meant to start after it.
    pub after: OpResult,
    /// What the maintenance did when, in seconds since the writer started:
    /// ("compact", start, end), ("defrag m1", start, end), ...
    pub events: Vec<(String, f64, f64)>,
    /// The [`SLOWEST_KEPT`] slowest writes: (intended start in seconds
    /// since the writer started, latency ms), slowest first, to line stalls
    /// up with `events`.
    pub slowest: Vec<(f64, f64)>,
    /// Per [`PACED_BUCKET`] of intended starts: (bucket start s, p99 ms,
    /// max ms) of its successful writes.
    pub timeline: Vec<(f64, f64, f64)>,
}

impl MaintenanceStep {
    /// The maintenance's timeline: "compact 10.0-21.5 s, defrag m1 ...".
    fn event_list(&self) -> String {
        let events: Vec<String> = self
            .events
            .iter()
            .map(|(what, from, to)| format!("{what} {from:.1}-{to:.1} s"))
            .collect();
        events.join(", ")
    }
}

/// Steps 9 and 10.
#[derive(Clone, Debug, Serialize)]
pub struct RestartStep {
    /// The members restarted.
    pub members: Vec<String>,
    /// From the (first) spawn until each answered, in the order of `members`.
    pub ready_ms: Vec<f64>,
    /// The longest of them.
    pub ms: f64,
}

/// Step 11.
#[derive(Clone, Debug, Serialize)]
pub struct JoinStep {
    pub learner: String,
    /// From the MemberAdd until a MemberPromote succeeded.
    pub promoted_ms: f64,
    /// From the MemberAdd until a linearizable Get through it succeeded.
    pub serving_ms: f64,
    /// The learner's data directory once promoted, in bytes.
    pub data_dir_bytes: u64,
    /// The first [`FAILED_PROBES_KEPT`] failed Gets after the promotion:
    /// (ms since the promotion, error).
    pub failed_probes: Vec<(f64, String)>,
}

/// Every step on one system.
#[derive(Clone, Debug, Serialize)]
pub struct SystemRun {
    pub system: String,
    pub load: Step<LoadStep>,
    pub sizes_after_load: Step<Sizes>,
    pub full_list: Step<ListStep>,
    pub streamed_list: Step<ListStep>,
    pub paginated_list: Step<PagedStep>,
    pub count_only: Step<CountStep>,
    pub snapshot: Step<SnapshotStep>,
    pub maintenance: Step<MaintenanceStep>,
    pub sizes_after_defrag: Step<Sizes>,
    pub full_list_after_compaction: Step<ListStep>,
    pub restart_follower: Step<RestartStep>,
    pub restart_all: Step<RestartStep>,
    pub learner_join: Step<JoinStep>,
}

/// Both systems.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleOutcome {
    pub seed: u64,
    pub keys: u64,
    pub value_size: usize,
    pub clients: usize,
    pub paced_rate: f64,
    pub paced_before_s: f64,
    pub paced_after_s: f64,
    pub list_timeout_s: f64,
    /// Whether the page cache was dropped before each restart.
    pub cold_restart: bool,
    pub ours_bin: String,
    pub etcd_bin: String,
    /// Ours, then etcd.
    pub systems: Vec<SystemRun>,
}

struct Plan {
    keys: u64,
    value_size: usize,
    clients: usize,
    paced_rate: f64,
    paced_before: Duration,
    paced_after: Duration,
    list_timeout: Duration,
    seed: u64,
    progress: bool,
    steps: Vec<StepGroup>,
    cold_restart: bool,
}

impl Plan {
    fn runs(&self, group: StepGroup) -> bool {
        self.steps.contains(&group)
    }

    fn new(args: &ScaleArgs, seed: u64, progress: bool) -> Plan {
        let steps = if args.steps.is_empty() {
            StepGroup::ALL.to_vec()
        } else {
            args.steps.clone()
        };
        if args.smoke {
            return Plan {
                keys: SMOKE_KEYS,
                value_size: SMOKE_VALUE_SIZE,
                clients: SMOKE_CLIENTS,
                paced_rate: SMOKE_PACED_RATE,
                paced_before: SMOKE_PACED_BEFORE,
                paced_after: SMOKE_PACED_AFTER,
                list_timeout: SMOKE_LIST_TIMEOUT,
                seed,
                progress,
                steps,
                cold_restart: args.cold_restart,
            };
        }
        Plan {
            keys: args.keys.max(1),
            value_size: args.value_size,
            clients: args.clients.max(1),
            paced_rate: args.paced_rate,
            paced_before: PACED_BEFORE,
            paced_after: PACED_AFTER,
            list_timeout: args.list_timeout,
            seed,
            progress,
            steps,
            cold_restart: args.cold_restart,
        }
    }
}

/// Runs every step on ours, then on etcd.
pub async fn run(args: &ScaleArgs, seed: u64, progress: bool) -> Result<ScaleOutcome> {
    let plan = Plan::new(args, seed, progress);
    if !(plan.paced_rate.is_finite() && plan.paced_rate > 0.0) {
        bail!("--paced-rate must be a positive number of Puts per second");
    }
    let (ours, etcd) = args.systems.specs(DEFAULT_SUBNET)?;
    let mut systems = Vec::with_capacity(2);
    let chosen = match args.which {
        Which::Both => vec![&ours, &etcd],
        Which::Ours => vec![&ours],
        Which::Etcd => vec![&etcd],
    };
    for spec in chosen {
        systems.push(run_system(spec, &plan).await);
    }
    Ok(ScaleOutcome {
        seed,
        keys: plan.keys,
        value_size: plan.value_size,
        clients: plan.clients,
        paced_rate: plan.paced_rate,
        paced_before_s: plan.paced_before.as_secs_f64(),
        paced_after_s: plan.paced_after.as_secs_f64(),
        list_timeout_s: plan.list_timeout.as_secs_f64(),
        cold_restart: plan.cold_restart,
        ours_bin: ours.bin.display().to_string(),
        etcd_bin: etcd.bin.display().to_string(),
        systems,
    })
}

/// Every step on a fresh cluster of `spec`, killed at the end.
async fn run_system(spec: &ClusterSpec, plan: &Plan) -> SystemRun {
    eprintln!(
        "bench: scale: starting {} cluster ({})",
        spec.label,
        spec.bin.display()
    );
    let mut cluster = match Cluster::start(spec).await {
        Ok(c) => c,
        Err(e) => return SystemRun::not_started(&spec.label, &e),
    };
    let (c, label, show) = (&cluster, spec.label.as_str(), plan.progress);
    let load = step(label, "load", false, true, load(c, plan)).await;
    let runs = |g| plan.runs(g);
    let sizes_after_load = step(
        label,
        "sizes",
        show,
        runs(StepGroup::Sizes),
        bounded(SIZES_TIMEOUT, sizes(c)),
    )
    .await;
    let lists = runs(StepGroup::Lists);
    // The stream first: a process keeps some of the memory a list freed,
    // which would hide the stream's own growth.
    let streamed_list = step(
        label,
        "streamed list",
        show,
        lists,
        stream_everything(c, plan),
    )
    .await;
    let full_list = step(label, "full list", show, lists, list_everything(c, plan)).await;
    let paginated_list = step(
        label,
        "paginated list",
        show,
        lists,
        paginated_list(c, plan),
    )
    .await;
    let count_only = step(label, "count only", show, lists, count_only(c, plan)).await;
    let snapshot = step(
        label,
        "snapshot save",
        show,
        runs(StepGroup::Snapshot),
        snapshot(c),
    )
    .await;
    let maint = runs(StepGroup::Maintenance);
    let maintenance = step(
        label,
        "compaction and defrag",
        false,
        maint,
        maintenance(c, plan),
    )
    .await;
    let sizes_after_defrag = step(
        label,
        "sizes",
        show,
        maint,
        bounded(SIZES_TIMEOUT, sizes(c)),
    )
    .await;
    let full_list_after_compaction = step(
        label,
        "full list after compaction",
        show,
        maint,
        list_everything(c, plan),
    )
    .await;
    let restarts = runs(StepGroup::Restart);
    let restart_follower = step(
        label,
        "restart follower",
        show,
        restarts,
        bounded(RESTART_TIMEOUT, restart_follower(&mut cluster, plan)),
    )
    .await;
    let restart_all = step(
        label,
        "restart all",
        show,
        restarts,
        bounded(RESTART_TIMEOUT, restart_all(&mut cluster, plan)),
    )
    .await;
    let learner_join = step(
        label,
        "learner join",
        show,
        runs(StepGroup::Learner),
        bounded(LEARNER_TIMEOUT, learner_join(&mut cluster)),
    )
    .await;
    drop(cluster);
    SystemRun {
        system: spec.label.clone(),
        load,
        sizes_after_load,
        full_list,
        streamed_list,
        paginated_list,
        count_only,
        snapshot,
        maintenance,
        sizes_after_defrag,
        full_list_after_compaction,
        restart_follower,
        restart_all,
        learner_join,
    }
}

impl SystemRun {
    /// Every step failed: the cluster did not start.
    fn not_started(system: &str, e: &anyhow::Error) -> SystemRun {
        let why = format!("cluster did not start: {e:#}");
        SystemRun {
            system: system.to_string(),
            load: Step::Failed(why.clone()),
            sizes_after_load: Step::Failed(why.clone()),
            full_list: Step::Failed(why.clone()),
            streamed_list: Step::Failed(why.clone()),
            paginated_list: Step::Failed(why.clone()),
            count_only: Step::Failed(why.clone()),
            snapshot: Step::Failed(why.clone()),
            maintenance: Step::Failed(why.clone()),
            sizes_after_defrag: Step::Failed(why.clone()),
            full_list_after_compaction: Step::Failed(why.clone()),
            restart_follower: Step::Failed(why.clone()),
            restart_all: Step::Failed(why.clone()),
            learner_join: Step::Failed(why.clone()),
        }
    }
}

/// Runs one step of `system` unless not `chosen` (under a spinner naming it if `show`), logs
/// how it ended and keeps its result or error.
async fn step<T>(
    system: &str,
    name: &str,
    show: bool,
    chosen: bool,
    fut: impl Future<Output = Result<T>>,
) -> Step<T> {
    if !chosen {
        return Step::Skipped;
    }
    let bar = spinner(show, &format!("scale {system}: {name}"));
    let started = Instant::now();
    let result = fut.await;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    match &result {
        Ok(_) => eprintln!("bench: scale {system}: {name} done in {secs:.1} s"),
        Err(e) => eprintln!("bench: scale {system}: {name} failed after {secs:.1} s: {e:#}"),
    }
    result.into()
}

/// A spinner naming the running step (hidden unless `show`).
fn spinner(show: bool, label: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {prefix} [{elapsed_precise}] {msg}")
    {
        bar.set_style(style);
    }
    bar.set_prefix(label.to_string());
    bar.enable_steady_tick(SPINNER_TICK);
    bar
}

/// `fut`, failing with "did not finish in N s" (or "N ms") after `limit`.
async fn bounded<T>(limit: Duration, fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| not_finished(limit))?
}

fn not_finished(limit: Duration) -> anyhow::Error {
    if limit.subsec_millis() == 0 {
        anyhow!("did not finish in {} s", limit.as_secs())
    } else {
        anyhow!("did not finish in {} ms", limit.as_millis())
    }
}

/// `size` random bytes.
fn random_value(rng: &mut StdRng, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    rng.fill(&mut v[..]);
    v
}

/// Key number `n` of the run.
fn key(n: u64) -> Vec<u8> {
    key_with_prefix(KEY_PREFIX, KEY_SIZE, n)
}

/// Step 1: every key once, closed loop.
async fn load(cluster: &Cluster, plan: &Plan) -> Result<LoadStep> {
    let conns = crate::load::connect(
        &cluster.endpoints(),
        plan.clients.div_ceil(CLIENTS_PER_CONN),
    )
    .await?;
    let kvs: Vec<KvClient> = conns.iter().map(Client::kv_client).collect();
    let stop = Stop::new(Some(plan.keys), Some(LOAD_TIMEOUT));
    let label = format!("scale load {}", cluster.label);
    let pacer = Arc::new(Pacer::new(None, stop, plan.progress, &label));
    let failures = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks = (0..plan.clients)
        .map(|c| {
            let rng = client_rng(plan.seed, c as u64);
            let loader = Loader {
                kvs: kvs.clone(),
                turn: c,
                rng,
                value_size: plan.value_size,
                pacer: pacer.clone(),
                failures: failures.clone(),
                samples: Vec::new(),
            };
            tokio::spawn(loader.run())
        })
        .collect::<Vec<_>>();
    let mut puts = Recorder::new();
    let mut samples = Vec::new();
    for task in tasks {
        let (rec, mut s) = task.await.context("load writer task")?;
        puts.merge(&rec);
        samples.append(&mut s);
    }
    pacer.finish();
    let elapsed = started.elapsed();
    if puts.ok() == 0 {
        bail!("no Put succeeded ({} failed)", puts.errors());
    }
    if puts.errors() >= MAX_LOAD_FAILURES {
        let (msg, n) = puts.most_common_error().unwrap_or(("", 0));
        bail!(
            "stopped after {} failed Puts ({} written); {n} of them: {msg}",
            puts.errors(),
            puts.ok()
        );
    }
    let samples = samples
        .iter()
        .map(|s| (f64::from(s.intended_ms) / 1000.0, s.latency()));
    Ok(LoadStep {
        keys_written: puts.ok(),
        elapsed_s: elapsed.as_secs_f64(),
        puts: puts.result("put", elapsed),
        timeline: timeline(samples, LOAD_BUCKET),
    })
}

/// One successful load Put, in 8 bytes (8M of them fit in 64 MiB): when it
/// was meant to start, in ms since the load started, and its latency in µs.
struct LoadSample {
    intended_ms: u32,
    latency_us: u32,
}

impl LoadSample {
    fn latency(&self) -> Duration {
        Duration::from_micros(u64::from(self.latency_us))
    }
}

/// One load writer: the keys of the tickets it draws, each on the next
/// connection, until the tickets run out or the writers together have seen
/// [`MAX_LOAD_FAILURES`] Puts fail.
struct Loader {
    kvs: Vec<KvClient>,
    turn: usize,
    rng: StdRng,
    value_size: usize,
    pacer: Arc<Pacer>,
    /// Failed Puts of all the writers.
    failures: Arc<AtomicU64>,
    samples: Vec<LoadSample>,
}

impl Loader {
    async fn run(mut self) -> (Recorder, Vec<LoadSample>) {
        let mut rec = Recorder::new();
        while self.failures.load(Ordering::Relaxed) < MAX_LOAD_FAILURES {
            let Some(t) = self.pacer.next().await else {
                break;
            };
            let conn = self.turn % self.kvs.len();
            self.turn = conn + 1;
            let value = random_value(&mut self.rng, self.value_size);
            let put = self.kvs[conn].put(key(t.index), value, None);
            match tokio::time::timeout(OP_TIMEOUT, put).await {
                Ok(Ok(_)) => {
                    let latency = t.intended.elapsed();
                    rec.record(latency);
                    let since = t.intended.saturating_duration_since(self.pacer.start());
                    self.samples.push(LoadSample {
                        intended_ms: u32::try_from(since.as_millis()).unwrap_or(u32::MAX),
                        latency_us: u32::try_from(latency.as_micros()).unwrap_or(u32::MAX),
                    });
                }
                Ok(Err(e)) => {
                    rec.error(e);
                    self.failures.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    rec.error("timeout");
                    self.failures.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.pacer.done();
        }
        (rec, self.samples)
    }
}

/// Index of the current leader (retrying while an election runs).
async fn leader(cluster: &Cluster) -> Result<usize> {
    let endpoints = cluster.endpoints();
    let ep = leader_endpoint(&endpoints).await?;
    endpoints
        .iter()
        .position(|e| *e == ep)
        .context("the leader is not a member")
}

/// Steps 2 and 7: data directories and the leader's Status.
async fn sizes(cluster: &Cluster) -> Result<Sizes> {
    let data_dir_bytes = cluster
        .members
        .iter()
        .map(|m| dir_size(&m.data_dir).with_context(|| format!("sizing {}", m.data_dir.display())))
        .collect::<Result<Vec<_>>>()?;
    let i = leader(cluster).await?;
    let member = &cluster.members[i];
    let status = control_client(std::slice::from_ref(&member.client_url))
        .await?
        .status()
        .await
        .with_context(|| format!("Status of {}", member.name))?;
    Ok(Sizes {
        data_dir_bytes,
        leader: member.name.clone(),
        db_size_bytes: status.db_size(),
        db_size_in_use_bytes: status.raft_used_db_size(),
    })
}

/// Sum of the lengths of the files under `dir` (symbolic links not
/// followed; files removed during the walk are skipped).
pub fn dir_size(dir: &Path) -> Result<u64> {
    let mut seen = std::collections::HashSet::new();
    dir_size_once(dir, &mut seen)
}

/// [`dir_size`], counting a file with several names (hard links: our
/// snapshot checkpoints link the engine's table files) once, as `du` does.
fn dir_size_once(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = match entry.path().symlink_metadata() {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        if meta.is_dir() {
            total += dir_size_once(&entry.path(), seen)?;
        } else if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
            total += meta.len();
        }
    }
    Ok(total)
}

/// A KV client on its own connection to `endpoint` that accepts answers of
/// up to [`MAX_ANSWER_BYTES`].
async fn list_client(endpoint: &str) -> Result<KvClient> {
    let client = connect_one(endpoint, CONNECT_TIMEOUT)
        .await
        .with_context(|| format!("connecting to {endpoint}"))?;
    Ok(client
        .kv_client()
        .max_decoding_message_size(MAX_ANSWER_BYTES))
}

/// The Range options selecting the whole key space.
fn whole_space() -> GetOptions {
    GetOptions::new().with_range(prefix_end(KEY_PREFIX.as_bytes()))
}

/// Steps 3 and 8: one linearizable Range of everything from the leader.
async fn list_everything(cluster: &Cluster, plan: &Plan) -> Result<ListStep> {
    let member = &cluster.members[leader(cluster).await?];
    let mut kv = list_client(&member.client_url).await?;
    let sampler = RssSampler::start(member.pid())?;
    let started = Instant::now();
    let answer =
        tokio::time::timeout(plan.list_timeout, kv.get(KEY_PREFIX, Some(whole_space()))).await;
    let seconds = started.elapsed().as_secs_f64();
    let (before, peak) = sampler.finish();
    let answer = answer
        .map_err(|_| not_finished(plan.list_timeout))?
        .context("Range")?;
    let answer_bytes: u64 = answer
        .kvs()
        .iter()
        .map(|kv| (kv.key().len() + kv.value().len()) as u64)
        .sum();
    let growth = peak.saturating_sub(before);
    Ok(ListStep {
        leader: member.name.clone(),
        seconds,
        keys: answer.kvs().len() as u64,
        answer_bytes,
        rss_before_kib: before,
        rss_peak_kib: peak,
        rss_growth_kib: growth,
        growth_per_answer_byte: ratio(growth as f64 * 1024.0, answer_bytes as f64),
    })
}

/// Step 3b: the same keys through one RangeStream (etcd 3.7) from the
/// leader, each chunk dropped once counted: the server holds a chunk or
/// two, never the answer. etcd 3.5 has no RangeStream.
async fn stream_everything(cluster: &Cluster, plan: &Plan) -> Result<ListStep> {
    let member = &cluster.members[leader(cluster).await?];
    let mut kv = list_client(&member.client_url).await?;
    let sampler = RssSampler::start(member.pid())?;
    let started = Instant::now();
    let streamed = tokio::time::timeout(plan.list_timeout, async {
        let mut stream = kv.get_stream(KEY_PREFIX, Some(whole_space())).await?;
        let (mut keys, mut bytes) = (0u64, 0u64);
        while let Some(chunk) = stream.message().await? {
            keys += chunk.kvs().len() as u64;
            bytes += chunk
                .kvs()
                .iter()
                .map(|kv| (kv.key().len() + kv.value().len()) as u64)
                .sum::<u64>();
        }
        Ok::<_, etcd_client::Error>((keys, bytes))
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let (before, peak) = sampler.finish();
    let (keys, answer_bytes) = match streamed.map_err(|_| not_finished(plan.list_timeout))? {
        Ok(done) => done,
        Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::Unimplemented => {
            bail!("no RangeStream (etcd 3.7's)")
        }
        Err(e) => return Err(e).context("RangeStream"),
    };
    let growth = peak.saturating_sub(before);
    Ok(ListStep {
        leader: member.name.clone(),
        seconds,
        keys,
        answer_bytes,
        rss_before_kib: before,
        rss_peak_kib: peak,
        rss_growth_kib: growth,
        growth_per_answer_byte: ratio(growth as f64 * 1024.0, answer_bytes as f64),
    })
}

/// Samples a process's RSS on a thread of its own (so that a busy runtime
/// does not delay the samples) until finished.
struct RssSampler {
    before_kib: u64,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start(pid: u32) -> Result<RssSampler> {
        let before_kib = crate::procs::rss_kib(pid)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = before_kib;
            loop {
                if let Ok(rss) = crate::procs::rss_kib(pid) {
                    peak = peak.max(rss);
                }
                if stopped.load(Ordering::Relaxed) {
                    return peak;
                }
                std::thread::sleep(RSS_SAMPLE_INTERVAL);
            }
        });
        Ok(RssSampler {
            before_kib,
            stop,
            thread,
        })
    }

    /// (RSS before, peak RSS), in KiB.
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let peak = self.thread.join().unwrap_or(self.before_kib);
        (self.before_kib, peak)
    }
}

/// Step 4: kube-apiserver's pages.
async fn paginated_list(cluster: &Cluster, plan: &Plan) -> Result<PagedStep> {
    let member = &cluster.members[leader(cluster).await?];
    let mut kv = list_client(&member.client_url).await?;
    let started = Instant::now();
    let (pages, keys) = bounded(plan.list_timeout, list_pages(&mut kv)).await?;
    Ok(PagedStep {
        seconds: started.elapsed().as_secs_f64(),
        pages,
        keys,
    })
}

/// Lists the key space in pages; returns (pages, keys).
async fn list_pages(kv: &mut KvClient) -> Result<(u64, u64)> {
    let mut from = KEY_PREFIX.as_bytes().to_vec();
    let mut revision = 0;
    let (mut pages, mut keys) = (0u64, 0u64);
    loop {
        let mut opts = whole_space().with_limit(PAGE_LIMIT);
        if revision > 0 {
            opts = opts.with_revision(revision);
        }
        let page = kv
            .get(from.clone(), Some(opts))
            .await
            .with_context(|| format!("page {}", pages + 1))?;
        pages += 1;
        keys += page.kvs().len() as u64;
        if revision == 0 {
            revision = page.header().map_or(0, |h| h.revision());
        }
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok((pages, keys)),
        }
    }
}

/// Step 5.
async fn count_only(cluster: &Cluster, plan: &Plan) -> Result<CountStep> {
    let member = &cluster.members[leader(cluster).await?];
    let mut kv = list_client(&member.client_url).await?;
    let started = Instant::now();
    let opts = whole_space().with_count_only();
    let answer = bounded(plan.list_timeout, async {
        kv.get(KEY_PREFIX, Some(opts)).await.context("Range")
    })
    .await?;
    Ok(CountStep {
        ms: started.elapsed().as_secs_f64() * 1000.0,
        count: answer.count(),
    })
}

/// Step 6.
async fn snapshot(cluster: &Cluster) -> Result<SnapshotStep> {
    let member = &cluster.members[leader(cluster).await?];
    let client = connect_one(&member.client_url, CONNECT_TIMEOUT).await?;
    let mut maintenance = client.maintenance_client();
    let dir = tempfile::Builder::new()
        .prefix("bench-scale-snapshot-")
        .tempdir()
        .context("creating snapshot dir")?;
    let path = dir.path().join("snapshot.db");
    let mut file = tokio::fs::File::create(&path)
        .await
        .with_context(|| format!("creating {}", path.display()))?;
    let started = Instant::now();
    let bytes = bounded(SNAPSHOT_TIMEOUT, async {
        let mut stream = maintenance.snapshot().await.context("Snapshot")?;
        let mut bytes = 0u64;
        while let Some(chunk) = stream.message().await.context("Snapshot stream")? {
            file.write_all(chunk.blob())
                .await
                .context("writing snapshot")?;
            bytes += chunk.blob().len() as u64;
        }
        file.sync_all().await.context("syncing snapshot")?;
        anyhow::Ok(bytes)
    })
    .await?;
    Ok(SnapshotStep {
        seconds: started.elapsed().as_secs_f64(),
        bytes,
    })
}

/// One paced write: when it was meant to start (seconds since the writer
/// started) and its latency from then, or its error.
struct PacedWrite {
    intended_s: f64,
    outcome: Result<Duration, String>,
}

/// Step 7: the paced writer around a Compact and the Defragments.
async fn maintenance(cluster: &Cluster, plan: &Plan) -> Result<MaintenanceStep> {
    let conns = crate::load::connect(&cluster.endpoints(), PACED_CONNS).await?;
    let mut kvs: Vec<KvClient> = conns.iter().map(Client::kv_client).collect();
    warm_up(&mut kvs, plan).await?;
    let limit =
        plan.paced_before + COMPACT_TIMEOUT + DEFRAG_TIMEOUT * MEMBERS as u32 + plan.paced_after;
    let pacer = Arc::new(Pacer::new(
        Some(plan.paced_rate),
        Stop::new(None, Some(limit)),
        false,
        "paced writer",
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..PACED_WRITERS)
        .map(|w| {
            let keys = KeyGen::new(KEY_PREFIX, KEY_SIZE, plan.keys, false, plan.seed, w as u64);
            let writer = PacedWriter {
                kvs: kvs.clone(),
                turn: w,
                keys,
                value_size: plan.value_size,
                pacer: pacer.clone(),
                stop: stop.clone(),
            };
            tokio::spawn(writer.run())
        })
        .collect();
    let bar = spinner(
        plan.progress,
        &format!("scale {}: maintenance", cluster.label),
    );
    bar.set_message("steady state");
    tokio::time::sleep_until((pacer.start() + plan.paced_before).into()).await;
    let compact_at = pacer.start().elapsed().as_secs_f64();
    let work = compact_and_defrag(cluster, &bar, pacer.start()).await;
    let done_at = pacer.start().elapsed().as_secs_f64();
    bar.set_message("after");
    tokio::time::sleep(plan.paced_after).await;
    stop.store(true, Ordering::Relaxed);
    let mut log = Vec::new();
    for w in writers {
        log.extend(w.await.context("paced writer task")?);
    }
    bar.finish_and_clear();
    let (compacted_revision, events) = work?;
    let [steady, during, after] = split_phases(&log, compact_at, done_at);
    let ms = |(_, from, to): &(String, f64, f64)| (to - from) * 1000.0;
    let compaction_ms = events.first().map_or(0.0, ms);
    let defrag_ms = events.iter().skip(1).map(ms).collect();
    Ok(MaintenanceStep {
        compacted_revision,
        compaction_ms,
        defrag_ms,
        steady: steady.result("put", Duration::from_secs_f64(compact_at)),
        during: during.result("put", Duration::from_secs_f64(done_at - compact_at)),
        after: after.result("put", plan.paced_after),
        events,
        slowest: slowest(&log, SLOWEST_KEPT),
        timeline: timeline(paced_samples(&log), PACED_BUCKET),
    })
}

/// One Put of an existing key through each connection before the paced
/// writer starts, so that its first writes do not pay for connection
/// set-up (without it the steady phase's p99 held 78 ms puts at t=0).
async fn warm_up(kvs: &mut [KvClient], plan: &Plan) -> Result<()> {
    let mut rng = client_rng(plan.seed, u64::MAX);
    for kv in kvs {
        let value = random_value(&mut rng, plan.value_size);
        tokio::time::timeout(OP_TIMEOUT, kv.put(key(0), value, None))
            .await
            .context("warm-up Put: timeout")?
            .context("warm-up Put")?;
    }
    Ok(())
}

/// The successful writes of `log`: (intended start s, latency).
fn paced_samples(log: &[PacedWrite]) -> impl Iterator<Item = (f64, Duration)> + '_ {
    log.iter()
        .filter_map(|w| w.outcome.as_ref().ok().map(|l| (w.intended_s, *l)))
}

/// Per `bucket` of intended starts: (start s, p99 ms, max ms) of the
/// `(intended start s, latency)` samples, from the same recorder as the
/// phases' percentiles; buckets without one are left out.
fn timeline(
    samples: impl Iterator<Item = (f64, Duration)>,
    bucket: Duration,
) -> Vec<(f64, f64, f64)> {
    let width = bucket.as_secs_f64();
    let mut buckets: std::collections::BTreeMap<u64, Recorder> = Default::default();
    for (intended_s, latency) in samples {
        let n = (intended_s / width).floor().max(0.0) as u64;
        buckets.entry(n).or_default().record(latency);
    }
    buckets
        .into_iter()
        .map(|(n, recorder)| {
            let latency = recorder.result("put", bucket).latency;
            (n as f64 * width, latency.p99_ms, latency.max_ms)
        })
        .collect()
}

/// The `n` slowest successful writes of `log`: (intended start s, ms).
fn slowest(log: &[PacedWrite], n: usize) -> Vec<(f64, f64)> {
    let mut writes: Vec<(f64, f64)> = log
        .iter()
        .filter_map(|w| {
            let latency = w.outcome.as_ref().ok()?;
            Some((w.intended_s, latency.as_secs_f64() * 1000.0))
        })
        .collect();
    writes.sort_by(|a, b| b.1.total_cmp(&a.1));
    writes.truncate(n);
    writes
}

/// Compacts at the current revision (physically), then defragments each
/// member in turn; returns the revision and the timeline: ("compact",
/// start, end), then ("defrag <member>", start, end) for each, in seconds
/// since `epoch`.
async fn compact_and_defrag(
    cluster: &Cluster,
    bar: &ProgressBar,
    epoch: Instant,
) -> Result<(i64, Vec<(String, f64, f64)>)> {
    let since = |at: Instant| at.duration_since(epoch).as_secs_f64();
    let member = &cluster.members[leader(cluster).await?];
    let mut kv = connect_one(&member.client_url, CONNECT_TIMEOUT)
        .await?
        .kv_client();
    let probe = GetOptions::new().with_count_only();
    let revision = tokio::time::timeout(OP_TIMEOUT, kv.get(key(0), Some(probe)))
        .await
        .context("current revision: timeout")??
        .header()
        .map(|h| h.revision())
        .context("no header in a Range answer")?;
    bar.set_message(format!("compacting at revision {revision}"));
    let started = Instant::now();
    let physical = CompactionOptions::new().with_physical();
    bounded(COMPACT_TIMEOUT, async {
        kv.compact(revision, Some(physical))
            .await
            .context("Compact")
    })
    .await?;
    let mut events = vec![("compact".to_string(), since(started), since(Instant::now()))];
    for m in &cluster.members {
        bar.set_message(format!("defragmenting {}", m.name));
        let mut maintenance = connect_one(&m.client_url, CONNECT_TIMEOUT)
            .await?
            .maintenance_client();
        let started = Instant::now();
        bounded(DEFRAG_TIMEOUT, async {
            maintenance
                .defragment()
                .await
                .with_context(|| format!("Defragment of {}", m.name))
        })
        .await?;
        let name = format!("defrag {}", m.name);
        events.push((name, since(started), since(Instant::now())));
    }
    Ok((revision, events))
}

/// Recorders of the writes meant to start before `from`, from `from` to
/// `to`, and after `to` (seconds since the writer started).
fn split_phases(log: &[PacedWrite], from: f64, to: f64) -> [Recorder; 3] {
    let mut phases = [Recorder::new(), Recorder::new(), Recorder::new()];
    for w in log {
        let phase = match w.intended_s {
            t if t < from => 0,
            t if t < to => 1,
            _ => 2,
        };
        match &w.outcome {
            Ok(latency) => phases[phase].record(*latency),
            Err(e) => phases[phase].error(e),
        }
    }
    phases
}

/// One writer of the paced writer: open-loop Puts of random existing keys
/// until `stop`.
struct PacedWriter {
    kvs: Vec<KvClient>,
    turn: usize,
    keys: KeyGen,
    value_size: usize,
    pacer: Arc<Pacer>,
    stop: Arc<AtomicBool>,
}

impl PacedWriter {
    async fn run(mut self) -> Vec<PacedWrite> {
        let mut log = Vec::new();
        while let Some(t) = self.pacer.next().await {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let conn = self.turn % self.kvs.len();
            self.turn = conn + 1;
            let key = self.keys.key(t.index);
            let value = random_value(self.keys.rng(), self.value_size);
            let put = self.kvs[conn].put(key, value, None);
            let outcome = match tokio::time::timeout(OP_TIMEOUT, put).await {
                Ok(Ok(_)) => Ok(t.intended.elapsed()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("timeout".to_string()),
            };
            log.push(PacedWrite {
                intended_s: t.intended.duration_since(self.pacer.start()).as_secs_f64(),
                outcome,
            });
            self.pacer.done();
        }
        log
    }
}

/// Step 9: kill -9 a follower and start it again.
async fn restart_follower(cluster: &mut Cluster, plan: &Plan) -> Result<RestartStep> {
    let i = (leader(cluster).await? + 1) % cluster.members.len();
    cluster.kill9(i);
    if plan.cold_restart {
        drop_page_cache()?;
    }
    let spawned = cluster.restart(i)?;
    let ms = until_readable(cluster.members[i].client_url.clone(), spawned).await;
    Ok(RestartStep {
        members: vec![cluster.members[i].name.clone()],
        ready_ms: vec![ms],
        ms,
    })
}

/// Step 10: kill -9 every member and start them all again.
async fn restart_all(cluster: &mut Cluster, plan: &Plan) -> Result<RestartStep> {
    let n = cluster.members.len();
    for i in 0..n {
        cluster.kill9(i);
    }
    if plan.cold_restart {
        drop_page_cache()?;
    }
    let mut first = None;
    for i in 0..n {
        let at = cluster.restart(i)?;
        first.get_or_insert(at);
    }
    let first = first.context("a cluster without members")?;
    // A JoinSet aborts the probes still running if the step's bound drops it.
    let mut probes = tokio::task::JoinSet::new();
    for (i, m) in cluster.members.iter().enumerate() {
        let endpoint = m.client_url.clone();
        probes.spawn(async move { (i, until_readable(endpoint, first).await) });
    }
    let mut ready_ms = vec![0.0; n];
    while let Some(done) = probes.join_next().await {
        let (i, ms) = done.context("probe task")?;
        ready_ms[i] = ms;
    }
    Ok(RestartStep {
        members: cluster.members.iter().map(|m| m.name.clone()).collect(),
        ms: ready_ms.iter().copied().fold(0.0, f64::max),
        ready_ms,
    })
}

/// Where the kernel drops its clean caches when written `3`.
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Writes dirty pages out, then drops the page cache (and the dentry and
/// inode caches): what a killed member reads next comes from the disk, as
/// after a reboot. Needs root.
fn drop_page_cache() -> Result<()> {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write(DROP_CACHES, "3\n")
        .with_context(|| format!("writing {DROP_CACHES} for --cold-restart (needs root)"))
}

/// Step 11: a learner from nothing until promoted and serving.
async fn learner_join(cluster: &mut Cluster) -> Result<JoinStep> {
    // A restart step that ran out of time leaves members still starting
    // (etcd at 8M keys): the learner joins a serving cluster, and the wait
    // for it is not counted.
    for endpoint in cluster.endpoints() {
        until_readable(endpoint, Instant::now()).await;
    }
    let (i, added) = cluster.add_learner().await?;
    cluster.promote(i).await?;
    let promoted_ms = added.elapsed().as_secs_f64() * 1000.0;
    let member = &cluster.members[i];
    let promoted = Instant::now();
    let mut failed_probes = Vec::new();
    let serving_ms = until_readable_noting(member.client_url.clone(), added, &mut |e| {
        if failed_probes.len() < FAILED_PROBES_KEPT {
            let ms = promoted.elapsed().as_secs_f64() * 1000.0;
            failed_probes.push((ms, format!("{e:#}")));
        }
    })
    .await;
    Ok(JoinStep {
        learner: member.name.clone(),
        promoted_ms,
        serving_ms,
        data_dir_bytes: dir_size(&member.data_dir)?,
        failed_probes,
    })
}

/// Milliseconds from `since` until a linearizable Get through `endpoint`
/// succeeds, probing every [`RESTART_POLL`] (the caller bounds it).
async fn until_readable(endpoint: String, since: Instant) -> f64 {
    until_readable_noting(endpoint, since, &mut |_| {}).await
}

/// [`until_readable`], each failed probe's error handed to `failed`.
async fn until_readable_noting(
    endpoint: String,
    since: Instant,
    failed: &mut (dyn FnMut(anyhow::Error) + Send),
) -> f64 {
    loop {
        match probe(&endpoint).await {
            Ok(()) => return since.elapsed().as_secs_f64() * 1000.0,
            Err(e) => failed(e),
        }
        tokio::time::sleep(RESTART_POLL).await;
    }
}

/// One linearizable Get of key 0 on a new connection to `endpoint`, bounded by [`PROBE_TIMEOUT`].
async fn probe(endpoint: &str) -> Result<()> {
    bounded(PROBE_TIMEOUT, async {
        let client = connect_one(endpoint, PROBE_TIMEOUT).await?;
        client.kv_client().get(key(0), None).await?;
        Ok(())
    })
    .await
}

/// One table cell: a value (shown, and compared in the ratio column) or
/// why there is none.
enum Cell {
    Value { shown: String, value: f64 },
    Failed(String),
    Skipped,
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Cell::Value { shown, .. } => shown.clone(),
            Cell::Failed(e) if e.chars().count() > MAX_CELL_CHARS => {
                let short: String = e.chars().take(MAX_CELL_CHARS).collect();
                format!("{short}…")
            }
            Cell::Failed(e) => e.clone(),
            Cell::Skipped => "skipped".to_string(),
        }
    }

    fn value(&self) -> Option<f64> {
        match self {
            Cell::Value { value, .. } => Some(*value),
            Cell::Failed(_) | Cell::Skipped => None,
        }
    }
}

/// The cell of `step`, read by `read` as (value, shown text).
fn cell<T>(step: &Step<T>, read: impl Fn(&T) -> (f64, String)) -> Cell {
    match step {
        Step::Ok(t) => {
            let (value, shown) = read(t);
            Cell::Value { shown, value }
        }
        Step::Failed(e) => Cell::Failed(e.clone()),
        Step::Skipped => Cell::Skipped,
    }
}

/// `v` with `decimals` decimals.
fn fixed(v: f64, decimals: usize) -> (f64, String) {
    (v, format!("{v:.decimals$}"))
}

fn mib(bytes: f64) -> f64 {
    bytes / MIB
}

/// Per-member sizes shown as `a / b / c` MiB; the value is their sum.
fn per_member_mib(bytes: &[u64]) -> (f64, String) {
    let shown: Vec<String> = bytes
        .iter()
        .map(|b| format!("{:.0}", mib(*b as f64)))
        .collect();
    (bytes.iter().sum::<u64>() as f64, shown.join(" / "))
}

/// Per-member times shown as `a / b / c`; the value is their sum.
fn per_member_ms(ms: &[f64]) -> (f64, String) {
    let shown: Vec<String> = ms.iter().map(|m| format!("{m:.0}")).collect();
    (ms.iter().sum(), shown.join(" / "))
}

/// The leader's RSS shown as `before -> peak` MiB; the value is the peak.
fn rss_before_peak(l: &ListStep) -> (f64, String) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let shown = format!("{:.0} -> {:.0}", mib(l.rss_before_kib), mib(l.rss_peak_kib));
    (mib(l.rss_peak_kib), shown)
}

/// A row of the table: its label and how to read its cell from one system's run.
struct Row {
    label: &'static str,
    cell: fn(&SystemRun) -> Cell,
}

/// The table's rows, in step order.
const ROWS: &[Row] = &[
    Row {
        label: "load: puts/s",
        cell: |r| {
            cell(&r.load, |l| {
                let rate = l.puts.throughput_ops_s;
                let short = if l.puts.errors > 0 {
                    format!(" ({} errors)", l.puts.errors)
                } else {
                    String::new()
                };
                (rate, format!("{rate:.0}{short}"))
            })
        },
    },
    Row {
        label: "load: put p50 ms",
        cell: |r| cell(&r.load, |l| fixed(l.puts.latency.p50_ms, 2)),
    },
    Row {
        label: "load: put p99 ms",
        cell: |r| cell(&r.load, |l| fixed(l.puts.latency.p99_ms, 2)),
    },
    Row {
        label: "sizes after load: data dir MiB m1 / m2 / m3",
        cell: |r| cell(&r.sizes_after_load, |s| per_member_mib(&s.data_dir_bytes)),
    },
    Row {
        label: "sizes after load: dbSize MiB",
        cell: |r| {
            cell(&r.sizes_after_load, |s| {
                fixed(mib(s.db_size_bytes as f64), 0)
            })
        },
    },
    Row {
        label: "sizes after load: dbSizeInUse MiB",
        cell: |r| {
            cell(&r.sizes_after_load, |s| {
                fixed(mib(s.db_size_in_use_bytes as f64), 0)
            })
        },
    },
    Row {
        label: "full list: s",
        cell: |r| cell(&r.full_list, |l| fixed(l.seconds, 2)),
    },
    Row {
        label: "full list: answer MiB",
        cell: |r| cell(&r.full_list, |l| fixed(mib(l.answer_bytes as f64), 0)),
    },
    Row {
        label: "full list: leader RSS MiB before -> peak",
        cell: |r| cell(&r.full_list, rss_before_peak),
    },
    Row {
        label: "full list: leader RSS growth MiB",
        cell: |r| cell(&r.full_list, |l| fixed(l.rss_growth_kib as f64 / 1024.0, 0)),
    },
    Row {
        label: "full list: RSS growth / answer",
        cell: |r| cell(&r.full_list, |l| fixed(l.growth_per_answer_byte, 2)),
    },
    Row {
        label: "streamed list (RangeStream): s",
        cell: |r| cell(&r.streamed_list, |l| fixed(l.seconds, 2)),
    },
    Row {
        label: "streamed list: leader RSS growth MiB",
        cell: |r| {
            cell(&r.streamed_list, |l| {
                fixed(l.rss_growth_kib as f64 / 1024.0, 0)
            })
        },
    },
    Row {
        label: "paginated list: s (pages)",
        cell: |r| {
            cell(&r.paginated_list, |p| {
                (p.seconds, format!("{:.2} ({})", p.seconds, p.pages))
            })
        },
    },
    Row {
        label: "count only: ms",
        cell: |r| cell(&r.count_only, |c| fixed(c.ms, 1)),
    },
    Row {
        label: "snapshot save: s",
        cell: |r| cell(&r.snapshot, |s| fixed(s.seconds, 2)),
    },
    Row {
        label: "snapshot save: MiB",
        cell: |r| cell(&r.snapshot, |s| fixed(mib(s.bytes as f64), 0)),
    },
    Row {
        label: "paced writer steady: p50 ms",
        cell: |r| cell(&r.maintenance, |m| fixed(m.steady.latency.p50_ms, 2)),
    },
    Row {
        label: "paced writer steady: p99 ms",
        cell: |r| cell(&r.maintenance, |m| fixed(m.steady.latency.p99_ms, 2)),
    },
    Row {
        label: "paced writer during maintenance: p50 ms",
        cell: |r| cell(&r.maintenance, |m| fixed(m.during.latency.p50_ms, 2)),
    },
    Row {
        label: "paced writer during maintenance: p99 ms",
        cell: |r| cell(&r.maintenance, |m| fixed(m.during.latency.p99_ms, 2)),
    },
    Row {
        label: "paced writer during maintenance: max ms",
        cell: |r| cell(&r.maintenance, |m| fixed(m.during.latency.max_ms, 2)),
    },
    Row {
        label: "compaction: ms",
        cell: |r| cell(&r.maintenance, |m| fixed(m.compaction_ms, 0)),
    },
    Row {
        label: "defrag: ms m1 / m2 / m3",
        cell: |r| cell(&r.maintenance, |m| per_member_ms(&m.defrag_ms)),
    },
    Row {
        label: "sizes after defrag: data dir MiB m1 / m2 / m3",
        cell: |r| cell(&r.sizes_after_defrag, |s| per_member_mib(&s.data_dir_bytes)),
    },
    Row {
        label: "full list after compaction: s",
        cell: |r| cell(&r.full_list_after_compaction, |l| fixed(l.seconds, 2)),
    },
    Row {
        label: "full list after compaction: leader RSS MiB before -> peak",
        cell: |r| cell(&r.full_list_after_compaction, rss_before_peak),
    },
    Row {
        label: "full list after compaction: leader RSS growth MiB",
        cell: |r| {
            cell(&r.full_list_after_compaction, |l| {
                fixed(l.rss_growth_kib as f64 / 1024.0, 0)
            })
        },
    },
    Row {
        label: "restart follower: ms to linearizable Get",
        cell: |r| cell(&r.restart_follower, |s| fixed(s.ms, 0)),
    },
    Row {
        label: "restart all: ms to linearizable Get on every member",
        cell: |r| cell(&r.restart_all, |s| fixed(s.ms, 0)),
    },
    Row {
        label: "learner join: ms from MemberAdd to promoted",
        cell: |r| cell(&r.learner_join, |j| fixed(j.promoted_ms, 0)),
    },
    Row {
        label: "learner join: ms to linearizable Get",
        cell: |r| cell(&r.learner_join, |j| fixed(j.serving_ms, 0)),
    },
    Row {
        label: "learner join: its data dir MiB",
        cell: |r| cell(&r.learner_join, |j| fixed(mib(j.data_dir_bytes as f64), 0)),
    },
];

const HEADERS: [&str; 4] = ["step", "etcd 3.5.1", "store", "store/etcd"];

impl ScaleOutcome {
    fn system(&self, name: &str) -> Option<&SystemRun> {
        self.systems.iter().find(|s| s.system == name)
    }

    fn rows(&self) -> Vec<Vec<String>> {
        let missing = || Cell::Failed("not run".into());
        ROWS.iter()
            .map(|row| {
                let etcd = self
                    .system(crate::systems::ETCD)
                    .map_or_else(missing, |s| (row.cell)(s));
                let ours = self
                    .system(crate::systems::OURS)
                    .map_or_else(missing, |s| (row.cell)(s));
                let r = match (ours.value(), etcd.value()) {
                    (Some(o), Some(e)) => ratio(o, e),
                    _ => f64::NAN,
                };
                vec![
                    row.label.to_string(),
                    etcd.text(),
                    ours.text(),
                    fmt_ratio(r),
                ]
            })
            .collect()
    }

    /// For each system that ran the maintenance: what it did when, and its
    /// slowest writes, to line stalls up with their cause; for each whose
    /// promoted learner failed a Get: how.
    fn timelines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.systems {
            if let Step::Ok(j) = &s.learner_join {
                if !j.failed_probes.is_empty() {
                    let failed: Vec<String> = j
                        .failed_probes
                        .iter()
                        .map(|(ms, e)| format!("{ms:.0} ms: {e}"))
                        .collect();
                    out.push(format!(
                        "{} learner's failed Gets after its promotion: {}",
                        s.system,
                        failed.join("; ")
                    ));
                }
            }
            if let Step::Ok(m) = &s.maintenance {
                let slowest: Vec<String> = m
                    .slowest
                    .iter()
                    .map(|(at, ms)| format!("{ms:.0} ms at {at:.1} s"))
                    .collect();
                out.push(format!("{} maintenance: {}", s.system, m.event_list()));
                out.push(format!(
                    "{} slowest paced writes: {}",
                    s.system,
                    slowest.join(", ")
                ));
            }
        }
        out
    }

    /// For each system: a chart of its load's p99 and max per
    /// [`LOAD_BUCKET`], and, if it ran the maintenance, one of its paced
    /// writer's per [`PACED_BUCKET`] with the maintenance's timeline beneath
    /// (charts written into `dir`).
    fn timeline_charts(&self, dir: &Path) -> Result<String> {
        let mut md = String::new();
        for s in &self.systems {
            if let Step::Ok(l) = &s.load {
                let title = format!("{}: load, closed loop", s.system);
                let file = format!("scale-load-{}.svg", s.system);
                let x_label = "intended start, s since the load started";
                let y_label = "ms, per 10 s of starts";
                md.push_str(&timeline_chart(
                    dir,
                    &file,
                    &l.timeline,
                    &title,
                    x_label,
                    y_label,
                )?);
            }
            if let Step::Ok(m) = &s.maintenance {
                let title = format!(
                    "{}: paced writes through compaction and defragment",
                    s.system
                );
                let file = format!("scale-maintenance-{}.svg", s.system);
                let x_label = "intended start, s since the writer started";
                let y_label = "ms, per second of starts";
                md.push_str(&timeline_chart(
                    dir,
                    &file,
                    &m.timeline,
                    &title,
                    x_label,
                    y_label,
                )?);
                md.push_str(&format!("{}: {}.\n", s.system, m.event_list()));
            }
        }
        Ok(md)
    }

    /// "system step: error" for every failed step.
    fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.systems {
            for row in ROWS {
                if let Cell::Failed(e) = (row.cell)(s) {
                    let line = format!("{} {}: {e}", s.system, row.label);
                    if !out.contains(&line) {
                        out.push(line);
                    }
                }
            }
        }
        out
    }
}

impl Outcome for ScaleOutcome {
    fn title(&self) -> String {
        "scale: a large key space, store vs etcd 3.5".into()
    }

    fn text(&self) -> String {
        let mut text = format!(
            "scale (seed {}, {} keys of {} bytes by {} writers, paced writer {} puts/s; ratio = store / etcd)\n{}",
            self.seed,
            self.keys,
            self.value_size,
            self.clients,
            self.paced_rate,
            text_table(&HEADERS, &self.rows())
        );
        for f in self.failures() {
            text.push_str(&format!("failed: {f}\n"));
        }
        for line in self.timelines() {
            text.push_str(&line);
            text.push('\n');
        }
        text
    }

    fn markdown(&self, dir: &Path) -> Result<String> {
        let mut md = format!(
            "Each system in turn on a fresh 3-member cluster (never both at once): {} keys of {} random bytes \
             Put by {} closed-loop writers; then the members' data directories and the leader's dbSize; \
             one linearizable Range of everything from the leader (its RSS sampled every {} ms); \
             kube-apiserver-style pages of {}; a count-only Range; a snapshot save; a physical Compact \
             and a Defragment of each member under an open-loop writer at {} puts/s ({:.0} s before, {:.0} s after); \
             the full list again; kill -9 and restart of one follower, then of all members (time to a \
             linearizable Get through each restarted member{}); a learner added from nothing until promoted \
             and serving. Lists are bounded by {:.0} s. \
             Ratio = store / etcd (lower is better except for puts/s).\n\n\
             - store: `{}`\n- etcd: `{}`\n\n",
            self.keys,
            self.value_size,
            self.clients,
            RSS_SAMPLE_INTERVAL.as_millis(),
            PAGE_LIMIT,
            self.paced_rate,
            self.paced_before_s,
            self.paced_after_s,
            if self.cold_restart {
                "; the page cache dropped after each kill -9, as after a reboot"
            } else {
                ""
            },
            self.list_timeout_s,
            self.ours_bin,
            self.etcd_bin
        );
        md.push_str(&table(&HEADERS, &self.rows()));
        md.push_str(&self.timeline_charts(dir)?);
        let failures = self.failures();
        if !failures.is_empty() {
            md.push_str("\nFailed steps:\n\n");
            for f in failures {
                md.push_str(&format!("- `{f}`\n"));
            }
        }
        Ok(md)
    }
}

/// A chart of a timeline's p99 and max into `file` in `dir`; the
/// markdown that shows it.
fn timeline_chart(
    dir: &Path,
    file: &str,
    timeline: &[(f64, f64, f64)],
    title: &str,
    x_label: &str,
    y_label: &str,
) -> Result<String> {
    let column = |pick: fn(&(f64, f64, f64)) -> f64| -> Vec<(f64, f64)> {
        timeline.iter().map(|b| (b.0, pick(b))).collect()
    };
    let series = [
        Series {
            name: "p99".into(),
            points: column(|b| b.1),
        },
        Series {
            name: "max".into(),
            points: column(|b| b.2),
        },
    ];
    let chart = Chart {
        title,
        x_label,
        y_label,
        log_x: false,
        series: &series,
    };
    line_chart(&dir.join(file), &chart)?;
    Ok(format!("\n{}", image(title, file)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_sizes_add_up() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![0u8; 1000]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![0u8; 24]).unwrap();
        assert_eq!(dir_size(dir.path()).unwrap(), 1024);
    }

    #[test]
    fn writes_split_at_the_maintenance() {
        let write = |intended_s, ms| PacedWrite {
            intended_s,
            outcome: Ok(Duration::from_millis(ms)),
        };
        let log = [write(0.5, 1), write(1.5, 100), write(2.5, 2), write(3.5, 3)];
        let [steady, during, after] = split_phases(&log, 1.0, 3.0);
        assert_eq!((steady.ok(), during.ok(), after.ok()), (1, 2, 1));
    }

    #[test]
    fn timeline_buckets_by_intended_start() {
        // Microseconds, which the recorder keeps exactly.
        let write = |intended_s, us| PacedWrite {
            intended_s,
            outcome: Ok(Duration::from_micros(us)),
        };
        let mut log: Vec<PacedWrite> = (1..=100).map(|us| write(0.5, us)).collect();
        log.push(write(2.2, 7));
        log.push(PacedWrite {
            intended_s: 2.3,
            outcome: Err("timeout".into()),
        });
        let t = timeline(paced_samples(&log), Duration::from_secs(1));
        assert_eq!(t, vec![(0.0, 0.099, 0.1), (2.0, 0.007, 0.007)]);
    }

    #[test]
    fn a_bound_below_a_second_is_told_in_milliseconds() {
        assert_eq!(
            not_finished(Duration::from_millis(500)).to_string(),
            "did not finish in 500 ms"
        );
        assert_eq!(
            not_finished(Duration::from_secs(600)).to_string(),
            "did not finish in 600 s"
        );
    }

    #[test]
    fn random_values_do_not_repeat() {
        let mut rng = client_rng(1, 0);
        let v = random_value(&mut rng, 1024);
        assert_eq!(v.len(), 1024);
        let distinct: std::collections::BTreeSet<u8> = v.iter().copied().collect();
        assert!(distinct.len() > 200, "{} distinct bytes", distinct.len());
    }

    #[test]
    fn failed_steps_fill_their_rows() {
        let e = anyhow!("boom");
        let run = SystemRun::not_started("etcd", &e);
        for row in ROWS {
            assert!(matches!((row.cell)(&run), Cell::Failed(m) if m.contains("boom")));
        }
    }
}
