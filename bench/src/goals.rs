//! `goals`: the open issues' targets, checked against one `bench all` run.
//!
//! Issue 12 (writes) and issue 15 (the gateway's footprint) are done when
//! one run shows every ratio they name. Rather than reading five tables by
//! eye, `bench all` puts this table first in its report: each row names a
//! target, the figure this run measured for it, and whether it was met.
//! A target whose workload was not in the run (other `--workloads`, a
//! failed part) says "not measured", never "met".
//!
//! Worked example: h2load's `put:c=100:m=10` gave the store 40,000 req/s
//! and etcd 19,000, so the row "put, 1,000 streams >= 2.00x etcd" reads
//! "2.11x (40000 vs 19000 req/s)" and is met; at 37,000 it would read
//! 1.95x and be missed. Ratios are the parts' own medians over rounds.

use crate::compare::{CompareOutcome, Summary as CompareSummary};
use crate::failover::FailoverOutcome;
use crate::gateway::{GatewayOutcome, PathResult, RatePoint};
use crate::h2load::{H2loadOutcome, Summary as H2Summary};
use crate::report::{fmt_ratio, table};
use crate::systems::{ETCD, OURS};

/// The ratio the write goals ask for at high concurrency (issue 12).
const HIGH_CONCURRENCY_RATIO: f64 = 2.0;
/// The ratio the single-writer and read goals ask for (issue 12).
const PARITY_RATIO: f64 = 1.0;

/// h2load workload of the 1,000-stream put goal.
const H2_PUT_MANY: &str = "put:c=100:m=10";
/// h2load workload of the 1,000-stream txn-put goal.
const H2_TXN_MANY: &str = "txn-put:c=100:m=10";
/// h2load workload of the single-stream put goal.
const H2_PUT_ONE: &str = "put:c=1:m=1";
/// h2load read workloads.
const H2_READS: &[&str] = &["range-l:c=100:m=10", "range-s:c=100:m=10"];
/// `compare` workload of the 256-client put goal.
const CMP_PUT_MANY: &str = "put:c=256";
/// `compare` workload of the single-client put goal.
const CMP_PUT_ONE: &str = "put:c=1";
/// `compare` read workloads.
const CMP_READS: &[&str] = &["range-l:c=64:ks=10000", "range-s:c=64:ks=10000"];

/// Whether this run met a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    NotMeasured,
}

impl Verdict {
    fn of(met: bool) -> Verdict {
        if met {
            Verdict::Met
        } else {
            Verdict::Missed
        }
    }

    fn label(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "**missed**",
            Verdict::NotMeasured => "not measured",
        }
    }
}

/// One target and what this run measured for it.
#[derive(Clone, Debug)]
pub struct Goal {
    pub issue: u32,
    pub target: String,
    pub measured: String,
    pub verdict: Verdict,
}

impl Goal {
    fn new(issue: u32, target: String, measured: Option<(String, bool)>) -> Goal {
        let (measured, verdict) = match measured {
            Some((text, met)) => (text, Verdict::of(met)),
            None => ("-".to_string(), Verdict::NotMeasured),
        };
        Goal {
            issue,
            target,
            measured,
            verdict,
        }
    }
}

/// The parts of a run the goals read (a part that failed or did not run is `None`).
#[derive(Default)]
pub struct Inputs<'a> {
    pub compare: Option<&'a CompareOutcome>,
    pub h2load: Option<&'a H2loadOutcome>,
    pub failover: Option<&'a FailoverOutcome>,
    pub gateway: Option<&'a GatewayOutcome>,
}

