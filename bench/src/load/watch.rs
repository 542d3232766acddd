//! The `watch` workload: `--watchers` watchers × `--total` events.
//!
//! Watchers all watch the run's key prefix, spread over `--streams` gRPC
//! watch streams (watcher `w` on stream `w % streams`, stream `s` on
//! connection `s % conns`), and are all created before the first event.
//! Then `--clients` writers put the events (open or closed loop, like `put`);
//! every value carries its send time, so each delivery's latency is the time
//! from just before the Put was sent to the moment the event is decoded by
//! the watcher. Every event must reach every watcher: after the writers
//! stop, watchers drain for at most [`DRAIN_TIMEOUT`] and anything still
//! missing is counted as an error ("missing delivery").
//!
//! The receive loop is shared with the `apiserver` workload, which also asks
//! for progress notifications and times them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{Client, WatchOptions, WatchStream};
use tokio::sync::watch;

use super::{merge_into, LoadConfig, Recorders, Workload};
use crate::keys::since_stamp;

/// How long watchers may keep receiving after the writers stopped.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long creating one watcher may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a receiving stream re-checks whether it is done.
const RECEIVE_POLL: Duration = Duration::from_millis(50);

/// A watch stream and how many watchers it carries.
pub struct OpenStream {
    pub stream: WatchStream,
    pub watchers: usize,
}

/// When receivers stop: each watcher has seen `events` events, or `deadline` passed.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub events: u64,
    pub deadline: Instant,
}

/// Runs the workload; returns recorders ("watch-delivery", "put") and counters.
pub async fn run(
    cfg: &LoadConfig,
    conns: &[Client],
    watchers: usize,
    streams: usize,
) -> Result<(Recorders, BTreeMap<String, f64>)> {
    let opts = WatchOptions::new().with_prefix();
    let open = open_streams(conns, cfg.prefix.as_bytes(), &opts, watchers, streams).await?;
    let (target_tx, target_rx) = watch::channel(None);
    let receivers: Vec<_> = open
        .into_iter()
        .map(|s| tokio::spawn(receive(s, target_rx.clone(), None)))
        .collect();
    let mut recs = super::run_kv(cfg, conns, &Workload::Put).await;
    let events = recs.get("put").map_or(0, |r| r.ok());
    let delivered = drain(&target_tx, receivers, events, &mut recs).await?;
    let expected = events * watchers.max(1) as u64;
    let missing = expected.saturating_sub(delivered);
    recs.entry("watch-delivery")
        .or_default()
        .error_n("missing delivery", missing);
    let counters = BTreeMap::from([
        ("watchers".to_string(), watchers.max(1) as f64),
        (
            "streams".to_string(),
            streams.clamp(1, watchers.max(1)) as f64,
        ),
        ("events_put".to_string(), events as f64),
        ("deliveries".to_string(), delivered as f64),
        ("missing_deliveries".to_string(), missing as f64),
    ]);
    Ok((recs, counters))
}

/// Creates `watchers` watchers of `key` (with `opts`) over `streams` streams.
pub async fn open_streams(
    conns: &[Client],
    key: &[u8],
    opts: &WatchOptions,
    watchers: usize,
    streams: usize,
) -> Result<Vec<OpenStream>> {
    let watchers = watchers.max(1);
    let streams = streams.clamp(1, watchers);
    let mut open = Vec::with_capacity(streams);
    for s in 0..streams {
        let on_stream = watchers / streams + usize::from(s < watchers % streams);
        let mut client = conns[s % conns.len()].watch_client();
        let mut stream = tokio::time::timeout(
            CREATE_TIMEOUT,
            client.watch(key.to_vec(), Some(opts.clone())),
        )
        .await
        .context("creating watch stream timed out")??;
        await_created(&mut stream).await?;
        for _ in 1..on_stream {
            stream.watch(key.to_vec(), Some(opts.clone())).await?;
            await_created(&mut stream).await?;
        }
        open.push(OpenStream {
            stream,
            watchers: on_stream,
        });
    }
    Ok(open)
}

