//! etcd's `concurrency` recipes (sessions, mutexes, elections) as the Lock
//! and Election services run them: as a client of this member's own KV,
//! Lease and Watch services, in process, with the caller's credentials.
//!
//! etcd's `v3lock` and `v3election` servers call its Go client's
//! `concurrency` package over an in-process client, so every step is an
//! ordinary request: checked, authorized as the caller, forwarded to the
//! leader, answered with the usual errors. [`Recipes`] does the same over
//! the gRPC dispatcher (no socket, no gRPC metrics for the inner calls, as
//! etcd's in-process client counts none).
//!
//! The algorithm, for a lock or election `name` held by lease `L`:
//!
//! - a contender's key is `name/<L in hex>`, created by a Txn only if it
//!   does not exist (`create_revision == 0`); its creation revision is its
//!   place in the queue;
//! - the holder (the leader) is the key under `name/` with the lowest
//!   creation revision;
//! - a contender waits ([`Recipes::wait_deletes`]) for the newest key
//!   created before its own to be deleted (a watch from the revision it read
//!   at), then looks again: each waiter watches only its predecessor, so a
//!   release wakes one waiter, not all;
//! - a key goes when it is unlocked or resigned, or when its lease ends (the
//!   services never keep a lease alive: the caller does).
//!
//! Worked example: A locks `job` with lease `0x1a` at revision 5 (key
//! `job/1a`, nothing before it: held at once); B locks with lease `0x2b`
//! (key `job/2b` created at 6) and watches `job/1a` from revision 6; A's
//! Unlock deletes `job/1a` at 7; B's watch sees the DELETE, B finds no key
//! created before 6, reads its own key (still there) and holds the lock,
//! answering the header of that read (revision 7).

use std::future::Future;

use axum::extract::ConnectInfo;
use etcd_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcd_proto::etcdserverpb::kv_client::KvClient;
use etcd_proto::etcdserverpb::lease_client::LeaseClient;
use etcd_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcd_proto::etcdserverpb::request_op::Request as Op;
use etcd_proto::etcdserverpb::watch_client::WatchClient;
use etcd_proto::etcdserverpb::watch_request::RequestUnion;
use etcd_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, PutRequest, RangeRequest,
    RangeResponse, RequestOp, ResponseHeader, TxnRequest, TxnResponse, WatchCreateRequest,
    WatchRequest, WatchResponse,
};
use etcd_proto::keys::prefix_end;
use etcd_proto::mvccpb::event::EventType;
use etcd_proto::mvccpb::KeyValue;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status, Streaming};

use crate::errors::EtcdError;
use crate::server::core::caller::TOKEN_KEYS;
use crate::server::transport::grpc_dispatch::GrpcDispatch;
use crate::tls::ClientPeer;

/// TTL of the lease a Lock or Campaign without one is given, in seconds
/// (etcd's `defaultSessionTTL`). Nothing keeps it alive: it ends a minute
/// later, and the key with it.
pub const SESSION_TTL_SECS: i64 = 60;

/// The recipes for one call, acting as its caller (see the module docs).
#[derive(Clone)]
pub struct Recipes {
    grpc: GrpcDispatch,
    credentials: MetadataMap,
    peer: Option<ConnectInfo<ClientPeer>>,
}

impl Recipes {
    /// Recipes over `grpc` with the credentials of `req`: its token and its
    /// client certificate.
    pub fn for_caller<T>(grpc: &GrpcDispatch, req: &Request<T>) -> Self {
        // The metadata a caller's token comes in, carried onto every inner
        // request.
        let mut credentials = MetadataMap::new();
        for key in TOKEN_KEYS {
            for value in req.metadata().get_all(key) {
                credentials.append(key, value.clone());
            }
        }
        Self {
            grpc: grpc.clone(),
            credentials,
            peer: req.extensions().get::<ConnectInfo<ClientPeer>>().cloned(),
        }
    }

    /// `msg` as a request of the caller.
    fn request<T>(&self, msg: T) -> Request<T> {
        let mut req = Request::new(msg);
        *req.metadata_mut() = self.credentials.clone();
        if let Some(peer) = &self.peer {
            req.extensions_mut().insert(peer.clone());
        }
        req
    }

