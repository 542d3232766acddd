//! The kube-apiserver watch-cache pattern, as properties checked the same way
//! against real etcd 3.5 (`etcd35::*`) and the candidate (`candidate::*`).
//!
//! kube-apiserver lists a resource prefix, then watches it from the list
//! revision + 1 with `prev_kv` and `progress_notify`, requires a leader on its
//! watch streams, asks for progress (RequestProgress) to serve consistent
//! reads from its cache, and on a broken stream resumes from the last
//! revision it saw + 1, on whichever member it reaches, relisting if that
//! revision was compacted. These tests check exactly what that relies on:
//!
//! - `progress_notify_on_an_idle_prefix_watch`: with
//!   `--experimental-watch-progress-notify-interval=1s`, an idle watcher that
//!   asked for progress notifications gets them within a bounded time, with
//!   the current revision; a watcher that did not ask gets none; events carry
//!   `prev_kv` consistent with the list.
//! - `request_progress_under_write_load`: 4 writers × 125 writes while
//!   RequestProgress is sent every 20 ms: every event arrives exactly once, in
//!   revision order, with a correct `prev_kv`; no progress response is ahead
//!   of the events delivered on the stream (no later event has a revision at
//!   or below it); the cache rebuilt from the list and the events equals a
//!   fresh list.
//! - `resume_on_another_member_after_a_stream_break` (3 members): a watch on
//!   member A is dropped mid-load and resumed on member B from the last
//!   revision + 1: no gap, no duplicate; after a compaction, resuming below
//!   it gets a canceled response with the compaction revision.
//! - `require_leader_watch_ends_when_the_member_loses_its_leader` (3
//!   members): with the `hasleader` metadata, a follower's watch stream ends
//!   with `Unavailable: etcdserver: no leader` once the other members are
//!   gone, and a new one is refused; a watch without it stays open.
//!
//! Every wait is bounded by a named deadline. Run:
//! `STORE_BIN=/opt/etcd-3.5/etcd cargo test -p integration-tests --test integration watch_cache_pattern::`

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{
    Client, ConnectOptions, Event, EventType, GetOptions, GetResponse, KeyValue, WatchOptions,
    WatchRequestSender, WatchResponse, WatchResponseStream,
};
use integration_tests::client::current_revision;
use integration_tests::client::{connect, describe_error, CONNECT_TIMEOUT};
use integration_tests::server::Release;
use integration_tests::wait::retry_until;
use integration_tests::watchlease::{
    event_key, event_revision, is_progress, next_response, watch_connect, FlaggedBinary,
    PROGRESS_NOTIFY_INTERVAL_FLAG, WATCH_OPEN_TIMEOUT,
};
use integration_tests::{against_both, Cluster, ClusterConfig, Server};
use tokio::time::{sleep, timeout, Instant};

/// The progress notification interval the servers run with.
const PROGRESS_NOTIFY_INTERVAL: &str = "1s";
/// Deadline for a periodic progress notification on an idle watch: the 1 s
/// interval plus generous slack for a loaded machine.
const PROGRESS_NOTIFY_TIMEOUT: Duration = Duration::from_secs(15);
/// Periodic notifications awaited on the idle watch (shows periodicity).
const PROGRESS_NOTIFICATIONS: usize = 2;
/// Deadline for a created response or the events of a few writes.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stream that must stay silent is watched.
const SILENCE_CHECK: Duration = Duration::from_secs(2);
/// Concurrent writers and writes per writer in the load test.
const WRITERS: usize = 4;
const WRITES_PER_WRITER: usize = 125;
/// Keys each writer cycles through (puts, and deletes of existing keys).
const KEYS_PER_WRITER: usize = 8;
/// Every this many writes a writer deletes the key instead (if it exists).
const DELETE_EVERY: usize = 5;
/// Interval of RequestProgress during the load.
const PROGRESS_REQUEST_INTERVAL: Duration = Duration::from_millis(10);
/// Progress responses that must arrive while events are still arriving, so
/// the "never ahead" property is really exercised.
const MIN_PROGRESS_DURING_LOAD: usize = 3;
/// Deadline for all writes of a load and the delivery of their events.
const LOAD_TIMEOUT: Duration = Duration::from_secs(240);
/// Bound of one read while waiting for the last event (the loop re-checks
/// whether the writers are done).
const READ_POLL: Duration = Duration::from_millis(500);
/// After the last expected event, how long the stream is read for extras.
const DUPLICATE_CHECK: Duration = Duration::from_secs(1);
/// Resume test: writers, writes per writer, and events read before the break.
const RESUME_WRITERS: usize = 2;
const RESUME_WRITES_PER_WRITER: usize = 150;
const BREAK_AFTER_EVENTS: usize = 60;
/// Deadline for a member to apply a compaction.
const COMPACTION_APPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for a leaderless member to end a `hasleader` watch stream.
const NO_LEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The first etcd 3.5 release whose requested progress responses wait for
/// the stream's pending events (etcd-io/etcd#15220, fixed by #15237). Older
/// releases, like the reference 3.5.1, can send a progress revision ahead of
/// events still queued on the stream; when the server under test is that
/// reference binary itself, such a violation is reported but not failed.
/// Any other binary (our store) is always held to the property.
const PROGRESS_ORDERING_FIXED_IN: Release = (3, 5, 8);
/// Objects created before the list, as kube-apiserver would find them.
const INITIAL_OBJECTS: usize = 5;

