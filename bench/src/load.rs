//! The load generator: etcd `benchmark`-style workloads against any etcd-API endpoints.
//!
//! * `put`: one Put of `--val-size` bytes per operation.
//! * `range`: one single-key Range over a pre-filled key space, linearizable
//!   (`--consistency l`, a read-index round trip through the leader) or
//!   serializable (`s`, served by the member the client talks to).
//! * `txn-put`: a Txn whose success branch holds `--txn-ops` Puts of
//!   distinct keys (etcd rejects duplicate keys in one Txn).
//! * `txn-mixed`: Txns that either read (`--txn-ops` Ranges) or write
//!   (`--txn-ops` Puts), `--rw-ratio` reads per write, over a pre-filled key space.
//! * `watch`: see [`watch`].
//! * `lease-keepalive`: every client holds one lease and sends
//!   LeaseKeepAlive requests on its own stream; latency is request to
//!   response on that stream.
//!
//! `--clients` tasks share `--conns` gRPC connections (see
//! [`crate::grpc_conn`]); client `i` sends its `n`-th key-value operation on
//! connection `(i + n) % conns`, so each client's operations visit every
//! member in turn, a lone client's too (one connection per client would pin
//! it to whichever member, leader or follower, its connection reached).
//! Operations are issued by a shared [`Pacer`]
//! (closed or open loop, see [`crate::pace`]); each one is bounded by
//! [`OP_TIMEOUT`]. With `--target-leader` all connections go to the member
//! that is leader when the run starts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use etcd_client::{Client, GetOptions, KvClient, Txn, TxnOp};
use rand::Rng;
use serde::Serialize;

use crate::keys::{key_with_prefix, stamped_value, KeyGen};
use crate::pace::{Pacer, Stop};
use crate::stats::{Recorder, RunResult};

pub mod watch;

/// Longest time one operation may take before it counts as an error.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect timeout of load-generating connections.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Most keys written before a read workload.
pub const MAX_PREFILL_KEYS: u64 = 100_000;
/// Concurrent writers while pre-filling.
const PREFILL_CONCURRENCY: u64 = 32;
/// TTL of the leases of `lease-keepalive`, in seconds.
const LEASE_TTL_S: i64 = 60;

/// What to run and how hard.
#[derive(Clone, Debug, Serialize)]
pub struct LoadConfig {
    /// Client URLs (`http://host:port`).
    pub endpoints: Vec<String>,
    pub conns: usize,
    pub clients: usize,
    #[serde(skip)]
    pub stop: Stop,
    pub rate: Option<f64>,
    pub key_size: usize,
    pub val_size: usize,
    pub key_space: u64,
    pub sequential: bool,
    pub target_leader: bool,
    pub seed: u64,
    #[serde(skip)]
    pub progress: bool,
    /// Name of the system under test, for reports.
    pub target: String,
    /// Prefix of every key the run touches.
    pub prefix: String,
}

/// The kinds of load.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Workload {
    Put,
    Range { serializable: bool },
    TxnPut { ops: usize },
    TxnMixed { ops: usize, rw_ratio: f64 },
    Watch { watchers: usize, streams: usize },
    LeaseKeepalive,
}

impl Workload {
    /// Short name used in output and reports.
    pub fn name(&self) -> String {
        match self {
            Workload::Put => "put".into(),
            Workload::Range {
                serializable: false,
            } => "range-linearizable".into(),
            Workload::Range { serializable: true } => "range-serializable".into(),
            Workload::TxnPut { .. } => "txn-put".into(),
            Workload::TxnMixed { .. } => "txn-mixed".into(),
            Workload::Watch { .. } => "watch".into(),
            Workload::LeaseKeepalive => "lease-keepalive".into(),
        }
    }

    fn main_op(&self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::Range { .. } => "range",
            Workload::TxnPut { .. } | Workload::TxnMixed { .. } => "txn",
            Workload::Watch { .. } => "watch-delivery",
            Workload::LeaseKeepalive => "keepalive",
        }
    }

    fn needs_prefill(&self) -> bool {
        matches!(self, Workload::Range { .. } | Workload::TxnMixed { .. })
    }
}

/// Recorders of one run, by operation name.
pub type Recorders = BTreeMap<&'static str, Recorder>;

/// Runs `workload` as configured and returns its result.
pub async fn run(cfg: &LoadConfig, workload: &Workload) -> Result<RunResult> {
    let endpoints = resolve_endpoints(cfg).await?;
    let conns = connect(&endpoints, cfg.conns).await?;
    if workload.needs_prefill() {
        prefill(&conns[0], cfg).await?;
    }
    let started = Instant::now();
    let (recs, counters) = match workload {
        Workload::Watch { watchers, streams } => {
            watch::run(cfg, &conns, *watchers, *streams).await?
        }
        Workload::LeaseKeepalive => (run_leases(cfg, &conns).await, BTreeMap::new()),
        _ => (run_kv(cfg, &conns, workload).await, BTreeMap::new()),
    };
    Ok(finish(
        cfg,
        conns.len(),
        workload,
        recs,
        started.elapsed(),
        counters,
    ))
}

