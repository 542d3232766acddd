//! Helpers for the Watch and Lease tests (`watch_lease_differential`,
//! `watch_cache_pattern`).
//!
//! - [`FlaggedBinary`]: a server binary started with extra etcd flags (for
//!   example `--experimental-watch-progress-notify-interval=1s`) through a
//!   tiny `exec` wrapper script, so [`crate::Cluster`] starts it unchanged.
//! - [`CtlProcess`]: a long-running etcdctl (`watch`, `lock`, `elect`) whose
//!   output is collected while it runs; it is stopped by SIGTERM (etcdctl's
//!   graceful path: lock and election sessions are revoked) or SIGKILL, and
//!   never outlives its deadline or its owner.
//! - Watch streams: [`next_response`] reads one response within a deadline;
//!   [`WatchItem`] flattens a response into events and control messages, so
//!   transcripts do not depend on how a server batches events into responses.
//! - [`LeaseNames`]: server-assigned lease ids differ between two servers;
//!   they are renamed `<LEASE#n>` in order of first appearance, so the same
//!   sequence of operations yields the same transcript on both.
//! - [`assert_same`]: compares the oracle's and the candidate's transcripts
//!   line by line and panics with the first difference.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use etcd_client::{Client, Event, EventType, KeyValue, WatchResponse, WatchResponseStream};
use regex::Regex;
use tempfile::TempDir;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use crate::binary::Binary;
use crate::client::connect_with_timeout;
use crate::etcdctl::{CtlOutput, Etcdctl};

