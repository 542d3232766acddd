//! `apiserver`: the etcd traffic of a kube-apiserver, for both systems.
//!
//! Objects live under `/registry/bench-<round>/pods/default/` (pre-created
//! with `--objects`), ~`--val-size` bytes each, stamped with their write
//! time. For `--duration`, concurrently:
//!
//! * creators: kube's Create — `Txn(If(ModRevision(key) = 0), Then(Put), Else(Get))` on new keys;
//! * updaters: kube's GuaranteedUpdate on `--hot-keys` shared objects —
//!   `Txn(If(ModRevision(key) = cached), Then(Put), Else(Get))`, retrying
//!   with the returned object on conflict (conflicts are counted; an
//!   update gives up after [`MAX_UPDATE_ATTEMPTS`]);
//! * listers: paginated lists of the whole prefix (`--page-size` per page,
//!   later pages pinned to the first page's revision) checked against the
//!   exact count the first page returns, plus a count-only Range as the
//!   apiserver's object counter does;
//! * watchers: prefix watches with prev_kv and progress notify; each stream
//!   asks for a progress notification every [`PROGRESS_INTERVAL`]; delivery
//!   latency per event and progress round trips are recorded;
//! * compactor: every `--compact-interval`, kube's compactor Txn on
//!   `compact_rev_key` (`If(Version = last seen), Then(Put), Else(Get)`)
//!   and, when it wins, Compact at the revision seen one interval earlier.
//!
//! Reported per operation: ops/s and p99 (closed loop), for both systems
//! (interleaved rounds, like `compare`), with ratios ours / etcd.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KvClient, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use rand::Rng;
use serde::Serialize;
use tokio::sync::watch;

use crate::cluster::Cluster;
use crate::keys::{client_rng, prefix_end, stamped_value};
use crate::load::watch::{drain, open_streams, receive};
use crate::load::{connect, merge_into, merge_tasks, Recorders, OP_TIMEOUT};
use crate::pace::{Pacer, Stop};
use crate::report::{fmt_ratio, median, ratio, table, text_table, OutArgs, Outcome};
use crate::stats::RunResult;
use crate::systems::{start_both, SystemArgs, ETCD, OURS};

/// Default subnet of `apiserver`.
pub const DEFAULT_SUBNET: &str = "127.0.52";
/// GuaranteedUpdate attempts before giving up.
pub const MAX_UPDATE_ATTEMPTS: usize = 16;
/// How often each watch stream requests a progress notification.
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
/// Watchers per watch stream.
const WATCHERS_PER_STREAM: usize = 4;
/// Concurrent writers while pre-creating objects.
const PRECREATE_CONCURRENCY: usize = 16;
/// Pages one list may take before it counts as an error.
const MAX_LIST_PAGES: usize = 10_000;
/// Connections shared by all workers.
const CONNS: usize = 4;

/// Options of `bench apiserver`.
#[derive(Args, Clone, Debug)]
pub struct ApiserverArgs {
    #[command(flatten)]
    pub systems: SystemArgs,
    /// Length of each run.
    #[arg(long, default_value = "10s", value_parser = crate::cli::parse_duration)]
    pub duration: Duration,
    /// Rounds (each runs once per system, order alternating).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Objects created before the run.
    #[arg(long, default_value_t = 2000)]
    pub objects: u64,
    /// Concurrent creators.
    #[arg(long, default_value_t = 4)]
    pub creators: usize,
    /// Concurrent updaters.
    #[arg(long, default_value_t = 16)]
    pub updaters: usize,
    /// Objects the updaters fight over.
    #[arg(long, default_value_t = 64)]
    pub hot_keys: u64,
    /// Concurrent listers.
    #[arg(long, default_value_t = 2)]
    pub listers: usize,
    /// Objects per list page.
    #[arg(long, default_value_t = 500)]
    pub page_size: i64,
    /// Prefix watchers.
    #[arg(long, default_value_t = 8)]
    pub watchers: usize,
    /// Compactor period.
    #[arg(long, default_value = "2s", value_parser = crate::cli::parse_duration)]
    pub compact_interval: Duration,
    /// Object size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub val_size: usize,
    /// Tiny run (CI): 2 s, 20 objects, one or two of each worker.
    #[arg(long)]
    pub smoke: bool,
    #[command(flatten)]
    pub out: OutArgs,
}

