//! etcd's client services, one file each (etcd's `api/v3rpc`): [`kv`]
//! (its Range answers encoded as read, [`range_answer`]), [`watch`],
//! [`lease`], [`cluster`], [`maintenance`], [`auth`]; [`lock`] and
//! [`election`], etcd's recipes run as in-process clients of the others
//! ([`concurrency`]).

pub mod auth;
pub mod cluster;
pub mod concurrency;
pub mod election;
pub mod inbound;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod range_answer;
pub mod watch;
