//! Watch at scale on a single member: many watchers, and a stalled reader.
//! Each scenario runs against the candidate (`candidate::*`) and, for
//! comparison, against real etcd 3.5 (`etcd35::*`), with the same property
//! assertions. The scenarios run one at a time (they share a lock), so each
//! has the machine's two cores to itself as far as this file is concerned.
//!
//! - `ten_thousand_watchers_on_one_stream` and
//!   `ten_thousand_watchers_on_a_hundred_streams`: [`WATCHERS`] watchers,
//!   all on one Watch stream, or spread round-robin over [`SPREAD_STREAMS`]
//!   streams of one connection, all created (from the current revision + 1)
//!   before [`SCALE_WRITERS`] writers make [`SCALE_PUTS_PER_WRITER`] puts
//!   each over [`SCALE_KEYS`] keys `s/k0000`..`s/k0999` (seeded random keys).
//!   Watcher `w` watches:
//!   - every [`PREFIX_WATCHER_EVERY`]th watcher: the whole prefix `s/`
//!     (100 watchers);
//!   - other even `w`: the single key `(w / 2) % 1000` (4,900 watchers, about
//!     5 per key);
//!   - odd `w`: the range of [`RANGE_KEYS`] keys from `(7 * (w / 2)) % 991`
//!     (5,000 watchers, on average 50 per key).
//!
//!   So each put reaches about 100 + 5 + 50 = 155 watchers, and the 2,000
//!   puts make about 310,000 events per scenario (the exact number, 309,844
//!   with the fixed seed, is computed from the acknowledged puts, printed,
//!   and checked against [`MAX_SCALE_EVENTS`]). Every watcher must receive
//!   exactly the puts of its keys, each once, in revision order, with the
//!   written key and value, and nothing else (streams are read on for
//!   [`DUPLICATE_CHECK`] after the last expected event).
//! - `many_streams_on_one_connection`: [`ONE_CONNECTION_STREAMS`] watch
//!   streams on one HTTP/2 connection (more than hyper's default limit of
//!   200 per connection; etcd has none unless `--max-concurrent-streams`
//!   sets one) are all created, and one put reaches each.
//! - `stalled_reader_does_not_block_writes_or_other_watchers`: one stream,
//!   on its own connection, carries [`STALLED_WATCHERS`] watchers of the
//!   prefix `b/`; after their created responses the client stops reading it.
//!   [`STALL_WRITERS`] × [`STALL_PUTS_PER_WRITER`] puts of [`STALL_VALUE_BYTES`]
//!   values follow: that is 20,000 × 20 ≈ 400 MiB of pending events on the
//!   stalled stream, more than the memory bound, so a server that buffers a
//!   slow stream's events fails the RSS check. Meanwhile:
//!   - every put succeeds within [`PUT_LATENCY_LIMIT`];
//!   - a watcher of the same prefix on another connection receives all
//!     20,000 events, in order, exactly once, within [`LIVE_DELIVERY_TIMEOUT`]
//!     of the last write, while the stalled stream is still not read;
//!   - the server's RSS (`VmRSS` of `/proc/<pid>/status`, sampled every
//!     [`RSS_SAMPLE_INTERVAL`]) never grows more than [`RSS_GROWTH_LIMIT`]
//!     above its value before the writes.
//!
//!   Then the stalled stream is read again: each of its watchers must receive
//!   all 20,000 events exactly once, in order (caught up from storage),
//!   within [`CATCH_UP_TIMEOUT`].
//!
//! Every wait is bounded by a named deadline. Run:
//! `STORE_BIN=/path/to/candidate cargo test -p integration-tests --test integration watch_scale::`

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{
    Client, EventType, WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream,
};
use integration_tests::client::current_revision;
use integration_tests::client::describe_error;
use integration_tests::process::status_bytes;
use integration_tests::watchlease::{next_response, watch_connect};
use integration_tests::{against_both, ClusterConfig, Server};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

