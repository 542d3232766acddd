//! Logging as etcd's zap logger writes it: `--logger zap`, `--log-outputs`
//! (`default`, `stderr`, `stdout` or file paths, comma-separated),
//! `--log-format json|console` and `--log-level`.
//!
//! Each event becomes one line. JSON lines carry etcd's field names:
//! `level` (lowercase), `ts` (RFC 3339 UTC, milliseconds), `logger` (for
//! events of other crates, e.g. `openraft`, as etcd tags raft's lines),
//! `caller` (`dir/file.rs:line`), `msg`, then the event's own fields, so
//! tools that read etcd's logs (`jq 'select(.level=="warn")'`, log
//! shippers keyed on `msg`) read ours. The console format is zap's console
//! encoder: tab-separated time, LEVEL, caller, message and the fields as a
//! JSON object. `default` means stderr (etcd uses journald under systemd
//! only when built for it; journald captures stderr there anyway).

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Why the logging flags cannot be applied. Messages are etcd's.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// `--logger` other than `zap`.
    #[error("unknown logger option {0:?}")]
    UnknownLogger(String),
    /// `--logger capnslog`.
    #[error("--logger=capnslog is removed in v3.5")]
    CapnslogRemoved,
    /// `default` listed with other outputs.
    #[error("multi logoutput for \"default\" is not supported yet")]
    MultiDefault,
    /// `--log-format` other than `json` or `console`.
    #[error("unsupported log format: {0:?}")]
    UnknownFormat(String),
    /// A file output cannot be opened for appending.
    #[error("open {path}: {reason}")]
    OpenFile {
        /// The path.
        path: String,
        /// The I/O error.
        reason: std::io::Error,
    },
}

/// One `--log-outputs` target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogOutput {
    /// Standard error (also what `default` means).
    Stderr,
    /// Standard output.
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

/// The logging flags.
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// `--logger`.
    pub logger: String,
    /// `--log-outputs`.
    pub outputs: String,
    /// `--log-format`.
    pub format: String,
    /// `--log-level`.
    pub level: String,
}

/// Parses `--log-outputs` as etcd does.
pub fn parse_outputs(list: &str) -> Result<Vec<LogOutput>, LogError> {
    let items: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if items.len() > 1 && items.contains(&"default") {
        return Err(LogError::MultiDefault);
    }
    let mut out: Vec<LogOutput> = Vec::new();
    for item in items {
        let o = match item {
            "default" | "stderr" => LogOutput::Stderr,
            "stdout" => LogOutput::Stdout,
            path => LogOutput::File(PathBuf::from(path)),
        };
        if !out.contains(&o) {
            out.push(o);
        }
    }
    if out.is_empty() {
        out.push(LogOutput::Stderr);
    }
    Ok(out)
}

/// The event formatter for `settings`, and where its lines go.
pub fn formatter(settings: &LogSettings) -> Result<(EtcdFormat, BoxMakeWriter), LogError> {
    match settings.logger.as_str() {
        "zap" => {}
        "capnslog" => return Err(LogError::CapnslogRemoved),
        other => return Err(LogError::UnknownLogger(other.to_string())),
    }
    let json = match settings.format.as_str() {
        "json" => true,
        "console" => false,
        other => return Err(LogError::UnknownFormat(other.to_string())),
    };
    let mut writer: Option<BoxMakeWriter> = None;
    for output in parse_outputs(&settings.outputs)? {
        let next = match output {
            LogOutput::Stderr => BoxMakeWriter::new(std::io::stderr),
            LogOutput::Stdout => BoxMakeWriter::new(std::io::stdout),
            LogOutput::File(path) => BoxMakeWriter::new(Arc::new(open_append(&path)?)),
        };
        writer = Some(match writer {
            None => next,
            Some(w) => BoxMakeWriter::new(w.and(next)),
        });
    }
    let writer = writer.unwrap_or_else(|| BoxMakeWriter::new(std::io::stderr));
    Ok((EtcdFormat { json }, writer))
}

fn open_append(path: &PathBuf) -> Result<std::fs::File, LogError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|reason| LogError::OpenFile {
            path: path.display().to_string(),
            reason,
        })
}

/// Installs the global subscriber. `RUST_LOG` (tracing's filter syntax)
/// overrides `--log-level` when set.
pub fn init(settings: &LogSettings) -> Result<(), LogError> {
    let (format, writer) = formatter(settings)?;
    let level = match settings.level.as_str() {
        "panic" | "fatal" => "error",
        other => other,
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},openraft=warn")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .event_format(format)
        .init();
    Ok(())
}

/// zap's line formats (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct EtcdFormat {
    json: bool,
}

impl<S, N> FormatEvent<S, N> for EtcdFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let line = render_line(self.json, SystemTime::now(), event);
        writer.write_str(&line)
    }
}

