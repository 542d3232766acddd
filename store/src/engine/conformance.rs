//! The engine conformance suite: every [`Engine`] must pass it.
//!
//! Called from each engine's unit tests with a constructor for a fresh,
//! empty engine. Checks ordering, bounds, batches, snapshots and table
//! independence: everything the MVCC and Raft layers assume of an engine.

use std::ops::ControlFlow;

use super::{scan_collect, Engine, EngineResult, Table, WriteBatch};

/// Builds a fresh, empty engine.
pub type MakeEngine<'a> = dyn Fn() -> Box<dyn Engine> + 'a;

/// Runs every conformance check, each on a fresh engine.
pub fn run_all(make: &MakeEngine<'_>) {
    point_reads_and_overwrites(make().as_ref());
    scans_are_ordered_and_bounded(make().as_ref());
    reverse_scans_are_ordered_and_bounded(make().as_ref());
    scans_stop_when_visitor_breaks(make().as_ref());
    delete_range_is_half_open(make().as_ref());
    later_ops_in_a_batch_win(make().as_ref());
    tables_are_independent(make().as_ref());
    snapshots_do_not_see_later_writes(make().as_ref());
    checkpoints_are_frozen_copies(make().as_ref());
    bulk_loads_land_over_a_cleared_table(make().as_ref());
}

fn put(e: &dyn Engine, t: Table, k: &[u8], v: &[u8]) {
    let mut b = WriteBatch::new();
    b.put(t, k.to_vec(), v.to_vec());
    e.write(b, false).expect("write");
}

