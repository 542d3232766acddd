//! Differential Watch and Lease tests: the candidate server against real etcd 3.5.
//!
//! Every test starts a fresh single-member reference etcd 3.5 (the oracle)
//! and a fresh single-member candidate (`STORE_BIN`, default: our release
//! `store`) and runs the same sequence against both. Expected outputs are
//! never written by hand: the oracle's normalized output is the expectation.
//!
//! - `etcdctl watch` (a child process, killed once the expected number of
//!   events was printed plus a short settle time, or at a deadline):
//!   historical replay with `--rev`, `--prev-kv`, `--prefix`, key ranges,
//!   `-w json`, a start revision in the future, a start at and below the
//!   compaction revision (etcdctl exits by itself with "required revision
//!   has been compacted").
//! - etcd-client watch streams: created responses and server/client-chosen
//!   watch ids (and a duplicate id), history from a revision, `prev_kv`,
//!   NOPUT/NODELETE filters, a future start revision, cancel, cancel of an
//!   unknown id, RequestProgress once synced (watch id -1, header revision =
//!   current revision), compacted start (created, then canceled with
//!   `compact_revision`), and fragmented responses under a small
//!   `--max-request-bytes`.
//! - Leases: grant (TTL raised to the minimum TTL), fixed-id grants and
//!   their errors, put with `--lease`, `timetolive --keys` (granted TTL and
//!   keys exact, remaining TTL within a tolerance), `keep-alive --once`,
//!   `lease list`, revoke (the DELETE events a watcher sees and the
//!   revision), unknown-lease errors (message and gRPC code), expiry of a
//!   lease without keep-alive (DELETE events with `prev_kv`) while a
//!   kept-alive lease survives.
//! - `etcdctl lock` and `etcdctl elect` (client-side recipes over lease, txn
//!   and watch): exec mode with the lock key and revision in the
//!   environment, exit-code propagation, two holders serialized, campaign
//!   with a blocked second candidate, and an `elect -l` observer.
//!
//! Watch transcripts are compared event by event (a server may group events
//! of a historical replay into responses differently); responses without
//! events are compared field by field, and the fragment test compares
//! responses exactly. Server-assigned lease ids are renamed `<LEASE#n>` in
//! order of first appearance.
//!
//! Run: `STORE_BIN=/opt/etcd-3.5/etcd cargo test -p integration-tests --test integration watch_lease_differential::`

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{
    Client, Error, EventType, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions,
    Txn, TxnOp, WatchFilterType, WatchOptions, WatchResponseStream,
};
use integration_tests::client::current_revision;
use integration_tests::client::grpc_code;
use integration_tests::differential::Side;
use integration_tests::differential::{assert_fails, assert_ok, differential};
use integration_tests::wait::retry_until;
use integration_tests::watchlease::{
    assert_same, ctl_lines, event_revision, json_watch_events, next_response, simple_watch_events,
    watch_connect, CtlProcess, LeaseNames, WatchItem,
};
use integration_tests::{Binary, ClusterConfig, CtlOutput, Differential};
use regex::Regex;
use tokio::time::{sleep, Instant};

/// Deadline for a watcher (etcdctl or etcd-client) to deliver the events a
/// step expects; generous for a loaded 2-core machine.
const EVENTS_TIMEOUT: Duration = Duration::from_secs(30);
/// After the expected events arrived, how long a watcher keeps running so
/// that extra (duplicate or spurious) output is caught too.
const SETTLE_TIME: Duration = Duration::from_millis(300);
/// How long a stream is read at the end of a scenario for unexpected extras.
const QUIET_PERIOD: Duration = Duration::from_millis(500);
/// Deadline for an etcdctl that ends by itself (compacted watch, lock with a
/// command, a lock waiter that got the lock).
const CTL_EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for lock/election waiters and observers to react.
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// Tolerance between two servers' remaining TTLs (they are read at slightly
/// different times on a loaded machine).
const TTL_TOLERANCE_SECONDS: i64 = 3;
/// TTL requested below etcd's minimum (ceil(1.5 × 1 s election timeout) = 2 s).
const BELOW_MINIMUM_TTL_SECONDS: i64 = 1;
/// TTL of long-lived test leases, far longer than any test runs.
const LONG_TTL_SECONDS: i64 = 60;
/// TTL of the leases that expire in the expiry test.
const EXPIRING_TTL_SECONDS: i64 = 3;
/// Deadline, beyond the TTL, for an expired lease's keys to be deleted.
const EXPIRY_TIMEOUT: Duration = Duration::from_secs(45);
/// Interval of keep-alive requests for the kept-alive lease (a third of its TTL).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long the kept-alive lease is kept alive: two full TTLs.
const KEEPALIVE_SPAN: Duration = Duration::from_secs(2 * EXPIRING_TTL_SECONDS as u64);
/// Fixed lease ids (etcdctl spells them in hex), so both servers agree.
const LEASE_A: i64 = 0x1000;
const LEASE_A_HEX: &str = "1000";
const LEASE_ZERO_TTL: i64 = 0x1001;
const LEASE_EXPIRING: i64 = 0x2000;
const LEASE_KEPT: i64 = 0x2001;
/// A lease id that is never granted.
const MISSING_LEASE: i64 = 0xabcdef;
const MISSING_LEASE_HEX: &str = "abcdef";
/// etcd's maximum lease TTL is 9,000,000,000 s; one more is rejected.
const TOO_LARGE_TTL_SECONDS: i64 = 9_000_000_001;
/// `--max-request-bytes` of the fragment test. etcd fragments a watch
/// response larger than that plus its 512 KiB gRPC overhead allowance
/// (589,824 bytes here): with 20,000-byte values, 29 DELETE events with
/// `prev_kv` fit in one fragment (about 8 KB below the limit) and 30 do not,
/// so 40 keys deleted in one revision arrive as fragments of 29 and 11.
const FRAGMENT_MAX_REQUEST_BYTES: u64 = 64 * 1024;
const FRAGMENT_VALUE_BYTES: usize = 20_000;
const FRAGMENT_KEYS: usize = 40;

fn same(d: &Differential, what: &str, oracle: &[String], candidate: &[String]) {
    assert_same(what, oracle, candidate, d.candidate.cluster.binary());
}

/// The keys under `prefix`, linearizably.
async fn keys_under(client: &Client, prefix: &str) -> Result<Vec<String>> {
    let response = client
        .clone()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await?;
    Ok(response
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect())
}

// ---------------------------------------------------------------------------
// etcdctl watch.
// ---------------------------------------------------------------------------

/// One write of the seed history.
struct Op {
    key: &'static str,
    /// `None` deletes the key.
    value: Option<&'static str>,
}

/// A write with the revision the server gave it (the same on both servers).
struct Written {
    key: &'static str,
    revision: i64,
}

