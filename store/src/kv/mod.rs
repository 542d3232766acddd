//! etcd's KV semantics on top of [`crate::mvcc`]: Range (limits, sorting,
//! revision filters), Put (prev_kv, ignore_value, ignore_lease), DeleteRange,
//! Txn (compares, nested transactions) and request validation, each as etcd
//! 3.5's `server/etcdserver/apply.go` and `api/v3rpc/key.go` define them.
//!
//! Reads run against any [`ReadView`]: the store itself (the read path) or
//! an open write transaction (reads inside a Txn see its earlier writes).

pub mod intervals;
pub mod range;
pub mod txn;
pub mod validate;

use crate::engine::EngineError;
use crate::errors::EtcdError;
use crate::mvcc::{KeyRange, MvccError, MvccStore, RangeOptions, RangeResult, WriteTxn};

/// Answers whether a lease exists (Put with a lease must name one).
pub trait LeaseLookup {
    /// True if lease `id` is currently granted.
    fn lease_exists(&self, id: i64) -> bool;
}

/// A lease table with no leases: every lease id is unknown.
pub struct NoLeases;

impl LeaseLookup for NoLeases {
    fn lease_exists(&self, _id: i64) -> bool {
        false
    }
}

/// Failure of a KV operation: a client error, or a storage failure.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// An error etcd reports to the client.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// The engine failed: fatal for the member.
    #[error(transparent)]
    Storage(#[from] EngineError),
}

impl From<MvccError> for KvError {
    fn from(e: MvccError) -> Self {
        match e {
            MvccError::Compacted => KvError::Etcd(EtcdError::Compacted),
            MvccError::FutureRev => KvError::Etcd(EtcdError::FutureRev),
            MvccError::Engine(e) => KvError::Storage(e),
        }
    }
}

/// Something ranges can be read from.
pub trait ReadView {
    /// Reads `range` with `opts` (see [`MvccStore::range`]).
    fn range(&self, range: &KeyRange, opts: RangeOptions) -> Result<RangeResult, MvccError>;
}

impl ReadView for MvccStore {
    fn range(&self, range: &KeyRange, opts: RangeOptions) -> Result<RangeResult, MvccError> {
        MvccStore::range(self, range, opts)
    }
}

impl ReadView for WriteTxn<'_> {
    fn range(&self, range: &KeyRange, opts: RangeOptions) -> Result<RangeResult, MvccError> {
        WriteTxn::range(self, range, opts)
    }
}
