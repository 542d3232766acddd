//! etcd's plain-HTTP endpoints, Prometheus metrics and gRPC health service,
//! compared with etcd 3.5.1 where it has them:
//!
//! - `/health` (with `exclude=` and `serializable=`), `/version`, unknown
//!   paths, other methods: status, `Content-Type`, CORS headers and body
//!   byte for byte on the client port and on `--listen-metrics-urls`;
//! - `/livez` and `/readyz` (etcd 3.5.13+; 3.5.1 answers 404) against
//!   etcd's documented output;
//! - losing a quorum turns `/health` and `/readyz` 503 on the survivor
//!   quickly (not after a 7 s read timeout) and `etcd_server_has_leader` 0;
//!   both recover when the quorum returns;
//! - every metric family kube-prometheus' etcd dashboards use exists with
//!   etcd's type, help text, label names and buckets, and counters move
//!   with the workload;
//! - `grpc.health.v1.Health/Check` answers SERVING as etcd's.
//!
//! Run: `cargo test --release -p integration-tests --test integration metrics_health::`

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use integration_tests::http::{get, request, HttpResponse};
use integration_tests::wait::retry_until;
use integration_tests::{Binary, Cluster, ClusterConfig};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// How long the survivor may take to report no leader: etcd's first
/// probe after the loss may wait out its 7 s request timeout (answering
/// `RANGE ERROR:...`), the next says `RAFT NO LEADER`.
const QUORUM_LOSS_REPORTED: Duration = Duration::from_secs(20);
/// How long the store may take: an election timeout (1 s) until the
/// leader counts as leaderless, plus the probe loop.
const STORE_QUORUM_LOSS_REPORTED: Duration = Duration::from_secs(3);
/// Longest a health answer may take once the quorum is known lost.
const FAST_ANSWER: Duration = Duration::from_secs(2);
/// How long the cluster may take to be healthy again after a restart.
const RECOVERY: Duration = Duration::from_secs(60);
/// Puts of the metrics workload.
const PUTS: u64 = 25;

fn config(size: usize) -> ClusterConfig {
    let mut c = ClusterConfig::new(size);
    c.metrics = true;
    c
}

async fn start(binary: Binary, size: usize) -> Cluster {
    Cluster::start(binary, config(size))
        .await
        .expect("cluster starts")
}

fn etcd() -> Binary {
    Binary::etcd35().expect("reference etcd 3.5")
}

fn candidate() -> Binary {
    Binary::candidate().expect("candidate binary")
}

/// The parts of an answer that must be etcd's.
fn essentials(r: &HttpResponse) -> String {
    let mut out = format!("{}\n", r.status);
    for name in [
        "content-type",
        "x-content-type-options",
        "allow",
        "access-control-allow-origin",
        "access-control-allow-methods",
        "access-control-allow-headers",
    ] {
        out.push_str(&format!("{name}: {:?}\n", r.header(name)));
    }
    out.push_str(&format!("body: {:?}", r.body));
    out
}

/// Client-port paths whose answers are identical in etcd 3.5.1 and the store.
const CLIENT_PATHS: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/health?serializable=true"),
    ("GET", "/health?serializable=false"),
    ("GET", "/health?exclude=NOSPACE"),
    ("GET", "/health?exclude=NOSPACE&serializable=true"),
    ("GET", "/health?exclude=NOSPACE&exclude=CORRUPT"),
    ("POST", "/health"),
    ("PUT", "/version"),
    ("OPTIONS", "/health"),
    ("GET", "/nope"),
    ("GET", "/metricsx"),
    ("GET", "/health/x"),
    ("POST", "/v3/nothing/here"),
    // A gRPC method's path without gRPC's content type: etcd's HTTP mux,
    // which has no gRPC routes.
    ("POST", "/etcdserverpb.KV/Range"),
    ("GET", "/etcdserverpb.Maintenance/Status"),
];

/// Metrics-port paths with identical answers.
const METRICS_PATHS: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/health?exclude=NOSPACE&serializable=true"),
    ("POST", "/health"),
    ("GET", "/version"),
    ("GET", "/nope"),
];

