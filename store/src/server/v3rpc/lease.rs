//! `etcdserverpb.Lease` and the leader's lease duties.
//!
//! Grant and Revoke go through Raft. KeepAlive and TimeToLive need the
//! leader's deadlines, so a follower forwards them to the leader over the
//! peer protocol (as etcd forwards them over HTTP). Leases lists the local
//! lease table.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;
use std::time::Duration;

use etcd_proto::etcdserverpb::lease_server::Lease;
use etcd_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use openraft::ServerState;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::errors::EtcdError;
use crate::lease::{Lessor, MAX_LEASE_TTL_SECONDS};
use crate::server::core::Core;
use crate::server::v3rpc::inbound::Inbound;

/// How often the leader looks for expired leases (etcd: 500 ms).
pub const EXPIRY_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Most leases revoked per check; etcd rate-limits revocations the same way
/// so a mass expiry does not flood Raft.
pub const MAX_REVOKES_PER_CHECK: usize = 500;

/// KeepAlive answers queued per stream before the server waits for the
/// client to read.
pub const KEEPALIVE_OUTPUT_QUEUE: usize = 16;

/// etcd's `leaseOverhead`: bytes a lease grant is charged against the quota.
pub const LEASE_OVERHEAD_BYTES: u64 = 64;

/// Serves the Lease API of one member.
pub struct LeaseService {
    core: Arc<Core>,
}

impl LeaseService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

fn lessor(core: &Core) -> &Lessor {
    &core.lessor
}

async fn keep_alive_once(core: &Core, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
    let ttl = core.renew_lease(id).await?.unwrap_or(0);
    Ok(LeaseKeepAliveResponse {
        header: core.current_header(),
        id,
        ttl,
    })
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let by = self.core.caller(&req).await?;
        let req = req.into_inner();
        if req.ttl > MAX_LEASE_TTL_SECONDS {
            return Err(EtcdError::LeaseTtlTooLarge.into());
        }
        let id = if req.id == 0 {
            random_lease_id()
        } else {
            req.id
        };
        let ttl = lessor(&self.core).effective_ttl(req.ttl);
        self.core.check_quota(LEASE_OVERHEAD_BYTES).await?;
        let grant = LeaseGrantRequest { ttl, id };
        let mut resp = self.core.lease_grant(by, grant).await?;
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn lease_revoke(
        &self,
        req: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let by = self.core.caller(&req).await?;
        let mut resp = self.core.lease_revoke(by, req.into_inner()).await?;
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    type LeaseKeepAliveStream = ReceiverStream<Result<LeaseKeepAliveResponse, Status>>;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let mut requests = Inbound::new(req.into_inner());
        let (tx, rx) = mpsc::channel(KEEPALIVE_OUTPUT_QUEUE);
        let core = self.core.clone();
        tokio::spawn(async move {
            loop {
                let answer = match requests.message().await {
                    Ok(Some(r)) => requests.while_reading(keep_alive_once(&core, r.id)).await,
                    Ok(None) => return,
                    // etcd ends the stream with the receive error (a message
                    // that does not parse), worded as grpc-go's.
                    Err(status) => Err(etcd_proto::codec::stream_status(status)),
                };
                let failed = answer.is_err();
                if requests.while_reading(tx.send(answer)).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let req = req.into_inner();
        let found = self.core.lease_time_to_live(req.id).await?;
        let header = self.core.current_header();
        let resp = match found {
            Some(lease) => LeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl: lease.remaining_seconds,
                granted_ttl: lease.granted_ttl_seconds,
                keys: if req.keys { lease.keys } else { Vec::new() },
            },
            None => LeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl: -1,
                ..Default::default()
            },
        };
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        _req: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let leases = lessor(&self.core)
            .ids()
            .into_iter()
            .map(|id| LeaseStatus { id })
            .collect();
        Ok(Response::new(LeaseLeasesResponse {
            header: self.core.current_header(),
            leases,
        }))
    }
}

/// A positive, non-zero lease id chosen by the proposing member.
fn random_lease_id() -> i64 {
    loop {
        let id = rand::random::<i64>() & i64::MAX;
        if id != 0 {
            return id;
        }
    }
}

/// Starts the leader duties: follow leadership (promote/demote the lessor)
/// and revoke expired leases while leader. Ends when `stop` fires.
pub fn spawn_lease_tasks(
    core: Arc<Core>,
    election_timeout: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let leader_core = core.clone();
    let mut leader_stop = stop.clone();
    tokio::spawn(async move {
        // Server metrics: they change with elections, not with every write.
        let mut metrics = leader_core.raft.server_metrics();
        loop {
            let leading = metrics.borrow_watched().state == ServerState::Leader;
            if leading && !leader_core.lessor.is_primary() {
                leader_core.lessor.promote(election_timeout);
            } else if !leading && leader_core.lessor.is_primary() {
                leader_core.lessor.demote();
            }
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = leader_stop.changed() => return,
            }
        }
    });
    let mut expiry_stop = stop;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXPIRY_CHECK_INTERVAL);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = expiry_stop.changed() => return,
            }
            if !core.lessor.is_primary() || core.lessor.expired(1).is_empty() {
                continue;
            }
            // Only a leader the quorum still follows revokes, and only
            // leases expired by its deadlines as they stand after that
            // confirmation (etcd 3.5.13's `revokeExpiredLeases`).
            if let Err(e) = core.confirm_leadership().await {
                tracing::info!(error = ?e, "not revoking expired leases: leadership not confirmed");
                continue;
            }
            for id in core.lessor.expired(MAX_REVOKES_PER_CHECK) {
                match core.revoke_expired_lease(id).await {
                    Ok(()) => tracing::debug!(lease = id, "revoked expired lease"),
                    Err(e) => {
                        tracing::warn!(lease = id, error = ?e, "could not revoke expired lease");
                        break;
                    }
                }
            }
        }
    });
}
