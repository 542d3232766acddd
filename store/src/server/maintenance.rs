//! `etcdserverpb.Maintenance`: Status (what `etcdctl endpoint status` and
//! kube-apiserver's health and version checks read) and Alarm (what
//! `etcdctl endpoint health` and `alarm list/disarm` use). The other calls
//! (alarms, defragment, hashes, snapshot, move-leader) belong to the
//! maintenance work and answer `Unimplemented` until then.

use std::sync::Arc;

use etcd_proto::etcdserverpb::maintenance_server::Maintenance;
use etcd_proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use tonic::{Request, Response, Status};

use super::core::Core;
use crate::raft::state_machine::alarms;
use crate::raft::{Command, CommandResponse};
use etcd_proto::etcdserverpb::alarm_request::AlarmAction;

/// The etcd version this member reports. kube-apiserver enables consistent
/// reads from its watch cache only for etcd >= 3.5.13, and clients gate
/// features on it, so we report the etcd API level we implement.
pub const ETCD_COMPATIBLE_VERSION: &str = "3.5.16";

/// Serves the Maintenance API of one member.
pub struct MaintenanceService {
    core: Arc<Core>,
}

impl MaintenanceService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!("{what} is not implemented yet"))
}

type SnapshotStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(&self, r: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        let r = r.into_inner();
        let mut resp = if AlarmAction::try_from(r.action) == Ok(AlarmAction::Get) {
            self.core.read_barrier().await?;
            let alarms = alarms(self.core.mvcc.engine().as_ref())
                .map_err(|e| Status::internal(e.to_string()))?;
            AlarmResponse {
                header: None,
                alarms,
            }
        } else {
            match self.core.propose(Command::Alarm(r)).await? {
                CommandResponse::Alarm(resp) => resp,
                CommandResponse::Error(e) => return Err(e.into()),
                other => return Err(Status::internal(format!("unexpected answer {other:?}"))),
            }
        };
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn status(&self, _r: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let m = self.core.raft.metrics().borrow().clone();
        let engine = self.core.mvcc.engine();
        let is_learner = !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == self.core.config.member_id);
        Ok(Response::new(StatusResponse {
            header: Some(self.core.header(self.core.mvcc.current_revision())),
            version: ETCD_COMPATIBLE_VERSION.to_string(),
            db_size: engine.size_bytes() as i64,
            leader: m.current_leader.unwrap_or(0),
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors: Vec::new(),
            db_size_in_use: engine.size_in_use_bytes() as i64,
            is_learner,
        }))
    }

    async fn defragment(
        &self,
        _r: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        Err(not_yet("Defragment"))
    }

    async fn hash(&self, _r: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(not_yet("Hash"))
    }

    async fn hash_kv(
        &self,
        _r: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        Err(not_yet("HashKV"))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        _r: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(not_yet("Snapshot"))
    }

    async fn move_leader(
        &self,
        _r: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(not_yet("MoveLeader"))
    }

    async fn downgrade(
        &self,
        _r: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(not_yet("Downgrade"))
    }
}