#[derive(Clone, Debug, Serialize)]
struct Plan {
    duration_s: f64,
    objects: u64,
    creators: usize,
    updaters: usize,
    hot_keys: u64,
    listers: usize,
    page_size: i64,
    watchers: usize,
    compact_interval_s: f64,
    val_size: usize,
    #[serde(skip)]
    seed: u64,
    #[serde(skip)]
    progress: bool,
}

impl Plan {
    fn new(a: &ApiserverArgs, seed: u64, progress: bool) -> Plan {
        if a.smoke {
            return Plan {
                duration_s: 2.0,
                objects: 20,
                creators: 1,
                updaters: 2,
                hot_keys: 2,
                listers: 1,
                page_size: 5,
                watchers: 2,
                compact_interval_s: 0.5,
                val_size: 256,
                seed,
                progress,
            };
        }
        Plan {
            duration_s: a.duration.as_secs_f64(),
            objects: a.objects.max(1),
            creators: a.creators,
            updaters: a.updaters,
            hot_keys: a.hot_keys.clamp(1, a.objects.max(1)),
            listers: a.listers,
            page_size: a.page_size.max(1),
            watchers: a.watchers,
            compact_interval_s: a.compact_interval.as_secs_f64(),
            val_size: a.val_size,
            seed,
            progress,
        }
    }

    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration_s)
    }
}

/// Medians over rounds of one operation on both systems.
#[derive(Clone, Debug, Serialize)]
pub struct OpComparison {
    pub op: String,
    pub ours_ops_s: f64,
    pub etcd_ops_s: f64,
    pub throughput_ratio: f64,
    pub ours_p99_ms: f64,
    pub etcd_p99_ms: f64,
    pub p99_ratio: f64,
    pub ours_errors: u64,
    pub etcd_errors: u64,
}

/// The whole apiserver benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct ApiserverOutcome {
    pub seed: u64,
    pub rounds: usize,
    plan: Plan,
    pub ours: Vec<RunResult>,
    pub etcd: Vec<RunResult>,
    pub comparison: Vec<OpComparison>,
}

/// Runs both systems, interleaved.
pub async fn run(args: &ApiserverArgs, seed: u64, progress: bool) -> Result<ApiserverOutcome> {
    let plan = Plan::new(args, seed, progress);
    let rounds = if args.smoke { 1 } else { args.rounds.max(1) };
    let (ours_spec, etcd_spec) = args.systems.specs(DEFAULT_SUBNET)?;
    let (ours, etcd) = start_both(&ours_spec, &etcd_spec).await?;
    let (mut ours_runs, mut etcd_runs) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [&ours, &etcd]
        } else {
            [&etcd, &ours]
        };
        for cluster in order {
            let r = run_one(cluster, &plan, round)
                .await
                .with_context(|| format!("apiserver on {}", cluster.label))?;
            eprintln!(
                "bench: apiserver round {} {}: {}",
                round + 1,
                cluster.label,
                one_line(&r)
            );
            if cluster.label == OURS {
                ours_runs.push(r)
            } else {
                etcd_runs.push(r)
            }
        }
    }
    let comparison = compare_ops(&ours_runs, &etcd_runs);
    Ok(ApiserverOutcome {
        seed,
        rounds,
        plan,
        ours: ours_runs,
        etcd: etcd_runs,
        comparison,
    })
}

