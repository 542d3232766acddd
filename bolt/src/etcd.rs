//! etcd 3.5's backend schema: which buckets etcd 3.5.1 creates in its bbolt
//! file (`<data-dir>/member/snap/db`, and `etcdctl snapshot save` files),
//! which keys they hold, and how keys and values are encoded.
//!
//! Researched from etcd's source at tag v3.5.1 (file names relative to the
//! etcd repository; descriptions, not code). Integers are big-endian unless
//! said otherwise; "proto" means the gogo-protobuf binary encoding of the
//! named message; "JSON" means Go's `encoding/json` output.
//!
//! | bucket            | created by (v3.5.1 source)                       | keys -> values |
//! |-------------------|--------------------------------------------------|----------------|
//! | `key`             | server/mvcc/kvstore.go (`NewStore`)              | [`revision_key`] -> proto `mvccpb.KeyValue` |
//! | `meta`            | server/mvcc/kvstore.go, server/etcdserver/cindex | see [`META_CONSISTENT_INDEX`] etc. |
//! | `lease`           | server/lease/lessor.go (`initAndRecover`)        | lease id (8 bytes) -> proto `leasepb.Lease` |
//! | `alarm`           | server/etcdserver/api/v3alarm/alarms.go          | proto `etcdserverpb.AlarmMember` -> empty |
//! | `cluster`         | server/etcdserver/api/membership/store.go        | `clusterVersion`, `downgrade` |
//! | `members`         | server/etcdserver/api/membership/store.go        | hex member id -> member JSON |
//! | `members_removed` | server/etcdserver/api/membership/store.go        | hex member id -> `removed` |
//! | `auth`            | server/auth/store.go (`NewAuthStore`)            | `authEnabled`, `authRevision` |
//! | `authUsers`       | server/auth/store.go                             | user name -> proto `authpb.User` |
//! | `authRoles`       | server/auth/store.go                             | role name -> proto `authpb.Role` |
//!
//! Bucket names and numeric ids are declared in server/mvcc/buckets/bucket.go
//! (ids are in-process only, never stored). A running etcd 3.5.1 creates all
//! ten buckets at startup, even when empty. There is no `storageVersion`
//! key in 3.5.1: the `meta` bucket's `storageVersion` was added in etcd 3.6
//! (server/storage/schema). `etcdutl snapshot status` reports `revision` =
//! main revision of the last key of `key`, `totalKey` = entries of all
//! buckets, `hash` = CRC-32C (Castagnoli) over each bucket's name followed
//! by each of its keys and values, in order (etcdutl/snapshot/v3_snapshot.go).

/// Bucket `key`: the MVCC history, one entry per revision.
///
/// Key: [`revision_key`] (17 bytes: main revision big-endian u64, `'_'`,
/// sub revision big-endian u64), with [`TOMBSTONE_MARK`] appended (18
/// bytes) when the entry records a deletion (server/mvcc/revision.go,
/// server/mvcc/kvstore.go `appendMarkTombstone`). `main` is the store
/// revision of the transaction, `sub` the index of the change within it.
///
/// Value: proto `mvccpb.KeyValue` (api/mvccpb/kv.proto): field 1 `key`
/// bytes, 2 `create_revision` int64, 3 `mod_revision` int64, 4 `version`
/// int64, 5 `value` bytes, 6 `lease` int64 (varints; zero fields omitted).
/// A tombstone's value is a KeyValue holding only `key`
/// (server/mvcc/kvstore_txn.go `put`/`delete`). etcd writes this bucket with
/// `FillPercent = 0.9` (server/mvcc/backend/batch_tx.go `UnsafeSeqPut`).
pub const BUCKET_KEY: &[u8] = b"key";

/// Bucket `meta`: raft and compaction bookkeeping; keys listed in the `META_*` constants.
pub const BUCKET_META: &[u8] = b"meta";

/// Bucket `lease`: one entry per live lease (server/lease/lessor.go).
///
/// Key: the lease id as a big-endian 8-byte int64 (`int64ToBytes`).
/// Value: proto `leasepb.Lease` (server/lease/leasepb/lease.proto): field 1
/// `ID` int64, 2 `TTL` int64 (seconds, as granted), 3 `RemainingTTL` int64
/// (seconds, set by lease checkpoints; 0 = unset).
pub const BUCKET_LEASE: &[u8] = b"lease";

/// Bucket `alarm`: raised alarms (server/etcdserver/api/v3alarm/alarms.go).
///
/// Key: proto `etcdserverpb.AlarmMember` (api/etcdserverpb/rpc.proto):
/// field 1 `memberID` uint64, 2 `alarm` enum ([`ALARM_NOSPACE`],
/// [`ALARM_CORRUPT`]). Value: empty.
pub const BUCKET_ALARM: &[u8] = b"alarm";

/// Bucket `cluster`: cluster-wide versions (server/etcdserver/api/membership/store.go).
/// Keys: [`CLUSTER_VERSION`], [`CLUSTER_DOWNGRADE`].
pub const BUCKET_CLUSTER: &[u8] = b"cluster";

