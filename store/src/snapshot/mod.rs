//! Backup files in etcd 3.5's snapshot format: what `Maintenance.Snapshot`
//! streams (and `etcdctl snapshot save` writes), what `etcdutl snapshot
//! status|restore` read, and what `store-util snapshot status|restore`
//! read (files from this store or from etcd 3.5).
//!
//! A backup is a bbolt file laid out as etcd 3.5.1's backend (see
//! [`bolt::etcd`] for the buckets and encodings), followed by the SHA-256
//! of that file (32 bytes). The store's tables map onto the buckets:
//!
//! | bucket            | from the store                                                     |
//! |-------------------|--------------------------------------------------------------------|
//! | `key`             | the `kv` table verbatim (same revision keys, same `KeyValue`s, tombstones as etcd writes them) |
//! | `meta`            | `consistent_index`/`term` from the applied log id, `confState` from the Raft membership, `scheduledCompactRev`/`finishedCompactRev` (as 17-byte revision keys) from the MVCC marks |
//! | `lease`           | the `lease` table: id -> `leasepb.Lease{ID, TTL}`                  |
//! | `auth`            | `authRevision`; `authEnabled` when auth is on                     |
//! | `authUsers`/`authRoles` | the auth state as `authpb.User`/`authpb.Role`               |
//! | `members`         | the Raft membership: hex id -> 3.5.1's member JSON                 |
//! | `members_removed` | empty (the store keeps no list of removed ids)                     |
//! | `cluster`         | `clusterVersion` = `3.5.0`                                         |
//! | `alarm`           | raised alarms (`etcdserverpb.AlarmMember` keys)                    |
//!
//! Restoring ([`restore`]) writes the key history, the compaction marks,
//! the leases and the auth state into a fresh data directory. It leaves out
//! the old cluster's membership, Raft progress and alarms, as `etcdutl
//! snapshot restore` replaces them: the restored member initializes Raft
//! from its own `--initial-cluster` when it first starts with
//! `--initial-cluster-state new`. Every member of the new cluster is
//! restored from the same file.

use std::io::{Seek, Write};
use std::ops::ControlFlow;
use std::path::Path;

use crate::raft::{LogId, StoredMembership};
use bolt::etcd as schema;
use etcd_proto::authpb;
use etcd_proto::etcdserverpb::AlarmMember;
use etcd_proto::mvccpb::KeyValue;
use prost::Message;

use crate::alarm::alarms;
use crate::auth::perm::Permission;
use crate::auth::state::{Role, User};
use crate::auth::{AuthState, AUTH_STATE_KEY};
use crate::codec;
use crate::engine::rocks::RocksEngine;
use crate::engine::{Engine, EngineError, EngineRead, Table, WriteBatch};
use crate::mvcc::{META_CURRENT_REV, META_FINISHED_COMPACT_REV, META_SCHEDULED_COMPACT_REV};
use crate::raft::state_machine::{KEY_APPLIED, KEY_MEMBERSHIP};

/// The cluster version written into `cluster/clusterVersion`: 3.5's, so
/// that etcd 3.5 (which refuses a data directory of a newer cluster
/// version) restores the file as well as etcd 3.6 does.
pub const CLUSTER_VERSION: &str = "3.5.0";

/// Engine batch size (pairs) while restoring.
const RESTORE_BATCH_KEYS: usize = 10_000;

/// Restore progress is reported every this many keys.
pub const PROGRESS_EVERY_KEYS: u64 = 100_000;

