//! One Watch stream: its watchers, catch-up from storage, live delivery
//! from the hub, progress answers. See the module docs of [`super`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::watch_create_request::FilterType;
use etcd_proto::etcdserverpb::watch_request::RequestUnion;
use etcd_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use etcd_proto::mvccpb::event::EventType;
use etcd_proto::mvccpb::Event;
use prost::Message;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use crate::auth::{Access, AuthInfo};
use crate::errors::{EtcdError, WatchCancelReason};
use crate::metrics::{self, GaugeGuard};
use crate::mvcc::{KeyRange, MvccError, MvccStore, PrevKvInterest};
use crate::server::core::Core;
use crate::server::v3rpc::inbound::Inbound;
use crate::watch::hub::{HubReceiver, Lagged, RevisionEvents, WatchHub};

/// Events read from storage per catch-up step: bounds the memory and the
/// time a session spends on one step before it looks at its other work.
pub const CATCH_UP_EVENTS_PER_STEP: usize = 1_000;

/// The watch id etcd uses for stream-wide progress answers.
pub const PROGRESS_WATCH_ID: i64 = -1;

/// How many election timeouts a stream with `hasleader` may go without a
/// leader before it is cancelled (etcd: 3).
pub const NO_LEADER_ELECTION_TIMEOUTS: u32 = 3;

/// Per-stream settings.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Interval of progress notifications for watchers that asked for them.
    pub progress_interval: Duration,
    /// Responses larger than this are split for watchers that allow it.
    pub max_response_bytes: usize,
    /// The stream carried `hasleader: true`.
    pub require_leader: bool,
    /// The member's election timeout.
    pub election_timeout: Duration,
    /// The stream's credentials (or why they are invalid), checked against
    /// each watcher's range when it is created.
    pub caller: Result<AuthInfo, EtcdError>,
}

struct Watcher {
    id: i64,
    range: KeyRange,
    /// The first revision not yet delivered.
    next_rev: i64,
    /// Set if the watcher wants `prev_kv`: while held, writes read the
    /// values they replace into their events.
    prev_kv: Option<PrevKvInterest>,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    fragment: bool,
    /// Counts the watcher in `etcd_debugging_mvcc_watcher_total`.
    _counted: GaugeGuard,
}

impl Watcher {
    fn wants(&self, ev: &Event) -> bool {
        let Some(kv) = &ev.kv else { return false };
        let is_put = ev.r#type == EventType::Put as i32;
        if (is_put && self.no_put) || (!is_put && self.no_delete) {
            return false;
        }
        self.range.contains(&kv.key)
    }

    /// The event as this watcher sees it. A write applied before the
    /// watcher's interest was registered carries no `prev_kv`; it is read
    /// from history then (none if compacted, as etcd's watch stream).
    fn shape(&self, ev: &Event, mvcc: &MvccStore) -> Result<Event, End> {
        if self.prev_kv.is_none() {
            return Ok(Event {
                prev_kv: None,
                ..ev.clone()
            });
        }
        let mut ev = ev.clone();
        let kv = ev.kv.as_ref().expect("wanted events have a key-value");
        let replaced = ev.r#type == EventType::Delete as i32 || kv.version > 1;
        if ev.prev_kv.is_none() && replaced {
            ev.prev_kv = mvcc
                .prev_kv(&kv.key, kv.mod_revision)
                .map_err(|e| End::Fail(e.into()))?;
        }
        Ok(ev)
    }
}

/// Why a session ended.
enum End {
    /// The client closed the stream or stopped reading.
    ClientGone,
    /// The session fails the stream with this status.
    Fail(Status),
}

type Out = mpsc::Sender<Result<WatchResponse, Status>>;

/// Runs a session until the client goes away or the stream fails.
pub async fn run(
    core: Arc<Core>,
    hub: Arc<WatchHub>,
    requests: Streaming<WatchRequest>,
    out: Out,
    config: SessionConfig,
) {
    let _stream = GaugeGuard::new(&metrics::global().mvcc.watch_streams);
    let hub_rx = hub.subscribe();
    let processed = core.mvcc.current_revision();
    let mut session = Session {
        core,
        hub_rx,
        out: out.clone(),
        watchers: BTreeMap::new(),
        next_auto_id: 0,
        processed,
        config,
    };
    if let Err(End::Fail(status)) = session.serve(Inbound::new(requests)).await {
        let _ = out.send(Err(status)).await;
    }
}