/// Bucket `members`: the cluster's members (server/etcdserver/api/membership/store.go).
///
/// Key: the member id in lowercase hexadecimal without leading zeros
/// ([`member_key`]; `types.ID.String`, client/pkg/types/id.go).
/// Value: JSON of `membership.Member` (server/etcdserver/api/membership/member.go):
/// `{"id":<decimal u64>,"peerURLs":[...],"isLearner":true?,"name":"...","clientURLs":[...]}`
/// where `isLearner`, `name` and `clientURLs` are omitted when empty/false, e.g.
/// `{"id":17655344527955096411,"peerURLs":["http://127.0.66.2:2380"],"name":"probe"}`
/// (from a 3.5.1 snapshot). In 3.5.1 the entry keeps the member as it was
/// added: `UpdateAttributes` (membership/cluster.go) calls
/// `unsafeSaveMemberToBackend`, which refuses to overwrite an existing key,
/// so published `clientURLs` reach only the v2 store.
/// `etcdutl snapshot restore` deletes all entries of `members` and
/// `members_removed` and writes the new cluster's members.
pub const BUCKET_MEMBERS: &[u8] = b"members";

/// Bucket `members_removed`: ids of removed members.
/// Key: hex member id as in [`BUCKET_MEMBERS`]; value: [`MEMBER_REMOVED_VALUE`].
pub const BUCKET_MEMBERS_REMOVED: &[u8] = b"members_removed";

/// Bucket `auth`: authentication state (server/auth/store.go).
/// Keys: [`AUTH_ENABLED`], [`AUTH_REVISION`].
pub const BUCKET_AUTH: &[u8] = b"auth";

/// Bucket `authUsers` (server/auth/store.go).
///
/// Key: user name. Value: proto `authpb.User` (api/authpb/auth.proto):
/// field 1 `name` bytes, 2 `password` bytes (bcrypt hash, empty for
/// no-password users), 3 `roles` repeated string (sorted), 4 `options`
/// message `UserAddOptions` (field 1 `no_password` bool).
pub const BUCKET_AUTH_USERS: &[u8] = b"authUsers";

/// Bucket `authRoles` (server/auth/store.go).
///
/// Key: role name. Value: proto `authpb.Role`: field 1 `name` bytes,
/// 2 `keyPermission` repeated `Permission` (field 1 `permType` enum
/// READ=0/WRITE=1/READWRITE=2, 2 `key` bytes, 3 `range_end` bytes).
pub const BUCKET_AUTH_ROLES: &[u8] = b"authRoles";

/// Every bucket etcd 3.5.1 creates, in bbolt's (byte-wise sorted) order.
pub const ALL_BUCKETS: [&[u8]; 10] = [
    BUCKET_ALARM,
    BUCKET_AUTH,
    BUCKET_AUTH_ROLES,
    BUCKET_AUTH_USERS,
    BUCKET_CLUSTER,
    BUCKET_KEY,
    BUCKET_LEASE,
    BUCKET_MEMBERS,
    BUCKET_MEMBERS_REMOVED,
    BUCKET_META,
];

/// `meta` key: index of the last raft entry applied to the backend,
/// big-endian u64 (server/etcdserver/cindex/cindex.go). Never written as 0.
pub const META_CONSISTENT_INDEX: &[u8] = b"consistent_index";
/// `meta` key: raft term of that entry, big-endian u64 (written since 3.5;
/// only when non-zero; server/etcdserver/cindex/cindex.go).
pub const META_TERM: &[u8] = b"term";
/// `meta` key: the raft `ConfState` as JSON, e.g.
/// `{"voters":[17655344527955096411],"auto_leave":false}`: `voters`,
/// `learners`, `voters_outgoing`, `learners_next` (decimal u64 arrays,
/// omitted when empty) and `auto_leave` (always present). Written since 3.5
/// (server/etcdserver/api/membership/confstate.go).
pub const META_CONF_STATE: &[u8] = b"confState";
/// `meta` key: revision of the last requested compaction, as a 17-byte
/// [`revision_key`] with sub 0 (server/mvcc/kvstore.go `compactLockfree`).
pub const META_SCHEDULED_COMPACT_REV: &[u8] = b"scheduledCompactRev";
/// `meta` key: revision of the last completed compaction, same encoding
/// (server/mvcc/kvstore_compaction.go). On start, a scheduled revision
/// greater than the finished one makes etcd run that compaction again.
pub const META_FINISHED_COMPACT_REV: &[u8] = b"finishedCompactRev";
/// `meta` key: the storage version as `major.minor.0` text, e.g. `3.6.0`
/// (written since 3.6; a file without it is 3.5's format, which 3.6 also
/// reads; server/storage/schema/version.go).
pub const META_STORAGE_VERSION: &[u8] = b"storageVersion";

/// `cluster` key: the cluster version as `major.minor.0` text, e.g. `3.5.0` (since 3.5).
pub const CLUSTER_VERSION: &[u8] = b"clusterVersion";
/// `cluster` key: downgrade state as JSON `{"target-version":"3.4.0","enabled":true}` (since 3.5).
pub const CLUSTER_DOWNGRADE: &[u8] = b"downgrade";

