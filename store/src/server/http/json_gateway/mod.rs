//! etcd's HTTP/JSON gateway on the client port: `POST /v3/kv/range` with
//! `{"key":"Zm9v"}` and the like, the API that etcd 3.5 serves with
//! grpc-gateway next to gRPC (used by curl scripts and JSON clients such as
//! Python's `etcd3gw`). Also under `/v3beta/`, which etcd 3.5 still serves.
//!
//! How it works, as in etcd: the gateway is a gRPC client of this member's
//! own gRPC services. Each JSON request is decoded ([`json`], checked by
//! [`schema`]) into the request message, sent through the same gRPC router
//! the listener serves, its layers included (in process: no socket, no
//! second implementation), and the answer or the gRPC status is written back as JSON ([`reply`]).
//! So everything the gRPC services do (auth, validation, size limits,
//! forwarding to the leader, error strings) holds for JSON clients too.
//!
//! Credentials: the `Authorization` header is passed on as `authorization`
//! metadata (which the services read like etcd's `token`), headers named
//! `Grpc-Metadata-<key>` as metadata `<key>`, and the client certificate of
//! a TLS connection as it is for gRPC.
//!
//! Streaming methods (`/v3/watch`, `/v3/lease/keepalive`,
//! `/v3/maintenance/snapshot`, `/v3/election/observe`) are in [`stream`].
//!
//! Bounds: a request body may hold at most [`max_body_bytes`] of JSON (the
//! base64 form of the largest message the gRPC services decode, plus
//! [`JSON_SLACK_BYTES`]); a watch or keep-alive stream buffers at most that
//! for one request.

mod go_syntax;
mod json;
mod reply;
mod schema;
mod stream;

use std::future::Future;

use axum::extract::{ConnectInfo, Request};
use axum::http::request::Parts;
use axum::response::Response;
use axum::routing::{any, post, MethodRouter};
use axum::Router;
use etcd_proto::etcdserverpb::auth_client::AuthClient;
use etcd_proto::etcdserverpb::cluster_client::ClusterClient;
use etcd_proto::etcdserverpb::kv_client::KvClient;
use etcd_proto::etcdserverpb::lease_client::LeaseClient;
use etcd_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use etcd_proto::etcdserverpb::watch_client::WatchClient;
use etcd_proto::v3electionpb::election_client::ElectionClient;
use etcd_proto::v3lockpb::lock_client::LockClient;
use serde::Serialize;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::Status;

use crate::server::transport::grpc_dispatch::GrpcServices;
use crate::tls::ClientPeer;
use stream::{Hold, RequestReader};

/// Path prefixes the gateway answers under (etcd 3.5 serves both).
const PREFIXES: [&str; 2] = ["/v3", "/v3beta"];
/// Room for JSON's field names and punctuation around a request's base64
/// payload, in bytes.
pub const JSON_SLACK_BYTES: usize = 1024 * 1024;
/// Headers passed on as gRPC metadata under the rest of their name.
const METADATA_HEADER_PREFIX: &str = "grpc-metadata-";

/// The most JSON one request may take, in bytes, when the gRPC services
/// decode messages of up to `max_message_bytes`: base64 makes 4 bytes of 3.
pub fn max_body_bytes(max_message_bytes: usize) -> usize {
    max_message_bytes.div_ceil(3) * 4 + JSON_SLACK_BYTES
}

/// The gateway's routes (`/v3/...`, `/v3beta/...`) over `grpc`, the
/// member's gRPC services as the client listener serves them (their layers
/// included, so gateway calls count in the gRPC metrics as etcd's do),
/// which decode messages of up to `max_message_bytes`.
pub fn routes(grpc: GrpcServices, max_message_bytes: usize) -> Router {
    let gw = Gateway {
        grpc,
        max_body_bytes: max_body_bytes(max_message_bytes),
    };
    let mut router = Router::new();
    for prefix in PREFIXES {
        for (path, endpoint) in gw.endpoints() {
            router = router.route(&format!("{prefix}{path}"), endpoint);
        }
        router = router.route(&format!("{prefix}/{{*rest}}"), any(unknown_path));
    }
    router
}

