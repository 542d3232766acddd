//! TLS for client and peer traffic with etcd's flags, on rustls.
//!
//! Client side (`--cert-file`, `--key-file`, `--trusted-ca-file`,
//! `--client-cert-auth`): `https://` client listeners accept TLS connections
//! (ALPN h2 and http/1.1, so gRPC and `/health` share the port); with
//! `--client-cert-auth` a client must present a certificate signed by the
//! trusted CA, which is what kube-apiserver's `--etcd-certfile` provides.
//!
//! Peer side (`--peer-cert-file`, `--peer-key-file`, `--peer-trusted-ca-file`,
//! `--peer-client-cert-auth`): `https://` peer listeners serve the peer
//! protocol over TLS, and members dial `https://` peer URLs with the peer
//! certificate as their client identity.
//!
//! A verified client certificate's common name is the user for auth when a
//! request carries no token, as in etcd ([`ClientPeer`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take to finish the TLS handshake before the
/// connection is dropped (so a stalled client holds no slot for long).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server to take them.
const ACCEPT_QUEUE: usize = 128;

/// TLS handshakes in progress at once, at most. Beyond it, new TCP
/// connections wait in the kernel's accept queue until a handshake ends
/// (at the latest after [`HANDSHAKE_TIMEOUT`]), so a flood of connections
/// that never finish a handshake holds bounded memory; connections already
/// established keep being served.
pub const MAX_PENDING_HANDSHAKES: usize = 1_024;

/// One side's certificate files, as etcd's flags name them.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// Certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// Private key (PEM).
    pub key: Option<PathBuf>,
    /// CA bundle that signs acceptable client (or peer) certificates.
    pub trusted_ca: Option<PathBuf>,
    /// Require a certificate from every client (or peer). As in etcd, a
    /// trusted CA file requires one as well.
    pub client_cert_auth: bool,
}

/// TLS configuration problems.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file cannot be read or parsed.
    #[error("{what} {path}: {source}")]
    Pem {
        /// What was read ("read certificates", "read private key", ...).
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        source: rustls::pki_types::pem::Error,
    },
    /// A file cannot be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A certificate file holds no certificate.
    #[error("no certificate in {0}")]
    NoCertificate(String),
    /// A trusted CA certificate is not usable as a root.
    #[error("trusted CA {path}: {source}")]
    TrustedCa {
        /// The file.
        path: String,
        /// Why.
        source: rustls::Error,
    },
    /// An https URL without certificate and key (etcd's message).
    #[error("TLS key/cert ({side}cert-file, {side}key-file) must be provided for {side}url with HTTPS scheme")]
    MissingCertificate {
        /// "--" or "--peer-".
        side: &'static str,
    },
    /// `--client-cert-auth` without a CA to verify against.
    #[error("{side}client-cert-auth needs {side}trusted-ca-file")]
    ClientCertAuthNeedsCa {
        /// "--" or "--peer-".
        side: &'static str,
    },
    /// The certificate and key do not form a usable identity.
    #[error("certificate {cert} and key {key}: {source}")]
    Identity {
        /// The certificate file.
        cert: String,
        /// The key file.
        key: String,
        /// Why.
        source: rustls::Error,
    },
    /// rustls refused the configuration.
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    /// The client certificate verifier cannot be built.
    #[error(transparent)]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

fn pem_error(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(rustls::pki_types::pem::Error) -> TlsError {
    let path = path.display().to_string();
    move |source| TlsError::Pem { what, path, source }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(pem_error("read certificates", path))?
        .collect();
    let certs = certs.map_err(pem_error("parse certificates", path))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.display().to_string()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(pem_error("read private key", path))
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in read_certs(path)? {
        store.add(cert).map_err(|source| TlsError::TrustedCa {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(store)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsFiles {
    /// True if a certificate is configured.
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }

    fn cert_and_key(&self, side: &'static str) -> Result<(&Path, &Path), TlsError> {
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Ok((c, k)),
            _ => Err(TlsError::MissingCertificate { side }),
        }
    }

    /// The rustls server configuration (`side` is "--" or "--peer-" for
    /// error messages).
    pub fn server_config(&self, side: &'static str) -> Result<Arc<ServerConfig>, TlsError> {
        let (cert, key) = self.cert_and_key(side)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        // As etcd 3.5: a trusted CA file alone already makes client
        // certificates mandatory (`TrustedCAFile != "" || ClientCertAuth`).
        let builder = match (&self.trusted_ca, self.client_cert_auth) {
            (Some(ca), _) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                        .build()?;
                builder.with_client_cert_verifier(verifier)
            }
            (None, true) => {
                return Err(TlsError::ClientCertAuthNeedsCa { side });
            }
            (None, false) => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|source| TlsError::Identity {
                cert: cert.display().to_string(),
                key: key.display().to_string(),
                source,
            })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// tonic's server TLS settings (peer port).
    pub fn tonic_server(&self) -> Result<tonic::transport::ServerTlsConfig, TlsError> {
        let (cert, key) = self.cert_and_key("--peer-")?;
        let read = read_file;
        let mut config = tonic::transport::ServerTlsConfig::new().identity(
            tonic::transport::Identity::from_pem(read(cert)?, read(key)?),
        );
        if let Some(ca) = &self.trusted_ca {
            config = config
                .client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?))
                .client_auth_optional(false);
        }
        Ok(config)
    }

    /// tonic's client TLS settings (dialing peers).
    pub fn tonic_client(&self) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
        let read = read_file;
        let mut config = tonic::transport::ClientTlsConfig::new();
        if let Some(ca) = &self.trusted_ca {
            config = config.ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            config = config.identity(tonic::transport::Identity::from_pem(
                read(cert)?,
                read(key)?,
            ));
        }
        Ok(config)
    }
}