fn keys(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<&[u8]> {
    pairs.iter().map(|(k, _)| k.as_slice()).collect()
}

fn point_reads_and_overwrites(e: &dyn Engine) {
    assert_eq!(e.get(Table::Kv, b"a").unwrap(), None);
    put(e, Table::Kv, b"a", b"1");
    put(e, Table::Kv, b"a", b"2");
    assert_eq!(e.get(Table::Kv, b"a").unwrap(), Some(b"2".to_vec()));
    let mut b = WriteBatch::new();
    b.delete(Table::Kv, b"a".to_vec());
    e.write(b, true).unwrap();
    assert_eq!(e.get(Table::Kv, b"a").unwrap(), None);
    e.sync().unwrap();
}

fn fill(e: &dyn Engine) {
    for k in [&b"b"[..], b"a", b"c", b"ab", b"\x00", b"\xff"] {
        put(e, Table::Kv, k, k);
    }
}

fn scans_are_ordered_and_bounded(e: &dyn Engine) {
    fill(e);
    let all = scan_collect(e, Table::Kv, b"", None, 0).unwrap();
    assert_eq!(
        keys(&all),
        vec![&b"\x00"[..], b"a", b"ab", b"b", b"c", b"\xff"]
    );
    let some = scan_collect(e, Table::Kv, b"a", Some(b"c"), 0).unwrap();
    assert_eq!(
        keys(&some),
        vec![&b"a"[..], b"ab", b"b"],
        "end is exclusive"
    );
    assert!(
        scan_collect(e, Table::Kv, b"c", Some(b"a"), 0)
            .unwrap()
            .is_empty(),
        "inverted range is empty"
    );
    assert!(
        scan_collect(e, Table::Kv, b"b", Some(b"b"), 0)
            .unwrap()
            .is_empty(),
        "empty range"
    );
    let limited = scan_collect(e, Table::Kv, b"a", None, 2).unwrap();
    assert_eq!(keys(&limited), vec![&b"a"[..], b"ab"]);
    assert_eq!(all[1].1, b"a".to_vec(), "values come with keys");
}

fn reverse_scans_are_ordered_and_bounded(e: &dyn Engine) {
    fill(e);
    let mut seen = Vec::new();
    e.scan_reverse(Table::Kv, b"a", Some(b"c"), &mut |k, _| {
        seen.push(k.to_vec());
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(seen, vec![b"b".to_vec(), b"ab".to_vec(), b"a".to_vec()]);
    let mut last = None;
    e.scan_reverse(Table::Kv, b"", None, &mut |k, _| {
        last = Some(k.to_vec());
        ControlFlow::Break(())
    })
    .unwrap();
    assert_eq!(
        last,
        Some(b"\xff".to_vec()),
        "reverse scan starts at the last key"
    );
}

fn scans_stop_when_visitor_breaks(e: &dyn Engine) {
    fill(e);
    let mut n = 0;
    e.scan(Table::Kv, b"", None, &mut |_, _| {
        n += 1;
        if n == 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .unwrap();
    assert_eq!(n, 3);
}

fn delete_range_is_half_open(e: &dyn Engine) {
    fill(e);
    let mut b = WriteBatch::new();
    b.delete_range(Table::Kv, b"a".to_vec(), b"b".to_vec());
    e.write(b, false).unwrap();
    let all = scan_collect(e, Table::Kv, b"", None, 0).unwrap();
    assert_eq!(keys(&all), vec![&b"\x00"[..], b"b", b"c", b"\xff"]);
}

fn later_ops_in_a_batch_win(e: &dyn Engine) {
    let mut b = WriteBatch::new();
    b.put(Table::Meta, b"k".to_vec(), b"1".to_vec());
    b.delete(Table::Meta, b"k".to_vec());
    b.put(Table::Meta, b"k".to_vec(), b"3".to_vec());
    b.put(Table::Meta, b"gone".to_vec(), b"x".to_vec());
    b.delete_range(Table::Meta, b"g".to_vec(), b"h".to_vec());
    assert_eq!(b.len(), 5);
    e.write(b, true).unwrap();
    assert_eq!(e.get(Table::Meta, b"k").unwrap(), Some(b"3".to_vec()));
    assert_eq!(e.get(Table::Meta, b"gone").unwrap(), None);
}

fn tables_are_independent(e: &dyn Engine) {
    put(e, Table::Kv, b"k", b"kv");
    put(e, Table::Meta, b"k", b"meta");
    put(e, Table::RaftLog, b"k", b"log");
    assert_eq!(e.get(Table::Kv, b"k").unwrap(), Some(b"kv".to_vec()));
    assert_eq!(e.get(Table::Meta, b"k").unwrap(), Some(b"meta".to_vec()));
    assert_eq!(e.get(Table::Lease, b"k").unwrap(), None);
    let mut b = WriteBatch::new();
    b.delete_range(Table::Kv, b"".to_vec(), b"\xff\xff".to_vec());
    e.write(b, false).unwrap();
    assert_eq!(e.get(Table::Meta, b"k").unwrap(), Some(b"meta".to_vec()));
}

fn snapshots_do_not_see_later_writes(e: &dyn Engine) {
    put(e, Table::Kv, b"a", b"old");
    let snap = e.snapshot();
    put(e, Table::Kv, b"a", b"new");
    put(e, Table::Kv, b"b", b"new");
    assert_eq!(snap.get(Table::Kv, b"a").unwrap(), Some(b"old".to_vec()));
    assert_eq!(snap.get(Table::Kv, b"b").unwrap(), None);
    let pairs = scan_collect(snap.as_ref(), Table::Kv, b"", None, 0).unwrap();
    assert_eq!(keys(&pairs), vec![&b"a"[..]]);
    let mut rev = Vec::new();
    snap.scan_reverse(Table::Kv, b"", None, &mut |k, _| {
        rev.push(k.to_vec());
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(rev, vec![b"a".to_vec()]);
    assert_eq!(e.get(Table::Kv, b"a").unwrap(), Some(b"new".to_vec()));
}

fn checkpoints_are_frozen_copies(e: &dyn Engine) {
    put(e, Table::Kv, b"a", b"old");
    put(e, Table::Meta, b"m", b"1");
    put(e, Table::RaftLog, b"l", b"entry");
    let dir = tempfile::tempdir().expect("tempdir");
    let copy_dir = dir.path().join("copy");
    e.checkpoint(&copy_dir).expect("checkpoint");
    assert!(
        e.checkpoint(&copy_dir).is_err(),
        "a checkpoint never overwrites"
    );
    put(e, Table::Kv, b"a", b"new");
    put(e, Table::Kv, b"b", b"later");
    let copy = e.open_checkpoint(&copy_dir).expect("open checkpoint");
    assert_eq!(copy.get(Table::Kv, b"a").unwrap(), Some(b"old".to_vec()));
    assert_eq!(copy.get(Table::Kv, b"b").unwrap(), None);
    assert_eq!(copy.get(Table::Meta, b"m").unwrap(), Some(b"1".to_vec()));
    let log = scan_collect(copy.as_ref(), Table::RaftLog, b"", None, 0).unwrap();
    assert_eq!(log, vec![(b"l".to_vec(), b"entry".to_vec())]);
    assert_eq!(e.get(Table::Kv, b"a").unwrap(), Some(b"new".to_vec()));
    assert!(e.open_checkpoint(&dir.path().join("missing")).is_err());
}

/// A bulk load after a range delete (a snapshot install): the loaded pairs
/// read as the newest data, across tables and table files, the deleted ones
/// stay deleted, and the staging directory is gone.
fn bulk_loads_land_over_a_cleared_table(e: &dyn Engine) {
    put(e, Table::Kv, b"a", b"old");
    put(e, Table::Kv, b"z", b"old");
    put(e, Table::Lease, b"l", b"old");
    let mut clear = WriteBatch::new();
    clear.delete_range(Table::Kv, Vec::new(), vec![0xff; 32]);
    clear.delete_range(Table::Lease, Vec::new(), vec![0xff; 32]);
    e.write(clear, true).unwrap();
    let mut pairs = vec![(Table::Kv, b"a".to_vec(), b"new".to_vec())];
    pairs.extend((0..1000u32).map(|n| (Table::Kv, n.to_be_bytes().to_vec(), vec![7; 100])));
    pairs.sort();
    pairs.push((Table::Lease, b"m".to_vec(), b"new".to_vec()));
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    let mut source = pairs.clone().into_iter();
    let mut next = || -> EngineResult<_> { Ok(source.next()) };
    e.bulk_load(&staging, &mut next).unwrap();
    assert!(!staging.exists());
    assert_eq!(e.get(Table::Kv, b"a").unwrap(), Some(b"new".to_vec()));
    assert_eq!(e.get(Table::Kv, b"z").unwrap(), None);
    assert_eq!(e.get(Table::Lease, b"l").unwrap(), None);
    assert_eq!(e.get(Table::Lease, b"m").unwrap(), Some(b"new".to_vec()));
    assert_eq!(
        scan_collect(e, Table::Kv, b"", None, 0).unwrap().len(),
        1001
    );
    put(e, Table::Kv, b"a", b"newer");
    assert_eq!(e.get(Table::Kv, b"a").unwrap(), Some(b"newer".to_vec()));
}