/// A path under the prefixes that names no method.
async fn unknown_path() -> Response {
    reply::not_found()
}

/// `POST` runs the handler; any other method is refused as the gateway
/// does (CORS preflights never get here: the client port answers them).
fn endpoint<H, T>(handler: H) -> MethodRouter
where
    H: axum::handler::Handler<T, ()>,
    T: 'static,
{
    post(handler).fallback(|| async { reply::method_not_allowed() })
}

/// A unary gateway method: `client`'s `method` over the gateway's gRPC.
macro_rules! unary {
    ($gw:expr, $client:ident, $method:ident) => {{
        let gw = $gw.clone();
        endpoint(move |req: Request| async move {
            gw.unary(
                req,
                |grpc, r| async move { $client::new(grpc).$method(r).await },
            )
            .await
        })
    }};
}

/// A server-streaming gateway method: `client`'s `method` over the
/// gateway's gRPC, its answers written as they come.
macro_rules! server_stream {
    ($gw:expr, $client:ident, $method:ident) => {{
        let gw = $gw.clone();
        endpoint(move |req: Request| async move {
            gw.server_stream(
                req,
                |grpc, r| async move { $client::new(grpc).$method(r).await },
            )
            .await
        })
    }};
}

#[derive(Clone)]
struct Gateway {
    grpc: GrpcServices,
    max_body_bytes: usize,
}

impl Gateway {
    /// Every method, by path under a prefix (paths as in etcd's
    /// `rpc.proto` HTTP options, the lease aliases under `/kv/` included).
    fn endpoints(&self) -> Vec<(&'static str, MethodRouter)> {
        let mut all = self.kv_endpoints();
        all.extend(self.lease_endpoints());
        all.extend(self.cluster_endpoints());
        all.extend(self.maintenance_endpoints());
        all.extend(self.auth_endpoints());
        all.extend(self.lock_endpoints());
        all.extend(self.election_endpoints());
        all
    }

    fn lock_endpoints(&self) -> Vec<(&'static str, MethodRouter)> {
        vec![
            ("/lock/lock", unary!(self, LockClient, lock)),
            ("/lock/unlock", unary!(self, LockClient, unlock)),
        ]
    }

    fn election_endpoints(&self) -> Vec<(&'static str, MethodRouter)> {
        vec![
            ("/election/campaign", unary!(self, ElectionClient, campaign)),
            ("/election/proclaim", unary!(self, ElectionClient, proclaim)),
            ("/election/leader", unary!(self, ElectionClient, leader)),
            ("/election/resign", unary!(self, ElectionClient, resign)),
            (
                "/election/observe",
                server_stream!(self, ElectionClient, observe),
            ),
        ]
    }

    fn kv_endpoints(&self) -> Vec<(&'static str, MethodRouter)> {
        let gw = self.clone();
        vec![
            ("/kv/range", unary!(self, KvClient, range)),
            ("/kv/put", unary!(self, KvClient, put)),
            ("/kv/deleterange", unary!(self, KvClient, delete_range)),
            ("/kv/txn", unary!(self, KvClient, txn)),
            ("/kv/compaction", unary!(self, KvClient, compact)),
            ("/watch", endpoint(move |req: Request| gw.watch(req))),
        ]
    }

