//! etcd KV semantics on the MVCC store, the same checks on both engines.
//!
//! These are unit-level checks of revision bookkeeping; the differential
//! tests in the workspace `tests/` crate compare whole answers with a real
//! etcd.

use std::sync::Arc;

use etcd_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcd_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcd_proto::etcdserverpb::request_op::Request;
use etcd_proto::etcdserverpb::response_op::Response;
use etcd_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use etcd_proto::mvccpb::Event;
use store::engine::memory::MemoryEngine;
use store::engine::rocks::RocksEngine;
use store::engine::{Engine, WriteBatch};
use store::errors::EtcdError;
use store::kv::{self, KvError, NoLeases};
use store::mvcc::{KeyRange, MvccStore, Prev};

fn put(store: &MvccStore, key: &str, value: &str) -> i64 {
    let mut txn = store.write();
    let req = PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    };
    let resp = kv::txn::put(&mut txn, &NoLeases, &req).expect("put");
    txn.commit(WriteBatch::new()).expect("commit");
    resp.header.unwrap().revision
}

fn delete(store: &MvccStore, key: &str, end: &str) -> i64 {
    let mut txn = store.write();
    let req = DeleteRangeRequest {
        key: key.into(),
        range_end: end.into(),
        ..Default::default()
    };
    let resp = kv::txn::delete_range(&mut txn, &req).expect("delete");
    txn.commit(WriteBatch::new()).expect("commit");
    resp.deleted
}

fn get(
    store: &MvccStore,
    req: RangeRequest,
) -> Result<etcd_proto::etcdserverpb::RangeResponse, KvError> {
    kv::range::range(store, &req)
}

fn keys(resp: &etcd_proto::etcdserverpb::RangeResponse) -> Vec<String> {
    resp.kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
        .collect()
}

fn run_suite(make: &dyn Fn() -> Arc<dyn Engine>) {
    revisions_versions_and_history(&MvccStore::open(make()).unwrap());
    limits_counts_and_sorting(&MvccStore::open(make()).unwrap());
    txn_compares_and_revision_bumps(&MvccStore::open(make()).unwrap());
    compaction_errors_and_physical_deletion(make);
    previous_values_only_when_wanted(&MvccStore::open(make()).unwrap());
}

