//! The data directory, checked before anything in it is opened or created.
//!
//! A member's data lives in `<data-dir>/member/db` (the engine),
//! `<data-dir>/member/log` (the Raft log) and `<data-dir>/member/snap`
//! (Raft snapshots); while a defragment runs and for a while after it,
//! `member/db.defrag-hold-*` holds the table files it replaced until they
//! are freed (`engine::rocks`), and `member/log/purged-*.purged` the Raft
//! log's purged segments (`wal`). Before creating any of them, [`prepare`] refuses two
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
//!
//! **The storage format.** `member/store-format` names the layout the
//! directory's data is in (its tables and meta keys, the Raft log's
//! records, the snapshot files), as etcd 3.6 records its storage version:
//! written once a start has opened (or created) everything, read by
//! [`prepare`] before anything else is opened. A format newer than this
//! build reads is refused with the directory, the format found and the
//! formats this build reads, before a file is touched; an older known one
//! is opened as it is, brought to [`FORMAT_VERSION`] by the start
//! (idempotent steps, so a start killed halfway is simply redone), and the
//! file written last (atomically: a temporary file, synced, renamed).
//!
//! Past that, the format follows the cluster's storage version, as etcd
//! 3.6's schema does: a member writes the newest format every member of
//! the cluster reads ([`crate::version::format_for`]). After a rolling
//! upgrade raises the cluster version, the new release [`migrate`]s up;
//! when a downgrade lowers it, the new release migrates back down before
//! the operator starts the older build, which could not open the newer
//! format.
//!
//! | format | what it is |
//! | --- | --- |
//! | 1 | written before the format was recorded: no `member/store-format`; the `kv_index` table may be missing or partial (the start fills it, `mvcc::store`) |
//! | 2 | `kv_index` complete (`mvcc/kvIndexComplete`); the format recorded. Later builds of it add the key history (`mvcc/keyHistory/...` keys in `meta`, [`crate::mvcc::key_history`]), which earlier ones never read and which is refilled at start when one of those changed the data |
//! | 3 | only the test-only next release writes it ([`crate::version::TEST_NEXT_RELEASE_ENV`]): format 2's layout under a new number, for the rolling upgrade test |

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

/// The file naming the data's format, relative to the data directory.
pub const FORMAT_FILE: &str = "member/store-format";

/// The format this build writes (see the module docs).
pub const FORMAT_VERSION: u32 = 2;

/// The oldest format this build opens.
pub const OLDEST_READABLE_FORMAT: u32 = 1;

/// The format of a directory written before formats were recorded.
const UNRECORDED_FORMAT: u32 = 1;

/// Bytes a format file may hold (a number and a newline).
const FORMAT_FILE_MAX_BYTES: u64 = 64;