const SEED: &[Op] = &[
    Op {
        key: "w/a",
        value: Some("a1"),
    },
    Op {
        key: "w/b",
        value: Some("b1"),
    },
    Op {
        key: "w/a",
        value: Some("a2"),
    },
    Op {
        key: "other/x",
        value: Some("x1"),
    },
    Op {
        key: "w/c",
        value: Some("c1"),
    },
    Op {
        key: "w/b",
        value: None,
    },
    Op {
        key: "w/a",
        value: Some("a3"),
    },
    Op {
        key: "w/b",
        value: Some("b2"),
    },
    Op {
        key: "w/a",
        value: None,
    },
    Op {
        key: "w/c",
        value: Some("c2"),
    },
    Op {
        key: "w/d",
        value: Some("d1"),
    },
    Op {
        key: "w/a",
        value: Some("a4"),
    },
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Simple,
    Json,
}

impl Format {
    fn events(self, stdout: &str) -> usize {
        match self {
            Format::Simple => simple_watch_events(stdout),
            Format::Json => json_watch_events(stdout),
        }
    }
}

/// A bounded `etcdctl watch` on one side: runs until `expected` events were
/// printed (plus [`SETTLE_TIME`]) or [`EVENTS_TIMEOUT`], then is killed.
/// Returns whether the expected events arrived, and the output.
async fn finish_watch(
    mut process: CtlProcess,
    expected: usize,
    format: Format,
) -> Result<(bool, CtlOutput)> {
    let reached = process
        .wait_stdout(&format!("{expected} events"), EVENTS_TIMEOUT, |stdout| {
            format.events(stdout) >= expected
        })
        .await
        .is_ok();
    sleep(SETTLE_TIME).await;
    Ok((reached, process.kill().await?))
}

fn spawn_watch(side: &Side, args: &[String]) -> Result<CtlProcess> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    CtlProcess::spawn(side.ctl35.binary(), &side.cluster.endpoints(), &args)
}

/// The comparable lines of an `etcdctl watch` output. JSON responses with
/// events are flattened to one line per event (and checked to carry a
/// header revision not below their events); other lines are kept as they are.
fn watch_transcript(output: &CtlOutput, format: Format) -> Vec<String> {
    let output = output.normalized();
    if format == Format::Simple {
        return ctl_lines("watch", &output);
    }
    let mut lines = vec![format!("watch: exit code {:?}", output.code)];
    for line in output.stdout.lines() {
        let Ok(response) = serde_json::from_str::<serde_json::Value>(line) else {
            lines.push(format!("stdout: {line}"));
            continue;
        };
        let events = response["Events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            lines.push(format!("response: {line}"));
            continue;
        }
        let header_revision = response["Header"]["revision"].as_i64().unwrap_or(0);
        for event in &events {
            let revision = event["kv"]["mod_revision"].as_i64().unwrap_or(0);
            if header_revision < revision {
                lines.push(format!(
                    "VIOLATION: header revision {header_revision} below event revision {revision}"
                ));
            }
            lines.push(format!("event: {event}"));
        }
    }
    lines.extend(output.stderr.lines().map(|line| format!("stderr: {line}")));
    lines
}

/// Runs one bounded `etcdctl watch` on both sides and compares the output.
/// Returns the oracle's transcript.
async fn compare_watch(
    d: &Differential,
    args: &[String],
    expected: usize,
    format: Format,
) -> Vec<String> {
    let ((oracle_reached, oracle), (_, candidate)) = d
        .each(|side| async move { finish_watch(spawn_watch(side, args)?, expected, format).await })
        .await;
    assert!(
        oracle_reached,
        "the oracle did not print {expected} events for etcdctl {args:?}:\n{oracle}"
    );
    let (oracle, candidate) = (
        watch_transcript(&oracle, format),
        watch_transcript(&candidate, format),
    );
    same(d, &format!("etcdctl {args:?}"), &oracle, &candidate);
    oracle
}

/// Runs an `etcdctl watch` that must end by itself (a compacted start) on
/// both sides and compares the complete output.
async fn compare_watch_exit(d: &Differential, args: &[String]) -> CtlOutput {
    let (oracle, candidate) = d
        .each(|side| async move { spawn_watch(side, args)?.wait_exit(CTL_EXIT_TIMEOUT).await })
        .await;
    same(
        d,
        &format!("etcdctl {args:?}"),
        &ctl_lines("watch", &oracle.normalized()),
        &ctl_lines("watch", &candidate.normalized()),
    );
    oracle
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| word.to_string()).collect()
}

/// Writes of `history` at or after `from` whose key satisfies `matches`.
fn count_events(history: &[Written], from: i64, matches: impl Fn(&str) -> bool) -> usize {
    history
        .iter()
        .filter(|write| write.revision >= from && matches(write.key))
        .count()
}

#[tokio::test]
async fn etcdctl_watch_history_prefix_prev_kv_and_compaction() {
    let mut d = differential().await;
    let mut history = Vec::new();
    for op in SEED {
        let out = match op.value {
            Some(value) => d.ctl(&["put", op.key, value, "-w", "json"]).await,
            None => d.ctl(&["del", op.key, "-w", "json"]).await,
        };
        assert_ok(&out);
        history.push(Written {
            key: op.key,
            revision: out.header_revision().expect("revision of a write"),
        });
    }
    let first = history[0].revision;
    let middle = history[SEED.len() / 2].revision;
    let is_a = |key: &str| key == "w/a";
    let in_w = |key: &str| key.starts_with("w/");

    // Historical replay of one key, with and without the previous values.
    let rev = format!("--rev={first}");
    for extra in [&[][..], &["--prev-kv"][..]] {
        let mut words = vec!["watch", rev.as_str(), "w/a"];
        words.extend_from_slice(extra);
        let expected = count_events(&history, first, is_a);
        compare_watch(&d, &args(&words), expected, Format::Simple).await;
        words.extend_from_slice(&["-w", "json"]);
        compare_watch(&d, &args(&words), expected, Format::Json).await;
    }
    // A key range [w/a, w/c) from the first revision.
    let expected = count_events(&history, first, |key| ("w/a".."w/c").contains(&key));
    compare_watch(
        &d,
        &args(&["watch", &rev, "w/a", "w/c", "--prev-kv"]),
        expected,
        Format::Simple,
    )
    .await;
    // Prefix from the middle of the history, simple and JSON, with prev_kv.
    let mid = format!("--rev={middle}");
    let expected = count_events(&history, middle, in_w);
    let oracle = compare_watch(
        &d,
        &args(&["watch", &mid, "--prefix", "w/", "--prev-kv"]),
        expected,
        Format::Simple,
    )
    .await;
    assert!(
        oracle.iter().any(|line| line.ends_with("DELETE")),
        "the replay should include a delete: {oracle:?}"
    );
    compare_watch(
        &d,
        &args(&["watch", &mid, "--prefix", "w/", "--prev-kv", "-w", "json"]),
        expected,
        Format::Json,
    )
    .await;
    compare_watch(
        &d,
        &args(&["watch", &mid, "--prefix", "w/"]),
        expected,
        Format::Simple,
    )
    .await;

    // A start revision in the future: the watch waits for it.
    let now = history.last().expect("seed").revision;
    let future = format!("--rev={}", now + 2);
    let watch = args(&["watch", &future, "--prefix", "w/", "--prev-kv"]);
    let (oracle_watch, candidate_watch) = (
        spawn_watch(&d.oracle, &watch).expect("spawn on the oracle"),
        spawn_watch(&d.candidate, &watch).expect("spawn on the candidate"),
    );
    for (key, value) in [("w/f1", "f1"), ("w/a", "a5"), ("w/f1", "f2")] {
        let out = d.ctl(&["put", key, value, "-w", "json"]).await;
        assert_ok(&out);
        history.push(Written {
            key,
            revision: out.header_revision().expect("revision of a write"),
        });
    }
    let (oracle, candidate) = tokio::join!(
        finish_watch(oracle_watch, 2, Format::Simple),
        finish_watch(candidate_watch, 2, Format::Simple)
    );
    let ((reached, oracle), (_, candidate)) =
        (oracle.expect("oracle"), candidate.expect("candidate"));
    assert!(
        reached,
        "the oracle's future watch did not deliver:\n{oracle}"
    );
    same(
        &d,
        &format!("etcdctl {watch:?}"),
        &watch_transcript(&oracle, Format::Simple),
        &watch_transcript(&candidate, Format::Simple),
    );

    // Compaction: a start below the compaction revision is canceled (etcdctl
    // exits by itself); a start at the compaction revision replays from it.
    let compact_at = middle + 1;
    assert_ok(&d.ctl(&["compact", &compact_at.to_string()]).await);
    let below = format!("--rev={first}");
    let out = compare_watch_exit(&d, &args(&["watch", &below, "w/a"])).await;
    assert_fails(&out, "required revision has been compacted");
    compare_watch_exit(
        &d,
        &args(&["watch", &below, "--prefix", "w/", "-w", "json"]),
    )
    .await;
    let just_below = format!("--rev={}", compact_at - 1);
    compare_watch_exit(&d, &args(&["watch", &just_below, "--prefix", "w/"])).await;
    let at = format!("--rev={compact_at}");
    let expected = count_events(&history, compact_at, in_w);
    compare_watch(
        &d,
        &args(&["watch", &at, "--prefix", "w/", "--prev-kv"]),
        expected,
        Format::Simple,
    )
    .await;
    // The same through etcdctl 3.4.
    assert_ok(&d.ctl34(&["get", "--prefix", "w/", "-w", "json"]).await);
}

