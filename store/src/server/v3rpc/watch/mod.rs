//! `etcdserverpb.Watch`: etcd's event streams, served by every member from
//! its own applied state.
//!
//! The state machine publishes each applied revision's events to the
//! [`WatchHub`], a ring bounded in revisions and bytes, shared by all
//! streams. Each
//! gRPC Watch stream runs one [`session`] task that owns its watchers:
//!
//! - A watcher whose next revision is in the past *catches up from storage*
//!   (`MvccStore::events_between`, in bounded chunks), then is *synced*:
//!   it takes events from the broadcast ring as they are published.
//! - A slow client never blocks writes or other streams: the session waits on
//!   its bounded output queue, stops reading the ring, and when the ring has
//!   moved past it (`Lagged`) every watcher falls back to catching up from
//!   storage. Memory is bounded by the ring plus one output queue per stream.
//! - While the session works (an answer waiting for room in its output
//!   queue), the stream's next requests are read ahead ([`super::inbound`]),
//!   so a client that sends many small requests in a burst does not leave h2
//!   holding more unread frames than it allows.
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

use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::watch_server::Watch;
use etcd_proto::etcdserverpb::{WatchRequest, WatchResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub mod session;

use self::session::SessionConfig;
use crate::errors::EtcdError;
use crate::limits::GRPC_OVERHEAD_BYTES;
use crate::server::core::Core;
use crate::watch::WatchHub;

/// Responses queued per stream before the session waits for the client;
/// with the hub's ring this bounds a slow client's memory.
pub const STREAM_OUTPUT_QUEUE: usize = 128;

/// etcd's default `--experimental-watch-progress-notify-interval`.
pub const DEFAULT_PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(600);

/// Serves the Watch API of one member.
pub struct WatchService {
    core: Arc<Core>,
    hub: Arc<WatchHub>,
    progress_interval: Duration,
    election_timeout: Duration,
}

impl WatchService {
    /// A service over `core` fed by `hub`.
    pub fn new(
        core: Arc<Core>,
        hub: Arc<WatchHub>,
        progress_interval: Duration,
        election_timeout: Duration,
    ) -> Self {
        Self {
            core,
            hub,
            progress_interval,
            election_timeout,
        }
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = ReceiverStream<Result<WatchResponse, Status>>;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let require_leader = request
            .metadata()
            .get("hasleader")
            .is_some_and(|v| v == "true");
        if require_leader && self.core.leader().is_none() {
            return Err(EtcdError::NoLeader.into());
        }
        let caller = self.core.caller(&request).await;
        let (tx, rx) = mpsc::channel(STREAM_OUTPUT_QUEUE);
        let config = SessionConfig {
            caller,
            progress_interval: self.progress_interval,
            max_response_bytes: self.core.config.max_request_bytes + GRPC_OVERHEAD_BYTES,
            require_leader,
            election_timeout: self.election_timeout,
        };
        tokio::spawn(session::run(
            self.core.clone(),
            self.hub.clone(),
            request.into_inner(),
            tx,
            config,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