fn one_line(r: &RunResult) -> String {
    r.ops
        .iter()
        .map(|o| {
            format!(
                "{} {:.0}/s p99 {:.1}ms",
                o.name, o.throughput_ops_s, o.latency.p99_ms
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Keys of one run.
#[derive(Clone)]
struct Layout {
    pods: String,
    compact_key: String,
}

impl Layout {
    fn new(round: usize) -> Layout {
        let root = format!("/registry/bench-{round}/");
        Layout {
            pods: format!("{root}pods/default/"),
            compact_key: format!("{root}compact_rev_key"),
        }
    }

    fn object(&self, name: &str) -> Vec<u8> {
        format!("{}{name}", self.pods).into_bytes()
    }

    fn existing(&self, n: u64) -> Vec<u8> {
        self.object(&format!("pod-{n:06}"))
    }
}

async fn run_one(cluster: &Cluster, plan: &Plan, round: usize) -> Result<RunResult> {
    let layout = Layout::new(round);
    let conns = connect(&cluster.endpoints(), CONNS).await?;
    precreate(&conns[0], &layout, plan).await?;
    let mut counters = BTreeMap::new();
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_progress_notify();
    let streams = plan.watchers.div_ceil(WATCHERS_PER_STREAM);
    let open = if plan.watchers > 0 {
        open_streams(
            &conns,
            layout.pods.as_bytes(),
            &opts,
            plan.watchers,
            streams,
        )
        .await?
    } else {
        Vec::new()
    };
    let (target_tx, target_rx) = watch::channel(None);
    let receivers: Vec<_> = open
        .into_iter()
        .map(|s| tokio::spawn(receive(s, target_rx.clone(), Some(PROGRESS_INTERVAL))))
        .collect();
    let started = Instant::now();
    let workers = Workers {
        conns: &conns,
        layout: &layout,
        plan,
    };
    let (mut recs, worker_counters) = workers.run().await;
    let elapsed = started.elapsed();
    let events = ["create", "update"]
        .iter()
        .map(|k| recs.get(k).map_or(0, |r| r.ok()))
        .sum::<u64>();
    let delivered = drain(&target_tx, receivers, events, &mut recs).await?;
    let missing = (events * plan.watchers as u64).saturating_sub(delivered);
    if plan.watchers > 0 {
        recs.entry("watch-delivery")
            .or_default()
            .error_n("missing delivery", missing);
    }
    counters.extend(worker_counters);
    counters.insert("watch_deliveries".into(), delivered as f64);
    counters.insert("missing_deliveries".into(), missing as f64);
    Ok(result(cluster, plan, recs, elapsed, counters))
}

fn result(
    cluster: &Cluster,
    plan: &Plan,
    mut recs: Recorders,
    elapsed: Duration,
    counters: BTreeMap<String, f64>,
) -> RunResult {
    let order = [
        "update",
        "create",
        "list",
        "count",
        "watch-delivery",
        "watch-progress",
        "compact-txn",
        "compact",
    ];
    let mut ops = Vec::new();
    for name in order {
        if let Some(r) = recs.remove(name) {
            ops.push(r.result(name, elapsed));
        }
    }
    ops.extend(recs.iter().map(|(name, r)| r.result(name, elapsed)));
    RunResult {
        workload: "apiserver".into(),
        target: cluster.label.clone(),
        clients: plan.creators + plan.updaters + plan.listers + 1,
        conns: CONNS,
        rate: None,
        seed: plan.seed,
        elapsed_s: elapsed.as_secs_f64(),
        ops,
        counters,
    }
}

/// Creates `plan.objects` objects (not measured).
async fn precreate(conn: &Client, layout: &Layout, plan: &Plan) -> Result<()> {
    let mut tasks = Vec::new();
    for w in 0..PRECREATE_CONCURRENCY as u64 {
        let (mut kv, layout, n, size) = (
            conn.kv_client(),
            layout.clone(),
            plan.objects,
            plan.val_size,
        );
        tasks.push(tokio::spawn(async move {
            for i in (w..n).step_by(PRECREATE_CONCURRENCY) {
                let txn = create_txn(layout.existing(i), size);
                tokio::time::timeout(OP_TIMEOUT, kv.txn(txn))
                    .await
                    .context("pre-create timed out")??;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

fn create_txn(key: Vec<u8>, size: usize) -> Txn {
    Txn::new()
        .when([Compare::mod_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), stamped_value(size), None)])
        .or_else([TxnOp::get(key, None)])
}

struct Workers<'a> {
    conns: &'a [Client],
    layout: &'a Layout,
    plan: &'a Plan,
}

type Counters = BTreeMap<String, f64>;

impl Workers<'_> {
    async fn run(&self) -> (Recorders, Counters) {
        let stop = Stop::new(None, Some(self.plan.duration()));
        let pacer = |show: bool, label: &str| {
            Arc::new(Pacer::new(None, stop, show && self.plan.progress, label))
        };
        let (updates, creates, lists) =
            (pacer(true, "apiserver"), pacer(false, ""), pacer(false, ""));
        let mut tasks = Vec::new();
        let mut counted = Vec::new();
        for i in 0..self.plan.creators {
            tasks.push(tokio::spawn(creator(
                self.kv(i),
                self.layout.clone(),
                i,
                self.plan.val_size,
                creates.clone(),
            )));
        }
        for i in 0..self.plan.updaters {
            let u = Updater::new(self.kv(i), self.layout.clone(), self.plan, i);
            counted.push(tokio::spawn(u.run(updates.clone())));
        }
        for i in 0..self.plan.listers {
            let l = Lister {
                kv: self.kv(i),
                layout: self.layout.clone(),
                page_size: self.plan.page_size,
            };
            counted.push(tokio::spawn(l.run(lists.clone())));
        }
        let compactor = tokio::spawn(compactor(
            self.kv(0),
            self.layout.clone(),
            self.plan.clone(),
        ));
        let mut recs = merge_tasks(tasks).await;
        let mut counters = Counters::new();
        for t in counted {
            match t.await {
                Ok((r, c)) => {
                    merge_into(&mut recs, &r);
                    for (k, v) in c {
                        *counters.entry(k).or_default() += v;
                    }
                }
                Err(e) => recs.entry("worker-task").or_default().error(e),
            }
        }
        match compactor.await {
            Ok(r) => merge_into(&mut recs, &r),
            Err(e) => recs.entry("worker-task").or_default().error(e),
        }
        updates.finish();
        (recs, counters)
    }

    fn kv(&self, i: usize) -> KvClient {
        self.conns[i % self.conns.len()].kv_client()
    }
}

async fn creator(
    mut kv: KvClient,
    layout: Layout,
    id: usize,
    size: usize,
    pacer: Arc<Pacer>,
) -> Recorders {
    let mut recs = Recorders::new();
    while let Some(t) = pacer.next().await {
        let key = layout.object(&format!("new-{id}-{}", t.index));
        let rec = recs.entry("create").or_default();
        match tokio::time::timeout(OP_TIMEOUT, kv.txn(create_txn(key, size))).await {
            Ok(Ok(resp)) if resp.succeeded() => rec.record(t.intended.elapsed()),
            Ok(Ok(_)) => rec.error("object already exists"),
            Ok(Err(e)) => rec.error(e),
            Err(_) => rec.error("timeout"),
        }
        pacer.done();
    }
    recs
}

/// GuaranteedUpdate with a per-worker cache of mod revisions, as the apiserver's watch cache gives it.
struct Updater {
    kv: KvClient,
    layout: Layout,
    hot_keys: u64,
    size: usize,
    rng: rand::rngs::StdRng,
    cache: HashMap<u64, i64>,
}

impl Updater {
    fn new(kv: KvClient, layout: Layout, plan: &Plan, id: usize) -> Updater {
        Updater {
            kv,
            layout,
            hot_keys: plan.hot_keys,
            size: plan.val_size,
            rng: client_rng(plan.seed, id as u64),
            cache: HashMap::new(),
        }
    }

    async fn run(mut self, pacer: Arc<Pacer>) -> (Recorders, Counters) {
        let mut recs = Recorders::new();
        let mut conflicts = 0u64;
        while let Some(t) = pacer.next().await {
            let n = self.rng.gen_range(0..self.hot_keys);
            let outcome = tokio::time::timeout(OP_TIMEOUT, self.update(n)).await;
            let rec = recs.entry("update").or_default();
            match outcome {
                Ok(Ok(c)) => {
                    conflicts += c;
                    rec.record(t.intended.elapsed());
                }
                Ok(Err(e)) => rec.error(format!("{e:#}")),
                Err(_) => rec.error("timeout"),
            }
            pacer.done();
        }
        (
            recs,
            Counters::from([("update_conflicts".to_string(), conflicts as f64)]),
        )
    }

    /// One GuaranteedUpdate of object `n`; returns the number of conflicts it hit.
    async fn update(&mut self, n: u64) -> Result<u64> {
        let key = self.layout.existing(n);
        let mut rev = *self.cache.get(&n).unwrap_or(&0);
        for attempt in 0..MAX_UPDATE_ATTEMPTS {
            let txn = Txn::new()
                .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key.clone(), stamped_value(self.size), None)])
                .or_else([TxnOp::get(key.clone(), None)]);
            let resp = self.kv.txn(txn).await?;
            if resp.succeeded() {
                let new_rev = resp.header().map_or(0, |h| h.revision());
                self.cache.insert(n, new_rev);
                return Ok(attempt as u64);
            }
            rev = current_mod_revision(&resp.op_responses())
                .context("conflict without the current object")?;
        }
        anyhow::bail!("gave up after {MAX_UPDATE_ATTEMPTS} conflicting attempts")
    }
}

fn current_mod_revision(responses: &[TxnOpResponse]) -> Option<i64> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.mod_revision()),
        _ => None,
    })
}

