//! Members started with the exact argument lists of kubeadm's etcd static
//! pod manifest (`/etc/kubernetes/manifests/etcd.yaml`), with kubeadm's
//! certificate layout, probed as kubelet probes them and used as
//! kube-apiserver uses them.
//!
//! Two spellings of that command line exist (kubeadm's
//! `cmd/kubeadm/app/phases/etcd/local.go`): kubeadm v1.36 and v1.37 (and
//! v1.34-v1.35 with an etcd image tag of at least 3.6.0) write etcd 3.6's
//! `--feature-gates=InitialCorruptCheck=true` and
//! `--watch-progress-notify-interval=5s`; v1.31-v1.35 with an etcd 3.5 image
//! write `--experimental-initial-corrupt-check=true` and
//! `--experimental-watch-progress-notify-interval=5s`. Both start a
//! three-member stacked cluster the way `kubeadm init` and `kubeadm join
//! --control-plane` build it: the first node alone, each next one added as
//! a learner (`MemberAddAsLearner`), started with the returned members in
//! `--initial-cluster` and `--initial-cluster-state=existing`, then
//! promoted once in sync.
//!
//! Addresses: kubeadm listens on `127.0.0.1` and the node's IP; here two
//! loopback addresses of the harness stand in for them (`local` for
//! `127.0.0.1`, `node` for the node IP), so the test shares no port with
//! other software. Certificates as kubeadm issues them under
//! `/etc/kubernetes/pki`: `etcd/ca`, `etcd/server` and `etcd/peer`
//! (server and client auth, SANs localhost, the addresses), and the client
//! certificates `etcd/healthcheck-client` and `apiserver-etcd-client`.
//!
//! kubelet's probes (kubeadm >= 1.31): startup and readiness `GET /readyz`,
//! liveness `GET /livez`, on `http://127.0.0.1:2381` (the metrics URL).
//!
//! Run: `cargo test --release -p integration-tests --test integration kubeadm_manifest::`

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{ensure, Result};
use etcd_client::GetOptions;
use integration_tests::client::connect_tls;
use integration_tests::etcdctl::Etcdctl;
use integration_tests::http::get;
use integration_tests::net::allocate_ip;
use integration_tests::pki::{etcdctl_flags, tls_options, Ca, CertFiles, CLIENT, PEER};
use integration_tests::wait::retry_until;
use integration_tests::{Binary, Process};

/// kubeadm's startup probe allows 24 failures 10 s apart; a member that
/// starts alone is ready long before.
const STARTUP: Duration = Duration::from_secs(60);

/// The node name kubeadm passes as `--name` and uses as the certificates'
/// common name.
const NODE: &str = "control-plane-1";

/// kubeadm's certificates for one control-plane node.
struct Pki {
    ca: std::path::PathBuf,
    server: CertFiles,
    peer: CertFiles,
    apiserver_client: CertFiles,
    healthcheck_client: CertFiles,
}

fn kubeadm_pki(dir: &std::path::Path, local: Ipv4Addr, node: Ipv4Addr) -> Result<Pki> {
    node_pki(dir, &Ca::new("etcd-ca")?, local, node, NODE)
}

/// kubeadm's certificates for the node `name` (its own server and peer
/// certificates; the cluster's shared etcd CA `ca`).
fn node_pki(
    dir: &std::path::Path,
    ca: &Ca,
    local: Ipv4Addr,
    node: Ipv4Addr,
    name: &str,
) -> Result<Pki> {
    let etcd_dir = dir.join("etcd");
    std::fs::create_dir_all(&etcd_dir)?;
    let ca_file = ca.write_ca(&etcd_dir, "ca")?;
    let sans = vec![
        "localhost".to_string(),
        node.to_string(),
        local.to_string(),
        "::1".to_string(),
    ];
    let server = ca.write(&etcd_dir, "server", name, &sans, PEER)?;
    let peer = ca.write(&etcd_dir, "peer", name, &sans, PEER)?;
    let healthcheck_client = ca.write(
        &etcd_dir,
        "healthcheck-client",
        "kube-etcd-healthcheck-client",
        &[],
        CLIENT,
    )?;
    let apiserver_client = ca.write(
        dir,
        "apiserver-etcd-client",
        "kube-apiserver-etcd-client",
        &[],
        CLIENT,
    )?;
    Ok(Pki {
        ca: ca_file,
        server,
        peer,
        apiserver_client,
        healthcheck_client,
    })
}

