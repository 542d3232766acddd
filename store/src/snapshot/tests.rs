//! The table <-> bucket mapping, each bucket both ways, on the in-memory engine.

use std::collections::{BTreeMap, BTreeSet};

use crate::raft::{LeaderId, MemberInfo, Membership, NodeId};

use super::*;
use crate::engine::memory::MemoryEngine;
use crate::mvcc::Revision;

const MEMBER: u64 = 0x1f;
const LEARNER: u64 = 0xabc;
const LEASE_ID: i64 = 0x735b_a208_8124_2506;

fn kv(key: &[u8], create: i64, modified: i64, version: i64, value: &[u8], lease: i64) -> Vec<u8> {
    KeyValue {
        key: key.to_vec(),
        create_revision: create,
        mod_revision: modified,
        version,
        value: value.to_vec(),
        lease,
    }
    .encode_to_vec()
}

fn sample_auth() -> AuthState {
    let mut auth = AuthState {
        enabled: true,
        revision: 7,
        ..AuthState::default()
    };
    auth.users.insert(
        "root".into(),
        User {
            password_hash: "$2a$10$abcdefghijklmnopqrstuv".into(),
            no_password: false,
            roles: vec!["root".into()],
        },
    );
    auth.users.insert(
        "cert".into(),
        User {
            password_hash: String::new(),
            no_password: true,
            roles: vec!["reader".into(), "writer".into()],
        },
    );
    auth.roles.insert("root".into(), Role::default());
    auth.roles.insert(
        "reader".into(),
        Role {
            perms: vec![Permission {
                kind: 0,
                key: b"a".to_vec(),
                range_end: b"b".to_vec(),
            }],
        },
    );
    auth.roles.insert(
        "writer".into(),
        Role {
            perms: vec![
                Permission {
                    kind: 2,
                    key: b"k".to_vec(),
                    range_end: Vec::new(),
                },
                Permission {
                    kind: 1,
                    key: b"z".to_vec(),
                    range_end: b"\0".to_vec(),
                },
            ],
        },
    );
    auth
}

/// A store state touching every table and bucket.
fn sample() -> MemoryEngine {
    let engine = MemoryEngine::new();
    let mut b = WriteBatch::new();
    b.put(
        Table::Kv,
        Revision::new(2, 0).to_key(false),
        kv(b"a", 2, 2, 1, b"1", 0),
    );
    b.put(
        Table::Kv,
        Revision::new(3, 0).to_key(false),
        kv(b"b", 3, 3, 1, b"x", LEASE_ID),
    );
    b.put(
        Table::Kv,
        Revision::new(4, 0).to_key(false),
        kv(b"a", 2, 4, 2, b"2", 0),
    );
    b.put(
        Table::Kv,
        Revision::new(5, 1).to_key(true),
        kv(b"c", 0, 0, 0, b"", 0),
    );
    b.put(
        Table::Meta,
        META_CURRENT_REV.to_vec(),
        6i64.to_be_bytes().to_vec(),
    );
    b.put(
        Table::Meta,
        META_SCHEDULED_COMPACT_REV.to_vec(),
        3i64.to_be_bytes().to_vec(),
    );
    b.put(
        Table::Meta,
        META_FINISHED_COMPACT_REV.to_vec(),
        3i64.to_be_bytes().to_vec(),
    );
    b.put(
        Table::Lease,
        LEASE_ID.to_be_bytes().to_vec(),
        60i64.to_be_bytes().to_vec(),
    );
    b.put(
        Table::Meta,
        AUTH_STATE_KEY.to_vec(),
        codec::encode(&sample_auth()),
    );
    let applied = LogId::new(
        LeaderId {
            term: 4,
            node_id: MEMBER,
        },
        42,
    );
    b.put(
        Table::Meta,
        KEY_APPLIED.to_vec(),
        codec::encode(&Some(applied)),
    );
    let nodes: BTreeMap<NodeId, MemberInfo> = [
        (
            MEMBER,
            MemberInfo {
                name: "m0".into(),
                peer_urls: vec!["http://127.0.67.1:2380".into()],
                client_urls: vec!["http://127.0.67.1:2379".into()],
            },
        ),
        (
            LEARNER,
            MemberInfo {
                name: String::new(),
                peer_urls: vec!["http://127.0.67.2:2380".into()],
                client_urls: Vec::new(),
            },
        ),
    ]
    .into();
    let membership = StoredMembership::new(
        Some(applied),
        Membership::new(vec![BTreeSet::from([MEMBER])], nodes).expect("the voter is a node"),
    );
    b.put(
        Table::Meta,
        KEY_MEMBERSHIP.to_vec(),
        codec::encode(&membership),
    );
    let mut alarm = crate::alarm::ALARM_PREFIX.to_vec();
    alarm.extend_from_slice(&MEMBER.to_be_bytes());
    alarm.extend_from_slice(&1i32.to_be_bytes());
    b.put(Table::Meta, alarm, Vec::new());
    engine.write(b, false).unwrap();
    engine
}

