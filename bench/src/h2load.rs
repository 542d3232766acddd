//! `h2load`: raw gRPC load from an outside generator, our cluster vs etcd 3.5.
//!
//! Our own load generator is a Rust gRPC client; a slow or fast client
//! could flatter either side. This subcommand drives both clusters with
//! nghttp2's `h2load` instead: it sends one fixed, pre-encoded gRPC request
//! (a 5-byte gRPC frame header plus the protobuf message) over `c` HTTP/2
//! connections with up to `m` concurrent streams each, and reports
//! requests/s and the mean, sd and max time per request.
//!
//! h2load counts HTTP statuses, and gRPC answers errors with HTTP 200 and a
//! `grpc-status` trailer, so a run is only trusted when the store's own
//! books agree: for writes, the revision on the target member must grow by
//! at least the number of requests h2load saw succeed (one revision per Put
//! or Txn) and at most that plus the streams still in flight when a timed
//! run stops (h2load does not count those); for reads, it must not move. A
//! gRPC error answered with HTTP 200 adds no revision, so the check catches
//! it. A run that fails the check is reported as an error, not as a number.
//!
//! Each run also reports the CPU time (user + system) the three members
//! used from h2load's start until the revision settled, per 10,000
//! successful requests: on a machine of two cores, throughput is a CPU
//! budget, and this is what each system spends of it per request.
//!
//! Rounds alternate which system goes first (ABBA), and every number in the
//! summary is the median over rounds. Both clusters run for the whole
//! command, one after the other on the same cores.
//!
//! Workload specs are `name[:key=value...]`: names `put`, `txn-put` (two
//! Puts per Txn), `range-l`, `range-s`; keys `c` (HTTP/2 connections) and
//! `m` (concurrent streams per connection). Example: `put:c=100:m=10` is
//! 1,000 streams in flight.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use etcd_proto::etcdserverpb::{request_op, PutRequest, RangeRequest, RequestOp, TxnRequest};
use prost::Message;
use serde::Serialize;

use crate::cluster::{control_client, Cluster};
use crate::report::{fmt_ratio, median, ratio, table, text_table, OutArgs, Outcome};
use crate::systems::{abba, start_both, workload_texts, SystemArgs, ETCD, OURS};

/// Default subnet of `h2load` (its own, so it can run beside `compare`).
pub const DEFAULT_SUBNET: &str = "127.0.53";
/// Default h2load binary (Debian's nghttp2-client).
pub const DEFAULT_H2LOAD: &str = "/usr/bin/h2load";
/// Workloads of a full run: one stream, 1,000 streams, reads.
pub const DEFAULT_WORKLOADS: &[&str] = &[
    "put:c=1:m=1",
    "put:c=16:m=1",
    "put:c=100:m=10",
    "txn-put:c=100:m=10",
    "range-l:c=100:m=10",
    "range-s:c=100:m=10",
];
/// Workloads of the smoke mode.
pub const SMOKE_WORKLOADS: &[&str] = &["put:c=2:m=2", "range-l:c=2:m=2"];
/// Requests per run in smoke mode (instead of a duration).
pub const SMOKE_REQUESTS: u64 = 50;
/// Most HTTP/2 connections a spec may open.
const MAX_CONNECTIONS: u64 = 1_000;
/// Most concurrent streams per connection a spec may ask for.
const MAX_STREAMS_PER_CONNECTION: u64 = 100;
/// Key size of every request, bytes.
const KEY_SIZE_BYTES: usize = 32;
/// Value size of every Put, bytes.
const VALUE_SIZE_BYTES: usize = 256;
/// Keys pre-written for the range workloads (they read one of them).
const RANGE_KEY: &str = "h2load/range/key";
/// Longest an h2load run may take beyond its own duration before it is
/// considered hung (connect, drain of in-flight streams).
const RUN_GRACE: Duration = Duration::from_secs(60);

