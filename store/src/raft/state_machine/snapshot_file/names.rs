//! The names in the snapshot directory: the current snapshot's meta and
//! data (and the previous layout's), the temporary files, and the unique
//! names new ones get.

use std::path::{Path, PathBuf};

pub(super) use crate::wal::unique_name;

/// The file that names the current snapshot's data and holds its meta.
pub(super) const META_FILE: &str = "snapshot.meta";
/// The previous layout's meta file (a bare
/// [`SnapshotMeta`](crate::raft::SnapshotMeta)).
pub(super) const LEGACY_META_FILE: &str = "current.meta";
/// The previous layout's data file.
pub(super) const LEGACY_DATA_FILE: &str = "current.snap";
/// Prefix of every snapshot's data (a checkpoint or a file).
pub(super) const DATA_PREFIX: &str = "snapshot-";
/// Extension of a checkpoint directory.
pub(super) const CHECKPOINT_EXTENSION: &str = "ckpt";
/// Extension of a records file.
pub(super) const FILE_EXTENSION: &str = "snap";
/// Prefix of the temporary files snapshots are received into.
pub(super) const RECEIVING_PREFIX: &str = "receiving-";
/// Prefix of the staging directories of table files to ingest.
pub(super) const INGEST_PREFIX: &str = "ingest-";
/// Prefix of the temporary files checkpoints are written out to be sent.
pub(super) const SENDING_PREFIX: &str = "sending-";
/// Extension of every temporary file in the snapshot directory (RocksDB
/// also builds a checkpoint in `<name>.tmp` before it renames it).
pub(super) const TEMP_EXTENSION: &str = "tmp";

/// A new staging directory for the table files of an install's bulk load,
/// in the snapshot directory `dir` (on the engine's file system, so
/// ingesting them links instead of copying); temporary, so a start removes
/// what a crash left.
pub(super) fn staging_dir_in(dir: &Path) -> PathBuf {
    dir.join(unique_name(INGEST_PREFIX, TEMP_EXTENSION))
}
