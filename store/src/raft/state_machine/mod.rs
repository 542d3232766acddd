//! The replicated state machine: committed commands applied to MVCC.
//!
//! Apply: an entry carries a batch of proposals. Consecutive key-value
//! proposals (put, delete, txn, lease grant/revoke, compaction) are applied
//! in one MVCC write transaction, each sealed as its own revision with its
//! own answer, and written in one engine batch that also records the
//! entry's progress (`applied`, or `applied_part` when an auth, alarm or
//! member proposal splits the entry; see [`At`]). With N concurrent
//! writers batched into one entry this is one engine write instead of N, as
//! etcd's backend commits many revisions in one batch transaction. Data
//! and progress therefore change atomically: after a crash the member
//! resumes exactly after the last proposals whose effects are on disk, and
//! Raft replays the rest from the log. These batches are not synced; the
//! log entry itself was synced before it was committed, and the shared WAL
//! keeps their order. Watch events are published after the write, one
//! revision at a time.
//!
//! Snapshots ([`snapshot_file`]): an engine checkpoint taken between two
//! entries, kept in `<data-dir>/member/snap/` so it survives restarts;
//! its records (every key of the state machine tables) are written out
//! only to be sent to a lagging follower, and stay in files, never whole
//! in memory. Installing one makes it the current snapshot, replaces the
//! tables in bounded batches (applied log id last) and reloads the
//! in-memory views (MVCC index, leases, auth).
//!
//! Beside it: [`members`] (published member attributes), the alarms
//! ([`crate::alarm`]) and the compactor ([`crate::mvcc::compactor`]), which
//! apply uses but which are not part of applying.

pub mod members;
pub mod snapshot_file;

use std::path::PathBuf;
use std::sync::Arc;

use etcd_proto::etcdserverpb::{
    CompactionResponse, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, ResponseHeader,
};
use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use tokio::sync::mpsc;

use self::members::member_attributes_key;
use self::snapshot_file::{
    installed_pairs, EntryGate, PreparedInstall, SnapshotBuilder, SnapshotFile, SnapshotFiles,
};
use super::log_store::io_error;
use super::{
    Batch, Command, CommandResponse, Entry, LogId, Proposal, Snapshot, SnapshotData, SnapshotMeta,
    StoredMembership, TypeConfig,
};
use crate::alarm::{self, apply_alarm};
use crate::auth::{AuthCommand, AuthInfo, AuthStore};
use crate::cluster_version::{ClusterStateCache, KEY_CLUSTER_VERSION, KEY_DOWNGRADE};
use crate::codec;
use crate::engine::{Engine, EngineRead, Table, WriteBatch};
use crate::errors::EtcdError;
use crate::kv::{self, KvError};
use crate::lease::Lessor;
use crate::mvcc::{CompactionJob, KeyRange, MvccStore, WriteTxn};
use crate::watch::WatchHub;

/// Meta key of the last applied log id.
pub const KEY_APPLIED: &[u8] = b"sm/applied";
/// Meta key of the last applied membership.
pub const KEY_MEMBERSHIP: &[u8] = b"sm/membership";
/// Meta key of how far the entry after `sm/applied` is applied, while its
/// proposals are being applied (see [`At`]).
pub const KEY_APPLIED_PART: &[u8] = b"sm/applied_part";

/// Where a proposal sits in the log. An entry carries a [`Batch`] of
/// proposals, applied in groups (module docs), each group in one engine
/// batch that records the entry's progress with it, atomically: the last
/// group's batch records the entry as applied (`sm/applied`), every
/// earlier one records `sm/applied_part` (this entry, proposals applied so
/// far). After a crash
/// in the middle of an entry, Raft replays the entry and the state machine
/// skips the proposals already applied, so each is applied exactly once.
#[derive(Debug, Clone, Copy)]
struct At {
    log_id: LogId,
    /// The proposal's position in its entry.
    position: usize,
    /// The entry's number of proposals.
    of: usize,
}

impl At {
    fn last(&self) -> bool {
        self.position + 1 == self.of
    }
}

/// The value of `sm/applied_part`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Partial {
    log_id: LogId,
    /// Proposals of the entry applied (a prefix).
    applied: usize,
}