struct Session {
    core: Arc<Core>,
    hub_rx: HubReceiver,
    out: Out,
    watchers: BTreeMap<i64, Watcher>,
    next_auto_id: i64,
    /// Every event up to this revision was delivered to every watcher.
    processed: i64,
    config: SessionConfig,
}

impl Session {
    async fn serve(&mut self, mut requests: Inbound<WatchRequest>) -> Result<(), End> {
        let mut progress = tokio::time::interval_at(
            Instant::now() + self.config.progress_interval,
            self.config.progress_interval,
        );
        let mut leader_check = tokio::time::interval(self.config.election_timeout);
        let mut no_leader_since: Option<Instant> = None;
        // A client that half-closes its side (no more requests) still gets
        // its events, as from etcd, until it cancels the stream.
        let mut requests_open = true;
        let out = self.out.clone();
        loop {
            tokio::select! {
                msg = requests.message(), if requests_open => match msg {
                    Ok(Some(req)) => requests.while_reading(self.handle(req)).await?,
                    Ok(None) => requests_open = false,
                    // etcd ends the stream with the receive error (a message
                    // that does not parse), worded as grpc-go's.
                    Err(status) => return Err(End::Fail(etcd_proto::codec::stream_status(status))),
                },
                _ = out.closed() => return Err(End::ClientGone),
                batch = self.hub_rx.recv() => match batch {
                    Ok(b) => requests.while_reading(self.deliver(&b)).await?,
                    Err(Lagged(_)) => requests.while_reading(self.resync()).await?,
                },
                _ = progress.tick() => requests.while_reading(self.periodic_progress()).await?,
                _ = leader_check.tick(), if self.config.require_leader => {
                    self.check_leader(&mut no_leader_since)?;
                }
            }
        }
    }

    fn check_leader(&self, since: &mut Option<Instant>) -> Result<(), End> {
        if self.core.leader().is_some() {
            *since = None;
            return Ok(());
        }
        let start = *since.get_or_insert_with(Instant::now);
        if start.elapsed() >= self.config.election_timeout * NO_LEADER_ELECTION_TIMEOUTS {
            return Err(End::Fail(EtcdError::NoLeader.into()));
        }
        Ok(())
    }

    async fn send(&self, resp: WatchResponse) -> Result<(), End> {
        self.out.send(Ok(resp)).await.map_err(|_| End::ClientGone)
    }

    fn response(&self, watch_id: i64, revision: i64) -> WatchResponse {
        WatchResponse {
            header: Some(self.core.header(revision)),
            watch_id,
            ..Default::default()
        }
    }

    async fn handle(&mut self, req: WatchRequest) -> Result<(), End> {
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) => {
                if self.watchers.remove(&c.watch_id).is_some() {
                    let mut resp = self.response(c.watch_id, self.core.mvcc.current_revision());
                    resp.canceled = true;
                    self.send(resp).await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => self.progress_request().await,
            None => Ok(()),
        }
    }

    async fn create(&mut self, c: WatchCreateRequest) -> Result<(), End> {
        let current = self.core.mvcc.current_revision();
        let key = if c.key.is_empty() {
            vec![0]
        } else {
            c.key.clone()
        };
        if let Err(e) = self.permitted(&key, &c.range_end) {
            // etcd answers a refused watch with the id the request asked for.
            let mut resp = self.response(c.watch_id, current);
            resp.created = true;
            resp.canceled = true;
            resp.cancel_reason = e.grpc_error_text();
            return self.send(resp).await;
        }
        let cancel_reason = if !c.range_end.is_empty() && c.range_end != [0] && key >= c.range_end {
            Some(WatchCancelReason::EmptyRange)
        } else if c.watch_id != 0 && self.watchers.contains_key(&c.watch_id) {
            Some(WatchCancelReason::DuplicateId)
        } else {
            None
        };
        if let Some(reason) = cancel_reason {
            let mut resp = self.response(-1, current);
            resp.created = true;
            resp.canceled = true;
            resp.cancel_reason = reason.to_string();
            return self.send(resp).await;
        }
        let id = if c.watch_id != 0 {
            c.watch_id
        } else {
            self.auto_id()
        };
        let start = if c.start_revision == 0 {
            current + 1
        } else {
            c.start_revision
        };
        let filters: Vec<i32> = c.filters.clone();
        let watcher = Watcher {
            id,
            range: KeyRange::new(&key, &c.range_end),
            next_rev: start,
            prev_kv: c.prev_kv.then(|| self.core.mvcc.watch_prev_kv()),
            no_put: filters.contains(&(FilterType::Noput as i32)),
            no_delete: filters.contains(&(FilterType::Nodelete as i32)),
            progress_notify: c.progress_notify,
            fragment: c.fragment,
            _counted: GaugeGuard::new(&metrics::global().mvcc.watchers),
        };
        let mut created = self.response(id, current);
        created.created = true;
        self.send(created).await?;
        self.watchers.insert(id, watcher);
        if start <= self.processed {
            self.catch_up(id, self.processed).await?;
        }
        Ok(())
    }

