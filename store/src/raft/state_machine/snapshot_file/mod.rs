//! The state machine's snapshot: the checkpoints and files that keep the
//! latest one in `<data-dir>/member/snap/`, its record format, and the
//! streaming reader and receiver.
//!
//! **Building** a snapshot (every `--snapshot-count` entries) takes an
//! engine checkpoint ([`Engine::checkpoint`]: RocksDB flushes its
//! memtables and hard-links its table files), so its cost does not grow
//! with the store: no scan, no copy, and apply goes on meanwhile. Its meta
//! (applied log id, membership) is read back from the checkpoint itself.
//! A checkpoint must not hold part of an entry: one that does (it caught
//! an entry applied in several engine batches) is taken again between
//! two entries, through the [`SnapshotFiles::entry_gate`] that apply holds
//! for each entry ([`SnapshotFiles::build`]). Writing every
//! key and revision out instead cost a member a whole scan and a file of
//! the store's size each time, and stretched the writes' p99.9 from 99 to
//! 354 ms at `--snapshot-count 5000` as the file grew to 102 MB.
//!
//! **Sending** one to a lagging follower reads the checkpoint as the
//! stream sends its records, in the format below, produced in chunks on a
//! thread a few chunks ahead ([`SnapshotData::source`],
//! [`Checkpoint::produce`]); no file is written. The stream marks its end
//! (peer protocol 2); for a member that speaks only protocol 1, whose
//! stream header announces the records' length, the checkpoint is read
//! once more before, to measure them ([`Checkpoint::measure`]). A **received** snapshot
//! is a records file: installing it makes it the current snapshot before
//! the tables are replaced, so a crash in between installs it again at the
//! next start. While it arrives, a thread writes its records into the
//! engine's table files ([`SnapshotReceiver::prepare_install`]), which the
//! install then ingests instead of reading the file back. The key index
//! loads from the installed key history while the member serves.
//!
//! The format is a sequence of records `table u8 | key_len u32 | key |
//! value_len u32 | value` (big-endian lengths) of the state machine tables
//! ([`Table::STATE_MACHINE`]). A snapshot never sits in memory whole: the
//! sender reads chunks at their offsets, a follower writes the chunks it
//! receives to a temporary file ([`SnapshotReceiver`]) and installing reads
//! records back in bounded batches ([`RecordReader`]). Memory per snapshot
//! is a chunk or a batch, whatever the store's size (etcd's default quota
//! is 2 GiB).
//!
//! On disk: `snapshot.meta` names the current snapshot's data (a
//! `snapshot-*.ckpt` directory or a `snapshot-*.snap` file) and holds its
//! meta; it is replaced by a rename after the data is synced, and the
//! previous data is removed once no sender reads it. At start,
//! [`remove_leftovers`] removes what a crash left: data no meta names and
//! temporary files. A data dir of the previous layout (`current.meta` and
//! `current.snap`) is read as is until the next snapshot replaces it.
//!
//! The parts: [`names`] (the directory's file names), [`records`] (the
//! format), [`file`] (records files), [`checkpoint`] (checkpoints),
//! [`data`] (either of them, as openraft passes it around), [`receiver`]
//! (receiving, and preparing the install meanwhile). Replaced data is
//! freed gradually ([`crate::removal`]). This module keeps the directory and its current
//! snapshot ([`SnapshotFiles`]), and builds snapshots.

mod checkpoint;
mod data;
mod file;
mod names;
mod receiver;
mod records;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftSnapshotBuilder;

pub use self::checkpoint::Checkpoint;
pub use self::data::{SnapshotData, SnapshotSource};
use self::file::lock;
pub use self::file::{PreparedInstall, SnapshotFile};
use self::names::{
    staging_dir_in, unique_name, CHECKPOINT_EXTENSION, DATA_PREFIX, FILE_EXTENSION,
    LEGACY_DATA_FILE, LEGACY_META_FILE, META_FILE, TEMP_EXTENSION,
};
pub use self::receiver::SnapshotReceiver;
pub(super) use self::records::installed_pairs;
use self::records::invalid;
pub use self::records::{encode_records, Record, RecordReader};
use super::{read_meta, KEY_APPLIED, KEY_APPLIED_PART, KEY_MEMBERSHIP};
use crate::codec;
use crate::engine::{Engine, Table};
use crate::raft::log_store::io_error;
use crate::raft::{LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};
use crate::removal::remove_if_present;
use crate::wal::sync_dir;