/// Watchers in each scale scenario.
const WATCHERS: usize = 10_000;
/// Streams the watchers are spread over in the spread scenario.
const SPREAD_STREAMS: usize = 100;
/// Keys written in the scale scenarios: `s/k0000` .. `s/k0999`.
const SCALE_KEYS: usize = 1_000;
/// Keys covered by a range watcher.
const RANGE_KEYS: usize = 10;
/// Every this many watchers, one watches the whole prefix.
const PREFIX_WATCHER_EVERY: usize = 100;
/// Writers and puts per writer in the scale scenarios (2,000 puts).
const SCALE_WRITERS: usize = 4;
const SCALE_PUTS_PER_WRITER: usize = 500;
/// Upper bound on the events of one scale scenario (the computed number is
/// checked against it, so a change of the sizes cannot silently blow up).
const MAX_SCALE_EVENTS: usize = 500_000;
/// Seed of the writers' key choices.
const SEED: u64 = 0x5eed_0f7a;
/// Deadline for all watchers' created responses.
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);
/// Deadline for all writes of one load.
const WRITE_TIMEOUT: Duration = Duration::from_secs(180);
/// Deadline, after the last write, for every expected event to arrive.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);
/// After the last expected event, how long streams are read for extras.
const DUPLICATE_CHECK: Duration = Duration::from_secs(2);
/// Bound of one read of a stream before the reader re-checks its stop flag.
const READ_POLL: Duration = Duration::from_millis(200);
/// Bound of a single response (created response, first write).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest watch response accepted (clientv3's default: no practical limit).
const MAX_WATCH_RESPONSE_BYTES: usize = i32::MAX as usize;

/// Watchers on the stalled stream.
const STALLED_WATCHERS: usize = 20;
/// Writers and puts per writer while the stream is stalled (20,000 puts).
const STALL_WRITERS: usize = 8;
const STALL_PUTS_PER_WRITER: usize = 2_500;
/// Keys written while the stream is stalled: `b/k0000` .. `b/k0999`.
const STALL_KEYS: usize = 1_000;
/// Size of each value written while the stream is stalled.
const STALL_VALUE_BYTES: usize = 1024;
/// Every put must be acknowledged within this time.
const PUT_LATENCY_LIMIT: Duration = Duration::from_secs(10);
/// Deadline, after the last write, for the live watcher to have everything.
const LIVE_DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for the stalled stream, once read again, to deliver everything.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(180);
/// Bound on the server's RSS growth above its value before the writes.
const RSS_GROWTH_LIMIT: u64 = 300 * 1024 * 1024;
/// Interval of RSS samples.
const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// The scenarios of this file run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------
// Keys, values, writes.
// ---------------------------------------------------------------------------

fn key(prefix: &str, index: usize) -> String {
    format!("{prefix}k{index:04}")
}

/// The value of writer `writer`'s `i`th put: a unique header padded to `size`.
fn value(writer: usize, i: usize, size: usize) -> Vec<u8> {
    let mut value = format!("w{writer}-{i}:").into_bytes();
    let fill = b'a' + ((writer * 7 + i) % 26) as u8;
    value.resize(value.len().max(size), fill);
    value
}

/// FNV-1a, to remember values compactly.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x100000001b3)
    })
}

/// One acknowledged put.
#[derive(Clone, Debug)]
struct Acked {
    revision: i64,
    key_index: usize,
    key: String,
    value_hash: u64,
}