/// The events of one write transaction running `f`.
fn events_of(s: &MvccStore, f: impl FnOnce(&mut store::mvcc::WriteTxn<'_>)) -> Vec<Event> {
    let mut txn = s.write();
    f(&mut txn);
    txn.commit(WriteBatch::new()).unwrap().1
}

fn put_event(s: &MvccStore, key: &str, value: &str) -> Event {
    let mut events = events_of(s, |t| {
        t.put(key.as_bytes(), value.into(), 0, Prev::Unread)
            .unwrap();
    });
    assert_eq!(events.len(), 1);
    events.remove(0)
}

/// Puts and deletes take create revision and version from the index; their
/// events carry the replaced value only while a prev_kv watcher is open,
/// and `prev_kv` finds it later otherwise.
fn previous_values_only_when_wanted(s: &MvccStore) {
    put(s, "k", "v1"); // rev 2
    let ev = put_event(s, "k", "v2"); // rev 3
    let kv = ev.kv.unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    assert_eq!(ev.prev_kv, None, "no watcher wants it: not read");
    let late = s.prev_kv(b"k", 3).unwrap().expect("history has it");
    assert_eq!((late.value, late.version), (b"v1".to_vec(), 1));
    assert_eq!(s.prev_kv(b"k", 2).unwrap(), None, "created at 2");

    let interest = s.watch_prev_kv();
    let ev = put_event(s, "k", "v3"); // rev 4
    assert_eq!(ev.prev_kv.unwrap().value, b"v2".to_vec());
    let del = events_of(s, |t| {
        assert_eq!(
            t.delete_range(&KeyRange::Single(b"k".to_vec()), false)
                .unwrap(),
            (1, vec![])
        );
    }); // rev 5
    assert_eq!(del[0].prev_kv.as_ref().unwrap().value, b"v3".to_vec());
    drop(interest);

    let ev = put_event(s, "k", "new"); // rev 6
    let kv = ev.kv.unwrap();
    assert_eq!((kv.create_revision, kv.version), (6, 1), "a new life");
    assert_eq!(s.prev_kv(b"k", 6).unwrap(), None, "deleted at 5");
    let del = events_of(s, |t| {
        let (n, values) = t
            .delete_range(&KeyRange::From(b"k".to_vec()), true)
            .unwrap();
        assert_eq!((n, values[0].value.as_slice()), (1, &b"new"[..]));
    }); // rev 7
    assert_eq!(
        del[0].prev_kv, None,
        "asked by the request, not by a watcher"
    );

    // Within one transaction, a later put sees the earlier one's version.
    put(s, "t", "1"); // rev 8
    let evs = events_of(s, |t| {
        t.put(b"t", b"2".to_vec(), 0, Prev::Unread).unwrap();
        t.seal();
        t.put(b"t", b"3".to_vec(), 0, Prev::Unread).unwrap();
    });
    let kv = evs[0].kv.as_ref().unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (8, 10, 3)
    );

    // After compaction the index still knows the version; the history
    // before the compaction revision is gone, so no late prev_kv.
    let mut txn = s.write();
    txn.compact(10).unwrap();
    txn.commit(WriteBatch::new()).unwrap();
    let ev = put_event(s, "t", "4"); // rev 11
    let kv = ev.kv.unwrap();
    assert_eq!((kv.create_revision, kv.version), (8, 4));
    assert_eq!(s.prev_kv(b"t", 11).unwrap().unwrap().value, b"3".to_vec());
    assert_eq!(s.prev_kv(b"t", 10).unwrap(), None, "compacted");
}