/// Paginated lists with an exact count, and count-only Ranges.
struct Lister {
    kv: KvClient,
    layout: Layout,
    page_size: i64,
}

impl Lister {
    async fn run(mut self, pacer: Arc<Pacer>) -> (Recorders, Counters) {
        let mut recs = Recorders::new();
        let mut mismatches = 0u64;
        while let Some(t) = pacer.next().await {
            match tokio::time::timeout(OP_TIMEOUT, self.list()).await {
                Ok(Ok(exact)) => {
                    mismatches += u64::from(!exact);
                    recs.entry("list").or_default().record(t.intended.elapsed());
                }
                Ok(Err(e)) => recs.entry("list").or_default().error(format!("{e:#}")),
                Err(_) => recs.entry("list").or_default().error("timeout"),
            }
            let started = Instant::now();
            let opts = GetOptions::new().with_prefix().with_count_only();
            match tokio::time::timeout(
                OP_TIMEOUT,
                self.kv.get(self.layout.pods.clone(), Some(opts)),
            )
            .await
            {
                Ok(Ok(_)) => recs.entry("count").or_default().record(started.elapsed()),
                Ok(Err(e)) => recs.entry("count").or_default().error(e),
                Err(_) => recs.entry("count").or_default().error("timeout"),
            }
            pacer.done();
        }
        (
            recs,
            Counters::from([("list_count_mismatches".to_string(), mismatches as f64)]),
        )
    }

