//! The admin API: drain, disable, enable and weight change the routing of new connections,
//! drain keeps established connections, disable closes them.

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_disable_enable_and_weight() {
    let pki = Pki::new();
    let mut backends = Vec::new();
    for name in ["cp1", "cp2"] {
        backends.push(Nginx::start(&pki, name, None).await);
    }
    let listen = free_local_address();
    let refs: Vec<&Nginx> = backends.iter().collect();
    let gateway = Gateway::start_with_config(listen, &config_toml(listen, &refs, "", "")).await;
    let action = |backend: &'static str, action: &'static str| {
        let admin = gateway.admin;
        async move {
            let path = format!("/api/frontends/api/backends/{backend}/{action}");
            let (status, body) = http_request(admin, "POST", &path, "").await.unwrap();
            assert_eq!(status, 200, "{action} {backend}: {body}");
        }
    };
    // An established connection on cp1.
    let mut on_cp1 = None;
    for _ in 0..40 {
        let mut client = TlsClient::connect(&pki, listen).await.unwrap();
        if client.get("/").await.unwrap().trim() == "cp1" {
            on_cp1 = Some(client);
            break;
        }
    }
    let mut on_cp1 = on_cp1.expect("a connection landed on cp1");

    action("cp1", "drain").await;
    for _ in 0..10 {
        assert_eq!(
            request_backend(&pki, listen, &refs).await.unwrap(),
            "cp2",
            "drained cp1 takes no new connections"
        );
    }
    assert_eq!(
        on_cp1
            .get("/")
            .await
            .expect("drain keeps established connections")
            .trim(),
        "cp1"
    );

    action("cp1", "disable").await;
    let disabled_at = std::time::Instant::now();
    while on_cp1.get("/").await.is_ok() {
        assert!(
            disabled_at.elapsed() < STARTUP_DEADLINE,
            "disable closes cp1's established connection"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }

    action("cp1", "enable").await;
    let (status, _) = http_request(
        gateway.admin,
        "PUT",
        "/api/frontends/api/backends/cp2/weight",
        "{\"weight\": 0}",
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    for _ in 0..10 {
        assert_eq!(
            request_backend(&pki, listen, &refs).await.unwrap(),
            "cp1",
            "weight 0 takes cp2 out"
        );
    }
    let (status, _) = http_request(
        gateway.admin,
        "PUT",
        "/api/frontends/api/backends/cp2/weight",
        "{\"weight\": 999}",
    )
    .await
    .unwrap();
    assert_eq!(status, 400, "weight above the maximum is refused");
    let (status, _) = http_request(
        gateway.admin,
        "POST",
        "/api/frontends/api/backends/nope/drain",
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 404);
}