/// Every goal, in the issues' order.
pub fn evaluate(inputs: &Inputs<'_>) -> Vec<Goal> {
    let h2 = |spec: &str, least: f64| h2load_ratio(inputs.h2load, spec, least);
    let cmp = |spec: &str, least: f64| compare_ratio(inputs.compare, spec, least);
    let (many, one) = (HIGH_CONCURRENCY_RATIO, PARITY_RATIO);
    let mut issue_12 = vec![
        (
            format!("put, 1,000 streams (h2load `{H2_PUT_MANY}`) >= {many:.2}x etcd"),
            h2(H2_PUT_MANY, many),
        ),
        (
            format!("put, 256 clients (compare `{CMP_PUT_MANY}`) >= {many:.2}x etcd"),
            cmp(CMP_PUT_MANY, many),
        ),
        (
            format!("put, 256 clients (compare `{CMP_PUT_MANY}`): p99 <= etcd's"),
            compare_p99(inputs.compare, CMP_PUT_MANY),
        ),
        (
            format!("put, one stream (h2load `{H2_PUT_ONE}`) >= {one:.2}x etcd"),
            h2(H2_PUT_ONE, one),
        ),
        (
            format!("put, one client (compare `{CMP_PUT_ONE}`) >= {one:.2}x etcd"),
            cmp(CMP_PUT_ONE, one),
        ),
        (
            format!("txn-put, 1,000 streams (h2load `{H2_TXN_MANY}`) >= {many:.2}x etcd"),
            h2(H2_TXN_MANY, many),
        ),
        (
            "leader kill -9 -> first write: store's median <= etcd's".to_string(),
            failover(inputs.failover),
        ),
    ];
    let reads = H2_READS
        .iter()
        .map(|spec| {
            (
                format!("reads (h2load `{spec}`) >= {one:.2}x etcd"),
                h2(spec, one),
            )
        })
        .chain(CMP_READS.iter().map(|spec| {
            (
                format!("reads (compare `{spec}`) >= {one:.2}x etcd"),
                cmp(spec, one),
            )
        }));
    issue_12.extend(reads);
    issue_12.push((
        format!("CPU s per 10,000 puts, 3 members (h2load `{H2_PUT_MANY}`) <= etcd's"),
        cpu_per_put(inputs.h2load),
    ));
    let mut goals: Vec<Goal> = issue_12
        .into_iter()
        .map(|(target, measured)| Goal::new(12, target, measured))
        .collect();
    goals.extend(gateway_goals(inputs.gateway));
    goals
}

/// The summary of h2load workload `spec`, if it ran.
fn h2load_summary<'a>(outcome: Option<&'a H2loadOutcome>, spec: &str) -> Option<&'a H2Summary> {
    let w = outcome?.workloads.iter().find(|w| w.spec.text == spec)?;
    Some(&w.summary)
}

/// The summary of `compare` workload `spec`, if it ran.
fn compare_summary<'a>(
    outcome: Option<&'a CompareOutcome>,
    spec: &str,
) -> Option<&'a CompareSummary> {
    let w = outcome?.workloads.iter().find(|w| w.spec.text == spec)?;
    Some(&w.summary)
}

/// "2.11x (40000 vs 19000 req/s)", met when the ratio is at least `least`.
fn ratio_row(ratio: f64, ours: f64, etcd: f64, unit: &str, least: f64) -> (String, bool) {
    let text = format!("{} ({ours:.0} vs {etcd:.0} {unit})", fmt_ratio(ratio));
    (text, ratio >= least)
}

fn h2load_ratio(outcome: Option<&H2loadOutcome>, spec: &str, least: f64) -> Option<(String, bool)> {
    let s = h2load_summary(outcome, spec)?;
    let (ours, etcd) = (s.ours_requests_s, s.etcd_requests_s);
    Some(ratio_row(s.throughput_ratio, ours, etcd, "req/s", least))
}

fn cpu_per_put(outcome: Option<&H2loadOutcome>) -> Option<(String, bool)> {
    let s = h2load_summary(outcome, H2_PUT_MANY)?;
    let (ours, etcd) = (s.ours_cpu_s_per_10k, s.etcd_cpu_s_per_10k);
    Some((format!("{ours:.2} vs {etcd:.2}"), ours <= etcd))
}

fn compare_ratio(
    outcome: Option<&CompareOutcome>,
    spec: &str,
    least: f64,
) -> Option<(String, bool)> {
    let s = compare_summary(outcome, spec)?;
    let (ours, etcd) = (s.ours_ops_s, s.etcd_ops_s);
    Some(ratio_row(s.throughput_ratio, ours, etcd, "ops/s", least))
}

fn compare_p99(outcome: Option<&CompareOutcome>, spec: &str) -> Option<(String, bool)> {
    let s = compare_summary(outcome, spec)?;
    let text = format!("{:.1} vs {:.1} ms", s.ours_p99_ms, s.etcd_p99_ms);
    Some((text, s.ours_p99_ms <= s.etcd_p99_ms))
}

/// Medians of the rounds' windows; a store round whose writes never came
/// back misses the goal whatever the median says.
fn failover(outcome: Option<&FailoverOutcome>) -> Option<(String, bool)> {
    let outcome = outcome?;
    let rounds = |system: &'static str| outcome.runs.iter().filter(move |r| r.system == system);
    if rounds(OURS).next().is_none() || rounds(ETCD).all(|r| r.unavailability_ms.is_none()) {
        return None;
    }
    let ours_back = rounds(OURS).all(|r| r.unavailability_ms.is_some());
    let (o, e) = (
        outcome.median_unavailability(OURS),
        outcome.median_unavailability(ETCD),
    );
    Some((format!("{o:.0} vs {e:.0} ms"), ours_back && o <= e))
}

