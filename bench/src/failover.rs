//! `failover`: kill -9 the leader under steady write load.
//!
//! For each system, a fresh 3-member cluster takes open-loop Puts at
//! `--rate` from `--clients` writers. Each writer talks to one member at a
//! time (its own connection per member) and moves to the next member after an
//! error or a request that takes longer than [`WRITE_TIMEOUT`], as etcd
//! clients do. After `--before`, the leader is killed with SIGKILL; the load
//! goes on for `--after`. Every write is logged (intended start, completion,
//! success), and from that log:
//!
//! * unavailability: from the kill to the first successful write that was
//!   scheduled after the kill (resolution about [`WRITE_TIMEOUT`]: a writer
//!   waiting on a leaderless member moves on only after it);
//! * errors: failed or timed-out writes (all, and after the kill);
//! * time to full throughput: from the kill (at least the unavailability)
//!   until successful writes per
//!   [`BUCKET`] stay at or above [`FULL_THROUGHPUT_FRACTION`] of the
//!   pre-kill rate for [`SUSTAIN_WINDOW`];
//! * a timeline of successes and errors per second around the kill.
//!
//! Latencies are open-loop (from the intended start), so writes queued
//! behind the outage count with their full waiting time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use etcd_client::{Client, ConnectOptions, KvClient};
use serde::Serialize;

use crate::cluster::{Cluster, ClusterSpec};
use crate::keys::{stamped_value, KeyGen};
use crate::load::CONNECT_TIMEOUT;
use crate::pace::{Pacer, Stop};
use crate::plot::{line_chart, Chart, Series};
use crate::report::{image, median, table, text_table, OutArgs, Outcome};
use crate::stats::{OpResult, Recorder};
use crate::systems::{SystemArgs, ETCD, OURS};

/// Default subnet of `failover`.
pub const DEFAULT_SUBNET: &str = "127.0.51";
/// A write slower than this is abandoned and retried on the next member.
/// It bounds how late a writer stuck on a leaderless member notices a new
/// leader, and so the resolution of the unavailability window.
pub const WRITE_TIMEOUT: Duration = Duration::from_millis(250);
/// Width of the timeline buckets.
pub const BUCKET: Duration = Duration::from_millis(100);
/// Share of the pre-kill throughput that counts as "full".
pub const FULL_THROUGHPUT_FRACTION: f64 = 0.9;
/// How long throughput must stay full to count as recovered.
pub const SUSTAIN_WINDOW: Duration = Duration::from_secs(1);
/// Smoke mode: writes per second, writers, time before and after the kill.
const SMOKE_RATE: f64 = 50.0;
const SMOKE_CLIENTS: usize = 2;
const SMOKE_BEFORE: Duration = Duration::from_secs(1);
const SMOKE_AFTER: Duration = Duration::from_secs(3);
/// Key space of the writes.
const KEY_SPACE: u64 = 10_000;
/// Key and value sizes of the writes, in bytes.
const KEY_SIZE: usize = 32;
const VAL_SIZE: usize = 256;

/// Options of `bench failover`.
#[derive(Args, Clone, Debug)]
pub struct FailoverArgs {
    #[command(flatten)]
    pub systems: SystemArgs,
    /// Offered writes per second (open loop).
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Load before the kill.
    #[arg(long, default_value = "5s", value_parser = crate::cli::parse_duration)]
    pub before: Duration,
    /// Load after the kill.
    #[arg(long, default_value = "10s", value_parser = crate::cli::parse_duration)]
    pub after: Duration,
    /// Kills per system (each on a fresh cluster).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Tiny run (CI): 50 writes/s, 2 writers, 1 s before and 3 s after the kill.
    #[arg(long)]
    pub smoke: bool,
    #[command(flatten)]
    pub out: OutArgs,
}

/// One write as logged by a writer, times in seconds since the load started.
#[derive(Clone, Copy, Debug)]
pub struct Write {
    pub intended: f64,
    pub done: f64,
    pub ok: bool,
}

/// Successes and errors per second in one bucket, `t_s` seconds after the kill.
#[derive(Clone, Debug, Serialize)]
pub struct TimelinePoint {
    pub t_s: f64,
    pub ok_per_s: f64,
    pub errors_per_s: f64,
}

