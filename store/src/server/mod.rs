//! The client-facing side of a member: the etcd v3 gRPC services and the
//! HTTP endpoints, over a shared [`core::Core`].

pub mod caller;
pub mod cluster;
pub mod core;
pub mod http;
pub mod kv;
pub mod maintenance;
pub mod transfer;
