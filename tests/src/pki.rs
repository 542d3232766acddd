//! Per-run certificates (rcgen): one PKI helper for the store, TLS, auth and
//! gateway tests.
//!
//! A [`Ca`] is a self-signed certificate authority (X.509 v3, `keyCertSign`)
//! that issues leaf certificates with a common name, subject alternative
//! names (IP addresses or DNS names) and extended key usages, as kubeadm
//! issues them:
//!
//! - [`Ca::server`]: `serverAuth` (kube-apiserver, nginx, an etcd client port);
//! - [`Ca::peer`]: `serverAuth` and `clientAuth` (an etcd member: it serves
//!   its peers and connects to them, as etcd's documentation issues them);
//! - [`Ca::client`]: `clientAuth` only (kube-apiserver's etcd client).
//!
//! [`Ca::write`] puts an issued certificate and its key into PEM files
//! ([`CertFiles`]) for the flags of etcd, etcdctl or nginx; [`tls_options`]
//! and [`etcdctl_flags`] turn those files into etcd-client TLS options and
//! etcdctl's `--cacert --cert --key`;
//! [`Ca::rustls_client`] is a raw rustls client configuration trusting
//! only this CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use etcd_client::{Certificate, Identity, TlsOptions};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// `serverAuth`: a TLS server.
pub const SERVER: &[ExtendedKeyUsagePurpose] = &[ExtendedKeyUsagePurpose::ServerAuth];
/// `serverAuth` and `clientAuth`: an etcd member (serves and dials peers).
pub const PEER: &[ExtendedKeyUsagePurpose] = &[
    ExtendedKeyUsagePurpose::ServerAuth,
    ExtendedKeyUsagePurpose::ClientAuth,
];
/// `clientAuth`: a TLS client with a certificate.
pub const CLIENT: &[ExtendedKeyUsagePurpose] = &[ExtendedKeyUsagePurpose::ClientAuth];

/// A certificate authority: its certificate and signing key.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate issued by a [`Ca`], in PEM, and its DER to recognise it on
/// the wire.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

/// PEM files of one certificate and its key.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    /// A new CA with the common name `name`.
    pub fn new(name: &str) -> Result<Ca> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().context("generating a CA key")?;
        let cert = params.self_signed(&key).context("self-signing the CA")?;
        Ok(Ca { cert, key })
    }

    /// The CA certificate in PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA certificate in DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// Writes the CA certificate to `<dir>/<name>.crt`.
    pub fn write_ca(&self, dir: &Path, name: &str) -> Result<PathBuf> {
        let path = dir.join(format!("{name}.crt"));
        std::fs::write(&path, self.pem()).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Issues a leaf certificate; `sans` are IPs or DNS names.
    pub fn issue(
        &self,
        cn: &str,
        sans: &[String],
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Result<Issued> {
        let mut params = CertificateParams::new(sans.to_vec()).context("certificate SANs")?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().context("generating a leaf key")?;
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .with_context(|| format!("signing the certificate of {cn}"))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        })
    }

    /// A server certificate ([`SERVER`]).
    pub fn server(&self, cn: &str, sans: &[String]) -> Result<Issued> {
        self.issue(cn, sans, SERVER)
    }

    /// Issues a certificate and writes `<dir>/<name>.crt` and `<dir>/<name>.key`.
    pub fn write(
        &self,
        dir: &Path,
        name: &str,
        cn: &str,
        sans: &[String],
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Result<CertFiles> {
        let issued = self.issue(cn, sans, usages)?;
        let files = CertFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert, issued.cert_pem)?;
        std::fs::write(&files.key, issued.key_pem)?;
        Ok(files)
    }

    /// An etcd member's certificate files ([`PEER`]): SANs `sans`.
    pub fn peer(&self, dir: &Path, name: &str, sans: &[String]) -> Result<CertFiles> {
        self.write(dir, name, name, sans, PEER)
    }

    /// A client certificate's files ([`CLIENT`]) with the common name `cn`
    /// (etcd takes it as the user name).
    pub fn client(&self, dir: &Path, name: &str, cn: &str) -> Result<CertFiles> {
        self.write(dir, name, cn, &[], CLIENT)
    }

    /// A rustls client configuration (ring) trusting only this CA,
    /// presenting `identity` if given.
    pub fn rustls_client(&self, identity: Option<&CertFiles>) -> Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.der())
            .context("adding the CA to the roots")?;
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
        Ok(match identity {
            Some(files) => {
                let chain = CertificateDer::pem_file_iter(&files.cert)
                    .context("reading the client certificate")?
                    .collect::<Result<Vec<_>, _>>()?;
                let key =
                    PrivateKeyDer::from_pem_file(&files.key).context("reading the client key")?;
                builder.with_client_auth_cert(chain, key)?
            }
            None => builder.with_no_client_auth(),
        })
    }
}

/// etcd-client TLS options trusting the CA in `ca_file`, presenting
/// `identity` if given.
pub fn tls_options(ca_file: &Path, identity: Option<&CertFiles>) -> Result<TlsOptions> {
    let ca = std::fs::read(ca_file).with_context(|| format!("reading {}", ca_file.display()))?;
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
    if let Some(files) = identity {
        let cert = std::fs::read(&files.cert)?;
        let key = std::fs::read(&files.key)?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

/// etcdctl flags of a client that trusts the CA in `ca_file` and presents
/// `identity` if given.
pub fn etcdctl_flags(ca_file: &Path, identity: Option<&CertFiles>) -> Vec<String> {
    let mut flags = vec![format!("--cacert={}", ca_file.display())];
    if let Some(files) = identity {
        flags.push(format!("--cert={}", files.cert.display()));
        flags.push(format!("--key={}", files.key.display()));
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_files_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("test-ca").unwrap();
        let member = ca
            .peer(dir.path(), "m0", &["127.0.0.1".to_string()])
            .unwrap();
        let client = ca.client(dir.path(), "client", "alice").unwrap();
        for files in [&member, &client] {
            assert!(std::fs::read_to_string(&files.cert)
                .unwrap()
                .starts_with("-----BEGIN CERTIFICATE-----"));
            assert!(files.key.exists());
        }
        let ca_file = ca.write_ca(dir.path(), "ca").unwrap();
        let flags = etcdctl_flags(&ca_file, Some(&client));
        assert_eq!(flags.len(), 3);
        assert!(flags[1].ends_with("client.crt"), "{flags:?}");
        assert_eq!(etcdctl_flags(&ca_file, None).len(), 1);
        ca.rustls_client(Some(&client)).unwrap();
        ca.rustls_client(None).unwrap();
    }
}
