//! Watch: etcd's event streams, served by every member from its own
//! applied state.
//!
//! The state machine publishes each applied revision's events to the
//! [`hub::WatchHub`], a bounded broadcast ring shared by all streams. Each
//! gRPC Watch stream runs one [`session`] task that owns its watchers:
//!
//! - A watcher whose next revision is in the past *catches up from storage*
//!   (`MvccStore::events_between`, in bounded chunks), then is *synced*:
//!   it takes events from the broadcast ring as they are published.
//! - A slow client never blocks writes or other streams: the session waits on
//!   its bounded output queue, stops reading the ring, and when the ring has
//!   moved past it (`Lagged`) every watcher falls back to catching up from
//!   storage. Memory is bounded by the ring plus one output queue per stream.
//! - The session tracks `processed`: every event up to that revision has
//!   been delivered to every watcher. Progress answers (RequestProgress and
//!   progress_notify) announce exactly that revision, so a progress
//!   revision is never ahead of delivered events.
//!
//! etcd's observable behaviour is kept: server-chosen ids from 0 or
//! client-chosen ids (duplicates refused), Created answers in request order
//! before any event, compacted starts answered with Created and then
//! `{compact_revision, canceled}`, filters, prev_kv, fragmentation, and the
//! `hasleader` stream metadata.

pub mod hub;
pub mod service;
pub mod session;

pub use hub::WatchHub;
pub use service::WatchService;