/// etcd's flag for the interval of periodic watch progress notifications.
pub const PROGRESS_NOTIFY_INTERVAL_FLAG: &str = "--experimental-watch-progress-notify-interval";
/// Per-request timeout of watch connections: it bounds opening a stream (the
/// response headers), not the life of the stream.
pub const WATCH_OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a [`CtlProcess`]'s collected output is checked while waiting.
pub const CTL_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Bound for an etcdctl process to exit after SIGTERM (it revokes its session
/// lease first, which is one round trip through Raft).
pub const CTL_TERM_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for reading the rest of a process's output after it exited.
const CTL_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Servers with extra flags.
// ---------------------------------------------------------------------------

/// A server binary that always gets some extra flags: a `/bin/sh` script that
/// `exec`s the real binary with the harness's flags followed by the extra
/// ones. `exec` keeps the process id, so SIGKILL by the cluster still hits
/// the server itself. The script lives as long as this value.
pub struct FlaggedBinary {
    binary: Binary,
    _dir: TempDir,
}

impl FlaggedBinary {
    /// A wrapper of `base` that appends `flags` to every start.
    pub fn new(base: &Binary, flags: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("etcd-it-flags-")
            .tempdir()
            .context("creating the wrapper script's directory")?;
        let base_path = base
            .path
            .to_str()
            .with_context(|| format!("{} is not UTF-8", base.path.display()))?;
        for word in std::iter::once(base_path).chain(flags.iter().copied()) {
            ensure!(!word.contains('\''), "cannot quote {word:?} for sh");
        }
        let extra: String = flags.iter().map(|flag| format!(" '{flag}'")).collect();
        let script = format!("#!/bin/sh\nexec '{base_path}' \"$@\"{extra}\n");
        let path: PathBuf = dir.path().join(base.file_name());
        std::fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        let binary = Binary::at(
            &format!("{} with {}", base.role, flags.join(" ")),
            path,
            "the wrapper script was just written",
        )?;
        Ok(Self { binary, _dir: dir })
    }

    /// The wrapper, to give to [`crate::Cluster::start`].
    pub fn binary(&self) -> Binary {
        self.binary.clone()
    }
}

// ---------------------------------------------------------------------------
// Long-running etcdctl processes.
// ---------------------------------------------------------------------------

/// A running etcdctl whose stdout and stderr are collected in the background.
pub struct CtlProcess {
    what: String,
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

impl CtlProcess {
    /// Starts `etcdctl <args>` against `endpoints` with the same global flags
    /// and clean environment as [`crate::Etcdctl`].
    pub fn spawn(ctl: &Binary, endpoints: &[String], args: &[&str]) -> Result<Self> {
        let what = format!("etcdctl {args:?}");
        let mut child = Etcdctl::new(ctl.clone(), endpoints.to_vec())
            .command(args)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {what}"))?;
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(
                child.stdout.take().context("stdout is piped")?,
                stdout.clone(),
            ),
            collect(
                child.stderr.take().context("stderr is piped")?,
                stderr.clone(),
            ),
        ];
        Ok(Self {
            what,
            child,
            stdout,
            stderr,
            readers,
        })
    }

    /// What this process is, for messages.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Everything printed on stdout so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().expect("stdout buffer")).into_owned()
    }

    /// Everything printed on stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("stderr buffer")).into_owned()
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until `done(stdout)` holds. Fails if the deadline passes or the
    /// process exits first (with everything it printed).
    pub async fn wait_stdout(
        &mut self,
        what: &str,
        deadline: Duration,
        done: impl Fn(&str) -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            if done(&self.stdout()) {
                return Ok(());
            }
            if self.exited() {
                // Output may still be in the pipe.
                sleep(CTL_POLL_INTERVAL).await;
                if done(&self.stdout()) {
                    return Ok(());
                }
                bail!(
                    "{} exited before {what}:\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.what,
                    self.stdout(),
                    self.stderr()
                );
            }
            if start.elapsed() >= deadline {
                bail!(
                    "{} did not print {what} within {deadline:?}:\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.what,
                    self.stdout(),
                    self.stderr()
                );
            }
            sleep(CTL_POLL_INTERVAL).await;
        }
    }

    /// Waits for the process to exit by itself within `deadline`; kills it
    /// and fails otherwise.
    pub async fn wait_exit(self, deadline: Duration) -> Result<CtlOutput> {
        self.exit_within(deadline, "").await
    }

    /// The output once the process exits within `deadline`; SIGKILL and an
    /// error (naming `after`, what the wait followed) if it does not.
    async fn exit_within(mut self, deadline: Duration, after: &str) -> Result<CtlOutput> {
        match timeout(deadline, self.child.wait()).await {
            Ok(status) => {
                status.with_context(|| format!("waiting for {}", self.what))?;
                self.output().await
            }
            Err(_) => {
                let what = self.what.clone();
                let output = self.kill().await?;
                bail!("{what} did not exit within {deadline:?}{after}:\n{output}")
            }
        }
    }

    /// SIGTERM (etcdctl closes its session: lock and election keys are
    /// released), then waits up to [`CTL_TERM_TIMEOUT`] for the exit; SIGKILL
    /// and an error if it does not exit.
    pub async fn terminate(self) -> Result<CtlOutput> {
        if let Some(pid) = self.child.id() {
            let status = Command::new("/bin/sh")
                .arg("-c")
                .arg(format!("kill -TERM {pid}"))
                .status()
                .await
                .context("running kill -TERM")?;
            ensure!(status.success(), "kill -TERM {pid} failed: {status}");
        }
        self.exit_within(CTL_TERM_TIMEOUT, " of SIGTERM").await
    }

    /// SIGKILL and the collected output (exit code `None`).
    pub async fn kill(mut self) -> Result<CtlOutput> {
        if self.child.try_wait()?.is_none() {
            self.child
                .kill()
                .await
                .with_context(|| format!("killing {}", self.what))?;
        }
        self.output().await
    }

    async fn output(&mut self) -> Result<CtlOutput> {
        let status = self.child.wait().await?;
        for reader in self.readers.drain(..) {
            timeout(CTL_DRAIN_TIMEOUT, reader)
                .await
                .with_context(|| format!("reading the output of {}", self.what))??;
        }
        Ok(CtlOutput {
            stdout: self.stdout(),
            stderr: self.stderr(),
            code: status.code(),
        })
    }
}

