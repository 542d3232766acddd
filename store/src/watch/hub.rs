//! The broadcast ring of applied events.

use std::sync::Arc;

use etcd_proto::mvccpb::Event;
use tokio::sync::broadcast;

/// Applied revisions kept in the ring for synced watchers. A stream that
/// falls further behind catches up from storage instead; this bounds the
/// memory held for slow watchers to this many revisions in total, not per
/// watcher.
pub const WATCH_RING_REVISIONS: usize = 4_096;

/// The events of one applied revision.
#[derive(Debug, Clone)]
pub struct RevisionEvents {
    /// The store revision the events created.
    pub revision: i64,
    /// The events, each with its prev_kv.
    pub events: Arc<Vec<Event>>,
}

/// Fans applied events out to watch sessions.
pub struct WatchHub {
    tx: broadcast::Sender<RevisionEvents>,
}

impl Default for WatchHub {
    fn default() -> Self {
        let (tx, _) = broadcast::channel(WATCH_RING_REVISIONS);
        Self { tx }
    }
}

impl WatchHub {
    /// A hub with no subscriber.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Publishes a revision's events (called by the state machine after the
    /// revision is committed to the engine, in revision order).
    pub fn publish(&self, revision: i64, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        // No receiver is not an error: nobody is watching.
        let _ = self.tx.send(RevisionEvents {
            revision,
            events: Arc::new(events),
        });
    }

    /// Subscribes to revisions published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RevisionEvents> {
        self.tx.subscribe()
    }
}