/// The thread that frees a replaced snapshot's data gradually.
const SNAPSHOT_REMOVAL_THREAD: &str = "snapshot-remove";

/// What `snapshot.meta` holds.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct SavedMeta {
    meta: SnapshotMeta,
    /// The data's name in the snapshot directory.
    data: String,
}

/// The current snapshot.
#[derive(Debug, Clone)]
struct Current {
    meta: SnapshotMeta,
    data: SnapshotData,
}

/// The decoded file `name` of `dir`, if it exists.
fn read_meta_file<T: serde::de::DeserializeOwned>(
    dir: &Path,
    name: &str,
) -> std::io::Result<Option<T>> {
    match std::fs::read(dir.join(name)) {
        Ok(bytes) => codec::decode(&bytes)
            .map(Some)
            .map_err(|e| io_error("reading the snapshot meta", e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the current snapshot's meta and data from `dir`: `snapshot.meta`,
/// else the previous layout's files.
fn load_current(dir: &Path, engine: &Arc<dyn Engine>) -> std::io::Result<Option<Current>> {
    let (meta, name) = if let Some(saved) = read_meta_file::<SavedMeta>(dir, META_FILE)? {
        (saved.meta, saved.data)
    } else if let Some(meta) = read_meta_file::<SnapshotMeta>(dir, LEGACY_META_FILE)? {
        (meta, LEGACY_DATA_FILE.to_string())
    } else {
        return Ok(None);
    };
    let path = dir.join(&name);
    let data = if name.ends_with(&format!(".{CHECKPOINT_EXTENSION}")) {
        if !path.is_dir() {
            return Err(invalid("the snapshot's checkpoint is missing"));
        }
        SnapshotData::Checkpoint(Checkpoint::new(path, engine.clone()))
    } else {
        SnapshotData::File(Arc::new(SnapshotFile::open(&path)?))
    };
    Ok(Some(Current { meta, data }))
}

/// Held by apply for each entry and by a checkpoint taken between
/// entries, so such a checkpoint never holds part of an entry.
#[derive(Debug, Default)]
pub struct EntryGate(Mutex<()>);

impl EntryGate {
    /// Holds the gate until the guard is dropped.
    pub fn hold(&self) -> MutexGuard<'_, ()> {
        lock(&self.0)
    }
}

/// The current snapshot in memory, read from disk on first use.
#[derive(Debug)]
enum Slot {
    Unread,
    Read(Option<Current>),
}

impl Slot {
    /// The current snapshot, once read.
    fn get(&self) -> Option<&Current> {
        match self {
            Slot::Read(current) => current.as_ref(),
            Slot::Unread => None,
        }
    }
}

/// The snapshot directory and the current snapshot. Replacing the current
/// snapshot and reading it take one lock, so a reader gets a meta and the
/// data it describes, whatever a concurrent build or install does.
#[derive(Clone)]
pub struct SnapshotFiles {
    dir: PathBuf,
    engine: Arc<dyn Engine>,
    current: Arc<Mutex<Slot>>,
    /// Shared with apply (see [`EntryGate`]).
    entry_gate: Arc<EntryGate>,
}

impl std::fmt::Debug for SnapshotFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotFiles")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl SnapshotFiles {
    /// The snapshots of `engine`'s state machine in `dir`.
    pub fn new(dir: PathBuf, engine: Arc<dyn Engine>) -> Self {
        Self {
            dir,
            engine,
            current: Arc::new(Mutex::new(Slot::Unread)),
            entry_gate: Arc::default(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new staging directory in this snapshot directory
    /// ([`staging_dir_in`]).
    pub(super) fn staging_dir(&self) -> PathBuf {
        staging_dir_in(&self.dir)
    }

    /// The gate apply holds while it applies one entry.
    pub(super) fn entry_gate(&self) -> Arc<EntryGate> {
        self.entry_gate.clone()
    }

    fn locked_current(&self) -> std::io::Result<MutexGuard<'_, Slot>> {
        let mut slot = lock(&self.current);
        if let Slot::Unread = *slot {
            *slot = Slot::Read(load_current(&self.dir, &self.engine)?);
        }
        Ok(slot)
    }

    /// The current snapshot's meta and data, if there is one.
    pub fn current(&self) -> std::io::Result<Option<(SnapshotMeta, SnapshotData)>> {
        let slot = self.locked_current()?;
        Ok(slot.get().map(|c| (c.meta.clone(), c.data.clone())))
    }

    /// Whether `data` is the current snapshot's.
    fn is_current(&self, data: &SnapshotData) -> std::io::Result<bool> {
        let slot = self.locked_current()?;
        Ok(slot.get().is_some_and(|c| c.data.path() == data.path()))
    }

    /// Makes the synced `data`, named `name` in the directory, the current
    /// snapshot with `meta`, unless the current one is newer (a build that
    /// an install overtook): `snapshot.meta` is written to a synced
    /// temporary file and renamed into place, then the previous data is
    /// retired. Data that does not become current is retired itself.
    fn make_current(
        &self,
        meta: &SnapshotMeta,
        name: &str,
        data: SnapshotData,
    ) -> std::io::Result<()> {
        let saved = codec::encode(&SavedMeta {
            meta: meta.clone(),
            data: name.to_string(),
        });
        let tmp = self
            .dir
            .join(format!("{META_FILE}.{}", unique_name("", TEMP_EXTENSION)));
        std::fs::write(&tmp, saved)?;
        File::open(&tmp)?.sync_all()?;
        let mut slot = self.locked_current()?;
        let previous = slot.get().cloned();
        if previous
            .as_ref()
            .is_some_and(|c| c.meta.last_log_id > meta.last_log_id)
        {
            std::fs::remove_file(&tmp)?;
            retire(&data);
            return Ok(());
        }
        std::fs::rename(&tmp, self.dir.join(META_FILE))?;
        sync_dir(&self.dir)?;
        *slot = Slot::Read(Some(Current {
            meta: meta.clone(),
            data: data.clone(),
        }));
        drop(slot);
        if let Some(previous) = previous {
            if previous.data.path() != data.path() {
                retire(&previous.data);
            }
        }
        for legacy in [LEGACY_META_FILE, LEGACY_DATA_FILE] {
            remove_if_present(&self.dir.join(legacy))?;
        }
        Ok(())
    }

    /// Takes a checkpoint and reads its meta back; `None` (and the
    /// checkpoint removed) if it holds part of an entry. With `gated`, it
    /// is taken between two entries (apply waits meanwhile).
    fn checkpoint(
        &self,
        gated: bool,
    ) -> std::io::Result<Option<(SnapshotMeta, SnapshotData, String)>> {
        let name = unique_name(DATA_PREFIX, CHECKPOINT_EXTENSION);
        let path = self.dir.join(&name);
        {
            let _between_entries = gated.then(|| self.entry_gate.hold());
            self.engine
                .checkpoint(&path)
                .map_err(|e| io_error("taking a snapshot checkpoint", e))?;
        }
        let checkpoint = Checkpoint::new(path, self.engine.clone());
        let view = checkpoint.open()?;
        if view
            .get(Table::Meta, KEY_APPLIED_PART)
            .map_err(|e| io_error("reading a checkpoint", e))?
            .is_some()
        {
            drop(view);
            checkpoint.retire();
            return Ok(None);
        }
        let applied: Option<LogId> =
            read_meta::<Option<LogId>>(view.as_ref(), KEY_APPLIED)?.flatten();
        let membership: StoredMembership =
            read_meta(view.as_ref(), KEY_MEMBERSHIP)?.unwrap_or_default();
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
        };
        Ok(Some((meta, SnapshotData::Checkpoint(checkpoint), name)))
    }

    /// Takes a checkpoint at an entry boundary and makes it the current
    /// snapshot (blocking). The first try does not stop apply: a
    /// checkpoint lands between entries unless it catches an entry applied
    /// in several engine batches (an auth, alarm or member proposal among
    /// key-value ones), which the progress key `sm/applied_part` shows;
    /// then a second one is taken through the entry gate, with little
    /// left to flush after the first.
    fn build(&self) -> std::io::Result<(SnapshotMeta, SnapshotData)> {
        std::fs::create_dir_all(&self.dir)?;
        let started = std::time::Instant::now();
        let (gated, (meta, data, name)) = match self.checkpoint(false)? {
            Some(taken) => (false, taken),
            None => match self.checkpoint(true)? {
                Some(taken) => (true, taken),
                None => return Err(invalid("a checkpoint between entries holds part of one")),
            },
        };
        self.make_current(&meta, &name, data.clone())?;
        tracing::info!(
            dir = %self.dir.display(),
            meta = %meta,
            between_entries_by_gate = gated,
            took_ms = started.elapsed().as_millis() as u64,
            "built snapshot"
        );
        Ok((meta, data))
    }

    /// After an install has replaced the tables with `installed`'s records:
    /// a checkpoint of them becomes the current snapshot in place of the
    /// received file, which is removed. A checkpoint shares its table files
    /// with the engine, so a member that caught up by snapshot no longer
    /// keeps the store twice on disk (a records file as large as the
    /// store, until its next snapshot). The caller holds the entry gate.
    /// On failure the file stays current, as before.
    pub(super) fn replace_installed_file(&self, installed: &SnapshotMeta) -> std::io::Result<()> {
        let Some((meta, data, name)) = self.checkpoint(false)? else {
            return Err(invalid("the installed tables hold part of an entry"));
        };
        if meta.last_log_id != installed.last_log_id {
            if let SnapshotData::Checkpoint(c) = &data {
                c.retire();
            }
            return Err(invalid(
                "the installed tables are not at the snapshot's log id",
            ));
        }
        self.make_current(&meta, &name, data)
    }

    /// Makes a snapshot to be installed the current one, unless it already
    /// is (one restored at start), and returns its records: a received
    /// file is moved into place, another member's checkpoint (openraft's
    /// storage suite installs one store's snapshot into another) is
    /// written out first. Blocking.
    pub(super) fn adopt(
        &self,
        meta: &SnapshotMeta,
        data: SnapshotData,
    ) -> std::io::Result<Arc<SnapshotFile>> {
        if self.is_current(&data)? {
            return data.encoded();
        }
        std::fs::create_dir_all(&self.dir)?;
        let file = match data {
            SnapshotData::File(file) => file,
            SnapshotData::Checkpoint(checkpoint) => Arc::new(checkpoint.encode()?),
        };
        let name = unique_name(DATA_PREFIX, FILE_EXTENSION);
        let file = Arc::new(SnapshotFile::persist(file, &self.dir, &name)?);
        sync_dir(&self.dir)?;
        self.make_current(meta, &name, SnapshotData::File(file.clone()))?;
        Ok(file)
    }
}

/// Marks data a newer snapshot replaced for removal: a checkpoint goes
/// when its last reader lets go, a file now (its readers hold it open).
fn retire(data: &SnapshotData) {
    match data {
        SnapshotData::Checkpoint(checkpoint) => checkpoint.retire(),
        SnapshotData::File(file) => {
            if let Err(e) = remove_if_present(&file.path) {
                tracing::warn!(path = %file.path.display(), error = %e, "removing a replaced snapshot");
            }
        }
    }
}

/// Removes what a crash left in the snapshot directory: temporary files
/// and checkpoints, snapshot data that `snapshot.meta` does not name, and
/// the previous layout's files once `snapshot.meta` exists.
pub fn remove_leftovers(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let current = read_meta_file::<SavedMeta>(dir, META_FILE)?.map(|saved| saved.data);
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let temporary = name.ends_with(&format!(".{TEMP_EXTENSION}"));
        let stale_data = name.starts_with(DATA_PREFIX) && current.as_deref() != Some(name.as_str());
        let stale_legacy =
            current.is_some() && [LEGACY_META_FILE, LEGACY_DATA_FILE].contains(&name.as_str());
        if !(temporary || stale_data || stale_legacy) {
            continue;
        }
        let path = entry.path();
        tracing::info!(path = %path.display(), "removing a leftover snapshot file");
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Builds a snapshot: a checkpoint of the engine (module docs).
pub struct SnapshotBuilder {
    pub(super) files: SnapshotFiles,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> std::io::Result<Snapshot> {
        let files = self.files.clone();
        let (meta, snapshot) = tokio::task::spawn_blocking(move || files.build())
            .await
            .map_err(|e| io_error("building a snapshot", e))?
            .map_err(|e| io_error("saving a snapshot", e))?;
        Ok(Snapshot { meta, snapshot })
    }
}

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use super::testing::{applied_batch, encode, memory_files, names, put_applied, record};
    use super::*;

    /// A build is a checkpoint with the meta read back from it; the next
    /// build replaces it and removes the old one once its last reader is
    /// gone; a restart finds the current one.
    #[test]
    fn builds_replace_the_current_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        assert!(files.current().unwrap().is_none());
        put_applied(engine.as_ref(), 5, "a");
        let (meta, first) = files.build().unwrap();
        assert_eq!(meta.last_log_id.unwrap().index, 5);
        let sent = first.encoded().unwrap();
        let mut records = sent.records();
        let mut keys = Vec::new();
        while let Some(r) = records.next_record().unwrap() {
            keys.push((r.table, r.key));
        }
        assert!(keys.contains(&(Table::Kv, b"a".to_vec())));

        put_applied(engine.as_ref(), 9, "b");
        let (meta, second) = files.build().unwrap();
        assert_eq!(meta.last_log_id.unwrap().index, 9);
        assert!(first.path().exists(), "a reader still holds the first one");
        let first_path = first.path().to_path_buf();
        drop(first);
        assert!(!first_path.exists());
        drop(sent);
        assert_eq!(names(dir.path()).len(), 2, "{:?}", names(dir.path()));

        let (_, reopened) = memory_files(dir.path());
        let (meta, data) = reopened.current().unwrap().unwrap();
        assert_eq!(meta.last_log_id.unwrap().index, 9);
        assert_eq!(data.path(), second.path());
    }

    /// A snapshot older than the current one (an install a build
    /// overtook, or the reverse) never replaces it.
    #[test]
    fn an_older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        put_applied(engine.as_ref(), 3, "a");
        let (old_meta, _) = files.build().unwrap();
        put_applied(engine.as_ref(), 7, "b");
        let (new_meta, newer) = files.build().unwrap();
        let received = newer.encoded().unwrap();
        let copy = SnapshotReceiver::create(dir.path(), Some(received.len())).unwrap();
        let mut copy = copy;
        copy.write(&received.chunk_at(0, received.len()).unwrap())
            .unwrap();
        let copy = SnapshotData::File(Arc::new(copy.finish().unwrap()));
        // Adopting an older snapshot's records keeps the newer current.
        files.adopt(&old_meta, copy).unwrap();
        let (meta, _) = files.current().unwrap().unwrap();
        assert_eq!(meta.last_log_id, new_meta.last_log_id);
    }

    /// A checkpoint that catches an entry in the middle (its progress key
    /// `sm/applied_part` set) is dropped and taken again between entries,
    /// once the entry being applied is done.
    #[test]
    fn a_checkpoint_never_holds_part_of_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        put_applied(engine.as_ref(), 3, "a");
        let mut part = crate::engine::WriteBatch::new();
        part.put(
            Table::Meta,
            KEY_APPLIED_PART.to_vec(),
            b"entry 4, 1 applied".to_vec(),
        );
        engine.write(part, false).unwrap();
        assert!(files.checkpoint(false).unwrap().is_none());
        assert_eq!(
            names(dir.path()),
            Vec::<String>::new(),
            "the partial one is gone"
        );

        let (gate_held, held) = std::sync::mpsc::channel();
        let applier = {
            let (engine, files) = (engine.clone(), files.clone());
            std::thread::spawn(move || {
                let gate = files.entry_gate();
                let _held = gate.hold();
                gate_held.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                // The entry's last group: its data, `applied`, and the
                // progress key gone, in one batch.
                let mut done = applied_batch(4, "b");
                done.delete(Table::Meta, KEY_APPLIED_PART.to_vec());
                engine.write(done, false).unwrap();
            })
        };
        held.recv().unwrap();
        let (meta, _) = files.build().unwrap();
        applier.join().unwrap();
        assert_eq!(meta.last_log_id.unwrap().index, 4);
    }

    /// Another member's current snapshot file (still shared with its own
    /// current slot) is copied when adopted, and stays with its owner.
    #[test]
    fn a_shared_file_is_copied_when_adopted() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (engine_a, files_a) = memory_files(a.path());
        put_applied(engine_a.as_ref(), 4, "k");
        let (meta, built) = files_a.build().unwrap();
        let records = built.encoded().unwrap();
        let mut receiver = SnapshotReceiver::create(a.path(), Some(records.len())).unwrap();
        receiver
            .write(&records.chunk_at(0, records.len()).unwrap())
            .unwrap();
        let received = SnapshotData::File(Arc::new(receiver.finish().unwrap()));
        drop((built, records));
        files_a.adopt(&meta, received).unwrap();
        let (_, shared) = files_a.current().unwrap().unwrap();

        let (_, files_b) = memory_files(b.path());
        let adopted = files_b.adopt(&meta, shared.clone()).unwrap();
        assert_eq!(adopted.len(), shared.encoded().unwrap().len());
        assert!(shared.path().exists(), "the owner keeps its file");
        assert_eq!(
            files_b.current().unwrap().unwrap().0.last_log_id,
            meta.last_log_id
        );
    }

    #[test]
    fn leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        put_applied(engine.as_ref(), 2, "a");
        let (_, current) = files.build().unwrap();
        let current_name = current
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        drop(current);
        std::fs::write(dir.path().join("current.snap"), b"x").unwrap();
        std::fs::write(dir.path().join("current.meta"), b"x").unwrap();
        std::fs::write(dir.path().join("receiving-1-0.tmp"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("snapshot-1-2-3.ckpt.tmp")).unwrap();
        std::fs::create_dir(dir.path().join("snapshot-1-2-4.ckpt")).unwrap();
        std::fs::write(dir.path().join("snapshot-1-2-5.snap"), b"x").unwrap();
        std::fs::write(dir.path().join("unrelated"), b"x").unwrap();
        remove_leftovers(dir.path()).unwrap();
        let mut expected = vec![current_name, META_FILE.to_string(), "unrelated".to_string()];
        expected.sort();
        assert_eq!(names(dir.path()), expected);
    }

    /// A data dir of the previous layout is read until a new snapshot
    /// replaces it, and its files go then.
    #[test]
    fn the_previous_layout_is_read_then_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, files) = memory_files(dir.path());
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(
                crate::raft::LeaderId {
                    term: 1,
                    node_id: 1,
                },
                4,
            )),
            last_membership: StoredMembership::default(),
        };
        std::fs::write(
            dir.path().join(LEGACY_DATA_FILE),
            encode(&[record(Table::Kv, "k", "v")]),
        )
        .unwrap();
        std::fs::write(dir.path().join(LEGACY_META_FILE), codec::encode(&meta)).unwrap();
        remove_leftovers(dir.path()).unwrap();
        let (read, data) = files.current().unwrap().unwrap();
        assert_eq!(read.last_log_id, meta.last_log_id);
        assert!(matches!(data, SnapshotData::File(_)));
        put_applied(engine.as_ref(), 6, "a");
        files.build().unwrap();
        assert!(!dir.path().join(LEGACY_DATA_FILE).exists());
        assert!(!dir.path().join(LEGACY_META_FILE).exists());
    }
}