/// The command of kubeadm v1.31's etcd.yaml (etcd 3.5's spellings), flag
/// for flag and in its order, with this test's addresses and files.
fn manifest_args(
    pki: &Pki,
    data_dir: &std::path::Path,
    local: Ipv4Addr,
    node: Ipv4Addr,
) -> Vec<String> {
    kubeadm_command(
        Spelling::Etcd35,
        pki,
        data_dir,
        (local, node),
        NODE,
        &format!("{NODE}=https://{node}:2380"),
        false,
    )
}

#[tokio::test]
async fn member_started_from_kubeadms_manifest_passes_kubelets_probes_and_serves_the_apiserver() {
    let binary = Binary::candidate().expect("candidate binary");
    let dir = tempfile::tempdir().expect("tempdir");
    let (local, node) = (allocate_ip().expect("ip"), allocate_ip().expect("ip"));
    let pki = kubeadm_pki(dir.path(), local, node).expect("pki");
    let args = manifest_args(&pki, &dir.path().join("etcd"), local, node);
    let process =
        Process::start(&binary, "etcd", &dir.path().join("etcd.log"), &args).expect("start");
    let probe = |path: &'static str| {
        let url = format!("http://{local}:2381{path}");
        async move { get(&url).await }
    };
    retry_until("kubelet's startup probe (GET /readyz)", STARTUP, || async {
        process.ensure_running()?;
        let r = probe("/readyz").await?;
        ensure!(r.status == 200, "{} {}", r.status, r.body);
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", process.log_tail()));
    let live = probe("/livez").await.expect("liveness probe");
    assert_eq!((live.status, live.body.as_str()), (200, "ok\n"));
    let ready = probe("/readyz").await.expect("readiness probe");
    assert_eq!((ready.status, ready.body.as_str()), (200, "ok\n"));
    let old_probe = probe("/health?exclude=NOSPACE&serializable=true")
        .await
        .expect("health");
    assert_eq!(old_probe.body, r#"{"health":"true","reason":""}"#);

    // kube-apiserver: --etcd-servers=https://127.0.0.1:2379 with its client
    // certificate, keys under /registry.
    let tls = tls_options(&pki.ca, Some(&pki.apiserver_client)).expect("tls");
    let mut client = connect_tls(&[format!("https://{local}:2379")], tls)
        .await
        .expect("apiserver client connects");
    client
        .put(
            "/registry/namespaces/default",
            "{\"kind\":\"Namespace\"}",
            None,
        )
        .await
        .expect("put");
    let got = client
        .get("/registry/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(got.kvs().len(), 1);
    assert_eq!(
        got.kvs()[0].key_str().expect("utf-8"),
        "/registry/namespaces/default"
    );
    let metrics = probe("/metrics").await.expect("metrics");
    assert!(
        metrics.body.contains("etcd_server_has_leader 1\n"),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.contains("etcd_mvcc_put_total 1\n"),
        "{}",
        metrics.body
    );
    // etcd 3.6's gate metric: 3.5's flag turned the gate on.
    for series in [
        "etcd_server_feature_enabled{name=\"InitialCorruptCheck\",stage=\"ALPHA\"} 1\n",
        "etcd_server_feature_enabled{name=\"TxnModeWriteWithSharedBuffer\",stage=\"BETA\"} 1\n",
        "etcd_server_feature_enabled{name=\"StopGRPCServiceOnDefrag\",stage=\"ALPHA\"} 0\n",
        "etcd_server_version{server_version=\"3.6.14\"} 1\n",
        "# TYPE etcd_network_known_peers gauge\n",
        "etcd_server_range_duration_seconds_count{success=\"true\"} 1\n",
    ] {
        assert!(metrics.body.contains(series), "{series}{}", metrics.body);
    }
    process.kill().expect("stop");
}

/// `curl` of `url` trusting the etcd CA, with `identity`'s certificate if
/// given: (HTTP status, body), or curl's exit code when it fails.
fn curl(pki: &Pki, url: &str, identity: Option<&CertFiles>) -> Result<(u16, String), i32> {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "-w",
        "\n%{http_code}",
        "--cacert",
    ])
    .arg(&pki.ca);
    if let Some(id) = identity {
        cmd.arg("--cert").arg(&id.cert).arg("--key").arg(&id.key);
    }
    let out = cmd
        .arg(url)
        .output()
        .expect("curl runs (setup.sh installs it)");
    if !out.status.success() {
        return Err(out.status.code().unwrap_or(-1));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status line");
    Ok((code.parse().expect("status code"), body.to_string()))
}

/// `--listen-metrics-urls` with an https URL serves the probes and
/// `/metrics` over TLS with the client port's certificate and, with
/// `--client-cert-auth`, only to clients with a certificate of the CA
/// (kubeadm's `healthcheck-client`); compared with etcd 3.5.
#[tokio::test]
async fn https_metrics_url_serves_with_client_certificates_as_etcd() {
    for binary in [
        Binary::etcd35().expect("etcd"),
        Binary::candidate().expect("candidate"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (local, node) = (allocate_ip().expect("ip"), allocate_ip().expect("ip"));
        let pki = kubeadm_pki(dir.path(), local, node).expect("pki");
        let mut args = manifest_args(&pki, &dir.path().join("etcd"), local, node);
        for a in args
            .iter_mut()
            .filter(|a| a.starts_with("--listen-metrics-urls="))
        {
            *a = format!("--listen-metrics-urls=http://{local}:2381,https://{node}:2381");
        }
        let process =
            Process::start(&binary, "etcd", &dir.path().join("etcd.log"), &args).expect("start");
        let url = |path: &str| format!("https://{node}:2381{path}");
        let hc = Some(&pki.healthcheck_client);
        let health = retry_until("/health over https", STARTUP, || async {
            process.ensure_running()?;
            match curl(&pki, &url("/health"), hc) {
                Ok((200, body)) => Ok(body),
                other => anyhow::bail!("{other:?}"),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e:#}\n{}", binary.role, process.log_tail()));
        assert_eq!(
            health, r#"{"health":"true","reason":""}"#,
            "{}",
            binary.role
        );
        let (status, metrics) = curl(&pki, &url("/metrics"), hc).expect("metrics");
        assert_eq!(status, 200, "{}", binary.role);
        assert!(
            metrics.contains("etcd_server_has_leader 1\n"),
            "{}",
            binary.role
        );
        assert!(
            curl(&pki, &url("/health"), None).is_err(),
            "{}: served a client without a certificate",
            binary.role
        );
        if binary == Binary::candidate().expect("candidate") {
            assert_eq!(
                curl(&pki, &url("/readyz"), hc),
                Ok((200, "ok\n".to_string()))
            );
        }
        process.kill().expect("stop");
    }
}

/// Which etcd flags a kubeadm release writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// kubeadm v1.36, v1.37 (and v1.34-v1.35 with an etcd >= 3.6 image).
    Etcd36,
    /// kubeadm v1.31-v1.35 with an etcd 3.5 image.
    Etcd35,
}

/// One control-plane node's etcd command line as kubeadm builds it:
/// `--name=value` pairs sorted by name. `initial_cluster` is the node
/// itself for `kubeadm init`, the members MemberAdd returned for `kubeadm
/// join` (which also passes `--initial-cluster-state=existing`).
fn kubeadm_command(
    spelling: Spelling,
    pki: &Pki,
    data_dir: &std::path::Path,
    (local, node): (Ipv4Addr, Ipv4Addr),
    name: &str,
    initial_cluster: &str,
    joining: bool,
) -> Vec<String> {
    let p = |f: &std::path::Path| f.display().to_string();
    let mut args: Vec<(&str, String)> = vec![
        ("advertise-client-urls", format!("https://{node}:2379")),
        ("cert-file", p(&pki.server.cert)),
        ("client-cert-auth", "true".into()),
        ("data-dir", p(data_dir)),
        (
            "initial-advertise-peer-urls",
            format!("https://{node}:2380"),
        ),
        ("initial-cluster", initial_cluster.to_string()),
        ("key-file", p(&pki.server.key)),
        (
            "listen-client-urls",
            format!("https://{local}:2379,https://{node}:2379"),
        ),
        ("listen-metrics-urls", format!("http://{local}:2381")),
        ("listen-peer-urls", format!("https://{node}:2380")),
        ("name", name.to_string()),
        ("peer-cert-file", p(&pki.peer.cert)),
        ("peer-client-cert-auth", "true".into()),
        ("peer-key-file", p(&pki.peer.key)),
        ("peer-trusted-ca-file", p(&pki.ca)),
        ("snapshot-count", "10000".into()),
        ("trusted-ca-file", p(&pki.ca)),
    ];
    match spelling {
        Spelling::Etcd36 => {
            args.push(("feature-gates", "InitialCorruptCheck=true".into()));
            args.push(("watch-progress-notify-interval", "5s".into()));
        }
        Spelling::Etcd35 => {
            args.push(("experimental-initial-corrupt-check", "true".into()));
            args.push(("experimental-watch-progress-notify-interval", "5s".into()));
        }
    }
    if joining {
        args.push(("initial-cluster-state", "existing".into()));
    }
    args.sort_by(|a, b| a.0.cmp(b.0));
    args.into_iter()
        .map(|(k, v)| format!("--{k}={v}"))
        .collect()
}

/// Starts node `name`'s member as kubelet runs kubeadm's manifest: its
/// command line ([`kubeadm_command`]), data in `<node_dir>/data`, log in
/// `<node_dir>/etcd.log`.
fn launch(
    spelling: Spelling,
    pki: &Pki,
    node_dir: &std::path::Path,
    ips: (Ipv4Addr, Ipv4Addr),
    name: &str,
    initial_cluster: &str,
    joining: bool,
) -> Result<Process> {
    let args = kubeadm_command(
        spelling,
        pki,
        &node_dir.join("data"),
        ips,
        name,
        initial_cluster,
        joining,
    );
    Process::start(
        &Binary::candidate()?,
        name,
        &node_dir.join("etcd.log"),
        &args,
    )
}

/// A started control-plane node of the stacked cluster.
struct Node {
    name: String,
    local: Ipv4Addr,
    process: Process,
}

/// kubeadm's join: MemberAddAsLearner through the existing members, the
/// manifest from the answer, then MemberPromote retried until the learner
/// is in sync (kubeadm retries the same way).
async fn join(
    client: &mut etcd_client::Client,
    spelling: Spelling,
    dir: &std::path::Path,
    ca: &Ca,
    name: &str,
) -> Result<Node> {
    let (local, node) = (allocate_ip()?, allocate_ip()?);
    let node_dir = dir.join(name);
    let pki = node_pki(&node_dir, ca, local, node, name)?;
    let own_url = format!("https://{node}:2380");
    let added = client
        .member_add(
            [own_url.clone()],
            Some(etcd_client::MemberAddOptions::new().with_is_learner()),
        )
        .await?;
    let id = added.member().map(|m| m.id()).unwrap_or_default();
    // kubeadm names the new member by the node, and a member that has not
    // published its name yet by its hex id.
    let initial_cluster: Vec<String> = added
        .member_list()
        .iter()
        .flat_map(|m| {
            let member = if m.peer_urls().contains(&own_url) {
                name.to_string()
            } else if m.name().is_empty() {
                format!("{:x}", m.id())
            } else {
                m.name().to_string()
            };
            m.peer_urls()
                .iter()
                .map(move |url| format!("{member}={url}"))
                .collect::<Vec<_>>()
        })
        .collect();
    let process = launch(
        spelling,
        &pki,
        &node_dir,
        (local, node),
        name,
        &initial_cluster.join(","),
        true,
    )?;
    retry_until("the learner's promotion", STARTUP, || {
        let mut client = client.clone();
        let process = &process;
        async move {
            process.ensure_running()?;
            client.member_promote(id).await?;
            Ok(())
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n{}", process.log_tail()))?;
    Ok(Node {
        name: name.to_string(),
        local,
        process,
    })
}

/// `kubeadm init` on the first node, `kubeadm join --control-plane` on two
/// more, with `spelling`'s command lines; then etcd-client and etcdctl 3.5
/// (kube-apiserver's and an operator's clients) use all three members.
async fn stacked_cluster_from_kubeadms_command_lines(spelling: Spelling) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::new("etcd-ca").expect("ca");
    let (local, node) = (allocate_ip().expect("ip"), allocate_ip().expect("ip"));
    let first = "control-plane-1";
    let first_dir = dir.path().join(first);
    let pki = node_pki(&first_dir, &ca, local, node, first).expect("pki");
    let process = launch(
        spelling,
        &pki,
        &first_dir,
        (local, node),
        first,
        &format!("{first}=https://{node}:2380"),
        false,
    )
    .expect("start");
    retry_until("the first member's /readyz", STARTUP, || async {
        process.ensure_running()?;
        let r = get(&format!("http://{local}:2381/readyz")).await?;
        ensure!(r.status == 200, "{} {}", r.status, r.body);
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", process.log_tail()));
    let mut nodes = vec![Node {
        name: first.to_string(),
        local,
        process,
    }];
    let tls = tls_options(&pki.ca, Some(&pki.apiserver_client)).expect("tls");
    let mut kubeadm = connect_tls(&[format!("https://{local}:2379")], tls.clone())
        .await
        .expect("kubeadm's etcd client");
    for name in ["control-plane-2", "control-plane-3"] {
        let node = join(&mut kubeadm, spelling, dir.path(), &ca, name)
            .await
            .unwrap_or_else(|e| panic!("{spelling:?}: joining {name}: {e:#}"));
        nodes.push(node);
    }

    // A member's name shows once it has published it, after it serves.
    retry_until("every member's name in the member list", STARTUP, || {
        let mut kubeadm = kubeadm.clone();
        async move {
            let members = kubeadm.member_list().await?;
            let mut names: Vec<&str> = members.members().iter().map(|m| m.name()).collect();
            names.sort_unstable();
            ensure!(
                names == ["control-plane-1", "control-plane-2", "control-plane-3"],
                "{names:?}"
            );
            ensure!(members.members().iter().all(|m| !m.is_learner()));
            Ok(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{spelling:?}: {e:#}"));

    // kube-apiserver: --etcd-servers=https://127.0.0.1:2379 on each node.
    let endpoints: Vec<String> = nodes
        .iter()
        .map(|n| format!("https://{}:2379", n.local))
        .collect();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let mut apiserver = connect_tls(std::slice::from_ref(endpoint), tls.clone())
            .await
            .expect("apiserver client");
        let key = format!("/registry/namespaces/ns-{i}");
        apiserver.put(key.as_str(), "{}", None).await.expect("put");
        let status = apiserver.status().await.expect("status");
        assert_eq!(status.version(), "3.6.14", "{}", nodes[i].name);
    }
    let ctl = Etcdctl::new(Binary::etcdctl35().expect("etcdctl 3.5"), endpoints.clone());
    let mut flags = etcdctl_flags(&pki.ca, Some(&pki.apiserver_client));
    flags.extend(["get", "/registry/", "--prefix", "--keys-only"].map(String::from));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = ctl.run(&flags).await.expect("etcdctl get");
    assert!(out.success(), "{}", out.stderr);
    let keys: Vec<&str> = out.stdout.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        keys,
        [
            "/registry/namespaces/ns-0",
            "/registry/namespaces/ns-1",
            "/registry/namespaces/ns-2"
        ]
    );
    let mut flags = etcdctl_flags(&pki.ca, Some(&pki.apiserver_client));
    flags.extend(["endpoint", "status", "-w", "json"].map(String::from));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = ctl.run(&flags).await.expect("etcdctl endpoint status");
    assert!(out.success(), "{}", out.stderr);
    let statuses = out.json().expect("json");
    let statuses = statuses.as_array().expect("a status per endpoint");
    assert_eq!(statuses.len(), 3);
    for s in statuses {
        assert_eq!(s["Status"]["version"], "3.6.14", "{s}");
    }
    for node in &nodes {
        let live = get(&format!("http://{}:2381/livez", node.local))
            .await
            .expect("livez");
        assert_eq!(
            (live.status, live.body.as_str()),
            (200, "ok\n"),
            "{}",
            node.name
        );
        node.process.ensure_running().expect("running");
    }
}

#[tokio::test]
async fn kubeadm_137_command_lines_start_a_stacked_cluster() {
    stacked_cluster_from_kubeadms_command_lines(Spelling::Etcd36).await;
}

#[tokio::test]
async fn kubeadm_135_etcd35_command_lines_start_a_stacked_cluster() {
    stacked_cluster_from_kubeadms_command_lines(Spelling::Etcd35).await;
}
