//! `compare`: our 3-member cluster vs etcd 3.5, same workloads, interleaved.
//!
//! Both clusters run side by side on loopback for the whole command. Each
//! round runs every workload once on each system, alternating which system
//! goes first (ABBA order), so slow drifts of the machine (thermal, page
//! cache, other builds) hit both equally. Each run uses fresh keys (its own
//! prefix). Per workload and system we take the median over rounds of
//! throughput, p50 and p99, and report ratios ours / etcd: above 1 is better
//! for throughput, below 1 is better for latency.
//!
//! Workloads are given as specs `name[:key=value...]`: names `put`,
//! `range-l`, `range-s`, `txn-put`, `txn-mixed`, `watch`, `lease-keepalive`;
//! keys `c` (clients), `conns`, `rate` (open loop, ops/s), `ks` (key space),
//! `ops` (ops per txn), `rw` (reads per write), `w` (watchers), `s` (watch
//! streams). Example: `put:c=64`, `put:c=16:rate=1000`, `watch:c=4:w=100:s=10`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::load::{LoadConfig, Workload};
use crate::pace::Stop;
use crate::plot::{line_chart, Chart, Series};
use crate::report::{fmt_ratio, image, median, ratio, table, text_table, OutArgs, Outcome};
use crate::stats::RunResult;
use crate::systems::{abba, start_both, workload_texts, SystemArgs, ETCD, OURS};

/// Default subnet of `compare`.
pub const DEFAULT_SUBNET: &str = "127.0.50";
/// Workloads of a full comparison.
pub const DEFAULT_WORKLOADS: &[&str] = &[
    "put:c=1",
    "put:c=16",
    "put:c=64",
    "put:c=256",
    "put:c=16:rate=1000",
    "range-l:c=64:ks=10000",
    "range-s:c=64:ks=10000",
    "txn-put:c=64:ops=2",
    "txn-mixed:c=64:ks=10000",
    "watch:c=4:w=100:s=10",
    "lease-keepalive:c=64",
];
/// Workloads of the smoke mode.
pub const SMOKE_WORKLOADS: &[&str] = &[
    "put:c=1",
    "put:c=2",
    "range-l:c=2:ks=10",
    "range-s:c=2:ks=10",
    "txn-put:c=2:ops=2",
    "txn-mixed:c=2:ks=10",
    "watch:c=1:w=2:s=1",
    "lease-keepalive:c=2",
];
/// Operations per run in smoke mode.
pub const SMOKE_TOTAL: u64 = 20;
/// Clients per gRPC connection when a spec gives no `conns`.
const CLIENTS_PER_CONN: usize = 16;
/// Default key space of write workloads.
const DEFAULT_KEY_SPACE: u64 = 100_000;

/// Options of `bench compare`.
#[derive(Args, Clone, Debug)]
pub struct CompareArgs {
    #[command(flatten)]
    pub systems: SystemArgs,
    /// Rounds (each runs every workload once per system).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Length of each run.
    #[arg(long, default_value = "5s", value_parser = crate::cli::parse_duration)]
    pub duration: Duration,
    /// Operations per run instead of --duration.
    #[arg(long)]
    pub total: Option<u64>,
    /// Workload specs (comma-separated), see the module docs.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Key size in bytes.
    #[arg(long, default_value_t = 32)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
    /// Tiny runs of every workload (CI): 1 round, 20 operations each.
    #[arg(long)]
    pub smoke: bool,
    #[command(flatten)]
    pub out: OutArgs,
}

/// A parsed workload spec.
#[derive(Clone, Debug, Serialize)]
pub struct Spec {
    pub text: String,
    pub workload: Workload,
    pub clients: usize,
    pub conns: usize,
    pub rate: Option<f64>,
    pub key_space: u64,
}

