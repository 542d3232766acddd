//! One health probe: TCP connect, HTTP(S) GET expecting 2xx, or etcd's `/health`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::error::{ProbeError, TlsSetupError};
use super::tls::client_config;
use crate::config::{CheckConfig, CheckKind};

/// Largest response body read from a check endpoint; `/readyz` and etcd's `/health` answer a
/// few bytes, so anything longer is not the endpoint we expect.
pub const MAX_CHECK_BODY_BYTES: usize = 16 * 1024;

/// Runs probes of one check configuration against backend addresses.
#[derive(Clone)]
pub struct Prober {
    kind: CheckKind,
    path: String,
    timeout: Duration,
    tls: Option<TlsConnector>,
    server_name: Option<String>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Prober")
            .field("kind", &self.kind)
            .field("path", &self.path)
            .finish()
    }
}

impl Prober {
    /// Prepares probes for `check`; reads the CA bundle and client certificate files now, so a
    /// bad file refuses the configuration instead of failing every check later.
    pub fn new(check: &CheckConfig) -> Result<Prober, TlsSetupError> {
        let tls = if check.kind.uses_tls() {
            Some(TlsConnector::from(client_config(&check.tls)?))
        } else {
            None
        };
        Ok(Prober {
            kind: check.kind,
            path: check.path.clone(),
            timeout: check.timeout,
            tls,
            server_name: check.tls.server_name.clone(),
        })
    }

    /// The protocol probed.
    pub fn kind(&self) -> CheckKind {
        self.kind
    }

    /// Probes `address` (`HOST:PORT`) once, within the check timeout.
    pub async fn probe(&self, address: &str) -> Result<(), ProbeError> {
        tokio::time::timeout(self.timeout, self.probe_unbounded(address))
            .await
            .map_err(|_| ProbeError::Timeout)?
    }

    async fn probe_unbounded(&self, address: &str) -> Result<(), ProbeError> {
        let stream = TcpStream::connect(address)
            .await
            .map_err(ProbeError::Connect)?;
        let _ = stream.set_nodelay(true);
        match (self.kind, &self.tls) {
            (CheckKind::None | CheckKind::Tcp, _) => Ok(()),
            (_, None) => self.http(stream, address).await,
            (_, Some(connector)) => {
                let name = self.server_name(address)?;
                let stream = connector
                    .connect(name, stream)
                    .await
                    .map_err(ProbeError::Tls)?;
                self.http(stream, address).await
            }
        }
    }

    fn server_name(&self, address: &str) -> Result<ServerName<'static>, ProbeError> {
        let host = match &self.server_name {
            Some(name) => name.as_str(),
            None => host_of(address),
        };
        ServerName::try_from(host.to_string()).map_err(|_| ProbeError::Address(address.to_string()))
    }

    async fn http<S>(&self, stream: S, address: &str) -> Result<(), ProbeError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(connection);
        let request = http::Request::get(self.path.as_str())
            .header(http::header::HOST, address)
            .header(http::header::USER_AGENT, "gateway-health-check")
            .header(http::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .map_err(|error| ProbeError::Address(error.to_string()))?;
        let result = self.exchange(&mut sender, request).await;
        drop(sender);
        driver.abort();
        result
    }

    async fn exchange(
        &self,
        sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
        request: http::Request<Empty<Bytes>>,
    ) -> Result<(), ProbeError> {
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_CHECK_BODY_BYTES)
            .collect()
            .await
            .map_err(|error| ProbeError::Body(error.to_string()))?
            .to_bytes();
        match self.kind {
            CheckKind::EtcdHttp | CheckKind::EtcdHttps => etcd_health(status.as_u16(), &body),
            _ if status.is_success() => Ok(()),
            _ => Err(ProbeError::Status(status.as_u16())),
        }
    }
}

/// etcd answers `/health` with `{"health":"true","reason":""}` (status 200) when it has a
/// leader and its store answers; anything else is unhealthy.
fn etcd_health(status: u16, body: &[u8]) -> Result<(), ProbeError> {
    if status != 200 {
        return Err(ProbeError::Status(status));
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|error| ProbeError::EtcdUnhealthy(format!("invalid JSON: {error}")))?;
    match value.get("health").and_then(|health| health.as_str()) {
        Some("true") => Ok(()),
        _ => Err(ProbeError::EtcdUnhealthy(
            String::from_utf8_lossy(body).into_owned(),
        )),
    }
}

/// The host part of `HOST:PORT` (without IPv6 brackets).
pub fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A prober shared by all backends of one frontend.
pub type SharedProber = Arc<Prober>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_health_body() {
        assert!(etcd_health(200, br#"{"health":"true","reason":""}"#).is_ok());
        assert!(etcd_health(200, br#"{"health":"false","reason":"RAFT NO LEADER"}"#).is_err());
        assert!(etcd_health(503, br#"{"health":"true"}"#).is_err());
        assert!(etcd_health(200, b"not json").is_err());
    }

    #[test]
    fn host_of_strips_port_and_brackets() {
        assert_eq!(host_of("10.0.0.1:6443"), "10.0.0.1");
        assert_eq!(host_of("[::1]:6443"), "::1");
        assert_eq!(host_of("cp1.example:6443"), "cp1.example");
    }
}
