//! Serving connections: [`conn`] (client connections with the gRPC
//! keepalive settings and stream limit), [`authority_repair`] (repairs the
//! invalid HTTP/2 `:authority` some etcd clients send), [`frame_limit`]
//! (etcd's receive limit on each message's length prefix, and a unary
//! call's early start), [`grpc_dispatch`] (gRPC calls to their service by
//! name), [`grpc_metrics`] (etcd's `grpc_server_*` metrics) and
//! [`learner_guard`] (what a learner refuses).

pub mod authority_repair;
pub mod conn;
pub mod frame_limit;
pub mod grpc_dispatch;
pub mod grpc_metrics;
pub mod learner_guard;
