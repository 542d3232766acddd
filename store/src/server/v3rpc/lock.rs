//! `v3lockpb.Lock`: etcd's distributed locks (Lock, Unlock), run as the
//! caller through this member's own services ([`crate::server::v3rpc::concurrency`]).
//!
//! Lock(name, lease) puts `name/<lease in hex>` if it is not there, and
//! holds the lock at once if no key under `name/` is older; otherwise it
//! waits for every older key to go, then checks its own key is still there
//! (`mutex: session is expired` if its lease ended meanwhile). The answer's
//! header is the Txn's when held at once, else the final read's. A caller
//! that gives up while waiting has its key deleted. Unlock deletes the key.
//! Every error is sent with code Unknown, as etcd's lock server sends it.

use etcd_proto::etcdserverpb::{ResponseHeader, TxnRequest};
use etcd_proto::v3lockpb::lock_server::Lock;
use etcd_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tonic::{Request, Response, Status};

use crate::errors::EtcdError;
use crate::server::transport::grpc_dispatch::GrpcDispatch;
use crate::server::v3rpc::concurrency::{
    as_plain_error, contender_key, created_at, first_created, get_op, key_read, keys_prefix,
    put_op, range_op, txn_range_kvs, OnDrop, Recipes,
};

/// Serves the Lock API of one member over its KV, Lease and Watch services.
pub struct LockService {
    grpc: GrpcDispatch,
}

impl LockService {
    /// A service whose recipes call the services of `grpc`.
    pub fn new(grpc: GrpcDispatch) -> Self {
        Self { grpc }
    }
}

/// etcd's `Mutex.Lock` for `name` held by `lease`: the key and the header
/// of the read that found the lock held.
async fn lock(
    recipes: &Recipes,
    name: &[u8],
    lease: i64,
) -> Result<(Vec<u8>, ResponseHeader), Status> {
    let lease = recipes.session_lease(lease).await?;
    let prefix = keys_prefix(name);
    let key = contender_key(&prefix, lease);
    // Joins the queue (or finds this lease already in it) and reads its
    // head, in one Txn.
    let joined = recipes
        .txn(TxnRequest {
            compare: vec![created_at(&key, 0)],
            success: vec![
                put_op(&key, Vec::new(), lease),
                range_op(first_created(&prefix)),
            ],
            failure: vec![get_op(&key), range_op(first_created(&prefix))],
        })
        .await?;
    let header = joined.header.unwrap_or_default();
    let my_rev = if joined.succeeded {
        header.revision
    } else {
        txn_range_kvs(&joined, 0)
            .first()
            .map_or(header.revision, |kv| kv.create_revision)
    };
    let head = txn_range_kvs(&joined, 1).first();
    if head.is_none_or(|kv| kv.create_revision == my_rev) {
        return Ok((key, header));
    }
    let leave = {
        let (recipes, key) = (recipes.clone(), key.clone());
        OnDrop::new(async move {
            let _ = recipes.delete(&key).await;
        })
    };
    recipes.wait_deletes(&prefix, my_rev - 1).await?;
    let mine = recipes.range(key_read(&key)).await?;
    leave.disarm();
    if mine.kvs.is_empty() {
        return Err(EtcdError::SessionExpired.into());
    }
    Ok((key, mine.header.unwrap_or_default()))
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let recipes = Recipes::for_caller(&self.grpc, &req);
        let req = req.into_inner();
        let (key, header) = lock(&recipes, &req.name, req.lease)
            .await
            .map_err(as_plain_error)?;
        Ok(Response::new(LockResponse {
            header: Some(header),
            key,
        }))
    }

    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let recipes = Recipes::for_caller(&self.grpc, &req);
        let resp = recipes
            .delete(&req.into_inner().key)
            .await
            .map_err(as_plain_error)?;
        Ok(Response::new(UnlockResponse {
            header: resp.header,
        }))
    }
}
