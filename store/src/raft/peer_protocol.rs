//! Which peer protocol a member speaks to each other member, and the
//! answers that differ between protocols.
//!
//! # Choosing the protocol
//!
//! A member sends member M the newest protocol that
//! 1. its own release speaks,
//! 2. the cluster version allows ([`crate::version::peer_protocol_for`]),
//! 3. M announced in its last answer ([`crate::version::PEER_PROTOCOL_HEADER`]).
//!
//! Builds of one release present the same server version, so the cluster
//! version cannot tell a build that speaks protocol 2 from one that does
//! not; M's own word can. Every answer from M (a heartbeat's, a refusal's)
//! sets (3) again, and an answer without the header means protocol 1, so
//! (3) follows M across a restart on another build. Until M has answered,
//! and after a call to M fails in transport (M is down, and may come back
//! as another build), (3) is unknown and M is sent protocol 1, which every
//! build reads:
//!
//! ```text
//! what M's last answer said         | learned for M | sent to M (cluster version 3.6)
//! nothing yet                       | unknown       | 1
//! "peer-protocol: 2"                | 2             | 2
//! "peer-protocol: 3" (next release) | 3             | 2 (the cluster version's cap)
//! no header (a build before 2)      | 1             | 1
//! the connection failed             | unknown       | 1
//! ```
//!
//! A snapshot waits until M's protocol is known
//! ([`PeerChannel::knows_peer`]): protocol 1 would make the sender read the
//! whole checkpoint once more first, to announce its length. Openraft's
//! heartbeats reach every member, so M's protocol is known within a
//! heartbeat of M answering.
//!
//! The channel to M is per protocol ([`PeerChannel`], cached by
//! [`super::network::PeerNetworkFactory::channel`]): when the protocol to M
//! changes, the next call opens a channel in the new one; a stream opened
//! before keeps the protocol it was opened in until it ends. A receiver
//! still refuses a request in a protocol it does not speak before reading
//! it (`server::peer::check_peer_protocol`), so a wrong guess costs one
//! refused call, never a misread one.
//!
//! # Raft failures on the wire
//!
//! openraft's handlers of Raft messages (append, vote, pre-vote, snapshot,
//! handoff) fail only when the receiving member's Raft has stopped: it was
//! shut down, it panicked, or its storage failed. Protocol 2 sends that as
//! a [`RaftFailure`]; protocol 1 sent openraft's text, which
//! [`RaftFailure::from_text`] reads back. The sender treats every failure
//! as the member being unreachable: retrying at once cannot help a member
//! whose Raft has stopped, so openraft backs off.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use openraft::error::{Fatal, RaftError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use super::{NodeId, TypeConfig};
use crate::codec;
use crate::version::announced_peer_protocol;

/// The first peer protocol whose Raft answers carry a [`RaftFailure`]
/// (protocol 1 sent openraft's text).
pub const TYPED_FAILURES_SINCE: u32 = 2;

/// The first peer protocol whose snapshot stream opens without the
/// records' length and marks their end
/// ([`super::network::SnapshotOpening`]; protocol 1 announced the length).
pub const MARKED_SNAPSHOTS_SINCE: u32 = 2;

/// What [`PeerChannel`]s keep for a member that has not answered since it
/// was last reached: its protocol is not known.
pub const UNKNOWN: u32 = 0;

/// How a member's refusal of a request in a protocol it does not speak
/// begins (a FailedPrecondition status, sent before the request is read).
pub const REFUSAL_PREFIX: &str = "peer protocol ";

/// Whether `status` is a member's refusal of a request in a protocol it
/// does not speak: nothing was read, so the request may be sent again
/// (after the refusal's answer taught the channel what the member speaks).
pub fn refused(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition && status.message().starts_with(REFUSAL_PREFIX)
}

/// Why a member's Raft could not take a Raft message (peer protocol 2 and
/// later; module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RaftFailure {
    /// Its Raft has stopped: the member is shutting down.
    #[error("the member's raft has stopped")]
    Stopped,
    /// Its Raft panicked.
    #[error("the member's raft panicked")]
    Panicked,
    /// Its storage failed, which stopped its Raft (openraft's description).
    #[error("the member's storage failed: {0}")]
    Storage(String),
}

/// openraft's text of [`Fatal::Stopped`] and [`Fatal::Panicked`], as
/// protocol 1 sent them.
const STOPPED_TEXT: &str = "raft stopped";
const PANICKED_TEXT: &str = "panicked";

impl RaftFailure {
    /// The failure protocol 1 described as `text` (openraft's `Display`
    /// of the fatal error).
    pub fn from_text(text: String) -> Self {
        match text.as_str() {
            STOPPED_TEXT => Self::Stopped,
            PANICKED_TEXT => Self::Panicked,
            _ => Self::Storage(text),
        }
    }
}

impl From<Fatal<TypeConfig>> for RaftFailure {
    fn from(fatal: Fatal<TypeConfig>) -> Self {
        match fatal {
            Fatal::Stopped => Self::Stopped,
            Fatal::Panicked => Self::Panicked,
            Fatal::StorageError(e) => Self::Storage(e.to_string()),
        }
    }
}

