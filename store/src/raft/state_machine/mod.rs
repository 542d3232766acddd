//! The replicated state machine: committed commands applied to MVCC.
//!
//! Apply: each entry is applied in its own MVCC write transaction whose
//! engine batch also records the entry's log id as `applied` (and, for
//! membership entries, the membership). Data and applied id therefore
//! change atomically: after a crash the member resumes exactly after the
//! last entry whose effects are on disk, and Raft replays the rest from the
//! log. These batches are not synced; the log entry itself was synced
//! before it was committed, and the shared WAL keeps their order.
//!
//! Snapshots: a snapshot is every key of the state machine tables
//! ([`Table::STATE_MACHINE`]) read from one engine snapshot, so it is a
//! consistent point-in-time copy that includes the applied log id. The
//! format is a sequence of records `table u8 | key_len u32 | key |
//! value_len u32 | value` (big-endian lengths). The latest snapshot is kept
//! in `<data-dir>/member/snap/` so it survives restarts and can be sent to
//! lagging followers.

use std::io::Cursor;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use etcd_proto::etcdserverpb::alarm_request::AlarmAction;
use etcd_proto::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, ResponseHeader,
};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogId, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use tokio::sync::mpsc;

use super::codec;
use super::types::{
    Command, CommandResponse, MemberAttributes, MemberInfo, NodeId, Proposal, TypeConfig,
};
use crate::auth::{AuthInfo, AuthStore};
use crate::engine::{Engine, EngineRead, Table, WriteBatch};
use crate::errors::EtcdError;
use crate::kv::{self, KvError};
use crate::lease::Lessor;
use crate::mvcc::{CompactionJob, KeyRange, MvccError, MvccStore, WriteTxn};
use crate::watch::WatchHub;

const KEY_APPLIED: &[u8] = b"sm/applied";
const KEY_MEMBERSHIP: &[u8] = b"sm/membership";
const MEMBER_ATTRIBUTES_PREFIX: &[u8] = b"members/attr/";
const ALARM_PREFIX: &[u8] = b"alarm/";
const SNAPSHOT_DATA_FILE: &str = "current.snap";
const SNAPSHOT_META_FILE: &str = "current.meta";

type Membership = StoredMembership<NodeId, MemberInfo>;

/// The state machine. `apply` runs on openraft's state machine task; reads
/// go straight to the shared [`MvccStore`].
pub struct StateMachine {
    mvcc: Arc<MvccStore>,
    snapshot_dir: PathBuf,
    compactor: mpsc::Sender<CompactionJob>,
    hub: Arc<WatchHub>,
    lessor: Arc<Lessor>,
    auth: Arc<AuthStore>,
}

fn sm_read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_state_machine(&e).into()
}

fn sm_write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(&e).into()
}

fn read_meta<T: serde::de::DeserializeOwned>(
    reader: &dyn EngineRead,
    key: &[u8],
) -> Result<Option<T>, StorageError<NodeId>> {
    match reader.get(Table::Meta, key).map_err(sm_read_err)? {
        Some(bytes) => codec::decode(&bytes).map(Some).map_err(sm_read_err),
        None => Ok(None),
    }
}

impl StateMachine {
    /// A state machine over `mvcc`, keeping snapshots in `snapshot_dir`.
    /// Compaction jobs go to `compactor` (see [`spawn_compactor`]).
    /// Applied events are published to `hub`.
    pub fn new(
        mvcc: Arc<MvccStore>,
        snapshot_dir: PathBuf,
        compactor: mpsc::Sender<CompactionJob>,
        hub: Arc<WatchHub>,
        lessor: Arc<Lessor>,
        auth: Arc<AuthStore>,
    ) -> Self {
        Self {
            mvcc,
            snapshot_dir,
            compactor,
            hub,
            lessor,
            auth,
        }
    }

    fn engine(&self) -> &Arc<dyn Engine> {
        self.mvcc.engine()
    }

    fn applied_batch(log_id: &LogId<NodeId>, membership: Option<&Membership>) -> WriteBatch {
        let mut b = WriteBatch::new();
        b.put(
            Table::Meta,
            KEY_APPLIED.to_vec(),
            codec::encode(&Some(*log_id)),
        );
        if let Some(m) = membership {
            b.put(Table::Meta, KEY_MEMBERSHIP.to_vec(), codec::encode(m));
        }
        b
    }