/// Options of `bench h2load`.
#[derive(Args, Clone, Debug)]
pub struct H2loadArgs {
    #[command(flatten)]
    pub systems: SystemArgs,
    /// The h2load binary (Debian package nghttp2-client).
    #[arg(long, default_value = DEFAULT_H2LOAD)]
    pub h2load_bin: PathBuf,
    /// Rounds (each runs every workload once per system).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Length of each run, whole seconds (h2load's -D).
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Workload specs (comma-separated), see the module docs.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Which member receives the load: the leader, or a follower (whose
    /// writes take one more hop).
    #[arg(long, default_value = "leader", value_parser = ["leader", "follower"])]
    pub target: String,
    /// Tiny runs of every smoke workload (CI): 1 round, a few requests each.
    #[arg(long)]
    pub smoke: bool,
    #[command(flatten)]
    pub out: OutArgs,
}

/// What a workload sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kind {
    Put,
    TxnPut,
    RangeLinearizable,
    RangeSerializable,
}

impl Kind {
    /// gRPC method path.
    fn path(self) -> &'static str {
        match self {
            Kind::Put => "/etcdserverpb.KV/Put",
            Kind::TxnPut => "/etcdserverpb.KV/Txn",
            Kind::RangeLinearizable | Kind::RangeSerializable => "/etcdserverpb.KV/Range",
        }
    }

    /// Revisions one successful request adds.
    fn revisions_per_request(self) -> u64 {
        match self {
            Kind::Put | Kind::TxnPut => 1,
            Kind::RangeLinearizable | Kind::RangeSerializable => 0,
        }
    }

    /// The protobuf message every request carries.
    fn message(self) -> Vec<u8> {
        let key = padded("h2load/put/", KEY_SIZE_BYTES);
        let value = vec![b'v'; VALUE_SIZE_BYTES];
        let put = |k: Vec<u8>| PutRequest {
            key: k,
            value: value.clone(),
            ..Default::default()
        };
        match self {
            Kind::Put => put(key).encode_to_vec(),
            Kind::TxnPut => {
                let op = |k: Vec<u8>| RequestOp {
                    request: Some(request_op::Request::RequestPut(put(k))),
                };
                TxnRequest {
                    compare: Vec::new(),
                    success: vec![op(key.clone()), op(padded("h2load/txn/", KEY_SIZE_BYTES))],
                    failure: Vec::new(),
                }
                .encode_to_vec()
            }
            Kind::RangeLinearizable | Kind::RangeSerializable => RangeRequest {
                key: RANGE_KEY.as_bytes().to_vec(),
                serializable: self == Kind::RangeSerializable,
                ..Default::default()
            }
            .encode_to_vec(),
        }
    }
}

/// `prefix` padded with `x` to `len` bytes.
fn padded(prefix: &str, len: usize) -> Vec<u8> {
    let mut k = prefix.as_bytes().to_vec();
    k.resize(len.max(k.len()), b'x');
    k
}

/// A gRPC frame: uncompressed flag, 4-byte big-endian length, message.
pub fn grpc_frame(message: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(message.len()).context("gRPC message longer than 4 GiB")?;
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(message);
    Ok(frame)
}

/// A parsed workload spec.
#[derive(Clone, Debug, Serialize)]
pub struct Spec {
    pub text: String,
    pub kind: Kind,
    pub connections: u64,
    pub streams: u64,
}

/// Parses `name[:c=N][:m=N]`.
pub fn parse_spec(text: &str) -> Result<Spec> {
    let mut parts = text.split(':');
    let kind = match parts.next().unwrap_or_default() {
        "put" => Kind::Put,
        "txn-put" => Kind::TxnPut,
        "range-l" => Kind::RangeLinearizable,
        "range-s" => Kind::RangeSerializable,
        other => bail!("unknown h2load workload {other:?} in {text:?}"),
    };
    let mut kv = BTreeMap::new();
    for p in parts {
        let (k, v) = p
            .split_once('=')
            .with_context(|| format!("bad option {p:?} in workload {text:?}"))?;
        let n: u64 = v
            .parse()
            .with_context(|| format!("bad {k}={v} in {text:?}"))?;
        kv.insert(k.to_string(), n);
    }
    if let Some(bad) = kv.keys().find(|k| !["c", "m"].contains(&k.as_str())) {
        bail!("unknown option {bad:?} in workload {text:?} (use c and m)");
    }
    let connections = kv.get("c").copied().unwrap_or(1);
    let streams = kv.get("m").copied().unwrap_or(1);
    ensure!(
        (1..=MAX_CONNECTIONS).contains(&connections),
        "c must be 1..={MAX_CONNECTIONS} in {text:?}"
    );
    ensure!(
        (1..=MAX_STREAMS_PER_CONNECTION).contains(&streams),
        "m must be 1..={MAX_STREAMS_PER_CONNECTION} in {text:?}"
    );
    Ok(Spec {
        text: text.to_string(),
        kind,
        connections,
        streams,
    })
}

