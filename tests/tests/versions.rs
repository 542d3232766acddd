//! etcd 3.6's versions and Maintenance.Downgrade on a three-member store
//! cluster (no etcd 3.6 binary can be installed here: the expectations are
//! etcd 3.6.14's source, `server/etcdserver/version` and `v3_server.go`).
//!
//! - `status_version_and_downgrade_answer_as_etcd_36`: Status's 3.6 fields
//!   (`storageVersion`, `dbSizeQuota`, `downgradeInfo`) and `/version` on
//!   every member; Downgrade VALIDATE / ENABLE / CANCEL with 3.6's answers
//!   and errors; the cluster version lowered to the target after ENABLE
//!   and raised again after CANCEL; a member whose binary is older than
//!   the cluster version refuses to start.
//! - `a_rolling_downgrade_finishes_when_every_member_runs_the_target`:
//!   ENABLE 3.5, then each member restarted as a 3.5 build (the test-only
//!   `ETCDRS_TEST_SERVER_VERSION`) while writes go on; once all three run
//!   3.5 the leader ends the downgrade, and the cluster stays at 3.5.
//!
//! Run: `cargo test --release -p integration-tests --test integration versions::`

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_proto::etcdserverpb::downgrade_request::DowngradeAction;
use etcd_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use etcd_proto::etcdserverpb::{DowngradeInfo, DowngradeRequest, StatusRequest, StatusResponse};
use integration_tests::cluster::{Cluster, ClusterConfig};
use integration_tests::http::get;
use integration_tests::wait::retry_until;
use integration_tests::Binary;
use tonic::transport::Channel;
use tonic::Code;

/// The leader decides the cluster version every 4 s; a few rounds.
const VERSION_SETTLES: Duration = Duration::from_secs(30);

/// The test-only switch of the server version a member presents.
const TEST_VERSION_ENV: &str = "ETCDRS_TEST_SERVER_VERSION";

/// The older release the rolling downgrade installs.
const OLDER_RELEASE: &str = "3.5.21";

async fn maintenance(cluster: &Cluster, i: usize) -> Result<MaintenanceClient<Channel>> {
    let channel = Channel::from_shared(cluster.endpoint(i))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(MaintenanceClient::new(channel))
}

async fn status(cluster: &Cluster, i: usize) -> Result<StatusResponse> {
    Ok(maintenance(cluster, i)
        .await?
        .status(StatusRequest {})
        .await?
        .into_inner())
}

/// Downgrade `action` `version` on member `i`: the answered cluster
/// version, or the error's code and message.
pub(crate) async fn downgrade(
    cluster: &Cluster,
    i: usize,
    action: i32,
    version: &str,
) -> Result<Result<String, (Code, String)>> {
    let request = DowngradeRequest {
        action,
        version: version.to_string(),
    };
    Ok(
        match maintenance(cluster, i).await?.downgrade(request).await {
            Ok(r) => Ok(r.into_inner().version),
            Err(s) => Err((s.code(), s.message().to_string())),
        },
    )
}