#[tokio::test]
async fn http_endpoints_answer_as_etcd() {
    let reference = start(etcd(), 1).await;
    let ours = start(candidate(), 1).await;
    for (base, paths) in [
        ((reference.endpoint(0), ours.endpoint(0)), CLIENT_PATHS),
        (
            (reference.metrics_url(0), ours.metrics_url(0)),
            METRICS_PATHS,
        ),
    ] {
        for (method, path) in paths {
            let want = request(method, &format!("{}{path}", base.0), &[])
                .await
                .expect("etcd");
            let got = request(method, &format!("{}{path}", base.1), &[])
                .await
                .expect("store");
            assert_eq!(
                essentials(&got),
                essentials(&want),
                "{method} {path} on {}",
                base.1
            );
        }
    }
    let want = get(&format!("{}/version", reference.endpoint(0)))
        .await
        .expect("etcd");
    let got = get(&format!("{}/version", ours.endpoint(0)))
        .await
        .expect("store");
    assert_eq!(
        (got.status, got.header("content-type")),
        (want.status, want.header("content-type"))
    );
    let keys = |r: &HttpResponse| -> BTreeSet<String> {
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
        v.as_object().expect("object").keys().cloned().collect()
    };
    // etcd 3.6 adds `storage` to 3.5's two fields.
    let mut want_keys = keys(&want);
    want_keys.insert("storage".to_string());
    assert_eq!(keys(&got), want_keys);
    assert_eq!(
        got.body,
        r#"{"etcdserver":"3.6.14","etcdcluster":"3.6.0","storage":"3.6.0"}"#
    );
    let metrics = get(&format!("{}/metrics", ours.endpoint(0)))
        .await
        .expect("store");
    let reference_metrics = get(&format!("{}/metrics", reference.endpoint(0)))
        .await
        .expect("etcd");
    assert_eq!(metrics.status, 200);
    assert_eq!(
        metrics.header("content-type"),
        reference_metrics.header("content-type")
    );
}

/// `/livez` and `/readyz` as etcd 3.5.13+ documents them (3.5.1 lacks them).
#[tokio::test]
async fn livez_and_readyz_answer_as_etcd_documents() {
    let ours = start(candidate(), 1).await;
    for base in [ours.endpoint(0), ours.metrics_url(0)] {
        let cases: &[(&str, u16, &str)] = &[
            ("/livez", 200, "ok\n"),
            ("/livez?verbose", 200, "[+]serializable_read ok\nok\n"),
            ("/livez/serializable_read", 200, "ok\n"),
            ("/readyz", 200, "ok\n"),
            (
                "/readyz?verbose",
                200,
                "[+]data_corruption ok\n[+]serializable_read ok\n[+]linearizable_read ok\n[+]non_learner ok\nok\n",
            ),
            (
                "/readyz?verbose&exclude=linearizable_read&exclude=no_such_check",
                200,
                "[+]data_corruption ok\n[+]serializable_read ok\n[+]non_learner ok\nok\n",
            ),
            ("/readyz/non_learner?verbose", 200, "[+]non_learner ok\nok\n"),
            ("/readyz/linearizable_read", 200, "ok\n"),
            ("/readyz/data_corruption", 200, "ok\n"),
            ("/livez/linearizable_read", 404, "404 page not found\n"),
            ("/readyz/", 404, "404 page not found\n"),
        ];
        for (path, status, body) in cases {
            let r = get(&format!("{base}{path}")).await.expect("probe");
            assert_eq!(
                (r.status, r.body.as_str()),
                (*status, *body),
                "{base}{path}"
            );
            assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
            assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        }
        let r = request("POST", &format!("{base}/readyz"), &[])
            .await
            .expect("post");
        assert_eq!((r.status, r.body.as_str()), (405, "Method Not Allowed\n"));
        assert_eq!(r.header("allow"), Some("GET"));
    }
}

/// Member `i`'s `/health`, and how long it took.
async fn timed_get(url: &str) -> (HttpResponse, Duration) {
    let started = Instant::now();
    let r = get(url).await.expect("answer");
    (r, started.elapsed())
}

