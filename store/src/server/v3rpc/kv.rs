//! `etcdserverpb.KV`: Range, Put, DeleteRange, Txn, Compact.
//!
//! [`KvRoutes`] serves the service: its Range method answers a
//! [`RangeAnswer`] (key-values as stored where it can, see
//! [`crate::server::v3rpc::range_answer`]), every other method goes to tonic's generated
//! server.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use etcd_proto::etcdserverpb::kv_server::{Kv, KvServer};
use etcd_proto::etcdserverpb::request_op::Request as Op;
use etcd_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, TxnRequest, TxnResponse,
};
use futures::future::BoxFuture;
use prost::Message;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use crate::errors::{grpc_message_too_large, EtcdError};
use crate::server::core::Core;
use crate::server::v3rpc::range_answer::{self, RangeAnswer, RangeAnswerCodec};

use crate::auth::{self, Access, AuthInfo};
use crate::kv::{self, validate};
use crate::limits::{GRPC_OVERHEAD_BYTES, MAX_SEND_BYTES};
use crate::mvcc::KeyRange;

/// How a range is answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ranged {
    /// One RangeResponse.
    Once,
    /// A RangeStream.
    Stream,
}

/// Serves the KV API of one member.
pub struct KvService {
    core: Arc<Core>,
}

impl KvService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// etcd's proposal limit (callers have checked the transport limit,
    /// [`check_transport_size`], on arrival).
    fn check_size(&self, msg: &impl Message) -> Result<(), Status> {
        if msg.encoded_len() > self.core.config.max_request_bytes {
            return Err(EtcdError::RequestTooLarge.into());
        }
        Ok(())
    }

    /// What a Range and a RangeStream do before reading: the caller, the
    /// transport limit, etcd's checks (a stream's own too), the read
    /// barrier unless serializable, the caller's read permission.
    async fn admit_range(
        &self,
        req: Request<RangeRequest>,
        how: Ranged,
    ) -> Result<RangeRequest, Status> {
        // A learner serves serializable Ranges only, refused before
        // anything else (crate::server::transport::learner_guard).
        if !req.get_ref().serializable && self.core.is_learner() {
            return Err(EtcdError::NotSupportedForLearner.into());
        }
        let by = self.core.caller(&req).await?;
        let req = req.into_inner();
        check_transport_size(&req, self.core.config.max_request_bytes)?;
        validate::check_range(&req)?;
        if how == Ranged::Stream {
            kv::range::check_stream(&req)?;
        }
        if !req.serializable {
            self.core.read_barrier().await?;
        }
        self.core
            .auth
            .state()
            .check_keys(&by, Access::Read, &req.key, &req.range_end)?;
        if self.core.mvcc.is_loading() {
            let range = KeyRange::new(&req.key, &req.range_end);
            self.core.mvcc.loaded_for(&range).await;
        }
        Ok(req)
    }

    /// A Range's answer: the key-values as stored for a request
    /// [`kv::range::answers_as_stored`], else decoded.
    async fn range_answer(&self, req: Request<RangeRequest>) -> Result<RangeAnswer, Status> {
        let req = self.admit_range(req, Ranged::Once).await?;
        let started = Instant::now();
        if kv::range::answers_as_stored(&req) {
            let mut resp = kv::range::range_stored(&self.core.mvcc, &req).inspect_err(|_| {
                crate::metrics::global()
                    .txn
                    .observe_range(false, started.elapsed().as_secs_f64())
            })?;
            resp.header = self.core.header(resp.header.revision);
            // The range duration is observed once the values are read.
            return range_answer::check_send_limit(RangeAnswer::Stored { resp, started })
                .await
                .inspect_err(|_| {
                    crate::metrics::global()
                        .txn
                        .observe_range(false, started.elapsed().as_secs_f64())
                });
        }
        let answer = RangeAnswer::Decoded(self.decoded_range(&req, started)?);
        range_answer::check_send_limit(answer).await
    }

    /// `req` read with its key-values decoded, the range duration observed
    /// from `started` and the header filled.
    fn decoded_range(&self, req: &RangeRequest, started: Instant) -> Result<RangeResponse, Status> {
        let result = kv::range::range(self.core.mvcc.as_ref(), req);
        crate::metrics::global()
            .txn
            .observe_range(result.is_ok(), started.elapsed().as_secs_f64());
        let mut resp = result?;
        self.core.fill(&mut resp.header);
        Ok(resp)
    }

    async fn read_only_txn(&self, by: &AuthInfo, req: &TxnRequest) -> Result<TxnResponse, Status> {
        if !is_txn_serializable(req) {
            self.core.read_barrier().await?;
        }
        auth::check_txn(&self.core.auth.state(), by, req)?;
        let view = kv::txn::AtRevision::now(&self.core.mvcc);
        Ok(kv::txn::read_only(&view, req)?)
    }
}

