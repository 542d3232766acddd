//! Encoding of openraft values: bincode of their serde form, used for Raft
//! log entries on disk and for peer RPC payloads; and a serde adapter that
//! carries prost messages (etcd requests) inside serde types as their
//! protobuf bytes.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes a serde value.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serialize(value).expect("serde types of the store always encode")
}

/// Appends the encoding of a serde value to `out`.
pub fn encode_into<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    bincode::serialize_into(out, value).expect("serde types of the store always encode")
}

/// Decodes a serde value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::Error> {
    bincode::deserialize(bytes)
}

/// `#[serde(with = "prost_bytes")]`: a prost message as its protobuf bytes.
pub mod prost_bytes {
    use prost::Message;
    use serde::{Deserializer, Serializer};

    /// Serializes `msg` as protobuf bytes.
    pub fn serialize<M: Message, S: Serializer>(msg: &M, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&msg.encode_to_vec())
    }

    /// Deserializes protobuf bytes into `M`.
    pub fn deserialize<'de, M: Message + Default, D: Deserializer<'de>>(
        d: D,
    ) -> Result<M, D::Error> {
        let bytes: Vec<u8> = serde_bytes_vec(d)?;
        M::decode(bytes.as_slice()).map_err(serde::de::Error::custom)
    }

    fn serde_bytes_vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("protobuf bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_byte_buf(V)
    }
}

#[cfg(test)]
mod layout;
