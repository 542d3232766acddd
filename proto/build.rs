//! Generates the Rust types and gRPC stubs (client and server) for the etcd
//! v3 API and for the store's peer protocol.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/etcdserverpb/rpc.proto",
        "proto/storepeer/peer.proto",
    ];
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