/// Puts by `writers` concurrent writers, `per_writer` each, on seeded random
/// keys among `keys` under `prefix`, values of `value_size` bytes. Returns
/// the acknowledged puts in revision order and every put's latency.
async fn write_load(
    client: &Client,
    prefix: &str,
    keys: usize,
    writers: usize,
    per_writer: usize,
    value_size: usize,
) -> Result<(Vec<Acked>, Vec<Duration>)> {
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let client = client.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(SEED ^ writer as u64);
            let mut acked = Vec::with_capacity(per_writer);
            let mut latencies = Vec::with_capacity(per_writer);
            for i in 0..per_writer {
                let key_index = rng.gen_range(0..keys);
                let key = key(&prefix, key_index);
                let value = value(writer, i, value_size);
                let value_hash = fnv(&value);
                let started = Instant::now();
                let response = client
                    .clone()
                    .put(key.as_str(), value, None)
                    .await
                    .with_context(|| format!("put {i} of writer {writer} ({key})"))?;
                latencies.push(started.elapsed());
                acked.push(Acked {
                    revision: response.header().context("put without header")?.revision(),
                    key_index,
                    key,
                    value_hash,
                });
            }
            Ok::<_, anyhow::Error>((acked, latencies))
        }));
    }
    let mut all = Vec::new();
    let mut latencies = Vec::new();
    for task in tasks {
        let (acked, times) = task.await??;
        all.extend(acked);
        latencies.extend(times);
    }
    all.sort_by_key(|acked| acked.revision);
    for pair in all.windows(2) {
        ensure!(
            pair[0].revision < pair[1].revision,
            "two puts acknowledged with revision {}",
            pair[1].revision
        );
    }
    Ok((all, latencies))
}

// ---------------------------------------------------------------------------
// Reading watch streams.
// ---------------------------------------------------------------------------

/// An event as a watcher received it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    revision: i64,
    put: bool,
    key: String,
    value_hash: u64,
}

/// Each watcher's events, in arrival order, by watcher index.
type SeenByWatcher = BTreeMap<usize, Vec<Seen>>;

/// Counters shared by the readers of one scenario.
#[derive(Default)]
struct Progress {
    created: AtomicUsize,
    events: AtomicUsize,
    stop: AtomicBool,
    /// The first reader failure: a wait stops on it at once instead of
    /// timing out on a counter no reader moves any more.
    failure: std::sync::Mutex<Option<String>>,
}

impl Progress {
    fn fail(&self, error: &anyhow::Error) {
        let mut failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        failure.get_or_insert_with(|| format!("{error:#}"));
    }

    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Reads `stream` until `progress.stop` is set. Created responses are
/// matched, in order, to `pending` (the watchers whose create requests were
/// sent on this stream, in request order); `ids` holds already matched ones.
/// Returns each watcher's events in arrival order.
fn spawn_reader(
    what: String,
    mut stream: WatchResponseStream,
    pending: Vec<usize>,
    mut ids: HashMap<i64, usize>,
    progress: Arc<Progress>,
) -> JoinHandle<Result<SeenByWatcher>> {
    tokio::spawn(async move {
        let mut pending = pending.into_iter();
        let mut seen = SeenByWatcher::new();
        let read = async {
            while !progress.stop.load(Ordering::SeqCst) {
                let response = match timeout(READ_POLL, stream.message()).await {
                    Err(_) => continue,
                    Ok(Err(error)) => bail!(
                        "{what}: stream failed: {} ({})",
                        describe_error(&error),
                        error_chain(&error)
                    ),
                    Ok(Ok(None)) => bail!("{what}: stream ended"),
                    Ok(Ok(Some(response))) => response,
                };
                record(
                    &what,
                    response,
                    &mut pending,
                    &mut ids,
                    &mut seen,
                    &progress,
                )?;
            }
            Ok(())
        };
        if let Err(error) = read.await {
            progress.fail(&error);
            return Err(error);
        }
        Ok(seen)
    })
}

/// The causes of `error`, outermost first: which side of the connection
/// ended it and why (an h2 error's reason, an I/O error).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut causes = Vec::new();
    let mut cause = error.source();
    while let Some(e) = cause {
        causes.push(format!("{e} [{e:?}]"));
        cause = e.source();
    }
    causes.join(" <- ")
}