/// One kill of one system.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverRun {
    pub system: String,
    pub round: usize,
    pub killed_member: String,
    pub steady_ops_s: f64,
    pub unavailability_ms: Option<f64>,
    pub time_to_full_throughput_ms: Option<f64>,
    pub errors_total: u64,
    pub errors_after_kill: u64,
    pub writes: OpResult,
    pub timeline: Vec<TimelinePoint>,
}

/// All kills.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverOutcome {
    pub seed: u64,
    pub rate: f64,
    pub clients: usize,
    pub before_s: f64,
    pub after_s: f64,
    pub runs: Vec<FailoverRun>,
}

struct Plan {
    rate: f64,
    clients: usize,
    before: Duration,
    after: Duration,
    seed: u64,
    progress: bool,
}

/// Runs every kill.
pub async fn run(args: &FailoverArgs, seed: u64, progress: bool) -> Result<FailoverOutcome> {
    let plan = if args.smoke {
        Plan {
            rate: SMOKE_RATE,
            clients: SMOKE_CLIENTS,
            before: SMOKE_BEFORE,
            after: SMOKE_AFTER,
            seed,
            progress,
        }
    } else {
        Plan {
            rate: args.rate,
            clients: args.clients.max(1),
            before: args.before,
            after: args.after,
            seed,
            progress,
        }
    };
    let (ours, etcd) = args.systems.specs(DEFAULT_SUBNET)?;
    let rounds = if args.smoke { 1 } else { args.rounds.max(1) };
    let mut runs = Vec::new();
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [&ours, &etcd]
        } else {
            [&etcd, &ours]
        };
        for spec in order {
            let r = run_one(spec, &plan, round).await?;
            eprintln!(
                "bench: failover {} round {}: unavailable {} ms, full throughput after {} ms, {} errors",
                r.system,
                round + 1,
                fmt_opt_ms(r.unavailability_ms),
                fmt_opt_ms(r.time_to_full_throughput_ms),
                r.errors_total
            );
            runs.push(r);
        }
    }
    Ok(FailoverOutcome {
        seed,
        rate: plan.rate,
        clients: plan.clients,
        before_s: plan.before.as_secs_f64(),
        after_s: plan.after.as_secs_f64(),
        runs,
    })
}

async fn run_one(spec: &ClusterSpec, plan: &Plan, round: usize) -> Result<FailoverRun> {
    eprintln!("bench: failover: starting {} cluster", spec.label);
    let mut cluster = Cluster::start(spec).await?;
    let endpoints = cluster.endpoints();
    let stop = Stop::new(None, Some(plan.before + plan.after));
    let pacer = Arc::new(Pacer::new(
        Some(plan.rate),
        stop,
        plan.progress,
        &format!("failover {}", spec.label),
    ));
    let mut writers = Vec::with_capacity(plan.clients);
    for w in 0..plan.clients {
        let kvs = member_clients(&endpoints).await?;
        let keys = KeyGen::new(
            &format!("failover/{round}/"),
            KEY_SIZE,
            KEY_SPACE,
            false,
            plan.seed,
            w as u64,
        );
        writers.push(tokio::spawn(writer(kvs, w, keys, pacer.clone())));
    }
    tokio::time::sleep_until((pacer.start() + plan.before).into()).await;
    let leader = cluster.leader_index().await?;
    let killed_member = cluster.members[leader].name.clone();
    let kill_at = cluster
        .kill9(leader)
        .duration_since(pacer.start())
        .as_secs_f64();
    let mut log = Vec::new();
    let mut rec = Recorder::new();
    for w in writers {
        let (writes, r) = w.await?;
        log.extend(writes);
        rec.merge(&r);
    }
    pacer.finish();
    let elapsed = plan.before + plan.after;
    Ok(analyze(
        spec.label.clone(),
        round,
        killed_member,
        &log,
        kill_at,
        plan.before,
        rec.result("put", elapsed),
    ))
}

/// One connection per member.
async fn member_clients(endpoints: &[String]) -> Result<Vec<KvClient>> {
    let opts = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
    let mut kvs = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        kvs.push(Client::connect([ep], Some(opts.clone())).await?.kv_client());
    }
    Ok(kvs)
}

