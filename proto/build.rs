//! Generates the Rust types and gRPC stubs (client and server) for the etcd
//! v3 API and for the store's peer protocol, and serde (JSON) impls for the
//! etcd API packages.
//!
//! The JSON impls (pbjson) follow the proto3 JSON mapping the way etcd 3.5's
//! grpc-gateway marshals it (`OrigName: true`, defaults omitted): field names
//! as written in the `.proto` files (`cluster_id`, `ID`, `peerURLs`), 64-bit
//! integers as strings, bytes as standard base64, enums by name; unknown
//! fields are ignored on input, as the gateway does.

use std::path::PathBuf;

/// Packages that get JSON impls (the etcd client API; not `storepeer`).
const JSON_PACKAGES: [&str; 5] = [
    ".mvccpb",
    ".authpb",
    ".etcdserverpb",
    ".v3lockpb",
    ".v3electionpb",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/etcdserverpb/rpc.proto",
        "proto/v3lockpb/v3lock.proto",
        "proto/v3electionpb/v3election.proto",
        "proto/storepeer/peer.proto",
    ];
    let descriptors = PathBuf::from(std::env::var("OUT_DIR")?).join("descriptors.bin");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(&descriptors)
        // prost's codec with etcd's (gogo's) words for a request that
        // does not parse (src/codec.rs).
        .codec_path("crate::codec::EtcdCodec")
        .compile_protos(&protos, &["proto"])?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&JSON_PACKAGES)?;
    Ok(())
}
