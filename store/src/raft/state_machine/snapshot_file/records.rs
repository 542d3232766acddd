//! The snapshot format: a sequence of records `table u8 | key_len u32 |
//! key | value_len u32 | value` (see the [module docs](super)). Writing an
//! engine's state machine tables as records, reading records back one by
//! one, and the pairs of them an install loads.

use std::io::{Read, Write};
use std::ops::ControlFlow;

use crate::engine::{BulkPair, EngineError, EngineRead, EngineResult, Table};
use crate::raft::log_store::io_error;
use crate::raft::state_machine::{KEY_APPLIED, KEY_APPLIED_PART, KEY_MEMBERSHIP};

/// Data that breaks the snapshot format or what its sender announced.
pub(super) fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// One record of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The table the pair belongs to.
    pub table: Table,
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
}

impl Record {
    /// The record's size in the snapshot format.
    pub fn encoded_len(&self) -> usize {
        1 + 4 + self.key.len() + 4 + self.value.len()
    }
}

/// Reads records one by one. A length that runs past the end of the
/// snapshot (or past the most a snapshot may hold, when its length is not
/// known) is refused before anything is allocated for it.
pub struct RecordReader<R> {
    input: R,
    remaining: u64,
    /// Whether `remaining` is the input's length (else only a bound, and
    /// the input's end, between two records, is the records' end).
    exact: bool,
}

impl<R: Read> RecordReader<R> {
    /// Reads records from `input`, which holds `len` bytes.
    pub fn new(input: R, len: u64) -> Self {
        Self {
            input,
            remaining: len,
            exact: true,
        }
    }

    /// Reads records from `input` until its end, at most `limit` bytes.
    pub fn until_end(input: R, limit: u64) -> Self {
        Self {
            input,
            remaining: limit,
            exact: false,
        }
    }

    /// The next record's table byte, or `None` at the end of the input.
    fn first_byte(&mut self) -> std::io::Result<Option<u8>> {
        if self.exact {
            return Ok(Some(self.take(1)?[0]));
        }
        let mut byte = [0u8];
        loop {
            match self.input.read(&mut byte) {
                Ok(0) => return Ok(None),
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.remaining == 0 {
            return Err(invalid("snapshot larger than the member's limit"));
        }
        self.remaining -= 1;
        Ok(Some(byte[0]))
    }

    fn take(&mut self, n: u64) -> std::io::Result<Vec<u8>> {
        if n > self.remaining {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "truncated snapshot",
            ));
        }
        let mut buf = vec![0; n as usize];
        self.input.read_exact(&mut buf)?;
        self.remaining -= n;
        Ok(buf)
    }

    fn take_len(&mut self) -> std::io::Result<u64> {
        let bytes: [u8; 4] = self.take(4)?.try_into().expect("4 bytes");
        Ok(u32::from_be_bytes(bytes) as u64)
    }

    /// The next record, or `None` at the end.
    pub fn next_record(&mut self) -> std::io::Result<Option<Record>> {
        if self.exact && self.remaining == 0 {
            return Ok(None);
        }
        let Some(table_byte) = self.first_byte()? else {
            return Ok(None);
        };
        let table = *Table::STATE_MACHINE
            .get(table_byte as usize)
            .ok_or_else(|| invalid("unknown snapshot table"))?;
        let key_len = self.take_len()?;
        let key = self.take(key_len)?;
        let value_len = self.take_len()?;
        let value = self.take(value_len)?;
        Ok(Some(Record { table, key, value }))
    }
}

/// Writes one record (snapshot format) of the table at `table_index` in
/// [`Table::STATE_MACHINE`].
pub(super) fn write_record(
    out: &mut dyn Write,
    table_index: u8,
    key: &[u8],
    value: &[u8],
) -> std::io::Result<()> {
    out.write_all(&[table_index])?;
    out.write_all(&(key.len() as u32).to_be_bytes())?;
    out.write_all(key)?;
    out.write_all(&(value.len() as u32).to_be_bytes())?;
    out.write_all(value)
}