/// Issue 15's four figures: new connections/s, memory per idle
/// connection, added p50 and p99 at every rate, against HAProxy's.
fn gateway_goals(outcome: Option<&GatewayOutcome>) -> Vec<Goal> {
    let path = |name: &str| outcome.and_then(|o| o.paths.iter().find(|p| p.path == name));
    let (ours, theirs) = (path("gateway"), path("haproxy"));
    let both = ours.zip(theirs);
    let mut goals = vec![
        Goal::new(
            15,
            "new connections/s >= HAProxy's".to_string(),
            both.map(|(g, h)| {
                let (a, b) = (g.new_conns.throughput_ops_s, h.new_conns.throughput_ops_s);
                (format!("{a:.0} vs {b:.0}"), a >= b)
            }),
        ),
        Goal::new(
            15,
            "KiB per idle connection <= HAProxy's".to_string(),
            both.and_then(|(g, h)| {
                let (a, b) = (
                    g.memory.as_ref()?.kib_per_conn,
                    h.memory.as_ref()?.kib_per_conn,
                );
                Some((format!("{a:.2} vs {b:.2}"), a <= b))
            }),
        ),
    ];
    let rates: Vec<f64> = ours.map_or_else(Vec::new, |g| g.rates.iter().map(|r| r.rate).collect());
    for rate in rates {
        let at = |p| rate_point(p, rate);
        // (gateway, HAProxy) added p50 and p99 at this rate.
        let added = both.and_then(|(g, h)| at(g).zip(at(h))).map(|(g, h)| {
            [
                (g.added_p50_ms, h.added_p50_ms),
                (g.added_p99_ms, h.added_p99_ms),
            ]
        });
        for (i, label) in ["p50", "p99"].into_iter().enumerate() {
            goals.push(Goal::new(
                15,
                format!("added {label} at {rate:.0} req/s <= HAProxy's"),
                added.map(|pairs| {
                    let (a, b) = pairs[i];
                    (format!("{a:+.3} vs {b:+.3} ms"), a <= b)
                }),
            ));
        }
    }
    goals
}

/// `path`'s latency figures at `rate` req/s, if it ran that rate.
fn rate_point(path: &PathResult, rate: f64) -> Option<&RatePoint> {
    path.rates.iter().find(|r| r.rate == rate)
}

const HEADERS: &[&str] = &[
    "issue",
    "target",
    "this run (store vs etcd, gateway vs HAProxy)",
    "verdict",
];