/// The state machine. `apply` runs on openraft's state machine task; reads
/// go straight to the shared [`MvccStore`].
pub struct StateMachine {
    mvcc: Arc<MvccStore>,
    snapshot_files: SnapshotFiles,
    /// Held while an entry is applied ([`snapshot_file::EntryGate`]).
    entry_gate: Arc<EntryGate>,
    compactor: mpsc::Sender<CompactionJob>,
    hub: Arc<WatchHub>,
    lessor: Arc<Lessor>,
    auth: Arc<AuthStore>,
    /// The interrupted entry's progress, read at start-up (see [`At`]).
    partial: Option<Partial>,
    /// The in-memory copy of the raised alarms the member's write checks
    /// read, refreshed after every write that changes the alarm table.
    alarms: Option<Arc<alarm::RaisedCache>>,
    /// The member's copy of the cluster version and downgrade state,
    /// refreshed after every write that changes them.
    cluster: Option<Arc<ClusterStateCache>>,
}

fn sm_read_err(e: impl std::fmt::Display) -> std::io::Error {
    io_error("reading the state machine", e)
}

fn sm_write_err(e: impl std::fmt::Display) -> std::io::Error {
    io_error("writing the state machine", e)
}

/// An error applying the entry at `log_id`.
fn apply_err(log_id: &LogId, e: impl std::fmt::Display) -> std::io::Error {
    io_error(&format!("applying log entry {log_id}"), e)
}

pub(crate) fn read_meta<T: serde::de::DeserializeOwned>(
    reader: &dyn EngineRead,
    key: &[u8],
) -> Result<Option<T>, std::io::Error> {
    match reader.get(Table::Meta, key).map_err(sm_read_err)? {
        Some(bytes) => codec::decode(&bytes).map(Some).map_err(sm_read_err),
        None => Ok(None),
    }
}

impl StateMachine {
    /// A state machine over `mvcc`, keeping snapshots in `snapshot_dir`.
    /// Compaction jobs go to `compactor` (see
    /// [`crate::mvcc::compactor::spawn_compactor`]).
    /// Applied events are published to `hub`.
    pub fn new(
        mvcc: Arc<MvccStore>,
        snapshot_dir: PathBuf,
        compactor: mpsc::Sender<CompactionJob>,
        hub: Arc<WatchHub>,
        lessor: Arc<Lessor>,
        auth: Arc<AuthStore>,
    ) -> Self {
        let snapshot_files = SnapshotFiles::new(snapshot_dir, mvcc.engine().clone());
        Self {
            mvcc,
            entry_gate: snapshot_files.entry_gate(),
            snapshot_files,
            compactor,
            hub,
            lessor,
            auth,
            partial: None,
            alarms: None,
            cluster: None,
        }
    }

    /// Keeps `cache` current with the alarm table (see
    /// [`alarm::RaisedCache`]).
    pub fn keeping_alarms_in(mut self, cache: Arc<alarm::RaisedCache>) -> Self {
        self.alarms = Some(cache);
        self
    }

    /// Keeps `cache` current with the replicated cluster version and
    /// downgrade state (see [`ClusterStateCache`]).
    pub fn keeping_cluster_state_in(mut self, cache: Arc<ClusterStateCache>) -> Self {
        self.cluster = Some(cache);
        self
    }

    /// Reads the cluster state into the member's cache after it changed.
    fn refresh_cluster_state(&self) -> Result<(), std::io::Error> {
        match &self.cluster {
            Some(cache) => cache.refresh(self.engine().as_ref()).map_err(sm_read_err),
            None => Ok(()),
        }
    }

    /// Reads the alarm table into the member's cache after it changed.
    fn refresh_alarms(&self) -> Result<(), std::io::Error> {
        match &self.alarms {
            Some(cache) => cache.refresh(self.engine().as_ref()).map_err(sm_read_err),
            None => Ok(()),
        }
    }

    /// The raised alarms a group's writes are checked against: the
    /// member's copy when it keeps one, since this state machine is the
    /// only writer of the alarm table and refreshes that copy after each
    /// write to it (an applied Alarm group, an installed snapshot), before
    /// the next group; else read from the engine. Reading the engine cost
    /// a RocksDB iterator per log entry, a tenth of a follower's apply
    /// time at 256 writers.
    fn raised_alarms(&self) -> Result<alarm::Raised, std::io::Error> {
        match &self.alarms {
            Some(cache) => Ok(cache.get()),
            None => alarm::raised(self.engine().as_ref()).map_err(sm_read_err),
        }
    }