/// grpc-go's receive limit as etcd configures it. Our transport accepts up
/// to [`crate::limits::TRANSPORT_MAX_DECODE_BYTES`] so that we can answer
/// with grpc-go's exact text here.
pub fn check_transport_size(msg: &impl Message, max_request_bytes: usize) -> Result<(), Status> {
    let limit = max_request_bytes + GRPC_OVERHEAD_BYTES;
    let len = msg.encoded_len();
    if len > limit {
        return Err(grpc_message_too_large(len, limit));
    }
    Ok(())
}

/// etcd's `kvOverhead`: bytes charged per key-value beyond key and value.
pub const KV_OVERHEAD_BYTES: u64 = 256;

/// etcd's `costTxn`: the puts of the larger branch.
fn txn_cost(req: &TxnRequest) -> u64 {
    let branch = |ops: &[etcd_proto::etcdserverpb::RequestOp]| -> u64 {
        ops.iter()
            .map(|op| match &op.request {
                Some(Op::RequestPut(p)) => KV_OVERHEAD_BYTES + (p.key.len() + p.value.len()) as u64,
                Some(Op::RequestTxn(t)) => txn_cost(t),
                _ => 0,
            })
            .sum()
    };
    branch(&req.success).max(branch(&req.failure))
}

/// True if no operation on any path writes.
fn is_txn_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .all(|op| match &op.request {
            Some(Op::RequestRange(_)) | None => true,
            Some(Op::RequestTxn(t)) => is_txn_read_only(t),
            Some(Op::RequestPut(_)) | Some(Op::RequestDeleteRange(_)) => false,
        })
}

/// True if every range in the txn asks for serializable reads.
fn is_txn_serializable(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .all(|op| match &op.request {
            Some(Op::RequestRange(r)) => r.serializable,
            Some(Op::RequestTxn(t)) => is_txn_serializable(t),
            _ => true,
        })
}

/// The chunks of a RangeStream answer, as tonic sends them.
pub type RangeStreamChunks =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<RangeStreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Kv for KvService {
    type RangeStreamStream = RangeStreamChunks;

    /// etcd 3.7's RangeStream: checked, read barrier and permissions as a
    /// Range, then one chunk read per message the transport takes
    /// ([`kv::range::RangeStream`]): a chunk is read only when the last
    /// one was taken, so a slow reader holds the server to a chunk or two.
    async fn range_stream(
        &self,
        req: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let req = self.admit_range(req, Ranged::Stream).await?;
        let core = self.core.clone();
        let mut chunks = kv::range::RangeStream::new(req, core.config.max_request_bytes);
        let stream = async_stream::stream! {
            loop {
                let started = std::time::Instant::now();
                // None once the last chunk went (no read made, none counted).
                let Some(chunk) = chunks.next_chunk(core.mvcc.as_ref()).transpose() else {
                    break;
                };
                crate::metrics::global()
                    .txn
                    .observe_range(chunk.is_ok(), started.elapsed().as_secs_f64());
                match chunk {
                    Ok(mut resp) => {
                        if resp.header.is_some() {
                            core.fill(&mut resp.header);
                        }
                        yield Ok(RangeStreamResponse { range_response: Some(resp) });
                    }
                    Err(e) => {
                        yield Err(Status::from(e));
                        break;
                    }
                }
            }
        };
        Ok(Response::new(Box::pin(stream)))
    }

    /// Range through tonic's generated server (a client of
    /// [`KvRoutes`] never reaches it): the decoded answer.
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let req = self.admit_range(req, Ranged::Once).await?;
        self.decoded_range(&req, Instant::now()).map(Response::new)
    }

    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let by = self.core.caller(&req).await?;
        let req = req.into_inner();
        check_transport_size(&req, self.core.config.max_request_bytes)?;
        validate::check_put(&req)?;
        self.check_size(&req)?;
        self.core
            .check_quota(KV_OVERHEAD_BYTES + (req.key.len() + req.value.len()) as u64)
            .await?;
        let mut resp = self.core.put(by, req).await?;
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let by = self.core.caller(&req).await?;
        let req = req.into_inner();
        check_transport_size(&req, self.core.config.max_request_bytes)?;
        validate::check_delete(&req)?;
        self.check_size(&req)?;
        let mut resp = self.core.delete_range(by, req).await?;
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let by = self.core.caller(&req).await?;
        let req = req.into_inner();
        check_transport_size(&req, self.core.config.max_request_bytes)?;
        validate::check_txn(&req, self.core.config.max_txn_ops)?;
        let mut resp = if is_txn_read_only(&req) {
            self.read_only_txn(&by, &req).await?
        } else {
            self.check_size(&req)?;
            self.core.check_quota(txn_cost(&req)).await?;
            self.core.txn(by, req).await?
        };
        self.core.fill(&mut resp.header);
        // Built whole, as etcd builds it; a Range is measured before it is
        // built (range_answer::check_send_limit).
        range_answer::within_send_limit(resp.encoded_len(), MAX_SEND_BYTES)?;
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let by = self.core.caller(&req).await?;
        let req = req.into_inner();
        let (revision, physical) = (req.revision, req.physical);
        let mut resp = self.core.compact(by, req).await?;
        if physical {
            let mut finished = self.core.mvcc.finished_compaction();
            finished
                .wait_for(|f| *f >= revision)
                .await
                .map_err(|_| Status::from(EtcdError::Stopped))?;
        }
        self.core.fill(&mut resp.header);
        Ok(Response::new(resp))
    }
}

