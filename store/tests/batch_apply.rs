//! A log entry carries a batch of proposals; each is applied exactly once,
//! with its own revision and its own answer, also when a crash interrupted
//! the entry half way (the state machine resumes after the proposals whose
//! engine batches reached disk).

use std::sync::Arc;

use etcd_proto::etcdserverpb::PutRequest;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;
use store::engine::memory::MemoryEngine;
use store::engine::{Engine, Table, WriteBatch};
use store::mvcc::compactor::spawn_compactor;
use store::mvcc::MvccStore;
use store::raft::state_machine::{StateMachine, KEY_APPLIED, KEY_APPLIED_PART};
use store::raft::{Batch, Command, CommandResponse, Entry, LeaderId, LogId, Proposal};

fn state_machine(engine: Arc<dyn Engine>, dir: &std::path::Path) -> (Arc<MvccStore>, StateMachine) {
    let mvcc = Arc::new(MvccStore::open(engine).expect("open mvcc"));
    let compactor = spawn_compactor(mvcc.clone(), None);
    let lessor = Arc::new(store::lease::Lessor::new(std::time::Duration::from_secs(1)));
    let auth = Arc::new(store::auth::AuthStore::new(
        store::auth::TokenProvider::Simple(store::auth::token::SimpleTokens::new(
            store::auth::token::DEFAULT_SIMPLE_TOKEN_TTL,
        )),
        store::auth::DEFAULT_BCRYPT_COST,
    ));
    let sm = StateMachine::new(
        mvcc.clone(),
        dir.join("snap"),
        compactor,
        store::watch::WatchHub::new(),
        lessor,
        auth,
    );
    (mvcc, sm)
}

fn put(key: &str) -> Proposal {
    Proposal {
        by: None,
        cmd: Command::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        }),
    }
}

fn log_id(index: u64) -> LogId {
    LogId::new(
        LeaderId {
            term: 1,
            node_id: 1,
        },
        index,
    )
}

fn entry(index: u64, proposals: Vec<Proposal>) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Batch {
            proposals: proposals.into(),
        }),
    }
}

fn revisions(answers: &[CommandResponse]) -> Vec<Option<i64>> {
    answers
        .iter()
        .map(|a| match a {
            CommandResponse::Put(r) => r.header.as_ref().map(|h| h.revision),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_batch_gets_one_revision_and_one_answer_per_proposal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let (mvcc, mut sm) = state_machine(engine, dir.path());
    sm.applied_state().await.expect("applied state");
    let answers = sm
        .apply_entries([entry(1, vec![put("a"), put("b"), put("c")])])
        .expect("apply");
    assert_eq!(answers.len(), 1, "one answer list per entry");
    assert_eq!(revisions(&answers[0]), vec![Some(2), Some(3), Some(4)]);
    assert_eq!(mvcc.current_revision(), 4);
    let (applied, _) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied, Some(log_id(1)));
}

#[tokio::test]
async fn an_interrupted_batch_resumes_after_the_applied_proposals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    // Entry 1 applied; of entry 2, only its first proposal reached disk
    // before the crash: the state a crash between the two engine batches
    // leaves (entry 2's first proposal applied on its own, then its
    // progress rewritten to "entry 2, 1 applied").
    {
        let (_, mut sm) = state_machine(engine.clone(), dir.path());
        sm.applied_state().await.expect("applied state");
        sm.apply_entries([entry(1, vec![put("a")]), entry(2, vec![put("b")])])
            .expect("apply");
        let mut progress = WriteBatch::new();
        progress.put(
            Table::Meta,
            KEY_APPLIED.to_vec(),
            store::codec::encode(&Some(log_id(1))),
        );
        progress.put(
            Table::Meta,
            KEY_APPLIED_PART.to_vec(),
            store::codec::encode(&(log_id(2), 1usize)),
        );
        engine.write(progress, true).expect("write progress");
    }
    // The restarted member replays entry 2 in full.
    let (mvcc, mut sm) = state_machine(engine.clone(), dir.path());
    let (applied, _) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied, Some(log_id(1)));
    let answers = sm
        .apply_entries([entry(2, vec![put("b"), put("c"), put("d")])])
        .expect("apply");
    assert_eq!(
        revisions(&answers[0]),
        vec![None, Some(4), Some(5)],
        "the applied proposal is skipped, the others get the next revisions"
    );
    assert_eq!(mvcc.current_revision(), 5, "b was not applied twice");
    let (applied, _) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied, Some(log_id(2)));
    assert_eq!(
        engine.get(Table::Meta, KEY_APPLIED_PART).expect("read"),
        None,
        "the progress marker is gone once the entry is applied"
    );
}