    /// Records `log_id` as applied without changing anything else, and
    /// answers `err` (a refused command).
    fn refuse(
        &self,
        log_id: &LogId<NodeId>,
        err: EtcdError,
    ) -> Result<CommandResponse, StorageError<NodeId>> {
        self.engine()
            .write(Self::applied_batch(log_id, None), false)
            .map_err(sm_write_err)?;
        Ok(CommandResponse::Error(err))
    }

    fn apply_proposal(
        &self,
        log_id: &LogId<NodeId>,
        proposal: &Proposal,
    ) -> Result<CommandResponse, StorageError<NodeId>> {
        let Proposal { by, cmd } = proposal;
        if let Command::Auth(c) = cmd {
            return self.apply_auth(log_id, c, by.as_ref());
        }
        if let Some(info) = by {
            if let Err(e) = self.auth.check_command(info, cmd, &self.lessor) {
                return self.refuse(log_id, e);
            }
        }
        self.apply_command(log_id, cmd)
    }

    fn apply_auth(
        &self,
        log_id: &LogId<NodeId>,
        cmd: &crate::auth::AuthCommand,
        by: Option<&AuthInfo>,
    ) -> Result<CommandResponse, StorageError<NodeId>> {
        let mut batch = Self::applied_batch(log_id, None);
        match self.auth.prepare(cmd, by, log_id.index, &mut batch) {
            Ok((reply, pending)) => {
                self.engine().write(batch, false).map_err(sm_write_err)?;
                self.auth.install(pending);
                Ok(CommandResponse::Auth(reply))
            }
            Err(e) => self.refuse(log_id, e),
        }
    }

    fn apply_command(
        &self,
        log_id: &LogId<NodeId>,
        cmd: &Command,
    ) -> Result<CommandResponse, StorageError<NodeId>> {
        if consumes_space(cmd) && nospace_raised(self.engine().as_ref()).map_err(sm_read_err)? {
            // etcd's capped applier: with NOSPACE raised, nothing that grows
            // the database is applied (deletes and compactions still are).
            return self.refuse(log_id, EtcdError::NoSpace);
        }
        let mut txn = self.mvcc.write();
        let mut compaction = None;
        let mut extra = Self::applied_batch(log_id, None);
        let leases = self.lessor.as_ref();
        let outcome = match cmd {
            Command::Put(r) => kv::txn::put(&mut txn, leases, r).map(CommandResponse::Put),
            Command::DeleteRange(r) => {
                kv::txn::delete_range(&mut txn, r).map(CommandResponse::DeleteRange)
            }
            Command::Txn(r) => kv::txn::txn(&mut txn, leases, r).map(CommandResponse::Txn),
            Command::LeaseGrant(r) => Ok(self.apply_lease_grant(&txn, r, &mut extra)),
            Command::LeaseRevoke(r) => self.apply_lease_revoke(&mut txn, r, &mut extra),
            Command::Alarm(r) => apply_alarm(self.engine().as_ref(), r, &mut extra)
                .map(CommandResponse::Alarm)
                .map_err(KvError::Storage),
            Command::Auth(_) => unreachable!("auth commands are applied by apply_auth"),
            Command::PublishMember(attrs) => {
                extra.put(
                    Table::Meta,
                    member_attributes_key(attrs.id),
                    codec::encode(attrs),
                );
                Ok(CommandResponse::Empty)
            }
            Command::Compact(r) => match txn.compact(r.revision) {
                Ok(job) => {
                    compaction = Some(job);
                    let header = Some(ResponseHeader {
                        revision: txn.write_rev() - 1,
                        ..Default::default()
                    });
                    Ok(CommandResponse::Compact(CompactionResponse { header }))
                }
                Err(e) => Err(KvError::from(e)),
            },
        };
        let response = match outcome {
            Ok(r) => r,
            Err(KvError::Etcd(e)) => CommandResponse::Error(e),
            Err(KvError::Storage(e)) => return Err(StorageIOError::apply(*log_id, &e).into()),
        };
        let (revision, events) = txn
            .commit(extra)
            .map_err(|e| StorageIOError::apply(*log_id, &e))?;
        self.lessor.apply_events(&events);
        self.hub.publish(revision, events);
        if let Some(job) = compaction {
            // The job is also recorded on disk; if the channel is gone the
            // member is shutting down and the restart finishes the job.
            let _ = self.compactor.try_send(job);
        }
        Ok(response)
    }

