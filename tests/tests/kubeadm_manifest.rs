//! A member started with the exact argument list of kubeadm v1.31's etcd
//! static pod manifest (`/etc/kubernetes/manifests/etcd.yaml`), with
//! kubeadm's certificate layout, probed as kubelet probes it and used as
//! kube-apiserver uses it.
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
//! Run: `cargo test --release -p integration-tests --test kubeadm_manifest`

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{ensure, Result};
use etcd_client::GetOptions;
use integration_tests::client::connect_tls;
use integration_tests::http::get;
use integration_tests::net::allocate_ip;
use integration_tests::pki::{tls_options, Ca, CertFiles, CLIENT, PEER};
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
}

fn kubeadm_pki(dir: &std::path::Path, local: Ipv4Addr, node: Ipv4Addr) -> Result<Pki> {
    let etcd_dir = dir.join("etcd");
    std::fs::create_dir_all(&etcd_dir)?;
    let ca = Ca::new("etcd-ca")?;
    let ca_file = ca.write_ca(&etcd_dir, "ca")?;
    let sans = vec![
        "localhost".to_string(),
        node.to_string(),
        local.to_string(),
        "::1".to_string(),
    ];
    let server = ca.write(&etcd_dir, "server", NODE, &sans, PEER)?;
    let peer = ca.write(&etcd_dir, "peer", NODE, &sans, PEER)?;
    ca.write(
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
    })
}

/// The command of kubeadm v1.31's etcd.yaml, flag for flag and in its
/// order, with this test's addresses and files.
fn manifest_args(
    pki: &Pki,
    data_dir: &std::path::Path,
    local: Ipv4Addr,
    node: Ipv4Addr,
) -> Vec<String> {
    let p = |f: &std::path::Path| f.display().to_string();
    vec![
        format!("--advertise-client-urls=https://{node}:2379"),
        format!("--cert-file={}", p(&pki.server.cert)),
        "--client-cert-auth=true".to_string(),
        format!("--data-dir={}", p(data_dir)),
        "--experimental-initial-corrupt-check=true".to_string(),
        "--experimental-watch-progress-notify-interval=5s".to_string(),
        format!("--initial-advertise-peer-urls=https://{node}:2380"),
        format!("--initial-cluster={NODE}=https://{node}:2380"),
        format!("--key-file={}", p(&pki.server.key)),
        format!("--listen-client-urls=https://{local}:2379,https://{node}:2379"),
        format!("--listen-metrics-urls=http://{local}:2381"),
        format!("--listen-peer-urls=https://{node}:2380"),
        format!("--name={NODE}"),
        format!("--peer-cert-file={}", p(&pki.peer.cert)),
        "--peer-client-cert-auth=true".to_string(),
        format!("--peer-key-file={}", p(&pki.peer.key)),
        format!("--peer-trusted-ca-file={}", p(&pki.ca)),
        "--snapshot-count=10000".to_string(),
        format!("--trusted-ca-file={}", p(&pki.ca)),
    ]
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
    process.kill().expect("stop");
}