    /// etcd's session lease: `lease`, or a new lease of
    /// [`SESSION_TTL_SECS`] if it is 0 (not checked: a lease that does not
    /// exist fails the put that names it).
    pub async fn session_lease(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let grant = LeaseGrantRequest {
            ttl: SESSION_TTL_SECS,
            id: 0,
        };
        let mut client = LeaseClient::new(self.grpc.clone());
        let resp = client.lease_grant(self.request(grant)).await?;
        Ok(resp.into_inner().id)
    }

    /// A Txn.
    pub async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse, Status> {
        let mut client = KvClient::new(self.grpc.clone());
        Ok(client.txn(self.request(txn)).await?.into_inner())
    }

    /// A linearizable Range.
    pub async fn range(&self, range: RangeRequest) -> Result<RangeResponse, Status> {
        let mut client = KvClient::new(self.grpc.clone());
        Ok(client.range(self.request(range)).await?.into_inner())
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &[u8]) -> Result<DeleteRangeResponse, Status> {
        let mut client = KvClient::new(self.grpc.clone());
        let req = self.request(key_delete(key));
        Ok(client.delete_range(req).await?.into_inner())
    }

    /// The oldest key under `prefix` (etcd's `WithFirstCreate`), with the
    /// read's header.
    pub async fn first_created(
        &self,
        prefix: &[u8],
    ) -> Result<(ResponseHeader, Option<KeyValue>), Status> {
        let resp = self.range(first_created(prefix)).await?;
        Ok((resp.header.unwrap_or_default(), resp.kvs.into_iter().next()))
    }

    /// Waits until no key under `prefix` created at or before
    /// `max_create_rev` is left, watching the newest of them each time;
    /// answers the header of the read that found none.
    pub async fn wait_deletes(
        &self,
        prefix: &[u8],
        max_create_rev: i64,
    ) -> Result<ResponseHeader, Status> {
        loop {
            let newest = RangeRequest {
                max_create_revision: max_create_rev,
                ..top_created(prefix, SortOrder::Descend)
            };
            let resp = self.range(newest).await?;
            let header = resp.header.unwrap_or_default();
            let Some(kv) = resp.kvs.into_iter().next() else {
                return Ok(header);
            };
            self.wait_delete(kv.key, header.revision).await?;
        }
    }

    /// Waits for a DELETE of `key` at or after revision `rev`.
    async fn wait_delete(&self, key: Vec<u8>, rev: i64) -> Result<(), Status> {
        let mut watch = self.watch(key, Vec::new(), rev).await?;
        while let Some(resp) = watch.next().await? {
            if resp
                .events
                .iter()
                .any(|e| e.r#type == EventType::Delete as i32)
            {
                return Ok(());
            }
        }
        Err(EtcdError::LostWatcher.into())
    }

    /// A watch of `[key, range_end)` from revision `start`.
    pub async fn watch(
        &self,
        key: Vec<u8>,
        range_end: Vec<u8>,
        start: i64,
    ) -> Result<Watching, Status> {
        let (requests, rx) = mpsc::channel(1);
        let create = WatchCreateRequest {
            key,
            range_end,
            start_revision: start,
            ..Default::default()
        };
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create)),
        };
        // The one request fits the channel's room.
        let _ = requests.try_send(create);
        let mut client = WatchClient::new(self.grpc.clone());
        let responses = client
            .watch(self.request(ReceiverStream::new(rx)))
            .await?
            .into_inner();
        Ok(Watching {
            _requests: requests,
            responses,
        })
    }
}

/// One watch of [`Recipes::watch`]: its event answers, in order.
pub struct Watching {
    /// Kept open: the watch lives while its request stream does.
    _requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
}

impl Watching {
    /// The next answer with events (None once the watch ended). A watch
    /// canceled by the server (its start revision compacted) is an error,
    /// as the Go client's `WatchResponse.Err()`.
    pub async fn next(&mut self) -> Result<Option<WatchResponse>, Status> {
        while let Some(resp) = self.responses.message().await? {
            if resp.canceled {
                return Err(if resp.compact_revision != 0 {
                    EtcdError::Compacted.into()
                } else {
                    Status::unknown(resp.cancel_reason)
                });
            }
            if !resp.events.is_empty() {
                return Ok(Some(resp));
            }
        }
        Ok(None)
    }
}