/// Writes every state machine table of `reader` to `out` (snapshot format).
pub fn encode_records(reader: &dyn EngineRead, out: &mut dyn Write) -> std::io::Result<()> {
    let mut failed = None;
    for (i, t) in Table::STATE_MACHINE.iter().enumerate() {
        reader
            .scan(
                *t,
                &[],
                None,
                &mut |k, v| match write_record(out, i as u8, k, v) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                },
            )
            .map_err(|e: EngineError| io_error("reading the state machine", e))?;
        if let Some(e) = failed.take() {
            return Err(e);
        }
    }
    Ok(())
}

/// The pairs of `records` an install loads into the tables: all but the
/// meta keys that record how far the state machine is applied (the
/// install writes its own).
pub(in crate::raft::state_machine) fn installed_pairs<R: Read>(
    records: &mut RecordReader<R>,
) -> impl FnMut() -> EngineResult<Option<BulkPair>> + '_ {
    move || loop {
        let record = records
            .next_record()
            .map_err(|e| EngineError::Backend(Box::new(e)))?;
        match record {
            Some(r) if r.table == Table::Meta && PROGRESS_KEYS.contains(&&r.key[..]) => {}
            Some(r) => return Ok(Some((r.table, r.key, r.value))),
            None => return Ok(None),
        }
    }
}

/// Meta keys that record how far the state machine is applied.
const PROGRESS_KEYS: [&[u8]; 3] = [KEY_APPLIED, KEY_MEMBERSHIP, KEY_APPLIED_PART];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::state_machine::snapshot_file::testing::{encode, record};

    fn read_all(data: &[u8]) -> std::io::Result<Vec<Record>> {
        let mut reader = RecordReader::new(data, data.len() as u64);
        let mut out = Vec::new();
        while let Some(r) = reader.next_record()? {
            out.push(r);
        }
        Ok(out)
    }

    #[test]
    fn records_read_back_in_order() {
        let records = vec![
            record(Table::Kv, "a", "1"),
            record(Table::Meta, "", ""),
            record(Table::Lease, "lease", "x"),
        ];
        let data = encode(&records);
        assert_eq!(
            data.len(),
            records.iter().map(Record::encoded_len).sum::<usize>()
        );
        assert_eq!(read_all(&data).unwrap(), records);
    }

    #[test]
    fn a_length_past_the_end_is_refused_before_allocating() {
        let mut data = vec![0u8];
        data.extend_from_slice(&u32::MAX.to_be_bytes());
        let err = read_all(&data).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        let mut cut = encode(&[record(Table::Kv, "key", "value")]);
        cut.pop();
        assert!(read_all(&cut).is_err());
    }

    /// Without a known length the records end where the input does,
    /// between two records; a cut record and a snapshot past the limit
    /// are refused.
    #[test]
    fn records_of_unknown_length_end_with_the_input() {
        let records = vec![record(Table::Kv, "a", "1"), record(Table::Lease, "b", "22")];
        let data = encode(&records);
        let read = |data: &[u8], limit: u64| -> std::io::Result<Vec<Record>> {
            let mut reader = RecordReader::until_end(data, limit);
            let mut out = Vec::new();
            while let Some(r) = reader.next_record()? {
                out.push(r);
            }
            Ok(out)
        };
        assert_eq!(read(&data, u64::MAX).unwrap(), records);
        assert_eq!(
            read(&data, data.len() as u64).unwrap(),
            records,
            "exactly the limit"
        );
        assert_eq!(read(&[], 10).unwrap(), Vec::new());
        let cut = &data[..data.len() - 1];
        assert_eq!(
            read(cut, u64::MAX).unwrap_err().kind(),
            std::io::ErrorKind::UnexpectedEof
        );
        let over = read(&data, data.len() as u64 - 1).unwrap_err();
        assert!(over.kind() != std::io::ErrorKind::Other, "{over}");
        let first = records[0].encoded_len() as u64;
        let past = read(&data, first).unwrap_err();
        assert_eq!(past.to_string(), "snapshot larger than the member's limit");
    }

    #[test]
    fn an_unknown_table_is_refused() {
        let mut data = encode(&[record(Table::Kv, "k", "v")]);
        data[0] = 9;
        assert_eq!(
            read_all(&data).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }
}
