//! `etcdserverpb.Watch`: one session task per stream.

use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::watch_server::Watch;
use etcd_proto::etcdserverpb::{WatchRequest, WatchResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::hub::WatchHub;
use super::session::{self, SessionConfig};
use crate::errors::EtcdError;
use crate::limits::GRPC_OVERHEAD_BYTES;
use crate::server::core::Core;

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
