//! `v3electionpb.Election`: etcd's leader election (Campaign, Proclaim,
//! Leader, Observe, Resign), run as the caller through this member's own
//! services ([`crate::server::v3rpc::concurrency`]).
//!
//! Candidates queue as lock contenders do: the leader is the oldest key
//! under `name/`. Campaign puts the candidate's key with its value (or
//! finds it, and proclaims the new value if it differs), waits for every
//! older key to go, and answers the leader key with the header of its
//! first Txn; a candidate that gives up while waiting resigns. Proclaim and
//! Resign act only while the key still has the creation revision the leader
//! key names (`election: not leader` for Proclaim; Resign then does
//! nothing, without an error). Leader reads the oldest key
//! (`election: no leader`). Observe sends the leader, each new value it
//! proclaims, and after it goes the next leader; with no leader it waits
//! for the first candidate. Every error is sent with code Unknown, as
//! etcd's election server sends it.

use std::pin::Pin;

use etcd_proto::etcdserverpb::{ResponseHeader, TxnRequest};
use etcd_proto::keys::prefix_end;
use etcd_proto::mvccpb::event::EventType;
use etcd_proto::mvccpb::KeyValue;
use etcd_proto::v3electionpb::election_server::Election;
use etcd_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::errors::EtcdError;
use crate::server::transport::grpc_dispatch::GrpcDispatch;
use crate::server::v3rpc::concurrency::{
    as_plain_error, contender_key, created_at, delete_op, get_op, keys_prefix, put_op,
    txn_range_kvs, OnDrop, Recipes,
};

/// Serves the Election API of one member over its KV, Lease and Watch
/// services.
pub struct ElectionService {
    grpc: GrpcDispatch,
}

impl ElectionService {
    /// A service whose recipes call the services of `grpc`.
    pub fn new(grpc: GrpcDispatch) -> Self {
        Self { grpc }
    }
}

/// etcd's `Election.Campaign`: the leader key and the header of the Txn
/// that queued the candidate.
async fn campaign(
    recipes: &Recipes,
    name: Vec<u8>,
    lease: i64,
    value: Vec<u8>,
) -> Result<(LeaderKey, ResponseHeader), Status> {
    let lease = recipes.session_lease(lease).await?;
    let prefix = keys_prefix(&name);
    let key = contender_key(&prefix, lease);
    let joined = recipes
        .txn(TxnRequest {
            compare: vec![created_at(&key, 0)],
            success: vec![put_op(&key, value.clone(), lease)],
            failure: vec![get_op(&key)],
        })
        .await?;
    let header = joined.header.unwrap_or_default();
    let mut leader = LeaderKey {
        name,
        key,
        rev: header.revision,
        lease,
    };
    if !joined.succeeded {
        if let Some(kv) = txn_range_kvs(&joined, 0).first() {
            leader.rev = kv.create_revision;
            if kv.value != value {
                if let Err(e) = proclaim(recipes, &leader, value).await {
                    let _ = resign(recipes, &leader).await;
                    return Err(e);
                }
            }
        }
    }
    let give_up = {
        let (recipes, leader) = (recipes.clone(), leader.clone());
        OnDrop::new(async move {
            let _ = resign(&recipes, &leader).await;
        })
    };
    let waited = recipes.wait_deletes(&prefix, leader.rev - 1).await;
    // An error that is not the caller leaving keeps the key (etcd's
    // recipe only resigns on cancellation).
    give_up.disarm();
    waited?;
    Ok((leader, header))
}

/// etcd's `Election.Proclaim`: puts `value` if `leader` still leads.
async fn proclaim(
    recipes: &Recipes,
    leader: &LeaderKey,
    value: Vec<u8>,
) -> Result<ResponseHeader, Status> {
    let resp = recipes
        .txn(TxnRequest {
            compare: vec![created_at(&leader.key, leader.rev)],
            success: vec![put_op(&leader.key, value, leader.lease)],
            failure: Vec::new(),
        })
        .await?;
    if !resp.succeeded {
        return Err(EtcdError::ElectionNotLeader.into());
    }
    Ok(resp.header.unwrap_or_default())
}

/// etcd's `Election.Resign`: deletes the key if `leader` still leads;
/// answers that Txn's header either way.
async fn resign(recipes: &Recipes, leader: &LeaderKey) -> Result<ResponseHeader, Status> {
    let resp = recipes
        .txn(TxnRequest {
            compare: vec![created_at(&leader.key, leader.rev)],
            success: vec![delete_op(&leader.key)],
            failure: Vec::new(),
        })
        .await?;
    Ok(resp.header.unwrap_or_default())
}

