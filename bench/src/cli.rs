//! Command-line arguments shared by the load-generating subcommands, and output helpers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::load::LoadConfig;
use crate::pace::Stop;

/// Operations per run when neither --total nor --duration is given (as etcd's benchmark).
pub const DEFAULT_TOTAL: u64 = 10_000;
/// Default seed of all random choices.
pub const DEFAULT_SEED: u64 = 20240601;

/// Output format of results on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Options of every load-generating subcommand (like etcd's `benchmark`).
#[derive(Args, Clone, Debug)]
pub struct LoadArgs {
    /// Comma-separated client URLs (host:port or http://host:port).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:2379")]
    pub endpoints: Vec<String>,
    /// gRPC connections shared by the clients.
    #[arg(long, default_value_t = 1)]
    pub conns: usize,
    /// Concurrent clients (each sends one request at a time).
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Operations to issue (default 10000 unless --duration is given).
    #[arg(long)]
    pub total: Option<u64>,
    /// Run for this long instead (e.g. 30s, 500ms, 2m).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Open-loop rate in operations per second over all clients (default: closed loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Key size in bytes.
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes (at least 8: the send timestamp).
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 1)]
    pub key_space_size: u64,
    /// Use keys in sequence instead of at random.
    #[arg(long)]
    pub sequential_keys: bool,
    /// Send everything to the current leader only.
    #[arg(long)]
    pub target_leader: bool,
    /// Prefix of every key the run writes or reads.
    #[arg(long, default_value = "bench/")]
    pub prefix: String,
    /// Result format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
    /// Also write the JSON result to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

impl LoadArgs {
    /// The run configuration these options describe.
    pub fn config(&self, seed: u64, progress: bool) -> Result<LoadConfig> {
        if self.clients == 0 || self.conns == 0 {
            bail!("--clients and --conns must be at least 1");
        }
        let total = match (self.total, self.duration) {
            (None, None) => Some(DEFAULT_TOTAL),
            (t, _) => t,
        };
        Ok(LoadConfig {
            endpoints: self
                .endpoints
                .iter()
                .map(|e| normalize_endpoint(e))
                .collect(),
            conns: self.conns,
            clients: self.clients,
            stop: Stop::new(total, self.duration),
            rate: self.rate,
            key_size: self.key_size,
            val_size: self.val_size,
            key_space: self.key_space_size.max(1),
            sequential: self.sequential_keys,
            target_leader: self.target_leader,
            seed,
            progress,
            target: self.endpoints.join(","),
            prefix: self.prefix.clone(),
        })
    }
}

/// `host:port` → `http://host:port`; URLs are kept.
pub fn normalize_endpoint(e: &str) -> String {
    if e.contains("://") {
        e.to_string()
    } else {
        format!("http://{e}")
    }
}

/// Parses `250ms`, `30s`, `2m`, `1h` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("3d").is_err());
    }
}