fn cmd(cmd: Command) -> Proposal {
    Proposal { by: None, cmd }
}

/// The key-value proposals of one entry share one MVCC transaction: each
/// sees what the earlier ones wrote (a put under a lease granted just
/// before, a txn comparing that put's version, a revoke deleting the
/// key), each gets its own revision, and the watch hub gets one event
/// batch per revision.
#[tokio::test]
async fn proposals_of_one_entry_see_each_other_and_keep_their_revisions() {
    use etcd_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
    use etcd_proto::etcdserverpb::request_op::Request;
    use etcd_proto::etcdserverpb::{
        Compare, LeaseGrantRequest, LeaseRevokeRequest, RequestOp, TxnRequest,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let mvcc = Arc::new(MvccStore::open(engine).expect("open mvcc"));
    let lessor = Arc::new(store::lease::Lessor::new(std::time::Duration::from_secs(1)));
    let hub = store::watch::WatchHub::new();
    let mut events = hub.subscribe();
    let auth = Arc::new(store::auth::AuthStore::new(
        store::auth::TokenProvider::Simple(store::auth::token::SimpleTokens::new(
            store::auth::token::DEFAULT_SIMPLE_TOKEN_TTL,
        )),
        store::auth::DEFAULT_BCRYPT_COST,
    ));
    let mut sm = StateMachine::new(
        mvcc.clone(),
        dir.path().join("snap"),
        spawn_compactor(mvcc.clone(), None),
        hub.clone(),
        lessor,
        auth,
    );
    sm.applied_state().await.expect("applied state");
    let put_k = Command::Put(PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        lease: 5,
        ..Default::default()
    });
    let txn = Command::Txn(TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Version as i32,
            key: b"k".to_vec(),
            target_union: Some(TargetUnion::Version(1)),
            ..Default::default()
        }],
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: b"k2".to_vec(),
                value: b"seen".to_vec(),
                ..Default::default()
            })),
        }],
        failure: vec![],
    });
    let answers = sm
        .apply_entries([entry(
            1,
            vec![
                cmd(Command::LeaseGrant(LeaseGrantRequest { ttl: 60, id: 5 })),
                cmd(put_k),
                cmd(txn),
                cmd(Command::LeaseRevoke(LeaseRevokeRequest { id: 5 })),
            ],
        )])
        .expect("apply");
    let answers = &answers[0];
    assert!(
        matches!(&answers[0], CommandResponse::LeaseGrant(_)),
        "{answers:?}"
    );
    assert_eq!(revisions(answers)[1], Some(2), "{answers:?}");
    match &answers[2] {
        CommandResponse::Txn(r) => {
            assert!(r.succeeded, "the txn saw the put before it: {r:?}");
            assert_eq!(r.header.as_ref().map(|h| h.revision), Some(3));
        }
        other => panic!("txn answered {other:?}"),
    }
    match &answers[3] {
        CommandResponse::LeaseRevoke(r) => {
            assert_eq!(
                r.header.as_ref().map(|h| h.revision),
                Some(4),
                "the revoke deleted k"
            )
        }
        other => panic!("revoke answered {other:?}"),
    }
    assert_eq!(mvcc.current_revision(), 4);
    let live: Vec<Vec<u8>> = mvcc
        .range(&store::mvcc::KeyRange::From(Vec::new()), Default::default())
        .expect("range")
        .kvs
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(live, vec![b"k2".to_vec()]);
    let published: Vec<i64> = (0..3)
        .map(|_| {
            events
                .try_recv()
                .expect("no lag")
                .expect("one event batch per revision")
                .revision
        })
        .collect();
    assert_eq!(published, vec![2, 3, 4]);
}

/// An alarm proposal is applied alone and splits the entry: the put
/// after a NOSPACE alarm raised in the same entry is refused, the one
/// before it applied.
#[tokio::test]
async fn an_alarm_in_the_middle_of_an_entry_takes_effect_in_order() {
    use etcd_proto::etcdserverpb::alarm_request::AlarmAction;
    use etcd_proto::etcdserverpb::{AlarmRequest, AlarmType};
    let dir = tempfile::tempdir().expect("tempdir");
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let (mvcc, mut sm) = state_machine(engine.clone(), dir.path());
    sm.applied_state().await.expect("applied state");
    let raise = Command::Alarm(AlarmRequest {
        action: AlarmAction::Activate as i32,
        member_id: 1,
        alarm: AlarmType::Nospace as i32,
    });
    let answers = sm
        .apply_entries([entry(1, vec![put("a"), cmd(raise), put("b")])])
        .expect("apply");
    assert_eq!(revisions(&answers[0])[0], Some(2));
    assert!(
        matches!(
            &answers[0][2],
            CommandResponse::Error(store::errors::EtcdError::NoSpace)
        ),
        "{:?}",
        answers[0]
    );
    assert_eq!(mvcc.current_revision(), 2);
    let (applied, _) = sm.applied_state().await.expect("applied state");
    assert_eq!(applied, Some(log_id(1)));
    assert_eq!(
        engine.get(Table::Meta, KEY_APPLIED_PART).expect("read"),
        None
    );
}