    fn lease_endpoints(&self) -> Vec<(&'static str, MethodRouter)> {
        let gw = self.clone();
        vec![
            ("/lease/grant", unary!(self, LeaseClient, lease_grant)),
            ("/lease/revoke", unary!(self, LeaseClient, lease_revoke)),
            ("/kv/lease/revoke", unary!(self, LeaseClient, lease_revoke)),
            (
                "/lease/timetolive",
                unary!(self, LeaseClient, lease_time_to_live),
            ),
            (
                "/kv/lease/timetolive",
                unary!(self, LeaseClient, lease_time_to_live),
            ),
            ("/lease/leases", unary!(self, LeaseClient, lease_leases)),
            ("/kv/lease/leases", unary!(self, LeaseClient, lease_leases)),
            (
                "/lease/keepalive",
                endpoint(move |req: Request| gw.keep_alive(req)),
            ),
        ]
    }

    fn cluster_endpoints(&self) -> Vec<(&'static str, MethodRouter)> {
        vec![
            (
                "/cluster/member/add",
                unary!(self, ClusterClient, member_add),
            ),
            (
                "/cluster/member/remove",
                unary!(self, ClusterClient, member_remove),
            ),
            (
                "/cluster/member/update",
                unary!(self, ClusterClient, member_update),
            ),
            (
                "/cluster/member/list",
                unary!(self, ClusterClient, member_list),
            ),
            (
                "/cluster/member/promote",
                unary!(self, ClusterClient, member_promote),
            ),
        ]
    }

    fn maintenance_endpoints(&self) -> Vec<(&'static str, MethodRouter)> {
        vec![
            ("/maintenance/alarm", unary!(self, MaintenanceClient, alarm)),
            (
                "/maintenance/status",
                unary!(self, MaintenanceClient, status),
            ),
            (
                "/maintenance/defragment",
                unary!(self, MaintenanceClient, defragment),
            ),
            // etcd maps Hash and HashKV to this one path; Hash answers it.
            ("/maintenance/hash", unary!(self, MaintenanceClient, hash)),
            (
                "/maintenance/transfer-leadership",
                unary!(self, MaintenanceClient, move_leader),
            ),
            (
                "/maintenance/downgrade",
                unary!(self, MaintenanceClient, downgrade),
            ),
            (
                "/maintenance/snapshot",
                server_stream!(self, MaintenanceClient, snapshot),
            ),
        ]
    }

    fn auth_endpoints(&self) -> Vec<(&'static str, MethodRouter)> {
        vec![
            ("/auth/enable", unary!(self, AuthClient, auth_enable)),
            ("/auth/disable", unary!(self, AuthClient, auth_disable)),
            ("/auth/status", unary!(self, AuthClient, auth_status)),
            ("/auth/authenticate", unary!(self, AuthClient, authenticate)),
            ("/auth/user/add", unary!(self, AuthClient, user_add)),
            ("/auth/user/get", unary!(self, AuthClient, user_get)),
            ("/auth/user/list", unary!(self, AuthClient, user_list)),
            ("/auth/user/delete", unary!(self, AuthClient, user_delete)),
            (
                "/auth/user/changepw",
                unary!(self, AuthClient, user_change_password),
            ),
            (
                "/auth/user/grant",
                unary!(self, AuthClient, user_grant_role),
            ),
            (
                "/auth/user/revoke",
                unary!(self, AuthClient, user_revoke_role),
            ),
            ("/auth/role/add", unary!(self, AuthClient, role_add)),
            ("/auth/role/get", unary!(self, AuthClient, role_get)),
            ("/auth/role/list", unary!(self, AuthClient, role_list)),
            ("/auth/role/delete", unary!(self, AuthClient, role_delete)),
            (
                "/auth/role/grant",
                unary!(self, AuthClient, role_grant_permission),
            ),
            (
                "/auth/role/revoke",
                unary!(self, AuthClient, role_revoke_permission),
            ),
        ]
    }

    /// Decodes the whole body as one request, makes the call, answers.
    async fn unary<Req, Resp, F, Fut>(self, req: Request, call: F) -> Response
    where
        Req: json::Request,
        Resp: Serialize,
        F: FnOnce(GrpcServices, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let (parts, msg) = match self.read_one::<Req>(req).await {
            Ok(read) => read,
            Err(status) => return reply::error(&status),
        };
        match call(self.grpc.clone(), grpc_request(&parts, msg)).await {
            Ok(resp) => reply::message(resp.get_ref()),
            Err(status) => reply::error(&status),
        }
    }

