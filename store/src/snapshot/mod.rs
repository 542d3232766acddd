//! Backup files: what `Maintenance.Snapshot` streams (and `etcdctl snapshot
//! save` writes) and what `store-util snapshot restore` reads.
//!
//! Format: the magic line [`MAGIC`], the length of the records (8 bytes
//! big-endian), the state machine tables in the Raft snapshot record format
//! (`raft::state_machine::snapshot_file::encode_records`), zero padding up to a multiple of
//! [`FILE_ALIGN_BYTES`], then the SHA-256 of everything before it (32
//! bytes). etcd appends a SHA-256 to its snapshots the same way, and
//! `etcdctl snapshot save` refuses a download whose size minus the checksum
//! is not a multiple of 512 (bbolt's page alignment), hence the padding.
//!
//! Restoring writes the key-value history and leases into a fresh data
//! directory and leaves out this cluster's Raft bookkeeping (applied index,
//! membership, member attributes). The new member then starts as a fresh
//! member would: it initializes Raft with its `--initial-cluster`, and its
//! store already holds every revision of the backup. As with etcd, every
//! member of the new cluster is restored from the same file.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::alarm::ALARM_PREFIX;
use crate::engine::rocks::RocksEngine;
use crate::engine::{Engine, EngineError, EngineRead, Table, WriteBatch};
use crate::raft::state_machine::members::MEMBER_ATTRIBUTES_PREFIX;
use crate::raft::state_machine::snapshot_file::{decode_records, encode_records};
use crate::raft::state_machine::{KEY_APPLIED, KEY_APPLIED_PART, KEY_MEMBERSHIP};

/// First bytes of every backup file.
pub const MAGIC: &[u8] = b"etcd-rs snapshot v1\n";

/// Length of the trailing checksum.
pub const CHECKSUM_BYTES: usize = 32;

/// The body (everything before the checksum) is padded to a multiple of
/// this, as etcdctl expects of etcd's bbolt files.
pub const FILE_ALIGN_BYTES: usize = 512;

const LENGTH_BYTES: usize = 8;

/// Backup problems.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// Not one of our backups.
    #[error("not a snapshot file of this store (bad magic)")]
    BadMagic,
    /// The checksum does not match: the file is damaged or truncated.
    #[error("snapshot file is corrupt: SHA-256 mismatch")]
    Checksum,
    /// The target data directory already holds data.
    #[error("data dir {0} already exists and is not empty")]
    DataDirExists(String),
    /// Reading or writing the engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The records inside a verified file do not decode.
    #[error("snapshot records are malformed: {0}")]
    Records(#[source] std::io::Error),
    /// Creating the data directory failed.
    #[error("cannot create {path}: {source}")]
    CreateDir {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// True for `meta` keys that describe this cluster's Raft progress rather
/// than the data (left out when a backup is restored into a new cluster).
pub fn is_raft_bookkeeping(key: &[u8]) -> bool {
    key == KEY_APPLIED
        || key == KEY_APPLIED_PART
        || key == KEY_MEMBERSHIP
        || key.starts_with(MEMBER_ATTRIBUTES_PREFIX)
        || key.starts_with(ALARM_PREFIX)
}

/// A backup of `view` (a consistent engine snapshot).
pub fn create(view: &dyn EngineRead) -> Result<Vec<u8>, BackupError> {
    let records = encode_records(view)?;
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(records.len() as u64).to_be_bytes());
    out.extend(records);
    out.resize(out.len().div_ceil(FILE_ALIGN_BYTES) * FILE_ALIGN_BYTES, 0);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    Ok(out)
}

/// Checks a backup and returns its records.
pub fn verify(file: &[u8]) -> Result<&[u8], BackupError> {
    if file.len() < MAGIC.len() + LENGTH_BYTES + CHECKSUM_BYTES || !file.starts_with(MAGIC) {
        return Err(BackupError::BadMagic);
    }
    let (body, sum) = file.split_at(file.len() - CHECKSUM_BYTES);
    if Sha256::digest(body).as_slice() != sum {
        return Err(BackupError::Checksum);
    }
    let rest = &body[MAGIC.len()..];
    let len = u64::from_be_bytes(rest[..LENGTH_BYTES].try_into().expect("8 bytes")) as usize;
    rest.get(LENGTH_BYTES..LENGTH_BYTES + len)
        .ok_or(BackupError::Checksum)
}

/// Restores `file` into the new data directory `data_dir` (which must not
/// hold data yet). Returns the number of records written.
pub fn restore(file: &[u8], data_dir: &Path) -> Result<usize, BackupError> {
    let records = verify(file)?;
    let db_dir = data_dir.join(crate::data_dir::ENGINE_DIR);
    if db_dir.exists()
        && std::fs::read_dir(&db_dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    {
        return Err(BackupError::DataDirExists(data_dir.display().to_string()));
    }
    let snap_dir = data_dir.join(crate::data_dir::SNAPSHOT_DIR);
    std::fs::create_dir_all(&snap_dir).map_err(|source| BackupError::CreateDir {
        path: snap_dir.display().to_string(),
        source,
    })?;
    let engine = RocksEngine::open(&db_dir)?;
    let mut all = WriteBatch::new();
    decode_records(records, &mut all).map_err(BackupError::Records)?;
    let mut kept = WriteBatch::new();
    for op in all.ops() {
        if let crate::engine::BatchOp::Put(table, k, v) = op {
            if *table == Table::Meta && is_raft_bookkeeping(k) {
                continue;
            }
            kept.put(*table, k.clone(), v.clone());
        }
    }
    let n = kept.len();
    engine.write(kept, true)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::MemoryEngine;

    #[test]
    fn backups_round_trip_and_detect_damage() {
        let engine = MemoryEngine::new();
        let mut b = WriteBatch::new();
        b.put(Table::Kv, b"k".to_vec(), b"v".to_vec());
        b.put(Table::Meta, b"sm/applied".to_vec(), b"x".to_vec());
        engine.write(b, false).unwrap();
        let mut file = create(&engine).unwrap();
        assert_eq!(
            (file.len() - CHECKSUM_BYTES) % FILE_ALIGN_BYTES,
            0,
            "etcdctl's size check"
        );
        assert!(verify(&file).is_ok());
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            restore(&file, dir.path()).unwrap(),
            1,
            "raft bookkeeping is left out"
        );
        assert!(matches!(
            restore(&file, dir.path()),
            Err(BackupError::DataDirExists(_))
        ));
        let last = file.len() - 1;
        file[last] ^= 1;
        assert!(matches!(verify(&file), Err(BackupError::Checksum)));
        assert!(matches!(verify(b"nonsense"), Err(BackupError::BadMagic)));
    }
}