/// The goals as a markdown table with a one-line tally.
pub fn markdown(goals: &[Goal]) -> String {
    let rows: Vec<Vec<String>> = goals
        .iter()
        .map(|g| {
            vec![
                format!("#{}", g.issue),
                g.target.clone(),
                g.measured.clone(),
                g.verdict.label().to_string(),
            ]
        })
        .collect();
    let count = |v: Verdict| goals.iter().filter(|g| g.verdict == v).count();
    format!(
        "{} of {} targets met, {} missed, {} not measured in this run.\n\n{}",
        count(Verdict::Met),
        goals.len(),
        count(Verdict::Missed),
        count(Verdict::NotMeasured),
        table(HEADERS, &rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_measured_is_never_met() {
        let goals = evaluate(&Inputs::default());
        assert!(goals.len() >= 12);
        assert!(goals.iter().all(|g| g.verdict == Verdict::NotMeasured));
        let md = markdown(&goals);
        assert!(md.starts_with(&format!("0 of {} targets met", goals.len())));
    }

    fn h2load_with(spec: &str, ours: f64, etcd: f64) -> H2loadOutcome {
        use crate::h2load::{parse_spec, Summary, WorkloadResult};
        H2loadOutcome {
            rounds: 1,
            seconds: 5,
            target: "leader".into(),
            h2load: "h2load".into(),
            workloads: vec![WorkloadResult {
                spec: parse_spec(spec).unwrap(),
                ours: Vec::new(),
                etcd: Vec::new(),
                summary: Summary {
                    ours_requests_s: ours,
                    etcd_requests_s: etcd,
                    throughput_ratio: ours / etcd,
                    ours_cpu_s_per_10k: 0.9,
                    etcd_cpu_s_per_10k: 1.5,
                    ..Default::default()
                },
            }],
        }
    }

    fn verdict_of(goals: &[Goal], target_part: &str) -> Verdict {
        goals
            .iter()
            .find(|g| g.target.contains(target_part))
            .map(|g| g.verdict)
            .unwrap()
    }

    #[test]
    fn ratios_at_the_boundary() {
        let met = h2load_with(H2_PUT_MANY, 40_000.0, 19_000.0);
        let goals = evaluate(&Inputs {
            h2load: Some(&met),
            ..Default::default()
        });
        assert_eq!(verdict_of(&goals, "put, 1,000 streams"), Verdict::Met);
        assert_eq!(verdict_of(&goals, "CPU s per 10,000 puts"), Verdict::Met);
        assert_eq!(verdict_of(&goals, "txn-put"), Verdict::NotMeasured);
        let row = goals
            .iter()
            .find(|g| g.target.starts_with("put, 1,000"))
            .unwrap();
        assert_eq!(row.measured, "2.11x (40000 vs 19000 req/s)");
        let missed = h2load_with(H2_PUT_MANY, 37_000.0, 19_000.0);
        let goals = evaluate(&Inputs {
            h2load: Some(&missed),
            ..Default::default()
        });
        assert_eq!(verdict_of(&goals, "put, 1,000 streams"), Verdict::Missed);
        assert!(
            markdown(&goals).starts_with(&format!("1 of {} targets met, 1 missed", goals.len()))
        );
    }

    fn op() -> crate::stats::OpResult {
        crate::stats::Recorder::new().result("op", std::time::Duration::from_secs(1))
    }

    fn failover_with(ours: &[Option<f64>], etcd: &[Option<f64>]) -> FailoverOutcome {
        let run =
            |system: &str, (round, window): (usize, &Option<f64>)| crate::failover::FailoverRun {
                system: system.to_string(),
                round,
                killed_member: "m1".into(),
                steady_ops_s: 500.0,
                unavailability_ms: *window,
                time_to_full_throughput_ms: *window,
                errors_total: 0,
                errors_after_kill: 0,
                writes: op(),
                timeline: Vec::new(),
            };
        let runs = ours.iter().enumerate().map(|r| run(OURS, r));
        FailoverOutcome {
            seed: 1,
            rate: 500.0,
            clients: 16,
            before_s: 5.0,
            after_s: 10.0,
            runs: runs
                .chain(etcd.iter().enumerate().map(|r| run(ETCD, r)))
                .collect(),
        }
    }

    #[test]
    fn failover_medians_and_a_round_that_never_came_back() {
        let verdict = |ours: &[Option<f64>], etcd: &[Option<f64>]| {
            let outcome = failover_with(ours, etcd);
            let goals = evaluate(&Inputs {
                failover: Some(&outcome),
                ..Default::default()
            });
            let row = goals
                .into_iter()
                .find(|g| g.target.starts_with("leader kill"))
                .unwrap();
            (row.measured, row.verdict)
        };
        let met = verdict(&[Some(800.0), Some(900.0), Some(700.0)], &[Some(1000.0)]);
        assert_eq!(met, ("800 vs 1000 ms".to_string(), Verdict::Met));
        assert_eq!(verdict(&[Some(1100.0)], &[Some(1000.0)]).1, Verdict::Missed);
        assert_eq!(
            verdict(&[Some(500.0), None], &[Some(1000.0)]).1,
            Verdict::Missed
        );
        assert_eq!(verdict(&[], &[Some(1000.0)]).1, Verdict::NotMeasured);
    }

    fn path(name: &str, p50: f64, p99: f64) -> PathResult {
        PathResult {
            path: name.to_string(),
            rates: vec![RatePoint {
                rate: 4000.0,
                result: op(),
                added_p50_ms: p50,
                added_p99_ms: p99,
            }],
            per_round: Default::default(),
            max_throughput: op(),
            new_conns: op(),
            cpu_us_per_request: None,
            cpu_us_per_conn: None,
            memory: None,
        }
    }

    #[test]
    fn gateway_latency_rows_per_rate_and_quantile() {
        let outcome = GatewayOutcome {
            seed: 1,
            rounds: 1,
            conns: 32,
            conn_clients: 16,
            duration_s: 5.0,
            idle_conns: 0,
            fd_limit: 1024,
            skipped: Vec::new(),
            paths: vec![path("gateway", 0.073, 0.700), path("haproxy", 0.232, 0.656)],
        };
        let goals = evaluate(&Inputs {
            gateway: Some(&outcome),
            ..Default::default()
        });
        let row = |label: &str| goals.iter().find(|g| g.target.starts_with(label)).unwrap();
        let p50 = row("added p50 at 4000 req/s");
        assert_eq!(
            (p50.measured.as_str(), p50.verdict),
            ("+0.073 vs +0.232 ms", Verdict::Met)
        );
        assert_eq!(row("added p99 at 4000 req/s").verdict, Verdict::Missed);
        assert_eq!(row("KiB per idle connection").verdict, Verdict::NotMeasured);
    }
}
