//! Connections spread across healthy nginx backends by the chosen policy, and TLS passes
//! through untouched: the client sees (and verifies) the certificate of the backend itself.

use std::collections::HashMap;

use crate::common::*;

async fn start_backends(pki: &Pki, count: usize) -> Vec<Nginx> {
    let mut backends = Vec::new();
    for index in 0..count {
        backends.push(Nginx::start(pki, &format!("cp{}", index + 1), None).await);
    }
    backends
}

fn flags(listen: std::net::SocketAddr, backends: &[Nginx], extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--listen".to_string(), listen.to_string()];
    for backend in backends {
        args.extend(["--backend".to_string(), backend.host_port()]);
    }
    args.extend(["--check".to_string(), "https:/readyz".to_string()]);
    args.extend(extra.iter().map(|arg| arg.to_string()));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_short_connections_evenly_with_tls_passthrough() {
    let pki = Pki::new();
    let backends = start_backends(&pki, 3).await;
    let listen = free_local_address();
    let gateway = Gateway::start_with_args(
        listen,
        &flags(listen, &backends, &["--balance", "round-robin"]),
    )
    .await;
    let refs: Vec<&Nginx> = backends.iter().collect();
    let mut counts: HashMap<String, usize> = HashMap::new();
    const REQUESTS: usize = 30;
    for _ in 0..REQUESTS {
        let name = request_backend(&pki, gateway.listen, &refs)
            .await
            .expect("request through the gateway");
        *counts.entry(name).or_default() += 1;
    }
    for backend in &backends {
        let count = counts.get(&backend.name).copied().unwrap_or(0);
        assert!(
            count >= REQUESTS / 3 - 2,
            "round robin gave {} only {count} of {REQUESTS}: {counts:?}",
            backend.name
        );
    }
}

/// A relay thread per CPU by default (see `gateway::cli::default_threads`), `--threads N` to
/// choose; each thread has a listener of its own and connections are relayed either way. The
/// kernel spreads connections over the listeners by a hash of their ports, so four requests
/// per thread most likely pass through every thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_threads_follow_the_threads_flag() {
    let pki = Pki::new();
    let backends = start_backends(&pki, 1).await;
    let refs: Vec<&Nginx> = backends.iter().collect();
    let cases = [
        (&[][..], gateway::cli::default_threads()),
        (&["--threads", "1"][..], 1),
        (&["--threads", "3"][..], 3),
    ];
    for (extra, threads) in cases {
        let listen = free_local_address();
        let gateway = Gateway::start_with_args(listen, &flags(listen, &backends, extra)).await;
        assert_eq!(gateway.relay_threads(), threads, "{extra:?}");
        // One listening socket per relay thread, each accepting for its thread.
        assert_eq!(gateway.listening_sockets(), threads, "{extra:?}");
        for _ in 0..threads * 4 {
            request_backend(&pki, gateway.listen, &refs)
                .await
                .expect("request through the gateway");
        }
    }
}

/// With one relay thread per allowed CPU (the default), each thread is pinned to a CPU of its
/// own and together they cover the set; `--cpu-affinity none`, or fewer threads than CPUs,
/// leaves every thread on the whole set (see `gateway::affinity`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_threads_are_pinned_one_per_cpu_by_default() {
    let pki = Pki::new();
    let backends = start_backends(&pki, 1).await;
    let refs: Vec<&Nginx> = backends.iter().collect();
    let allowed = gateway::affinity::allowed_cpus().expect("affinity");
    let pinned = allowed.len() > 1 && gateway::cli::default_threads() == allowed.len();
    let cases = [
        (&[][..], pinned),
        (&["--cpu-affinity", "none"][..], false),
        (
            &["--threads", "3", "--cpu-affinity", "auto"][..],
            allowed.len() == 3,
        ),
    ];
    for (extra, pinned) in cases {
        let listen = free_local_address();
        let gateway = Gateway::start_with_args(listen, &flags(listen, &backends, extra)).await;
        let mut placed = gateway.relay_thread_cpus();
        if pinned {
            assert!(
                placed.iter().all(|cpus| cpus.len() == 1),
                "{extra:?}: {placed:?}"
            );
            let mut covered: Vec<usize> = placed.concat();
            covered.sort_unstable();
            assert_eq!(covered, allowed, "{extra:?}: one thread per allowed CPU");
        } else {
            placed.dedup();
            assert_eq!(placed, vec![allowed.clone()], "{extra:?}: unpinned");
        }
        request_backend(&pki, gateway.listen, &refs)
            .await
            .expect("request through the gateway");
    }
}

