//! The edge of a member (etcd's `etcdserver/api/v3rpc` over `etcdserver`):
//! every gRPC and HTTP service, over a shared [`core::Core`]. Services
//! check a request, call the core, and fill the answer; the domain modules
//! below (`engine`, `mvcc`, `kv`, `lease`, `watch`, `auth`, `raft`) never
//! import this module.
//!
//! - [`core`]: routing work to the leader and running it there;
//!   [`propose`]: one typed method per command kind; [`read_index`]: the
//!   linearizable read barrier; [`forward`]: what followers send the leader,
//!   [`forward_batch`]: batched on the way;
//!   [`caller`]: who is calling (tokens, client certificates);
//!   [`transfer`]: leadership transfer (MoveLeader).
//! - client services, one file each: [`kv`] (its Range answers encoded
//!   as read, [`range_answer`]), [`watch`], [`lease`],
//!   [`cluster`], [`maintenance`], [`auth`]; [`lock`] and [`election`],
//!   etcd's recipes run as a client of the others ([`concurrency`]); and
//!   [`http`] (`/health`,
//!   `/version`); [`conn`]: serving client connections with the gRPC
//!   keepalive settings, through [`authority`] (repairs the invalid
//!   `:authority` some etcd clients send) and `batched_writes` (one write
//!   for many answers, a crate of its own: the benchmark's load
//!   connections use it too).
//! - [`json_gateway`]: etcd's HTTP/JSON gateway (`POST /v3/kv/range`, ...),
//!   a client of the gRPC services above.
//! - [`peer`]: the member-to-member service (Raft messages, forwarded
//!   requests, ReadIndex, leadership transfer), apart from the client ones.
//! - [`status`]: the one conversion of internal errors to gRPC statuses.

pub mod auth;
pub mod authority;
pub mod auto_compaction;
pub mod caller;
pub mod cluster;
pub mod concurrency;
pub mod conn;
pub mod core;
pub mod corruption;
pub mod election;
#[cfg(test)]
mod fake_leader;
pub mod forward;
pub mod forward_batch;
pub mod forward_stream;
pub mod frame_limit;
pub mod grpc_dispatch;
pub mod grpc_metrics;
pub mod http;
pub mod json_gateway;
pub mod keepalive_batch;
pub mod kv;
pub mod leader_lane;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod peer;
pub mod propose;
pub mod quota;
pub mod range_answer;
pub mod read_index;
pub mod read_index_batch;
pub mod status;
pub mod transfer;
pub mod versions;
pub mod watch;
