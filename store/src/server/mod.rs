//! The edge of a member (etcd's `etcdserver/api/v3rpc` over `etcdserver`):
//! every gRPC and HTTP service, over a shared [`core::Core`]. Services
//! check a request, call the core, and fill the answer; the domain modules
//! below (`engine`, `mvcc`, `kv`, `lease`, `watch`, `auth`, `raft`) never
//! import this module. Its rooms:
//!
//! - [`core`]: what every service needs: routing work to the leader and
//!   running it there, one typed method per proposal, the linearizable
//!   read barrier, the quota, who is calling, and the one conversion of
//!   internal errors to gRPC statuses.
//! - [`v3rpc`]: etcd's client services, one file each (etcd's
//!   `api/v3rpc`), and the Lock and Election recipes.
//! - [`to_leader`]: what a follower sends its leader: forwarded requests,
//!   batched on one lane per leader and carried by one stream.
//! - [`peer`]: the member-to-member service and leadership transfer.
//! - [`transport`]: serving connections: keepalive settings, the
//!   `:authority` repair, etcd's receive limit, gRPC dispatch and metrics.
//! - [`http`]: the HTTP endpoints (probes, `/version`, `/metrics`) and the
//!   JSON gateway.
//! - [`duties`]: work a member does on its own: auto-compaction,
//!   corruption checks, the cluster version.

pub mod core;
pub mod duties;
pub mod http;
pub mod peer;
pub mod to_leader;
pub mod transport;
pub mod v3rpc;
