//! A snapshot's data as openraft passes it around ([`SnapshotData`]: a
//! checkpoint or a records file), and as a sender streams it
//! ([`SnapshotSource`]).

use std::path::Path;
use std::sync::Arc;

use super::checkpoint::Checkpoint;
use super::file::SnapshotFile;

/// A snapshot's data as openraft passes it around: a checkpoint of this
/// member's engine, or records in a file (received, or written out to be
/// sent). Clones share the data.
#[derive(Debug, Clone)]
pub enum SnapshotData {
    /// Records in a file.
    File(Arc<SnapshotFile>),
    /// An engine checkpoint, written out as records only to be sent.
    Checkpoint(Arc<Checkpoint>),
}

impl SnapshotData {
    /// The records in a file: this file, or a checkpoint's written out to
    /// a temporary file beside it (a blocking scan of the checkpoint).
    pub fn encoded(&self) -> std::io::Result<Arc<SnapshotFile>> {
        match self {
            Self::File(file) => Ok(file.clone()),
            Self::Checkpoint(checkpoint) => checkpoint.encode().map(Arc::new),
        }
    }

    /// What a sender streams (blocking): a file as it is; a checkpoint's
    /// records produced as they are sent, with no file written. With
    /// `measured`, a checkpoint is measured first ([`Checkpoint::measure`],
    /// one more pass over it): peer protocol 1's stream header announces
    /// the length; protocol 2's stream ends with a mark instead.
    pub fn source(&self, measured: bool) -> std::io::Result<SnapshotSource> {
        match self {
            Self::File(file) => Ok(SnapshotSource::File(file.clone())),
            Self::Checkpoint(checkpoint) => Ok(SnapshotSource::Checkpoint {
                len: if measured {
                    Some(checkpoint.measure()?)
                } else {
                    None
                },
                checkpoint: checkpoint.clone(),
            }),
        }
    }

    /// The file or directory that holds the data.
    pub(super) fn path(&self) -> &Path {
        match self {
            Self::File(file) => &file.path,
            Self::Checkpoint(checkpoint) => &checkpoint.path,
        }
    }
}

/// A snapshot's records as a sender streams them ([`SnapshotData::source`]).
pub enum SnapshotSource {
    /// Records in a file, read in chunks at their offsets.
    File(Arc<SnapshotFile>),
    /// A checkpoint's records, produced as they are sent
    /// ([`Checkpoint::produce`]).
    Checkpoint {
        /// The checkpoint.
        checkpoint: Arc<Checkpoint>,
        /// Its records' length, if measured ([`Checkpoint::measure`]).
        len: Option<u64>,
    },
}

impl SnapshotSource {
    /// The records' length in bytes, if known before they are sent.
    pub fn known_len(&self) -> Option<u64> {
        match self {
            Self::File(file) => Some(file.len()),
            Self::Checkpoint { len, .. } => *len,
        }
    }
}