fn record(
    what: &str,
    response: WatchResponse,
    pending: &mut impl Iterator<Item = usize>,
    ids: &mut HashMap<i64, usize>,
    seen: &mut SeenByWatcher,
    progress: &Progress,
) -> Result<()> {
    ensure!(!response.canceled(), "{what}: watch canceled: {response:?}");
    if response.created() {
        ensure!(
            response.events().is_empty(),
            "{what}: created response with events"
        );
        let watcher = pending
            .next()
            .with_context(|| format!("{what}: more created responses than create requests"))?;
        ensure!(
            ids.insert(response.watch_id(), watcher).is_none(),
            "{what}: watch id {} created twice",
            response.watch_id()
        );
        progress.created.fetch_add(1, Ordering::SeqCst);
        return Ok(());
    }
    if response.events().is_empty() {
        return Ok(()); // A progress notification.
    }
    let watcher = *ids.get(&response.watch_id()).with_context(|| {
        format!(
            "{what}: events for unknown watch id {}",
            response.watch_id()
        )
    })?;
    let events = seen.entry(watcher).or_default();
    for event in response.events() {
        let kv = event.kv().context("event without kv")?;
        events.push(Seen {
            revision: kv.mod_revision(),
            put: event.event_type() == EventType::Put,
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value_hash: fnv(kv.value()),
        });
    }
    progress
        .events
        .fetch_add(response.events().len(), Ordering::SeqCst);
    Ok(())
}

/// Waits until `counter` reaches `target`, failing after `deadline`.
async fn wait_count(
    what: &str,
    progress: &Progress,
    counter: fn(&Progress) -> &AtomicUsize,
    target: usize,
    deadline: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let now = counter(progress).load(Ordering::SeqCst);
        if now >= target {
            return Ok(());
        }
        if let Some(failure) = progress.failure() {
            bail!("{what}: {now} of {target}, and a reader stopped: {failure}");
        }
        if start.elapsed() >= deadline {
            bail!("{what}: {now} of {target} within {deadline:?}");
        }
        sleep(READ_POLL).await;
    }
}

/// The server's watch gauges (`etcd_debugging_mvcc_watcher_total` and
/// `etcd_debugging_mvcc_watch_stream_total` of its `/metrics`) for a failure
/// message: they tell a server that stopped taking create requests from a
/// client that stopped reading the answers.
async fn watch_gauges(endpoint: &str) -> String {
    match integration_tests::http::get(&format!("{endpoint}/metrics")).await {
        Ok(metrics) => metrics
            .body
            .lines()
            .filter(|line| {
                line.starts_with("etcd_debugging_mvcc_watcher_total")
                    || line.starts_with("etcd_debugging_mvcc_watch_stream_total")
            })
            .collect::<Vec<_>>()
            .join(", "),
        Err(error) => format!("unknown ({error:#})"),
    }
}

/// Stops the readers and collects every watcher's events; reader failures
/// are errors.
async fn collect(
    readers: Vec<JoinHandle<Result<SeenByWatcher>>>,
    progress: &Progress,
) -> Result<SeenByWatcher> {
    progress.stop.store(true, Ordering::SeqCst);
    let mut all = BTreeMap::new();
    for reader in readers {
        let seen = timeout(RESPONSE_TIMEOUT, reader)
            .await
            .context("a reader did not stop")???;
        all.extend(seen);
    }
    Ok(all)
}