/// Backup problems.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The file is not a valid bbolt file or its SHA-256 trailer is wrong.
    #[error("snapshot file is invalid: {0}")]
    Bolt(#[from] bolt::Error),
    /// A bucket entry does not decode as etcd 3.5 writes it.
    #[error("snapshot file is invalid: bucket {bucket}: {what}")]
    Content {
        /// The bucket.
        bucket: &'static str,
        /// What is wrong.
        what: String,
    },
    /// The target data directory already holds data.
    #[error("data dir {0} already exists and is not empty")]
    DataDirExists(String),
    /// Reading or writing the engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Creating the data directory or a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

fn content(bucket: &'static str, what: impl std::fmt::Display) -> BackupError {
    BackupError::Content {
        bucket,
        what: what.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Store -> etcd.
// ---------------------------------------------------------------------------

/// 3.5.1's `members` bucket value (field order and omissions as Go writes them).
#[derive(serde::Serialize, serde::Deserialize)]
struct MemberJson {
    id: u64,
    #[serde(rename = "peerURLs", default)]
    peer_urls: Vec<String>,
    #[serde(
        rename = "isLearner",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    is_learner: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    name: String,
}

/// 3.5.1's `meta/confState` value.
#[derive(serde::Serialize)]
struct ConfStateJson {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    voters: Vec<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    learners: Vec<u64>,
    auto_leave: bool,
}

/// Key-value pairs of a table or bucket.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn engine_pairs(view: &dyn EngineRead, table: Table) -> Result<Pairs, EngineError> {
    crate::engine::scan_collect(view, table, &[], None, 0)
}

fn read_i64(view: &dyn EngineRead, key: &[u8]) -> Result<i64, EngineError> {
    match view.get(Table::Meta, key)? {
        Some(v) => v
            .as_slice()
            .try_into()
            .map(i64::from_be_bytes)
            .map_err(|_| EngineError::corrupt(format!("meta value of {key:?}"))),
        None => Ok(0),
    }
}

fn auth_state(view: &dyn EngineRead) -> Result<AuthState, EngineError> {
    match view.get(Table::Meta, AUTH_STATE_KEY)? {
        Some(b) => codec::decode(&b).map_err(|e| EngineError::corrupt(format!("auth state: {e}"))),
        None => Ok(AuthState::default()),
    }
}

/// `authpb.User` of a store user.
pub fn user_to_proto(name: &str, u: &User) -> authpb::User {
    authpb::User {
        name: name.as_bytes().to_vec(),
        password: u.password_hash.as_bytes().to_vec(),
        roles: u.roles.clone(),
        options: Some(authpb::UserAddOptions {
            no_password: u.no_password,
        }),
    }
}

/// `authpb.Role` of a store role.
pub fn role_to_proto(name: &str, r: &Role) -> authpb::Role {
    authpb::Role {
        name: name.as_bytes().to_vec(),
        key_permission: r
            .perms
            .iter()
            .map(|p| authpb::Permission {
                perm_type: p.kind,
                key: p.key.clone(),
                range_end: p.range_end.clone(),
            })
            .collect(),
    }
}

/// `leasepb.Lease{ID: id, TTL: ttl}` (fields 1 and 2, varints; zero fields omitted).
pub fn encode_lease(id: i64, ttl: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(22);
    for (tag, v) in [(0x08u8, id), (0x10u8, ttl)] {
        if v != 0 {
            out.push(tag);
            prost::encoding::encode_varint(v as u64, &mut out);
        }
    }
    out
}

/// Decodes `leasepb.Lease` into (ID, TTL); RemainingTTL (field 3) and unknown fields are skipped.
pub fn decode_lease(mut buf: &[u8]) -> Result<(i64, i64), String> {
    let (mut id, mut ttl) = (0i64, 0i64);
    while !buf.is_empty() {
        let key = prost::encoding::decode_varint(&mut buf).map_err(|e| e.to_string())?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                let v = prost::encoding::decode_varint(&mut buf).map_err(|e| e.to_string())? as i64;
                match field {
                    1 => id = v,
                    2 => ttl = v,
                    _ => {}
                }
            }
            1 if buf.len() >= 8 => buf = &buf[8..],
            5 if buf.len() >= 4 => buf = &buf[4..],
            2 => {
                let n =
                    prost::encoding::decode_varint(&mut buf).map_err(|e| e.to_string())? as usize;
                if n > buf.len() {
                    return Err("truncated field".into());
                }
                buf = &buf[n..];
            }
            _ => return Err(format!("bad wire type {wire}")),
        }
    }
    Ok((id, ttl))
}