/// `members_removed` value.
pub const MEMBER_REMOVED_VALUE: &[u8] = b"removed";

/// `auth` key: one byte, [`AUTH_ENABLED_TRUE`] or [`AUTH_ENABLED_FALSE`];
/// absent until auth is first enabled or disabled (absent = disabled).
pub const AUTH_ENABLED: &[u8] = b"authEnabled";
/// [`AUTH_ENABLED`] value when auth is on.
pub const AUTH_ENABLED_TRUE: &[u8] = &[1];
/// [`AUTH_ENABLED`] value when auth is off.
pub const AUTH_ENABLED_FALSE: &[u8] = &[0];
/// `auth` key: the auth store revision, big-endian u64 (8 bytes); set to 1
/// when the store is created, incremented by every auth change.
pub const AUTH_REVISION: &[u8] = b"authRevision";

/// Alarm type NOSPACE (`etcdserverpb.AlarmType`): backend quota exceeded.
pub const ALARM_NOSPACE: u64 = 1;
/// Alarm type CORRUPT: data inconsistency detected.
pub const ALARM_CORRUPT: u64 = 2;

/// Bytes of a revision key: 8 (main) + 1 (`'_'`) + 8 (sub).
pub const REVISION_KEY_LEN: usize = 17;
/// Bytes of a tombstone revision key: a revision key plus [`TOMBSTONE_MARK`].
pub const TOMBSTONE_KEY_LEN: usize = 18;
/// Separator between main and sub revision.
pub const REVISION_SEPARATOR: u8 = b'_';
/// Last byte of a tombstone's revision key.
pub const TOMBSTONE_MARK: u8 = b't';

/// A revision: `main` is the store revision, `sub` the change within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    /// Store revision (etcd's `int64`, never negative).
    pub main: i64,
    /// Index of the change within that revision's transaction.
    pub sub: i64,
}

/// The 17-byte `key`-bucket key of `rev` (also the value of the compaction keys in `meta`).
pub fn revision_key(rev: Revision) -> [u8; REVISION_KEY_LEN] {
    let mut k = [0u8; REVISION_KEY_LEN];
    k[..8].copy_from_slice(&(rev.main as u64).to_be_bytes());
    k[8] = REVISION_SEPARATOR;
    k[9..].copy_from_slice(&(rev.sub as u64).to_be_bytes());
    k
}

/// The 18-byte key of a tombstone at `rev`.
pub fn tombstone_key(rev: Revision) -> [u8; TOMBSTONE_KEY_LEN] {
    let mut k = [0u8; TOMBSTONE_KEY_LEN];
    k[..REVISION_KEY_LEN].copy_from_slice(&revision_key(rev));
    k[REVISION_KEY_LEN] = TOMBSTONE_MARK;
    k
}

/// Parses a `key`-bucket key: the revision and whether it is a tombstone;
/// `None` if it is neither 17 bytes nor 18 bytes ending in `'t'`, or lacks the `'_'`.
pub fn parse_revision_key(key: &[u8]) -> Option<(Revision, bool)> {
    let tombstone = match key.len() {
        REVISION_KEY_LEN => false,
        TOMBSTONE_KEY_LEN if key[REVISION_KEY_LEN] == TOMBSTONE_MARK => true,
        _ => return None,
    };
    if key[8] != REVISION_SEPARATOR {
        return None;
    }
    let main = u64::from_be_bytes(key[..8].try_into().ok()?) as i64;
    let sub = u64::from_be_bytes(key[9..17].try_into().ok()?) as i64;
    Some((Revision { main, sub }, tombstone))
}

/// The `lease` bucket key of lease `id`.
pub fn lease_key(id: i64) -> [u8; 8] {
    (id as u64).to_be_bytes()
}

/// The `members`/`members_removed` key of member `id` (lowercase hex, no padding).
pub fn member_key(id: u64) -> String {
    format!("{id:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_keys() {
        let rev = Revision { main: 5, sub: 1 };
        let k = revision_key(rev);
        assert_eq!(k, *b"\0\0\0\0\0\0\0\x05_\0\0\0\0\0\0\0\x01");
        assert_eq!(parse_revision_key(&k), Some((rev, false)));
        let t = tombstone_key(rev);
        assert_eq!(t[17], b't');
        assert_eq!(parse_revision_key(&t), Some((rev, true)));
        assert_eq!(parse_revision_key(&k[..16]), None);
        let mut bad = t;
        bad[17] = b'x';
        assert_eq!(parse_revision_key(&bad), None);
        // Byte order is revision order.
        assert!(
            revision_key(Revision { main: 2, sub: 9 }) < revision_key(Revision { main: 3, sub: 0 })
        );
    }

    #[test]
    fn member_and_lease_keys() {
        assert_eq!(member_key(17655344527955096411), "f504624e5fe6735b");
        assert_eq!(member_key(0x1f), "1f");
        assert_eq!(lease_key(0x735ba20881242506), *b"s[\xa2\x08\x81$%\x06");
    }

    #[test]
    fn bucket_list_is_sorted() {
        assert!(ALL_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