/// Checks that `seen` is exactly `expected`: same events, each once, in
/// revision order. Returns a description of the first difference.
fn compare(watcher: &str, seen: &[Seen], expected: &[&Acked]) -> Result<()> {
    for pair in seen.windows(2) {
        ensure!(
            pair[0].revision < pair[1].revision,
            "{watcher}: revision {} followed by {} (out of order or duplicated)",
            pair[0].revision,
            pair[1].revision
        );
    }
    for (i, acked) in expected.iter().enumerate() {
        let want = Seen {
            revision: acked.revision,
            put: true,
            key: acked.key.clone(),
            value_hash: acked.value_hash,
        };
        match seen.get(i) {
            Some(got) if *got == want => {}
            got => bail!(
                "{watcher}: event {i} of {} is {got:?}, expected {want:?} ({} events received)",
                expected.len(),
                seen.len()
            ),
        }
    }
    ensure!(
        seen.len() == expected.len(),
        "{watcher}: {} events received, {} expected; first extra: {:?}",
        seen.len(),
        expected.len(),
        seen.get(expected.len())
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Scale: 10,000 watchers on one or on a hundred streams.
// ---------------------------------------------------------------------------

/// The keys watcher `w` watches: a range of key indexes `[from, to)`.
fn watched_keys(w: usize) -> (usize, usize) {
    if w.is_multiple_of(PREFIX_WATCHER_EVERY) {
        (0, SCALE_KEYS)
    } else if w.is_multiple_of(2) {
        let k = (w / 2) % SCALE_KEYS;
        (k, k + 1)
    } else {
        let from = (7 * (w / 2)) % (SCALE_KEYS - RANGE_KEYS + 1);
        (from, from + RANGE_KEYS)
    }
}

/// The watch request of watcher `w`, from `start`.
fn scale_watch(w: usize, start: i64) -> (String, WatchOptions) {
    let prefix = "s/";
    let options = WatchOptions::new().with_start_revision(start);
    if w.is_multiple_of(PREFIX_WATCHER_EVERY) {
        return (prefix.to_string(), options.with_prefix());
    }
    match watched_keys(w) {
        (from, to) if to == from + 1 => (key(prefix, from), options),
        (from, to) => (key(prefix, from), options.with_range(key(prefix, to))),
    }
}

async fn many_watchers(server: Server, streams: usize) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = server.start(ClusterConfig::new(1)).await;
    let run = async {
        let began = Instant::now();
        let client = cluster.client(0).await?;
        let start = current_revision(&client).await? + 1;
        let watch_client = watch_connect(&[cluster.endpoint(0)]).await?;
        let progress = Arc::new(Progress::default());
        let mut readers = Vec::new();
        let mut senders: Vec<WatchRequestSender> = Vec::new();
        let mut per_stream: Vec<Vec<usize>> = vec![Vec::new(); streams];
        for w in 0..WATCHERS {
            per_stream[w % streams].push(w);
        }
        for (s, watchers) in per_stream.iter().enumerate() {
            let (first_key, first_options) = scale_watch(watchers[0], start);
            let (sender, stream) = timeout(
                RESPONSE_TIMEOUT,
                watch_client
                    .watch_client()
                    .max_decoding_message_size(MAX_WATCH_RESPONSE_BYTES)
                    .watch(first_key, Some(first_options)),
            )
            .await
            .with_context(|| format!("opening stream {s}"))??
            .split();
            readers.push(spawn_reader(
                format!("stream {s}"),
                stream,
                watchers.clone(),
                HashMap::new(),
                progress.clone(),
            ));
            senders.push(sender);
        }
        for (s, watchers) in per_stream.iter().enumerate() {
            for &w in &watchers[1..] {
                let (key, options) = scale_watch(w, start);
                timeout(RESPONSE_TIMEOUT, senders[s].watch(key, Some(options)))
                    .await
                    .with_context(|| format!("sending the create request of watcher {w}"))??;
            }
        }
        let created = wait_count(
            "created responses",
            &progress,
            |p| &p.created,
            WATCHERS,
            CREATE_TIMEOUT,
        )
        .await;
        if let Err(error) = created {
            let gauges = watch_gauges(&cluster.endpoint(0)).await;
            return Err(error.context(format!("the server's gauges: {gauges}")));
        }
        let created = began.elapsed();

        let (acked, latencies) = timeout(
            WRITE_TIMEOUT,
            write_load(
                &client,
                "s/",
                SCALE_KEYS,
                SCALE_WRITERS,
                SCALE_PUTS_PER_WRITER,
                0,
            ),
        )
        .await
        .context("the writes did not finish")??;
        let written = began.elapsed();

        // Who must see what: the watchers of each key, then each put's.
        let mut watchers_of: Vec<Vec<usize>> = vec![Vec::new(); SCALE_KEYS];
        for w in 0..WATCHERS {
            let (from, to) = watched_keys(w);
            for watchers in &mut watchers_of[from..to] {
                watchers.push(w);
            }
        }
        let mut expected: Vec<Vec<&Acked>> = vec![Vec::new(); WATCHERS];
        for put in &acked {
            for &w in &watchers_of[put.key_index] {
                expected[w].push(put);
            }
        }
        let total: usize = expected.iter().map(Vec::len).sum();
        ensure!(
            total <= MAX_SCALE_EVENTS,
            "the sizes give {total} events, more than {MAX_SCALE_EVENTS}"
        );
        wait_count(
            "events delivered",
            &progress,
            |p| &p.events,
            total,
            DELIVERY_TIMEOUT,
        )
        .await?;
        let delivered = began.elapsed();
        sleep(DUPLICATE_CHECK).await;
        let seen = collect(readers, &progress).await?;
        drop(senders);
        let empty = Vec::new();
        let mut failures = Vec::new();
        for (w, expected) in expected.iter().enumerate() {
            if let Err(error) = compare(
                &format!("watcher {w} on keys {:?}", watched_keys(w)),
                seen.get(&w).unwrap_or(&empty),
                expected,
            ) {
                failures.push(format!("{error:#}"));
            }
        }
        ensure!(
            failures.is_empty(),
            "{} of {WATCHERS} watchers did not get exactly their events; first ones:\n{}",
            failures.len(),
            failures[..failures.len().min(10)].join("\n")
        );
        let max_latency = latencies.iter().max().copied().unwrap_or_default();
        eprintln!(
            "{server:?}: {WATCHERS} watchers on {streams} stream(s): created in {created:?}; \
             {} puts done at {written:?} (max put latency {max_latency:?}); \
             {total} events delivered at {delivered:?}",
            acked.len()
        );
        Ok::<_, anyhow::Error>(())
    };
    run.await
        .unwrap_or_else(|e| panic!("{server:?}, {streams} stream(s): {e:#}"));
}

async fn ten_thousand_watchers_on_one_stream(server: Server) {
    many_watchers(server, 1).await;
}

async fn ten_thousand_watchers_on_a_hundred_streams(server: Server) {
    many_watchers(server, SPREAD_STREAMS).await;
}

// ---------------------------------------------------------------------------
// Many streams on one connection.
// ---------------------------------------------------------------------------

/// Watch streams opened on one HTTP/2 connection: more than hyper's
/// default per-connection stream limit (200), which etcd does not have (its
/// `--max-concurrent-streams` defaults to 2^32 - 1), as kube-apiserver
/// multiplexes one watch per resource over each etcd client's connection.
const ONE_CONNECTION_STREAMS: usize = 300;

/// [`ONE_CONNECTION_STREAMS`] watch streams on one connection (each with
/// one watcher of the same key) are all created, and one put reaches every
/// one of them.
async fn many_streams_on_one_connection(server: Server) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = server.start(ClusterConfig::new(1)).await;
    let run = async {
        let client = cluster.client(0).await?;
        let watch_client = watch_connect(&[cluster.endpoint(0)]).await?;
        let mut streams = Vec::with_capacity(ONE_CONNECTION_STREAMS);
        for s in 0..ONE_CONNECTION_STREAMS {
            let (sender, mut stream) = timeout(
                RESPONSE_TIMEOUT,
                watch_client.watch_client().watch("streams/key", None),
            )
            .await
            .with_context(|| format!("opening stream {s}: no answer"))?
            .with_context(|| format!("opening stream {s}"))?
            .split();
            let created = next_response(&mut stream, RESPONSE_TIMEOUT)
                .await
                .with_context(|| format!("created response of stream {s}"))?;
            ensure!(created.created(), "stream {s}: first response {created:?}");
            streams.push((sender, stream));
        }
        let put = client.clone().put("streams/key", "v", None).await?;
        let revision = put.header().context("put header")?.revision();
        for (s, (_sender, stream)) in streams.iter_mut().enumerate() {
            let response = next_response(stream, RESPONSE_TIMEOUT)
                .await
                .with_context(|| format!("event on stream {s}"))?;
            let events = response.events();
            ensure!(
                events.len() == 1 && events[0].kv().map(|kv| kv.mod_revision()) == Some(revision),
                "stream {s}: expected the put at revision {revision}, got {response:?}"
            );
        }
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

// ---------------------------------------------------------------------------
// A stalled reader.
// ---------------------------------------------------------------------------

/// Samples the RSS of `pid` until `stop`; the maximum is kept in `max`.
fn spawn_rss_sampler(
    pid: u32,
    max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<()>> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            max.fetch_max(status_bytes(pid, "VmRSS:")?, Ordering::SeqCst);
            sleep(RSS_SAMPLE_INTERVAL).await;
        }
        Ok(())
    })
}

