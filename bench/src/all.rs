//! `all`: every comparison (compare, h2load, failover, gateway, apiserver) in one
//! run, one report folder, one `report.md` with a section each.
//!
//! Each benchmark runs with its own defaults (or its smoke settings with
//! `--smoke`); a failing benchmark is reported in its section and makes the
//! command exit non-zero after the others have run. The report opens with
//! the open issues' targets checked against this run ([`crate::goals`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::{Args, FromArgMatches, Parser};
use serde_json::{json, Value};

use crate::report::{ensure_dir, write_report, Outcome, RESULTS_FILE};

/// Options of `bench all`.
#[derive(Args, Clone, Debug)]
pub struct AllArgs {
    /// Folder for report.md, results.json and the plots.
    #[arg(long)]
    pub report: PathBuf,
    /// Our store binary.
    #[arg(long, env = "STORE_BIN")]
    pub ours_bin: Option<PathBuf>,
    /// Our gateway binary.
    #[arg(long, env = "GATEWAY_BIN")]
    pub gateway_bin: Option<PathBuf>,
    /// Directory holding etcd 3.5.
    #[arg(long, env = "ETCD35_DIR")]
    pub etcd_dir: Option<PathBuf>,
    /// Leave a proxy out of the gateway benchmark (gateway|haproxy).
    #[arg(long)]
    pub skip: Vec<String>,
    /// Tiny runs of everything (CI).
    #[arg(long)]
    pub smoke: bool,
}

/// Parses a subcommand's options from an argument list.
#[derive(Parser, Debug)]
struct Sub<T: Args + FromArgMatches> {
    #[command(flatten)]
    args: T,
}

fn sub_args<T: Args + FromArgMatches>(argv: Vec<String>) -> Result<T> {
    let argv = std::iter::once("bench".to_string()).chain(argv);
    Ok(Sub::<T>::try_parse_from(argv)?.args)
}

impl AllArgs {
    fn common(&self, gateway: bool) -> Vec<String> {
        let mut v = Vec::new();
        let mut push = |flag: &str, val: &Option<PathBuf>| {
            if let Some(p) = val {
                v.push(flag.to_string());
                v.push(p.display().to_string());
            }
        };
        if gateway {
            push("--gateway-bin", &self.gateway_bin);
        } else {
            push("--ours-bin", &self.ours_bin);
            push("--etcd-dir", &self.etcd_dir);
        }
        if gateway {
            for s in &self.skip {
                v.extend(["--skip".to_string(), s.clone()]);
            }
        }
        if self.smoke {
            v.push("--smoke".into());
        }
        v
    }
}

/// One benchmark's contribution: (title, text, markdown, json) or its error.
struct Part {
    title: String,
    outcome: Result<(String, String, Value)>,
}

fn part(title: &str, dir: &Path, outcome: &Result<impl Outcome>) -> Part {
    let outcome = outcome
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(|o| Ok((o.text(), o.markdown(dir)?, serde_json::to_value(o)?)));
    Part {
        title: title.to_string(),
        outcome,
    }
}

/// Runs everything and writes the combined report.
pub async fn run(args: &AllArgs, seed: u64, progress: bool) -> Result<()> {
    let dir = ensure_dir(&args.report)?;
    let mut parts = Vec::new();
    let compare = sub_args::<crate::compare::CompareArgs>(args.common(false))?;
    let compare = crate::compare::run(&compare, seed, progress).await;
    parts.push(part("compare: store vs etcd 3.5", &dir, &compare));
    let h2load = sub_args::<crate::h2load::H2loadArgs>(args.common(false))?;
    let h2load = crate::h2load::run(&h2load).await;
    parts.push(part("h2load: raw gRPC, store vs etcd 3.5", &dir, &h2load));
    let failover = sub_args::<crate::failover::FailoverArgs>(args.common(false))?;
    let failover = crate::failover::run(&failover, seed, progress).await;
    parts.push(part("failover: leader kill -9 under load", &dir, &failover));
    let gateway = sub_args::<crate::gateway::GatewayArgs>(args.common(true))?;
    let gateway = crate::gateway::run(&gateway, seed, progress).await;
    parts.push(part(
        "gateway: direct vs gateway vs HAProxy",
        &dir,
        &gateway,
    ));
    let apiserver = sub_args::<crate::apiserver::ApiserverArgs>(args.common(false))?;
    let apiserver = crate::apiserver::run(&apiserver, seed, progress).await;
    parts.push(part(
        "apiserver: kube-apiserver-shaped workload",
        &dir,
        &apiserver,
    ));
    let goals = crate::goals::evaluate(&crate::goals::Inputs {
        compare: compare.as_ref().ok(),
        h2load: h2load.as_ref().ok(),
        failover: failover.as_ref().ok(),
        gateway: gateway.as_ref().ok(),
    });
    let goals = (
        "Goals: the open issues' targets in this run".to_string(),
        crate::goals::markdown(&goals),
    );
    finish(&dir, goals, parts)
}

fn finish(dir: &Path, goals: (String, String), parts: Vec<Part>) -> Result<()> {
    println!("{}\n", goals.1);
    let mut sections = vec![goals];
    let mut results = serde_json::Map::new();
    let mut failed = Vec::new();
    for p in parts {
        let key = p.title.split(':').next().unwrap_or("part").to_string();
        match p.outcome {
            Ok((text, md, value)) => {
                println!("{text}");
                sections.push((p.title, md));
                results.insert(key, value);
            }
            Err(e) => {
                eprintln!("bench: {key} failed: {e:#}");
                sections.push((p.title, format!("**Failed:** `{e:#}`\n")));
                results.insert(key.clone(), json!({ "error": format!("{e:#}") }));
                failed.push(key);
            }
        }
    }
    write_report(dir, &sections)?;
    crate::cli::write_json(&dir.join(RESULTS_FILE), &Value::Object(results))?;
    eprintln!(
        "bench: report written to {}",
        dir.join(crate::report::REPORT_FILE).display()
    );
    if !failed.is_empty() {
        bail!("benchmarks failed: {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_args_parse_defaults_and_flags() {
        let c: crate::compare::CompareArgs = sub_args(vec!["--smoke".into()]).unwrap();
        assert!(c.smoke);
        let g: crate::gateway::GatewayArgs =
            sub_args(vec!["--skip".into(), "gateway".into()]).unwrap();
        assert_eq!(g.skip, vec![crate::gateway::Side::Gateway]);
    }
}