fn revisions_versions_and_history(s: &MvccStore) {
    assert_eq!(s.current_revision(), 1, "a fresh store is at revision 1");
    assert_eq!(put(s, "a", "1"), 2);
    assert_eq!(put(s, "a", "2"), 3);
    assert_eq!(delete(s, "a", ""), 1);
    assert_eq!(put(s, "a", "3"), 5);
    let now = get(
        s,
        RangeRequest {
            key: "a".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let kv = &now.kvs[0];
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (5, 5, 1),
        "new generation after delete"
    );
    let then = get(
        s,
        RangeRequest {
            key: "a".into(),
            revision: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let kv = &then.kvs[0];
    assert_eq!(
        (
            kv.create_revision,
            kv.mod_revision,
            kv.version,
            kv.value.as_slice()
        ),
        (2, 3, 2, &b"2"[..])
    );
    assert_eq!(
        then.header.unwrap().revision,
        5,
        "historical reads carry the current revision"
    );
    let gone = get(
        s,
        RangeRequest {
            key: "a".into(),
            revision: 4,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(gone.kvs.is_empty() && gone.count == 0, "deleted at 4");
    assert_eq!(delete(s, "nothing", ""), 0);
    assert_eq!(
        s.current_revision(),
        5,
        "a delete of nothing creates no revision"
    );
    let future = get(
        s,
        RangeRequest {
            key: "a".into(),
            revision: 6,
            ..Default::default()
        },
    );
    assert!(matches!(future, Err(KvError::Etcd(EtcdError::FutureRev))));
}

fn limits_counts_and_sorting(s: &MvccStore) {
    for (k, v) in [("k1", "c"), ("k2", "a"), ("k3", "b"), ("k4", "a")] {
        put(s, k, v);
    }
    let r = get(
        s,
        RangeRequest {
            key: "k".into(),
            range_end: "l".into(),
            limit: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        (keys(&r), r.count, r.more),
        (vec!["k1".to_string(), "k2".to_string()], 4, true)
    );
    let r = get(
        s,
        RangeRequest {
            key: "k".into(),
            range_end: "\0".into(),
            count_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((r.kvs.len(), r.count), (0, 4));
    let by_value = RangeRequest {
        key: "k".into(),
        range_end: "l".into(),
        sort_target: SortTarget::Value as i32,
        sort_order: SortOrder::Descend as i32,
        ..Default::default()
    };
    let r = get(s, by_value.clone()).unwrap();
    assert_eq!(
        keys(&r),
        vec!["k1", "k3", "k2", "k4"],
        "stable descending sort by value"
    );
    // Keys only: values are dropped as they are read, except when the sort
    // needs them (then after sorting, as etcd does).
    let keys_only_by_value = RangeRequest {
        keys_only: true,
        ..by_value
    };
    let r = get(s, keys_only_by_value).unwrap();
    assert_eq!(keys(&r), vec!["k1", "k3", "k2", "k4"]);
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()));
    let keys_only = RangeRequest {
        key: "k".into(),
        range_end: "l".into(),
        keys_only: true,
        ..Default::default()
    };
    let r = get(s, keys_only).unwrap();
    assert_eq!(keys(&r), vec!["k1", "k2", "k3", "k4"]);
    assert!(r
        .kvs
        .iter()
        .all(|kv| kv.value.is_empty() && kv.mod_revision > 0));
    let newest = RangeRequest {
        key: "k".into(),
        range_end: "l".into(),
        min_mod_revision: 4,
        keys_only: true,
        ..Default::default()
    };
    let r = get(s, newest).unwrap();
    assert_eq!(
        (keys(&r), r.count),
        (vec!["k3".to_string(), "k4".to_string()], 4),
        "count ignores filters"
    );
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()), "keys_only");
}

fn op(request: Request) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

fn txn_compares_and_revision_bumps(s: &MvccStore) {
    put(s, "x", "1");
    let before = s.current_revision();
    let cmp = |result: CompareResult, target: CompareTarget, union: TargetUnion| Compare {
        result: result as i32,
        target: target as i32,
        key: "x".into(),
        target_union: Some(union),
        range_end: vec![],
    };
    let read_only = TxnRequest {
        compare: vec![cmp(
            CompareResult::Equal,
            CompareTarget::Value,
            TargetUnion::Value("1".into()),
        )],
        success: vec![op(Request::RequestRange(RangeRequest {
            key: "x".into(),
            ..Default::default()
        }))],
        failure: vec![],
    };
    let mut txn = s.write();
    let resp = kv::txn::txn(&mut txn, &NoLeases, &read_only).unwrap();
    txn.commit(WriteBatch::new()).unwrap();
    assert!(resp.succeeded);
    // Served without the write lock, as the server serves read-only txns:
    // the same answer.
    let view = kv::txn::AtRevision::now(s);
    assert_eq!(kv::txn::read_only(&view, &read_only).unwrap(), resp);
    let mut future = read_only.clone();
    future.success = vec![op(Request::RequestRange(RangeRequest {
        key: "x".into(),
        revision: before + 1,
        ..Default::default()
    }))];
    put(s, "x", "2");
    assert!(
        matches!(
            kv::txn::read_only(&view, &future),
            Err(KvError::Etcd(store::errors::EtcdError::FutureRev))
        ),
        "the view stays at the revision it started at"
    );
    let view = kv::txn::AtRevision::now(s);
    let later = kv::txn::read_only(&view, &future).unwrap();
    assert!(!later.succeeded, "x is 2 now");
    let before = s.current_revision();
    assert_eq!(
        s.current_revision(),
        before,
        "read-only txn does not bump the revision"
    );

    let create_if_missing = TxnRequest {
        compare: vec![Compare {
            key: "new".into(),
            target: CompareTarget::Mod as i32,
            ..Default::default()
        }],
        success: vec![
            op(Request::RequestPut(PutRequest {
                key: "new".into(),
                value: "v".into(),
                ..Default::default()
            })),
            op(Request::RequestPut(PutRequest {
                key: "new2".into(),
                value: "v".into(),
                ..Default::default()
            })),
            op(Request::RequestRange(RangeRequest {
                key: "new".into(),
                ..Default::default()
            })),
        ],
        failure: vec![],
    };
    let mut txn = s.write();
    let resp = kv::txn::txn(&mut txn, &NoLeases, &create_if_missing).unwrap();
    txn.commit(WriteBatch::new()).unwrap();
    assert!(resp.succeeded, "a missing key compares as mod_revision 0");
    assert_eq!(
        s.current_revision(),
        before + 1,
        "one revision for the whole txn"
    );
    let Some(Response::ResponseRange(r)) = &resp.responses[2].response else {
        panic!("range response")
    };
    assert_eq!(
        r.kvs[0].mod_revision,
        before + 1,
        "reads inside a txn see its writes"
    );

    let unknown_lease = TxnRequest {
        compare: vec![],
        success: vec![
            op(Request::RequestPut(PutRequest {
                key: "y".into(),
                ..Default::default()
            })),
            op(Request::RequestPut(PutRequest {
                key: "z".into(),
                lease: 42,
                ..Default::default()
            })),
        ],
        failure: vec![],
    };
    let mut txn = s.write();
    let err = kv::txn::txn(&mut txn, &NoLeases, &unknown_lease).unwrap_err();
    assert!(!txn.has_changes(), "no partial writes");
    txn.commit(WriteBatch::new()).unwrap();
    assert!(matches!(err, KvError::Etcd(EtcdError::LeaseNotFound)));
    let value_on_missing = TxnRequest {
        compare: vec![cmp(
            CompareResult::NotEqual,
            CompareTarget::Value,
            TargetUnion::Value("q".into()),
        )],
        ..Default::default()
    };
    let mut value_on_missing = value_on_missing;
    value_on_missing.compare[0].key = "missing".into();
    let mut txn = s.write();
    let resp = kv::txn::txn(&mut txn, &NoLeases, &value_on_missing).unwrap();
    txn.commit(WriteBatch::new()).unwrap();
    assert!(!resp.succeeded, "a VALUE compare on a missing key is false");
}

fn compaction_errors_and_physical_deletion(make: &dyn Fn() -> Arc<dyn Engine>) {
    let engine = make();
    let s = MvccStore::open(engine.clone()).unwrap();
    for i in 0..10 {
        put(&s, "c", &i.to_string());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut txn = s.write();
    let job = txn.compact(6).unwrap();
    txn.commit(WriteBatch::new()).unwrap();
    rt.block_on(s.run_physical_compaction(job)).unwrap();
    let old = get(
        &s,
        RangeRequest {
            key: "c".into(),
            revision: 5,
            ..Default::default()
        },
    );
    assert!(matches!(old, Err(KvError::Etcd(EtcdError::Compacted))));
    let at = get(
        &s,
        RangeRequest {
            key: "c".into(),
            revision: 6,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        at.kvs[0].value,
        b"4".to_vec(),
        "the compaction revision itself stays readable"
    );
    let mut txn = s.write();
    assert!(
        txn.compact(6).is_err(),
        "compacting again at the same revision"
    );
    assert!(txn.compact(99).is_err(), "compacting the future");
    txn.commit(WriteBatch::new()).unwrap();
    assert!(
        s.kv_at_revision(store::mvcc::Revision::new(5, 0), false)
            .unwrap()
            .is_none(),
        "physically deleted"
    );
    let reopened = MvccStore::open(engine).unwrap();
    assert_eq!(reopened.current_revision(), s.current_revision());
    assert_eq!(reopened.compact_revision(), 6);
    let now = get(
        &reopened,
        RangeRequest {
            key: "c".into(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        (now.kvs[0].version, now.kvs[0].create_revision),
        (10, 2),
        "rebuilt index keeps versions"
    );
}

#[test]
fn kv_semantics_memory_engine() {
    run_suite(&|| Arc::new(MemoryEngine::new()));
}

#[test]
fn kv_semantics_rocks_engine() {
    let dirs = std::sync::Mutex::new(Vec::new());
    run_suite(&|| {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        dirs.lock().unwrap().push(dir);
        Arc::new(engine)
    });
}