async fn writer(
    mut kvs: Vec<KvClient>,
    w: usize,
    mut keys: KeyGen,
    pacer: Arc<Pacer>,
) -> (Vec<Write>, Recorder) {
    let mut member = w % kvs.len();
    let mut log = Vec::new();
    let mut rec = Recorder::new();
    let start = pacer.start();
    while let Some(t) = pacer.next().await {
        let put = kvs[member].put(keys.key(t.index), stamped_value(VAL_SIZE), None);
        let ok = match tokio::time::timeout(WRITE_TIMEOUT, put).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                rec.error(e);
                false
            }
            Err(_) => {
                rec.error("timeout");
                false
            }
        };
        if ok {
            rec.record(t.intended.elapsed());
        } else {
            member = (member + 1) % kvs.len();
        }
        let secs = |i: Instant| i.duration_since(start).as_secs_f64();
        log.push(Write {
            intended: secs(t.intended),
            done: secs(Instant::now()),
            ok,
        });
        pacer.done();
    }
    (log, rec)
}

/// Derives the failover metrics from the write log.
pub fn analyze(
    system: String,
    round: usize,
    killed_member: String,
    log: &[Write],
    kill_at: f64,
    before: Duration,
    writes: OpResult,
) -> FailoverRun {
    let steady_from = kill_at - before.as_secs_f64() / 2.0;
    let steady = log
        .iter()
        .filter(|w| w.ok && w.done >= steady_from && w.done < kill_at)
        .count();
    let steady_ops_s = steady as f64 / (kill_at - steady_from).max(f64::EPSILON);
    let first_ok = log
        .iter()
        .filter(|w| w.ok && w.intended >= kill_at)
        .map(|w| w.done)
        .min_by(f64::total_cmp);
    let timeline = timeline(log, kill_at);
    let unavailable = first_ok.map(|t| t - kill_at);
    let full =
        full_throughput_at(&timeline, steady_ops_s).map(|t| t.max(unavailable.unwrap_or(0.0)));
    FailoverRun {
        system,
        round,
        killed_member,
        steady_ops_s,
        unavailability_ms: unavailable.map(|t| t * 1000.0),
        time_to_full_throughput_ms: full.map(|t| t * 1000.0),
        errors_total: log.iter().filter(|w| !w.ok).count() as u64,
        errors_after_kill: log.iter().filter(|w| !w.ok && w.done >= kill_at).count() as u64,
        writes,
        timeline,
    }
}

fn timeline(log: &[Write], kill_at: f64) -> Vec<TimelinePoint> {
    let width = BUCKET.as_secs_f64();
    let end = log.iter().map(|w| w.done).fold(0.0, f64::max);
    let buckets = (end / width).ceil() as usize + 1;
    let mut ok = vec![0u64; buckets];
    let mut err = vec![0u64; buckets];
    for w in log {
        let b = ((w.done / width) as usize).min(buckets - 1);
        if w.ok {
            ok[b] += 1
        } else {
            err[b] += 1
        }
    }
    (0..buckets)
        .map(|b| TimelinePoint {
            t_s: b as f64 * width - kill_at,
            ok_per_s: ok[b] as f64 / width,
            errors_per_s: err[b] as f64 / width,
        })
        .collect()
}

/// Seconds from the kill until throughput stays full for [`SUSTAIN_WINDOW`].
fn full_throughput_at(timeline: &[TimelinePoint], steady_ops_s: f64) -> Option<f64> {
    let need = (SUSTAIN_WINDOW.as_secs_f64() / BUCKET.as_secs_f64()).round() as usize;
    let full = |p: &TimelinePoint| p.ok_per_s >= FULL_THROUGHPUT_FRACTION * steady_ops_s;
    let after: Vec<&TimelinePoint> = timeline.iter().filter(|p| p.t_s >= 0.0).collect();
    // The last bucket is partial; windows must fit before it.
    let usable = after.len().saturating_sub(1);
    (0..usable.saturating_sub(need.saturating_sub(1)))
        .find(|&i| after[i..i + need].iter().all(|p| full(p)))
        .map(|i| after[i].t_s.max(0.0))
}

fn fmt_opt_ms(v: Option<f64>) -> String {
    v.map_or("never".into(), |ms| format!("{ms:.0}"))
}

const HEADERS: [&str; 8] = [
    "system",
    "round",
    "killed",
    "steady ops/s",
    "unavailable ms",
    "full throughput after ms",
    "errors (after kill)",
    "write p99 ms",
];