/// One event as a complete line (with its newline).
fn render_line(json: bool, now: SystemTime, event: &Event<'_>) -> String {
    let meta = event.metadata();
    let mut fields = Fields::default();
    event.record(&mut fields);
    let ts = rfc3339_millis(now);
    let caller = caller(meta.file(), meta.line());
    let logger = meta.target().split("::").next().unwrap_or_default();
    let logger = (logger != "store").then_some(logger);
    if json {
        let mut head = vec![
            ("level".to_string(), Value::from(level_name(meta.level()))),
            ("ts".to_string(), ts.into()),
        ];
        head.extend(logger.map(|l| ("logger".to_string(), Value::from(l))));
        head.push(("caller".to_string(), caller.into()));
        head.push(("msg".to_string(), fields.msg.into()));
        let members: Vec<String> = head
            .into_iter()
            .chain(fields.rest)
            .map(|(k, v)| format!("{}:{v}", Value::String(k)))
            .collect();
        format!("{{{}}}\n", members.join(","))
    } else {
        let mut parts = vec![ts, level_name(meta.level()).to_uppercase()];
        parts.extend(logger.map(str::to_string));
        parts.push(caller);
        parts.push(fields.msg);
        if !fields.rest.is_empty() {
            let rest: Map<String, Value> = fields.rest.into_iter().collect();
            parts.push(Value::Object(rest).to_string());
        }
        format!("{}\n", parts.join("\t"))
    }
}

/// zap's level names.
fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG | Level::TRACE => "debug",
    }
}

/// `dir/file.rs:line`, as zap's short caller encoder writes it.
fn caller(file: Option<&str>, line: Option<u32>) -> String {
    let file = file.unwrap_or("?");
    let mut parts = file.rsplitn(3, '/');
    let name = parts.next().unwrap_or(file);
    let short = match parts.next() {
        Some(dir) => format!("{dir}/{name}"),
        None => name.to_string(),
    };
    format!("{short}:{}", line.unwrap_or(0))
}

/// An event's message and other fields (in the order they were given).
#[derive(Default)]
struct Fields {
    msg: String,
    rest: Vec<(String, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.msg = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.rest.push((field.name().to_string(), value));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
}

/// Seconds per day.
const SECS_PER_DAY: u64 = 86_400;

/// `2026-11-23T08:13:37.385Z`: zap's ISO 8601 time encoder in UTC.
fn rfc3339_millis(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) = civil_from_days(secs / SECS_PER_DAY);
    let rem = secs % SECS_PER_DAY;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (days are grouped
/// into 400-year eras of 146,097 days, each starting on March 1st so that
/// the leap day ends a year).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn outputs_follow_etcd() {
        assert_eq!(parse_outputs("default").unwrap(), [LogOutput::Stderr]);
        assert_eq!(
            parse_outputs("stdout,/var/log/etcd.log").unwrap(),
            [
                LogOutput::Stdout,
                LogOutput::File(PathBuf::from("/var/log/etcd.log"))
            ]
        );
        assert_eq!(
            parse_outputs("default,stdout").unwrap_err().to_string(),
            "multi logoutput for \"default\" is not supported yet"
        );
        let settings = |logger: &str, format: &str| LogSettings {
            logger: logger.into(),
            outputs: "stderr".into(),
            format: format.into(),
            level: "info".into(),
        };
        assert_eq!(
            formatter(&settings("foo", "json")).unwrap_err().to_string(),
            "unknown logger option \"foo\""
        );
        assert!(matches!(
            formatter(&settings("zap", "xml")),
            Err(LogError::UnknownFormat(_))
        ));
    }

    #[test]
    fn timestamps_and_callers_are_zaps() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_421_617_385);
        assert_eq!(rfc3339_millis(t), "2026-11-23T08:13:37.385Z");
        assert_eq!(
            rfc3339_millis(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(
            caller(Some("store/src/server/kv.rs"), Some(7)),
            "server/kv.rs:7"
        );
        assert_eq!(caller(Some("main.rs"), Some(1)), "main.rs:1");
    }

    #[test]
    fn json_lines_carry_etcds_field_names() {
        use std::sync::Mutex;
        let lines = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || SharedBuf(sink.clone()))
            .event_format(EtcdFormat { json: true })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(path = %"/x", count = 3u64, "loaded");
        });
        let text = String::from_utf8(lines.lock().unwrap().clone()).unwrap();
        let v: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["level"], "warn");
        assert_eq!(v["msg"], "loaded");
        assert_eq!(v["path"], "/x");
        assert_eq!(v["count"], 3);
        assert!(v["caller"].as_str().unwrap().starts_with("src/logging.rs:"));
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
        assert!(text.starts_with("{\"level\":\"warn\",\"ts\":"), "{text}");
        assert!(
            text.contains("\"msg\":\"loaded\",\"path\":\"/x\",\"count\":3}"),
            "{text}"
        );
    }

    struct SharedBuf(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
