//! In-memory engine: one `BTreeMap` per table behind a lock.
//!
//! Nothing is persisted: `sync` is a no-op and a restart loses everything.
//! Used by unit tests, the engine conformance suite, and embedders that want
//! a throwaway member. Snapshots copy the maps (O(data)), which is fine for
//! the sizes it is meant for; so do checkpoints, into one file
//! ([`CHECKPOINT_FILE`]) of the tables' pairs.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, RwLock};

use super::{
    BatchOp, BulkSource, Engine, EngineError, EngineRead, EngineResult, PreparedLoad, ScanVisitor,
    Table, WriteBatch,
};
use crate::codec;

/// The file in a checkpoint directory that holds the tables.
const CHECKPOINT_FILE: &str = "tables";

/// A checkpoint's contents: each table's position in [`Table::ALL`] and
/// its pairs.
type CheckpointTables = Vec<(u8, Vec<(Vec<u8>, Vec<u8>)>)>;

fn io_err(e: std::io::Error) -> EngineError {
    EngineError::Backend(Box::new(e))
}

type Tables = HashMap<Table, BTreeMap<Vec<u8>, Vec<u8>>>;

/// A non-persistent engine.
#[derive(Default)]
pub struct MemoryEngine {
    tables: RwLock<Tables>,
}

impl MemoryEngine {
    /// An empty engine.
    pub fn new() -> Self {
        Self::default()
    }
}

/// A frozen copy of the tables.
struct MemorySnapshot {
    tables: Tables,
}

fn bounds<'a>(start: &'a [u8], end: Option<&'a [u8]>) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
    let upper = match end {
        Some(e) => Bound::Excluded(e),
        None => Bound::Unbounded,
    };
    (Bound::Included(start), upper)
}

fn empty_range(start: &[u8], end: Option<&[u8]>) -> bool {
    matches!(end, Some(e) if e <= start)
}

fn get_in(tables: &Tables, table: Table, key: &[u8]) -> Option<Vec<u8>> {
    tables.get(&table).and_then(|t| t.get(key).cloned())
}

fn scan_in(
    tables: &Tables,
    table: Table,
    start: &[u8],
    end: Option<&[u8]>,
    reverse: bool,
    visit: &mut ScanVisitor<'_>,
) {
    let Some(map) = tables.get(&table) else {
        return;
    };
    if empty_range(start, end) {
        return;
    }
    let range = map.range::<[u8], _>(bounds(start, end));
    let mut step = |(k, v): (&Vec<u8>, &Vec<u8>)| visit(k, v);
    if reverse {
        for kv in range.rev() {
            if step(kv).is_break() {
                return;
            }
        }
    } else {
        for kv in range {
            if step(kv).is_break() {
                return;
            }
        }
    }
}

impl EngineRead for MemoryEngine {
    fn get(&self, table: Table, key: &[u8]) -> EngineResult<Option<Vec<u8>>> {
        Ok(get_in(
            &self.tables.read().expect("memory engine lock"),
            table,
            key,
        ))
    }

    fn scan_range(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()> {
        let tables = self.tables.read().expect("memory engine lock");
        scan_in(&tables, table, start, end, reverse, visit);
        Ok(())
    }
}

impl EngineRead for MemorySnapshot {
    fn get(&self, table: Table, key: &[u8]) -> EngineResult<Option<Vec<u8>>> {
        Ok(get_in(&self.tables, table, key))
    }

    fn scan_range(
        &self,
        table: Table,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        visit: &mut ScanVisitor<'_>,
    ) -> EngineResult<()> {
        scan_in(&self.tables, table, start, end, reverse, visit);
        Ok(())
    }
}

impl Engine for MemoryEngine {
    fn write(&self, batch: WriteBatch, _sync: bool) -> EngineResult<()> {
        let mut tables = self.tables.write().expect("memory engine lock");
        for op in batch.ops {
            match op {
                BatchOp::Put(t, k, v) => {
                    tables.entry(t).or_default().insert(k, v);
                }
                BatchOp::Delete(t, k) => {
                    tables.entry(t).or_default().remove(&k);
                }
                BatchOp::DeleteRange(t, start, end) => {
                    let map = tables.entry(t).or_default();
                    if start < end {
                        let doomed: Vec<Vec<u8>> = map
                            .range::<[u8], _>(bounds(&start, Some(&end)))
                            .map(|(k, _)| k.clone())
                            .collect();
                        for k in doomed {
                            map.remove(&k);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> EngineResult<()> {
        Ok(())
    }

    fn prepare_load(
        &self,
        _staging: &Path,
        next: &mut BulkSource<'_>,
    ) -> EngineResult<PreparedLoad> {
        let mut pairs = Vec::new();
        while let Some(pair) = next()? {
            pairs.push(pair);
        }
        Ok(PreparedLoad::pairs(pairs))
    }

    fn ingest(&self, mut load: PreparedLoad) -> EngineResult<()> {
        let mut batch = WriteBatch::new();
        for (table, key, value) in load.take_pairs() {
            batch.put(table, key, value);
        }
        self.write(batch, true)
    }

    fn snapshot(&self) -> Arc<dyn EngineRead> {
        let tables = self.tables.read().expect("memory engine lock").clone();
        Arc::new(MemorySnapshot { tables })
    }

    fn size_bytes(&self) -> u64 {
        self.size_in_use_bytes()
    }

    fn tables_size_bytes(&self, tables: &[Table]) -> u64 {
        let all = self.tables.read().expect("memory engine lock");
        tables
            .iter()
            .filter_map(|t| all.get(t))
            .flat_map(|t| t.iter())
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum()
    }

    fn size_in_use_bytes(&self) -> u64 {
        let tables = self.tables.read().expect("memory engine lock");
        tables
            .values()
            .flat_map(|t| t.iter())
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum()
    }

    fn compact_files(&self) -> EngineResult<()> {
        Ok(())
    }

    fn checkpoint(&self, dir: &Path) -> EngineResult<()> {
        let tables: CheckpointTables = {
            let all = self.tables.read().expect("memory engine lock");
            Table::ALL
                .iter()
                .enumerate()
                .filter_map(|(i, t)| all.get(t).map(|map| (i, map)))
                .map(|(i, map)| (i as u8, map.clone().into_iter().collect()))
                .collect()
        };
        std::fs::create_dir(dir).map_err(io_err)?;
        let path = dir.join(CHECKPOINT_FILE);
        std::fs::write(&path, codec::encode(&tables)).map_err(io_err)?;
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(io_err)
    }

    fn open_checkpoint(&self, dir: &Path) -> EngineResult<Arc<dyn EngineRead>> {
        let bytes = std::fs::read(dir.join(CHECKPOINT_FILE)).map_err(io_err)?;
        let saved: CheckpointTables = codec::decode(&bytes).map_err(EngineError::corrupt)?;
        let mut tables = Tables::new();
        for (i, pairs) in saved {
            let table = *Table::ALL
                .get(i as usize)
                .ok_or_else(|| EngineError::corrupt("unknown table in a checkpoint"))?;
            tables.insert(table, pairs.into_iter().collect());
        }
        Ok(Arc::new(MemorySnapshot { tables }))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn conformance() {
        super::super::conformance::run_all(&|| Box::new(super::MemoryEngine::new()));
    }
}