/// Parses `name[:key=value...]`.
pub fn parse_spec(text: &str) -> Result<Spec> {
    let mut parts = text.split(':');
    let name = parts.next().unwrap_or_default();
    let mut kv = BTreeMap::new();
    for p in parts {
        let (k, v) = p
            .split_once('=')
            .with_context(|| format!("bad option {p:?} in workload {text:?}"))?;
        kv.insert(k, v);
    }
    let num = |k: &str, d: f64| -> Result<f64> {
        kv.get(k).map_or(Ok(d), |v| {
            v.parse()
                .with_context(|| format!("bad {k}={v} in {text:?}"))
        })
    };
    let clients = num("c", 1.0)? as usize;
    let workload = match name {
        "put" => Workload::Put,
        "range-l" => Workload::Range {
            serializable: false,
        },
        "range-s" => Workload::Range { serializable: true },
        "txn-put" => Workload::TxnPut {
            ops: num("ops", 1.0)? as usize,
        },
        "txn-mixed" => Workload::TxnMixed {
            ops: num("ops", 1.0)? as usize,
            rw_ratio: num("rw", 1.0)?,
        },
        "watch" => Workload::Watch {
            watchers: num("w", 10.0)? as usize,
            streams: num("s", 1.0)? as usize,
        },
        "lease-keepalive" => Workload::LeaseKeepalive,
        _ => bail!("unknown workload {name:?} in {text:?}"),
    };
    if let Some(bad) = kv
        .keys()
        .find(|k| !["c", "conns", "rate", "ks", "ops", "rw", "w", "s"].contains(k))
    {
        bail!("unknown option {bad:?} in workload {text:?}");
    }
    Ok(Spec {
        text: text.to_string(),
        workload,
        clients: clients.max(1),
        conns: num("conns", clients.div_ceil(CLIENTS_PER_CONN) as f64)?.max(1.0) as usize,
        rate: kv.get("rate").map(|_| num("rate", 0.0)).transpose()?,
        key_space: num("ks", DEFAULT_KEY_SPACE as f64)? as u64,
    })
}

/// Results of one workload on both systems.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadComparison {
    pub spec: Spec,
    pub ours: Vec<RunResult>,
    pub etcd: Vec<RunResult>,
    pub summary: Summary,
}

/// Medians over rounds and ratios ours / etcd.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub ours_ops_s: f64,
    pub etcd_ops_s: f64,
    pub throughput_ratio: f64,
    pub ours_p50_ms: f64,
    pub etcd_p50_ms: f64,
    pub p50_ratio: f64,
    pub ours_p99_ms: f64,
    pub etcd_p99_ms: f64,
    pub p99_ratio: f64,
    pub ours_errors: u64,
    pub etcd_errors: u64,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct CompareOutcome {
    pub seed: u64,
    pub rounds: usize,
    pub ours_bin: String,
    pub etcd_bin: String,
    pub workloads: Vec<WorkloadComparison>,
}

/// Runs the comparison.
pub async fn run(args: &CompareArgs, seed: u64, progress: bool) -> Result<CompareOutcome> {
    let texts = workload_texts(
        &args.workloads,
        args.smoke,
        SMOKE_WORKLOADS,
        DEFAULT_WORKLOADS,
    );
    let specs: Vec<Spec> = texts.iter().map(|t| parse_spec(t)).collect::<Result<_>>()?;
    let rounds = if args.smoke { 1 } else { args.rounds.max(1) };
    let stop = match (args.smoke, args.total) {
        (true, t) => Stop::new(
            Some(t.unwrap_or(SMOKE_TOTAL).min(SMOKE_TOTAL)),
            Some(args.duration),
        ),
        (false, Some(t)) => Stop::new(Some(t), None),
        (false, None) => Stop::new(None, Some(args.duration)),
    };
    let (ours_spec, etcd_spec) = args.systems.specs(DEFAULT_SUBNET)?;
    let (ours, etcd) = start_both(&ours_spec, &etcd_spec).await?;
    let mut results: Vec<(Vec<RunResult>, Vec<RunResult>)> =
        vec![(Vec::new(), Vec::new()); specs.len()];
    for round in 0..rounds {
        for (i, spec) in specs.iter().enumerate() {
            for (is_ours, cluster) in abba(round, i, &ours, &etcd) {
                let run = Run {
                    args,
                    spec,
                    stop,
                    seed,
                    progress,
                    prefix: format!("cmp/{round}/{i}/"),
                };
                let result = run.exec(cluster).await?;
                eprintln!(
                    "bench: round {}/{rounds} {:<26} {:<5} {:>10.1} ops/s p99 {:.3} ms",
                    round + 1,
                    spec.text,
                    cluster.label,
                    result.main().throughput_ops_s,
                    result.main().latency.p99_ms
                );
                let (o, e) = &mut results[i];
                if is_ours { o } else { e }.push(result);
            }
        }
    }
    let workloads = specs
        .into_iter()
        .zip(results)
        .map(|(spec, (ours, etcd))| WorkloadComparison {
            summary: summarize(&ours, &etcd),
            spec,
            ours,
            etcd,
        })
        .collect();
    Ok(CompareOutcome {
        seed,
        rounds,
        ours_bin: ours_spec.bin.display().to_string(),
        etcd_bin: etcd_spec.bin.display().to_string(),
        workloads,
    })
}

