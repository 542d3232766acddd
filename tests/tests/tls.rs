//! TLS on the client and the peer port, with etcd's flags.
//!
//! Every test generates its own PKI (rcgen): a CA, one server certificate per
//! member (SANs: the member's loopback IP and `localhost`; server and client
//! auth, as etcd's documentation issues peer certificates), a client
//! certificate with CN `kube-apiserver-etcd-client`, and a client
//! certificate signed by another CA that the members do not trust.
//!
//! - Client mTLS on a single member (`--listen-client-urls https://IP:2379
//!   --cert-file --key-file --trusted-ca-file --client-cert-auth`):
//!   - `client_certificate_grants_access`: etcdctl with `--cacert --cert
//!     --key` (what kube-apiserver's `--etcd-cafile/--etcd-certfile/
//!     --etcd-keyfile` amount to) puts and reads back, and so does
//!     etcd-client with a CA and an identity; each sees the other's writes.
//!   - `clients_without_a_trusted_certificate_are_refused`: etcdctl with the
//!     CA but no client certificate, etcdctl with a certificate of the
//!     untrusted CA, etcdctl speaking plain http to the https port, and the
//!     same three with etcd-client, all fail (etcdctl: non-zero exit, nothing
//!     on stdout) and none of their writes exists afterwards.
//! - `trusted_ca_file_alone_requires_client_certificates`: the same member
//!   without `--client-cert-auth` still refuses clients without a trusted
//!   certificate, as etcd 3.5 does whenever `--trusted-ca-file` is set.
//! - Peer TLS (`peer_tls_cluster_replicates_and_refuses_uncertified_peers`):
//!   3 members with https peer URLs and `--peer-cert-file --peer-key-file
//!   --peer-trusted-ca-file --peer-client-cert-auth` (client URLs plain
//!   http) elect a leader all agree on; a write through each member is read
//!   (serializable, i.e. member-local) on every member with the same mod
//!   revision; a raw TLS client (rustls) on a peer port is refused without a
//!   client certificate and with the untrusted CA's certificate, while the
//!   same probe with a member certificate is not refused (control).
//!
//! Every scenario runs against real etcd 3.5 (`etcd35::`) and the candidate
//! (`candidate::`) with the same assertions. The members are started by this
//! file (the harness's [`integration_tests::Cluster`] only speaks http) with
//! the harness's [`Process`], [`MemberFlags`] and [`pki`] certificates.
//!
//! Run: `STORE_BIN=/root/.cache/etcd-rs/target/release/store cargo test -p integration-tests --test integration tls::`
//! (`STORE_BIN=/opt/etcd-3.5/etcd` runs both modules against etcd).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{Client, GetOptions, TlsOptions};
use integration_tests::client::{check_serving, connect, connect_tls, describe_error};
use integration_tests::cluster;
use integration_tests::net::{
    allocate_ip, client_url, https_client_url, https_peer_url, peer_url, PEER_PORT,
};
use integration_tests::pki::{self, Ca, CertFiles};
use integration_tests::wait::retry_until;
use integration_tests::writer::served;
use integration_tests::{
    against_both, Binary, ClusterConfig, CtlOutput, Etcdctl, MemberFlags, Process, Server,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Members of the peer-TLS cluster.
const MEMBERS: usize = 3;
/// CN of the client certificate (kube-apiserver's usual etcd client name).
const CLIENT_CN: &str = "kube-apiserver-etcd-client";
/// Deadline for members to start and serve a linearizable read.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline for the members to agree on a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for a member's serializable reads to show the writes of others.
const CONVERGENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// etcdctl's `--command-timeout` for commands that must be refused (a
/// refused TLS handshake makes etcdctl retry until this passes; the
/// harness's default of 20 s would only make the test slower).
const REFUSED_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound of one refused etcd-client attempt (connect plus one request).
const REFUSED_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of the TCP connect plus TLS handshake of the raw peer-port probe.
const PROBE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the raw peer-port probe waits for the server's answer (a
/// refusing server sends its alert or closes well within this).
const PROBE_READ_TIMEOUT: Duration = Duration::from_secs(3);
/// Keys written through each member of the peer-TLS cluster.
const KEYS_PER_MEMBER: usize = 5;

fn etcdctl35() -> Binary {
    Binary::etcdctl35().expect("etcdctl 3.5")
}

// ---------------------------------------------------------------------------
// Per-run PKI.
// ---------------------------------------------------------------------------

/// Everything one test run needs: the trusted CA, a server certificate per
/// member, a client certificate, and a client certificate of an untrusted CA.
struct Pki {
    ca: Ca,
    ca_file: PathBuf,
    members: Vec<CertFiles>,
    client: CertFiles,
    untrusted_client: CertFiles,
}

impl Pki {
    fn generate(dir: &Path, member_ips: &[Ipv4Addr]) -> Result<Self> {
        let ca = Ca::new("etcd-it-ca")?;
        let other_ca = Ca::new("etcd-it-untrusted-ca")?;
        let ca_file = ca.write_ca(dir, "ca")?;
        other_ca.write_ca(dir, "untrusted-ca")?;
        let members = member_ips
            .iter()
            .enumerate()
            .map(|(i, ip)| {
                ca.peer(
                    dir,
                    &format!("m{i}"),
                    &[ip.to_string(), "localhost".to_string()],
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let client = ca.client(dir, "client", CLIENT_CN)?;
        let untrusted_client = other_ca.client(dir, "untrusted-client", CLIENT_CN)?;
        Ok(Self {
            ca,
            ca_file,
            members,
            client,
            untrusted_client,
        })
    }

    /// etcdctl flags of a client that trusts the CA and presents `identity`.
    fn etcdctl_flags(&self, identity: Option<&CertFiles>) -> Vec<String> {
        pki::etcdctl_flags(&self.ca_file, identity)
    }

    /// etcd-client TLS options that trust the CA and present `identity`.
    fn tls_options(&self, identity: Option<&CertFiles>) -> Result<TlsOptions> {
        pki::tls_options(&self.ca_file, identity)
    }
}

// ---------------------------------------------------------------------------
// Member processes started by this file.
// ---------------------------------------------------------------------------

/// Members started by a test, in one temporary directory with their PKI.
struct TlsCluster {
    ips: Vec<Ipv4Addr>,
    pki: Pki,
    client_tls: bool,
    members: Vec<Process>,
    dir: tempfile::TempDir,
}

/// Which side of the members speaks TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// https client URLs with `--client-cert-auth`; plain http peers.
    ClientMtls,
    /// https client URLs with `--trusted-ca-file` but without
    /// `--client-cert-auth`; plain http peers.
    ClientCaOnly,
    /// https peer URLs with `--peer-client-cert-auth`; plain http clients.
    PeerMtls,
}

impl TlsCluster {
    fn start(binary: &Binary, size: usize, mode: Mode) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("etcd-it-tls-")
            .tempdir()
            .context("creating the test's temporary directory")?;
        let ips = (0..size)
            .map(|_| allocate_ip())
            .collect::<Result<Vec<_>>>()?;
        let pki = Pki::generate(dir.path(), &ips)?;
        let client_tls = mode != Mode::PeerMtls;
        let peer_tls = mode == Mode::PeerMtls;
        let peer_urls: Vec<String> = ips
            .iter()
            .map(|ip| {
                if peer_tls {
                    https_peer_url(*ip)
                } else {
                    peer_url(*ip)
                }
            })
            .collect();
        let initial_cluster = cluster::initial_cluster(&peer_urls);
        let token = cluster::new_token("it-tls");
        let config = ClusterConfig::new(size);
        let mut members = Vec::new();
        for (i, ip) in ips.iter().enumerate() {
            let name = cluster::member_name(i);
            let certs = &pki.members[i];
            let mut flags = MemberFlags::new(&name, *ip, dir.path(), &initial_cluster, &token);
            flags.peer_url = peer_urls[i].clone();
            flags.advertise_peer_url = peer_urls[i].clone();
            if client_tls {
                flags.client_url = https_client_url(*ip);
            }
            let mut args = flags.args(&config);
            if client_tls {
                args.extend([
                    format!("--cert-file={}", certs.cert.display()),
                    format!("--key-file={}", certs.key.display()),
                    format!("--trusted-ca-file={}", pki.ca_file.display()),
                ]);
                if mode == Mode::ClientMtls {
                    args.push("--client-cert-auth".to_string());
                }
            }
            if peer_tls {
                args.extend([
                    format!("--peer-cert-file={}", certs.cert.display()),
                    format!("--peer-key-file={}", certs.key.display()),
                    format!("--peer-trusted-ca-file={}", pki.ca_file.display()),
                    "--peer-client-cert-auth".to_string(),
                ]);
            }
            let log = dir.path().join(format!("{name}.log"));
            members.push(Process::start(binary, &name, &log, &args)?);
        }
        Ok(Self {
            ips,
            pki,
            client_tls,
            members,
            dir,
        })
    }

    fn endpoint(&self, i: usize) -> String {
        if self.client_tls {
            https_client_url(self.ips[i])
        } else {
            client_url(self.ips[i])
        }
    }

    /// An etcd-client to member `i` (with the trusted client certificate if
    /// the client port speaks TLS).
    async fn client(&self, i: usize) -> Result<Client> {
        if !self.client_tls {
            return connect(&[self.endpoint(i)]).await;
        }
        let tls = self.pki.tls_options(Some(&self.pki.client))?;
        connect_tls(&[self.endpoint(i)], tls).await
    }

    /// etcdctl 3.5 on member `i` (TLS flags are given per command).
    fn etcdctl(&self, i: usize) -> Etcdctl {
        Etcdctl::new(etcdctl35(), vec![self.endpoint(i)])
    }

    async fn member_ready(&self, i: usize) -> Result<u64> {
        self.members[i].ensure_running()?;
        let mut client = self.client(i).await?;
        let status = check_serving(&mut client)
            .await
            .with_context(|| format!("member {i}"))?;
        Ok(status.leader())
    }

    /// Waits until every member knows a leader and serves a linearizable read.
    async fn wait_ready(&self) -> Result<()> {
        retry_until("all members to be healthy", STARTUP_TIMEOUT, || async {
            for i in 0..self.members.len() {
                self.member_ready(i).await?;
            }
            Ok(())
        })
        .await
        .with_context(|| self.log_tails())
    }

    /// The leader's member id, once every member reports the same one.
    async fn agreed_leader(&self) -> Result<u64> {
        retry_until("a leader all members agree on", LEADER_TIMEOUT, || async {
            let mut leaders = Vec::new();
            for i in 0..self.members.len() {
                leaders.push(self.member_ready(i).await?);
            }
            ensure!(
                leaders.iter().all(|&l| l == leaders[0]),
                "members disagree on the leader: {leaders:x?}"
            );
            Ok(leaders[0])
        })
        .await
        .with_context(|| self.log_tails())
    }

    fn log_tails(&self) -> String {
        self.members.iter().map(Process::log_tail).collect()
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        if std::env::var_os("IT_KEEP_DATA").is_some() {
            let dir = std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().expect("a replacement temporary directory"),
            );
            eprintln!("keeping test data in {}", dir.keep().display());
        }
    }
}

/// Runs etcdctl with TLS flags plus `args`.
async fn ctl(etcdctl: &Etcdctl, tls: &[String], args: &[&str]) -> Result<CtlOutput> {
    let mut all: Vec<&str> = tls.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    etcdctl.run(&all).await
}

fn ensure_refused(what: &str, output: &CtlOutput) -> Result<()> {
    ensure!(
        !output.success() && output.stdout.trim().is_empty(),
        "{what} was not refused (expected a non-zero exit and nothing on stdout):\n{output}"
    );
    Ok(())
}

/// Connects with etcd-client (with `tls` if given) and tries a put of `key`;
/// an error if that succeeds. Returns the error's description.
async fn ensure_client_refused(
    what: &str,
    endpoint: &str,
    tls: Option<TlsOptions>,
    key: &str,
) -> Result<String> {
    let attempt = async {
        let mut client = match tls {
            Some(tls) => connect_tls(&[endpoint.to_string()], tls).await?,
            None => connect(&[endpoint.to_string()]).await?,
        };
        client.put(key, "must-not-be-written", None).await?;
        Ok::<_, anyhow::Error>(())
    };
    match timeout(REFUSED_ATTEMPT_TIMEOUT, attempt).await {
        Ok(Ok(())) => bail!("{what}: etcd-client put {key:?} succeeded"),
        Ok(Err(error)) => Ok(format!("{error:#}")),
        Err(_) => Ok(format!("no answer within {REFUSED_ATTEMPT_TIMEOUT:?}")),
    }
}

// ---------------------------------------------------------------------------
// Raw TLS probe of a peer port.
// ---------------------------------------------------------------------------

/// What a TLS client saw on a peer port.
#[derive(Debug)]
struct ProbeOutcome {
    /// The handshake or the first read failed (alert, reset, EOF without
    /// close_notify): the server refused the client. Otherwise the server
    /// answered (bytes), closed cleanly, or kept waiting.
    refused: bool,
    /// What happened, for messages.
    detail: String,
}

impl ProbeOutcome {
    fn refused(detail: String) -> Self {
        Self {
            refused: true,
            detail,
        }
    }

    fn accepted(detail: String) -> Self {
        Self {
            refused: false,
            detail,
        }
    }
}

/// Connects to `ip:PEER_PORT` with TLS trusting `ca`, presenting
/// `identity` if given, sends an HTTP/1.1 request for `/version` (what etcd's
/// peer handler serves) and reads the first answer.
async fn probe_peer_port(
    ip: Ipv4Addr,
    ca: &Ca,
    identity: Option<&CertFiles>,
) -> Result<ProbeOutcome> {
    use rustls::pki_types::ServerName;

    let config = ca.rustls_client(identity)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let server_name = ServerName::IpAddress(std::net::IpAddr::V4(ip).into());
    let tcp = timeout(PROBE_HANDSHAKE_TIMEOUT, TcpStream::connect((ip, PEER_PORT)))
        .await
        .context("TCP connect to the peer port timed out")?
        .context("TCP connect to the peer port")?;
    let mut tls = match timeout(PROBE_HANDSHAKE_TIMEOUT, connector.connect(server_name, tcp)).await
    {
        Err(_) => {
            return Ok(ProbeOutcome::refused(format!(
                "handshake did not finish within {PROBE_HANDSHAKE_TIMEOUT:?}"
            )))
        }
        Ok(Err(error)) => return Ok(ProbeOutcome::refused(format!("handshake: {error}"))),
        Ok(Ok(tls)) => tls,
    };
    let request = format!("GET /version HTTP/1.1\r\nHost: {ip}:{PEER_PORT}\r\n\r\n");
    if let Err(error) = tls.write_all(request.as_bytes()).await {
        return Ok(ProbeOutcome::refused(format!("write: {error}")));
    }
    let _ = tls.flush().await;
    let mut buffer = vec![0u8; 4096];
    Ok(
        match timeout(PROBE_READ_TIMEOUT, tls.read(&mut buffer)).await {
            Err(_) => ProbeOutcome::accepted(format!("no answer within {PROBE_READ_TIMEOUT:?}")),
            Ok(Ok(0)) => ProbeOutcome::accepted("clean close (close_notify)".to_string()),
            Ok(Ok(n)) => ProbeOutcome::accepted(format!(
                "{n} bytes: {:?}",
                String::from_utf8_lossy(&buffer[..n.min(80)])
            )),
            Ok(Err(error)) => ProbeOutcome::refused(format!("read: {error}")),
        },
    )
}

// ---------------------------------------------------------------------------
// Scenarios.
// ---------------------------------------------------------------------------

/// etcdctl and etcd-client with a CA-signed client certificate read and
/// write, and see each other's writes.
async fn client_certificate_grants_access(server: Server) {
    let run = async {
        let cluster = TlsCluster::start(&server.binary(), 1, Mode::ClientMtls)?;
        cluster.wait_ready().await?;
        let pki = &cluster.pki;
        let etcdctl = cluster.etcdctl(0);
        let with_cert = pki.etcdctl_flags(Some(&pki.client));

        let put = ctl(&etcdctl, &with_cert, &["put", "tls/ctl", "from-etcdctl"]).await?;
        ensure!(
            put.success() && put.stdout.trim() == "OK",
            "etcdctl put with a client certificate:\n{put}"
        );
        let get = ctl(
            &etcdctl,
            &with_cert,
            &["get", "tls/ctl", "--print-value-only"],
        )
        .await?;
        ensure!(
            get.success() && get.stdout.trim() == "from-etcdctl",
            "etcdctl get with a client certificate:\n{get}"
        );
        let health = ctl(&etcdctl, &with_cert, &["endpoint", "health"]).await?;
        ensure!(
            health.success() && health.stdout.contains("is healthy"),
            "etcdctl endpoint health with a client certificate:\n{health}"
        );

        let mut client = cluster.client(0).await?;
        let from_ctl = client.get("tls/ctl", None).await?;
        ensure!(
            from_ctl.kvs().len() == 1 && from_ctl.kvs()[0].value() == b"from-etcdctl",
            "etcd-client (TLS) does not read etcdctl's write: {from_ctl:?}"
        );
        client.put("tls/client", "from-etcd-client", None).await?;
        let both = client
            .get("tls/", Some(GetOptions::new().with_prefix()))
            .await?;
        let keys: Vec<&[u8]> = both.kvs().iter().map(|kv| kv.key()).collect();
        ensure!(
            keys == [b"tls/client".as_slice(), b"tls/ctl".as_slice()],
            "etcd-client (TLS) prefix read: {keys:?}"
        );
        let get = ctl(
            &etcdctl,
            &with_cert,
            &["get", "tls/client", "--print-value-only"],
        )
        .await?;
        ensure!(
            get.success() && get.stdout.trim() == "from-etcd-client",
            "etcdctl does not read etcd-client's write:\n{get}"
        );
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

/// Clients without a certificate, with an untrusted CA's certificate, or
/// speaking plain http are refused, and none of their writes exists.
async fn clients_without_a_trusted_certificate_are_refused(server: Server) {
    let run = async {
        let cluster = TlsCluster::start(&server.binary(), 1, Mode::ClientMtls)?;
        cluster.wait_ready().await?;
        let pki = &cluster.pki;
        let etcdctl = cluster.etcdctl(0);
        let endpoint = cluster.endpoint(0);
        let ip = cluster.ips[0];

        // A key that exists, so a refused get cannot pass by "no such key".
        let mut trusted = cluster.client(0).await?;
        trusted.put("refused/existing", "secret", None).await?;

        let short = format!("--command-timeout={}s", REFUSED_COMMAND_TIMEOUT.as_secs());
        let mut no_cert = pki.etcdctl_flags(None);
        no_cert.push(short.clone());
        let mut untrusted = pki.etcdctl_flags(Some(&pki.untrusted_client));
        untrusted.push(short.clone());
        let cases: [(&str, &[String]); 2] = [
            ("etcdctl with --cacert and no client certificate", &no_cert),
            (
                "etcdctl with a client certificate of an untrusted CA",
                &untrusted,
            ),
        ];
        for (what, flags) in cases {
            let put = ctl(&etcdctl, flags, &["put", "refused/ctl", "x"]).await?;
            ensure_refused(&format!("{what}: put"), &put)?;
            let get = ctl(&etcdctl, flags, &["get", "refused/existing"]).await?;
            ensure_refused(&format!("{what}: get"), &get)?;
        }

        // Plain http to the https port.
        let plain = Etcdctl::new(etcdctl35(), vec![client_url(ip)]);
        let put = plain.run(&[&short, "put", "refused/plain", "x"]).await?;
        ensure_refused("etcdctl over plain http to the https port: put", &put)?;
        let get = plain.run(&[&short, "get", "refused/existing"]).await?;
        ensure_refused("etcdctl over plain http to the https port: get", &get)?;

        // The same with etcd-client.
        let mut refusals = Vec::new();
        refusals.push(
            ensure_client_refused(
                "etcd-client with the CA and no identity",
                &endpoint,
                Some(pki.tls_options(None)?),
                "refused/client-no-cert",
            )
            .await?,
        );
        refusals.push(
            ensure_client_refused(
                "etcd-client with an untrusted CA's identity",
                &endpoint,
                Some(pki.tls_options(Some(&pki.untrusted_client))?),
                "refused/client-untrusted",
            )
            .await?,
        );
        refusals.push(
            ensure_client_refused(
                "etcd-client over plain http to the https port",
                &client_url(ip),
                None,
                "refused/client-plain",
            )
            .await?,
        );
        eprintln!("{server:?}: etcd-client refusals: {refusals:#?}");

        // Nothing a refused client tried to write exists; the trusted client
        // still works.
        let mut trusted = cluster.client(0).await?;
        let all = trusted
            .get("refused/", Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| anyhow::anyhow!(describe_error(&e)))?;
        let keys: Vec<String> = all
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        ensure!(
            keys == ["refused/existing"],
            "keys under refused/ after the refused clients: {keys:?}"
        );
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

/// etcd 3.5 requires and verifies client certificates as soon as
/// `--trusted-ca-file` is given, even without `--client-cert-auth`
/// (`transport.TLSInfo.ServerConfig`: `TrustedCAFile != "" || ClientCertAuth`
/// selects `tls.RequireAndVerifyClientCert`): a drop-in must not open the
/// port to certificate-less clients when an operator left the flag out.
async fn trusted_ca_file_alone_requires_client_certificates(server: Server) {
    let run = async {
        let cluster = TlsCluster::start(&server.binary(), 1, Mode::ClientCaOnly)?;
        cluster.wait_ready().await?;
        let pki = &cluster.pki;
        let etcdctl = cluster.etcdctl(0);
        let short = format!("--command-timeout={}s", REFUSED_COMMAND_TIMEOUT.as_secs());

        let with_cert = pki.etcdctl_flags(Some(&pki.client));
        let put = ctl(&etcdctl, &with_cert, &["put", "ca-only/ok", "v"]).await?;
        ensure!(
            put.success() && put.stdout.trim() == "OK",
            "etcdctl put with a client certificate:\n{put}"
        );

        let mut no_cert = pki.etcdctl_flags(None);
        no_cert.push(short.clone());
        let put = ctl(&etcdctl, &no_cert, &["put", "ca-only/no-cert", "x"]).await?;
        ensure_refused("etcdctl with --cacert and no client certificate: put", &put)?;
        let mut untrusted = pki.etcdctl_flags(Some(&pki.untrusted_client));
        untrusted.push(short);
        let put = ctl(&etcdctl, &untrusted, &["put", "ca-only/untrusted", "x"]).await?;
        ensure_refused("etcdctl with an untrusted CA's certificate: put", &put)?;

        let mut client = cluster.client(0).await?;
        let keys: Vec<String> = client
            .get("ca-only/", Some(GetOptions::new().with_prefix()))
            .await?
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        ensure!(
            keys == ["ca-only/ok"],
            "keys under ca-only/ after the refused clients: {keys:?}"
        );
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

/// 3 members with mutual TLS between peers: leader, replication, and a peer
/// port that refuses TLS clients without a trusted certificate.
async fn peer_tls_cluster_replicates_and_refuses_uncertified_peers(server: Server) {
    let run = async {
        let cluster = TlsCluster::start(&server.binary(), MEMBERS, Mode::PeerMtls)?;
        cluster.wait_ready().await?;
        let leader = cluster.agreed_leader().await?;
        ensure!(leader != 0, "no leader");

        // Writes through every member.
        let mut expected = Vec::new();
        for i in 0..MEMBERS {
            let mut client = cluster.client(i).await?;
            for k in 0..KEYS_PER_MEMBER {
                let key = format!("peer/m{i}/{k}");
                let value = format!("written-through-m{i}-{k}");
                let put = client
                    .put(key.as_str(), value.as_str(), None)
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!("put {key} through m{i}: {}", describe_error(&e))
                    })?;
                let revision = put.header().context("put without header")?.revision();
                expected.push((key, value, revision));
            }
        }
        expected.sort();

        // Every member serves all of them locally (serializable), with the
        // revision the write was acknowledged at.
        for i in 0..MEMBERS {
            retry_until(
                &format!("m{i} to serve every write serializably"),
                CONVERGENCE_TIMEOUT,
                || async {
                    let mut client = cluster.client(i).await?;
                    let got = client
                        .get(
                            "peer/",
                            Some(GetOptions::new().with_prefix().with_serializable()),
                        )
                        .await?;
                    let got: Vec<(String, String, i64)> = served(&got)
                        .into_iter()
                        .map(|(key, (value, revision))| (key, value, revision))
                        .collect();
                    ensure!(
                        got == expected,
                        "m{i} serves {got:?}, expected {expected:?}"
                    );
                    Ok(())
                },
            )
            .await
            .with_context(|| cluster.log_tails())?;
        }

        // The peer ports: refused without a certificate and with an untrusted
        // CA's certificate; the member certificate is the control that the
        // probe itself can get through.
        let pki = &cluster.pki;
        for (i, ip) in cluster.ips.iter().enumerate() {
            let no_cert = probe_peer_port(*ip, &pki.ca, None).await?;
            ensure!(
                no_cert.refused,
                "m{i}'s peer port accepted a TLS client without a certificate: {no_cert:?}"
            );
            let untrusted = probe_peer_port(*ip, &pki.ca, Some(&pki.untrusted_client)).await?;
            ensure!(
                untrusted.refused,
                "m{i}'s peer port accepted an untrusted CA's certificate: {untrusted:?}"
            );
            let peer = (i + 1) % MEMBERS;
            let control = probe_peer_port(*ip, &pki.ca, Some(&pki.members[peer])).await?;
            ensure!(
                !control.refused,
                "m{i}'s peer port refused m{peer}'s certificate: {control:?}"
            );
            eprintln!(
                "{server:?}: m{i} peer port: no cert -> {}; untrusted -> {}; m{peer}'s cert -> {}",
                no_cert.detail, untrusted.detail, control.detail
            );
        }

        // Still one leader and still writable after the probes.
        cluster.agreed_leader().await?;
        cluster
            .client(0)
            .await?
            .put("peer/after", "probes", None)
            .await?;
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

/// More connections that never start a TLS handshake than the candidate
/// handshakes at once (`store::tls::MAX_PENDING_HANDSHAKES`, 1,024).
const STALLED_CONNECTIONS: usize = 1_100;
/// How long a new client may wait for its handshake meanwhile: the
/// candidate's handshake deadline (10 s) frees the slots, plus margin.
const NEW_CLIENT_DEADLINE: Duration = Duration::from_secs(30);

/// A flood of TCP connections that never finish a TLS handshake: a client
/// connected before it keeps writing, a new client is served (at the
/// latest once the stalled handshakes time out), and the candidate closes
/// the stalled connections after its handshake deadline.
async fn stalled_handshakes_leave_writes_flowing(server: Server) {
    let run = async {
        let cluster = TlsCluster::start(&server.binary(), 1, Mode::ClientMtls)?;
        cluster.wait_ready().await?;
        let mut before = cluster.client(0).await?;
        before.put("flood/before", "v", None).await?;
        let addr = std::net::SocketAddr::from((cluster.ips[0], 2379));
        let mut stalled = Vec::with_capacity(STALLED_CONNECTIONS);
        for _ in 0..STALLED_CONNECTIONS {
            stalled.push(tokio::net::TcpStream::connect(addr).await?);
        }
        for i in 0..10 {
            before.put(format!("flood/during/{i}"), "v", None).await?;
        }
        let mut fresh = tokio::time::timeout(NEW_CLIENT_DEADLINE, cluster.client(0))
            .await
            .context("a new TLS client was not served during the flood")??;
        fresh.put("flood/new-client", "v", None).await?;
        if matches!(server, Server::Candidate) {
            let mut buf = [0u8; 1];
            let closed = tokio::time::timeout(
                NEW_CLIENT_DEADLINE,
                tokio::io::AsyncReadExt::read(&mut stalled[0], &mut buf),
            )
            .await
            .context("a stalled connection was not closed")?;
            ensure!(matches!(closed, Ok(0) | Err(_)), "read {closed:?}");
        }
        let all = fresh
            .get(
                "flood/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await?;
        ensure!(all.count() == 12, "keys written: {}", all.count());
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

against_both!(
    stalled_handshakes_leave_writes_flowing,
    client_certificate_grants_access,
    clients_without_a_trusted_certificate_are_refused,
    trusted_ca_file_alone_requires_client_certificates,
    peer_tls_cluster_replicates_and_refuses_uncertified_peers,
);