/// A contender's key: `prefix` then the lease in hex, as Go's `%x` prints
/// an `int64` (a minus sign before a negative one).
pub fn contender_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    [prefix, hex.as_bytes()].concat()
}

/// The prefix of a lock's or an election's keys: its name and `/`.
pub fn keys_prefix(name: &[u8]) -> Vec<u8> {
    [name, b"/"].concat()
}

/// The oldest key under `prefix`.
pub fn first_created(prefix: &[u8]) -> RangeRequest {
    top_created(prefix, SortOrder::Ascend)
}

/// The first key under `prefix` by creation revision in `order`.
fn top_created(prefix: &[u8], order: SortOrder) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: order as i32,
        sort_target: SortTarget::Create as i32,
        ..Default::default()
    }
}

/// `key`'s creation revision is `rev` (0: the key does not exist).
pub fn created_at(key: &[u8], rev: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::CreateRevision(rev)),
    }
}

/// A put of `key` with `value`, held by `lease`.
pub fn put_op(key: &[u8], value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key: key.to_vec(),
            value,
            lease,
            ..Default::default()
        })),
    }
}

/// A read of `range` inside a Txn.
pub fn range_op(range: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestRange(range)),
    }
}

/// A read of `key` alone.
pub fn key_read(key: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    }
}

/// A read of `key` inside a Txn.
pub fn get_op(key: &[u8]) -> RequestOp {
    range_op(key_read(key))
}

/// A delete of `key` alone.
fn key_delete(key: &[u8]) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: key.to_vec(),
        ..Default::default()
    }
}

/// A delete of `key` inside a Txn.
pub fn delete_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestDeleteRange(key_delete(key))),
    }
}

/// The key-values the `i`th answer of a Txn read (none if it is not a
/// range answer).
pub fn txn_range_kvs(resp: &TxnResponse, i: usize) -> &[KeyValue] {
    use etcd_proto::etcdserverpb::response_op::Response as Answer;
    match resp.responses.get(i).and_then(|r| r.response.as_ref()) {
        Some(Answer::ResponseRange(r)) => &r.kvs,
        _ => &[],
    }
}

/// Runs `cleanup` (in its own task) if dropped before [`Self::disarm`]: a
/// waiter whose caller went away takes its key out of the queue, as etcd's
/// recipes do when their context is canceled.
pub struct OnDrop<F: Future<Output = ()> + Send + 'static> {
    cleanup: Option<F>,
}

impl<F: Future<Output = ()> + Send + 'static> OnDrop<F> {
    /// Runs `cleanup` on drop unless disarmed.
    pub fn new(cleanup: F) -> Self {
        Self {
            cleanup: Some(cleanup),
        }
    }

    /// Drops the cleanup without running it.
    pub fn disarm(mut self) {
        self.cleanup = None;
    }
}

impl<F: Future<Output = ()> + Send + 'static> Drop for OnDrop<F> {
    fn drop(&mut self) {
        let Some(cleanup) = self.cleanup.take() else {
            return;
        };
        // No runtime: the member is stopping, and the lease ends the key.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(cleanup);
        }
    }
}

/// Any error of an inner request as the Lock and Election services send
/// it: etcd's handlers return their client's errors as plain errors, which
/// grpc-go sends with code Unknown and the message.
pub fn as_plain_error(status: Status) -> Status {
    Status::unknown(status.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contender_keys_print_the_lease_as_go_does() {
        assert_eq!(contender_key(b"job/", 0x1a), b"job/1a");
        assert_eq!(
            contender_key(b"mylock/", 2324035697471529009),
            b"mylock/2040a227511e2031"
        );
        assert_eq!(contender_key(b"x/", -26), b"x/-1a");
        assert_eq!(contender_key(b"x/", i64::MIN), b"x/-8000000000000000");
    }

    #[test]
    fn an_empty_name_has_the_prefix_slash() {
        assert_eq!(keys_prefix(b""), b"/");
        assert_eq!(keys_prefix(b"job"), b"job/");
    }
}
