//! The health-check TLS client: `verify none` (kubeadm's HAProxy setting) or a CA bundle,
//! optionally with a client certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::error::TlsSetupError;
use crate::config::{CheckTls, Verify};

/// Builds the rustls client configuration for HTTPS checks (ALPN `http/1.1`).
pub fn client_config(tls: &CheckTls) -> Result<Arc<ClientConfig>, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &tls.verify {
        Verify::None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate { provider })),
        Verify::CaFile(path) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates(path, "CA bundle")? {
                roots.add(certificate)?;
            }
            builder.with_root_certificates(roots)
        }
    };
    let mut config = match &tls.client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = certificates(cert, "client certificate")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|error| pem_error("client key", key, error))?;
            builder.with_client_auth_cert(chain, key)?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn certificates(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| pem_error(what, path, error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(what, path, error))?;
    if certificates.is_empty() {
        return Err(TlsSetupError::Pem {
            what,
            path: path.to_path_buf(),
            message: "no certificate found".to_string(),
        });
    }
    Ok(certificates)
}

fn pem_error(
    what: &'static str,
    path: &Path,
    error: rustls::pki_types::pem::Error,
) -> TlsSetupError {
    TlsSetupError::Pem {
        what,
        path: path.to_path_buf(),
        message: error.to_string(),
    }
}

/// `verify none`: any certificate chain is accepted, but handshake signatures are still
/// checked so the peer must hold the key of the certificate it presents.
#[derive(Debug)]
struct AcceptAnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
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
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