struct Run<'a> {
    args: &'a CompareArgs,
    spec: &'a Spec,
    stop: Stop,
    seed: u64,
    progress: bool,
    prefix: String,
}

impl Run<'_> {
    async fn exec(&self, cluster: &Cluster) -> Result<RunResult> {
        let cfg = LoadConfig {
            endpoints: cluster.endpoints(),
            conns: self.spec.conns,
            clients: self.spec.clients,
            stop: self.stop,
            rate: self.spec.rate,
            key_size: self.args.key_size,
            val_size: self.args.val_size,
            key_space: self.spec.key_space,
            sequential: false,
            target_leader: false,
            seed: self.seed,
            progress: self.progress,
            target: cluster.label.clone(),
            prefix: self.prefix.clone(),
        };
        crate::load::run(&cfg, &self.spec.workload)
            .await
            .with_context(|| format!("{} on {}", self.spec.text, cluster.label))
    }
}

fn summarize(ours: &[RunResult], etcd: &[RunResult]) -> Summary {
    let med = |runs: &[RunResult], f: &dyn Fn(&RunResult) -> f64| {
        median(&mut runs.iter().map(f).collect::<Vec<_>>())
    };
    let tput = |r: &RunResult| r.main().throughput_ops_s;
    let p50 = |r: &RunResult| r.main().latency.p50_ms;
    let p99 = |r: &RunResult| r.main().latency.p99_ms;
    let errors = |runs: &[RunResult]| {
        runs.iter()
            .map(|r| r.ops.iter().map(|o| o.errors).sum::<u64>())
            .sum()
    };
    let (ot, et) = (med(ours, &tput), med(etcd, &tput));
    let (o50, e50) = (med(ours, &p50), med(etcd, &p50));
    let (o99, e99) = (med(ours, &p99), med(etcd, &p99));
    Summary {
        ours_ops_s: ot,
        etcd_ops_s: et,
        throughput_ratio: ratio(ot, et),
        ours_p50_ms: o50,
        etcd_p50_ms: e50,
        p50_ratio: ratio(o50, e50),
        ours_p99_ms: o99,
        etcd_p99_ms: e99,
        p99_ratio: ratio(o99, e99),
        ours_errors: errors(ours),
        etcd_errors: errors(etcd),
    }
}

/// The run whose throughput is the median of `runs` (for plotting its CDF).
fn median_run(runs: &[RunResult]) -> Option<&RunResult> {
    let mut sorted: Vec<&RunResult> = runs.iter().collect();
    sorted.sort_by(|a, b| {
        a.main()
            .throughput_ops_s
            .total_cmp(&b.main().throughput_ops_s)
    });
    sorted.get(sorted.len() / 2).copied()
}

/// (clients, store ops/s, etcd ops/s).
type ScalingPoint = (f64, f64, f64);

const HEADERS: [&str; 9] = [
    "workload",
    "store ops/s",
    "etcd ops/s",
    "ops/s ratio",
    "store p99 ms",
    "etcd p99 ms",
    "p99 ratio",
    "p50 ratio",
    "errors (store/etcd)",
];

impl CompareOutcome {
    fn rows(&self) -> Vec<Vec<String>> {
        self.workloads
            .iter()
            .map(|w| {
                let s = &w.summary;
                vec![
                    w.spec.text.clone(),
                    format!("{:.0}", s.ours_ops_s),
                    format!("{:.0}", s.etcd_ops_s),
                    fmt_ratio(s.throughput_ratio),
                    format!("{:.3}", s.ours_p99_ms),
                    format!("{:.3}", s.etcd_p99_ms),
                    fmt_ratio(s.p99_ratio),
                    fmt_ratio(s.p50_ratio),
                    format!("{}/{}", s.ours_errors, s.etcd_errors),
                ]
            })
            .collect()
    }