const MIB: u64 = 1024 * 1024;

async fn stalled_reader_does_not_block_writes_or_other_watchers(server: Server) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let cluster = server.start(ClusterConfig::new(1)).await;
    let run = async {
        let prefix = "b/";
        let began = Instant::now();
        let client = cluster.client(0).await?;
        let pid = cluster.pid(0).context("the member is not running")?;
        let start = current_revision(&client).await? + 1;
        let options = WatchOptions::new().with_prefix().with_start_revision(start);

        // The stalled stream, on its own connection: created, then not read.
        let stalled_client = watch_connect(&[cluster.endpoint(0)]).await?;
        let (mut stalled_sender, mut stalled) = timeout(
            RESPONSE_TIMEOUT,
            stalled_client
                .watch_client()
                .max_decoding_message_size(MAX_WATCH_RESPONSE_BYTES)
                .watch(prefix, Some(options.clone())),
        )
        .await
        .context("opening the stalled stream")??
        .split();
        for _ in 1..STALLED_WATCHERS {
            stalled_sender.watch(prefix, Some(options.clone())).await?;
        }
        let mut stalled_ids = HashMap::new();
        for w in 0..STALLED_WATCHERS {
            let response = next_response(&mut stalled, RESPONSE_TIMEOUT)
                .await
                .context("created responses of the stalled stream")?;
            ensure!(
                response.created() && !response.canceled() && response.events().is_empty(),
                "expected a created response on the stalled stream, got {response:?}"
            );
            stalled_ids.insert(response.watch_id(), w);
        }
        ensure!(stalled_ids.len() == STALLED_WATCHERS, "duplicate watch ids");

        // The live watcher, on another connection, read all along.
        let live_client = watch_connect(&[cluster.endpoint(0)]).await?;
        let (live_sender, live) = timeout(
            RESPONSE_TIMEOUT,
            live_client
                .watch_client()
                .max_decoding_message_size(MAX_WATCH_RESPONSE_BYTES)
                .watch(prefix, Some(options.clone())),
        )
        .await
        .context("opening the live stream")??
        .split();
        let live_progress = Arc::new(Progress::default());
        let live_reader = spawn_reader(
            "live stream".to_string(),
            live,
            vec![0],
            HashMap::new(),
            live_progress.clone(),
        );
        wait_count(
            "created response of the live watcher",
            &live_progress,
            |p| &p.created,
            1,
            RESPONSE_TIMEOUT,
        )
        .await?;

        let baseline = status_bytes(pid, "VmRSS:")?;
        let max_rss = Arc::new(AtomicU64::new(baseline));
        let sampling = Arc::new(AtomicBool::new(false));
        let sampler = spawn_rss_sampler(pid, max_rss.clone(), sampling.clone());

        let writes_began = Instant::now();
        let (acked, mut latencies) = timeout(
            WRITE_TIMEOUT,
            write_load(
                &client,
                prefix,
                STALL_KEYS,
                STALL_WRITERS,
                STALL_PUTS_PER_WRITER,
                STALL_VALUE_BYTES,
            ),
        )
        .await
        .context("the writes did not finish while a stream was stalled")??;
        let write_time = writes_began.elapsed();
        let live_at_end_of_writes = live_progress.events.load(Ordering::SeqCst);
        latencies.sort();
        let max_latency = *latencies.last().context("no writes")?;
        let p99 = latencies[latencies.len() * 99 / 100];
        eprintln!(
            "{server:?}: {} puts of {STALL_VALUE_BYTES} B in {write_time:?} with a stalled stream \
             (p50 {:?}, p99 {p99:?}, max {max_latency:?}); the live watcher had {live_at_end_of_writes} events",
            acked.len(),
            latencies[latencies.len() / 2],
        );
        ensure!(
            max_latency <= PUT_LATENCY_LIMIT,
            "a put took {max_latency:?} while a stream was stalled (limit {PUT_LATENCY_LIMIT:?})"
        );

        // The live watcher gets everything while the other stream is stalled.
        wait_count(
            "events of the live watcher while the other stream is stalled",
            &live_progress,
            |p| &p.events,
            acked.len(),
            LIVE_DELIVERY_TIMEOUT,
        )
        .await?;
        let live_done = writes_began.elapsed();
        sleep(DUPLICATE_CHECK).await;
        let seen = collect(vec![live_reader], &live_progress).await?;
        drop(live_sender);
        let expected: Vec<&Acked> = acked.iter().collect();
        compare(
            "live watcher",
            seen.get(&0).map(Vec::as_slice).unwrap_or(&[]),
            &expected,
        )?;

        sampling.store(true, Ordering::SeqCst);
        timeout(RESPONSE_TIMEOUT, sampler)
            .await
            .context("the RSS sampler did not stop")???;
        let peak = max_rss.load(Ordering::SeqCst);
        let growth = peak.saturating_sub(baseline);
        eprintln!(
            "{server:?}: RSS {} MiB before the writes, peak {} MiB while stalled (growth {} MiB); \
             the live watcher had all events {live_done:?} after the writes began",
            baseline / MIB,
            peak / MIB,
            growth / MIB
        );
        ensure!(
            growth <= RSS_GROWTH_LIMIT,
            "the server's RSS grew by {} MiB (from {} to {} MiB) while a stream was stalled; limit {} MiB",
            growth / MIB,
            baseline / MIB,
            peak / MIB,
            RSS_GROWTH_LIMIT / MIB
        );

        // Resume the stalled stream: everything, once, in order.
        let resumed = Instant::now();
        let stalled_progress = Arc::new(Progress::default());
        let stalled_reader = spawn_reader(
            "stalled stream".to_string(),
            stalled,
            Vec::new(),
            stalled_ids,
            stalled_progress.clone(),
        );
        wait_count(
            "events of the stalled stream after it is read again",
            &stalled_progress,
            |p| &p.events,
            acked.len() * STALLED_WATCHERS,
            CATCH_UP_TIMEOUT,
        )
        .await?;
        let caught_up = resumed.elapsed();
        sleep(DUPLICATE_CHECK).await;
        let seen = collect(vec![stalled_reader], &stalled_progress).await?;
        drop(stalled_sender);
        for w in 0..STALLED_WATCHERS {
            compare(
                &format!("stalled watcher {w}"),
                seen.get(&w).map(Vec::as_slice).unwrap_or(&[]),
                &expected,
            )?;
        }
        eprintln!(
            "{server:?}: the stalled stream caught up ({} events) {caught_up:?} after it was read again; \
             scenario took {:?}",
            acked.len() * STALLED_WATCHERS,
            began.elapsed()
        );
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

against_both!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    ten_thousand_watchers_on_one_stream,
    ten_thousand_watchers_on_a_hundred_streams,
    many_streams_on_one_connection,
    stalled_reader_does_not_block_writes_or_other_watchers,
);