    /// Lists the prefix page by page; true if the items match the first page's count.
    async fn list(&mut self) -> Result<bool> {
        let prefix = self.layout.pods.as_bytes().to_vec();
        let end = prefix_end(&prefix);
        let mut key = prefix;
        let (mut revision, mut expected, mut items) = (0i64, 0i64, 0i64);
        for page in 0..MAX_LIST_PAGES {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(self.page_size);
            if revision > 0 {
                opts = opts.with_revision(revision);
            }
            let resp = self.kv.get(key.clone(), Some(opts)).await?;
            if page == 0 {
                revision = resp.header().map_or(0, |h| h.revision());
                expected = resp.count();
            }
            items += resp.kvs().len() as i64;
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    key = last.key().to_vec();
                    key.push(0);
                }
                _ => return Ok(items == expected),
            }
        }
        anyhow::bail!("list did not finish within {MAX_LIST_PAGES} pages")
    }
}

/// kube's compactor: win the compact_rev_key Txn, then compact one interval behind.
async fn compactor(mut kv: KvClient, layout: Layout, plan: Plan) -> Recorders {
    let mut recs = Recorders::new();
    let deadline = Instant::now() + plan.duration();
    let interval = Duration::from_secs_f64(plan.compact_interval_s);
    let (mut version, mut last_rev) = (0i64, 0i64);
    while Instant::now() + interval <= deadline {
        tokio::time::sleep(interval).await;
        let key = layout.compact_key.clone();
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, version)])
            .and_then([TxnOp::put(key.clone(), last_rev.to_string(), None)])
            .or_else([TxnOp::get(key, None)]);
        let started = Instant::now();
        let resp = match tokio::time::timeout(OP_TIMEOUT, kv.txn(txn)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => {
                recs.entry("compact-txn").or_default().error(e);
                continue;
            }
            Err(_) => {
                recs.entry("compact-txn").or_default().error("timeout");
                continue;
            }
        };
        recs.entry("compact-txn")
            .or_default()
            .record(started.elapsed());
        let current = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() {
            version = current_version(&resp.op_responses()).unwrap_or(version);
            continue;
        }
        version += 1;
        if last_rev > 0 {
            let started = Instant::now();
            match tokio::time::timeout(OP_TIMEOUT, kv.compact(last_rev, None)).await {
                Ok(Ok(_)) => recs.entry("compact").or_default().record(started.elapsed()),
                Ok(Err(e)) => recs.entry("compact").or_default().error(e),
                Err(_) => recs.entry("compact").or_default().error("timeout"),
            }
        }
        last_rev = current;
    }
    recs
}

fn current_version(responses: &[TxnOpResponse]) -> Option<i64> {
    responses.iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.version()),
        _ => None,
    })
}

