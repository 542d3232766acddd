//! Multi-version concurrency control, in etcd's model.
//!
//! The store has one global revision, starting at 1. Every write
//! transaction that changes something creates the next revision; each key
//! keeps `create_revision` (when its current life began), `mod_revision`
//! (its last change) and `version` (puts since creation). Deleting a key
//! writes a tombstone; history stays readable at any revision that is not
//! compacted.
//!
//! - [`revision`]: revisions and their on-disk encoding (etcd's layout).
//! - [`key_index`]: one key's generations, with a worked example.
//! - [`index`]: the ordered in-memory index over all keys.
//! - [`key_history`]: each stored revision's index fields again, ordered by
//!   key, so one key's history is one short scan.
//! - [`loading`]: the index loaded from the key history while the member
//!   serves.
//! - [`store`]: reads, write transactions, compaction, rebuild at start-up.
//! - [`stored`]: a stored key-value's index fields, read without its value.

pub mod compactor;
pub mod index;
pub mod key_history;
pub mod key_index;
pub mod loading;
pub mod revision;
pub mod store;
pub mod stored;

pub use index::KeyRange;
pub use revision::Revision;
pub use store::{
    CompactionJob, LeaseSink, MvccError, MvccStore, Prev, PrevKvInterest, RangeOptions,
    RangeResult, StoredRange, WriteTxn, META_CURRENT_REV, META_FINISHED_COMPACT_REV,
    META_SCHEDULED_COMPACT_REV, RANGE_VALUES_UNDER_LOCK,
};
pub use stored::StoredKvs;