/// One h2load run, as h2load reported it and as the store's books checked it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct H2Run {
    pub requests_s: f64,
    pub started: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub mean_ms: f64,
    pub sd_ms: f64,
    pub max_ms: f64,
    /// Revision growth on the target member during the run.
    pub revisions: u64,
    /// CPU seconds (user + system, the three members summed) per 10,000
    /// successful requests, from h2load's start until the revision settled.
    pub cpu_s_per_10k: f64,
}

/// Requests [`H2Run::cpu_s_per_10k`] counts CPU time per.
const CPU_PER_REQUESTS: f64 = 10_000.0;

/// CPU seconds per [`CPU_PER_REQUESTS`] requests; 0 when none succeeded.
fn cpu_per_10k(cpu_seconds: f64, succeeded: u64) -> f64 {
    if succeeded == 0 {
        0.0
    } else {
        cpu_seconds * CPU_PER_REQUESTS / succeeded as f64
    }
}

/// Parses h2load's summary (`finished in ...`, `requests: ...`, `time for request: ...`).
pub fn parse_output(text: &str) -> Result<H2Run> {
    let mut run = H2Run::default();
    let mut seen = (false, false, false);
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("finished in ") {
            let rate = rest
                .split(", ")
                .nth(1)
                .and_then(|s| s.strip_suffix(" req/s"))
                .with_context(|| format!("unexpected h2load line {line:?}"))?;
            run.requests_s = rate.parse().context("h2load req/s")?;
            seen.0 = true;
        } else if let Some(rest) = line.strip_prefix("requests: ") {
            run.started = count_before(rest, " started")?;
            run.succeeded = count_before(rest, " succeeded")?;
            run.failed = count_before(rest, " failed")? + count_before(rest, " errored")?;
            seen.1 = true;
        } else if let Some(rest) = line.strip_prefix("time for request:") {
            let cells: Vec<&str> = rest.split_whitespace().collect();
            ensure!(cells.len() >= 4, "unexpected h2load line {line:?}");
            run.max_ms = millis(cells[1])?;
            run.mean_ms = millis(cells[2])?;
            run.sd_ms = millis(cells[3])?;
            seen.2 = true;
        }
    }
    ensure!(
        seen == (true, true, true),
        "h2load printed no summary:\n{text}"
    );
    Ok(run)
}

/// The number right before `label` in `... 10 succeeded, 0 failed ...`.
fn count_before(text: &str, label: &str) -> Result<u64> {
    let end = text
        .find(label)
        .with_context(|| format!("no {label:?} in {text:?}"))?;
    let number = text[..end].rsplit([' ', ',']).next().unwrap_or_default();
    number
        .parse()
        .with_context(|| format!("bad count before {label:?} in {text:?}"))
}

/// `778us`, `8.87ms`, `1.2s` in milliseconds.
fn millis(cell: &str) -> Result<f64> {
    let (num, scale) = if let Some(n) = cell.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = cell.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = cell.strip_suffix('s') {
        (n, 1000.0)
    } else {
        bail!("bad h2load time {cell:?}")
    };
    Ok(num
        .parse::<f64>()
        .with_context(|| format!("bad h2load time {cell:?}"))?
        * scale)
}

/// Medians over rounds and ratios ours / etcd.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub ours_requests_s: f64,
    pub etcd_requests_s: f64,
    pub throughput_ratio: f64,
    pub ours_mean_ms: f64,
    pub etcd_mean_ms: f64,
    pub mean_ratio: f64,
    pub ours_max_ms: f64,
    pub etcd_max_ms: f64,
    pub ours_cpu_s_per_10k: f64,
    pub etcd_cpu_s_per_10k: f64,
}

/// Results of one workload on both systems.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub spec: Spec,
    pub ours: Vec<H2Run>,
    pub etcd: Vec<H2Run>,
    pub summary: Summary,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct H2loadOutcome {
    pub rounds: usize,
    pub seconds: u64,
    pub target: String,
    pub h2load: String,
    pub workloads: Vec<WorkloadResult>,
}