// ---------------------------------------------------------------------------
// etcd-client watch streams.
// ---------------------------------------------------------------------------

/// A watch stream being recorded into a transcript.
struct Recorder {
    sender: etcd_client::WatchRequestSender,
    stream: WatchResponseStream,
    names: LeaseNames,
    lines: Vec<String>,
    /// Steps whose expected items did not all arrive in time.
    short_steps: Vec<String>,
}

impl Recorder {
    /// Opens a stream on `client` with a first watch.
    async fn open(client: &Client, key: &str, options: WatchOptions) -> Result<Recorder> {
        let (sender, stream) = client
            .watch_client()
            .watch(key, Some(options))
            .await
            .context("opening a watch stream")?
            .split();
        Ok(Recorder {
            sender,
            stream,
            names: LeaseNames::new(),
            lines: Vec::new(),
            short_steps: Vec::new(),
        })
    }

    /// Reads `expected` items (events or responses without events), orders
    /// them by watch id (the order between different watchers is not
    /// defined; within one watcher it is kept), and records them under `step`.
    async fn step(&mut self, step: &str, expected: usize) -> Result<Vec<WatchItem>> {
        self.lines.push(format!("== {step}"));
        let mut items = Vec::new();
        let start = Instant::now();
        while items.len() < expected {
            let left = EVENTS_TIMEOUT.saturating_sub(start.elapsed());
            match next_response(&mut self.stream, left).await {
                Ok(response) => items.extend(WatchItem::split(response)),
                Err(error) => {
                    self.lines.push(format!(
                        "only {} of {expected} items: {error:#}",
                        items.len()
                    ));
                    self.short_steps.push(step.to_string());
                    break;
                }
            }
        }
        self.record(&mut items.clone());
        Ok(items)
    }

    /// Reads for [`QUIET_PERIOD`] and records anything that arrives.
    async fn drain(&mut self, step: &str) {
        self.lines.push(format!("== {step} (nothing expected)"));
        let mut items = Vec::new();
        while let Ok(response) = next_response(&mut self.stream, QUIET_PERIOD).await {
            items.extend(WatchItem::split(response));
        }
        self.record(&mut items);
    }

    fn record(&mut self, items: &mut [WatchItem]) {
        items.sort_by_key(WatchItem::watch_id);
        for item in items.iter() {
            if let WatchItem::Event {
                header_revision,
                event,
                ..
            } = item
            {
                if *header_revision < event_revision(event) {
                    self.lines.push(format!(
                        "VIOLATION: header revision {header_revision} below event revision {}",
                        event_revision(event)
                    ));
                }
            }
            let line = self.names.item(item);
            self.lines.push(line);
        }
    }

    async fn watch(&mut self, key: &str, options: WatchOptions) -> Result<()> {
        Ok(self.sender.watch(key, Some(options)).await?)
    }
}

/// What a client watch scenario produced on one side.
struct ClientWatchRun {
    lines: Vec<String>,
    short_steps: Vec<String>,
    /// (progress response watch id, its header revision, the current revision).
    progress: Vec<(i64, i64, i64)>,
    compact_revision: i64,
}

async fn put(client: &Client, key: &str, value: &str) -> Result<i64> {
    let response = client.clone().put(key, value, None).await?;
    Ok(response.header().context("put without header")?.revision())
}

async fn delete(client: &Client, key: &str) -> Result<i64> {
    let response = client.clone().delete(key, None).await?;
    Ok(response
        .header()
        .context("delete without header")?
        .revision())
}