/// Stops two of three members; the survivor reports no leader quickly on
/// `/health` and `/readyz`, stays live, and recovers with the quorum.
async fn quorum_loss(binary: Binary, fast: bool) {
    let cluster = start(binary, 3).await;
    let survivor = cluster.leader().await.expect("leader");
    let others: Vec<usize> = (0..3).filter(|i| *i != survivor).collect();
    let health = format!("{}/health", cluster.endpoint(survivor));
    let metrics = format!("{}/metrics", cluster.metrics_url(survivor));
    assert_eq!(sample(&metrics, "etcd_server_has_leader").await, Some(1.0));
    let changes_before = sample(&metrics, "etcd_server_leader_changes_seen_total").await;
    for i in &others {
        cluster.kill(*i).expect("kill");
    }
    let killed = Instant::now();
    retry_until(
        "the survivor to report no leader",
        QUORUM_LOSS_REPORTED,
        || async {
            let r = get(&health).await?;
            ensure!(
                r.body.contains("RAFT NO LEADER"),
                "still {} {}",
                r.status,
                r.body
            );
            Ok(())
        },
    )
    .await
    .expect("quorum loss reported");
    if fast {
        let took = killed.elapsed();
        assert!(
            took < STORE_QUORUM_LOSS_REPORTED,
            "no leader reported after {took:?}"
        );
    }
    let (r, took) = timed_get(&health).await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (
            503,
            "{\"health\":\"false\",\"reason\":\"RAFT NO LEADER\"}\n"
        )
    );
    if fast {
        assert!(took < FAST_ANSWER, "/health took {took:?}");
        let (r, took) =
            timed_get(&format!("{}/readyz?verbose", cluster.metrics_url(survivor))).await;
        assert!(took < FAST_ANSWER, "/readyz took {took:?}");
        assert_eq!(r.status, 503);
        assert_eq!(
            r.body,
            "[+]data_corruption ok\n[+]serializable_read ok\n\
             [-]linearizable_read failed: etcdserver: no leader\n[+]non_learner ok\n\n"
        );
        let (r, _) = timed_get(&format!("{}/livez", cluster.metrics_url(survivor))).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
        let (r, _) = timed_get(&format!("{health}?serializable=true")).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(sample(&metrics, "etcd_server_has_leader").await, Some(0.0));
    for i in &others {
        cluster.restart(*i).expect("restart");
    }
    retry_until("the cluster to be healthy again", RECOVERY, || async {
        let r = get(&health).await?;
        ensure!(r.status == 200, "still {} {}", r.status, r.body);
        Ok(())
    })
    .await
    .expect("recovered");
    if fast {
        let r = get(&format!("{}/readyz", cluster.metrics_url(survivor)))
            .await
            .expect("readyz");
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    }
    assert_eq!(sample(&metrics, "etcd_server_has_leader").await, Some(1.0));
    let changes_after = sample(&metrics, "etcd_server_leader_changes_seen_total").await;
    assert!(
        changes_after > changes_before,
        "{changes_before:?} -> {changes_after:?}"
    );
}

#[tokio::test]
async fn etcd_reports_quorum_loss_on_health() {
    quorum_loss(etcd(), false).await;
}

#[tokio::test]
async fn store_reports_quorum_loss_quickly_on_health_and_readyz() {
    quorum_loss(candidate(), true).await;
}

/// One metric family as scraped.
#[derive(Debug, Default, Clone, PartialEq)]
struct Family {
    kind: String,
    help: String,
    labels: BTreeSet<String>,
    buckets: BTreeSet<String>,
}

/// Families by name, and samples by their full text before the value.
fn parse(text: &str) -> (BTreeMap<String, Family>, BTreeMap<String, f64>) {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().help = help.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().kind = kind.to_string();
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').expect("sample value");
            samples.insert(series.to_string(), value.parse().unwrap_or(f64::NAN));
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains_key(*f)))
                .unwrap_or(name);
            let entry = families.entry(family.to_string()).or_default();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').expect("label");
                if k == "le" {
                    let v = v
                        .trim_matches('"')
                        .parse::<f64>()
                        .map_or(v.to_string(), |f| f.to_string());
                    entry.buckets.insert(v);
                } else {
                    entry.labels.insert(k.to_string());
                }
            }
        }
    }
    (families, samples)
}

async fn scrape(url: &str) -> (BTreeMap<String, Family>, BTreeMap<String, f64>) {
    let r = get(url).await.expect("scrape");
    assert_eq!(r.status, 200);
    parse(&r.body)
}

async fn sample(url: &str, series: &str) -> Option<f64> {
    scrape(url).await.1.get(series).copied()
}

