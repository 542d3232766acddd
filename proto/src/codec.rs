//! The gRPC codec of every generated service and client: prost's, except
//! that a request that does not parse is refused with etcd's message
//! (`grpc: error unmarshalling request: <gogo's error>`, code `Internal`,
//! see [`crate::gogo`]), and one gogo accepts is accepted (prost decodes
//! the fields gogo keeps). Parsing is prost's; the gogo walk runs only for
//! bytes prost refused.
//!
//! Clients decode answers with the same codec, so an answer that does not
//! parse also reads "unmarshalling request" (grpc-go's client says "failed
//! to unmarshal the received message"); this crate's clients only talk to
//! the store's own servers.

use std::any::Any;
use std::marker::PhantomData;

use prost::bytes::{Buf, BufMut};
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

use crate::etcdserverpb::RangeResponse;

/// grpc-go's prefix of a request that does not parse.
const UNMARSHAL_PREFIX: &str = "grpc: error unmarshalling request: ";
/// grpc-go's prefix of a client-stream message that does not parse (its
/// `recv`, where a unary request's goes through the prefix above).
const STREAM_UNMARSHAL_PREFIX: &str = "grpc: failed to unmarshal the received message ";

/// prost's codec with etcd's parse errors.
#[derive(Debug, Clone)]
pub struct EtcdCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for EtcdCodec<T, U> {
    fn default() -> Self {
        Self {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for EtcdCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = EtcdEncoder<T>;
    type Decoder = EtcdDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        EtcdEncoder {
            inner: ProstCodec::<T, U>::raw_encoder(BufferSettings::default()),
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        EtcdDecoder { _type: PhantomData }
    }
}

/// Encodes `T` with prost into a buffer grown once to the message's size.
///
/// prost writes into whatever room the buffer has, and tonic's buffer
/// grows by doubling: a 1 GiB Range answer was copied into ever larger
/// buffers (about 2 GiB of copies and page faults, 40% of the serving
/// member's CPU for that answer) and could leave up to twice its size
/// allocated. Reserving the encoded length first copies each byte once.
///
/// A [`RangeResponse`] gives up each key-value as soon as it is encoded
/// ([`encode_range_consuming`]), so a large answer is held about once (its
/// encoding) rather than twice (the key-values and their encoding).
#[derive(Debug)]
pub struct EtcdEncoder<T> {
    inner: ProstEncoder<T>,
}

impl<T: Message + 'static> Encoder for EtcdEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, mut item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        if let Some(range) = (&mut item as &mut dyn Any).downcast_mut::<RangeResponse>() {
            encode_range_consuming(range, buf);
            return Ok(());
        }
        self.inner.encode(item, buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

/// Encodes `range` as prost does (fields in tag order, defaults left out),
/// dropping each key-value once its bytes are in `buf`; `range` is left
/// without its key-values.
pub fn encode_range_consuming(range: &mut RangeResponse, buf: &mut impl BufMut) {
    use prost::encoding::{bool, int64, message};
    let kvs = std::mem::take(&mut range.kvs);
    if let Some(header) = &range.header {
        message::encode(1, header, buf);
    }
    for kv in kvs {
        message::encode(2, &kv, buf);
    }
    if range.more {
        bool::encode(3, &range.more, buf);
    }
    if range.count != 0 {
        int64::encode(4, &range.count, buf);
    }
}

/// Decodes `U` with prost; words a refusal as etcd does.
#[derive(Debug)]
pub struct EtcdDecoder<U> {
    _type: PhantomData<U>,
}

impl<U: Message + Default> Decoder for EtcdDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        decode(buf.copy_to_bytes(buf.remaining()))
            .map(Some)
            .map_err(refused)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// `bytes` as etcd parses a `U`: prost's decoding, or, for bytes prost
/// refuses and gogo accepts, the fields gogo keeps; `Err` with the reason
/// etcd gives (gogo's error, else prost's).
pub fn decode<U: Message + Default>(bytes: prost::bytes::Bytes) -> Result<U, String> {
    match U::decode(bytes.clone()) {
        Ok(message) => Ok(message),
        Err(e) => match crate::gogo::unmarshal(&full_name::<U>(), &bytes) {
            Some(Err(gogo)) => Err(gogo),
            // gogo parses it: decode what gogo keeps.
            Some(Ok(known)) => U::decode(&known[..]).map_err(|_| e.to_string()),
            None => Err(e.to_string()),
        },
    }
}

fn refused(reason: String) -> Status {
    Status::internal(format!("{UNMARSHAL_PREFIX}{reason}"))
}

/// The status that ends a client stream (Watch, LeaseKeepAlive) after
/// receiving it from the stream: [`EtcdDecoder`] words every refusal as a
/// unary request's, which grpc-go words differently for a stream's message.
/// Any other status is returned as it is.
pub fn stream_status(status: Status) -> Status {
    match status.message().strip_prefix(UNMARSHAL_PREFIX) {
        Some(reason) if status.code() == tonic::Code::Internal => {
            Status::internal(format!("{STREAM_UNMARSHAL_PREFIX}{reason}"))
        }
        _ => status,
    }
}

/// `U`'s protobuf name from its Rust path: `etcd_proto::etcdserverpb::RangeRequest`
/// is `etcdserverpb.RangeRequest` (messages at a package's top level, as
/// every request is).
fn full_name<U>() -> String {
    let path = std::any::type_name::<U>();
    let path = path.strip_prefix("etcd_proto::").unwrap_or(path);
    path.replace("::", ".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_message_refusal_is_worded_as_grpc_go_words_it() {
        let refusal = refused("unexpected EOF".into());
        assert_eq!(
            stream_status(refusal).message(),
            "grpc: failed to unmarshal the received message unexpected EOF"
        );
        let other = Status::cancelled("gone");
        assert_eq!(stream_status(other).message(), "gone");
    }

    /// The consuming encoding is prost's, byte for byte, with and without
    /// the optional fields.
    #[test]
    fn a_range_answer_encodes_as_prost_encodes_it() {
        use crate::etcdserverpb::ResponseHeader;
        use crate::mvccpb::KeyValue;
        let kv = |n: u8| KeyValue {
            key: vec![b'k', n],
            value: vec![n; 300],
            create_revision: 2,
            mod_revision: i64::from(n) + 2,
            version: 1,
            lease: i64::from(n % 2),
        };
        let full = RangeResponse {
            header: Some(ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 9,
                raft_term: 3,
            }),
            kvs: (0..5).map(kv).collect(),
            more: true,
            count: 7,
        };
        for answer in [
            full.clone(),
            RangeResponse::default(),
            RangeResponse {
                more: false,
                count: 0,
                ..full
            },
        ] {
            let mut consumed = answer.clone();
            let mut bytes = Vec::new();
            encode_range_consuming(&mut consumed, &mut bytes);
            assert_eq!(bytes, answer.encode_to_vec());
            assert!(consumed.kvs.is_empty());
        }
    }

    #[test]
    fn request_names_follow_the_package() {
        assert_eq!(
            full_name::<crate::etcdserverpb::RangeRequest>(),
            "etcdserverpb.RangeRequest"
        );
    }
}