    /// The request head and the one request the body holds.
    async fn read_one<Req>(&self, req: Request) -> Result<(Parts, Req), Status>
    where
        Req: json::Request,
    {
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, self.max_body_bytes)
            .await
            .map_err(|_| body_too_large(self.max_body_bytes))?;
        let msg =
            json::decode::<Req>(&bytes).map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok((parts, msg))
    }

    /// One request decoded from the whole body, a stream of answers
    /// (`Maintenance.Snapshot`, `Election.Observe`).
    async fn server_stream<Req, Resp, F, Fut>(self, req: Request, call: F) -> Response
    where
        Req: json::Request,
        Resp: Serialize + Send + 'static,
        F: FnOnce(GrpcServices, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<tonic::Streaming<Resp>>, Status>>,
    {
        let (parts, msg) = match self.read_one::<Req>(req).await {
            Ok(read) => read,
            Err(status) => return reply::error(&status),
        };
        let call = call(self.grpc.clone(), grpc_request(&parts, msg)).await;
        stream::respond(call, None).await
    }

    /// `Watch.Watch`: a stream of requests, a stream of answers; the watch
    /// lives on after the body ends, until the client goes away.
    async fn watch(self, req: Request) -> Response {
        let (parts, first, reader) = match self.read_first(req).await {
            Ok(read) => read,
            Err(resp) => return resp,
        };
        let (hold, gone) = Hold::new();
        let requests = stream::requests(first, reader, Some(gone));
        let mut client = WatchClient::new(self.grpc.clone());
        let call = client.watch(grpc_request(&parts, requests)).await;
        stream::respond(call, Some(hold)).await
    }

    /// `Lease.LeaseKeepAlive`: one answer per request in the body.
    async fn keep_alive(self, req: Request) -> Response {
        let (parts, first, reader) = match self.read_first(req).await {
            Ok(read) => read,
            Err(resp) => return resp,
        };
        let requests = stream::requests(first, reader, None);
        let mut client = LeaseClient::new(self.grpc.clone());
        let call = client
            .lease_keep_alive(grpc_request(&parts, requests))
            .await;
        stream::respond(call, None).await
    }

    /// The request head, the first request of a streaming body and the
    /// reader of the rest. Like the gateway, the first request is read
    /// before the call is made: if it does not decode, the answer is that
    /// error (code `Unknown`).
    async fn read_first<Req>(
        &self,
        req: Request,
    ) -> Result<(Parts, Option<Req>, RequestReader), Response>
    where
        Req: json::Request,
    {
        let (parts, body) = req.into_parts();
        let mut reader = RequestReader::new(body, self.max_body_bytes);
        match reader.next::<Req>().await {
            Ok(first) => Ok((parts, first, reader)),
            Err(e) => Err(reply::error(&Status::unknown(e.to_string()))),
        }
    }
}

/// Status for a body over the bound.
fn body_too_large(max: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc-gateway: request body larger than max ({max} bytes)"
    ))
}

/// `msg` as a gRPC request carrying the HTTP request's credentials.
fn grpc_request<T>(parts: &Parts, msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    for (name, value) in &parts.headers {
        let key = if name == axum::http::header::AUTHORIZATION {
            Some(name.as_str())
        } else {
            name.as_str().strip_prefix(METADATA_HEADER_PREFIX)
        };
        let Some(key) = key else { continue };
        let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_bytes()),
        ) else {
            continue;
        };
        req.metadata_mut().append(key, value);
    }
    if let Some(peer) = parts.extensions.get::<ConnectInfo<ClientPeer>>() {
        req.extensions_mut().insert(peer.clone());
    }
    req
}
