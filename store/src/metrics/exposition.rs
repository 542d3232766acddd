//! The Prometheus text exposition format (version 0.0.4), which etcd
//! serves on `/metrics`, from prometheus-client's OpenMetrics encoding.
//!
//! The two formats agree on sample lines; they differ in the metadata:
//! prometheus-client names a counter's family without its `_total` suffix
//! in `# HELP`/`# TYPE` (OpenMetrics' family name) while Prometheus' format
//! names the sample (`etcd_mvcc_put_total`), prometheus-client appends a
//! period to every registered help text, and OpenMetrics ends with
//! `# EOF`. [`to_prometheus_text`] rewrites exactly those three things, so
//! `# HELP` lines carry etcd's help texts byte for byte.

use std::fmt::Write;

use prometheus_client::encoding::text::encode_registry;
use prometheus_client::registry::Registry;

/// The `Content-Type` of the Prometheus text format, as etcd's promhttp
/// handler sends it.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Encodes `registry` in the Prometheus text format.
pub fn encode(registry: &Registry) -> String {
    let mut open_metrics = String::new();
    // Writing to a String cannot fail; an encoder error would be a bug in
    // a metric's encoding, which then leaves that family out.
    if let Err(e) = encode_registry(&mut open_metrics, registry) {
        tracing::warn!(error = %e, "encoding metrics");
    }
    to_prometheus_text(&open_metrics)
}

/// Rewrites prometheus-client's OpenMetrics text (without `# EOF`) into
/// the Prometheus text format.
pub fn to_prometheus_text(open_metrics: &str) -> String {
    let mut out = String::with_capacity(open_metrics.len());
    let mut help: Option<(&str, &str)> = None;
    for line in open_metrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text.strip_suffix('.').unwrap_or(text)));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let sample_name = match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            };
            if let Some((_, text)) = help.take() {
                let _ = writeln!(out, "# HELP {sample_name} {text}");
            }
            let _ = writeln!(out, "# TYPE {sample_name} {kind}");
        } else if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn counters_are_named_by_their_samples_and_help_is_verbatim() {
        let mut r = Registry::default();
        let c: Counter = Counter::default();
        c.inc_by(3);
        r.register(
            "etcd_mvcc_put",
            "Total number of puts seen by this member.",
            c,
        );
        let g: Gauge = Gauge::default();
        r.register("etcd_cluster_version", "no period here", g);
        let text = encode(&r);
        assert!(
            text.contains(
                "# HELP etcd_mvcc_put_total Total number of puts seen by this member.\n\
             # TYPE etcd_mvcc_put_total counter\netcd_mvcc_put_total 3\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# HELP etcd_cluster_version no period here\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
    }
}
