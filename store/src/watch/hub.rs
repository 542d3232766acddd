//! The ring of applied events, bounded in revisions and in bytes.
//!
//! The state machine publishes each applied revision's events (with their
//! values and `prev_kv`s) once; every Watch stream reads them through its
//! own [`HubReceiver`], a position in the ring. The ring keeps the newest
//! revisions, at most [`WATCH_RING_REVISIONS`] of them and at most
//! [`WATCH_RING_BYTES`] of event data (always the newest one, whatever its
//! size). A stream that falls behind the oldest kept revision is told it
//! lagged, jumps to the oldest kept one and catches up from storage
//! instead. So the memory held for slow watchers is bounded in total, not
//! per watcher, and large values cannot make it grow with the revision
//! count (4,096 revisions of 1 MiB values held 4 GiB when the ring counted
//! revisions only).
//!
//! Readers wait on a [`Notify`]: a publish wakes every waiting reader, as
//! a broadcast channel does. Receiving is cancel-safe: a reader's position
//! moves only when it returns an item.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use etcd_proto::mvccpb::Event;
use prost::Message;
use tokio::sync::Notify;

/// Applied revisions kept in the ring for synced watchers. A stream that
/// falls further behind catches up from storage instead.
pub const WATCH_RING_REVISIONS: usize = 4_096;

/// Event bytes (encoded events: keys, values, previous values) kept in the
/// ring, at most: 64 MiB, room for 4,096 revisions of 16 KiB events.
pub const WATCH_RING_BYTES: usize = 64 * 1024 * 1024;

/// The events of one applied revision.
#[derive(Debug, Clone)]
pub struct RevisionEvents {
    /// The store revision the events created.
    pub revision: i64,
    /// The events, each with its prev_kv.
    pub events: Arc<Vec<Event>>,
}

/// A reader fell behind the ring: this many revisions were dropped before
/// it read them; it now reads from the oldest kept one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagged(pub u64);

struct Kept {
    events: RevisionEvents,
    bytes: usize,
}

#[derive(Default)]
struct Ring {
    kept: VecDeque<Kept>,
    /// Sequence number of `kept`'s front.
    first: u64,
    bytes: usize,
}

impl Ring {
    fn next(&self) -> u64 {
        self.first + self.kept.len() as u64
    }

    fn push(&mut self, events: RevisionEvents, bytes: usize) {
        self.kept.push_back(Kept { events, bytes });
        self.bytes += bytes;
        while self.kept.len() > 1
            && (self.kept.len() > WATCH_RING_REVISIONS || self.bytes > WATCH_RING_BYTES)
        {
            let dropped = self.kept.pop_front().expect("more than one kept");
            self.bytes -= dropped.bytes;
            self.first += 1;
        }
    }
}

/// Fans applied events out to watch sessions.
#[derive(Default)]
pub struct WatchHub {
    ring: Mutex<Ring>,
    published: Notify,
}

impl WatchHub {
    /// A hub with no subscriber.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        self.ring
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes a revision's events (called by the state machine after the
    /// revision is committed to the engine, in revision order).
    pub fn publish(&self, revision: i64, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let bytes: usize = events.iter().map(Message::encoded_len).sum();
        let events = RevisionEvents {
            revision,
            events: Arc::new(events),
        };
        self.ring().push(events, bytes);
        self.published.notify_waiters();
    }

    /// A reader of the revisions published from now on.
    pub fn subscribe(self: &Arc<Self>) -> HubReceiver {
        let next = self.ring().next();
        HubReceiver {
            hub: self.clone(),
            next,
        }
    }
}

/// One stream's position in the ring.
pub struct HubReceiver {
    hub: Arc<WatchHub>,
    /// Sequence number of the next revision to read.
    next: u64,
}

impl HubReceiver {
    /// The next revision, if one is published already.
    pub fn try_recv(&mut self) -> Result<Option<RevisionEvents>, Lagged> {
        let ring = self.hub.ring();
        if self.next < ring.first {
            let dropped = ring.first - self.next;
            self.next = ring.first;
            return Err(Lagged(dropped));
        }
        let Some(kept) = ring.kept.get((self.next - ring.first) as usize) else {
            return Ok(None);
        };
        self.next += 1;
        Ok(Some(kept.events.clone()))
    }

    /// The next revision, waiting for it to be published.
    pub async fn recv(&mut self) -> Result<RevisionEvents, Lagged> {
        let hub = self.hub.clone();
        loop {
            let published = hub.published.notified();
            tokio::pin!(published);
            // Registered before looking, so a publish in between wakes us.
            published.as_mut().enable();
            if let Some(events) = self.try_recv()? {
                return Ok(events);
            }
            published.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_proto::mvccpb::KeyValue;

    fn event(value_bytes: usize) -> Vec<Event> {
        vec![Event {
            kv: Some(KeyValue {
                key: b"k".to_vec(),
                value: vec![0; value_bytes],
                ..Default::default()
            }),
            ..Default::default()
        }]
    }

    #[tokio::test]
    async fn readers_get_every_revision_in_order() {
        let hub = WatchHub::new();
        let mut early = hub.subscribe();
        hub.publish(1, event(1));
        let mut late = hub.subscribe();
        hub.publish(2, event(1));
        assert_eq!(early.recv().await.unwrap().revision, 1);
        assert_eq!(early.recv().await.unwrap().revision, 2);
        assert_eq!(late.recv().await.unwrap().revision, 2);
        assert!(early.try_recv().unwrap().is_none());
        hub.publish(3, Vec::new());
        assert!(
            early.try_recv().unwrap().is_none(),
            "no events, nothing kept"
        );
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_on_publish() {
        let hub = WatchHub::new();
        let mut rx = hub.subscribe();
        let waiting = tokio::spawn(async move { rx.recv().await.map(|e| e.revision) });
        tokio::task::yield_now().await;
        hub.publish(7, event(1));
        assert_eq!(waiting.await.unwrap(), Ok(7));
    }

    #[test]
    fn the_ring_keeps_at_most_its_revisions() {
        let hub = WatchHub::new();
        let mut rx = hub.subscribe();
        let extra = 10;
        for rev in 0..(WATCH_RING_REVISIONS + extra) as i64 {
            hub.publish(rev + 1, event(1));
        }
        assert_eq!(rx.try_recv().unwrap_err(), Lagged(extra as u64));
        assert_eq!(rx.try_recv().unwrap().unwrap().revision, extra as i64 + 1);
    }

    #[test]
    fn the_ring_keeps_at_most_its_bytes_but_always_the_newest() {
        let hub = WatchHub::new();
        let mut rx = hub.subscribe();
        let value = 1024 * 1024;
        let fit = WATCH_RING_BYTES / value;
        for rev in 0..(fit + 5) as i64 {
            hub.publish(rev + 1, event(value));
        }
        let Err(Lagged(dropped)) = rx.try_recv() else {
            panic!("the reader lags");
        };
        assert!(dropped >= 5, "dropped {dropped}");
        assert!(hub.ring().bytes <= WATCH_RING_BYTES);
        let huge = hub.subscribe();
        hub.publish(1_000, event(WATCH_RING_BYTES + 1));
        let mut huge = huge;
        assert_eq!(huge.try_recv().unwrap().unwrap().revision, 1_000);
        assert_eq!(hub.ring().kept.len(), 1);
    }
}