/// The fatal error inside a Raft message handler's error: the only kind
/// there is (its API error is `Infallible`).
pub fn fatal(error: RaftError<TypeConfig>) -> Fatal<TypeConfig> {
    match error {
        RaftError::Fatal(fatal) => fatal,
        RaftError::APIError(never) => match never {},
    }
}

/// A Raft message handler's answer, encoded in `protocol`: the value or
/// the failure, as its text in protocol 1 and typed after.
pub fn encode_answer<T: Serialize>(protocol: u32, result: Result<T, Fatal<TypeConfig>>) -> Vec<u8> {
    if protocol < TYPED_FAILURES_SINCE {
        codec::encode(&result.map_err(|e| e.to_string()))
    } else {
        codec::encode(&result.map_err(RaftFailure::from))
    }
}

/// Reads an answer [`encode_answer`] wrote in `protocol`.
pub fn decode_answer<T: DeserializeOwned>(
    protocol: u32,
    payload: &[u8],
) -> Result<Result<T, RaftFailure>, bincode::Error> {
    if protocol < TYPED_FAILURES_SINCE {
        let answer: Result<T, String> = codec::decode(payload)?;
        Ok(answer.map_err(RaftFailure::from_text))
    } else {
        codec::decode(payload)
    }
}

/// A channel to one member that sends one peer protocol and learns, from
/// each answer, the newest protocol the member speaks (module docs).
#[derive(Clone, Debug)]
pub struct PeerChannel {
    inner: Channel,
    /// The protocol its requests announce and are encoded in.
    protocol: u32,
    /// The member it goes to (for the log).
    target: NodeId,
    /// What the member announced last; shared by its channels.
    announced: Arc<AtomicU32>,
}

impl PeerChannel {
    /// A channel over `inner`, whose requests are in `protocol`, to member
    /// `target`, keeping what the member announces in `announced`.
    pub fn new(inner: Channel, protocol: u32, target: NodeId, announced: Arc<AtomicU32>) -> Self {
        Self {
            inner,
            protocol,
            target,
            announced,
        }
    }

    /// The protocol its requests are in (and so their answers).
    pub fn protocol(&self) -> u32 {
        self.protocol
    }

    /// Whether the member answered since it was last reached, so that
    /// the newest protocol it speaks is known (module docs).
    pub fn knows_peer(&self) -> bool {
        self.announced.load(Ordering::Relaxed) != UNKNOWN
    }
}

/// Keeps `protocol` as what member `target` announced, logging a change.
fn learn(announced: &AtomicU32, target: NodeId, protocol: u32, why: &'static str) {
    let before = announced.swap(protocol, Ordering::Relaxed);
    if before != protocol {
        tracing::info!(
            member = format!("{target:x}"),
            from = before,
            to = protocol,
            why,
            "learned a member's peer protocol"
        );
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for PeerChannel {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let answer = self.inner.call(request);
        let (announced, target) = (self.announced.clone(), self.target);
        Box::pin(async move {
            match answer.await {
                Ok(response) => {
                    if let Some(protocol) = announced_peer_protocol(response.headers()) {
                        learn(&announced, target, protocol, "its answer announced it");
                    }
                    Ok(response)
                }
                Err(e) => {
                    learn(&announced, target, UNKNOWN, "the connection failed");
                    Err(e)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{ErrorSubject, ErrorVerb, StorageError};

    fn storage_failure() -> Fatal<TypeConfig> {
        let io = std::io::Error::other("disk full");
        Fatal::StorageError(StorageError::from_io_error(
            ErrorSubject::Logs,
            ErrorVerb::Write,
            io,
        ))
    }

    /// Protocol 1 answers with openraft's text, which reads back as the
    /// same failure; protocol 2 answers typed.
    #[test]
    fn failures_survive_the_hop_in_both_protocols() {
        for fatal in [Fatal::Stopped, Fatal::Panicked, storage_failure()] {
            let expected = RaftFailure::from(fatal.clone());
            for protocol in [1, 2] {
                let payload = encode_answer::<u64>(protocol, Err(fatal.clone()));
                let answer = decode_answer::<u64>(protocol, &payload).expect("decodes");
                assert_eq!(answer, Err(expected.clone()), "protocol {protocol}");
            }
        }
        assert!(matches!(
            RaftFailure::from(storage_failure()),
            RaftFailure::Storage(text) if text.contains("disk full")
        ));
        let ok = encode_answer::<u64>(2, Ok(7));
        assert_eq!(decode_answer::<u64>(2, &ok).expect("decodes"), Ok(7));
    }

    /// Protocol 1's layout is `Result<T, String>`, as builds before 2
    /// read it.
    #[test]
    fn protocol_1_answers_are_text() {
        let payload = encode_answer::<u64>(1, Err(Fatal::Stopped));
        let old: Result<u64, String> = codec::decode(&payload).expect("decodes");
        assert_eq!(old, Err(STOPPED_TEXT.to_string()));
        let payload = encode_answer::<u64>(1, Err(Fatal::Panicked));
        let old: Result<u64, String> = codec::decode(&payload).expect("decodes");
        assert_eq!(old, Err(PANICKED_TEXT.to_string()));
    }
}