/// What [`prepare`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing of ours yet: the start creates the data in [`FORMAT_VERSION`].
    Fresh,
    /// Data in this format, which this build reads.
    Format(u32),
}

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
    /// The data is in a format this build does not read.
    #[error(
        "--data-dir {dir} holds data in storage format {found}, which this build of the store \
         does not read (it reads formats {OLDEST_READABLE_FORMAT} to {newest}); start a build \
         that reads format {found} (a downgrade migrates the data back before the older build \
         starts), or restore a backup into an empty --data-dir with `store-util snapshot \
         restore`",
        dir = .dir.display()
    )]
    UnreadableFormat {
        /// The data directory.
        dir: PathBuf,
        /// The format its `member/store-format` names.
        found: u32,
        /// The newest format this build reads.
        newest: u32,
    },
    /// `member/store-format` does not hold a format number.
    #[error("--data-dir {dir}: {FORMAT_FILE} does not name a storage format: {content:?}", dir = .dir.display())]
    BadFormatFile {
        /// The data directory.
        dir: PathBuf,
        /// What the file holds (its first bytes).
        content: String,
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

/// Checks `data_dir` (see the module docs) for a release that reads
/// formats up to `newest`, then creates the member's directories in it
/// with etcd's permissions (0700); answers what it found.
pub fn prepare(data_dir: &Path, newest: u32) -> Result<Found, DataDirError> {
    if data_dir.exists() && !data_dir.is_dir() {
        return Err(DataDirError::NotADirectory(data_dir.to_path_buf()));
    }
    let found = read_format(data_dir, newest)?;
    let etcd = etcd_markers(data_dir);
    if !etcd.is_empty() && found == Found::Fresh {
        return Err(DataDirError::ForeignEtcd {
            dir: data_dir.to_path_buf(),
            found: etcd,
        });
    }
    for d in [ENGINE_DIR, SNAPSHOT_DIR] {
        let path = data_dir.join(d);
        std::fs::create_dir_all(&path).map_err(|source| DataDirError::Io { path, source })?;
    }
    restrict(data_dir)?;
    Ok(found)
}

/// The format of the data in `data_dir`: its format file's, else
/// [`UNRECORDED_FORMAT`] if an engine is there, else [`Found::Fresh`].
/// A format past `newest` (or before the oldest) is an error.
fn read_format(data_dir: &Path, newest: u32) -> Result<Found, DataDirError> {
    let path = data_dir.join(FORMAT_FILE);
    let content = match read_bounded(&path) {
        Ok(content) => content,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let engine = data_dir.join(ENGINE_DIR).join(ENGINE_MARKER).exists();
            return Ok(if engine {
                Found::Format(UNRECORDED_FORMAT)
            } else {
                Found::Fresh
            });
        }
        Err(source) => return Err(DataDirError::Io { path, source }),
    };
    let found: u32 = content
        .trim()
        .parse()
        .map_err(|_| DataDirError::BadFormatFile {
            dir: data_dir.to_path_buf(),
            content: content.clone(),
        })?;
    if !(OLDEST_READABLE_FORMAT..=newest).contains(&found) {
        return Err(DataDirError::UnreadableFormat {
            dir: data_dir.to_path_buf(),
            found,
            newest,
        });
    }
    Ok(Found::Format(found))
}

/// The first [`FORMAT_FILE_MAX_BYTES`] of `path`, as text.
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(FORMAT_FILE_MAX_BYTES)
        .read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The format the directory holds once a start has opened everything: an
/// older format brought up by the opening itself (format 1's `kv_index`
/// fill) is [`FORMAT_VERSION`] now, a fresh directory too; a later one
/// stays as it is (only [`migrate`], following the storage version,
/// changes it). The start records it when it differs from `found`.
pub fn format_after_start(found: Found) -> u32 {
    match found {
        Found::Format(n) if n >= FORMAT_VERSION => n,
        Found::Fresh | Found::Format(_) => FORMAT_VERSION,
    }
}

/// Brings `data_dir`'s data from format `from` to `to`, up or down, and
/// records `to` (etcd 3.6 migrates its schema to the storage version the
/// same way, both ways). From [`FORMAT_VERSION`] on, formats share their
/// layout (see [`crate::version`]'s table: the later ones are the
/// test-only next release's), so the step is the record alone; a kill -9
/// before it leaves the directory in `from`, which the next start reads
/// and migrates again. Formats before [`FORMAT_VERSION`] are only brought
/// up, by the start ([`format_after_start`]).
pub fn migrate(data_dir: &Path, from: u32, to: u32) -> Result<(), DataDirError> {
    assert!(
        from >= FORMAT_VERSION && to >= FORMAT_VERSION,
        "formats before {FORMAT_VERSION} are brought up by the start, not migrated ({from} -> {to})"
    );
    record_format(data_dir, to)
}