    /// etcd's `isWatchPermitted`: read access to the watched range. An
    /// invalid token, no user or a stale revision are all refused.
    fn permitted(&self, key: &[u8], range_end: &[u8]) -> Result<(), EtcdError> {
        let info = self.config.caller.as_ref().map_err(|e| *e)?;
        self.core
            .auth
            .state()
            .check_keys(info, Access::Read, key, range_end)
    }

    fn auto_id(&mut self) -> i64 {
        while self.watchers.contains_key(&self.next_auto_id) {
            self.next_auto_id += 1;
        }
        let id = self.next_auto_id;
        self.next_auto_id += 1;
        id
    }

    /// Delivers history from storage to watcher `id` up to revision `to`.
    async fn catch_up(&mut self, id: i64, to: i64) -> Result<(), End> {
        loop {
            let Some(w) = self.watchers.get(&id) else {
                return Ok(());
            };
            if w.next_rev > to {
                return Ok(());
            }
            let from = w.next_rev;
            let (events, last) =
                match self
                    .core
                    .mvcc
                    .events_between(from, to, CATCH_UP_EVENTS_PER_STEP)
                {
                    Ok(r) => r,
                    Err(MvccError::Compacted) => return self.cancel_compacted(id).await,
                    Err(MvccError::FutureRev) => return Ok(()),
                    Err(e @ MvccError::Engine(_)) => return Err(End::Fail(e.into())),
                };
            let w = self.watchers.get_mut(&id).expect("checked above");
            w.next_rev = last + 1;
            let w = self.watchers.get(&id).expect("checked above");
            let mine = events
                .iter()
                .filter(|e| w.wants(e))
                .map(|e| w.shape(e, &self.core.mvcc))
                .collect::<Result<Vec<Event>, End>>()?;
            if !mine.is_empty() {
                self.send_events(id, mine, last).await?;
            }
        }
    }

    async fn cancel_compacted(&mut self, id: i64) -> Result<(), End> {
        self.watchers.remove(&id);
        // etcd sends the compacted cancel without a header revision.
        let mut resp = self.response(id, 0);
        resp.compact_revision = self.core.mvcc.compact_revision();
        resp.canceled = true;
        self.send(resp).await
    }

    /// Sends `events` to watcher `id`, split into fragments if it allows
    /// and the response would reach the size limit (etcd's
    /// `sendFragments`: a fragment grows while it stays under the limit,
    /// and always holds at least one event).
    async fn send_events(&self, id: i64, events: Vec<Event>, revision: i64) -> Result<(), End> {
        let fragment = self.watchers.get(&id).is_some_and(|w| w.fragment);
        let mut resp = self.response(id, revision);
        resp.events = events;
        let limit = self.config.max_response_bytes;
        if !fragment || resp.events.len() < 2 || resp.encoded_len() < limit {
            return self.send(resp).await;
        }
        let events = std::mem::take(&mut resp.events);
        resp.fragment = true;
        let mut rest = events.into_iter().peekable();
        while rest.peek().is_some() {
            let mut part = resp.clone();
            while let Some(ev) = rest.peek() {
                part.events.push(ev.clone());
                if part.events.len() > 1 && part.encoded_len() >= limit {
                    part.events.pop();
                    break;
                }
                rest.next();
            }
            part.fragment = rest.peek().is_some();
            self.send(part).await?;
        }
        Ok(())
    }

    /// Live delivery of one applied revision to synced watchers.
    async fn deliver(&mut self, batch: &RevisionEvents) -> Result<(), End> {
        if batch.revision <= self.processed {
            return Ok(());
        }
        if batch.revision > self.processed + 1 {
            // Revisions are published one by one, so a gap means this member
            // installed a snapshot: take the skipped history from storage.
            let ids: Vec<i64> = self.watchers.keys().copied().collect();
            for id in ids {
                self.catch_up(id, batch.revision - 1).await?;
            }
        }
        let ids: Vec<i64> = self.watchers.keys().copied().collect();
        for id in ids {
            let Some(w) = self.watchers.get_mut(&id) else {
                continue;
            };
            if w.next_rev > batch.revision {
                continue;
            }
            w.next_rev = batch.revision + 1;
            let mine = batch
                .events
                .iter()
                .filter(|e| w.wants(e))
                .map(|e| w.shape(e, &self.core.mvcc))
                .collect::<Result<Vec<Event>, End>>()?;
            if !mine.is_empty() {
                self.send_events(id, mine, batch.revision).await?;
            }
        }
        self.processed = batch.revision;
        Ok(())
    }