    fn engine(&self) -> &Arc<dyn Engine> {
        self.mvcc.engine()
    }

    fn applied_batch(log_id: &LogId, membership: Option<&StoredMembership>) -> WriteBatch {
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

    /// What a proposal's engine batch records about the progress of its
    /// entry (see [`At`]).
    fn progress_batch(at: &At) -> WriteBatch {
        if !at.last() {
            let mut b = WriteBatch::new();
            let part = Partial {
                log_id: at.log_id,
                applied: at.position + 1,
            };
            b.put(Table::Meta, KEY_APPLIED_PART.to_vec(), codec::encode(&part));
            return b;
        }
        let mut b = Self::applied_batch(&at.log_id, None);
        if at.of > 1 {
            b.delete(Table::Meta, KEY_APPLIED_PART.to_vec());
        }
        b
    }

    /// Records the proposal at `at` as applied without changing anything
    /// else, and answers `err` (a refused command).
    fn refuse(&self, at: &At, err: EtcdError) -> Result<CommandResponse, std::io::Error> {
        self.engine()
            .write(Self::progress_batch(at), false)
            .map_err(sm_write_err)?;
        Ok(CommandResponse::Error(err))
    }

    /// Applies the proposals of one entry in order, each with its own
    /// revision and answer. Consecutive key-value proposals form a group
    /// applied in one MVCC transaction and one engine batch (see
    /// [`groups_with_kv`]); auth, alarm and member proposals are applied
    /// alone. Proposals that a crash interrupted the entry after are
    /// skipped (their answers went to clients of a leader that is gone).
    fn apply_batch(
        &mut self,
        log_id: &LogId,
        batch: &Batch,
    ) -> Result<Vec<CommandResponse>, std::io::Error> {
        let resume_at = match self.partial.take() {
            Some(p) if p.log_id == *log_id => p.applied,
            _ => 0,
        };
        let proposals = &batch.proposals;
        let of = proposals.len();
        let mut answers = Vec::with_capacity(of);
        answers.resize_with(resume_at.min(of), || CommandResponse::Empty);
        let mut position = answers.len();
        while position < of {
            let end = if groups_with_kv(&proposals[position].cmd) {
                (position..of)
                    .find(|&i| !groups_with_kv(&proposals[i].cmd))
                    .unwrap_or(of)
            } else {
                position + 1
            };
            let last = At {
                log_id: *log_id,
                position: end - 1,
                of,
            };
            if let Command::Auth(c) = &proposals[position].cmd {
                answers.push(self.apply_auth(&last, c, proposals[position].by.as_ref())?);
            } else {
                self.apply_group(&last, &proposals[position..end], &mut answers)?;
            }
            position = end;
        }
        Ok(answers)
    }

    /// Applies `group` (ending at `last`) in one MVCC transaction, each
    /// proposal sealed as its own revision, then writes it with the
    /// entry's progress in one engine batch and publishes the events.
    fn apply_group(
        &self,
        last: &At,
        group: &[Proposal],
        answers: &mut Vec<CommandResponse>,
    ) -> Result<(), std::io::Error> {
        // Alarms change only by Alarm proposals, which are applied alone.
        let raised = self.raised_alarms()?;
        let mut txn = self.mvcc.write();
        let mut extra = Self::progress_batch(last);
        let mut published = Vec::new();
        let mut compactions = Vec::new();
        for proposal in group {
            let started = std::time::Instant::now();
            let answer = self
                .apply_grouped(&mut txn, &mut extra, raised, proposal, &mut compactions)
                .map_err(|e| apply_err(&last.log_id, e))?;
            answers.push(answer);
            let (revision, events) = txn.seal();
            if !events.is_empty() {
                // Later proposals of the group see the leases' new keys.
                self.lessor.apply_events(&events);
                published.push((revision, events));
            }
            if started.elapsed().as_millis() > crate::metrics::SLOW_APPLY_MILLIS {
                crate::metrics::global().server.slow_apply.inc();
            }
        }
        txn.commit(extra).map_err(|e| apply_err(&last.log_id, e))?;
        if group.iter().any(|p| matches!(p.cmd, Command::Alarm(_))) {
            self.refresh_alarms()?;
        }
        let versions = |p: &Proposal| {
            matches!(
                p.cmd,
                Command::ClusterVersionSet(_) | Command::DowngradeInfoSet(_)
            )
        };
        if group.iter().any(versions) {
            self.refresh_cluster_state()?;
        }
        for (revision, events) in published {
            self.hub.publish(revision, events);
        }
        for job in compactions {
            // The job is also recorded on disk; if the channel is gone the
            // member is shutting down and the restart finishes the job.
            let _ = self.compactor.try_send(job);
        }
        Ok(())
    }

    /// The sender's permission for a write, against the auth state at this
    /// point of the log (so every member decides the same).
    fn check_sender(&self, info: &AuthInfo, cmd: &Command) -> Result<(), EtcdError> {
        let lessor = self.lessor.as_ref();
        match cmd {
            Command::Put(r) => self.auth.check_put(info, r, lessor),
            Command::DeleteRange(r) => self.auth.check_delete_range(info, r),
            Command::Txn(r) => self.auth.check_txn(info, r),
            Command::LeaseRevoke(r) => self.auth.check_lease_revoke(info, r.id, lessor),
            _ => Ok(()),
        }
    }

    fn apply_auth(
        &self,
        at: &At,
        cmd: &AuthCommand,
        by: Option<&AuthInfo>,
    ) -> Result<CommandResponse, std::io::Error> {
        let mut batch = Self::progress_batch(at);
        // A simple token names its entry's log index (tokens of one entry
        // differ in their random prefix).
        match self.auth.prepare(cmd, by, at.log_id.index, &mut batch) {
            Ok((reply, pending)) => {
                self.engine().write(batch, false).map_err(sm_write_err)?;
                self.auth.install(pending);
                Ok(CommandResponse::Auth(reply))
            }
            Err(e) => self.refuse(at, e),
        }
    }

    /// Applies one proposal of a group into `txn` (the caller seals it):
    /// its answer, an etcd error if it is refused, or the engine error
    /// that stops applying.
    fn apply_grouped<'t>(
        &self,
        txn: &mut WriteTxn<'t>,
        extra: &mut WriteBatch,
        raised: alarm::Raised,
        proposal: &Proposal,
        compactions: &mut Vec<CompactionJob>,
    ) -> Result<CommandResponse, crate::engine::EngineError> {
        let Proposal { by, cmd } = proposal;
        if let Some(info) = by {
            // The lease checks read every key attached to the lease, which
            // the lessor knows once the key index is loaded.
            let lease_checked = match cmd {
                Command::Put(r) => r.lease != 0,
                Command::LeaseRevoke(_) => true,
                _ => false,
            };
            if lease_checked && self.auth.checks(info) {
                txn.load_all()?;
            }
            if let Err(e) = self.check_sender(info, cmd) {
                return Ok(CommandResponse::Error(e));
            }
        }
        if let Some(refusal) = alarm_refusal(raised, cmd) {
            return Ok(CommandResponse::Error(refusal));
        }
        let leases = self.lessor.as_ref();
        let outcome = match cmd {
            Command::Put(r) => kv::txn::put(txn, leases, r).map(CommandResponse::Put),
            Command::DeleteRange(r) => {
                kv::txn::delete_range(txn, r).map(CommandResponse::DeleteRange)
            }
            Command::Txn(r) => kv::txn::txn(txn, leases, r).map(CommandResponse::Txn),
            Command::LeaseGrant(r) => Ok(self.apply_lease_grant(txn, r, extra)),
            Command::LeaseRevoke(r) => self.apply_lease_revoke(txn, r, extra),
            Command::Alarm(r) => apply_alarm(self.engine().as_ref(), r, extra)
                .map(CommandResponse::Alarm)
                .map_err(KvError::Storage),
            Command::Auth(_) => unreachable!("auth commands are applied by apply_auth"),
            Command::ClusterVersionSet(version) => {
                extra.put(
                    Table::Meta,
                    KEY_CLUSTER_VERSION.to_vec(),
                    version.as_bytes().to_vec(),
                );
                Ok(CommandResponse::Empty)
            }
            Command::DowngradeInfoSet(info) => {
                let json = serde_json::to_vec(info).expect("downgrade state as JSON");
                extra.put(Table::Meta, KEY_DOWNGRADE.to_vec(), json);
                Ok(CommandResponse::Empty)
            }
            Command::PublishMember(attrs) => {
                extra.put(
                    Table::Meta,
                    member_attributes_key(attrs.id),
                    codec::encode(attrs),
                );
                Ok(CommandResponse::Empty)
            }
            Command::Compact(r) => txn.compact(r.revision).map_err(KvError::from).map(|job| {
                compactions.push(job);
                let header = Some(ResponseHeader {
                    revision: txn.write_rev() - 1,
                    ..Default::default()
                });
                CommandResponse::Compact(CompactionResponse { header })
            }),
        };
        match outcome {
            Ok(r) => Ok(r),
            Err(KvError::Etcd(e)) => Ok(CommandResponse::Error(e)),
            Err(KvError::Storage(e)) => Err(e),
        }
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
        // The lessor knows every attached key once the index is loaded.
        txn.load_all()?;
        let Some(keys) = self.lessor.keys(r.id) else {
            return Err(KvError::Etcd(EtcdError::LeaseNotFound));
        };
        for key in keys {
            txn.delete_range(&KeyRange::Single(key), false)?;
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

    /// Applies `entries` in order: each entry's answers, one per proposal
    /// (what openraft's `apply` hands to the proposers).
    pub fn apply_entries(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> std::io::Result<Vec<Vec<CommandResponse>>> {
        entries
            .into_iter()
            .map(|entry| self.apply_entry(&entry))
            .collect()
    }

    /// Applies one entry, holding the entry gate so that a snapshot's
    /// checkpoint never lands in the middle of it.
    fn apply_entry(&mut self, entry: &Entry) -> std::io::Result<Vec<CommandResponse>> {
        let gate = Arc::clone(&self.entry_gate);
        let _held = gate.hold();
        self.apply_entry_ungated(entry)
    }

    fn apply_entry_ungated(&mut self, entry: &Entry) -> std::io::Result<Vec<CommandResponse>> {
        let log_id = &entry.log_id;
        match &entry.payload {
            EntryPayload::Normal(batch) => self.apply_batch(log_id, batch),
            EntryPayload::Blank => {
                self.engine()
                    .write(Self::applied_batch(log_id, None), false)
                    .map_err(sm_write_err)?;
                Ok(Vec::new())
            }
            EntryPayload::Membership(m) => {
                let stored = StoredMembership::new(Some(*log_id), m.clone());
                self.engine()
                    .write(Self::applied_batch(log_id, Some(&stored)), false)
                    .map_err(sm_write_err)?;
                Ok(Vec::new())
            }
        }
    }

    /// Replaces the state machine tables with the snapshot's records: one
    /// synced batch clears them, the applied log id with them; the records
    /// go in as table files ingested at disk speed (no WAL, memtable or
    /// compaction, and no background-write rate limit): those prepared
    /// while the snapshot arrived ([`Engine::ingest`]), or else written now
    /// from the file ([`Engine::bulk_load`]); a last synced batch records
    /// the snapshot's log id and membership (the snapshot's own copies of
    /// these keys are skipped). Until that batch the state machine claims
    /// nothing applied: after a crash in between, openraft finds the
    /// current snapshot newer than the state machine at start and installs
    /// it again, from the file. Then the in-memory views are reloaded, as
    /// at a start: the key index loads from the snapshot's key history
    /// while the member serves (or is rebuilt first, from a snapshot
    /// whose history is not valid).
    fn replace_state(&self, meta: &SnapshotMeta, data: &SnapshotFile) -> std::io::Result<()> {
        let Some(last_log_id) = meta.last_log_id.as_ref() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "an installed snapshot has no last log id",
            ));
        };
        let started = std::time::Instant::now();
        let mut clear = WriteBatch::new();
        for t in Table::STATE_MACHINE {
            // A range deletion over an empty table would still make the
            // ingested files overlap it: they would land in the top level
            // and the engine would rewrite them all (a new member's case).
            let first = crate::engine::scan_collect(self.engine().as_ref(), t, b"", None, 1);
            if !first.map_err(sm_read_err)?.is_empty() {
                clear.delete_range(t, Vec::new(), vec![0xff; 32]);
            }
        }
        self.engine().write(clear, true).map_err(sm_write_err)?;
        match data.take_prepared() {
            Some(PreparedInstall { load }) => self.engine().ingest(load).map_err(sm_write_err)?,
            None => {
                let mut records = data.records();
                let staging = self.snapshot_files.staging_dir();
                self.engine()
                    .bulk_load(&staging, &mut installed_pairs(&mut records))
                    .map_err(sm_write_err)?;
            }
        }
        let applied = Self::applied_batch(last_log_id, Some(&meta.last_membership));
        self.engine().write(applied, true).map_err(sm_write_err)?;
        tracing::info!(
            took_ms = started.elapsed().as_millis() as u64,
            "wrote the snapshot's records into the tables"
        );
        self.refresh_alarms()?;
        self.refresh_cluster_state()?;
        match self.mvcc.reload() {
            Ok(Some(job)) => {
                let _ = self.compactor.try_send(job);
            }
            Ok(None) => {}
            Err(e) => return Err(sm_read_err(e)),
        }
        self.lessor
            .reload_from_store(&self.mvcc)
            .map_err(sm_read_err)?;
        self.mvcc.load_in_background()?;
        self.auth.load(self.engine().as_ref()).map_err(sm_read_err)
    }
}