async fn client_watch_scenario(side: &Side) -> Result<ClientWatchRun> {
    let client = watch_connect(&side.cluster.endpoints()).await?;
    let kv = &side.client;
    let first = put(kv, "c/a", "1").await?;
    put(kv, "c/b", "1").await?;
    put(kv, "c/a", "2").await?;
    delete(kv, "c/b").await?;

    // A server-chosen id with history from the first write and prev_kv.
    let mut r = Recorder::open(
        &client,
        "c/a",
        WatchOptions::new()
            .with_start_revision(first)
            .with_prev_key(),
    )
    .await?;
    r.step("history of c/a from the first write, server-chosen id", 3)
        .await?;
    r.watch(
        "c/",
        WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_watch_id(100),
    )
    .await?;
    r.step("prefix c/ with client-chosen id 100", 1).await?;
    r.watch("c/", WatchOptions::new().with_prefix().with_watch_id(100))
        .await?;
    r.step("duplicate id 100", 1).await?;
    r.watch(
        "c/z",
        WatchOptions::new().with_filters([WatchFilterType::NoPut]),
    )
    .await?;
    r.step("c/z with NOPUT", 1).await?;
    r.watch(
        "c/",
        WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoDelete]),
    )
    .await?;
    r.step("prefix c/ with NODELETE", 1).await?;
    let now = current_revision(kv).await?;
    r.watch(
        "c/",
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(now + 3)
            .with_watch_id(200),
    )
    .await?;
    r.step("prefix c/ from a future revision, id 200", 1)
        .await?;

    put(kv, "c/a", "3").await?;
    put(kv, "c/z", "z1").await?;
    delete(kv, "c/z").await?;
    put(kv, "c/b", "b2").await?;
    // c/a: 1, id 100: 4, NOPUT c/z: 1, NODELETE: 3, future: 2.
    r.step("four writes seen by five watchers", 11).await?;

    r.sender.cancel(100).await?;
    r.step("cancel id 100", 1).await?;
    put(kv, "c/a", "4").await?;
    r.step("a write after the cancel", 3).await?;

    // Progress once every watcher is synced: watch id -1, current revision.
    let mut progress = Vec::new();
    r.sender.request_progress().await?;
    for item in r.step("progress request", 1).await? {
        if let WatchItem::Control(response) = item {
            let revision = response.header().map_or(-1, |header| header.revision());
            progress.push((response.watch_id(), revision, current_revision(kv).await?));
        }
    }
    // Canceling an unknown id sends nothing: the next response is the progress.
    r.sender.cancel(12345).await?;
    r.sender.request_progress().await?;
    r.step("cancel of an unknown id, then a progress request", 1)
        .await?;
    r.drain("end of the first stream").await;

    // Compaction: a start below it is canceled, a start at it replays.
    let compact_revision = current_revision(kv).await? - 2;
    kv.clone().compact(compact_revision, None).await?;
    let mut c = Recorder::open(
        &client,
        "c/a",
        WatchOptions::new().with_start_revision(first + 1),
    )
    .await?;
    c.step("start below the compaction revision", 2).await?;
    c.watch(
        "c/",
        WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(compact_revision),
    )
    .await?;
    // Created, then the writes after the compaction revision: the delete at
    // the compaction revision itself is compacted away (etcd drops
    // tombstones at the compaction revision).
    c.step("start at the compaction revision", 3).await?;
    c.drain("end of the second stream").await;

    let mut lines = r.lines;
    lines.extend(c.lines);
    let mut short_steps = r.short_steps;
    short_steps.extend(c.short_steps);
    Ok(ClientWatchRun {
        lines,
        short_steps,
        progress,
        compact_revision,
    })
}

#[tokio::test]
async fn client_watch_ids_history_filters_cancel_progress_compaction() {
    let d = differential().await;
    let (oracle, candidate) = d.each(client_watch_scenario).await;
    assert!(
        oracle.short_steps.is_empty(),
        "the scenario expects more than the oracle delivers in {:?}:\n{}",
        oracle.short_steps,
        oracle.lines.join("\n")
    );
    for (watch_id, revision, current) in &oracle.progress {
        assert_eq!(
            *watch_id, -1,
            "oracle progress response: {:?}",
            oracle.progress
        );
        assert_eq!(
            revision, current,
            "oracle progress revision: {:?}",
            oracle.progress
        );
    }
    assert_eq!(oracle.progress.len(), 1);
    assert!(
        oracle
            .lines
            .iter()
            .any(|line| line.contains(&format!("compact_revision={}", oracle.compact_revision))),
        "the oracle's compacted watch: {}",
        oracle.lines.join("\n")
    );
    same(
        &d,
        "etcd-client watch scenario",
        &oracle.lines,
        &candidate.lines,
    );
}

/// Rendering of the fragment test: responses exactly, not flattened.
async fn fragment_scenario(side: &Side) -> Result<Vec<String>> {
    let kv = &side.client;
    let value = "v".repeat(FRAGMENT_VALUE_BYTES);
    for i in 0..FRAGMENT_KEYS {
        put(kv, &format!("f/k{i:02}"), &value).await?;
    }
    let client = watch_connect(&side.cluster.endpoints()).await?;
    let (mut sender, mut stream) = client
        .watch_client()
        .watch(
            "f/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_fragment()
                    .with_watch_id(1),
            ),
        )
        .await?
        .split();
    sender
        .watch(
            "f/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_watch_id(2),
            ),
        )
        .await?;
    let mut names = LeaseNames::new();
    let mut responses = Vec::new();
    for _ in 0..2 {
        responses.push(next_response(&mut stream, EVENTS_TIMEOUT).await?);
    }
    kv.clone()
        .delete("f/", Some(etcd_client::DeleteOptions::new().with_prefix()))
        .await?;
    // Watch 1 gets the revision in fragments, watch 2 in one response: read
    // until each has FRAGMENT_KEYS events, then a quiet period for extras.
    let count = |responses: &[etcd_client::WatchResponse], id: i64| {
        responses
            .iter()
            .filter(|response| response.watch_id() == id)
            .map(|response| response.events().len())
            .sum::<usize>()
    };
    let start = Instant::now();
    while count(&responses, 1) < FRAGMENT_KEYS || count(&responses, 2) < FRAGMENT_KEYS {
        let left = EVENTS_TIMEOUT.saturating_sub(start.elapsed());
        match next_response(&mut stream, left).await {
            Ok(response) => responses.push(response),
            Err(error) => {
                responses.sort_by_key(|response| response.watch_id());
                bail!(
                    "not all events arrived: {error:#}; got {} responses",
                    responses.len()
                );
            }
        }
    }
    while let Ok(response) = next_response(&mut stream, QUIET_PERIOD).await {
        responses.push(response);
    }
    responses.sort_by_key(|response| response.watch_id());
    let mut lines = Vec::new();
    for response in &responses {
        lines.push(format!(
            "response watch_id={} events={} {}",
            response.watch_id(),
            response.events().len(),
            names.control(response)
        ));
        for event in response.events() {
            lines.push(format!("  {}", names.event(event)));
        }
    }
    Ok(lines)
}

#[tokio::test]
async fn watch_fragments_large_revisions() {
    let mut config = ClusterConfig::new(1);
    config.max_request_bytes = Some(FRAGMENT_MAX_REQUEST_BYTES);
    let d = Differential::start_with(
        Binary::etcd35().expect("reference etcd"),
        Binary::candidate().expect("candidate server binary"),
        config,
    )
    .await
    .expect("starting the reference etcd and the candidate");
    let (oracle, candidate) = d.each(fragment_scenario).await;
    let fragments = oracle
        .iter()
        .filter(|line| line.contains("watch_id=1 ") && line.contains("fragment=true"))
        .count();
    assert!(
        fragments >= 1,
        "the oracle should fragment the revision:\n{}",
        oracle.join("\n")
    );
    same(&d, "fragmented watch responses", &oracle, &candidate);
}

// ---------------------------------------------------------------------------
// Leases.
// ---------------------------------------------------------------------------

static REMAINING: std::sync::LazyLock<Regex> =
    std::sync::LazyLock::new(|| Regex::new(r"remaining\((-?\d+)s\)").expect("valid pattern"));