/// The memory engine, whose writes fail once `writes_left` (when not
/// negative) is used up.
struct FailingEngine {
    inner: MemoryEngine,
    writes_left: std::sync::atomic::AtomicI64,
}

impl FailingEngine {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryEngine::new(),
            writes_left: std::sync::atomic::AtomicI64::new(-1),
        })
    }

    /// Lets `n` more writes through (negative: all of them).
    fn allow_writes(&self, n: i64) {
        self.writes_left
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }
}

impl store::engine::EngineRead for FailingEngine {
    fn get(&self, table: Table, key: &[u8]) -> store::engine::EngineResult<Option<Vec<u8>>> {
        self.inner.get(table, key)
    }

    fn scan_range(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        visit: &mut store::engine::ScanVisitor<'_>,
    ) -> store::engine::EngineResult<()> {
        self.inner.scan_range(table, start, end, reverse, visit)
    }
}

impl FailingEngine {
    /// Uses up one write (a batch or a bulk load), or fails it.
    fn take_write(&self) -> store::engine::EngineResult<()> {
        let left = self
            .writes_left
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| Some(if n > 0 { n - 1 } else { n }),
            )
            .expect("the update always applies");
        if left == 0 {
            return Err(store::engine::EngineError::corrupt(
                "injected write failure",
            ));
        }
        Ok(())
    }
}

impl Engine for FailingEngine {
    fn write(&self, batch: WriteBatch, sync: bool) -> store::engine::EngineResult<()> {
        self.take_write()?;
        self.inner.write(batch, sync)
    }
    fn prepare_load(
        &self,
        staging: &std::path::Path,
        next: &mut store::engine::BulkSource<'_>,
    ) -> store::engine::EngineResult<store::engine::PreparedLoad> {
        self.inner.prepare_load(staging, next)
    }
    fn ingest(&self, load: store::engine::PreparedLoad) -> store::engine::EngineResult<()> {
        self.take_write()?;
        self.inner.ingest(load)
    }
    fn sync(&self) -> store::engine::EngineResult<()> {
        self.inner.sync()
    }
    fn snapshot(&self) -> Arc<dyn store::engine::EngineRead> {
        self.inner.snapshot()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn tables_size_bytes(&self, tables: &[Table]) -> u64 {
        self.inner.tables_size_bytes(tables)
    }
    fn size_in_use_bytes(&self) -> u64 {
        self.inner.size_in_use_bytes()
    }
    fn compact_files(&self) -> store::engine::EngineResult<()> {
        self.inner.compact_files()
    }
    fn checkpoint(&self, dir: &std::path::Path) -> store::engine::EngineResult<()> {
        self.inner.checkpoint(dir)
    }
    fn open_checkpoint(
        &self,
        dir: &std::path::Path,
    ) -> store::engine::EngineResult<Arc<dyn store::engine::EngineRead>> {
        self.inner.open_checkpoint(dir)
    }
}

/// An engine failure while applying an entry fails the apply with a
/// storage error (openraft then stops this member's Raft) instead of
/// aborting the process, and the store refuses to answer reads from an
/// index the engine does not match.
#[tokio::test]
async fn an_engine_failure_during_apply_fails_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = FailingEngine::new();
    let (mvcc, mut sm) = state_machine(engine.clone(), dir.path());
    sm.applied_state().await.expect("applied state");
    sm.apply_entries([entry(1, vec![put("a")])]).expect("apply");
    engine.allow_writes(0);
    let failed = sm.apply_entries([entry(2, vec![put("b"), put("c")])]);
    assert!(failed.is_err(), "{failed:?}");
    let read = mvcc.range(&store::mvcc::KeyRange::From(Vec::new()), Default::default());
    assert!(read.is_err(), "reads refuse the diverged index: {read:?}");
}

/// Puts `key` with a value of `bytes` bytes.
fn put_large(key: &str, bytes: usize) -> Proposal {
    Proposal {
        by: None,
        cmd: Command::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: vec![b'v'; bytes],
            ..Default::default()
        }),
    }
}