/// Writes the bbolt file of `view` (a consistent engine snapshot) to `out`.
pub fn write_db<W: Write + Seek>(
    view: &dyn EngineRead,
    out: W,
) -> Result<(W, bolt::Summary), BackupError> {
    let mut w = bolt::Writer::new(out, bolt::WriterOptions::default())?;

    // alarm
    let mut alarm_pairs: Pairs = alarms(view)?
        .into_iter()
        .map(|a| (a.encode_to_vec(), Vec::new()))
        .collect();
    alarm_pairs.dedup_by(|a, b| a.0 == b.0);
    w.write_unsorted(schema::BUCKET_ALARM, alarm_pairs)?;

    // auth, authRoles, authUsers
    let auth = auth_state(view)?;
    let mut auth_pairs = Vec::new();
    if auth.enabled {
        auth_pairs.push((
            schema::AUTH_ENABLED.to_vec(),
            schema::AUTH_ENABLED_TRUE.to_vec(),
        ));
    }
    auth_pairs.push((
        schema::AUTH_REVISION.to_vec(),
        auth.revision.to_be_bytes().to_vec(),
    ));
    w.write_sorted(schema::BUCKET_AUTH, auth_pairs)?;
    w.write_sorted(
        schema::BUCKET_AUTH_ROLES,
        auth.roles
            .iter()
            .map(|(n, r)| (n.as_bytes().to_vec(), role_to_proto(n, r).encode_to_vec())),
    )?;
    w.write_sorted(
        schema::BUCKET_AUTH_USERS,
        auth.users
            .iter()
            .map(|(n, u)| (n.as_bytes().to_vec(), user_to_proto(n, u).encode_to_vec())),
    )?;

    // cluster
    w.write_sorted(
        schema::BUCKET_CLUSTER,
        [(schema::CLUSTER_VERSION, CLUSTER_VERSION.as_bytes())],
    )?;

    // key: the kv table verbatim, streamed.
    {
        let mut b = w.bucket(schema::BUCKET_KEY)?;
        let mut failure = None;
        view.scan(Table::Kv, &[], None, &mut |k, v| match b.put(k, v) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                failure = Some(e);
                ControlFlow::Break(())
            }
        })?;
        if let Some(e) = failure {
            return Err(e.into());
        }
        b.finish()?;
    }

    // lease
    let mut lease_pairs = Vec::new();
    for (k, v) in engine_pairs(view, Table::Lease)? {
        let (Ok(id), Ok(ttl)) = (
            <[u8; 8]>::try_from(k.as_slice()).map(i64::from_be_bytes),
            <[u8; 8]>::try_from(v.as_slice()).map(i64::from_be_bytes),
        ) else {
            return Err(EngineError::corrupt("lease table entry").into());
        };
        lease_pairs.push((schema::lease_key(id).to_vec(), encode_lease(id, ttl)));
    }
    w.write_sorted(schema::BUCKET_LEASE, lease_pairs)?;

    // members, members_removed, meta
    let membership: StoredMembership = match view.get(Table::Meta, KEY_MEMBERSHIP)? {
        Some(b) => {
            codec::decode(&b).map_err(|e| EngineError::corrupt(format!("membership: {e}")))?
        }
        None => StoredMembership::default(),
    };
    let m = membership.membership();
    let voters: Vec<u64> = m.voter_ids().collect();
    let learners: Vec<u64> = m.learner_ids().collect();
    let members = m
        .nodes()
        .map(|(id, info)| {
            let json = MemberJson {
                id: *id,
                peer_urls: info.peer_urls.clone(),
                is_learner: learners.contains(id),
                name: info.name.clone(),
            };
            (
                schema::member_key(*id).into_bytes(),
                serde_json::to_vec(&json).expect("member JSON"),
            )
        })
        .collect();
    w.write_unsorted(schema::BUCKET_MEMBERS, members)?;
    w.write_sorted(schema::BUCKET_MEMBERS_REMOVED, Pairs::new())?;

    let applied: Option<LogId> = match view.get(Table::Meta, KEY_APPLIED)? {
        Some(b) => codec::decode(&b).map_err(|e| EngineError::corrupt(format!("applied: {e}")))?,
        None => None,
    };
    let mut meta = Vec::new();
    let (index, term) = applied.map_or((0, 0), |l| (l.index, l.leader_id.term));
    meta.push((
        schema::META_CONSISTENT_INDEX.to_vec(),
        index.max(1).to_be_bytes().to_vec(),
    ));
    if term > 0 {
        meta.push((schema::META_TERM.to_vec(), term.to_be_bytes().to_vec()));
    }
    let conf = ConfStateJson {
        voters,
        learners,
        auto_leave: false,
    };
    meta.push((
        schema::META_CONF_STATE.to_vec(),
        serde_json::to_vec(&conf).expect("confState JSON"),
    ));
    for (store_key, etcd_key) in [
        (
            META_SCHEDULED_COMPACT_REV,
            schema::META_SCHEDULED_COMPACT_REV,
        ),
        (META_FINISHED_COMPACT_REV, schema::META_FINISHED_COMPACT_REV),
    ] {
        let rev = read_i64(view, store_key)?;
        if rev > 0 {
            let key = schema::revision_key(schema::Revision { main: rev, sub: 0 });
            meta.push((etcd_key.to_vec(), key.to_vec()));
        }
    }
    // etcd 3.6's storage version. etcd 3.5 ignores the key, so its tools
    // restore these files too (the cluster version stays 3.5.0 for them).
    meta.push((
        schema::META_STORAGE_VERSION.to_vec(),
        crate::version::STORAGE_VERSION.as_bytes().to_vec(),
    ));
    w.write_unsorted(schema::BUCKET_META, meta)?;

    Ok(w.finish()?)
}

