//! etcd-client connections and implementation-neutral descriptions of results.
//!
//! Every connection has a connect timeout and a per-request timeout, so no RPC
//! can hang a test. [`describe`] renders a response (its `Debug` form) or a
//! gRPC error (code and message only: the trailing metadata is transport
//! detail that legitimately differs between servers) and normalizes
//! instance-specific ids, so results from two servers compare with `==`.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::{Client, ConnectOptions, GetResponse, StatusResponse, TlsOptions};

use crate::normalize::normalize;
use crate::wait::retry_until;

/// Upper bound for establishing a connection to one endpoint.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Upper bound for one RPC made through a harness connection.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Key read by the health check (it is never written, so reading it leaves
/// the revision untouched).
pub const HEALTH_KEY: &str = "health";

/// Connects to `endpoints` with the harness's default timeouts.
pub async fn connect(endpoints: &[String]) -> Result<Client> {
    connect_with_timeout(endpoints, REQUEST_TIMEOUT).await
}

/// (hash, compact revision, header revision) of `HashKV` at `revision` on
/// `endpoint`, retried until the member has applied `revision` (before that
/// it answers "future revision"), for at most `deadline`.
pub async fn hash_kv_when_applied(
    endpoint: &str,
    revision: i64,
    deadline: Duration,
) -> Result<(u32, i64, i64)> {
    retry_until(
        &format!("HashKV at {revision} on {endpoint}"),
        deadline,
        || async move {
            let mut client = connect(&[endpoint.to_string()]).await?;
            let response = client.hash_kv(revision).await?;
            Ok((
                response.hash(),
                response.compact_version(),
                response
                    .header()
                    .context("hashkv without header")?
                    .revision(),
            ))
        },
    )
    .await
}

/// Connects to `endpoints` with a specific per-request timeout.
pub async fn connect_with_timeout(
    endpoints: &[String],
    request_timeout: Duration,
) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(request_timeout);
    Client::connect(endpoints, Some(options))
        .await
        .with_context(|| format!("connecting etcd-client to {endpoints:?}"))
}

/// Connects to `endpoints` over TLS with the harness's default timeouts
/// (the connect timeout bounds the TLS handshake too).
pub async fn connect_tls(endpoints: &[String], tls: TlsOptions) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_tls(tls);
    Client::connect(endpoints, Some(options))
        .await
        .with_context(|| format!("connecting etcd-client with TLS to {endpoints:?}"))
}

/// Checks that the member behind `client` knows a leader and serves a
/// linearizable read (so it is connected to a quorum and caught up to the
/// commit index at the time of the read); returns its status.
pub async fn check_serving(client: &mut Client) -> Result<StatusResponse> {
    let status = client.status().await?;
    ensure!(status.leader() != 0, "no leader yet");
    client.get(HEALTH_KEY, None).await?;
    Ok(status)
}

/// A future of an etcd-client call, as the operations of the oracle's rpc
/// steps return them.
pub type Call<T> = Pin<Box<dyn Future<Output = Result<T, etcd_client::Error>> + Send>>;

/// `get(key)` as an operation for the oracle's rpc steps
/// ([`crate::Differential::rpc`], [`crate::auth::UserClients::rpc`]).
pub fn get_op(key: &str) -> impl Fn(Client) -> Call<GetResponse> {
    let key = key.to_string();
    move |mut client| {
        let key = key.clone();
        Box::pin(async move { client.get(key, None).await })
    }
}

/// The store's current revision (the header of a read of a key that is
/// never written).
pub async fn current_revision(client: &Client) -> Result<i64> {
    let response = client.clone().get("revision-probe", None).await?;
    Ok(response.header().context("get without header")?.revision())
}

/// The gRPC status code and message of an error, or its display text if it
/// is not a gRPC status.
pub fn describe_error(error: &etcd_client::Error) -> String {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            format!(
                "gRPC error code={:?} message={:?}",
                status.code(),
                status.message()
            )
        }
        other => format!("client error: {other}"),
    }
}

/// A normalized, comparable rendering of an etcd-client result.
pub fn describe<T: Debug>(result: &Result<T, etcd_client::Error>) -> String {
    match result {
        Ok(response) => normalize(&format!("{response:#?}")),
        Err(error) => describe_error(error),
    }
}

/// The gRPC status code of an error, if it is a gRPC status.
pub fn grpc_code(error: &etcd_client::Error) -> Option<tonic::Code> {
    match error {
        etcd_client::Error::GRpcStatus(status) => Some(status.code()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_described_by_code_and_message_only() {
        let status = tonic::Status::invalid_argument("etcdserver: request is too large");
        let text = describe_error(&etcd_client::Error::GRpcStatus(status));
        assert_eq!(
            text,
            "gRPC error code=InvalidArgument message=\"etcdserver: request is too large\""
        );
    }

    #[test]
    fn described_responses_hide_ids() {
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Header {
            cluster_id: u64,
            member_id: u64,
            revision: i64,
            raft_term: u64,
        }
        let make = |cluster_id, member_id, raft_term| {
            Ok::<_, etcd_client::Error>(Header {
                cluster_id,
                member_id,
                revision: 7,
                raft_term,
            })
        };
        assert_eq!(describe(&make(1, 2, 3)), describe(&make(4, 5, 6)));
        assert_ne!(describe(&make(1, 2, 3)), describe(&make(1, 2, 0)));
    }
}