/// A snapshot install that a crash cuts off after its first engine batch
/// leaves a state machine that claims nothing applied, while the snapshot
/// is already the current one; at the next start openraft finds the
/// snapshot newer and installs it again (`restore_from_snapshot`, done by
/// hand here), which completes it.
#[tokio::test]
async fn an_interrupted_snapshot_install_completes_at_the_next_start() {
    let source_dir = tempfile::tempdir().expect("tempdir");
    let (source_mvcc, mut source) = state_machine(Arc::new(MemoryEngine::new()), source_dir.path());
    source.applied_state().await.expect("applied state");
    // 6 MiB of values.
    let values = (0..6).map(|i| put_large(&format!("k{i}"), 1024 * 1024));
    source
        .apply_entries([entry(1, values.collect())])
        .expect("apply");
    let snapshot = source
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build a snapshot");
    let meta = snapshot.meta.clone();
    assert_eq!(meta.last_log_id, Some(log_id(1)));

    let dir = tempfile::tempdir().expect("tempdir");
    let engine = FailingEngine::new();
    let (_, mut member) = state_machine(engine.clone(), dir.path());
    member.applied_state().await.expect("applied state");
    member
        .apply_entries([entry(1, vec![put("old")])])
        .expect("apply");
    engine.allow_writes(1);
    let cut = member.install_snapshot(&meta, snapshot.snapshot).await;
    assert!(
        cut.is_err(),
        "the bulk load after the clearing batch fails: {cut:?}"
    );

    // The next start.
    engine.allow_writes(-1);
    let (mvcc, mut restarted) = state_machine(engine.clone(), dir.path());
    let (applied, _) = restarted.applied_state().await.expect("applied state");
    assert!(applied < meta.last_log_id, "claims {applied:?}");
    let current = restarted
        .get_current_snapshot()
        .await
        .expect("read the current snapshot")
        .expect("the received snapshot is the current one");
    assert_eq!(current.meta, meta);
    restarted
        .install_snapshot(&current.meta, current.snapshot)
        .await
        .expect("install again");
    let (applied, _) = restarted.applied_state().await.expect("applied state");
    assert_eq!(applied, meta.last_log_id);
    let all = store::mvcc::KeyRange::From(Vec::new());
    let served = mvcc.range(&all, Default::default()).expect("range");
    let expected = source_mvcc.range(&all, Default::default()).expect("range");
    assert_eq!(
        served.kvs, expected.kvs,
        "the old key is gone, the snapshot's are there"
    );
    assert_eq!(mvcc.current_revision(), source_mvcc.current_revision());
}

/// A member whose engine lost writes its snapshot holds (the state
/// machine's writes are not synced; a power loss can take them after the
/// log entries were purged) restores the snapshot from its own checkpoint
/// at the next start: openraft finds the snapshot newer than the state
/// machine and installs it (`restore_from_snapshot`, done by hand here).
#[tokio::test]
async fn a_member_restores_its_own_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine: Arc<dyn Engine> =
        Arc::new(store::engine::rocks::RocksEngine::open(&dir.path().join("db")).expect("open"));
    let (mvcc, mut sm) = state_machine(engine, dir.path());
    sm.applied_state().await.expect("applied state");
    sm.apply_entries([entry(1, vec![put("a"), put("b")]), entry(2, vec![put("c")])])
        .expect("apply");
    let built = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build a snapshot");
    assert_eq!(built.meta.last_log_id, Some(log_id(2)));
    let all = store::mvcc::KeyRange::From(Vec::new());
    let expected = mvcc.range(&all, Default::default()).expect("range").kvs;
    drop((built, sm, mvcc));

    // The next start, on an engine that lost everything.
    let lost: Arc<dyn Engine> =
        Arc::new(store::engine::rocks::RocksEngine::open(&dir.path().join("db2")).expect("open"));
    let (mvcc, mut restarted) = state_machine(lost, dir.path());
    let (applied, _) = restarted.applied_state().await.expect("applied state");
    assert_eq!(applied, None);
    let current = restarted
        .get_current_snapshot()
        .await
        .expect("read the current snapshot")
        .expect("the checkpoint is the current snapshot");
    assert_eq!(current.meta.last_log_id, Some(log_id(2)));
    restarted
        .install_snapshot(&current.meta.clone(), current.snapshot)
        .await
        .expect("restore");
    let (applied, _) = restarted.applied_state().await.expect("applied state");
    assert_eq!(applied, Some(log_id(2)));
    assert_eq!(
        mvcc.range(&all, Default::default()).expect("range").kvs,
        expected
    );
    let again = restarted
        .get_current_snapshot()
        .await
        .expect("read the current snapshot")
        .expect("still a current snapshot");
    assert_eq!(
        again.meta.last_log_id,
        Some(log_id(2)),
        "restoring keeps it current"
    );
}