/// Runs the comparison.
pub async fn run(args: &H2loadArgs) -> Result<H2loadOutcome> {
    crate::bins::require_executable(
        &args.h2load_bin,
        "h2load",
        "install Debian's nghttp2-client (scripts/setup.sh does)",
    )?;
    let texts = workload_texts(
        &args.workloads,
        args.smoke,
        SMOKE_WORKLOADS,
        DEFAULT_WORKLOADS,
    );
    let specs: Vec<Spec> = texts.iter().map(|t| parse_spec(t)).collect::<Result<_>>()?;
    let rounds = if args.smoke { 1 } else { args.rounds.max(1) };
    let body_dir = tempfile::tempdir()?;
    let (ours_spec, etcd_spec) = args.systems.specs(DEFAULT_SUBNET)?;
    let (ours, etcd) = start_both(&ours_spec, &etcd_spec).await?;
    for cluster in [&ours, &etcd] {
        prepare(cluster).await?;
    }
    let bodies: Vec<PathBuf> = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| write_body(body_dir.path(), i, spec.kind))
        .collect::<Result<_>>()?;
    let mut results = vec![(Vec::new(), Vec::new()); specs.len()];
    for round in 0..rounds {
        for (i, spec) in specs.iter().enumerate() {
            for (is_ours, cluster) in abba(round, i, &ours, &etcd) {
                let one = RunOne {
                    args,
                    spec,
                    body: &bodies[i],
                };
                let result = one.exec(cluster).await?;
                eprintln!(
                    "bench: round {}/{rounds} {:<22} {:<5} {:>10.1} req/s mean {:.3} ms, \
                     {:.2} CPU s per 10k",
                    round + 1,
                    spec.text,
                    cluster.label,
                    result.requests_s,
                    result.mean_ms,
                    result.cpu_s_per_10k
                );
                let (o, e) = &mut results[i];
                if is_ours { o } else { e }.push(result);
            }
        }
    }
    Ok(H2loadOutcome {
        rounds,
        seconds: args.seconds,
        target: args.target.clone(),
        h2load: crate::procs::version_line(&args.h2load_bin, &["--version"]),
        workloads: specs
            .into_iter()
            .zip(results)
            .map(|(spec, (ours, etcd))| WorkloadResult {
                summary: summarize(&ours, &etcd),
                spec,
                ours,
                etcd,
            })
            .collect(),
    })
}

/// Writes the key the range workloads read.
async fn prepare(cluster: &Cluster) -> Result<()> {
    let mut client = control_client(&cluster.endpoints()).await?;
    client
        .put(RANGE_KEY, vec![b'v'; VALUE_SIZE_BYTES], None)
        .await
        .with_context(|| format!("{}: writing {RANGE_KEY}", cluster.label))?;
    Ok(())
}