/// Waits until every running member reports `cluster` as the cluster
/// version and `downgrade` as the downgrade state.
pub(crate) async fn wait_versions(
    cluster: &Cluster,
    server: &[&str],
    cv: &str,
    downgrade: DowngradeInfo,
) {
    retry_until(
        &format!("cluster version {cv}, downgrade {downgrade:?}"),
        VERSION_SETTLES,
        || async {
            for i in cluster.running() {
                let body = get(&format!("{}/version", cluster.endpoint(i))).await?.body;
                let want = format!(
                    r#"{{"etcdserver":"{}","etcdcluster":"{cv}","storage":"{cv}"}}"#,
                    server[i]
                );
                ensure!(body == want, "member {i}: {body}");
                let metrics = get(&format!("{}/metrics", cluster.endpoint(i))).await?.body;
                let api = cv
                    .rsplit_once('.')
                    .map_or("", |(major_minor, _)| major_minor);
                let series = format!("etcd_cluster_version{{cluster_version=\"{api}\"}} 1\n");
                ensure!(metrics.contains(&series), "member {i}: no {series}");
                let s = status(cluster, i).await?;
                ensure!(s.version == server[i], "member {i}: {}", s.version);
                ensure!(s.storage_version == cv, "member {i}: {}", s.storage_version);
                ensure!(
                    s.downgrade_info.as_ref() == Some(&downgrade),
                    "member {i}: {:?}",
                    s.downgrade_info
                );
            }
            Ok(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.log_tails()));
}

pub(crate) fn enabled(target: &str) -> DowngradeInfo {
    DowngradeInfo {
        enabled: true,
        target_version: target.to_string(),
    }
}

/// A 3-member store cluster once its cluster version is decided (3.6.0),
/// with its members' server versions.
async fn cluster_at_36() -> (Cluster, [&'static str; 3]) {
    let cluster = Cluster::start(
        Binary::candidate().expect("candidate"),
        ClusterConfig::new(3),
    )
    .await
    .expect("cluster");
    let server = ["3.6.14"; 3];
    wait_versions(&cluster, &server, "3.6.0", DowngradeInfo::default()).await;
    (cluster, server)
}

pub(crate) const VALIDATE: i32 = DowngradeAction::Validate as i32;
pub(crate) const ENABLE: i32 = DowngradeAction::Enable as i32;
const CANCEL: i32 = DowngradeAction::Cancel as i32;

#[tokio::test]
async fn status_version_and_downgrade_answer_as_etcd_36() {
    let (cluster, current) = cluster_at_36().await;
    let s = status(&cluster, 0).await.expect("status");
    assert_eq!(
        s.db_size_quota,
        16 * 1024 * 1024 * 1024,
        "the store's default quota (etcd's is 2 GiB; docs/compatibility.md)"
    );

    let call = |i, action, version: &'static str| {
        let cluster = &cluster;
        async move { downgrade(cluster, i, action, version).await.expect("rpc") }
    };
    let invalid = |m: &str| Err((Code::InvalidArgument, m.to_string()));
    assert_eq!(call(0, VALIDATE, "3.5").await, Ok("3.6".to_string()));
    assert_eq!(call(1, VALIDATE, "3.5.7").await, Ok("3.6".to_string()));
    assert_eq!(
        call(1, VALIDATE, "3.4").await,
        invalid("etcdserver: invalid downgrade target version")
    );
    assert_eq!(
        call(2, VALIDATE, "3.6").await,
        invalid("etcdserver: invalid downgrade target version")
    );
    assert_eq!(
        call(2, ENABLE, "three").await,
        invalid("etcdserver: wrong downgrade target version format")
    );
    assert_eq!(
        call(0, 7, "3.5").await,
        Err((Code::Unknown, "etcdserver: unknown method".to_string()))
    );
    // etcd never fails a CANCEL: with nothing to cancel it only logs.
    assert_eq!(call(0, CANCEL, "").await, Ok("3.6".to_string()));

    assert_eq!(call(1, ENABLE, "3.5").await, Ok("3.6".to_string()));
    wait_versions(&cluster, &current, "3.5.0", enabled("3.5.0")).await;
    let in_progress = Err((
        Code::FailedPrecondition,
        "etcdserver: cluster has a downgrade job in progress".to_string(),
    ));
    // etcd checks the target against the cluster version (3.5 now) first,
    // then whether a job runs.
    assert_eq!(
        call(2, VALIDATE, "3.5").await,
        invalid("etcdserver: invalid downgrade target version")
    );
    assert_eq!(call(1, VALIDATE, "3.4").await, in_progress);
    assert_eq!(call(0, ENABLE, "3.4").await, in_progress);

    assert_eq!(call(2, CANCEL, "").await, Ok("3.5".to_string()));
    wait_versions(&cluster, &current, "3.6.0", DowngradeInfo::default()).await;

    // A 3.5 binary may not serve a cluster at 3.6 (etcd's
    // MustDetectDowngrade).
    cluster.kill(0).expect("kill");
    let env = format!("{TEST_VERSION_ENV}={OLDER_RELEASE}");
    cluster
        .restart_under(0, &["env".to_string(), env])
        .expect("restart");
    let exited = retry_until("the older member to exit", VERSION_SETTLES, || async {
        cluster.exit_status(0)?.context("still running")
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.log_tail(0)));
    assert!(!exited.success());
    assert!(
        cluster
            .log(0)
            .contains("invalid downgrade; server version is lower than determined cluster version"),
        "{}",
        cluster.log_tail(0)
    );
    cluster.restart_and_wait(0).await.expect("restart as 3.6");
}

#[tokio::test]
async fn a_rolling_downgrade_finishes_when_every_member_runs_the_target() {
    let (cluster, mut server) = cluster_at_36().await;
    let answer = downgrade(&cluster, 0, ENABLE, "3.5").await.expect("rpc");
    assert_eq!(answer, Ok("3.6".to_string()));
    wait_versions(&cluster, &server, "3.5.0", enabled("3.5.0")).await;

    let env = format!("{TEST_VERSION_ENV}={OLDER_RELEASE}");
    for i in 0..3 {
        cluster.kill(i).expect("kill");
        cluster
            .restart_under(i, &["env".to_string(), env.clone()])
            .expect("restart as the older release");
        cluster.wait_member_ready(i).await.expect("ready");
        server[i] = OLDER_RELEASE;
        let mut client = cluster.client_all().await.expect("client");
        client
            .put(format!("written-after-{i}"), "v", None)
            .await
            .expect("writes go on during the downgrade");
        if i < 2 {
            wait_versions(&cluster, &server, "3.5.0", enabled("3.5.0")).await;
        }
    }
    // Every member runs 3.5: the leader ends the downgrade.
    wait_versions(&cluster, &server, "3.5.0", DowngradeInfo::default()).await;
    let keys = cluster
        .get_prefix(0, "written-after-", false)
        .await
        .expect("reads");
    assert_eq!(keys.kvs().len(), 3, "{keys:?}");
}

/// A peer request announcing a peer protocol the member does not speak
/// (a newer build's) is refused with FailedPrecondition, before its
/// message is read; one in a protocol the member speaks (1 or 2) is read.
/// Every answer, the refusal too, announces the newest protocol the member
/// speaks.
#[tokio::test]
async fn a_newer_peer_protocol_is_refused() -> Result<()> {
    use etcd_proto::storepeer::raft_peer_client::RaftPeerClient;
    use etcd_proto::storepeer::RaftMessage;
    let cluster = Cluster::start(Binary::candidate()?, ClusterConfig::new(1)).await?;
    let vote = |agent: &'static str| {
        let url = cluster.peer_url(0);
        async move {
            let channel = tonic::transport::Endpoint::from_shared(url)?
                .user_agent(agent)?
                .connect()
                .await?;
            let answer = RaftPeerClient::new(channel)
                .vote(RaftMessage {
                    payload: vec![0xff],
                })
                .await;
            anyhow::Ok(answer)
        }
    };
    let announced = |metadata: &tonic::metadata::MetadataMap| {
        metadata
            .get("peer-protocol")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let refused = vote("etcd-rs-store/9.9.9 peer-protocol/3")
        .await?
        .expect_err("a vote in peer protocol 3");
    ensure!(refused.code() == Code::FailedPrecondition, "{refused:?}");
    ensure!(
        refused
            .message()
            .starts_with("peer protocol 3 is not one this member speaks (1 to 2)"),
        "{refused:?}"
    );
    ensure!(
        announced(refused.metadata()).as_deref() == Some("2"),
        "{refused:?}"
    );
    for agent in [
        "etcd-rs-store/3.6.14 peer-protocol/1",
        "etcd-rs-store/3.6.14 peer-protocol/2",
    ] {
        let read = vote(agent).await?;
        let status = read.as_ref().expect_err("the payload is not a vote");
        ensure!(
            status.code() == Code::InvalidArgument,
            "{agent}: refused before reading: {read:?}"
        );
        ensure!(
            announced(status.metadata()).as_deref() == Some("2"),
            "{agent}: {read:?}"
        );
    }
    Ok(())
}