static GRANTED: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
    Regex::new(r"lease (\S+) granted with TTL\((\d+)s\)").expect("valid pattern")
});
static ATTACHED: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
    Regex::new(r"attached keys\(\[([^\]]*)\]\)").expect("valid pattern")
});

/// Remaining TTLs, taken out of a transcript so it compares exactly.
type Remaining = Vec<i64>;

/// An etcdctl output made comparable: lease ids renamed, `remaining(Ns)`
/// replaced (the values are returned for a tolerance check), attached keys
/// sorted (etcd lists them in map order).
fn lease_lines(
    label: &str,
    output: &CtlOutput,
    names: &mut LeaseNames,
) -> (Vec<String>, Remaining) {
    let output = output.normalized();
    let mut remaining = Vec::new();
    let mut fix = |text: &str| {
        let text = names.rename_hex(text);
        for captures in REMAINING.captures_iter(&text) {
            remaining.push(captures[1].parse().unwrap_or(i64::MIN));
        }
        let text = REMAINING.replace_all(&text, "remaining(<R>s)").into_owned();
        ATTACHED
            .replace_all(&text, |captures: &regex::Captures| {
                let mut keys: Vec<&str> = captures[1].split(' ').collect();
                keys.sort_unstable();
                format!("attached keys([{}])", keys.join(" "))
            })
            .into_owned()
    };
    let output = CtlOutput {
        stdout: fix(&output.stdout),
        stderr: fix(&output.stderr),
        code: output.code,
    };
    (ctl_lines(label, &output), remaining)
}

/// Checks that two servers' remaining TTLs agree within the tolerance and
/// stay within (0, granted].
fn check_remaining(what: &str, oracle: &Remaining, candidate: &Remaining, granted: i64) {
    assert_eq!(
        oracle.len(),
        candidate.len(),
        "{what}: remaining TTLs oracle {oracle:?} candidate {candidate:?}"
    );
    for (o, c) in oracle.iter().zip(candidate) {
        assert!(
            (o - c).abs() <= TTL_TOLERANCE_SECONDS,
            "{what}: remaining TTL oracle {o}s, candidate {c}s (tolerance {TTL_TOLERANCE_SECONDS}s)"
        );
        assert!(
            (0..=granted).contains(c) && (0..=granted).contains(o),
            "{what}: remaining TTL outside 0..={granted}: oracle {o}s candidate {c}s"
        );
    }
}

/// Runs etcdctl 3.5 with `args` on one side only.
async fn ctl_on(side: &Side, args: &[&str]) -> Result<CtlOutput> {
    side.ctl35.run(args).await
}

/// What etcdctl's two grants (server-assigned ids) returned on one side.
struct Grants {
    short: CtlOutput,
    long_json: CtlOutput,
    short_id: String,
    long_id: i64,
}

async fn etcdctl_grants(side: &Side) -> Result<Grants> {
    let short = ctl_on(
        side,
        &["lease", "grant", &BELOW_MINIMUM_TTL_SECONDS.to_string()],
    )
    .await?;
    let long_json = ctl_on(
        side,
        &[
            "lease",
            "grant",
            &LONG_TTL_SECONDS.to_string(),
            "-w",
            "json",
        ],
    )
    .await?;
    let short_id = GRANTED
        .captures(&short.stdout)
        .map(|captures| captures[1].to_string())
        .with_context(|| format!("no lease id in:\n{short}"))?;
    let long_id = long_json.json()?["ID"]
        .as_i64()
        .with_context(|| format!("no lease ID in:\n{long_json}"))?;
    Ok(Grants {
        short,
        long_json,
        short_id,
        long_id,
    })
}

/// Waits (bounded) until the short etcdctl-granted lease and the TTL-0 lease
/// have expired on one side, then revokes the expired short lease.
async fn revoke_after_expiry(side: &Side, short_id: &str) -> Result<CtlOutput> {
    retry_until(
        "the short leases to expire",
        EXPIRY_TIMEOUT,
        || async move {
            let out = ctl_on(side, &["lease", "timetolive", short_id]).await?;
            ensure!(out.stdout.contains("already expired"), "not yet: {out}");
            let zero = side
                .client
                .clone()
                .lease_time_to_live(LEASE_ZERO_TTL, None)
                .await?;
            ensure!(zero.ttl() == -1, "TTL-0 lease not expired yet: {zero:?}");
            Ok(())
        },
    )
    .await?;
    ctl_on(side, &["lease", "revoke", short_id]).await
}

/// `lease list` and etcd-client's `leases()` on one side.
async fn lease_list(side: &Side) -> Result<(CtlOutput, Vec<i64>)> {
    let out = ctl_on(side, &["lease", "list"]).await?;
    let leases = side.client.clone().leases().await?;
    Ok((
        out,
        leases.leases().iter().map(|lease| lease.id()).collect(),
    ))
}

/// A lease list made comparable: ids renamed and sorted (etcd lists them in
/// map order).
fn list_lines(out: &CtlOutput, ids: &[i64], names: &mut LeaseNames) -> Vec<String> {
    let mut lines = vec![format!("lease list: exit code {:?}", out.code)];
    let mut listed: Vec<String> = out
        .stdout
        .lines()
        .map(|line| match i64::from_str_radix(line, 16) {
            Ok(id) => names.name(id),
            Err(_) => line.to_string(),
        })
        .collect();
    listed.sort();
    lines.extend(listed);
    let mut from_client: Vec<String> = ids.iter().map(|id| names.name(*id)).collect();
    from_client.sort();
    lines.push(format!("etcd-client leases: {from_client:?}"));
    lines
}

/// Revokes LEASE_A on one side while a prefix watch with prev_kv records the
/// DELETE events. Returns the transcript and the DELETE events' revisions.
async fn revoke_with_watcher(side: &Side) -> Result<(Vec<String>, Vec<i64>)> {
    let from = current_revision(&side.client).await? + 1;
    let client = watch_connect(&side.cluster.endpoints()).await?;
    let mut r = Recorder::open(
        &client,
        "l/",
        WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(from),
    )
    .await?;
    r.step("watch created", 1).await?;
    let revoke = ctl_on(side, &["lease", "revoke", LEASE_A_HEX]).await?;
    let items = r.step("revoke deletes the attached keys", 2).await?;
    r.drain("after the revoke").await;
    let revisions: Vec<i64> = items
        .iter()
        .filter_map(|item| match item {
            WatchItem::Event { event, .. } if event.event_type() == EventType::Delete => {
                Some(event_revision(event))
            }
            _ => None,
        })
        .collect();
    let mut lines = ctl_lines("revoke", &revoke.normalized());
    lines.extend(r.lines);
    lines.push(format!(
        "keys left: {:?}",
        keys_under(&side.client, "l/").await?
    ));
    Ok((lines, revisions))
}