/// Builds the result of a run over `conns` connections (as opened: see
/// [`connect`]); the main operation goes first.
pub fn finish(
    cfg: &LoadConfig,
    conns: usize,
    workload: &Workload,
    mut recs: Recorders,
    elapsed: Duration,
    counters: BTreeMap<String, f64>,
) -> RunResult {
    let main = workload.main_op();
    let mut ops = vec![recs.remove(main).unwrap_or_default().result(main, elapsed)];
    ops.extend(recs.iter().map(|(name, r)| r.result(name, elapsed)));
    RunResult {
        workload: workload.name(),
        target: cfg.target.clone(),
        clients: cfg.clients,
        conns,
        rate: cfg.rate,
        seed: cfg.seed,
        elapsed_s: elapsed.as_secs_f64(),
        ops,
        counters,
    }
}

async fn resolve_endpoints(cfg: &LoadConfig) -> Result<Vec<String>> {
    if cfg.target_leader {
        Ok(vec![crate::cluster::leader_endpoint(&cfg.endpoints).await?])
    } else {
        Ok(cfg.endpoints.clone())
    }
}

/// Opens about `n` connections spread over `endpoints` (see [`crate::grpc_conn`]).
pub async fn connect(endpoints: &[String], n: usize) -> Result<Vec<Client>> {
    crate::grpc_conn::connect_spread(endpoints, n, CONNECT_TIMEOUT).await
}

