//! Removing large files without stalling the disk: a file no other link
//! holds shrinks a step at a time, on a thread of its own, each step
//! synced so that the file system's journal commits (and discards) one
//! step's blocks at a time. Used for a replaced snapshot's data
//! (`raft::state_machine::snapshot_file`), the table files a defragment
//! replaced (`engine::rocks`) and the Raft log's purged segments (`wal`).

use std::path::{Path, PathBuf};

/// Bytes freed per step, and the pause after each step (80 MiB/s). A
/// checkpoint whose table files a defragment replaced is the last link to
/// a whole copy of the store, and so are the table files a defragment
/// replaced. Freed at once (or even at 1.3 GB/s), a gigabyte held up every
/// member's fsync on the file system for 0.4-0.8 s: on a file system
/// mounted with `discard` (ext4's online discard), the journal commit that
/// an fsync waits for discards every block freed since the last one.
const REMOVE_STEP_BYTES: u64 = 16 * 1024 * 1024;
const REMOVE_STEP_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// Removes `path` (a file, or a directory of files): at once if it holds
/// at most [`REMOVE_STEP_BYTES`], else on a thread named `thread`, freeing
/// large files gradually. A failure is logged: nothing waits for it.
pub fn remove_in_background(path: PathBuf, thread: &str) {
    if bytes_under(&path) <= REMOVE_STEP_BYTES {
        return remove_logging_failure(&path);
    }
    let spawned = std::thread::Builder::new().name(thread.into()).spawn({
        let path = path.clone();
        move || remove_logging_failure(&path)
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, path = %path.display(), "no thread to remove files gradually; removing them now");
        remove_logging_failure(&path);
    }
}

/// Removes, each in the background ([`remove_in_background`]), every entry
/// of `dir` whose path `matches`: what a stop left of earlier removals.
pub fn remove_matching_in_background(
    dir: &Path,
    matches: impl Fn(&Path) -> bool,
    thread: &str,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if matches(&path) {
            remove_in_background(path, thread);
        }
    }
    Ok(())
}

/// Removes the file at `path`, if there is one.
pub fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// [`remove_gradually`], a failure logged.
fn remove_logging_failure(path: &Path) {
    if let Err(e) = remove_gradually(path) {
        tracing::warn!(path = %path.display(), error = %e, "removing files gradually");
    }
}

/// Bytes of the files at `path` (a file, or a directory's files); 0 for
/// what cannot be read.
fn bytes_under(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| bytes_under(&e.path()))
                    .sum()
            })
            .unwrap_or(0),
        Ok(meta) => meta.len(),
        Err(_) => 0,
    }
}

/// Removes a file or a directory of files, first shrinking each file that
/// has no other link (a table file the engine still uses is only unlinked)
/// by [`REMOVE_STEP_BYTES`] at a time.
fn remove_gradually(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            remove_gradually(&entry?.path())?;
        }
        return std::fs::remove_dir(path);
    }
    if meta.is_file() && meta.nlink() == 1 && meta.len() > REMOVE_STEP_BYTES {
        let file = std::fs::OpenOptions::new().write(true).open(path)?;
        let mut len = meta.len();
        while len > REMOVE_STEP_BYTES {
            len -= REMOVE_STEP_BYTES;
            file.set_len(len)?;
            // Commits the step now: the journal commit discards only its
            // blocks, on this thread, instead of everything freed since
            // the last commit on whichever fsync needs the next one.
            file.sync_all()?;
            std::thread::sleep(REMOVE_STEP_PAUSE);
        }
    }
    remove_if_present(path)
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;

    /// A directory goes file by file; a large file with no other
    /// link shrinks in steps, one the engine still links is only unlinked.
    #[test]
    fn removal_shrinks_only_unshared_files() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = dir.path().join("snapshot-1.ckpt");
        std::fs::create_dir(&checkpoint).unwrap();
        let big = REMOVE_STEP_BYTES * 2 + 1;
        let own = File::create(checkpoint.join("own.sst")).unwrap();
        own.set_len(big).unwrap();
        let engine_file = dir.path().join("engine.sst");
        File::create(&engine_file).unwrap().set_len(big).unwrap();
        std::fs::hard_link(&engine_file, checkpoint.join("shared.sst")).unwrap();
        assert_eq!(bytes_under(&checkpoint), 2 * big);

        remove_gradually(&checkpoint).unwrap();
        assert!(!checkpoint.exists());
        assert_eq!(std::fs::metadata(&engine_file).unwrap().len(), big);
        remove_gradually(&checkpoint).unwrap();
    }
}