    fn apply_lease_grant(
        &self,
        txn: &WriteTxn<'_>,
        r: &LeaseGrantRequest,
        extra: &mut WriteBatch,
    ) -> CommandResponse {
        if !self.lessor.apply_grant(r.id, r.ttl, extra) {
            return CommandResponse::Error(EtcdError::LeaseExist);
        }
        let header = Some(ResponseHeader {
            revision: txn.write_rev() - 1,
            ..Default::default()
        });
        CommandResponse::LeaseGrant(LeaseGrantResponse {
            header,
            id: r.id,
            ttl: r.ttl,
            error: String::new(),
        })
    }

    /// Deletes the lease's keys in one revision, then forgets the lease.
    fn apply_lease_revoke(
        &self,
        txn: &mut WriteTxn<'_>,
        r: &LeaseRevokeRequest,
        extra: &mut WriteBatch,
    ) -> Result<CommandResponse, KvError> {
        let Some(keys) = self.lessor.keys(r.id) else {
            return Err(KvError::Etcd(EtcdError::LeaseNotFound));
        };
        for key in keys {
            txn.delete_range(&KeyRange::Single(key))?;
        }
        self.lessor.apply_revoke(r.id, extra);
        let revision = if txn.has_changes() {
            txn.write_rev()
        } else {
            txn.write_rev() - 1
        };
        let header = Some(ResponseHeader {
            revision,
            ..Default::default()
        });
        Ok(CommandResponse::LeaseRevoke(LeaseRevokeResponse { header }))
    }

    fn apply_entry(
        &self,
        entry: &Entry<TypeConfig>,
    ) -> Result<CommandResponse, StorageError<NodeId>> {
        let log_id = entry.get_log_id();
        match &entry.payload {
            EntryPayload::Normal(p) => self.apply_proposal(log_id, p),
            EntryPayload::Blank => {
                self.engine()
                    .write(Self::applied_batch(log_id, None), false)
                    .map_err(sm_write_err)?;
                Ok(CommandResponse::Empty)
            }
            EntryPayload::Membership(m) => {
                let stored = StoredMembership::new(Some(*log_id), m.clone());
                self.engine()
                    .write(Self::applied_batch(log_id, Some(&stored)), false)
                    .map_err(sm_write_err)?;
                Ok(CommandResponse::Empty)
            }
        }
    }

    fn snapshot_paths(&self) -> (PathBuf, PathBuf) {
        snapshot_paths(&self.snapshot_dir)
    }

    fn replace_state(
        &self,
        meta: &SnapshotMeta<NodeId, MemberInfo>,
        data: &[u8],
    ) -> Result<(), StorageError<NodeId>> {
        let mut batch = WriteBatch::new();
        for t in Table::STATE_MACHINE {
            batch.delete_range(t, Vec::new(), vec![0xff; 32]);
        }
        decode_records(data, &mut batch).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        batch.extend(Self::applied_batch(
            meta.last_log_id
                .as_ref()
                .expect("an installed snapshot has a last log id"),
            Some(&meta.last_membership),
        ));
        self.engine().write(batch, true).map_err(sm_write_err)?;
        match self.mvcc.reload() {
            Ok(Some(job)) => {
                let _ = self.compactor.try_send(job);
            }
            Ok(None) => {}
            Err(e) => return Err(sm_read_err(e)),
        }
        reload_lessor(&self.mvcc, &self.lessor).map_err(sm_read_err)?;
        self.auth.load(self.engine().as_ref()).map_err(sm_read_err)
    }
}

/// True for `meta` keys that describe this cluster's Raft progress rather
/// than the data (left out when a backup is restored into a new cluster).
pub fn is_raft_bookkeeping(key: &[u8]) -> bool {
    key == KEY_APPLIED
        || key == KEY_MEMBERSHIP
        || key.starts_with(MEMBER_ATTRIBUTES_PREFIX)
        || key.starts_with(ALARM_PREFIX)
}

/// Commands refused while the NOSPACE alarm is raised.
fn consumes_space(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Put(_) | Command::Txn(_) | Command::LeaseGrant(_)
    )
}

/// True if any member has raised the NOSPACE alarm.
pub fn nospace_raised(engine: &dyn EngineRead) -> Result<bool, crate::engine::EngineError> {
    Ok(alarms(engine)?
        .iter()
        .any(|a| a.alarm == AlarmType::Nospace as i32))
}

/// Meta key of one raised alarm: prefix, member id, alarm type.
fn alarm_key(member_id: u64, alarm: i32) -> Vec<u8> {
    let mut k = ALARM_PREFIX.to_vec();
    k.extend_from_slice(&member_id.to_be_bytes());
    k.extend_from_slice(&alarm.to_be_bytes());
    k
}