/// The whole backup of `view` in memory (bbolt file + SHA-256); for tests and small stores.
pub fn create(view: &dyn EngineRead) -> Result<Vec<u8>, BackupError> {
    let (cursor, _) = write_db(view, std::io::Cursor::new(Vec::new()))?;
    let mut file = cursor.into_inner();
    let sum = bolt::sha256(&file);
    file.extend_from_slice(&sum);
    Ok(file)
}

/// Writes the bbolt file of `view` into an anonymous temporary file in
/// `dir` (gone when closed) and returns it rewound, with its size. The
/// SHA-256 trailer is not appended: the streamer computes it as it sends.
pub fn create_temp_file(
    view: &dyn EngineRead,
    dir: &Path,
) -> Result<(std::fs::File, u64), BackupError> {
    let io = |source| BackupError::Io {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let file = tempfile::tempfile_in(dir).map_err(io)?;
    let (buffered, summary) = write_db(view, std::io::BufWriter::new(file))?;
    let mut file = buffered.into_inner().map_err(|e| io(e.into_error()))?;
    file.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
    Ok((file, summary.bytes))
}

// ---------------------------------------------------------------------------
// etcd -> store.
// ---------------------------------------------------------------------------

/// Checks the SHA-256 trailer (files from `etcdctl snapshot save`) and
/// returns the bbolt database. As `etcdutl`, a file without trailer (a
/// copied `member/snap/db`) is refused unless `skip_hash_check`.
pub fn database(file: &[u8], skip_hash_check: bool) -> Result<&[u8], BackupError> {
    if bolt::has_checksum(file.len() as u64) {
        Ok(bolt::split_and_verify(file)?)
    } else if skip_hash_check {
        Ok(file)
    } else {
        Err(bolt::Error::NoChecksum {
            len: file.len() as u64,
        }
        .into())
    }
}

/// Counts of what [`import`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    /// Entries of the `key` bucket (revisions, tombstones included).
    pub revisions: u64,
    /// The store revision (last revision, or the compaction revision if later).
    pub revision: i64,
    /// The compaction revision (0: none).
    pub compact_revision: i64,
    /// Leases.
    pub leases: u64,
    /// Users.
    pub users: u64,
    /// Roles.
    pub roles: u64,
}

fn bucket<'a>(
    db: &bolt::Db<'a>,
    name: &'static [u8],
) -> Result<Option<bolt::Bucket<'a>>, BackupError> {
    Ok(db.bucket(name)?)
}

/// Visits each (key, value) of bucket `name` (absent bucket: none).
fn each(
    db: &bolt::Db<'_>,
    name: &'static [u8],
    mut f: impl FnMut(&[u8], &[u8]) -> Result<(), BackupError>,
) -> Result<(), BackupError> {
    let bucket_name = std::str::from_utf8(name).unwrap_or("?");
    let bucket_name: &'static str = match bucket_name {
        "key" => "key",
        "lease" => "lease",
        "meta" => "meta",
        "auth" => "auth",
        "authUsers" => "authUsers",
        "authRoles" => "authRoles",
        _ => "?",
    };
    let Some(b) = bucket(db, name)? else {
        return Ok(());
    };
    for item in b.iter() {
        let (k, v) = item?;
        let Some(v) = v.data() else {
            return Err(content(bucket_name, "nested bucket where a value belongs"));
        };
        f(k, v)?;
    }
    Ok(())
}