fn get<'a>(db: &bolt::Db<'a>, bucket: &[u8], key: &[u8]) -> Option<&'a [u8]> {
    db.bucket(bucket)
        .unwrap()
        .unwrap()
        .get(key)
        .unwrap()
        .and_then(|v| v.data())
}

fn bucket_pairs(db: &bolt::Db<'_>, bucket: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    db.bucket(bucket)
        .unwrap()
        .unwrap()
        .iter()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.to_vec(), v.data().unwrap().to_vec())
        })
        .collect()
}

#[test]
fn every_bucket_is_written_as_etcd_3_5_1_lays_it_out() {
    let engine = sample();
    let file = create(&engine).unwrap();
    assert!(bolt::has_checksum(file.len() as u64), "SHA-256 trailer");
    let db = bolt::Db::open(bolt::split_and_verify(&file).unwrap()).unwrap();
    db.check().unwrap();
    let names: Vec<Vec<u8>> = db.buckets().map(|b| b.unwrap().0.to_vec()).collect();
    assert_eq!(names, schema::ALL_BUCKETS.map(<[u8]>::to_vec).to_vec());

    // key: verbatim, tombstone keys 18 bytes with a key-only KeyValue.
    let keys = bucket_pairs(&db, schema::BUCKET_KEY);
    assert_eq!(
        keys,
        crate::engine::scan_collect(&engine, Table::Kv, &[], None, 0).unwrap()
    );
    assert_eq!(keys[3].0.len(), schema::TOMBSTONE_KEY_LEN);
    assert_eq!(KeyValue::decode(keys[3].1.as_slice()).unwrap().key, b"c");

    // meta
    assert_eq!(
        get(&db, b"meta", b"consistent_index"),
        Some(&42u64.to_be_bytes()[..])
    );
    assert_eq!(get(&db, b"meta", b"term"), Some(&4u64.to_be_bytes()[..]));
    assert_eq!(
        get(&db, b"meta", b"confState"),
        Some(&br#"{"voters":[31],"learners":[2748],"auto_leave":false}"#[..])
    );
    let rev3 = schema::revision_key(schema::Revision { main: 3, sub: 0 });
    assert_eq!(get(&db, b"meta", b"scheduledCompactRev"), Some(&rev3[..]));
    assert_eq!(get(&db, b"meta", b"finishedCompactRev"), Some(&rev3[..]));
    assert_eq!(get(&db, b"meta", b"storageVersion"), Some(&b"3.6.0"[..]));
    assert_eq!(bucket_pairs(&db, b"meta").len(), 6);

    // lease
    assert_eq!(
        bucket_pairs(&db, b"lease"),
        vec![(
            schema::lease_key(LEASE_ID).to_vec(),
            encode_lease(LEASE_ID, 60)
        )]
    );
    assert_eq!(
        decode_lease(&encode_lease(LEASE_ID, 60)),
        Ok((LEASE_ID, 60))
    );

    // auth
    assert_eq!(get(&db, b"auth", b"authEnabled"), Some(&[1u8][..]));
    assert_eq!(
        get(&db, b"auth", b"authRevision"),
        Some(&7u64.to_be_bytes()[..])
    );
    let users = bucket_pairs(&db, b"authUsers");
    assert_eq!(users.len(), 2);
    let cert = authpb::User::decode(users[0].1.as_slice()).unwrap();
    assert_eq!((cert.name.as_slice(), cert.roles.len()), (&b"cert"[..], 2));
    assert!(cert.options.unwrap().no_password);
    let roles = bucket_pairs(&db, b"authRoles");
    assert_eq!(
        roles.iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
        [&b"reader"[..], b"root", b"writer"]
    );
    let writer = authpb::Role::decode(roles[2].1.as_slice()).unwrap();
    assert_eq!(writer.key_permission.len(), 2);
    assert_eq!(writer.key_permission[1].range_end, b"\0");

    // members, cluster, alarm
    assert_eq!(
        get(&db, b"members", b"1f"),
        Some(&br#"{"id":31,"peerURLs":["http://127.0.67.1:2380"],"name":"m0"}"#[..])
    );
    assert_eq!(
        get(&db, b"members", b"abc"),
        Some(&br#"{"id":2748,"peerURLs":["http://127.0.67.2:2380"],"isLearner":true}"#[..])
    );
    assert!(bucket_pairs(&db, b"members_removed").is_empty());
    assert_eq!(get(&db, b"cluster", b"clusterVersion"), Some(&b"3.5.0"[..]));
    assert_eq!(
        bucket_pairs(&db, b"alarm"),
        vec![(alarm_key(MEMBER, 1), Vec::new())]
    );

    let st = status(&file).unwrap();
    assert_eq!(
        (st.revision, st.total_key),
        (5, 4 + 5 + 1 + 2 + 2 + 3 + 2 + 1 + 1 + 1)
    );
}

#[test]
fn every_bucket_is_read_back_into_the_tables() {
    let engine = sample();
    let file = create(&engine).unwrap();
    let db = bolt::Db::open(database(&file, false).unwrap()).unwrap();
    let restored = MemoryEngine::new();
    let mut seen = 0;
    let imported = import(
        &db,
        &mut |b| Ok(restored.write(b, false)?),
        &mut |pairs, _| seen = pairs,
    )
    .unwrap();
    assert_eq!(
        imported,
        Imported {
            revisions: 4,
            revision: 5,
            compact_revision: 3,
            leases: 1,
            users: 2,
            roles: 3,
        }
    );
    assert_eq!(seen, 4 + 3 + 1 + 1, "kv, meta marks, lease, auth");
    for table in [Table::Kv, Table::Lease] {
        assert_eq!(
            crate::engine::scan_collect(&restored, table, &[], None, 0).unwrap(),
            crate::engine::scan_collect(&engine, table, &[], None, 0).unwrap(),
            "{table:?}"
        );
    }
    assert_eq!(auth_state(&restored).unwrap(), sample_auth());
    assert_eq!(read_i64(&restored, META_SCHEDULED_COMPACT_REV).unwrap(), 3);
    assert_eq!(read_i64(&restored, META_FINISHED_COMPACT_REV).unwrap(), 3);
    // The current revision comes from the last revision (the store's own
    // mark, 6, came from a write etcd would not count either).
    assert_eq!(read_i64(&restored, META_CURRENT_REV).unwrap(), 5);
    // Membership, Raft progress and alarms are the new cluster's own.
    for key in [KEY_APPLIED, KEY_MEMBERSHIP] {
        assert_eq!(restored.get(Table::Meta, key).unwrap(), None);
    }
    assert!(alarms(&restored).unwrap().is_empty());

    // The MVCC store opens on it at the right revision.
    let mvcc = crate::mvcc::MvccStore::open(std::sync::Arc::new(restored)).unwrap();
    assert_eq!((mvcc.current_revision(), mvcc.compact_revision()), (5, 3));
}

#[test]
fn an_empty_store_round_trips() {
    let engine = MemoryEngine::new();
    let file = create(&engine).unwrap();
    let st = status(&file).unwrap();
    assert_eq!(st.revision, 0);
    let db = bolt::Db::open(database(&file, false).unwrap()).unwrap();
    let restored = MemoryEngine::new();
    let imported = import(&db, &mut |b| Ok(restored.write(b, false)?), &mut |_, _| {}).unwrap();
    assert_eq!(imported.revision, 1);
    assert_eq!(auth_state(&restored).unwrap(), AuthState::default());
}

#[test]
fn damaged_files_are_refused_before_anything_is_written() {
    let file = create(&sample()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("m0.etcd");
    let mut corrupted = file.clone();
    corrupted[file.len() / 2] ^= 0xff;
    let err = restore(&corrupted, &target, false, &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("sha256 mismatch"), "{err}");
    let truncated = &file[..file.len() - 16];
    let err = restore(truncated, &target, false, &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(err, BackupError::Bolt(bolt::Error::NoChecksum { .. })),
        "{err}"
    );
    // A damaged page behind a recomputed trailer is found by the full check.
    let mut db = file[..file.len() - 32].to_vec();
    let page = 3 * 4096; // the root bucket's leaf
    db[page + 8] = 0x7f; // page flags
    let sum = bolt::sha256(&db);
    db.extend_from_slice(&sum);
    assert!(restore(&db, &target, false, &mut |_, _| {}).is_err());
    assert!(
        !target.exists(),
        "nothing may be created for a refused file"
    );

    // A good file restores once; the data dir is then taken.
    let r = restore(&file, &target, false, &mut |_, _| {}).unwrap();
    assert_eq!(r.revision, 5);
    assert!(matches!(
        restore(&file, &target, false, &mut |_, _| {}),
        Err(BackupError::DataDirExists(_))
    ));
}
