//! A minimal HTTPS/1.1 client (tokio-rustls, ring) for the gateway benchmark.
//!
//! The proxies under test pass TLS through, so the client talks TLS to
//! nginx at the far end. Certificates are not verified against a CA (the
//! backends use a throw-away self-signed certificate), but handshake
//! signatures are checked, so every handshake does the real work.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Server name sent in the ClientHello.
const SERVER_NAME: &str = "localhost";
/// Longest response header block accepted, in bytes.
const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Largest response body accepted, in bytes.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Timeout of TCP connect plus TLS handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts any certificate but verifies handshake signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS connector for the benchmark backends.
pub fn connector() -> Result<TlsConnector> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// A keep-alive HTTPS connection.
pub struct HttpsConn {
    stream: BufReader<TlsStream<TcpStream>>,
}

/// Connects and completes the TLS handshake (bounded by [`CONNECT_TIMEOUT`]).
pub async fn connect(addr: SocketAddr, tls: &TlsConnector) -> Result<HttpsConn> {
    let handshake = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(SERVER_NAME)?;
        anyhow::Ok(tls.connect(name, tcp).await?)
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
        .await
        .with_context(|| format!("connect to {addr} timed out"))?
        .with_context(|| format!("connect to {addr}"))?;
    Ok(HttpsConn {
        stream: BufReader::new(stream),
    })
}

impl HttpsConn {
    /// Sends `GET path` and reads the whole response; fails unless it is a 200.
    pub async fn get(&mut self, path: &str) -> Result<()> {
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nUser-Agent: bench\r\n\r\n");
        self.stream.get_mut().write_all(req.as_bytes()).await?;
        let (status, length) = self.read_head().await?;
        if length > MAX_BODY_BYTES {
            bail!("response body of {length} bytes is too large");
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await?;
        if status != 200 {
            bail!("HTTP status {status}");
        }
        Ok(())
    }

    /// Reads the status line and headers; returns (status, content length).
    async fn read_head(&mut self) -> Result<(u16, usize)> {
        let mut line = String::new();
        let mut status = 0;
        let mut length = 0;
        let mut seen = 0;
        loop {
            line.clear();
            let n = self.stream.read_line(&mut line).await?;
            seen += n;
            if n == 0 {
                bail!("connection closed before the response ended");
            }
            if seen > MAX_HEADER_BYTES {
                bail!("response headers too long");
            }
            let l = line.trim_end();
            if l.is_empty() {
                return Ok((status, length));
            }
            if status == 0 {
                status = l
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .context("bad status line")?;
            } else if let Some((name, value)) = l.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().context("bad content-length")?;
                }
            }
        }
    }

    /// Closes the connection with a TLS close_notify.
    pub async fn close(mut self) {
        let _ = self.stream.get_mut().shutdown().await;
    }
}