impl FailoverOutcome {
    fn rows(&self) -> Vec<Vec<String>> {
        self.runs
            .iter()
            .map(|r| {
                vec![
                    r.system.clone(),
                    (r.round + 1).to_string(),
                    r.killed_member.clone(),
                    format!("{:.0}", r.steady_ops_s),
                    fmt_opt_ms(r.unavailability_ms),
                    fmt_opt_ms(r.time_to_full_throughput_ms),
                    format!("{} ({})", r.errors_total, r.errors_after_kill),
                    format!("{:.1}", r.writes.latency.p99_ms),
                ]
            })
            .collect()
    }

    /// Median over `system`'s rounds of the kill-to-first-write window,
    /// rounds whose writes never came back left out (0 for none).
    pub fn median_unavailability(&self, system: &str) -> f64 {
        let mut v: Vec<f64> = self
            .runs
            .iter()
            .filter(|r| r.system == system)
            .filter_map(|r| r.unavailability_ms)
            .collect();
        median(&mut v)
    }

    fn timeline_plot(&self, dir: &Path) -> Result<String> {
        let series: Vec<Series> = [OURS, ETCD]
            .iter()
            .filter_map(|sys| self.runs.iter().find(|r| r.system == *sys))
            .map(|r| Series {
                name: format!("{} successful writes/s", r.system),
                points: r.timeline.iter().map(|p| (p.t_s, p.ok_per_s)).collect(),
            })
            .collect();
        let title = "failover: writes/s around the leader kill (t = 0)";
        let file = "failover-timeline.svg";
        let chart = Chart {
            title,
            x_label: "seconds since kill",
            y_label: "writes/s",
            log_x: false,
            series: &series,
        };
        line_chart(&dir.join(file), &chart)?;
        Ok(image(title, file))
    }
}

impl Outcome for FailoverOutcome {
    fn title(&self) -> String {
        "failover: leader kill -9 under load".into()
    }

    fn text(&self) -> String {
        format!(
            "failover (seed {}, {} writes/s offered by {} writers, kill after {:.1}s, {:.1}s after)\n{}\
             median unavailability: store {:.0} ms, etcd {:.0} ms\n",
            self.seed,
            self.rate,
            self.clients,
            self.before_s,
            self.after_s,
            text_table(&HEADERS, &self.rows()),
            self.median_unavailability(OURS),
            self.median_unavailability(ETCD)
        )
    }

    fn markdown(&self, dir: &Path) -> Result<String> {
        let mut md = format!(
            "Open-loop Puts at {} writes/s from {} writers; the leader is killed with SIGKILL after {:.1} s, \
             load continues for {:.1} s. Unavailability = kill to the first successful write scheduled after \
             the kill. Full throughput = successes per {} ms stay at or above {:.0} % of the pre-kill rate for {} s.\n\n",
            self.rate,
            self.clients,
            self.before_s,
            self.after_s,
            BUCKET.as_millis(),
            FULL_THROUGHPUT_FRACTION * 100.0,
            SUSTAIN_WINDOW.as_secs_f64()
        );
        md.push_str(&table(&HEADERS, &self.rows()));
        md.push('\n');
        md.push_str(&self.timeline_plot(dir)?);
        Ok(md)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_with_outage() -> Vec<Write> {
        // 100 writes/s for 4 s; nothing succeeds between 2.0 s and 2.5 s.
        (0..400)
            .map(|i| {
                let t = i as f64 / 100.0;
                let ok = !(2.0..2.5).contains(&t);
                Write {
                    intended: t,
                    done: if ok { t + 0.001 } else { t + 0.2 },
                    ok,
                }
            })
            .collect()
    }

    #[test]
    fn outage_metrics() {
        let empty = Recorder::new().result("put", Duration::from_secs(1));
        let r = analyze(
            "etcd".into(),
            0,
            "m1".into(),
            &log_with_outage(),
            2.0,
            Duration::from_secs(2),
            empty,
        );
        assert!((r.steady_ops_s - 100.0).abs() < 2.0);
        let u = r.unavailability_ms.unwrap();
        assert!((500.0..=510.0).contains(&u), "{u}");
        assert_eq!(r.errors_total, 50);
        let full = r.time_to_full_throughput_ms.unwrap();
        assert!((500.0..=700.0).contains(&full), "{full}");
    }
}