/// Writes the first `min(key_space, MAX_PREFILL_KEYS)` keys of the run's key space.
async fn prefill(conn: &Client, cfg: &LoadConfig) -> Result<()> {
    let n = cfg.key_space.clamp(1, MAX_PREFILL_KEYS);
    let mut tasks = Vec::new();
    for w in 0..PREFILL_CONCURRENCY.min(n) {
        let mut kv = conn.kv_client();
        let (prefix, key_size, val_size) = (cfg.prefix.clone(), cfg.key_size, cfg.val_size);
        tasks.push(tokio::spawn(async move {
            for i in (w..n).step_by(PREFILL_CONCURRENCY as usize) {
                let key = key_with_prefix(&prefix, key_size, i);
                tokio::time::timeout(OP_TIMEOUT, kv.put(key, stamped_value(val_size), None))
                    .await
                    .context("prefill put timed out")??;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

pub(crate) async fn run_kv(cfg: &LoadConfig, conns: &[Client], workload: &Workload) -> Recorders {
    let pacer = Arc::new(Pacer::new(
        cfg.rate,
        cfg.stop,
        cfg.progress,
        &workload.name(),
    ));
    let mut tasks = Vec::with_capacity(cfg.clients);
    let kvs: Vec<KvClient> = conns.iter().map(Client::kv_client).collect();
    for c in 0..cfg.clients.max(1) {
        let keys = KeyGen::new(
            &cfg.prefix,
            cfg.key_size,
            cfg.key_space,
            cfg.sequential,
            cfg.seed,
            c as u64,
        );
        let task = KvTask {
            kvs: kvs.clone(),
            turn: c,
            keys,
            workload: workload.clone(),
            val_size: cfg.val_size,
            pacer: pacer.clone(),
        };
        tasks.push(tokio::spawn(task.run()));
    }
    let recs = merge_tasks(tasks).await;
    pacer.finish();
    recs
}

/// Joins client tasks and merges their recorders.
pub async fn merge_tasks(tasks: Vec<tokio::task::JoinHandle<Recorders>>) -> Recorders {
    let mut all = Recorders::new();
    for t in tasks {
        match t.await {
            Ok(recs) => merge_into(&mut all, &recs),
            Err(e) => all.entry("client-task").or_default().error(e),
        }
    }
    all
}

/// Adds every recorder of `from` to `into`.
pub fn merge_into(into: &mut Recorders, from: &Recorders) {
    for (name, r) in from {
        into.entry(name).or_default().merge(r);
    }
}

struct KvTask {
    /// One client per connection; operations take them in turn.
    kvs: Vec<KvClient>,
    /// Index (modulo `kvs.len()`) of the connection of the next operation.
    turn: usize,
    keys: KeyGen,
    workload: Workload,
    val_size: usize,
    pacer: Arc<Pacer>,
}

impl KvTask {
    async fn run(mut self) -> Recorders {
        let mut recs = Recorders::new();
        let main = self.workload.main_op();
        while let Some(ticket) = self.pacer.next().await {
            let outcome = tokio::time::timeout(OP_TIMEOUT, self.op(ticket.index)).await;
            let latency = ticket.intended.elapsed();
            match outcome {
                Ok(Ok(sub)) => {
                    recs.entry(main).or_default().record(latency);
                    if let Some(sub) = sub {
                        recs.entry(sub).or_default().record(latency);
                    }
                }
                Ok(Err(e)) => recs.entry(main).or_default().error(e),
                Err(_) => recs.entry(main).or_default().error("timeout"),
            }
            self.pacer.done();
        }
        recs
    }

    /// The connection of the next operation.
    fn next_conn(&mut self) -> usize {
        let conn = self.turn % self.kvs.len();
        self.turn = conn + 1;
        conn
    }

    /// One operation; returns the name of a sub-kind to record as well.
    async fn op(&mut self, index: u64) -> Result<Option<&'static str>, etcd_client::Error> {
        let conn = self.next_conn();
        match self.workload.clone() {
            Workload::Put => {
                let key = self.keys.key(index);
                let value = stamped_value(self.val_size);
                self.kvs[conn].put(key, value, None).await?;
                Ok(None)
            }
            Workload::Range { serializable } => {
                let key = self.keys.key(index);
                let opts = serializable.then(|| GetOptions::new().with_serializable());
                self.kvs[conn].get(key, opts).await?;
                Ok(None)
            }
            Workload::TxnPut { ops } => {
                let txn = self.put_txn(index, ops);
                self.kvs[conn].txn(txn).await?;
                Ok(None)
            }
            Workload::TxnMixed { ops, rw_ratio } => {
                let read = self.keys.rng().gen_bool(rw_ratio / (1.0 + rw_ratio));
                let txn = if read {
                    self.read_txn(index, ops)
                } else {
                    self.put_txn(index, ops)
                };
                self.kvs[conn].txn(txn).await?;
                Ok(Some(if read { "txn-read" } else { "txn-write" }))
            }
            Workload::Watch { .. } | Workload::LeaseKeepalive => Ok(None),
        }
    }

    fn put_txn(&mut self, index: u64, ops: usize) -> Txn {
        let puts: Vec<TxnOp> = (self.keys.distinct_keys(index, ops.max(1)).into_iter())
            .map(|key| TxnOp::put(key, stamped_value(self.val_size), None))
            .collect();
        Txn::new().and_then(puts)
    }

    fn read_txn(&mut self, index: u64, ops: usize) -> Txn {
        let gets: Vec<TxnOp> = (self.keys.distinct_keys(index, ops.max(1)).into_iter())
            .map(|key| TxnOp::get(key, None))
            .collect();
        Txn::new().and_then(gets)
    }
}

async fn run_leases(cfg: &LoadConfig, conns: &[Client]) -> Recorders {
    let pacer = Arc::new(Pacer::new(
        cfg.rate,
        cfg.stop,
        cfg.progress,
        "lease-keepalive",
    ));
    let mut tasks = Vec::with_capacity(cfg.clients);
    for c in 0..cfg.clients.max(1) {
        let conn = conns[c % conns.len()].clone();
        tasks.push(tokio::spawn(lease_client(conn, pacer.clone())));
    }
    let recs = merge_tasks(tasks).await;
    pacer.finish();
    recs
}

async fn lease_client(mut conn: Client, pacer: Arc<Pacer>) -> Recorders {
    let mut recs = Recorders::new();
    let rec = recs.entry("keepalive").or_default();
    let setup = async {
        let lease = conn.lease_grant(LEASE_TTL_S, None).await?;
        let (keeper, stream) = conn.lease_keep_alive(lease.id()).await?;
        Ok::<_, etcd_client::Error>((lease.id(), keeper, stream))
    };
    let (id, mut keeper, mut stream) = match tokio::time::timeout(OP_TIMEOUT, setup).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            rec.error(format!("lease setup: {e}"));
            return recs;
        }
        Err(_) => {
            rec.error("lease setup: timeout");
            return recs;
        }
    };
    while let Some(ticket) = pacer.next().await {
        let round_trip = async {
            keeper.keep_alive().await?;
            stream.message().await
        };
        match tokio::time::timeout(OP_TIMEOUT, round_trip).await {
            Ok(Ok(Some(_))) => rec.record(ticket.intended.elapsed()),
            Ok(Ok(None)) => rec.error("keepalive stream closed"),
            Ok(Err(e)) => rec.error(e),
            Err(_) => rec.error("timeout"),
        }
        pacer.done();
    }
    let _ = tokio::time::timeout(OP_TIMEOUT, conn.lease_revoke(id)).await;
    recs
}