/// Writes the framed request of workload `i` into `dir`.
fn write_body(dir: &Path, i: usize, kind: Kind) -> Result<PathBuf> {
    let path = dir.join(format!("request-{i}.bin"));
    std::fs::write(&path, grpc_frame(&kind.message())?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

struct RunOne<'a> {
    args: &'a H2loadArgs,
    spec: &'a Spec,
    body: &'a Path,
}

impl RunOne<'_> {
    async fn exec(&self, cluster: &Cluster) -> Result<H2Run> {
        let endpoint = self.target(cluster).await?;
        // Settled on both sides: requests h2load abandoned when its run
        // ended may still apply, and belong to that run.
        let before = settled_revision(&endpoint).await?;
        let cpu_before = cluster.cpu_seconds();
        let output = self.h2load(&endpoint).await?;
        let after = settled_revision(&endpoint).await?;
        let cpu = cluster.cpu_seconds() - cpu_before;
        let mut run = parse_output(&output)
            .with_context(|| format!("{} on {}", self.spec.text, cluster.label))?;
        run.revisions = after.saturating_sub(before);
        run.cpu_s_per_10k = cpu_per_10k(cpu, run.succeeded);
        let per_request = self.spec.kind.revisions_per_request();
        let least = run.succeeded * per_request;
        let most = (run.succeeded + self.spec.connections * self.spec.streams) * per_request;
        ensure!(
            run.failed == 0 && (least..=most).contains(&run.revisions),
            "{} on {}: h2load saw {} started, {} succeeded and {} failed, but the revision grew \
             by {} (expected {least}..={most}); some gRPC calls failed",
            self.spec.text,
            cluster.label,
            run.started,
            run.succeeded,
            run.failed,
            run.revisions
        );
        Ok(run)
    }

    /// The endpoint that receives the load.
    async fn target(&self, cluster: &Cluster) -> Result<String> {
        let leader = cluster.leader_index().await?;
        let i = if self.args.target == "leader" {
            leader
        } else {
            (leader + 1) % cluster.members.len()
        };
        Ok(cluster.members[i].client_url.clone())
    }

    async fn h2load(&self, endpoint: &str) -> Result<String> {
        let mut cmd = Command::new(&self.args.h2load_bin);
        cmd.arg("-c")
            .arg(self.spec.connections.to_string())
            .arg("-m")
            .arg(self.spec.streams.to_string())
            .arg("-d")
            .arg(self.body)
            .args(["-H", "content-type: application/grpc", "-H", "te: trailers"]);
        let limit = if self.args.smoke {
            cmd.arg("-n").arg(SMOKE_REQUESTS.to_string());
            RUN_GRACE
        } else {
            cmd.arg("-D").arg(self.args.seconds.to_string());
            RUN_GRACE + Duration::from_secs(self.args.seconds)
        };
        cmd.arg(format!("{endpoint}{}", self.spec.kind.path()));
        let output = tokio::time::timeout(
            limit,
            tokio::process::Command::from(cmd)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .with_context(|| format!("h2load did not finish within {limit:?}"))?
        .context("running h2load")?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        ensure!(
            output.status.success(),
            "h2load failed ({}): {text}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(text)
    }
}

/// Pause between two revision reads while waiting for writes to settle.
const SETTLE_POLL: Duration = Duration::from_millis(250);
/// Longest wait for the revision to stop moving.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(15);

/// The revision `endpoint` reports once two reads [`SETTLE_POLL`] apart
/// agree (writes of a finished run still being applied have landed).
async fn settled_revision(endpoint: &str) -> Result<u64> {
    let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
    let mut last = revision(endpoint).await?;
    loop {
        tokio::time::sleep(SETTLE_POLL).await;
        let now = revision(endpoint).await?;
        if now == last {
            return Ok(now);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the revision of {endpoint} still moves after {SETTLE_TIMEOUT:?} ({last} -> {now})"
        );
        last = now;
    }
}

/// The store revision `endpoint` reports.
async fn revision(endpoint: &str) -> Result<u64> {
    let mut client = control_client(&[endpoint.to_string()]).await?;
    let status = client.status().await.context("Status")?;
    let rev = status.header().map_or(0, |h| h.revision());
    u64::try_from(rev).context("negative revision")
}

fn summarize(ours: &[H2Run], etcd: &[H2Run]) -> Summary {
    let med = |runs: &[H2Run], f: &dyn Fn(&H2Run) -> f64| {
        median(&mut runs.iter().map(f).collect::<Vec<_>>())
    };
    let (ot, et) = (med(ours, &|r| r.requests_s), med(etcd, &|r| r.requests_s));
    let (om, em) = (med(ours, &|r| r.mean_ms), med(etcd, &|r| r.mean_ms));
    Summary {
        ours_requests_s: ot,
        etcd_requests_s: et,
        throughput_ratio: ratio(ot, et),
        ours_mean_ms: om,
        etcd_mean_ms: em,
        mean_ratio: ratio(om, em),
        ours_max_ms: med(ours, &|r| r.max_ms),
        etcd_max_ms: med(etcd, &|r| r.max_ms),
        ours_cpu_s_per_10k: med(ours, &|r| r.cpu_s_per_10k),
        etcd_cpu_s_per_10k: med(etcd, &|r| r.cpu_s_per_10k),
    }
}

const HEADERS: &[&str] = &[
    "workload",
    "streams",
    "store req/s",
    "etcd req/s",
    "ratio",
    "store mean ms",
    "etcd mean ms",
    "mean ratio",
    "store max ms",
    "etcd max ms",
    "store CPU s/10k",
    "etcd CPU s/10k",
];

fn rows(outcome: &H2loadOutcome) -> Vec<Vec<String>> {
    outcome
        .workloads
        .iter()
        .map(|w| {
            let s = &w.summary;
            vec![
                w.spec.text.clone(),
                (w.spec.connections * w.spec.streams).to_string(),
                format!("{:.0}", s.ours_requests_s),
                format!("{:.0}", s.etcd_requests_s),
                fmt_ratio(s.throughput_ratio),
                format!("{:.3}", s.ours_mean_ms),
                format!("{:.3}", s.etcd_mean_ms),
                fmt_ratio(s.mean_ratio),
                format!("{:.1}", s.ours_max_ms),
                format!("{:.1}", s.etcd_max_ms),
                format!("{:.2}", s.ours_cpu_s_per_10k),
                format!("{:.2}", s.etcd_cpu_s_per_10k),
            ]
        })
        .collect()
}

impl Outcome for H2loadOutcome {
    fn title(&self) -> String {
        format!("Raw gRPC with h2load: {OURS} vs {ETCD} 3.5")
    }

    fn text(&self) -> String {
        text_table(HEADERS, &rows(self))
    }

    fn markdown(&self, _dir: &Path) -> Result<String> {
        Ok(format!(
            "{} rounds of {} s per workload and system, ABBA order, medians; load on the {}; \
             {}. Ratios are store / etcd (throughput: higher is better; latency: lower is better). \
             Every run is checked against the revision (each acknowledged write is one revision). \
             CPU s/10k: user + system CPU seconds of the three members summed, from h2load's \
             start until the revision settled, per 10,000 successful requests.\n\n{}",
            self.rounds,
            self.seconds,
            self.target,
            self.h2load,
            table(HEADERS, &rows(self))
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
finished in 193.16ms, 10354.16 req/s, 690.23KB/s
requests: 2000 total, 2000 started, 2000 done, 1998 succeeded, 2 failed, 0 errored, 0 timeout
status codes: 2000 2xx, 0 3xx, 0 4xx, 0 5xx
                     min         max         mean         sd        +/- sd
time for request:      778us     20.16ms      8.87ms      4.69ms    62.60%
time for connect:      143us       816us       379us       193us    80.00%
";

    #[test]
    fn parses_h2load_summary() {
        let run = parse_output(SAMPLE).unwrap();
        assert_eq!(run.requests_s, 10354.16);
        assert_eq!(run.started, 2000);
        assert_eq!(run.succeeded, 1998);
        assert_eq!(run.failed, 2);
        assert!((run.max_ms - 20.16).abs() < 1e-9);
        assert!((run.mean_ms - 8.87).abs() < 1e-9);
        assert!((run.sd_ms - 4.69).abs() < 1e-9);
        assert!(parse_output("finished in 1s, 5 req/s, 1KB/s\n").is_err());
        assert_eq!(millis("778us").unwrap(), 0.778);
        assert_eq!(millis("1.5s").unwrap(), 1500.0);
        assert!(millis("5m").is_err());
        assert_eq!(cpu_per_10k(1.5, 30_000), 0.5);
        assert_eq!(cpu_per_10k(1.5, 0), 0.0);
    }

    #[test]
    fn specs_and_frames() {
        let s = parse_spec("put:c=100:m=10").unwrap();
        assert_eq!((s.kind, s.connections, s.streams), (Kind::Put, 100, 10));
        assert!(parse_spec("put:c=0").is_err());
        assert!(parse_spec("put:x=1").is_err());
        assert!(parse_spec("get").is_err());
        let frame = grpc_frame(&Kind::Put.message()).unwrap();
        let msg = &frame[5..];
        assert_eq!(frame[0], 0);
        assert_eq!(
            u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize,
            msg.len()
        );
        let put = PutRequest::decode(msg).unwrap();
        assert_eq!(put.key.len(), KEY_SIZE_BYTES);
        assert_eq!(put.value.len(), VALUE_SIZE_BYTES);
        let range =
            RangeRequest::decode(&grpc_frame(&Kind::RangeSerializable.message()).unwrap()[5..])
                .unwrap();
        assert!(range.serializable);
        let txn = TxnRequest::decode(&Kind::TxnPut.message()[..]).unwrap();
        assert_eq!(txn.success.len(), 2);
    }
}