/// Commands refused while the NOSPACE alarm is raised.
fn consumes_space(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Put(_) | Command::Txn(_) | Command::LeaseGrant(_)
    )
}

/// Commands applied together in one MVCC transaction when they follow
/// each other in an entry: they read and write only the key space, leases
/// and the compaction state, which the transaction sees as it changes.
/// Alarm and member proposals read the engine directly and auth proposals
/// have their own store, so each of those is applied alone.
fn groups_with_kv(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Put(_)
            | Command::DeleteRange(_)
            | Command::Txn(_)
            | Command::LeaseGrant(_)
            | Command::LeaseRevoke(_)
            | Command::Compact(_)
    )
}

/// The alarm that refuses `cmd`, if one is raised: CORRUPT refuses every
/// data change (etcd's corrupt applier), NOSPACE the ones that grow the
/// database (its capped applier; deletes and compactions still apply).
fn alarm_refusal(raised: alarm::Raised, cmd: &Command) -> Option<EtcdError> {
    if !refused_when_corrupt(cmd) {
        None
    } else if raised.corrupt {
        Some(EtcdError::Corrupt)
    } else if raised.nospace && consumes_space(cmd) {
        Some(EtcdError::NoSpace)
    } else {
        None
    }
}

/// Commands etcd's corrupt applier refuses while CORRUPT is raised.
fn refused_when_corrupt(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Put(_)
            | Command::DeleteRange(_)
            | Command::Txn(_)
            | Command::Compact(_)
            | Command::LeaseGrant(_)
            | Command::LeaseRevoke(_)
    )
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> std::io::Result<(Option<LogId>, StoredMembership)> {
        let engine = self.engine().clone();
        let applied = read_meta::<Option<LogId>>(engine.as_ref(), KEY_APPLIED)?.flatten();
        let membership = read_meta(engine.as_ref(), KEY_MEMBERSHIP)?.unwrap_or_default();
        self.partial = read_meta(engine.as_ref(), KEY_APPLIED_PART)?;
        Ok((applied, membership))
    }

    /// Applies the entries in order, answering each client's proposal as
    /// soon as its entry is applied.
    async fn apply<Strm>(&mut self, mut entries: Strm) -> std::io::Result<()>
    where
        Strm: Stream<Item = std::io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let answers = self.apply_entry(&entry)?;
            if let Some(responder) = responder {
                responder.send(answers);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            files: self.snapshot_files.clone(),
        }
    }

    /// Makes the received snapshot the current one, then replaces the
    /// tables with it (see [`StateMachine::replace_state`] for a crash in
    /// between), holding the entry gate so no checkpoint sees the tables
    /// half replaced.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> std::io::Result<()> {
        let started = std::time::Instant::now();
        let gate = Arc::clone(&self.entry_gate);
        let _held = gate.hold();
        let records = self
            .snapshot_files
            .adopt(meta, snapshot)
            .map_err(|e| io_error("saving the installed snapshot", e))?;
        self.replace_state(meta, &records)?;
        self.partial = None;
        let bytes = records.len();
        drop(records);
        if let Err(e) = self.snapshot_files.replace_installed_file(meta) {
            tracing::warn!(error = %e, "keeping the received snapshot file as the current snapshot");
        }
        tracing::info!(
            meta = %meta,
            bytes,
            took_ms = started.elapsed().as_millis() as u64,
            "installed snapshot"
        );
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> std::io::Result<Option<Snapshot>> {
        let current = self.snapshot_files.current()?;
        Ok(current.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}