/// The path of the Range method, which [`KvRoutes`] answers itself.
const RANGE_PATH: &str = "/etcdserverpb.KV/Range";

/// The KV service as a listener serves it (see the module docs), with
/// tonic's message size limits on the Range method too.
#[derive(Clone)]
pub struct KvRoutes {
    service: Arc<KvService>,
    generated: KvServer<KvService>,
    max_decoding_bytes: usize,
    max_encoding_bytes: usize,
}

impl KvRoutes {
    /// The KV service over `core`, taking requests up to
    /// `max_decoding_bytes` and answers up to `max_encoding_bytes`.
    pub fn new(core: Arc<Core>, max_decoding_bytes: usize, max_encoding_bytes: usize) -> Self {
        let service = Arc::new(KvService::new(core));
        let generated = KvServer::from_arc(service.clone())
            .max_decoding_message_size(max_decoding_bytes)
            .max_encoding_message_size(max_encoding_bytes);
        Self {
            service,
            generated,
            max_decoding_bytes,
            max_encoding_bytes,
        }
    }
}

impl NamedService for KvRoutes {
    const NAME: &'static str = <KvServer<KvService> as NamedService>::NAME;
}

impl tower::Service<http::Request<tonic::body::Body>> for KvRoutes {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // tonic's generated servers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != RANGE_PATH {
            return Box::pin(self.generated.call(req));
        }
        let method = RangeMethod(self.service.clone());
        let mut grpc = Grpc::new(RangeAnswerCodec).apply_max_message_size_config(
            Some(self.max_decoding_bytes),
            Some(self.max_encoding_bytes),
        );
        Box::pin(async move { Ok(grpc.unary(method, req).await) })
    }
}

/// The Range method, answering a [`RangeAnswer`].
struct RangeMethod(Arc<KvService>);

impl UnaryService<RangeRequest> for RangeMethod {
    type Response = RangeAnswer;
    type Future = BoxFuture<'static, Result<Response<RangeAnswer>, Status>>;

    fn call(&mut self, req: Request<RangeRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.range_answer(req).await.map(Response::new) })
    }
}

#[cfg(test)]
mod tests {
    use etcd_proto::etcdserverpb::response_op::Response as OpAnswer;
    use etcd_proto::etcdserverpb::ResponseOp;
    use etcd_proto::mvccpb::KeyValue;

    use super::*;

    /// A Txn answer whose one range holds `values` values of 100 bytes.
    fn txn_answer(values: usize) -> TxnResponse {
        let kvs = (0..values)
            .map(|i| KeyValue {
                key: format!("k{i}").into_bytes(),
                value: vec![b'v'; 100],
                ..Default::default()
            })
            .collect();
        TxnResponse {
            succeeded: true,
            responses: vec![ResponseOp {
                response: Some(OpAnswer::ResponseRange(RangeResponse {
                    kvs,
                    count: values as i64,
                    ..Default::default()
                })),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn an_answer_over_the_send_limit_gets_grpc_gos_text_with_its_size() {
        let answer = txn_answer(10);
        let len = answer.encoded_len();
        assert!(
            range_answer::within_send_limit(len, len).is_ok(),
            "at the limit"
        );
        let refused = range_answer::within_send_limit(len, len - 1).expect_err("one byte over");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            refused.message(),
            format!(
                "grpc: trying to send message larger than max ({len} vs. {})",
                len - 1
            )
        );
    }
}