/// The families compared with etcd: those kube-prometheus' etcd mixin and
/// common dashboards use.
const FAMILIES: &[&str] = &[
    "etcd_server_has_leader",
    "etcd_server_is_leader",
    "etcd_server_is_learner",
    "etcd_server_leader_changes_seen_total",
    "etcd_server_proposals_committed_total",
    "etcd_server_proposals_applied_total",
    "etcd_server_proposals_pending",
    "etcd_server_proposals_failed_total",
    "etcd_server_slow_apply_total",
    "etcd_server_slow_read_indexes_total",
    "etcd_server_read_indexes_failed_total",
    "etcd_server_quota_backend_bytes",
    "etcd_server_version",
    "etcd_server_id",
    "etcd_cluster_version",
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_debugging_mvcc_keys_total",
    "etcd_mvcc_put_total",
    "etcd_mvcc_range_total",
    "etcd_mvcc_txn_total",
    "etcd_mvcc_delete_total",
    "etcd_debugging_mvcc_watcher_total",
    "etcd_debugging_mvcc_watch_stream_total",
    "etcd_disk_wal_fsync_duration_seconds",
    "etcd_disk_backend_commit_duration_seconds",
    "etcd_network_peer_sent_bytes_total",
    "etcd_network_peer_received_bytes_total",
    "etcd_network_client_grpc_sent_bytes_total",
    "etcd_network_client_grpc_received_bytes_total",
    "grpc_server_started_total",
    "grpc_server_handled_total",
    "grpc_server_msg_received_total",
    "grpc_server_msg_sent_total",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// The same workload on a cluster: puts, a get, a txn, a delete, and a
/// watch (returned, to stay open while the metrics are scraped).
async fn workload(cluster: &Cluster, member: usize) -> Result<etcd_client::WatchStream> {
    let mut client = cluster.client(member).await?;
    for i in 0..PUTS {
        client.put(format!("/registry/k{i}"), "v", None).await?;
    }
    client.get("/registry/k1", None).await?;
    let txn = Txn::new()
        .when([Compare::value("/registry/k1", CompareOp::Equal, "v")])
        .and_then([
            TxnOp::put("/registry/t", "1", None),
            TxnOp::get("/registry/k2", None),
        ]);
    client.txn(txn).await?;
    client.delete("/registry/t", None).await?;
    Ok(client.watch("/registry", None).await?)
}

#[tokio::test]
async fn metric_families_match_etcd_and_move_with_the_workload() {
    let reference = start(etcd(), 3).await;
    let ours = start(candidate(), 3).await;
    let mut scraped = Vec::new();
    for cluster in [&reference, &ours] {
        let leader = cluster.leader().await.expect("leader");
        let url = format!("{}/metrics", cluster.metrics_url(leader));
        let (_, before) = scrape(&url).await;
        let _watch = workload(cluster, leader).await.expect("workload");
        let (families, after) = scrape(&url).await;
        let put = |s: &BTreeMap<String, f64>| s.get("etcd_mvcc_put_total").copied().unwrap_or(0.0);
        // PUTS puts and the txn's put, applied on this member.
        assert_eq!(put(&after) - put(&before), (PUTS + 1) as f64, "{url}");
        assert_eq!(after.get("etcd_server_is_leader"), Some(&1.0), "{url}");
        assert_eq!(after.get("etcd_server_has_leader"), Some(&1.0), "{url}");
        let started = "grpc_server_started_total{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}";
        let handled = "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}";
        let grew =
            |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
        assert_eq!(grew(started), PUTS as f64, "{url}");
        assert_eq!(grew(handled), PUTS as f64, "{url}");
        for messages in [
            "grpc_server_msg_received_total",
            "grpc_server_msg_sent_total",
        ] {
            let put = format!("{messages}{{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}}");
            assert_eq!(grew(&put), PUTS as f64, "{url} {put}");
        }
        assert!(grew("etcd_network_client_grpc_received_bytes_total") > 0.0);
        assert!(grew("etcd_disk_wal_fsync_duration_seconds_count") > 0.0);
        assert!(
            after
                .get("etcd_debugging_mvcc_watch_stream_total")
                .copied()
                .unwrap_or(0.0)
                >= 1.0
        );
        assert!(
            after
                .get("etcd_debugging_mvcc_keys_total")
                .copied()
                .unwrap_or(0.0)
                >= PUTS as f64
        );
        scraped.push(families);
    }
    let (want, got) = (&scraped[0], &scraped[1]);
    for name in FAMILIES {
        let w = want
            .get(*name)
            .with_context(|| format!("etcd lacks {name}"))
            .unwrap();
        let g = got
            .get(*name)
            .with_context(|| format!("the store lacks {name}"))
            .unwrap();
        assert_eq!(
            (&g.kind, &g.help, &g.labels),
            (&w.kind, &w.help, &w.labels),
            "{name}"
        );
        assert_eq!(g.buckets, w.buckets, "{name} buckets");
    }
    // etcd observes peer round trips every 30 s; the store on every RPC.
    let rtt = got
        .get("etcd_network_peer_round_trip_time_seconds")
        .expect("rtt");
    assert_eq!(rtt.kind, "histogram");
    assert_eq!(rtt.labels, BTreeSet::from(["To".to_string()]));
    assert_eq!(rtt.help, "Round-Trip-Time histogram between peers");
    assert_eq!(rtt.buckets.len(), 17, "16 buckets and +Inf");
}

async fn grpc_health(endpoint: &str, service: &str) -> Result<ServingStatus, tonic::Code> {
    let channel = tonic::transport::Channel::from_shared(endpoint.to_string())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = HealthClient::new(channel);
    let r = client
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .map_err(|s| s.code())?;
    Ok(r.into_inner().status())
}

#[tokio::test]
async fn grpc_health_check_answers_as_etcd() {
    let reference = start(etcd(), 1).await;
    let ours = start(candidate(), 1).await;
    for service in ["", "etcdserverpb.KV", "no.such.Service"] {
        let want = grpc_health(&reference.endpoint(0), service).await;
        let got = grpc_health(&ours.endpoint(0), service).await;
        assert_eq!(got, want, "service {service:?}");
    }
    assert_eq!(
        grpc_health(&ours.endpoint(0), "").await,
        Ok(ServingStatus::Serving)
    );
}

/// Paths compared while the NOSPACE alarm is raised.
const ALARM_PATHS: &[&str] = &[
    "/health",
    "/health?serializable=true",
    "/health?exclude=NOSPACE",
    "/health?exclude=CORRUPT",
    "/health?exclude=NOSPACE&serializable=true",
];

async fn raise_nospace(cluster: &Cluster, action: etcd_client::AlarmAction) {
    let member = cluster.member_id(0).await.expect("member id");
    let mut client = cluster.client(0).await.expect("client");
    let mut options = etcd_client::AlarmOptions::new();
    options.with_member(member);
    client
        .alarm(action, etcd_client::AlarmType::Nospace, Some(options))
        .await
        .expect("alarm");
}

/// A raised NOSPACE alarm makes `/health` 503 `ALARM NOSPACE` unless
/// excluded, as in etcd; `/livez` and `/readyz` ignore it (etcd 3.5.13+).
#[tokio::test]
async fn nospace_alarm_on_health_as_etcd() {
    let reference = start(etcd(), 1).await;
    let ours = start(candidate(), 1).await;
    for cluster in [&reference, &ours] {
        raise_nospace(cluster, etcd_client::AlarmAction::Activate).await;
    }
    for path in ALARM_PATHS {
        let want = get(&format!("{}{path}", reference.endpoint(0)))
            .await
            .expect("etcd");
        let got = get(&format!("{}{path}", ours.endpoint(0)))
            .await
            .expect("store");
        assert_eq!(essentials(&got), essentials(&want), "{path}");
    }
    let health = get(&format!("{}/health", ours.endpoint(0)))
        .await
        .expect("health");
    assert_eq!(
        (health.status, health.body.as_str()),
        (503, "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n")
    );
    for path in ["/livez", "/readyz"] {
        let r = get(&format!("{}{path}", ours.metrics_url(0)))
            .await
            .expect("probe");
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"), "{path}");
    }
    raise_nospace(&ours, etcd_client::AlarmAction::Deactivate).await;
    let health = get(&format!("{}/health", ours.endpoint(0)))
        .await
        .expect("health");
    assert_eq!(health.status, 200, "{}", health.body);
}