/// A cluster of `server` started with the progress notification interval;
/// the wrapper script must outlive the cluster.
async fn start(server: Server, size: usize) -> (Cluster, FlaggedBinary) {
    let flag = format!("{PROGRESS_NOTIFY_INTERVAL_FLAG}={PROGRESS_NOTIFY_INTERVAL}");
    let binary = FlaggedBinary::new(&server.binary(), &[&flag]).expect("wrapper script");
    let cluster = Cluster::start(binary.binary(), ClusterConfig::new(size))
        .await
        .unwrap_or_else(|e| panic!("starting {size} member(s) of {server:?}: {e:#}"));
    (cluster, binary)
}

// ---------------------------------------------------------------------------
// The cache a watcher maintains.
// ---------------------------------------------------------------------------

/// An object as the cache holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Object {
    value: Vec<u8>,
    create_revision: i64,
    mod_revision: i64,
    version: i64,
}

impl From<&KeyValue> for Object {
    fn from(kv: &KeyValue) -> Self {
        Object {
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
        }
    }
}

/// A watch cache: the list, then every event applied, each checked against
/// what the cache already holds (prev_kv, version, create revision).
#[derive(Debug, Default)]
struct Cache {
    objects: BTreeMap<Vec<u8>, Object>,
    revision: i64,
}

impl Cache {
    fn from_list(list: &GetResponse) -> Result<Cache> {
        Ok(Cache {
            objects: list
                .kvs()
                .iter()
                .map(|kv| (kv.key().to_vec(), Object::from(kv)))
                .collect(),
            revision: list.header().context("list without header")?.revision(),
        })
    }

    /// Applies one event; an error names what is inconsistent.
    fn apply(&mut self, event: &Event) -> Result<()> {
        let kv = event.kv().context("event without kv")?;
        let key = kv.key().to_vec();
        let what = format!(
            "{:?} of {} at {}",
            event.event_type(),
            event_key(event),
            kv.mod_revision()
        );
        ensure!(
            kv.mod_revision() > self.revision,
            "{what}: not after the cache's revision {} (duplicate or out of order)",
            self.revision
        );
        let before = self.objects.get(&key);
        let prev = event.prev_kv().map(Object::from);
        ensure!(
            prev.as_ref() == before,
            "{what}: prev_kv {prev:?} but the cache holds {before:?}"
        );
        match event.event_type() {
            EventType::Put => {
                let (create, version) = match before {
                    Some(object) => (object.create_revision, object.version + 1),
                    None => (kv.mod_revision(), 1),
                };
                ensure!(
                    kv.create_revision() == create && kv.version() == version,
                    "{what}: create revision {} version {}, expected {create} and {version}",
                    kv.create_revision(),
                    kv.version()
                );
                self.objects.insert(key, Object::from(kv));
            }
            EventType::Delete => {
                ensure!(before.is_some(), "{what}: the cache does not hold the key");
                self.objects.remove(&key);
            }
        }
        self.revision = kv.mod_revision();
        Ok(())
    }

    /// Fails unless the cache equals `list` (a linearizable list at the
    /// cache's revision or later with no writes in between).
    fn check_equals(&self, list: &GetResponse) -> Result<()> {
        let listed: BTreeMap<Vec<u8>, Object> = list
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), Object::from(kv)))
            .collect();
        if listed != self.objects {
            let show = |objects: &BTreeMap<Vec<u8>, Object>| {
                objects
                    .iter()
                    .map(|(key, object)| format!("  {} {object:?}", String::from_utf8_lossy(key)))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            bail!(
                "the cache differs from a fresh list:\ncache:\n{}\nlist:\n{}",
                show(&self.objects),
                show(&listed)
            );
        }
        Ok(())
    }
}