fn collect(
    mut source: impl AsyncRead + Unpin + Send + 'static,
    sink: Arc<Mutex<Vec<u8>>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut buffer = [0u8; 8192];
        while let Ok(read) = source.read(&mut buffer).await {
            if read == 0 {
                break;
            }
            sink.lock()
                .expect("output buffer")
                .extend_from_slice(&buffer[..read]);
        }
    })
}

/// Events printed by `etcdctl watch` in the simple format: one `PUT` or
/// `DELETE` line each (test values never equal those words).
pub fn simple_watch_events(stdout: &str) -> usize {
    stdout
        .lines()
        .filter(|line| *line == "PUT" || *line == "DELETE")
        .count()
}

/// Events printed by `etcdctl watch -w json` (one response per line).
pub fn json_watch_events(stdout: &str) -> usize {
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|response| response["Events"].as_array().map_or(0, Vec::len))
        .sum()
}

// ---------------------------------------------------------------------------
// Watch streams.
// ---------------------------------------------------------------------------

/// A connection for watch streams (see [`WATCH_OPEN_TIMEOUT`]).
pub async fn watch_connect(endpoints: &[String]) -> Result<Client> {
    connect_with_timeout(endpoints, WATCH_OPEN_TIMEOUT).await
}

/// The next response of `stream` within `deadline`. The end of the stream or
/// a gRPC error is an error.
pub async fn next_response(
    stream: &mut WatchResponseStream,
    deadline: Duration,
) -> Result<WatchResponse> {
    match timeout(deadline, stream.message()).await {
        Err(_) => bail!("no watch response within {deadline:?}"),
        Ok(Err(error)) => Err(anyhow!(error).context("watch stream failed")),
        Ok(Ok(None)) => bail!("watch stream ended"),
        Ok(Ok(Some(response))) => Ok(response),
    }
}

/// One event or control message of a watch stream, independent of how the
/// server grouped events into responses.
#[derive(Clone, Debug)]
pub enum WatchItem {
    /// An event, with the watch id and header revision of its response.
    Event {
        watch_id: i64,
        header_revision: i64,
        fragment: bool,
        event: Event,
    },
    /// A response without events (created, canceled, progress).
    Control(WatchResponse),
}

impl WatchItem {
    /// The items of one response, in order.
    pub fn split(response: WatchResponse) -> Vec<WatchItem> {
        if response.events().is_empty() {
            return vec![WatchItem::Control(response)];
        }
        let header_revision = response.header().map_or(0, |header| header.revision());
        let fragment = is_fragment(&response);
        response
            .events()
            .iter()
            .map(|event| WatchItem::Event {
                watch_id: response.watch_id(),
                header_revision,
                fragment,
                event: event.clone(),
            })
            .collect()
    }

    /// The watch id the item belongs to.
    pub fn watch_id(&self) -> i64 {
        match self {
            WatchItem::Event { watch_id, .. } => *watch_id,
            WatchItem::Control(response) => response.watch_id(),
        }
    }
}

/// The `fragment` flag of a response (etcd-client has no accessor; the
/// field is visible in its `Debug` form).
pub fn is_fragment(response: &WatchResponse) -> bool {
    format!("{response:?}").contains("fragment: true")
}

/// Whether a response is a progress notification: no events, not a
/// created or canceled response.
pub fn is_progress(response: &WatchResponse) -> bool {
    response.events().is_empty() && !response.created() && !response.canceled()
}

/// The revision of an event (its kv's mod revision; for a DELETE the
/// revision of the deletion).
pub fn event_revision(event: &Event) -> i64 {
    event.kv().map_or(0, KeyValue::mod_revision)
}

