//! Configuration lifecycle: hot reload adds and removes backends without dropping open
//! connections, invalid configurations are refused with the line at fault (at startup and on
//! reload, where the running configuration stays), and SIGTERM drains.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// Deadline for the gateway to exit once its last connection closed after SIGTERM.
const EXIT_DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_adds_and_removes_backends_without_dropping_connections() {
    let pki = Pki::new();
    let mut backends = Vec::new();
    for name in ["cp1", "cp2", "cp3"] {
        backends.push(Nginx::start(&pki, name, None).await);
    }
    let listen = free_local_address();
    // Two relay threads: the reload hands each thread's listener to its next accept loop.
    const THREADS: usize = 2;
    let gateway = Gateway::start_with_config_and_args(
        listen,
        &config_toml(listen, &[&backends[0], &backends[1]], "", ""),
        &["--threads", &THREADS.to_string()],
    )
    .await;
    assert_eq!(gateway.listening_sockets(), THREADS);
    // Open connections until one sits on cp1, the backend the reload removes.
    let mut open = Vec::new();
    for _ in 0..40 {
        let mut client = TlsClient::connect(&pki, listen).await.unwrap();
        let name = client.get("/").await.unwrap().trim().to_string();
        open.push((name.clone(), client));
        if name == "cp1" {
            break;
        }
    }
    assert!(
        open.iter().any(|(name, _)| name == "cp1"),
        "some connection landed on cp1"
    );

    std::fs::write(
        gateway.config_path(),
        config_toml(listen, &[&backends[1], &backends[2]], "", ""),
    )
    .unwrap();
    gateway.signal(libc::SIGHUP);
    wait_for("cp3 added and cp1 removed", STARTUP_DEADLINE, || async {
        let names: Vec<_> = gateway
            .backends()
            .await
            .iter()
            .map(|b| b["name"].as_str().unwrap().to_string())
            .collect();
        names.contains(&"cp3".to_string()) && !names.contains(&"cp1".to_string())
    })
    .await;
    gateway.wait_serving("cp3", true).await;

    for (name, client) in &mut open {
        let again = client
            .get("/")
            .await
            .expect("open connection survives the reload");
        assert_eq!(again.trim(), name, "same backend as before the reload");
    }
    let refs: Vec<&Nginx> = backends.iter().collect();
    let mut seen_cp3 = false;
    for _ in 0..20 {
        let name = request_backend(&pki, listen, &refs)
            .await
            .expect("new connection after reload");
        assert_ne!(name, "cp1", "removed backend gets no new connections");
        seen_cp3 |= name == "cp3";
    }
    assert!(seen_cp3, "added backend takes new connections");
    assert!(gateway.log().contains("configuration reloaded"));
    assert_eq!(gateway.listening_sockets(), THREADS, "listeners kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_reload_keeps_the_running_configuration() {
    let pki = Pki::new();
    let backend = Nginx::start(&pki, "cp1", None).await;
    let listen = free_local_address();
    let good = config_toml(listen, &[&backend], "", "");
    let gateway = Gateway::start_with_config(listen, &good).await;
    let refs = [&backend];
    request_backend(&pki, listen, &refs).await.unwrap();

    // Line 14 is the `fall` of the check: zero is refused.
    let bad = good.replace(&format!("fall = {FAST_FALL}"), "fall = 0");
    let bad_line = bad.lines().position(|line| line == "fall = 0").unwrap() + 1;
    std::fs::write(gateway.config_path(), &bad).unwrap();
    gateway.signal(libc::SIGHUP);
    wait_for(
        "the reload failure in the log",
        STARTUP_DEADLINE,
        || async { gateway.log().contains("reload failed") },
    )
    .await;
    let log = gateway.log();
    assert!(
        log.contains(&format!("line {bad_line}")),
        "the error names line {bad_line}:\n{log}"
    );
    assert!(log.contains("fall"), "{log}");
    request_backend(&pki, listen, &refs)
        .await
        .expect("still serving with the old configuration");
    assert_eq!(gateway.backends().await.len(), 1);

    // The file watcher reloads on its own once the file is fixed (a new backend appears).
    let second = Nginx::start(&pki, "cp2", None).await;
    std::fs::write(
        gateway.config_path(),
        config_toml(listen, &[&backend, &second], "", ""),
    )
    .unwrap();
    wait_for(
        "the fixed file to be picked up",
        STARTUP_DEADLINE,
        || async { gateway.backends().await.len() == 2 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_is_refused_at_startup_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[[frontend]]\nname = \"api\"\nlisten = \"127.0.0.1:6443\"\nbalance = \"fastest\"\n", 4, "balance"),
        ("[[frontend]]\nname = \"api\"\nlisten = \"127.0.0.1:6443\"\n\n[[frontend.backend]]\nname = \"cp1\"\naddress = \"10.0.0.1\"\n", 7, "HOST:PORT"),
        ("[[frontend]]\nname = \"api\"\nlisten = 127.0.0.1\n", 3, ""),
        ("[[frontend]]\nname = \"api\"\nlisten = \"127.0.0.1:6443\"\nidle_timout = \"1h\"\n", 4, "idle_timout"),
    ];
    for (text, line, word) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        for extra in [None, Some("--check-config")] {
            let mut command = Command::new(env!("CARGO_BIN_EXE_gateway"));
            command.arg("--config").arg(&path).args(["--admin", "off"]);
            command.args(extra);
            let output = command.output().expect("run the gateway");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "refused: {text}");
            assert!(
                stderr.contains(&format!("line {line}")),
                "names line {line}: {stderr}"
            );
            assert!(stderr.contains(word), "mentions {word}: {stderr}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_and_drains_open_connections() {
    let pki = Pki::new();
    let backend = Nginx::start(&pki, "cp1", None).await;
    let listen = free_local_address();
    let mut gateway =
        Gateway::start_with_config(listen, &config_toml(listen, &[&backend], "", "")).await;
    let mut client = TlsClient::connect(&pki, listen).await.unwrap();
    assert_eq!(client.get("/").await.unwrap().trim(), "cp1");

    gateway.signal(libc::SIGTERM);
    wait_for("the listener to close", STARTUP_DEADLINE, || async {
        tokio::net::TcpStream::connect(listen).await.is_err()
    })
    .await;
    for _ in 0..3 {
        assert_eq!(
            client
                .get("/")
                .await
                .expect("open connection keeps working while draining")
                .trim(),
            "cp1"
        );
    }
    drop(client);
    let status = gateway.wait_exit(EXIT_DEADLINE).await;
    assert!(status.success(), "clean exit after the drain: {status}");
    assert!(gateway.log().contains("shutdown complete"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_connections_at_the_drain_deadline() {
    let pki = Pki::new();
    let backend = Nginx::start(&pki, "cp1", None).await;
    let listen = free_local_address();
    let config = config_toml(listen, &[&backend], "", "")
        .replace("shutdown_grace = \"30s\"", "shutdown_grace = \"1s\"");
    let mut gateway = Gateway::start_with_config(listen, &config).await;
    let mut client = TlsClient::connect(&pki, listen).await.unwrap();
    client.get("/").await.unwrap();
    gateway.signal(libc::SIGTERM);
    let status = gateway.wait_exit(EXIT_DEADLINE).await;
    assert!(status.success(), "{status}");
    assert!(
        client.get("/").await.is_err(),
        "the connection was closed at the deadline"
    );
    assert!(gateway.log().contains("drain deadline passed"));
}