#[tokio::test]
async fn leases_grant_attach_timetolive_keepalive_list_revoke() {
    let mut d = differential().await;

    // A TTL below the minimum is raised to it (server-assigned ids).
    let (oracle_grants, candidate_grants) = d.each(etcdctl_grants).await;
    let granted_ttl: i64 = GRANTED
        .captures(&oracle_grants.short.stdout)
        .expect("oracle grant")[2]
        .parse()
        .expect("TTL");
    assert!(
        granted_ttl > BELOW_MINIMUM_TTL_SECONDS,
        "the oracle should raise a TTL of {BELOW_MINIMUM_TTL_SECONDS}s to its minimum:\n{}",
        oracle_grants.short
    );
    let (mut oracle_names, mut candidate_names) = (LeaseNames::new(), LeaseNames::new());
    let mut lines = [Vec::new(), Vec::new()];
    for ((grants, names), lines) in [
        (&oracle_grants, &mut oracle_names),
        (&candidate_grants, &mut candidate_names),
    ]
    .into_iter()
    .zip(lines.iter_mut())
    {
        lines.extend(lease_lines("grant", &grants.short, names).0);
        lines.extend(lease_lines("grant json", &grants.long_json, names).0);
        // Names for every lease the lists below show, in a fixed order.
        for id in [grants.long_id, LEASE_A, LEASE_ZERO_TTL] {
            names.name(id);
        }
    }
    same(&d, "etcdctl lease grant", &lines[0], &lines[1]);

    // Fixed ids through etcd-client, and their errors.
    d.rpc("lease grant with a fixed id", |mut client| async move {
        let options = LeaseGrantOptions::new().with_id(LEASE_A);
        client.lease_grant(LONG_TTL_SECONDS, Some(options)).await
    })
    .await
    .expect("fixed-id grant");
    let duplicate = d
        .rpc("lease grant of an existing id", |mut client| async move {
            let options = LeaseGrantOptions::new().with_id(LEASE_A);
            client.lease_grant(LONG_TTL_SECONDS, Some(options)).await
        })
        .await;
    assert!(duplicate.is_err(), "duplicate lease id: {duplicate:?}");
    let too_large = d
        .rpc(
            "lease grant with too large a TTL",
            |mut client| async move { client.lease_grant(TOO_LARGE_TTL_SECONDS, None).await },
        )
        .await;
    assert!(too_large.is_err(), "too large TTL: {too_large:?}");
    let zero = d
        .rpc("lease grant with TTL 0", |mut client| async move {
            let options = LeaseGrantOptions::new().with_id(LEASE_ZERO_TTL);
            client.lease_grant(0, Some(options)).await
        })
        .await
        .expect("TTL 0 grant");
    assert!(zero.ttl() > 0, "the oracle should raise TTL 0: {zero:?}");

    // Keys attached to a lease.
    let lease = format!("--lease={LEASE_A_HEX}");
    assert_ok(&d.ctl(&["put", "l/k2", "v2", &lease, "-w", "json"]).await);
    assert_ok(&d.ctl(&["put", "l/k1", "v1", &lease, "-w", "json"]).await);
    assert_ok(&d.ctl(&["put", "l/k3", "v3", "-w", "json"]).await);
    assert_ok(&d.ctl(&["get", "l/k1", "-w", "json"]).await);

    // timetolive: granted TTL and keys exact, remaining within tolerance.
    let (oracle, candidate) = d
        .each(|side| async move {
            let mut outputs = Vec::new();
            for args in [
                &["lease", "timetolive", LEASE_A_HEX, "--keys"][..],
                &["lease", "timetolive", LEASE_A_HEX][..],
                &["lease", "timetolive", MISSING_LEASE_HEX][..],
            ] {
                outputs.push(ctl_on(side, args).await?);
            }
            let ttl = side
                .client
                .clone()
                .lease_time_to_live(LEASE_A, Some(LeaseTimeToLiveOptions::new().with_keys()))
                .await?;
            let mut keys: Vec<String> = ttl
                .keys()
                .iter()
                .map(|key| String::from_utf8_lossy(key).into_owned())
                .collect();
            keys.sort();
            let client_view = format!(
                "etcd-client timetolive: id={} granted_ttl={} keys={keys:?}",
                ttl.id(),
                ttl.granted_ttl()
            );
            Ok((outputs, client_view, ttl.ttl()))
        })
        .await;
    let (mut oracle_lines, mut oracle_remaining) = (Vec::new(), Vec::new());
    let (mut candidate_lines, mut candidate_remaining) = (Vec::new(), Vec::new());
    for (o, c) in oracle.0.iter().zip(&candidate.0) {
        let (lines, remaining) = lease_lines("timetolive", o, &mut oracle_names);
        oracle_lines.extend(lines);
        oracle_remaining.extend(remaining);
        let (lines, remaining) = lease_lines("timetolive", c, &mut candidate_names);
        candidate_lines.extend(lines);
        candidate_remaining.extend(remaining);
    }
    oracle_lines.push(oracle.1);
    candidate_lines.push(candidate.1);
    oracle_remaining.push(oracle.2);
    candidate_remaining.push(candidate.2);
    assert!(
        oracle_lines
            .iter()
            .any(|line| line.contains("attached keys([l/k1 l/k2])")),
        "oracle timetolive --keys: {oracle_lines:?}"
    );
    same(&d, "lease timetolive", &oracle_lines, &candidate_lines);
    check_remaining(
        "lease timetolive",
        &oracle_remaining,
        &candidate_remaining,
        LONG_TTL_SECONDS,
    );
    d.ctl(&["lease", "timetolive", MISSING_LEASE_HEX, "-w", "json"])
        .await;
    d.rpc("timetolive of an unknown lease", |mut client| async move {
        client.lease_time_to_live(MISSING_LEASE, None).await
    })
    .await
    .expect("timetolive of an unknown lease is not an error");

    // keep-alive --once.
    assert_ok(&d.ctl(&["lease", "keep-alive", "--once", LEASE_A_HEX]).await);
    d.ctl(&["lease", "keep-alive", "--once", LEASE_A_HEX, "-w", "json"])
        .await;
    let out = d
        .ctl(&["lease", "keep-alive", "--once", MISSING_LEASE_HEX])
        .await;
    assert!(!out.success(), "keep-alive of an unknown lease: {out}");
    // etcd answers TTL 0, which etcd-client reports as an error.
    let unknown = d
        .rpc("keep-alive of an unknown lease", |mut client| async move {
            let (mut keeper, mut stream) = client.lease_keep_alive(MISSING_LEASE).await?;
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await;
    assert!(
        unknown.is_err(),
        "keep-alive of an unknown lease: {unknown:?}"
    );

    // The minimum-TTL leases expire; revoking an expired lease fails alike.
    let (oracle, candidate) = tokio::join!(
        revoke_after_expiry(&d.oracle, &oracle_grants.short_id),
        revoke_after_expiry(&d.candidate, &candidate_grants.short_id),
    );
    let oracle = oracle.expect("short leases on the oracle");
    let candidate = candidate.expect("short leases on the candidate");
    assert_fails(&oracle, "requested lease not found");
    same(
        &d,
        "revoke of an expired server-assigned lease",
        &lease_lines("revoke", &oracle, &mut oracle_names).0,
        &lease_lines("revoke", &candidate, &mut candidate_names).0,
    );
    d.rpc(
        "revoke of the expired TTL-0 lease",
        |mut client| async move { client.lease_revoke(LEASE_ZERO_TTL).await },
    )
    .await
    .expect_err("the TTL-0 lease has expired");

    // lease list: the long server-assigned lease and LEASE_A.
    let (oracle, candidate) = d.each(lease_list).await;
    let oracle_list = list_lines(&oracle.0, &oracle.1, &mut oracle_names);
    let candidate_list = list_lines(&candidate.0, &candidate.1, &mut candidate_names);
    assert!(
        oracle_list
            .iter()
            .any(|line| line.starts_with("found 2 leases")),
        "oracle lease list: {oracle_list:?}"
    );
    same(&d, "lease list", &oracle_list, &candidate_list);

    // Revoke: a watcher sees the attached keys' DELETE events in one revision.
    let (oracle, candidate) = d.each(revoke_with_watcher).await;
    assert!(
        oracle.1.len() == 2 && oracle.1[0] == oracle.1[1],
        "the oracle's revoke should delete two keys in one revision: {:?}",
        oracle.0
    );
    same(&d, "lease revoke", &oracle.0, &candidate.0);
    assert_ok(&d.ctl(&["get", "--prefix", "l/", "-w", "json"]).await);

    // Unknown leases.
    assert_fails(
        &d.ctl(&["lease", "revoke", LEASE_A_HEX]).await,
        "requested lease not found",
    );
    let revoked = d
        .rpc("revoke of an unknown lease", |mut client| async move {
            client.lease_revoke(MISSING_LEASE).await
        })
        .await;
    match &revoked {
        Err(error @ Error::GRpcStatus(status)) => {
            assert_eq!(grpc_code(error), Some(tonic::Code::NotFound), "{error}");
            assert!(
                status.message().contains("requested lease not found"),
                "{error}"
            );
        }
        other => panic!("revoke of an unknown lease on the oracle: {other:?}"),
    }
    assert_fails(
        &d.ctl(&["put", "l/k4", "v", &lease]).await,
        "requested lease not found",
    );
    let put_unknown = d
        .rpc("put with an unknown lease", |mut client| async move {
            let options = PutOptions::new().with_lease(MISSING_LEASE);
            client.put("l/k5", "v", Some(options)).await
        })
        .await;
    assert_eq!(
        put_unknown.as_ref().err().and_then(grpc_code),
        Some(tonic::Code::NotFound),
        "{put_unknown:?}"
    );
    d.ctl(&["lease", "timetolive", LEASE_A_HEX]).await;
    let (oracle, candidate) = d.each(lease_list).await;
    same(
        &d,
        "lease list at the end",
        &list_lines(&oracle.0, &oracle.1, &mut oracle_names),
        &list_lines(&candidate.0, &candidate.1, &mut candidate_names),
    );
}

/// Grants two leases with a short TTL, attaches keys, keeps one alive and
/// lets the other expire; records the events a watcher sees.
async fn expiry_scenario(side: &Side) -> Result<Vec<String>> {
    let kv = &side.client;
    let from = current_revision(kv).await? + 1;
    let client = watch_connect(&side.cluster.endpoints()).await?;
    let mut r = Recorder::open(
        &client,
        "e/",
        WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(from),
    )
    .await?;
    r.step("watch created", 1).await?;

    let started = Instant::now();
    let mut lease_client = kv.clone();
    for id in [LEASE_EXPIRING, LEASE_KEPT] {
        let options = LeaseGrantOptions::new().with_id(id);
        lease_client
            .lease_grant(EXPIRING_TTL_SECONDS, Some(options))
            .await?;
    }
    // One request for all keys, so they are attached well before the TTL.
    let put = |key: &str, id: i64| {
        TxnOp::put(
            key,
            format!("value-of-{key}"),
            Some(PutOptions::new().with_lease(id)),
        )
    };
    kv.clone()
        .txn(Txn::new().and_then([
            put("e/k1", LEASE_EXPIRING),
            put("e/k2", LEASE_EXPIRING),
            put("e/kept", LEASE_KEPT),
        ]))
        .await?;
    r.step("three puts in one txn", 3).await?;

    // Keep LEASE_KEPT alive while LEASE_EXPIRING expires.
    let (mut keeper, mut responses) = kv.clone().lease_keep_alive(LEASE_KEPT).await?;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let keepalive = tokio::spawn(async move {
        let mut ttls = Vec::new();
        loop {
            if keeper.keep_alive().await.is_err() {
                break;
            }
            match responses.message().await {
                Ok(Some(response)) => ttls.push(response.ttl()),
                _ => break,
            }
            tokio::select! {
                _ = sleep(KEEPALIVE_INTERVAL) => {}
                _ = &mut stopped => break,
            }
        }
        ttls
    });
    let expired = r.step("the unrenewed lease expires", 2).await?;
    let elapsed = started.elapsed();
    let mut lines = r.lines.clone();
    r.lines.clear();
    ensure!(
        elapsed >= Duration::from_secs(EXPIRING_TTL_SECONDS as u64),
        "keys deleted {elapsed:?} after the grant, before the TTL of {EXPIRING_TTL_SECONDS}s"
    );
    ensure!(expired.len() == 2, "expiry events: {expired:?}");
    // Let the kept lease outlive two TTLs.
    let span_end = started + KEEPALIVE_SPAN + Duration::from_secs(EXPIRING_TTL_SECONDS as u64);
    tokio::time::sleep_until(span_end).await;
    lines.push(format!(
        "keys while one lease is kept alive: {:?}",
        keys_under(kv, "e/").await?
    ));
    let ttl = kv.clone().lease_time_to_live(LEASE_EXPIRING, None).await?;
    lines.push(format!(
        "expired lease: ttl={} granted_ttl={}",
        ttl.ttl(),
        ttl.granted_ttl()
    ));
    let _ = stop.send(());
    let ttls = tokio::time::timeout(EVENTS_TIMEOUT, keepalive)
        .await
        .context("stopping the keep-alive task")??;
    lines.push(format!(
        "keep-alive responses all with the granted TTL: {}",
        !ttls.is_empty() && ttls.iter().all(|ttl| *ttl == EXPIRING_TTL_SECONDS)
    ));
    // Without keep-alives the second lease expires too.
    r.step("the kept lease expires after its keep-alives stop", 1)
        .await?;
    r.drain("after both expiries").await;
    lines.extend(r.lines);
    lines.push(format!(
        "keys at the end: {:?}",
        keys_under(kv, "e/").await?
    ));
    let leases = kv.clone().leases().await?;
    lines.push(format!(
        "leases at the end: {:?}",
        leases
            .leases()
            .iter()
            .map(|lease| lease.id())
            .collect::<Vec<_>>()
    ));
    lines.push(format!(
        "revision at the end: {}",
        current_revision(kv).await?
    ));
    Ok(lines)
}

#[tokio::test]
async fn lease_expiry_deletes_keys_while_keepalive_preserves() {
    let d = differential().await;
    let (oracle, candidate) = d.each(expiry_scenario).await;
    assert!(
        oracle
            .iter()
            .any(|line| line.contains("DELETE") && line.contains("prev_kv={")),
        "the oracle's expiry should produce DELETE events with prev_kv:\n{}",
        oracle.join("\n")
    );
    same(&d, "lease expiry", &oracle, &candidate);
}

// ---------------------------------------------------------------------------
// etcdctl lock and elect.
// ---------------------------------------------------------------------------

/// Polls until exactly `count` keys exist under `prefix`.
async fn wait_keys(client: &Client, prefix: &str, count: usize) -> Result<()> {
    retry_until(
        &format!("{count} keys under {prefix}"),
        LOCK_TIMEOUT,
        || async move {
            let keys = keys_under(client, prefix).await?;
            ensure!(keys.len() == count, "keys under {prefix}: {keys:?}");
            Ok(())
        },
    )
    .await
}

/// Every event from `from` on, read through a history watch that ends at a
/// sentinel key written last.
async fn history_from(side: &Side, from: i64, names: &mut LeaseNames) -> Result<Vec<String>> {
    const SENTINEL: &str = "~history-end";
    put(&side.client, SENTINEL, "end").await?;
    let client = watch_connect(&side.cluster.endpoints()).await?;
    let (_sender, mut stream) = client
        .watch_client()
        .watch(
            "",
            Some(
                WatchOptions::new()
                    .with_all_keys()
                    .with_start_revision(from),
            ),
        )
        .await?
        .split();
    let mut lines = Vec::new();
    let start = Instant::now();
    loop {
        let left = EVENTS_TIMEOUT.saturating_sub(start.elapsed());
        let response = next_response(&mut stream, left)
            .await
            .with_context(|| format!("history so far: {lines:#?}"))?;
        for event in response.events() {
            if event.kv().map(|kv| kv.key()) == Some(SENTINEL.as_bytes()) {
                return Ok(lines);
            }
            let line = names.event(event);
            lines.push(format!("history: {}", names.rename_hex(&line)));
        }
    }
}

/// `stderr` without etcdctl's client-side log lines about RPCs canceled by
/// its own shutdown: whether one is in flight at SIGTERM is a matter of timing.
fn without_cancel_noise(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|line| !(line.starts_with("{\"level\":") && line.contains("context canceled")))
        .map(|line| format!("{line}\n"))
        .collect()
}

async fn lock_elect_scenario(side: &Side) -> Result<Vec<String>> {
    let ctl = side.ctl35.binary();
    let endpoints = side.cluster.endpoints();
    let spawn = |args: &[&str]| CtlProcess::spawn(ctl, &endpoints, args);
    let from = current_revision(&side.client).await? + 1;
    let mut outputs: Vec<(&str, CtlOutput)> = Vec::new();
    let mut facts = Vec::new();

    // Exec mode: the command sees the lock key and revision; the lock is
    // released afterwards; the command's exit code is etcdctl's.
    let show = "echo \"held $ETCD_LOCK_KEY rev $ETCD_LOCK_REV\"";
    outputs.push((
        "lock exec",
        spawn(&["lock", "lk", "--", "/bin/sh", "-c", show])?
            .wait_exit(CTL_EXIT_TIMEOUT)
            .await?,
    ));
    outputs.push((
        "lock exec exit 3",
        spawn(&["lock", "lk", "--", "/bin/sh", "-c", "exit 3"])?
            .wait_exit(CTL_EXIT_TIMEOUT)
            .await?,
    ));

    // Two holders: the second waits until the first is terminated.
    let mut first = spawn(&["lock", "lk"])?;
    first
        .wait_stdout("the lock key", LOCK_TIMEOUT, |out| out.contains("lk/"))
        .await?;
    let show_b = "echo \"second holder $ETCD_LOCK_KEY rev $ETCD_LOCK_REV\"";
    let mut second = spawn(&["lock", "lk", "--", "/bin/sh", "-c", show_b])?;
    wait_keys(&side.client, "lk/", 2).await?;
    facts.push(format!(
        "second lock waiter while the first holds: exited={} stdout={:?}",
        second.exited(),
        second.stdout()
    ));
    outputs.push(("first holder", first.terminate().await?));
    outputs.push(("second holder", second.wait_exit(LOCK_TIMEOUT).await?));
    facts.push(format!(
        "lock keys at the end: {:?}",
        keys_under(&side.client, "lk/").await?
    ));

    // Election: observer, leader p1, blocked p2, then p2 after p1 resigns.
    let mut observer = spawn(&["elect", "-l", "myel"])?;
    let mut p1 = spawn(&["elect", "myel", "p1"])?;
    p1.wait_stdout("p1 elected", LOCK_TIMEOUT, |out| {
        out.lines().any(|l| l == "p1")
    })
    .await?;
    observer
        .wait_stdout("the observer to see p1", LOCK_TIMEOUT, |out| {
            out.lines().any(|l| l == "p1")
        })
        .await?;
    let mut p2 = spawn(&["elect", "myel", "p2"])?;
    wait_keys(&side.client, "myel/", 2).await?;
    facts.push(format!(
        "p2 while p1 leads: exited={} stdout={:?}",
        p2.exited(),
        p2.stdout()
    ));
    outputs.push(("p1", p1.terminate().await?));
    p2.wait_stdout("p2 elected", LOCK_TIMEOUT, |out| {
        out.lines().any(|l| l == "p2")
    })
    .await?;
    observer
        .wait_stdout("the observer to see p2", LOCK_TIMEOUT, |out| {
            out.lines().any(|l| l == "p2")
        })
        .await?;
    outputs.push(("p2", p2.terminate().await?));
    outputs.push(("observer", observer.terminate().await?));
    facts.push(format!(
        "election keys at the end: {:?}",
        keys_under(&side.client, "myel/").await?
    ));

    // Lease names in order of the history, then the outputs.
    let mut names = LeaseNames::new();
    let mut lines = history_from(side, from, &mut names).await?;
    for (label, output) in &outputs {
        let output = output.normalized();
        let output = CtlOutput {
            stdout: names.rename_hex(&output.stdout),
            stderr: names.rename_hex(&without_cancel_noise(&output.stderr)),
            code: output.code,
        };
        lines.extend(ctl_lines(label, &output));
    }
    lines.extend(facts);
    Ok(lines)
}

#[tokio::test]
async fn etcdctl_lock_and_elect() {
    let d = differential().await;
    let (oracle, candidate) = d.each(lock_elect_scenario).await;
    for needle in [
        "lock exec: stdout: held lk/",
        "lock exec exit 3: exit code Some(3)",
        "second holder: stdout: second holder lk/",
        "second lock waiter while the first holds: exited=false stdout=\"\"",
        "p2 while p1 leads: exited=false stdout=\"\"",
    ] {
        assert!(
            oracle.iter().any(|line| line.starts_with(needle)),
            "the oracle's transcript lacks {needle:?}:\n{}",
            oracle.join("\n")
        );
    }
    same(&d, "etcdctl lock and elect", &oracle, &candidate);
}