/// The key of an event, lossily as text.
pub fn event_key(event: &Event) -> String {
    event
        .kv()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Rendering with stable lease names.
// ---------------------------------------------------------------------------

/// Renames server-assigned lease ids `<LEASE#1>`, `<LEASE#2>`, ... in order of
/// first appearance. Id 0 (no lease) stays `0`.
#[derive(Default, Debug)]
pub struct LeaseNames {
    names: BTreeMap<i64, String>,
}

/// Places where etcdctl prints a lease id in hex, with the id as group 1:
/// `lease <id> ...` messages, and the keys `<name>/<id>` of `etcdctl lock`
/// and `etcdctl elect` for the lock and election names the tests use (names
/// starting with `lk`, `lock`, `myel` or `election`; a generic `<x>/<hex>`
/// would also match ordinary keys such as `w/a`).
static HEX_LEASE_CONTEXTS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        r"\blease ([0-9a-f]{1,16})\b",
        r"\b(?:lk|lock|myel|election)[a-z0-9-]*/([0-9a-f]{1,16})\b",
    ]
    .iter()
    .map(|pattern| Regex::new(pattern).expect("valid pattern"))
    .collect()
});

impl LeaseNames {
    pub fn new() -> Self {
        Self::default()
    }

    /// The stable name of lease `id`.
    pub fn name(&mut self, id: i64) -> String {
        if id == 0 {
            return "0".to_string();
        }
        let next = self.names.len() + 1;
        self.names
            .entry(id)
            .or_insert_with(|| format!("<LEASE#{next}>"))
            .clone()
    }

    /// The lease ids named so far, with their names.
    pub fn known(&self) -> &BTreeMap<i64, String> {
        &self.names
    }

    /// `text` with every hex lease id etcdctl prints as `lease <id> ...` or
    /// inside lock/election keys `<name>/<id>` replaced by its stable name.
    pub fn rename_hex(&mut self, text: &str) -> String {
        let mut current = text.to_string();
        for pattern in HEX_LEASE_CONTEXTS.iter() {
            let mut out = String::new();
            let mut last = 0;
            for captures in pattern.captures_iter(&current) {
                let group = captures.get(1).expect("group 1");
                let Ok(id) = u64::from_str_radix(group.as_str(), 16) else {
                    continue;
                };
                out.push_str(&current[last..group.start()]);
                out.push_str(&self.name(id as i64));
                last = group.end();
            }
            out.push_str(&current[last..]);
            current = out;
        }
        current
    }

    /// A key-value pair as one comparable line fragment.
    pub fn kv(&mut self, kv: &KeyValue) -> String {
        format!(
            "key={:?} create={} mod={} version={} lease={} value={}",
            String::from_utf8_lossy(kv.key()),
            kv.create_revision(),
            kv.mod_revision(),
            kv.version(),
            self.name(kv.lease()),
            render_value(kv.value()),
        )
    }

    /// An event as one comparable line.
    pub fn event(&mut self, event: &Event) -> String {
        let kind = match event.event_type() {
            EventType::Put => "PUT",
            EventType::Delete => "DELETE",
        };
        let kv = event.kv().map_or("kv=None".to_string(), |kv| self.kv(kv));
        let prev = event
            .prev_kv()
            .map_or("None".to_string(), |kv| format!("{{{}}}", self.kv(kv)));
        format!("{kind} {kv} prev_kv={prev}")
    }

    /// A watch item as one comparable line. Events show the watch id and the
    /// event; control responses show every field (header revision included).
    pub fn item(&mut self, item: &WatchItem) -> String {
        match item {
            WatchItem::Event {
                watch_id, event, ..
            } => format!("event watch_id={watch_id} {}", self.event(event)),
            WatchItem::Control(response) => self.control(response),
        }
    }

    /// A response without events, every field shown.
    pub fn control(&mut self, response: &WatchResponse) -> String {
        format!(
            "control watch_id={} created={} canceled={} compact_revision={} cancel_reason={:?} fragment={} header_revision={}",
            response.watch_id(),
            response.created(),
            response.canceled(),
            response.compact_revision(),
            response.cancel_reason(),
            is_fragment(response),
            response.header().map_or(-1, |header| header.revision()),
        )
    }
}