/// Every raised alarm, in (member, type) order.
pub fn alarms(engine: &dyn EngineRead) -> Result<Vec<AlarmMember>, crate::engine::EngineError> {
    let mut out = Vec::new();
    let mut end = ALARM_PREFIX.to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    engine.scan(Table::Meta, ALARM_PREFIX, Some(&end), &mut |k, _| {
        let rest = &k[ALARM_PREFIX.len()..];
        if rest.len() == 12 {
            let member_id = u64::from_be_bytes(rest[..8].try_into().expect("8 bytes"));
            let alarm = i32::from_be_bytes(rest[8..].try_into().expect("4 bytes"));
            out.push(AlarmMember { member_id, alarm });
        }
        ControlFlow::Continue(())
    })?;
    Ok(out)
}

/// etcd's alarm apply: ACTIVATE answers the alarm if it was newly raised,
/// DEACTIVATE the alarm if it was raised; NONE alarms are ignored.
fn apply_alarm(
    engine: &dyn EngineRead,
    r: &AlarmRequest,
    extra: &mut WriteBatch,
) -> Result<AlarmResponse, crate::engine::EngineError> {
    let key = alarm_key(r.member_id, r.alarm);
    let raised = engine.get(Table::Meta, &key)?.is_some();
    let member = AlarmMember {
        member_id: r.member_id,
        alarm: r.alarm,
    };
    let mut resp = AlarmResponse {
        header: None,
        alarms: Vec::new(),
    };
    if r.alarm == AlarmType::None as i32 {
        return Ok(resp);
    }
    match AlarmAction::try_from(r.action) {
        Ok(AlarmAction::Activate) if !raised => {
            extra.put(Table::Meta, key, Vec::new());
            resp.alarms.push(member);
        }
        Ok(AlarmAction::Deactivate) if raised => {
            extra.delete(Table::Meta, key);
            resp.alarms.push(member);
        }
        _ => {}
    }
    Ok(resp)
}

/// Meta key of a member's published attributes.
pub fn member_attributes_key(id: NodeId) -> Vec<u8> {
    let mut k = MEMBER_ATTRIBUTES_PREFIX.to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// Every member's published attributes.
pub fn published_members(
    engine: &dyn EngineRead,
) -> Result<Vec<MemberAttributes>, crate::engine::EngineError> {
    let mut out = Vec::new();
    let mut end = MEMBER_ATTRIBUTES_PREFIX.to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    engine.scan(
        Table::Meta,
        MEMBER_ATTRIBUTES_PREFIX,
        Some(&end),
        &mut |_, v| {
            if let Ok(a) = codec::decode::<MemberAttributes>(v) {
                out.push(a);
            }
            ControlFlow::Continue(())
        },
    )?;
    Ok(out)
}

/// Rebuilds the lessor from the lease table and the live keys' leases.
pub fn reload_lessor(mvcc: &MvccStore, lessor: &Lessor) -> Result<(), MvccError> {
    let leased = mvcc.live_leased_keys()?;
    lessor.reload(mvcc.engine().as_ref(), leased)?;
    Ok(())
}

fn snapshot_paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join(SNAPSHOT_DATA_FILE), dir.join(SNAPSHOT_META_FILE))
}

/// Writes `data` and `meta` as the current snapshot in `dir` (atomically:
/// synced temp files, then renames, data first so meta never points at
/// older data).
fn save_snapshot(
    dir: &Path,
    meta: &SnapshotMeta<NodeId, MemberInfo>,
    data: &[u8],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (data_path, meta_path) = snapshot_paths(dir);
    let tmp_data = data_path.with_extension("snap.tmp");
    let tmp_meta = meta_path.with_extension("meta.tmp");
    std::fs::write(&tmp_data, data)?;
    std::fs::File::open(&tmp_data)?.sync_all()?;
    std::fs::write(&tmp_meta, codec::encode(meta))?;
    std::fs::File::open(&tmp_meta)?.sync_all()?;
    std::fs::rename(&tmp_data, &data_path)?;
    std::fs::rename(&tmp_meta, &meta_path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Appends `records` (snapshot format) to `batch` as puts.
pub fn decode_records(mut data: &[u8], batch: &mut WriteBatch) -> std::io::Result<()> {
    fn take<'a>(data: &mut &'a [u8], n: usize) -> std::io::Result<&'a [u8]> {
        if data.len() < n {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "truncated snapshot",
            ));
        }
        let (head, tail) = data.split_at(n);
        *data = tail;
        Ok(head)
    }
    fn take_len(data: &mut &[u8]) -> std::io::Result<usize> {
        Ok(u32::from_be_bytes(take(data, 4)?.try_into().expect("4 bytes")) as usize)
    }
    while !data.is_empty() {
        let table_byte = take(&mut data, 1)?[0];
        let table = *Table::STATE_MACHINE
            .get(table_byte as usize)
            .ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "unknown snapshot table")
            })?;
        let klen = take_len(&mut data)?;
        let key = take(&mut data, klen)?.to_vec();
        let vlen = take_len(&mut data)?;
        let value = take(&mut data, vlen)?.to_vec();
        batch.put(table, key, value);
    }
    Ok(())
}