async fn list(client: &Client, prefix: &str) -> Result<GetResponse> {
    Ok(client
        .clone()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await?)
}

/// Creates [`INITIAL_OBJECTS`] objects under `prefix`.
async fn seed(client: &Client, prefix: &str) -> Result<()> {
    for i in 0..INITIAL_OBJECTS {
        client
            .clone()
            .put(format!("{prefix}seed-{i}"), format!("initial-{i}"), None)
            .await?;
    }
    Ok(())
}

/// Seeds `prefix` and lists it: the cache kube-apiserver starts from.
async fn seeded_cache(client: &Client, prefix: &str) -> Result<Cache> {
    seed(client, prefix).await?;
    Cache::from_list(&list(client, prefix).await?)
}

/// kube-apiserver's watch of `prefix` from `start_revision` on a new
/// connection to `endpoints` (the client must live as long as the stream).
async fn open_kube_watch(
    endpoints: &[String],
    prefix: &str,
    start_revision: i64,
) -> Result<(Client, WatchRequestSender, WatchResponseStream)> {
    let client = watch_connect(endpoints).await?;
    let (sender, stream) = client
        .watch_client()
        .watch(prefix, Some(kube_watch(start_revision)))
        .await?
        .split();
    Ok((client, sender, stream))
}

/// The created response of a new watch; anything else first is an error.
async fn expect_created(stream: &mut WatchResponseStream) -> Result<WatchResponse> {
    let response = next_response(stream, RESPONSE_TIMEOUT)
        .await
        .context("waiting for the created response")?;
    ensure!(
        response.created() && !response.canceled() && response.events().is_empty(),
        "expected a created response, got {response:?}"
    );
    Ok(response)
}

fn kube_watch(start_revision: i64) -> WatchOptions {
    WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_progress_notify()
        .with_start_revision(start_revision)
}

// ---------------------------------------------------------------------------
// Writers.
// ---------------------------------------------------------------------------

/// One acknowledged write.
#[derive(Clone, Debug)]
struct Acked {
    revision: i64,
    key: String,
    /// The value put, `None` for a delete.
    value: Option<String>,
}

/// `writers` concurrent writers, each doing `writes` puts/deletes on its own
/// keys under `prefix` through `client`. `done` is set when all finished.
/// Returns every acknowledged write.
async fn write_load(
    client: Client,
    prefix: &str,
    writers: usize,
    writes: usize,
    done: Arc<AtomicBool>,
) -> Result<Vec<Acked>> {
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let client = client.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut exists = [false; KEYS_PER_WRITER];
            let mut acked = Vec::new();
            for i in 0..writes {
                let slot = i % KEYS_PER_WRITER;
                let key = format!("{prefix}w{writer}-k{slot}");
                if exists[slot] && i % DELETE_EVERY == DELETE_EVERY - 1 {
                    let response = client.clone().delete(key.as_str(), None).await?;
                    ensure!(response.deleted() == 1, "delete of {key}: {response:?}");
                    let revision = response.header().context("no header")?.revision();
                    acked.push(Acked {
                        revision,
                        key,
                        value: None,
                    });
                    exists[slot] = false;
                } else {
                    let value = format!("w{writer}-write{i}");
                    let response = client
                        .clone()
                        .put(key.as_str(), value.as_str(), None)
                        .await?;
                    let revision = response.header().context("no header")?.revision();
                    acked.push(Acked {
                        revision,
                        key,
                        value: Some(value),
                    });
                    exists[slot] = true;
                }
            }
            Ok::<_, anyhow::Error>(acked)
        }));
    }
    let mut all = Vec::new();
    let mut result = Ok(());
    for task in tasks {
        match task.await {
            Ok(Ok(acked)) => all.extend(acked),
            Ok(Err(error)) => result = Err(error),
            Err(error) => result = Err(error.into()),
        }
    }
    done.store(true, Ordering::SeqCst);
    result?;
    all.sort_by_key(|acked| acked.revision);
    Ok(all)
}

