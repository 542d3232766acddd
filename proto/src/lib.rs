//! Wire types and gRPC stubs for the store.
//!
//! This crate holds two protocols, both generated at build time from the
//! `.proto` files under `proto/proto` with `tonic-prost-build`:
//!
//! * The etcd v3 client API, so that etcdctl and any etcd client library can
//!   talk to the store unchanged. The definitions were written for this
//!   project from etcd 3.5's public API reference; package, service, rpc,
//!   message, enum and field names and field numbers match etcd 3.5, which
//!   gives identical gRPC paths (e.g. `/etcdserverpb.KV/Range`) and an
//!   identical wire format. It is split, as in etcd, into three packages:
//!   [`mvccpb`] (key-values and watch events), [`authpb`] (users, roles,
//!   permissions) and [`etcdserverpb`] (the `KV`, `Watch`, `Lease`,
//!   `Cluster`, `Maintenance` and `Auth` services and their messages).
//! * [`storepeer`], the store's own member-to-member protocol (raft messages,
//!   snapshot transfer, request forwarding). It is not part of etcd's API.
//!
//! Every package gets both client and server stubs: for example
//! [`etcdserverpb::kv_server::KvServer`] and
//! [`etcdserverpb::kv_client::KvClient`].
#![deny(missing_docs)]

/// etcd's storage types: `KeyValue` and watch `Event` (protobuf package
/// `mvccpb`).
#[allow(missing_docs, clippy::all)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// etcd's authentication types: `User`, `Role`, `Permission` (protobuf
/// package `authpb`).
#[allow(missing_docs, clippy::all)]
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// The etcd v3 gRPC API: services `KV`, `Watch`, `Lease`, `Cluster`,
/// `Maintenance`, `Auth` and their messages (protobuf package
/// `etcdserverpb`).
#[allow(missing_docs, clippy::all)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// The store's member-to-member protocol (protobuf package `storepeer`).
#[allow(missing_docs, clippy::all)]
pub mod storepeer {
    tonic::include_proto!("storepeer");
}

#[cfg(test)]
mod tests {
    //! Checks field numbers against hand-computed protobuf encodings: a wrong
    //! tag in a `.proto` file changes the bytes and fails these tests.

    use super::etcdserverpb::{
        compare, request_op, watch_request, Compare, PutRequest, RangeRequest, RequestOp,
        ResponseHeader, TxnRequest, WatchCreateRequest, WatchRequest, WatchResponse,
    };
    use super::mvccpb::{event::EventType, Event, KeyValue};
    use prost::Message;

    #[test]
    fn compare_range_end_is_field_64() {
        let cmp = Compare {
            result: compare::CompareResult::Greater as i32,
            target: compare::CompareTarget::Mod as i32,
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            target_union: Some(compare::TargetUnion::ModRevision(5)),
        };
        let expected: &[u8] = &[
            0x08, 0x01, // result = 1 (varint), GREATER
            0x10, 0x02, // target = 2 (varint), MOD
            0x1a, 0x01, b'a', // key = 3 (bytes)
            0x30, 0x05, // mod_revision = 6 (varint)
            // range_end = 64: tag (64 << 3) | 2 = 514 = varint 0x82 0x04
            0x82, 0x04, 0x01, b'b',
        ];
        assert_eq!(cmp.encode_to_vec(), expected);
        assert_eq!(Compare::decode(expected).unwrap(), cmp);

        // The value arm of the oneof is field 7, lease is field 8.
        let v = Compare {
            target_union: Some(compare::TargetUnion::Value(b"x".to_vec())),
            ..Default::default()
        };
        assert_eq!(v.encode_to_vec(), [0x3a, 0x01, b'x']);
        let l = Compare {
            target_union: Some(compare::TargetUnion::Lease(3)),
            ..Default::default()
        };
        assert_eq!(l.encode_to_vec(), [0x40, 0x03]);
    }

    #[test]
    fn watch_response_events_is_field_11() {
        let resp = WatchResponse {
            header: Some(ResponseHeader {
                revision: 9,
                ..Default::default()
            }),
            watch_id: 1,
            cancel_reason: "x".into(),
            fragment: true,
            events: vec![Event {
                r#type: EventType::Delete as i32,
                kv: Some(KeyValue {
                    key: b"k".to_vec(),
                    mod_revision: 9,
                    ..Default::default()
                }),
                prev_kv: None,
            }],
            ..Default::default()
        };
        let expected: &[u8] = &[
            0x0a, 0x02, 0x18, 0x09, // header = 1 { revision = 3 }
            0x10, 0x01, // watch_id = 2
            0x32, 0x01, b'x', // cancel_reason = 6
            0x38, 0x01, // fragment = 7
            // events = 11: tag (11 << 3) | 2 = 0x5a
            0x5a, 0x09, //
            0x08, 0x01, // type = 1, DELETE
            0x12, 0x05, // kv = 2
            0x0a, 0x01, b'k', // key = 1
            0x18, 0x09, // mod_revision = 3
        ];
        assert_eq!(resp.encode_to_vec(), expected);
        assert_eq!(WatchResponse::decode(expected).unwrap(), resp);
    }

    #[test]
    fn range_request_high_fields() {
        let req = RangeRequest {
            key: b"a".to_vec(),
            sort_order: 2,
            sort_target: 4,
            count_only: true,
            min_mod_revision: 1,
            max_create_revision: 2,
            ..Default::default()
        };
        let expected: &[u8] = &[
            0x0a, 0x01, b'a', // key = 1
            0x28, 0x02, // sort_order = 5, DESCEND
            0x30, 0x04, // sort_target = 6, VALUE
            0x48, 0x01, // count_only = 9
            0x50, 0x01, // min_mod_revision = 10
            0x68, 0x02, // max_create_revision = 13
        ];
        assert_eq!(req.encode_to_vec(), expected);
    }

    #[test]
    fn txn_and_watch_request_oneofs() {
        let txn = TxnRequest {
            compare: vec![],
            success: vec![],
            failure: vec![RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    ignore_lease: true,
                    ..Default::default()
                })),
            }],
        };
        // failure = 3 { request_put = 2 { ignore_lease = 6 } }
        assert_eq!(txn.encode_to_vec(), [0x1a, 0x04, 0x12, 0x02, 0x30, 0x01]);

        let watch = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    filters: vec![1],
                    watch_id: 7,
                    fragment: true,
                    ..Default::default()
                },
            )),
        };
        // create_request = 1 { filters = 5 (packed) [NODELETE],
        //                      watch_id = 7, fragment = 8 }
        assert_eq!(
            watch.encode_to_vec(),
            [0x0a, 0x07, 0x2a, 0x01, 0x01, 0x38, 0x07, 0x40, 0x01]
        );
    }
}
