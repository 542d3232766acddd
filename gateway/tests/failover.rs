//! Health checks and failure handling against real nginx backends: a stopped backend, a
//! backend whose `/readyz` turns to 500, every backend down (fail fast), recovery after `rise`,
//! and etcd's `/health` check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;

/// Slack on top of `fall × interval` for a loaded two-core CI machine (scheduling, TLS
/// handshakes of the checks). The requirement is functional: out within a few intervals,
/// not within milliseconds.
const DETECTION_SLACK: Duration = Duration::from_secs(5);

fn detection_bound() -> Duration {
    FAST_INTERVAL * (FAST_FALL + 1) + DETECTION_SLACK
}

/// One client request record: when it started and what it got.
struct Outcome {
    started: Instant,
    result: Result<String, String>,
}

/// Sends requests on new connections, one after another, until `stop` is set.
fn spawn_traffic(
    pki: Arc<Pki>,
    gateway: std::net::SocketAddr,
    names: Vec<String>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Outcome>> {
    tokio::spawn(async move {
        let mut outcomes = Vec::new();
        // Bounded even if `stop` is never set.
        const MAX_REQUESTS: usize = 20_000;
        while !stop.load(Ordering::Relaxed) && outcomes.len() < MAX_REQUESTS {
            let started = Instant::now();
            let result = async {
                let mut client = TlsClient::connect(&pki, gateway).await?;
                client.get("/").await
            }
            .await
            .map(|body| body.trim().to_string())
            .map_err(|error| error.to_string());
            if let Ok(name) = &result {
                assert!(names.contains(name), "unknown backend {name}");
            }
            outcomes.push(Outcome { started, result });
        }
        outcomes
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_backend_is_skipped_without_client_errors() {
    let pki = Arc::new(Pki::new());
    let mut backends = Vec::new();
    for name in ["cp1", "cp2", "cp3"] {
        backends.push(Nginx::start(&pki, name, None).await);
    }
    let listen = free_local_address();
    let refs: Vec<&Nginx> = backends.iter().collect();
    let gateway = Gateway::start_with_config(listen, &config_toml(listen, &refs, "", "")).await;
    let names = backends
        .iter()
        .map(|backend| backend.name.clone())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = spawn_traffic(Arc::clone(&pki), listen, names, Arc::clone(&stop));

    request_backend(&pki, listen, &refs)
        .await
        .expect("serving before the kill");
    backends[1].stop();
    // Taken once the process is gone: a connection the dying nginx had
    // already accepted can break mid-handshake, and no passthrough balancer
    // can save that one (HAProxy cannot either). Every connection made
    // after the death must be sent elsewhere.
    let killed_at = Instant::now();
    let start = Instant::now();
    gateway.wait_serving("cp2", false).await;
    let detected = start.elapsed();
    // Keep traffic flowing a little after detection, then stop it.
    let after_detection = Instant::now();
    wait_for("more traffic after detection", STARTUP_DEADLINE, || async {
        after_detection.elapsed() > FAST_INTERVAL * 4
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let outcomes = traffic.await.unwrap();

    assert!(
        detected <= detection_bound(),
        "cp2 marked down after {detected:?}"
    );
    let failures: Vec<_> = outcomes
        .iter()
        .filter(|outcome| outcome.started >= killed_at && outcome.result.is_err())
        .map(|outcome| outcome.result.as_ref().unwrap_err().clone())
        .collect();
    assert!(
        failures.is_empty(),
        "new connections after the kill failed: {failures:?}"
    );
    let late_to_cp2 = outcomes
        .iter()
        .filter(|outcome| outcome.started >= killed_at && outcome.result.as_deref() == Ok("cp2"))
        .count();
    assert_eq!(late_to_cp2, 0, "a killed backend cannot answer");
    assert!(
        outcomes.len() > 10,
        "traffic ran: {} requests",
        outcomes.len()
    );
    let log = gateway.log();
    assert!(log.contains("backend is down"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_readyz_removes_backend_within_fall_times_inter_and_rise_restores_it() {
    let pki = Arc::new(Pki::new());
    let mut backends = Vec::new();
    for name in ["cp1", "cp2"] {
        backends.push(Nginx::start(&pki, name, None).await);
    }
    let listen = free_local_address();
    let refs: Vec<&Nginx> = backends.iter().collect();
    let gateway = Gateway::start_with_config(
        listen,
        &config_toml(listen, &refs, "balance = \"round-robin\"", ""),
    )
    .await;
    let names = backends
        .iter()
        .map(|backend| backend.name.clone())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = spawn_traffic(Arc::clone(&pki), listen, names, Arc::clone(&stop));

    let failed_at = Instant::now();
    backends[0].set_ready(false);
    gateway.wait_serving("cp1", false).await;
    let marked_down = failed_at.elapsed();
    let down_since = Instant::now();
    wait_for("traffic while cp1 is out", STARTUP_DEADLINE, || async {
        down_since.elapsed() > FAST_INTERVAL * 4
    })
    .await;
    backends[0].set_ready(true);
    let recovered_at = Instant::now();
    gateway.wait_serving("cp1", true).await;
    let came_back = recovered_at.elapsed();
    let back_since = Instant::now();
    wait_for("traffic after recovery", STARTUP_DEADLINE, || async {
        back_since.elapsed() > FAST_INTERVAL * 4
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let outcomes = traffic.await.unwrap();

    assert!(
        marked_down <= detection_bound(),
        "cp1 marked down after {marked_down:?}"
    );
    assert!(
        came_back >= FAST_INTERVAL,
        "rise needs {FAST_RISE} checks, came back after {came_back:?}"
    );
    let errors: Vec<_> = outcomes
        .iter()
        .filter_map(|outcome| outcome.result.as_ref().err())
        .collect();
    assert!(
        errors.is_empty(),
        "a /readyz failure must not cause client errors: {errors:?}"
    );
    let while_out = outcomes
        .iter()
        .filter(|outcome| outcome.started > down_since && outcome.started < recovered_at)
        .filter(|outcome| outcome.result.as_deref() == Ok("cp1"))
        .count();
    assert_eq!(
        while_out, 0,
        "no new connection reaches cp1 while its /readyz fails"
    );
    let after = outcomes
        .iter()
        .filter(|outcome| outcome.started > back_since && outcome.result.as_deref() == Ok("cp1"))
        .count();
    assert!(after > 0, "cp1 takes connections again after rise");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_backends_down_fails_fast_and_one_back_resumes_traffic() {
    let pki = Pki::new();
    let mut backends = Vec::new();
    for name in ["cp1", "cp2"] {
        backends.push(Nginx::start(&pki, name, None).await);
    }
    let listen = free_local_address();
    let refs: Vec<&Nginx> = backends.iter().collect();
    let gateway = Gateway::start_with_config(listen, &config_toml(listen, &refs, "", "")).await;
    request_backend(&pki, listen, &refs)
        .await
        .expect("serving before the outage");
    for backend in &mut backends {
        backend.stop();
    }
    gateway.wait_serving("cp1", false).await;
    gateway.wait_serving("cp2", false).await;

    // The gateway accepts and closes at once: the client's handshake fails right away instead
    // of hanging until some timeout (HAProxy holds it for `timeout connect`/`queue`).
    const FAIL_FAST_BOUND: Duration = Duration::from_secs(3);
    for _ in 0..5 {
        let started = Instant::now();
        let result = tokio::time::timeout(FAIL_FAST_BOUND, TlsClient::connect(&pki, listen)).await;
        let elapsed = started.elapsed();
        assert!(
            matches!(result, Ok(Err(_))),
            "connection must be refused at once, took {elapsed:?}"
        );
    }
    let (_, metrics) = http_get(gateway.admin, "/metrics").await.unwrap();
    assert!(
        metrics.contains("gateway_frontend_rejected_connections_total{frontend=\"api\",reason=\"no_healthy_backend\"}"),
        "{metrics}"
    );

    backends[1].restart().await;
    gateway.wait_serving("cp2", true).await;
    let refs: Vec<&Nginx> = backends.iter().collect();
    for _ in 0..5 {
        let name = request_backend(&pki, listen, &refs)
            .await
            .expect("traffic resumes");
        assert_eq!(name, "cp2");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_mode_checks_the_health_endpoint() {
    let pki = Pki::new();
    let mut backends = Vec::new();
    for name in ["member1", "member2"] {
        backends.push(Nginx::start(&pki, name, None).await);
    }
    let listen = free_local_address();
    let args = vec![
        "--listen".to_string(),
        listen.to_string(),
        "--backend".to_string(),
        backends[0].host_port(),
        "--backend".to_string(),
        backends[1].host_port(),
        "--check".to_string(),
        "etcd".to_string(),
        "--check-interval".to_string(),
        format!("{}ms", FAST_INTERVAL.as_millis()),
    ];
    let gateway = Gateway::start_with_args(listen, &args).await;
    gateway.wait_serving("backend1", true).await;
    backends[0].set_ready(false);
    gateway.wait_serving("backend1", false).await;
    let status = gateway.backend("backend1").await.unwrap();
    assert!(
        status["last_check_error"].as_str().unwrap().contains("503"),
        "{status}"
    );
    let refs: Vec<&Nginx> = backends.iter().collect();
    for _ in 0..5 {
        assert_eq!(
            request_backend(&pki, listen, &refs).await.unwrap(),
            "member2"
        );
    }
}