    /// Closed-loop workloads run at several client counts, by workload name.
    fn scaling(&self) -> Vec<(String, Vec<ScalingPoint>)> {
        let mut by_name: BTreeMap<String, Vec<ScalingPoint>> = BTreeMap::new();
        for w in self.workloads.iter().filter(|w| w.spec.rate.is_none()) {
            let s = &w.summary;
            by_name.entry(w.spec.workload.name()).or_default().push((
                w.spec.clients as f64,
                s.ours_ops_s,
                s.etcd_ops_s,
            ));
        }
        by_name
            .into_iter()
            .filter(|(_, pts)| pts.len() > 1)
            .map(|(name, mut pts)| {
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (name, pts)
            })
            .collect()
    }

    fn scaling_plot(&self, dir: &Path, name: &str, pts: &[ScalingPoint]) -> Result<String> {
        let series = [
            Series {
                name: OURS.into(),
                points: pts.iter().map(|p| (p.0, p.1)).collect(),
            },
            Series {
                name: ETCD.into(),
                points: pts.iter().map(|p| (p.0, p.2)).collect(),
            },
        ];
        let title = format!("{name}: throughput vs clients");
        let file = format!("compare-{name}-throughput.svg");
        let chart = Chart {
            title: &title,
            x_label: "clients",
            y_label: "ops/s",
            log_x: true,
            series: &series,
        };
        line_chart(&dir.join(&file), &chart)?;
        Ok(image(&title, &file))
    }

    fn cdf_plot(&self, dir: &Path, i: usize, w: &WorkloadComparison) -> Result<String> {
        let mut series = Vec::new();
        for (label, runs) in [(OURS, &w.ours), (ETCD, &w.etcd)] {
            if let Some(run) = median_run(runs) {
                let points = run
                    .main()
                    .cdf
                    .iter()
                    .map(|p| (p.latency_ms, p.quantile))
                    .collect();
                series.push(Series {
                    name: label.into(),
                    points,
                });
            }
        }
        let title = format!("{}: latency CDF", w.spec.text);
        let file = format!("compare-{i:02}-cdf.svg");
        let chart = Chart {
            title: &title,
            x_label: "latency (ms)",
            y_label: "quantile",
            log_x: true,
            series: &series,
        };
        line_chart(&dir.join(&file), &chart)?;
        Ok(image(&title, &file))
    }
}

impl Outcome for CompareOutcome {
    fn title(&self) -> String {
        "compare: store vs etcd 3.5".into()
    }

    fn text(&self) -> String {
        format!(
            "compare (seed {}, {} rounds, medians; ratio = store / etcd)\n{}",
            self.seed,
            self.rounds,
            text_table(&HEADERS, &self.rows())
        )
    }

    fn markdown(&self, dir: &Path) -> Result<String> {
        let mut md = format!(
            "Both 3-member clusters on loopback, {} interleaved round(s), seed {}. Medians over rounds; \
             ratio = store / etcd (throughput: higher is better; latency: lower is better).\n\n\
             - store: `{}`\n- etcd: `{}`\n\n",
            self.rounds, self.seed, self.ours_bin, self.etcd_bin
        );
        md.push_str(&table(&HEADERS, &self.rows()));
        md.push('\n');
        for (name, pts) in self.scaling() {
            md.push_str(&self.scaling_plot(dir, &name, &pts)?);
        }
        for (i, w) in self.workloads.iter().enumerate() {
            md.push_str(&self.cdf_plot(dir, i, w)?);
        }
        Ok(md)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        let s = parse_spec("put:c=64:rate=1000").unwrap();
        assert_eq!(s.workload, Workload::Put);
        assert_eq!((s.clients, s.conns, s.rate), (64, 4, Some(1000.0)));
        let w = parse_spec("watch:w=5:s=2").unwrap();
        assert_eq!(
            w.workload,
            Workload::Watch {
                watchers: 5,
                streams: 2
            }
        );
        assert!(parse_spec("nope").is_err());
        assert!(parse_spec("put:x=1").is_err());
        for s in DEFAULT_WORKLOADS.iter().chain(SMOKE_WORKLOADS) {
            parse_spec(s).unwrap();
        }
    }
}