    /// After falling out of the ring: everyone catches up from storage.
    async fn resync(&mut self) -> Result<(), End> {
        let target = self.core.mvcc.current_revision();
        let ids: Vec<i64> = self.watchers.keys().copied().collect();
        for id in ids {
            self.catch_up(id, target).await?;
        }
        self.processed = self.processed.max(target);
        Ok(())
    }

    /// Takes in every revision already published, so a progress answer is
    /// as fresh as possible without announcing undelivered events.
    async fn drain_hub(&mut self) -> Result<(), End> {
        loop {
            match self.hub_rx.try_recv() {
                Ok(Some(b)) => self.deliver(&b).await?,
                Ok(None) => return Ok(()),
                Err(Lagged(_)) => self.resync().await?,
            }
        }
    }

    async fn progress_request(&mut self) -> Result<(), End> {
        self.drain_hub().await?;
        let synced = self.watchers.values().all(|w| w.next_rev > self.processed);
        if synced {
            self.send(self.response(PROGRESS_WATCH_ID, self.processed))
                .await?;
        }
        Ok(())
    }

    async fn periodic_progress(&mut self) -> Result<(), End> {
        self.drain_hub().await?;
        let ids: Vec<i64> = self
            .watchers
            .values()
            .filter(|w| w.progress_notify && w.next_rev > self.processed)
            .map(|w| w.id)
            .collect();
        for id in ids {
            self.send(self.response(id, self.processed)).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::MemoryEngine;
    use crate::engine::WriteBatch;
    use crate::mvcc::Prev;

    fn watcher(prev_kv: Option<PrevKvInterest>) -> Watcher {
        Watcher {
            id: 1,
            range: KeyRange::new(b"k", b"\0"),
            next_rev: 1,
            prev_kv,
            no_put: false,
            no_delete: false,
            progress_notify: false,
            fragment: false,
            _counted: GaugeGuard::new(&metrics::global().mvcc.watchers),
        }
    }

    fn commit(mvcc: &MvccStore, f: impl FnOnce(&mut crate::mvcc::WriteTxn<'_>)) -> Vec<Event> {
        let mut txn = mvcc.write();
        f(&mut txn);
        txn.commit(WriteBatch::new()).unwrap().1
    }

    /// Events applied before a prev_kv watcher registered carry no prev_kv;
    /// the watcher reads it from history, and a watcher without prev_kv
    /// never sees one.
    #[test]
    fn prev_kv_is_filled_in_for_events_written_before_the_interest() {
        let mvcc = MvccStore::open(Arc::new(MemoryEngine::new())).unwrap();
        let put = |v: &str| {
            commit(&mvcc, |t| {
                t.put(b"k1", v.into(), 0, Prev::Unread).unwrap();
            })
        };
        let created = put("a");
        let replaced = put("b");
        let deleted = commit(&mvcc, |t| {
            t.delete_range(&KeyRange::Single(b"k1".to_vec()), false)
                .unwrap();
        });
        for ev in created.iter().chain(&replaced).chain(&deleted) {
            assert_eq!(ev.prev_kv, None, "no interest when written");
        }
        let with = watcher(Some(mvcc.watch_prev_kv()));
        let without = watcher(None);
        let shaped = |w: &Watcher, evs: &[Event]| w.shape(&evs[0], &mvcc).ok().unwrap();
        assert_eq!(shaped(&with, &created).prev_kv, None, "a creation");
        assert_eq!(shaped(&with, &replaced).prev_kv.unwrap().value, b"a");
        assert_eq!(shaped(&with, &deleted).prev_kv.unwrap().value, b"b");
        let now = put("c");
        assert_eq!(now[0].prev_kv, None, "deleted before");
        let again = put("d");
        assert_eq!(
            again[0].prev_kv.as_ref().unwrap().value,
            b"c",
            "read eagerly now"
        );
        assert_eq!(shaped(&with, &again).prev_kv.unwrap().value, b"c");
        assert_eq!(shaped(&without, &again).prev_kv, None);
        drop(with);
        assert_eq!(put("e")[0].prev_kv, None, "interest ended");
    }
}