/// Waits for the Created answer of the watch just requested on `stream`.
/// Responses for watchers created earlier on the same stream (events,
/// progress) may arrive first while writes are in flight; they are skipped.
async fn await_created(stream: &mut WatchStream) -> Result<()> {
    let deadline = tokio::time::Instant::now() + CREATE_TIMEOUT;
    loop {
        let resp = tokio::time::timeout_at(deadline, stream.message())
            .await
            .context("watch creation timed out")??
            .context("watch stream closed during creation")?;
        if resp.created() {
            if resp.canceled() {
                bail!("watch not created: {}", resp.cancel_reason());
            }
            return Ok(());
        }
        if resp.canceled() {
            bail!("watch canceled during creation: {}", resp.cancel_reason());
        }
    }
}

/// Tells the receiving streams that `events` were written (each waits
/// for them at most [`DRAIN_TIMEOUT`] more), then merges their recorders
/// into `recs`; the events they received in all.
pub async fn drain(
    target: &watch::Sender<Option<Target>>,
    receivers: Vec<tokio::task::JoinHandle<(Recorders, u64)>>,
    events: u64,
    recs: &mut Recorders,
) -> Result<u64> {
    let _ = target.send(Some(Target {
        events,
        deadline: Instant::now() + DRAIN_TIMEOUT,
    }));
    let mut delivered = 0;
    for r in receivers {
        let (stream_recs, n) = r.await.context("watch receiver panicked")?;
        merge_into(recs, &stream_recs);
        delivered += n;
    }
    Ok(delivered)
}

/// Receives events until the target is met; records "watch-delivery" latency per
/// event and, with `progress_every`, "watch-progress" round trips. Returns the
/// recorders and the number of deliveries (events × watchers they reached).
pub async fn receive(
    mut open: OpenStream,
    mut target: watch::Receiver<Option<Target>>,
    progress_every: Option<Duration>,
) -> (Recorders, u64) {
    let mut recs = Recorders::new();
    let mut delivered = 0u64;
    let mut progress_sent: Option<Instant> = None;
    let mut next_progress = progress_every.map(|p| Instant::now() + p);
    loop {
        if let Some(t) = *target.borrow() {
            if delivered >= t.events * open.watchers as u64 || Instant::now() >= t.deadline {
                break;
            }
        }
        if let (Some(at), None) = (next_progress, progress_sent) {
            if Instant::now() >= at {
                if let Err(e) = open.stream.request_progress().await {
                    recs.entry("watch-progress").or_default().error(e);
                }
                progress_sent = Some(Instant::now());
            }
        }
        let msg = tokio::select! {
            m = open.stream.message() => m,
            changed = target.changed() => {
                if changed.is_err() {
                    tokio::time::sleep(RECEIVE_POLL).await;
                }
                continue;
            }
            _ = tokio::time::sleep(RECEIVE_POLL) => continue,
        };
        let resp = match msg {
            Ok(Some(resp)) => resp,
            Ok(None) => {
                recs.entry("watch-delivery")
                    .or_default()
                    .error("watch stream closed");
                break;
            }
            Err(e) => {
                recs.entry("watch-delivery").or_default().error(e);
                break;
            }
        };
        if resp.canceled() {
            let reason = format!(
                "watch canceled: {} (compact rev {})",
                resp.cancel_reason(),
                resp.compact_revision()
            );
            recs.entry("watch-delivery").or_default().error(reason);
            break;
        }
        if resp.events().is_empty() && !resp.created() {
            if let Some(sent) = progress_sent.take() {
                recs.entry("watch-progress")
                    .or_default()
                    .record(sent.elapsed());
                next_progress = progress_every.map(|p| Instant::now() + p);
            }
            continue;
        }
        let rec = recs.entry("watch-delivery").or_default();
        for ev in resp.events() {
            if let Some(latency) = ev.kv().and_then(|kv| since_stamp(kv.value())) {
                rec.record(latency);
            }
            delivered += 1;
        }
    }
    (recs, delivered)
}
