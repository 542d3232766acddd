//! `etcdserverpb.Maintenance`: Status (what `etcdctl endpoint status` and
//! kube-apiserver's health and version checks read) and Alarm (what
//! `etcdctl endpoint health` and `alarm list/disarm` use), Defragment, Hash,
//! HashKV, Snapshot and MoveLeader (leadership transfer, in
//! [`crate::server::peer::transfer`]). Downgrade answers `Unimplemented`.

use openraft::async_runtime::WatchReceiver as _;
use std::sync::Arc;

use etcd_proto::etcdserverpb::maintenance_server::Maintenance;
use etcd_proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use tonic::{Request, Response, Status};

use crate::alarm::alarms;
use crate::errors::EtcdError;
use crate::server::core::status::task_failed;
use crate::server::core::Core;
use crate::server::duties::versions;
use crate::version::STORAGE_VERSION;
use etcd_proto::etcdserverpb::alarm_request::AlarmAction;
use etcd_proto::etcdserverpb::downgrade_request::DowngradeAction;
use etcd_proto::etcdserverpb::DowngradeInfo;

/// Bytes per Snapshot response message (etcd sends 32 KiB chunks).
pub const SNAPSHOT_STREAM_CHUNK_BYTES: usize = 32 * 1024;

/// Serves the Maintenance API of one member.
pub struct MaintenanceService {
    core: Arc<Core>,
}

impl MaintenanceService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// etcd 3.5's `authMaintenanceServer.isAuthenticated`: root only once
    /// auth is enabled, failing with the raw `auth:` error (code Unknown).
    async fn require_root<T>(&self, r: &Request<T>) -> Result<(), Status> {
        self.core
            .check_admin(r)
            .await
            .map_err(|e| Status::from(e.raw_auth()))
    }
}

/// Chunks read ahead of the client while streaming a snapshot.
const SNAPSHOT_STREAM_QUEUE: usize = 4;

/// Sends `file` (`total` bytes) as etcd does: 32 KiB chunks with the
/// remaining byte count, then the SHA-256 of everything sent, none with a
/// response header (etcd's carry none). Stops when the client goes away;
/// the file is closed (and so deleted) on return.
fn stream_file(
    mut file: std::fs::File,
    total: u64,
    tx: tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
) {
    use sha2::Digest;
    use std::io::Read;
    let mut hasher = sha2::Sha256::new();
    let mut sent = 0u64;
    while sent < total {
        let want = SNAPSHOT_STREAM_CHUNK_BYTES.min((total - sent) as usize);
        let mut blob = vec![0u8; want];
        if let Err(e) = file.read_exact(&mut blob) {
            let _ = tx.blocking_send(Err(Status::internal(format!("reading the snapshot: {e}"))));
            return;
        }
        hasher.update(&blob);
        sent += want as u64;
        let msg = SnapshotResponse {
            header: None,
            remaining_bytes: total - sent,
            blob,
            version: STORAGE_VERSION.to_string(),
        };
        if tx.blocking_send(Ok(msg)).is_err() {
            return;
        }
    }
    let _ = tx.blocking_send(Ok(SnapshotResponse {
        header: None,
        remaining_bytes: 0,
        blob: hasher.finalize().to_vec(),
        version: STORAGE_VERSION.to_string(),
    }));
}

type SnapshotStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(&self, r: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        let r = r.into_inner();
        let mut resp = if AlarmAction::try_from(r.action) == Ok(AlarmAction::Get) {
            self.core.read_barrier().await?;
            let alarms = alarms(self.core.mvcc.engine().as_ref())?;
            AlarmResponse {
                header: None,
                alarms,
            }
        } else {
            self.core.alarm(r).await?
        };
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn status(&self, _r: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let m = self.core.raft.metrics().borrow_watched().clone();
        let engine = self.core.mvcc.engine();
        let cluster = self.core.cluster.get();
        let is_learner = !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == self.core.config.member_id);
        Ok(Response::new(StatusResponse {
            header: self.core.current_header(),
            // kube-apiserver enables consistent reads from its watch cache
            // only for etcd >= 3.5.13, and clients gate features on it.
            version: crate::cluster_version::server_version_text().to_string(),
            db_size: engine.size_bytes() as i64,
            leader: m.current_leader.unwrap_or(0),
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors: alarms(engine.as_ref())
                .unwrap_or_default()
                .iter()
                .map(|a| {
                    let name = etcd_proto::etcdserverpb::AlarmType::try_from(a.alarm)
                        .map(|t| t.as_str_name().to_string())
                        .unwrap_or_else(|_| a.alarm.to_string());
                    format!("memberID:{} alarm:{} ", a.member_id, name)
                })
                .collect(),
            db_size_in_use: engine.size_in_use_bytes() as i64,
            is_learner,
            storage_version: cluster
                .storage_version()
                .map(|v| v.to_string())
                .unwrap_or_default(),
            db_size_quota: i64::try_from(self.core.config.quota_bytes).unwrap_or(i64::MAX),
            // etcd answers a downgrade state even when none is in progress.
            downgrade_info: Some(DowngradeInfo {
                enabled: cluster.downgrade.enabled,
                target_version: cluster.downgrade.target_version,
            }),
        }))
    }

    async fn defragment(
        &self,
        r: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.require_root(&r).await?;
        let engine = self.core.mvcc.engine().clone();
        tokio::task::spawn_blocking(move || engine.compact_files())
            .await
            .map_err(task_failed)??;
        // The last snapshot's checkpoint links the table files the
        // defragment replaced and keeps them on disk (a second copy of the
        // data) until a newer snapshot replaces it: ask for one now.
        if let Err(e) = self.core.raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "requesting a snapshot after a defragment");
        }
        // etcd answers a defragment without a header.
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    /// A CRC-32C over every state machine table (etcd hashes its whole
    /// bbolt file, which no other implementation can match; this hash is
    /// equal on members with equal state).
    async fn hash(&self, r: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.require_root(&r).await?;
        let view = self.core.mvcc.engine().snapshot();
        let mut crc = 0u32;
        for table in crate::engine::Table::STATE_MACHINE {
            view.scan(table, &[], None, &mut |k, v| {
                crc = crc32c::crc32c_append(crc32c::crc32c_append(crc, k), v);
                std::ops::ControlFlow::Continue(())
            })?;
        }
        let header = self.core.current_header();
        Ok(Response::new(HashResponse { header, hash: crc }))
    }

    async fn hash_kv(&self, r: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        self.require_root(&r).await?;
        let revision = r.into_inner().revision;
        // Before any compaction this is -1 (`NO_COMPACTION`), as etcd reports.
        let (hash, compact_revision, hash_revision) = self.core.mvcc.hash_kv(revision)?;
        Ok(Response::new(HashKvResponse {
            header: self.core.current_header(),
            hash,
            compact_revision,
            hash_revision,
        }))
    }

    type SnapshotStream = SnapshotStream;

    /// Streams a consistent point-in-time backup in etcd 3.5's format (see
    /// [`crate::snapshot`]): the bbolt file in 32 KiB chunks, each with the
    /// database bytes remaining after it, then its SHA-256 as the last
    /// message (remaining 0), as etcd's server does. The file is built from
    /// one engine snapshot into an anonymous temporary file in the data
    /// dir's `member/snap` (gone once streamed or abandoned), so memory
    /// stays bounded.
    async fn snapshot(
        &self,
        r: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.require_root(&r).await?;
        let view = self.core.mvcc.engine().snapshot();
        let dir = self.core.config.snapshot_dir_or_temp();
        let (file, total) = tokio::task::spawn_blocking(move || {
            crate::snapshot::create_temp_file(view.as_ref(), &dir)
        })
        .await
        .map_err(task_failed)??;
        let (tx, rx) = tokio::sync::mpsc::channel(SNAPSHOT_STREAM_QUEUE);
        tokio::task::spawn_blocking(move || stream_file(file, total, tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    /// Leadership transfer (see [`crate::server::peer::transfer`]). etcd 3.5 answers an
    /// empty response, without a header.
    async fn move_leader(
        &self,
        r: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        crate::server::peer::transfer::move_leader(&self.core, r.into_inner().target_id).await?;
        Ok(Response::new(MoveLeaderResponse::default()))
    }

    async fn downgrade(
        &self,
        r: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        self.require_root(&r).await?;
        let r = r.into_inner();
        let core = self.core.as_ref();
        let version = match DowngradeAction::try_from(r.action) {
            Ok(DowngradeAction::Validate) => versions::validate(core, &r.version).await?,
            Ok(DowngradeAction::Enable) => versions::enable(core, &r.version).await?,
            Ok(DowngradeAction::Cancel) => versions::cancel(core).await,
            Err(_) => return Err(EtcdError::UnknownMethod.into()),
        };
        Ok(Response::new(DowngradeResponse {
            header: self.core.current_header(),
            version,
        }))
    }
}
