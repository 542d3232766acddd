//! Work a member does on its own, beside answering requests:
//! [`auto_compaction`] (the leader's `--auto-compaction-*` compactor),
//! [`corruption`] (HashKV compared across members, the CORRUPT alarm) and
//! [`versions`] (the cluster version the leader keeps, the storage format
//! and peer protocol every member follows, and Downgrade).

pub mod auto_compaction;
pub mod corruption;
pub mod versions;