/// Serializes every state machine table of `reader` (snapshot format).
pub fn encode_records(reader: &dyn EngineRead) -> Result<Vec<u8>, crate::engine::EngineError> {
    let mut out = Vec::new();
    for (i, t) in Table::STATE_MACHINE.iter().enumerate() {
        reader.scan(*t, &[], None, &mut |k, v| {
            out.push(i as u8);
            out.extend_from_slice(&(k.len() as u32).to_be_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v);
            ControlFlow::Continue(())
        })?;
    }
    Ok(out)
}

/// Builds a snapshot from a frozen engine view.
pub struct SnapshotBuilder {
    view: Arc<dyn EngineRead>,
    snapshot_dir: PathBuf,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let applied: Option<LogId<NodeId>> =
            read_meta::<Option<LogId<NodeId>>>(self.view.as_ref(), KEY_APPLIED)?.flatten();
        let membership: Membership =
            read_meta(self.view.as_ref(), KEY_MEMBERSHIP)?.unwrap_or_default();
        let data = encode_records(self.view.as_ref())
            .map_err(|e| StorageIOError::read_state_machine(&e))?;
        let snapshot_id = match &applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, data.len()),
            None => format!("empty-{}", data.len()),
        };
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
            snapshot_id,
        };
        save_snapshot(&self.snapshot_dir, &meta, &data)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        tracing::info!(dir = %self.snapshot_dir.display(), id = %meta.snapshot_id, bytes = data.len(), "built snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        let engine = self.engine().clone();
        let applied = read_meta::<Option<LogId<NodeId>>>(engine.as_ref(), KEY_APPLIED)?.flatten();
        let membership = read_meta(engine.as_ref(), KEY_MEMBERSHIP)?.unwrap_or_default();
        Ok((applied, membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResponse>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        for entry in entries {
            responses.push(self.apply_entry(&entry)?);
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            view: self.engine().snapshot(),
            snapshot_dir: self.snapshot_dir.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, MemberInfo>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        self.replace_state(meta, &data)?;
        save_snapshot(&self.snapshot_dir, meta, &data)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        tracing::info!(id = %meta.snapshot_id, bytes = data.len(), "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let (data_path, meta_path) = self.snapshot_paths();
        if !meta_path.exists() {
            return Ok(None);
        }
        let read_err =
            |e: std::io::Error| StorageError::from(StorageIOError::read_snapshot(None, &e));
        let meta_bytes = std::fs::read(&meta_path).map_err(read_err)?;
        let meta: SnapshotMeta<NodeId, MemberInfo> =
            codec::decode(&meta_bytes).map_err(sm_read_err)?;
        let data = std::fs::read(&data_path).map_err(read_err)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Runs compaction jobs one after another in the background.
pub fn spawn_compactor(
    mvcc: Arc<MvccStore>,
    pending: Option<CompactionJob>,
) -> mpsc::Sender<CompactionJob> {
    /// Scheduled compactions waiting for the compactor; Compact requests are
    /// rare (kube-apiserver: one per 5 minutes), more is a client bug.
    const COMPACTOR_QUEUE: usize = 64;
    let (tx, mut rx) = mpsc::channel::<CompactionJob>(COMPACTOR_QUEUE);
    tokio::spawn(async move {
        if let Some(job) = pending {
            run_job(&mvcc, job).await;
        }
        while let Some(job) = rx.recv().await {
            run_job(&mvcc, job).await;
        }
    });
    tx
}

async fn run_job(mvcc: &MvccStore, job: CompactionJob) {
    let rev = job.rev;
    match mvcc.run_physical_compaction(job).await {
        Ok(()) => tracing::info!(revision = rev, "finished physical compaction"),
        Err(MvccError::Engine(e)) => {
            tracing::error!(revision = rev, error = %e, "physical compaction failed")
        }
        Err(e) => tracing::error!(revision = rev, error = %e, "physical compaction refused"),
    }
}