/// An axum listener that hands out TLS connections. A background task
/// accepts TCP connections and runs each handshake in its own task (bounded
/// by [`HANDSHAKE_TIMEOUT`], at most [`MAX_PENDING_HANDSHAKES`] at once), so
/// one slow client cannot delay others.
pub struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, ClientPeer)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener` with `config`.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let (tx, incoming) = mpsc::channel(ACCEPT_QUEUE);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, addr) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                if tx.is_closed() {
                    return;
                }
                let (acceptor, conn_tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                    drop(slot);
                    match handshake {
                        Ok(Ok(tls)) => {
                            let peer = ClientPeer {
                                addr,
                                common_name: peer_common_name(&tls),
                            };
                            let _ = conn_tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(peer = %addr, error = %e, "TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(peer = %addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { incoming, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = ClientPeer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(c) => c,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(ClientPeer {
            addr: self.local,
            common_name: None,
        })
    }
}

/// A TLS client connection: its address and, if it presented a verified
/// certificate, that certificate's common name. Handlers find it in the
/// request extensions as `axum::extract::ConnectInfo<ClientPeer>`.
#[derive(Debug, Clone)]
pub struct ClientPeer {
    /// The client's address.
    pub addr: SocketAddr,
    /// CN of the client certificate.
    pub common_name: Option<String>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for ClientPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// The subject common name of the client's (verified) leaf certificate.
fn peer_common_name(tls: &TlsStream<TcpStream>) -> Option<String> {
    let leaf = tls.get_ref().1.peer_certificates()?.first()?;
    let cert = webpki::EndEntityCert::try_from(leaf).ok()?;
    common_name(cert.subject())
}

/// DER tags used in an X.509 Name.
const DER_SEQUENCE: u8 = 0x30;
const DER_SET: u8 = 0x31;
const DER_OID: u8 = 0x06;
/// The attribute type id-at-commonName (2.5.4.3), DER-encoded.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// Splits one DER element off `input`: (tag, contents, rest).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > std::mem::size_of::<usize>() || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The first commonName in the contents of an X.509 Name (a sequence of
/// SETs of `SEQUENCE { type OID, value }`); string types are read as UTF-8.
fn common_name(mut name: &[u8]) -> Option<String> {
    while !name.is_empty() {
        let (tag, mut set, rest) = der_element(name)?;
        name = rest;
        if tag != DER_SET {
            return None;
        }
        while !set.is_empty() {
            let (tag, attribute, rest) = der_element(set)?;
            set = rest;
            if tag != DER_SEQUENCE {
                return None;
            }
            let (tag, oid, value) = der_element(attribute)?;
            if tag == DER_OID && oid == OID_COMMON_NAME {
                let (_, text, _) = der_element(value)?;
                return String::from_utf8(text.to_vec()).ok();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SET { SEQUENCE { OID, UTF8String } }`.
    fn rdn(oid: &[u8], value: &str) -> Vec<u8> {
        let mut attr = vec![DER_OID, oid.len() as u8];
        attr.extend_from_slice(oid);
        attr.extend_from_slice(&[0x0c, value.len() as u8]);
        attr.extend_from_slice(value.as_bytes());
        let mut seq = vec![DER_SEQUENCE, attr.len() as u8];
        seq.extend(attr);
        let mut set = vec![DER_SET, seq.len() as u8];
        set.extend(seq);
        set
    }

    #[test]
    fn finds_the_common_name_among_other_attributes() {
        let organization = [0x55, 0x04, 0x0a];
        let mut name = rdn(&organization, "system:masters");
        name.extend(rdn(OID_COMMON_NAME, "kube-apiserver-etcd-client"));
        assert_eq!(
            common_name(&name).as_deref(),
            Some("kube-apiserver-etcd-client")
        );
        assert_eq!(common_name(&rdn(&organization, "x")), None);
    }

    #[test]
    fn malformed_names_yield_nothing() {
        let name = rdn(OID_COMMON_NAME, "alice");
        for cut in 0..name.len() {
            assert_eq!(common_name(&name[..cut]), None, "cut at {cut}");
        }
        assert_eq!(common_name(&[DER_SET, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn long_form_lengths_are_read() {
        let long = "a".repeat(200);
        let mut attr = vec![DER_OID, 3, 0x55, 0x04, 0x03, 0x0c, 0x81, 200];
        attr.extend_from_slice(long.as_bytes());
        let mut seq = vec![DER_SEQUENCE, 0x81, attr.len() as u8];
        seq.extend(attr);
        let mut set = vec![DER_SET, 0x81, seq.len() as u8];
        set.extend(seq);
        assert_eq!(common_name(&set), Some(long));
    }
}