fn compaction_rev(db: &bolt::Db<'_>, key: &[u8]) -> Result<i64, BackupError> {
    let Some(meta) = bucket(db, schema::BUCKET_META)? else {
        return Ok(0);
    };
    match meta.get(key)?.and_then(|v| v.data()) {
        None => Ok(0),
        Some(v) => schema::parse_revision_key(v)
            .filter(|(_, t)| !t)
            .map(|(r, _)| r.main)
            .ok_or_else(|| {
                content(
                    "meta",
                    format!("{} is not a revision", String::from_utf8_lossy(key)),
                )
            }),
    }
}

/// Converts an etcd 3.5 database into engine batches handed to `sink`
/// (each at most [`RESTORE_BATCH_KEYS`] pairs), calling `progress` with
/// (pairs, bytes) so far. With a sink that drops the batches this is a full
/// validation pass.
pub fn import(
    db: &bolt::Db<'_>,
    sink: &mut dyn FnMut(WriteBatch) -> Result<(), BackupError>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Imported, BackupError> {
    let mut out = Imported::default();
    let mut batch = WriteBatch::new();
    let (mut pairs, mut bytes) = (0u64, 0u64);
    let mut push =
        |batch: &mut WriteBatch, table: Table, k: Vec<u8>, v: Vec<u8>| -> Result<(), BackupError> {
            pairs += 1;
            bytes += (k.len() + v.len()) as u64;
            batch.put(table, k, v);
            if batch.len() >= RESTORE_BATCH_KEYS {
                sink(std::mem::take(batch))?;
            }
            if pairs % PROGRESS_EVERY_KEYS == 0 {
                progress(pairs, bytes);
            }
            Ok(())
        };

    let mut last_main = 0i64;
    each(db, schema::BUCKET_KEY, |k, v| {
        let (rev, _) = schema::parse_revision_key(k)
            .ok_or_else(|| content("key", format!("{k:?} is not a revision key")))?;
        KeyValue::decode(v).map_err(|e| content("key", format!("revision {}: {e}", rev.main)))?;
        last_main = last_main.max(rev.main);
        out.revisions += 1;
        push(&mut batch, Table::Kv, k.to_vec(), v.to_vec())
    })?;

    let scheduled = compaction_rev(db, schema::META_SCHEDULED_COMPACT_REV)?;
    let finished = compaction_rev(db, schema::META_FINISHED_COMPACT_REV)?;
    out.compact_revision = scheduled.max(finished);
    out.revision = last_main.max(out.compact_revision).max(1);
    push(
        &mut batch,
        Table::Meta,
        META_CURRENT_REV.to_vec(),
        out.revision.to_be_bytes().to_vec(),
    )?;
    if out.compact_revision > 0 {
        push(
            &mut batch,
            Table::Meta,
            META_SCHEDULED_COMPACT_REV.to_vec(),
            out.compact_revision.to_be_bytes().to_vec(),
        )?;
        if finished > 0 {
            push(
                &mut batch,
                Table::Meta,
                META_FINISHED_COMPACT_REV.to_vec(),
                finished.to_be_bytes().to_vec(),
            )?;
        }
    }

    each(db, schema::BUCKET_LEASE, |k, v| {
        let (id, ttl) = decode_lease(v).map_err(|e| content("lease", e))?;
        if k != schema::lease_key(id) {
            return Err(content(
                "lease",
                format!("key {k:?} does not match lease id {id}"),
            ));
        }
        out.leases += 1;
        push(
            &mut batch,
            Table::Lease,
            k.to_vec(),
            ttl.to_be_bytes().to_vec(),
        )
    })?;

    let mut auth = AuthState::default();
    if let Some(b) = bucket(db, schema::BUCKET_AUTH)? {
        if let Some(v) = b.get(schema::AUTH_ENABLED)?.and_then(|v| v.data()) {
            auth.enabled = v == schema::AUTH_ENABLED_TRUE;
        }
        if let Some(v) = b.get(schema::AUTH_REVISION)?.and_then(|v| v.data()) {
            let v: [u8; 8] = v
                .try_into()
                .map_err(|_| content("auth", "authRevision is not 8 bytes"))?;
            auth.revision = u64::from_be_bytes(v);
        }
    }
    each(db, schema::BUCKET_AUTH_USERS, |k, v| {
        let u = authpb::User::decode(v).map_err(|e| content("authUsers", e))?;
        let name = String::from_utf8(k.to_vec()).map_err(|e| content("authUsers", e))?;
        let password_hash = String::from_utf8(u.password)
            .map_err(|e| content("authUsers", format!("{name}: {e}")))?;
        let mut roles = u.roles;
        roles.sort();
        auth.users.insert(
            name,
            User {
                password_hash,
                no_password: u.options.is_some_and(|o| o.no_password),
                roles,
            },
        );
        Ok(())
    })?;
    each(db, schema::BUCKET_AUTH_ROLES, |k, v| {
        let r = authpb::Role::decode(v).map_err(|e| content("authRoles", e))?;
        let name = String::from_utf8(k.to_vec()).map_err(|e| content("authRoles", e))?;
        let perms = r
            .key_permission
            .into_iter()
            .map(|p| Permission {
                kind: p.perm_type,
                key: p.key,
                range_end: p.range_end,
            })
            .collect();
        auth.roles.insert(name, Role { perms });
        Ok(())
    })?;
    out.users = auth.users.len() as u64;
    out.roles = auth.roles.len() as u64;
    push(
        &mut batch,
        Table::Meta,
        AUTH_STATE_KEY.to_vec(),
        codec::encode(&auth),
    )?;

    if !batch.is_empty() {
        sink(batch)?;
    }
    progress(pairs, bytes);
    Ok(out)
}

/// Restores the backup `file` (this store's or etcd 3.5's) into the new
/// data directory `data_dir`, which must not hold data yet. The file is
/// verified completely (trailer, every page, every entry) before anything
/// is created. `progress` gets (pairs, bytes) written so far.
pub fn restore(
    file: &[u8],
    data_dir: &Path,
    skip_hash_check: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Imported, BackupError> {
    let db_bytes = database(file, skip_hash_check)?;
    let db = bolt::Db::open(db_bytes)?;
    db.check()?;
    import(&db, &mut |_| Ok(()), &mut |_, _| {})?;

    let db_dir = data_dir.join(crate::data_dir::ENGINE_DIR);
    if db_dir.exists()
        && std::fs::read_dir(&db_dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    {
        return Err(BackupError::DataDirExists(data_dir.display().to_string()));
    }
    let snap_dir = data_dir.join(crate::data_dir::SNAPSHOT_DIR);
    std::fs::create_dir_all(&snap_dir).map_err(|source| BackupError::Io {
        path: snap_dir.display().to_string(),
        source,
    })?;
    let engine = RocksEngine::open(&db_dir)?;
    let imported = import(&db, &mut |b| Ok(engine.write(b, false)?), progress)?;
    engine.sync()?;
    Ok(imported)
}

/// What `etcdutl snapshot status` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// CRC-32C over each bucket's name, then its keys and values, in order.
    pub hash: u32,
    /// Main revision of the last key of bucket `key`.
    pub revision: i64,
    /// Entries of all buckets.
    #[serde(rename = "totalKey")]
    pub total_key: u64,
    /// Bytes of the bbolt file (pages in use x page size).
    #[serde(rename = "totalSize")]
    pub total_size: u64,
}

/// `etcdutl snapshot status` of a backup (every page checked; as etcdutl,
/// the trailer is not: it lies past the database's end).
pub fn status(file: &[u8]) -> Result<Status, BackupError> {
    let db = bolt::Db::open(file)?;
    db.check()?;
    let mut st = Status {
        hash: 0,
        revision: 0,
        total_key: 0,
        total_size: db.size(),
    };
    for item in db.buckets() {
        let (name, b) = item?;
        st.hash = crc32c::crc32c_append(st.hash, name);
        let is_key = name == schema::BUCKET_KEY;
        for kv in b.iter() {
            let (k, v) = kv?;
            st.hash = crc32c::crc32c_append(st.hash, k);
            st.hash = crc32c::crc32c_append(st.hash, v.data().unwrap_or_default());
            if is_key {
                if let Some((rev, _)) = schema::parse_revision_key(k) {
                    st.revision = rev.main;
                }
            }
            st.total_key += 1;
        }
    }
    Ok(st)
}

/// An alarm's `alarm` bucket key (for tests and tools).
pub fn alarm_key(member_id: u64, alarm: i32) -> Vec<u8> {
    AlarmMember { member_id, alarm }.encode_to_vec()
}

#[cfg(test)]
mod tests;
