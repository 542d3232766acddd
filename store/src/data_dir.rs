//! The data directory, checked before anything in it is opened or created.
//!
//! A member's data lives in `<data-dir>/member/db` (the engine),
//! `<data-dir>/member/log` (the Raft log) and `<data-dir>/member/snap`
//! (Raft snapshots). Before creating any of them, [`prepare`] refuses two
//! kinds of directory that would otherwise lead to silent damage:
//!
//! - **A path that is not a directory**: the error names the path (the
//!   bare OS error "Not a directory" does not).
//! - **An etcd data directory**: etcd keeps its WAL in `member/wal` and its
//!   bbolt database in `member/snap/db`. The store cannot read either, so
//!   starting on such a directory would bootstrap a new, empty cluster
//!   next to the old data: swapping etcd's image for the store's in place
//!   would hand kube-apiserver an empty store. The error says what was found
//!   and how to migrate (`etcdctl make-mirror` from the running etcd into
//!   a store started on an empty directory).
//!
//! A directory that holds both our engine and etcd's files is ours (the
//! operator copied something in); it is opened as usual.

use std::path::{Path, PathBuf};

/// etcd's files that mark an etcd data directory, relative to it.
const ETCD_MARKERS: [&str; 2] = ["member/wal", "member/snap/db"];

/// The engine's directory, relative to the data directory.
pub const ENGINE_DIR: &str = "member/db";

/// The Raft log's segment files, relative to the data directory (not
/// `member/wal`, which marks etcd's data directory).
pub const LOG_DIR: &str = "member/log";

/// The Raft snapshot directory, relative to the data directory.
pub const SNAPSHOT_DIR: &str = "member/snap";

/// A file every RocksDB database has: its presence means the engine exists.
const ENGINE_MARKER: &str = "CURRENT";

/// Why a data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// The path exists and is a file (or another non-directory).
    #[error("--data-dir {0}: not a directory")]
    NotADirectory(PathBuf),
    /// The directory holds etcd's data, which this store cannot read.
    #[error(
        "--data-dir {dir} holds an etcd data directory (found {found}); this store cannot read \
         etcd's WAL or bbolt database and would start an empty cluster instead. To migrate, start \
         the store on an empty --data-dir and copy the keys from the running etcd with \
         `etcdctl make-mirror --endpoints <etcd> <store endpoint>`; or point --data-dir elsewhere",
        dir = .dir.display(),
        found = .found.join(", ")
    )]
    ForeignEtcd {
        /// The data directory.
        dir: PathBuf,
        /// etcd's entries found in it.
        found: Vec<&'static str>,
    },
    /// Creating a directory or setting its permissions failed.
    #[error("--data-dir: preparing {path}: {source}")]
    Io {
        /// The directory being created or changed.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Checks `data_dir` (see the module docs), then creates the member's
/// directories in it with etcd's permissions (0700).
pub fn prepare(data_dir: &Path) -> Result<(), DataDirError> {
    if data_dir.exists() && !data_dir.is_dir() {
        return Err(DataDirError::NotADirectory(data_dir.to_path_buf()));
    }
    let found = etcd_markers(data_dir);
    if !found.is_empty() && !data_dir.join(ENGINE_DIR).join(ENGINE_MARKER).exists() {
        return Err(DataDirError::ForeignEtcd {
            dir: data_dir.to_path_buf(),
            found,
        });
    }
    for d in [ENGINE_DIR, SNAPSHOT_DIR] {
        let path = data_dir.join(d);
        std::fs::create_dir_all(&path).map_err(|source| DataDirError::Io { path, source })?;
    }
    restrict(data_dir)
}

/// etcd's entries present in `data_dir`.
fn etcd_markers(data_dir: &Path) -> Vec<&'static str> {
    ETCD_MARKERS
        .into_iter()
        .filter(|m| data_dir.join(m).exists())
        .collect()
}

/// Owner-only access, as etcd sets on its data directory.
fn restrict(data_dir: &Path) -> Result<(), DataDirError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| DataDirError::Io {
                path: data_dir.to_path_buf(),
                source,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_directory_is_prepared() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("new.etcd");
        prepare(&data).unwrap();
        assert!(data.join(ENGINE_DIR).is_dir() && data.join(SNAPSHOT_DIR).is_dir());
        prepare(&data).unwrap();
    }

    #[test]
    fn a_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, b"x").unwrap();
        let err = prepare(&file).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("--data-dir {}: not a directory", file.display())
        );
    }

    #[test]
    fn an_etcd_directory_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("member/wal")).unwrap();
        std::fs::create_dir_all(dir.path().join("member/snap")).unwrap();
        std::fs::write(dir.path().join("member/snap/db"), b"bbolt").unwrap();
        let err = prepare(dir.path()).unwrap_err();
        assert!(matches!(&err, DataDirError::ForeignEtcd { found, .. } if found.len() == 2));
        assert!(err.to_string().contains("etcdctl make-mirror"), "{err}");
        assert!(!dir.path().join(ENGINE_DIR).exists(), "nothing created");
        // Once our engine is there too, the directory is ours.
        std::fs::create_dir_all(dir.path().join(ENGINE_DIR)).unwrap();
        std::fs::write(dir.path().join(ENGINE_DIR).join(ENGINE_MARKER), b"x").unwrap();
        prepare(dir.path()).unwrap();
    }
}