/// A leader key of a request, which must have one; the session lease etcd
/// resumes it with (a new one if it names none).
async fn resumed(recipes: &Recipes, leader: Option<LeaderKey>) -> Result<LeaderKey, Status> {
    let mut leader = leader.ok_or(EtcdError::MissingLeaderKey)?;
    leader.lease = recipes.session_lease(leader.lease).await?;
    Ok(leader)
}

/// The leader of the election under `prefix`, with the read's header.
async fn current_leader(
    recipes: &Recipes,
    prefix: &[u8],
) -> Result<(ResponseHeader, KeyValue), Status> {
    match recipes.first_created(prefix).await? {
        (header, Some(kv)) => Ok((header, kv)),
        (_, None) => Err(EtcdError::ElectionNoLeader.into()),
    }
}

/// The answers of an Observe, as tonic sends them.
pub type Observed = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

/// etcd's `Election.Observe` for `prefix`: the leader (or, with none, the
/// first candidate put), each value it puts, and when its key goes the
/// next leader. Ends, without an error, if a read or watch fails.
fn observe(recipes: Recipes, prefix: Vec<u8>) -> Observed {
    Box::pin(async_stream::stream! {
        loop {
            let Ok((header, first)) = recipes.first_created(&prefix).await else {
                break;
            };
            let (header, kv) = match first {
                Some(kv) => (header, kv),
                None => match first_put(&recipes, &prefix, header.revision).await {
                    Some(found) => found,
                    None => break,
                },
            };
            let (key, from) = (kv.key.clone(), header.revision + 1);
            yield Ok(LeaderResponse { header: Some(header), kv: Some(kv) });
            let Ok(mut watch) = recipes.watch(key, Vec::new(), from).await else {
                break;
            };
            let mut deleted = false;
            while !deleted {
                let Ok(Some(resp)) = watch.next().await else {
                    return;
                };
                for event in resp.events {
                    if event.r#type == EventType::Delete as i32 {
                        deleted = true;
                        break;
                    }
                    yield Ok(LeaderResponse { header: resp.header, kv: event.kv });
                }
            }
        }
    })
}

/// The first key put under `prefix` from revision `from`, with its watch
/// answer's header at the key's revision (None if the watch ends first).
async fn first_put(
    recipes: &Recipes,
    prefix: &[u8],
    from: i64,
) -> Option<(ResponseHeader, KeyValue)> {
    let mut watch = recipes
        .watch(prefix.to_vec(), prefix_end(prefix), from)
        .await
        .ok()?;
    loop {
        let resp = watch.next().await.ok()??;
        let put = resp
            .events
            .into_iter()
            .find(|e| e.r#type == EventType::Put as i32)
            .and_then(|e| e.kv);
        if let Some(kv) = put {
            let mut header = resp.header.unwrap_or_default();
            header.revision = kv.mod_revision;
            return Some((header, kv));
        }
    }
}

#[tonic::async_trait]
impl Election for ElectionService {
    type ObserveStream = Observed;

    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let recipes = Recipes::for_caller(&self.grpc, &req);
        let req = req.into_inner();
        let (leader, header) = campaign(&recipes, req.name, req.lease, req.value)
            .await
            .map_err(as_plain_error)?;
        Ok(Response::new(CampaignResponse {
            header: Some(header),
            leader: Some(leader),
        }))
    }

    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let recipes = Recipes::for_caller(&self.grpc, &req);
        let req = req.into_inner();
        let header = async {
            let leader = resumed(&recipes, req.leader).await?;
            proclaim(&recipes, &leader, req.value).await
        }
        .await
        .map_err(as_plain_error)?;
        Ok(Response::new(ProclaimResponse {
            header: Some(header),
        }))
    }

    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let recipes = Recipes::for_caller(&self.grpc, &req);
        let prefix = keys_prefix(&req.into_inner().name);
        let (header, kv) = current_leader(&recipes, &prefix)
            .await
            .map_err(as_plain_error)?;
        Ok(Response::new(LeaderResponse {
            header: Some(header),
            kv: Some(kv),
        }))
    }

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let recipes = Recipes::for_caller(&self.grpc, &req);
        let prefix = keys_prefix(&req.into_inner().name);
        Ok(Response::new(observe(recipes, prefix)))
    }

    async fn resign(
        &self,
        req: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let recipes = Recipes::for_caller(&self.grpc, &req);
        let leader = req.into_inner().leader;
        let header = async {
            let leader = resumed(&recipes, leader).await?;
            resign(&recipes, &leader).await
        }
        .await
        .map_err(as_plain_error)?;
        Ok(Response::new(ResignResponse {
            header: Some(header),
        }))
    }
}