/// Records that `data_dir`'s data is in `format`: a temporary file,
/// synced, renamed over the format file, the directory synced.
pub fn record_format(data_dir: &Path, format: u32) -> Result<(), DataDirError> {
    use std::io::Write;
    let path = data_dir.join(FORMAT_FILE);
    let io = |source| DataDirError::Io {
        path: path.clone(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    file.write_all(format!("{format}\n").as_bytes())
        .map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    let dir = path.parent().unwrap_or(data_dir);
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
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
        assert_eq!(prepare(&data, FORMAT_VERSION).unwrap(), Found::Fresh);
        assert!(data.join(ENGINE_DIR).is_dir() && data.join(SNAPSHOT_DIR).is_dir());
        assert_eq!(prepare(&data, FORMAT_VERSION).unwrap(), Found::Fresh);
    }

    /// Format 1 is an engine without the file; recording writes the
    /// current format; a newer one, or a file that names none, is refused
    /// before anything is created.
    #[test]
    fn formats_are_read_recorded_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        std::fs::create_dir_all(data.join(ENGINE_DIR)).unwrap();
        std::fs::write(data.join(ENGINE_DIR).join(ENGINE_MARKER), b"x").unwrap();
        assert_eq!(prepare(data, FORMAT_VERSION).unwrap(), Found::Format(1));
        assert_eq!(format_after_start(Found::Format(1)), FORMAT_VERSION);
        record_format(data, FORMAT_VERSION).unwrap();
        assert_eq!(
            std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap(),
            format!("{FORMAT_VERSION}\n")
        );
        assert_eq!(
            prepare(data, FORMAT_VERSION).unwrap(),
            Found::Format(FORMAT_VERSION)
        );

        let newer = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(newer.path().join("member")).unwrap();
        std::fs::write(newer.path().join(FORMAT_FILE), b"3\n").unwrap();
        let err = prepare(newer.path(), FORMAT_VERSION)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "--data-dir {} holds data in storage format 3, which this build of the store does \
                 not read (it reads formats 1 to 2); start a build that reads format 3 (a \
                 downgrade migrates the data back before the older build starts), or restore a \
                 backup into an empty --data-dir with `store-util snapshot restore`",
                newer.path().display()
            )
        );
        assert!(!newer.path().join(ENGINE_DIR).exists(), "nothing created");
        std::fs::write(newer.path().join(FORMAT_FILE), b"two").unwrap();
        let err = prepare(newer.path(), FORMAT_VERSION).unwrap_err();
        assert!(matches!(err, DataDirError::BadFormatFile { .. }), "{err}");
    }

    /// A release that writes format 3 reads it; migrating records each
    /// format, down as well as up; a start leaves a later format alone.
    #[test]
    fn formats_are_migrated_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        assert_eq!(prepare(data, FORMAT_VERSION).unwrap(), Found::Fresh);
        assert_eq!(format_after_start(Found::Fresh), FORMAT_VERSION);
        record_format(data, FORMAT_VERSION).unwrap();
        assert_eq!(
            format_after_start(Found::Format(FORMAT_VERSION)),
            FORMAT_VERSION
        );
        let next = FORMAT_VERSION + 1;
        migrate(data, FORMAT_VERSION, next).unwrap();
        assert!(prepare(data, FORMAT_VERSION).is_err());
        assert_eq!(prepare(data, next).unwrap(), Found::Format(next));
        assert_eq!(format_after_start(Found::Format(next)), next);
        migrate(data, next, FORMAT_VERSION).unwrap();
        assert_eq!(
            prepare(data, FORMAT_VERSION).unwrap(),
            Found::Format(FORMAT_VERSION)
        );
        assert!(!data.join(FORMAT_FILE).with_extension("tmp").exists());
    }

    #[test]
    fn a_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, b"x").unwrap();
        let err = prepare(&file, FORMAT_VERSION).unwrap_err().to_string();
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
        let err = prepare(dir.path(), FORMAT_VERSION).unwrap_err();
        assert!(matches!(&err, DataDirError::ForeignEtcd { found, .. } if found.len() == 2));
        assert!(err.to_string().contains("etcdctl make-mirror"), "{err}");
        assert!(!dir.path().join(ENGINE_DIR).exists(), "nothing created");
        // Once our engine is there too, the directory is ours.
        std::fs::create_dir_all(dir.path().join(ENGINE_DIR)).unwrap();
        std::fs::write(dir.path().join(ENGINE_DIR).join(ENGINE_MARKER), b"x").unwrap();
        prepare(dir.path(), FORMAT_VERSION).unwrap();
    }
}