fn compare_ops(ours: &[RunResult], etcd: &[RunResult]) -> Vec<OpComparison> {
    let names: Vec<String> = ours
        .iter()
        .chain(etcd)
        .flat_map(|r| r.ops.iter().map(|o| o.name.clone()))
        .fold(Vec::new(), |mut v, n| {
            if !v.contains(&n) {
                v.push(n);
            }
            v
        });
    names
        .into_iter()
        .map(|op| {
            let stat = |runs: &[RunResult], f: &dyn Fn(&crate::stats::OpResult) -> f64| {
                median(
                    &mut runs
                        .iter()
                        .filter_map(|r| r.ops.iter().find(|o| o.name == op))
                        .map(f)
                        .collect::<Vec<_>>(),
                )
            };
            let errors = |runs: &[RunResult]| {
                runs.iter()
                    .filter_map(|r| r.ops.iter().find(|o| o.name == op))
                    .map(|o| o.errors)
                    .sum()
            };
            let (ot, et) = (
                stat(ours, &|o| o.throughput_ops_s),
                stat(etcd, &|o| o.throughput_ops_s),
            );
            let (o99, e99) = (
                stat(ours, &|o| o.latency.p99_ms),
                stat(etcd, &|o| o.latency.p99_ms),
            );
            OpComparison {
                ours_ops_s: ot,
                etcd_ops_s: et,
                throughput_ratio: ratio(ot, et),
                ours_p99_ms: o99,
                etcd_p99_ms: e99,
                p99_ratio: ratio(o99, e99),
                ours_errors: errors(ours),
                etcd_errors: errors(etcd),
                op,
            }
        })
        .collect()
}

const HEADERS: [&str; 8] = [
    "operation",
    "store ops/s",
    "etcd ops/s",
    "ops/s ratio",
    "store p99 ms",
    "etcd p99 ms",
    "p99 ratio",
    "errors (store/etcd)",
];

impl ApiserverOutcome {
    fn rows(&self) -> Vec<Vec<String>> {
        self.comparison
            .iter()
            .map(|c| {
                vec![
                    c.op.clone(),
                    format!("{:.1}", c.ours_ops_s),
                    format!("{:.1}", c.etcd_ops_s),
                    fmt_ratio(c.throughput_ratio),
                    format!("{:.3}", c.ours_p99_ms),
                    format!("{:.3}", c.etcd_p99_ms),
                    fmt_ratio(c.p99_ratio),
                    format!("{}/{}", c.ours_errors, c.etcd_errors),
                ]
            })
            .collect()
    }

    fn counters_text(&self) -> String {
        let line = |label: &str, runs: &[RunResult]| {
            let mut total: BTreeMap<&str, f64> = BTreeMap::new();
            for r in runs {
                for (k, v) in &r.counters {
                    *total.entry(k.as_str()).or_default() += v;
                }
            }
            let parts: Vec<String> = total.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{label}: {}\n", parts.join(" "))
        };
        line(OURS, &self.ours) + &line(ETCD, &self.etcd)
    }
}

impl Outcome for ApiserverOutcome {
    fn title(&self) -> String {
        "apiserver: kube-apiserver-shaped workload".into()
    }

    fn text(&self) -> String {
        format!(
            "apiserver (seed {}, {} rounds, medians; ratio = store / etcd)\n{}{}",
            self.seed,
            self.rounds,
            text_table(&HEADERS, &self.rows()),
            self.counters_text()
        )
    }

    fn markdown(&self, _dir: &Path) -> Result<String> {
        let p = &self.plan;
        let mut md = format!(
            "{:.0} s runs, {} round(s): {} pre-created objects of {} B; {} creators, {} updaters on {} hot objects \
             (GuaranteedUpdate with conflicts), {} listers (pages of {} at one revision + exact count, count-only \
             Range), {} prefix watchers (prev_kv, progress requests every {} ms), compactor every {:.1} s. \
             Medians over rounds; ratio = store / etcd.\n\n",
            p.duration_s,
            self.rounds,
            p.objects,
            p.val_size,
            p.creators,
            p.updaters,
            p.hot_keys,
            p.listers,
            p.page_size,
            p.watchers,
            PROGRESS_INTERVAL.as_millis(),
            p.compact_interval_s
        );
        md.push_str(&table(&HEADERS, &self.rows()));
        md.push_str(&format!(
            "\nTotals over rounds:\n\n```\n{}```\n",
            self.counters_text()
        ));
        Ok(md)
    }
}