#[test]
fn cpu_lists_parse_as_the_kernel_writes_them() {
    assert_eq!(parse_cpu_list("0"), vec![0]);
    assert_eq!(parse_cpu_list("0-2,5"), vec![0, 1, 2, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_connections_spreads_long_lived_connections() {
    let pki = Pki::new();
    let backends = start_backends(&pki, 3).await;
    let listen = free_local_address();
    let gateway =
        Gateway::start_with_args(listen, &flags(listen, &backends, &["--seed", "1"])).await;
    let refs: Vec<&Nginx> = backends.iter().collect();
    // Watch-like: every connection stays open, so the open-connection count is the load.
    const CONNECTIONS: usize = 12;
    let mut open = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut client = TlsClient::connect(&pki, gateway.listen)
            .await
            .expect("connect through the gateway");
        let body = client.get("/").await.expect("first request");
        open.push((body.trim().to_string(), client));
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (name, client) in &open {
        let backend = refs
            .iter()
            .find(|backend| &backend.name == name)
            .expect("known backend");
        assert_eq!(
            client.peer_certificate, backend.identity.der,
            "TLS passthrough"
        );
        *counts.entry(name.as_str()).or_default() += 1;
    }
    // p2c on open connections never sends to a backend that has more connections than the
    // other candidate, so no backend can fall far behind.
    for backend in &backends {
        let count = counts.get(backend.name.as_str()).copied().unwrap_or(0);
        assert!(
            count >= 2,
            "{} got {count} of {CONNECTIONS} long-lived connections: {counts:?}",
            backend.name
        );
    }
    let reported: usize = gateway
        .backends()
        .await
        .iter()
        .map(|backend| backend["open_connections"].as_u64().unwrap() as usize)
        .sum();
    assert_eq!(
        reported, CONNECTIONS,
        "admin API counts every open connection"
    );
    for (_, client) in &mut open {
        client
            .get("/")
            .await
            .expect("long-lived connections still work");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peak_ewma_serves_and_exports_metrics() {
    let pki = Pki::new();
    let backends = start_backends(&pki, 2).await;
    let listen = free_local_address();
    let gateway = Gateway::start_with_args(
        listen,
        &flags(listen, &backends, &["--balance", "peak-ewma"]),
    )
    .await;
    let refs: Vec<&Nginx> = backends.iter().collect();
    for _ in 0..10 {
        request_backend(&pki, gateway.listen, &refs)
            .await
            .expect("request through the gateway");
    }
    let (status, metrics) = http_get(gateway.admin, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for series in [
        "gateway_backend_active_connections",
        "gateway_backend_connections_total",
        "gateway_backend_bytes_total",
        "gateway_backend_connect_duration_seconds_bucket",
        "gateway_backend_health_transitions_total",
        "gateway_frontend_connections_total",
    ] {
        assert!(
            metrics.contains(series),
            "metrics lack {series}:\n{metrics}"
        );
    }
    let (status, page) = http_get(gateway.admin, "/status").await.unwrap();
    assert_eq!(status, 200);
    for backend in &backends {
        assert!(
            page.contains(&backend.host_port()),
            "status page lists {}",
            backend.name
        );
    }
}

/// `max_connections` is one limit for the frontend, not one per relay thread: with two relay
/// threads (each accepting on its own listening socket), the connections over the limit are
/// closed at once and counted, and a closed connection frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_is_one_limit_across_relay_threads() {
    const LIMIT: usize = 4;
    const OVER: usize = 3;
    let pki = Pki::new();
    let backends = start_backends(&pki, 2).await;
    let listen = free_local_address();
    let gateway = Gateway::start_with_config_and_args(
        listen,
        &config_toml(
            listen,
            &backends.iter().collect::<Vec<_>>(),
            &format!("max_connections = {LIMIT}"),
            "",
        ),
        &["--threads", "2"],
    )
    .await;
    assert_eq!(gateway.listening_sockets(), 2);
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        let mut client = TlsClient::connect(&pki, listen)
            .await
            .expect("a connection below the limit");
        client.get("/").await.expect("relayed below the limit");
        held.push(client);
    }
    for _ in 0..OVER {
        assert!(
            TlsClient::connect(&pki, listen).await.is_err(),
            "a connection over the limit is closed before its handshake"
        );
    }
    let rejected = format!(
        "gateway_frontend_rejected_connections_total{{frontend=\"api\",reason=\"max_connections\"}} {OVER}"
    );
    let (_, metrics) = http_get(gateway.admin, "/metrics").await.unwrap();
    assert!(metrics.contains(&rejected), "no {rejected} in:\n{metrics}");
    drop(held.pop());
    wait_for(
        "a place freed by a closed connection",
        STARTUP_DEADLINE,
        || async {
            match TlsClient::connect(&pki, listen).await {
                Ok(mut client) => client.get("/").await.is_ok(),
                Err(_) => false,
            }
        },
    )
    .await;
}