/// Checks that `events` are exactly the acknowledged writes, once each, in
/// revision order, with the written keys and values.
fn check_exactly_once(events: &[Event], acked: &[Acked]) -> Result<()> {
    let revisions: Vec<i64> = events.iter().map(event_revision).collect();
    for pair in revisions.windows(2) {
        ensure!(
            pair[0] < pair[1],
            "events out of order or duplicated: revision {} followed by {}",
            pair[0],
            pair[1]
        );
    }
    let expected: Vec<i64> = acked.iter().map(|acked| acked.revision).collect();
    if revisions != expected {
        let missing: Vec<_> = expected.iter().filter(|r| !revisions.contains(r)).collect();
        let extra: Vec<_> = revisions.iter().filter(|r| !expected.contains(r)).collect();
        bail!(
            "{} events for {} acknowledged writes; missing revisions {missing:?}, unexpected {extra:?}",
            revisions.len(),
            expected.len()
        );
    }
    for (event, acked) in events.iter().zip(acked) {
        let kv = event.kv().context("event without kv")?;
        let value = match event.event_type() {
            EventType::Put => Some(String::from_utf8_lossy(kv.value()).into_owned()),
            EventType::Delete => None,
        };
        ensure!(
            event_key(event) == acked.key && value == acked.value,
            "event at revision {} is {:?} {} {value:?}, the write was {acked:?}",
            acked.revision,
            event.event_type(),
            event_key(event)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Scenarios.
// ---------------------------------------------------------------------------

async fn progress_notify_on_an_idle_prefix_watch(server: Server) {
    let (cluster, _binary) = start(server, 1).await;
    let run = async {
        let client = cluster.client(0).await?;
        let prefix = "/registry/pods/";
        let mut cache = seeded_cache(&client, prefix).await?;
        let (_watch_client, mut sender, mut stream) =
            open_kube_watch(&cluster.endpoints(), prefix, cache.revision + 1).await?;
        let created = expect_created(&mut stream).await?;
        let notified_id = created.watch_id();
        // A second watcher on the same stream without progress_notify.
        sender
            .watch(
                prefix,
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_prev_key()
                        .with_start_revision(cache.revision + 1),
                ),
            )
            .await?;
        let quiet_id = expect_created(&mut stream).await?.watch_id();
        ensure!(
            quiet_id != notified_id,
            "two watchers got the same id {quiet_id}"
        );

        // Three writes: both watchers see them, with prev_kv matching the list.
        let mut kv = client.clone();
        kv.put(format!("{prefix}seed-1"), "updated", None).await?;
        kv.delete(format!("{prefix}seed-2"), None).await?;
        kv.put(format!("{prefix}new"), "created", None).await?;
        let mut seen: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
        let mut progress: Vec<(i64, i64)> = Vec::new();
        let started = Instant::now();
        while seen.values().map(Vec::len).sum::<usize>() < 6 {
            let left = RESPONSE_TIMEOUT.saturating_sub(started.elapsed());
            let response = next_response(&mut stream, left)
                .await
                .with_context(|| format!("waiting for 3 events on 2 watchers, got {seen:?}"))?;
            if is_progress(&response) {
                progress.push((response.watch_id(), header_revision(&response)));
                continue;
            }
            ensure!(!response.canceled(), "watch canceled: {response:?}");
            seen.entry(response.watch_id())
                .or_default()
                .extend(response.events().iter().cloned());
        }
        for event in &seen[&notified_id] {
            cache.apply(event)?;
        }
        ensure!(
            seen.get(&quiet_id).map(Vec::len) == Some(3),
            "the second watcher's events: {seen:?}"
        );
        cache.check_equals(&list(&client, prefix).await?)?;

        // Idle: periodic notifications for the first watcher only, each with
        // the current revision (nothing is written meanwhile).
        let revision = current_revision(&client).await?;
        let mut notifications = 0;
        let idle_since = Instant::now();
        while notifications < PROGRESS_NOTIFICATIONS {
            let deadline = PROGRESS_NOTIFY_TIMEOUT * PROGRESS_NOTIFICATIONS as u32;
            let left = deadline.saturating_sub(idle_since.elapsed());
            let response = next_response(&mut stream, left).await.with_context(|| {
                format!(
                    "waiting for {PROGRESS_NOTIFICATIONS} progress notifications at {} intervals, got {notifications}",
                    PROGRESS_NOTIFY_INTERVAL
                )
            })?;
            ensure!(
                is_progress(&response),
                "only progress notifications expected while idle, got {response:?}"
            );
            ensure!(
                response.watch_id() == notified_id,
                "progress notification for watch {} (asked for by {notified_id} only): {response:?}",
                response.watch_id()
            );
            ensure!(
                header_revision(&response) == revision,
                "progress notification at revision {} while the store is idle at {revision}",
                header_revision(&response)
            );
            notifications += 1;
        }
        let first_wait = idle_since.elapsed();
        eprintln!(
            "{server:?}: {PROGRESS_NOTIFICATIONS} progress notifications after {first_wait:?} idle"
        );
        ensure!(
            first_wait <= PROGRESS_NOTIFY_TIMEOUT * PROGRESS_NOTIFICATIONS as u32,
            "progress notifications took {first_wait:?}"
        );

        // One more write: the event, then a notification with its revision.
        let revision = kv
            .put(format!("{prefix}late"), "x", None)
            .await?
            .header()
            .context("header")?
            .revision();
        let started = Instant::now();
        let mut event_seen = false;
        loop {
            let left = PROGRESS_NOTIFY_TIMEOUT.saturating_sub(started.elapsed());
            let response = next_response(&mut stream, left)
                .await
                .context("waiting for a notification after the late write")?;
            if response.watch_id() == notified_id && !response.events().is_empty() {
                for event in response.events() {
                    cache.apply(event)?;
                }
                event_seen = true;
            } else if is_progress(&response) && response.watch_id() == notified_id {
                ensure!(
                    event_seen || header_revision(&response) < revision,
                    "progress at {} before the event of revision {revision}",
                    header_revision(&response)
                );
                if header_revision(&response) == revision {
                    break;
                }
            }
        }
        Ok::<_, anyhow::Error>(())
    };
    // On a panic the cluster's drop prints every member's log tail.
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

fn header_revision(response: &WatchResponse) -> i64 {
    response.header().map_or(-1, |header| header.revision())
}

/// What a watch stream delivered, in order.
#[derive(Debug)]
enum Delivered {
    Event(Event),
    Progress { watch_id: i64, revision: i64 },
}

async fn request_progress_under_write_load(server: Server) {
    let (cluster, _binary) = start(server, 1).await;
    let run = async {
        let client = cluster.client(0).await?;
        let prefix = "/registry/leases/";
        let mut cache = seeded_cache(&client, prefix).await?;
        let (_watch_client, mut sender, mut stream) =
            open_kube_watch(&cluster.endpoints(), prefix, cache.revision + 1).await?;
        let watch_id = expect_created(&mut stream).await?.watch_id();

        let done = Arc::new(AtomicBool::new(false));
        let target = Arc::new(AtomicI64::new(i64::MAX));
        let requests = Arc::new(AtomicUsize::new(0));
        let requester = {
            let (done, requests) = (done.clone(), requests.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::SeqCst) {
                    if sender.request_progress().await.is_err() {
                        break;
                    }
                    requests.fetch_add(1, Ordering::Relaxed);
                    sleep(PROGRESS_REQUEST_INTERVAL).await;
                }
                sender
            })
        };
        let reader = {
            let target = target.clone();
            tokio::spawn(async move {
                let mut delivered = Vec::new();
                let mut last_event = 0;
                let started = Instant::now();
                while last_event < target.load(Ordering::SeqCst) {
                    ensure!(
                        started.elapsed() < LOAD_TIMEOUT,
                        "events up to {} not delivered within {LOAD_TIMEOUT:?}; last {last_event}",
                        target.load(Ordering::SeqCst)
                    );
                    let response = match timeout(READ_POLL, stream.message()).await {
                        Err(_) => continue,
                        Ok(response) => response?.context("watch stream ended")?,
                    };
                    record(&mut delivered, &mut last_event, response)?;
                }
                let quiet_from = Instant::now();
                while let Some(left) = DUPLICATE_CHECK.checked_sub(quiet_from.elapsed()) {
                    match timeout(left, stream.message()).await {
                        Err(_) => break,
                        Ok(response) => {
                            let response = response?.context("watch stream ended")?;
                            record(&mut delivered, &mut last_event, response)?;
                        }
                    }
                }
                Ok::<_, anyhow::Error>(delivered)
            })
        };
        let acked = timeout(
            LOAD_TIMEOUT,
            write_load(
                client.clone(),
                prefix,
                WRITERS,
                WRITES_PER_WRITER,
                done.clone(),
            ),
        )
        .await
        .context("writes did not finish")??;
        let last = acked.last().context("no writes")?.revision;
        target.store(last, Ordering::SeqCst);
        let delivered = reader.await??;
        let _sender = requester.await?;

        // Exactly once, in order, consistent prev_kv; the cache equals a list.
        let events: Vec<Event> = delivered
            .iter()
            .filter_map(|item| match item {
                Delivered::Event(event) => Some(event.clone()),
                Delivered::Progress { .. } => None,
            })
            .collect();
        check_exactly_once(&events, &acked)?;
        for event in &events {
            cache.apply(event)?;
        }
        cache.check_equals(&list(&client, prefix).await?)?;

        // Progress is never ahead of the events delivered before it.
        let mut later_min = i64::MAX;
        let mut violations = Vec::new();
        let mut during_load = 0;
        for item in delivered.iter().rev() {
            match item {
                Delivered::Event(event) => later_min = later_min.min(event_revision(event)),
                Delivered::Progress {
                    watch_id: id,
                    revision,
                } => {
                    ensure!(
                        *id == -1 || *id == watch_id,
                        "progress response for unknown watch {id}"
                    );
                    ensure!(
                        *revision <= last,
                        "progress at {revision} beyond the last write {last}"
                    );
                    if later_min != i64::MAX {
                        during_load += 1;
                    }
                    if *revision >= later_min {
                        violations.push(format!(
                            "progress at revision {revision} (watch id {id}) arrived before the event of revision {later_min}"
                        ));
                    }
                }
            }
        }
        let progress_total = delivered
            .iter()
            .filter(|item| matches!(item, Delivered::Progress { .. }))
            .count();
        if !violations.is_empty() {
            let message = format!(
                "{} of {progress_total} progress responses were ahead of the events delivered; first: {}",
                violations.len(),
                violations[0]
            );
            let version = cluster.status(0).await?.version().to_string();
            if server.has_known_bug(&version, PROGRESS_ORDERING_FIXED_IN) {
                eprintln!(
                    "KNOWN BUG of the reference etcd {version} (etcd-io/etcd#15220, fixed in \
                     {PROGRESS_ORDERING_FIXED_IN:?}), not failed: {message}"
                );
            } else {
                bail!(message);
            }
        }
        // Informational: a progress revision below an event already delivered
        // is allowed (progress is a lower bound), but worth seeing.
        let mut max_event = 0;
        let mut behind = 0;
        for item in &delivered {
            match item {
                Delivered::Event(event) => max_event = max_event.max(event_revision(event)),
                Delivered::Progress { revision, .. } if *revision < max_event => behind += 1,
                Delivered::Progress { .. } => {}
            }
        }
        eprintln!(
            "{server:?}: {} events; {progress_total} progress responses for {} requests, \
             {during_load} while events were in flight, {behind} below an event already delivered",
            events.len(),
            requests.load(Ordering::Relaxed)
        );
        ensure!(
            during_load >= MIN_PROGRESS_DURING_LOAD,
            "only {during_load} progress responses arrived while events were in flight \
             ({progress_total} in all, {} requests sent)",
            requests.load(Ordering::Relaxed)
        );
        Ok::<_, anyhow::Error>(())
    };
    // On a panic the cluster's drop prints every member's log tail.
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

/// Appends a response's events or progress to `delivered`.
fn record(
    delivered: &mut Vec<Delivered>,
    last_event: &mut i64,
    response: WatchResponse,
) -> Result<()> {
    ensure!(
        !response.canceled() && !response.created(),
        "unexpected response during the load: {response:?}"
    );
    if response.events().is_empty() {
        delivered.push(Delivered::Progress {
            watch_id: response.watch_id(),
            revision: header_revision(&response),
        });
    }
    for event in response.events() {
        *last_event = (*last_event).max(event_revision(event));
        delivered.push(Delivered::Event(event.clone()));
    }
    Ok(())
}

async fn resume_on_another_member_after_a_stream_break(server: Server) {
    let (cluster, _binary) = start(server, 3).await;
    let run = async {
        let writer_client = cluster.client_all().await?;
        let prefix = "/registry/configmaps/";
        let mut cache = seeded_cache(&writer_client, prefix).await?;

        // Watch on member 0 and start the load.
        let (client_a, sender_a, mut stream_a) =
            open_kube_watch(&[cluster.endpoint(0)], prefix, cache.revision + 1).await?;
        expect_created(&mut stream_a).await?;
        let done = Arc::new(AtomicBool::new(false));
        let load = tokio::spawn(write_load(
            writer_client.clone(),
            prefix,
            RESUME_WRITERS,
            RESUME_WRITES_PER_WRITER,
            done.clone(),
        ));
        let mut events = Vec::new();
        let started = Instant::now();
        while events.len() < BREAK_AFTER_EVENTS {
            let left = LOAD_TIMEOUT.saturating_sub(started.elapsed());
            let response = next_response(&mut stream_a, left)
                .await
                .with_context(|| format!("member 0's watch after {} events", events.len()))?;
            ensure!(
                !response.canceled(),
                "member 0's watch canceled: {response:?}"
            );
            events.extend(response.events().iter().cloned());
        }
        // The stream breaks: stop reading and drop it with its connection.
        drop((sender_a, stream_a, client_a));
        let last_seen = events
            .iter()
            .map(event_revision)
            .max()
            .context("no events")?;
        ensure!(
            !done.load(Ordering::SeqCst),
            "the load finished before the break; the test needs writes during the resume"
        );

        // Resume on member 1 from the last revision seen + 1.
        let client_b = watch_connect(&[cluster.endpoint(1)]).await?;
        let (_sender_b, mut stream_b) = client_b
            .watch_client()
            .watch(prefix, Some(kube_watch(last_seen + 1)))
            .await?
            .split();
        expect_created(&mut stream_b).await?;
        let mut acked: Option<Vec<Acked>> = None;
        let mut load = Some(load);
        let started = Instant::now();
        loop {
            if let Some(task) = load.as_mut() {
                if task.is_finished() {
                    acked = Some(task.await??);
                    load = None;
                }
            }
            if let Some(acked) = &acked {
                let last = acked.last().context("no writes")?.revision;
                if events.iter().map(event_revision).max() >= Some(last) {
                    break;
                }
            }
            ensure!(
                started.elapsed() < LOAD_TIMEOUT,
                "resumed watch incomplete after {LOAD_TIMEOUT:?}: {} events",
                events.len()
            );
            match timeout(READ_POLL, stream_b.message()).await {
                Err(_) => continue,
                Ok(response) => {
                    let response = response?.context("member 1's watch stream ended")?;
                    ensure!(
                        !response.canceled(),
                        "member 1's watch canceled: {response:?}"
                    );
                    events.extend(response.events().iter().cloned());
                }
            }
        }
        let acked = acked.context("writes")?;
        // Extras (duplicates) would show up here.
        let quiet_from = Instant::now();
        while let Some(left) = DUPLICATE_CHECK.checked_sub(quiet_from.elapsed()) {
            match timeout(left, stream_b.message()).await {
                Err(_) => break,
                Ok(response) => {
                    let response = response?.context("member 1's watch stream ended")?;
                    events.extend(response.events().iter().cloned());
                }
            }
        }
        check_exactly_once(&events, &acked)
            .with_context(|| format!("across the break at revision {last_seen}"))?;
        eprintln!(
            "{server:?}: {} events, break after revision {last_seen} (of {})",
            events.len(),
            acked.last().map_or(0, |acked| acked.revision)
        );
        for event in &events {
            cache.apply(event)?;
        }
        cache.check_equals(&list(&writer_client, prefix).await?)?;

        // Compaction: resuming below it (on member 2) is canceled with the
        // compaction revision; relisting and watching from there works.
        let compacted_at = current_revision(&writer_client).await?;
        writer_client.clone().compact(compacted_at, None).await?;
        let client_c = cluster.client(2).await?;
        retry_until(
            "member 2 to apply the compaction",
            COMPACTION_APPLY_TIMEOUT,
            || {
                let client_c = client_c.clone();
                async move {
                    let old = client_c
                        .clone()
                        .get(
                            prefix,
                            Some(
                                GetOptions::new()
                                    .with_prefix()
                                    .with_serializable()
                                    .with_revision(last_seen + 1),
                            ),
                        )
                        .await;
                    ensure!(old.is_err(), "a read at {} still works", last_seen + 1);
                    Ok(())
                }
            },
        )
        .await?;
        let watch_c = watch_connect(&[cluster.endpoint(2)]).await?;
        let (_sender_c, mut stream_c) = watch_c
            .watch_client()
            .watch(prefix, Some(kube_watch(last_seen + 1)))
            .await?
            .split();
        let started = Instant::now();
        loop {
            let left = RESPONSE_TIMEOUT.saturating_sub(started.elapsed());
            let response = next_response(&mut stream_c, left)
                .await
                .context("waiting for the compacted cancel")?;
            ensure!(
                response.events().is_empty(),
                "events from a compacted start revision: {response:?}"
            );
            if response.canceled() {
                ensure!(
                    response.compact_revision() == compacted_at,
                    "canceled with compact_revision {}, the compaction was at {compacted_at}: {response:?}",
                    response.compact_revision()
                );
                break;
            }
            ensure!(response.created(), "unexpected response: {response:?}");
        }
        let relisted = list(&client_c, prefix).await?;
        let (_sender_d, mut stream_d) = watch_c
            .watch_client()
            .watch(
                prefix,
                Some(kube_watch(
                    relisted.header().context("header")?.revision() + 1,
                )),
            )
            .await?
            .split();
        expect_created(&mut stream_d).await?;
        Ok::<_, anyhow::Error>(())
    };
    // On a panic the cluster's drop prints every member's log tail.
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

/// An etcd-client connection that sends the `hasleader` metadata.
async fn connect_require_leader(endpoint: String) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(WATCH_OPEN_TIMEOUT)
        .with_require_leader(true);
    Ok(Client::connect([endpoint], Some(options)).await?)
}

/// Fails unless `error` is `Unavailable` with etcd's "no leader" message.
fn check_no_leader(error: &etcd_client::Error) -> Result<()> {
    let text = describe_error(error);
    ensure!(
        text.contains("code=Unavailable") && text.contains("no leader"),
        "expected Unavailable \"etcdserver: no leader\", got {text}"
    );
    Ok(())
}

async fn require_leader_watch_ends_when_the_member_loses_its_leader(server: Server) {
    let (cluster, _binary) = start(server, 3).await;
    let run = async {
        let follower = cluster.follower().await?;
        let prefix = "/registry/events/";
        let leader_client = connect_require_leader(cluster.endpoint(follower)).await?;
        let (_sender, mut guarded) = leader_client
            .watch_client()
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await?
            .split();
        expect_created(&mut guarded).await?;
        let plain_client = connect(&[cluster.endpoint(follower)]).await?;
        let (_plain_sender, mut plain) = plain_client
            .watch_client()
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await?
            .split();
        expect_created(&mut plain).await?;
        // With a leader, the guarded watch works.
        cluster
            .client(follower)
            .await?
            .put(format!("{prefix}e1"), "v", None)
            .await?;
        let response = next_response(&mut guarded, RESPONSE_TIMEOUT).await?;
        ensure!(
            response.events().len() == 1,
            "expected one event: {response:?}"
        );
        next_response(&mut plain, RESPONSE_TIMEOUT).await?;

        for i in 0..cluster.size() {
            if i != follower {
                cluster.kill(i)?;
            }
        }
        let killed = Instant::now();
        let ended = loop {
            let left = NO_LEADER_TIMEOUT.saturating_sub(killed.elapsed());
            match timeout(left, guarded.message()).await {
                Err(_) => bail!("the hasleader watch was still open {NO_LEADER_TIMEOUT:?} after the member lost its quorum"),
                Ok(Ok(Some(response))) if is_progress(&response) => continue,
                Ok(Ok(Some(response))) => {
                    bail!("unexpected response instead of the no-leader error: {response:?}")
                }
                Ok(Ok(None)) => bail!("the hasleader watch ended without the no-leader error"),
                Ok(Err(error)) => break error,
            }
        };
        check_no_leader(&ended).context("how the hasleader watch ended")?;
        eprintln!(
            "{server:?}: hasleader watch ended {:?} after the kill: {}",
            killed.elapsed(),
            describe_error(&ended)
        );
        // A new hasleader watch is refused; the plain watch is still open.
        let refused = match leader_client
            .watch_client()
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await
        {
            Err(error) => error,
            Ok(stream) => {
                let (_sender, mut stream) = stream.split();
                match timeout(RESPONSE_TIMEOUT, stream.message()).await {
                    Ok(Err(error)) => error,
                    other => bail!("a new hasleader watch without a leader: {other:?}"),
                }
            }
        };
        check_no_leader(&refused).context("a new hasleader watch")?;
        match timeout(SILENCE_CHECK, plain.message()).await {
            Err(_) => {}
            Ok(Ok(Some(response))) if is_progress(&response) => {}
            other => bail!("the watch without hasleader should stay open: {other:?}"),
        }
        Ok::<_, anyhow::Error>(())
    };
    // On a panic the cluster's drop prints every member's log tail.
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

against_both!(
    progress_notify_on_an_idle_prefix_watch,
    request_progress_under_write_load,
    resume_on_another_member_after_a_stream_break,
    require_leader_watch_ends_when_the_member_loses_its_leader,
);
