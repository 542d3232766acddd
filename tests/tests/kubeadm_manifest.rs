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
//! Run: `cargo test --release -p integration-tests --test integration kubeadm_manifest::`

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
    healthcheck_client: CertFiles,
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