/// A value as text if short and printable, else its length and a hash.
pub fn render_value(value: &[u8]) -> String {
    const SHOWN_BYTES: usize = 64;
    match std::str::from_utf8(value) {
        Ok(text) if value.len() <= SHOWN_BYTES => format!("{text:?}"),
        _ => {
            // FNV-1a, enough to tell two values apart in a report.
            let hash = value.iter().fold(0xcbf29ce484222325u64, |hash, byte| {
                (hash ^ u64::from(*byte)).wrapping_mul(0x100000001b3)
            });
            format!("<{} bytes fnv={hash:016x}>", value.len())
        }
    }
}

// ---------------------------------------------------------------------------
// Comparison.
// ---------------------------------------------------------------------------

/// Lines of each transcript shown in a mismatch report.
const REPORT_LINES: usize = 200;

/// Panics unless the two transcripts are identical, showing the first
/// differing line and (bounded) both transcripts.
/// With `IT_SHOW_TRANSCRIPTS=1` the oracle's transcript is printed too.
pub fn assert_same(what: &str, oracle: &[String], candidate: &[String], candidate_binary: &Binary) {
    if std::env::var_os("IT_SHOW_TRANSCRIPTS").is_some() {
        eprintln!(
            "===== {what}: oracle transcript =====\n{}",
            oracle.join("\n")
        );
    }
    if oracle == candidate {
        return;
    }
    let line = oracle
        .iter()
        .zip(candidate)
        .position(|(a, b)| a != b)
        .unwrap_or(oracle.len().min(candidate.len()));
    let show = |lines: &[String]| {
        let mut text = lines
            .iter()
            .take(REPORT_LINES)
            .enumerate()
            .map(|(i, line)| format!("{:4} {line}\n", i + 1))
            .collect::<String>();
        if lines.len() > REPORT_LINES {
            let _ = writeln!(text, "[... {} more lines]", lines.len() - REPORT_LINES);
        }
        text
    };
    panic!(
        "{what}: the candidate differs from the reference etcd at line {}\n  oracle:    {:?}\n  candidate: {:?}\n\
         ===== oracle (reference etcd) =====\n{}\
         ===== candidate ({}) =====\n{}",
        line + 1,
        oracle.get(line),
        candidate.get(line),
        show(oracle),
        candidate_binary.path.display(),
        show(candidate),
    );
}

/// The lines of an etcdctl output (exit code, stdout, stderr), for a transcript.
pub fn ctl_lines(label: &str, output: &CtlOutput) -> Vec<String> {
    let mut lines = vec![format!("{label}: exit code {:?}", output.code)];
    lines.extend(
        output
            .stdout
            .lines()
            .map(|line| format!("{label}: stdout: {line}")),
    );
    lines.extend(
        output
            .stderr
            .lines()
            .map(|line| format!("{label}: stderr: {line}")),
    );
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_named_in_order_of_appearance() {
        let mut a = LeaseNames::new();
        let mut b = LeaseNames::new();
        let text_a = "lease 694d7f3e9a1c2b0a granted with TTL(2s)\nlk/694d7f3e9a1c2b0c\nlease 694d7f3e9a1c2b0a revoked\n";
        let text_b = "lease 1 granted with TTL(2s)\nlk/2\nlease 1 revoked\n";
        assert_eq!(a.rename_hex(text_a), b.rename_hex(text_b));
        assert_eq!(
            b.rename_hex(text_b),
            "lease <LEASE#1> granted with TTL(2s)\nlk/<LEASE#2>\nlease <LEASE#1> revoked\n"
        );
        assert_eq!(a.name(0), "0");
    }

    #[test]
    fn long_values_are_summarized() {
        assert_eq!(render_value(b"v1"), "\"v1\"");
        let long = vec![b'x'; 100];
        assert!(render_value(&long).starts_with("<100 bytes fnv="));
    }

    #[test]
    fn event_counts_of_etcdctl_output() {
        assert_eq!(simple_watch_events("PUT\na\n1\nDELETE\na\n\n"), 2);
        let json = "{\"Events\":[{},{}]}\n{\"Events\":[{}]}\n{\"Events\":[]}\n";
        assert_eq!(json_watch_events(json), 3);
    }
}
