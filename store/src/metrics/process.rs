//! The `process_*` family (Prometheus' process collector, which etcd
//! registers): CPU time, memory, file descriptors and start time, read
//! from `/proc/self` on each scrape. Off Linux (no `/proc`) the family is
//! simply absent.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// Clock ticks per second in `/proc/<pid>/stat` times: `USER_HZ`, which
/// the kernel fixes at 100 for user space on every architecture.
const USER_HZ: f64 = 100.0;

/// Field numbers (1-based, as in proc(5)) of `/proc/self/stat`.
const STAT_UTIME: usize = 14;
const STAT_STIME: usize = 15;
const STAT_STARTTIME: usize = 22;
const STAT_VSIZE: usize = 23;

/// One reading of the process's state.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU seconds.
    pub cpu_seconds: f64,
    /// Resident set size in bytes.
    pub resident_bytes: f64,
    /// Virtual memory size in bytes.
    pub virtual_bytes: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The soft limit on open file descriptors.
    pub max_fds: f64,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Reads [`ProcessStats`] from `/proc`; `None` where there is no `/proc`.
pub fn read_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let boot = boot_time_seconds(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let fields = stat_fields(&stat)?;
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
    Some(ProcessStats {
        cpu_seconds: (field(STAT_UTIME)? + field(STAT_STIME)?) / USER_HZ,
        resident_bytes: status_kib(&status, "VmRSS:").unwrap_or(0.0) * 1024.0,
        virtual_bytes: field(STAT_VSIZE)?,
        open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count() as f64,
        max_fds: max_open_files(&limits)?,
        start_time_seconds: boot + field(STAT_STARTTIME)? / USER_HZ,
    })
}

/// The fields of `/proc/<pid>/stat` after the command name (which may
/// hold spaces and parentheses): field 3 (state) first.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    Some(after_comm.split_whitespace().collect())
}

fn status_kib(status: &str, key: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

fn max_open_files(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    match soft {
        "unlimited" => Some(f64::INFINITY),
        n => n.parse().ok(),
    }
}

fn boot_time_seconds(proc_stat: &str) -> Option<f64> {
    let line = proc_stat.lines().find(|l| l.starts_with("btime "))?;
    line["btime ".len()..].trim().parse().ok()
}

/// Encodes the `process_*` family on every scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl ProcessCollector {
    /// A collector for this process.
    pub fn new() -> Self {
        ProcessCollector
    }
}

/// Encodes one gauge. Help texts get the period that registered metrics
/// get from prometheus-client, so [`super::exposition`] treats every
/// `# HELP` line alike.
fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let m = encoder.encode_descriptor(name, &format!("{help}."), None, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(s) = read_stats() else {
            return Ok(());
        };
        let m = encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds..",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.cpu_seconds).encode(m)?;
        let e = &mut encoder;
        gauge(
            e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            s.resident_bytes,
        )?;
        gauge(
            e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            s.virtual_bytes,
        )?;
        gauge(
            e,
            "process_open_fds",
            "Number of open file descriptors.",
            s.open_fds,
        )?;
        gauge(
            e,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            s.max_fds,
        )?;
        gauge(
            e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            s.start_time_seconds,
        )
    }
}

/// Seconds since the Unix epoch now (for tests comparing start times).
pub fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let s = read_stats().expect("/proc");
        assert!(s.resident_bytes > 0.0);
        assert!(s.open_fds >= 3.0);
        assert!(s.max_fds >= s.open_fds);
        assert!(s.start_time_seconds <= now_seconds() + 1.0);
        assert!(s.start_time_seconds > now_seconds() - 86_400.0 * 365.0);
    }

    #[test]
    fn command_names_with_spaces_and_parentheses() {
        let f = stat_fields("12 (a b) c) S 1 2").expect("fields");
        assert_eq!(f, vec!["S", "1", "2"]);
    }
}
