//! Tests of the harness itself, run against the candidate server
//! (`STORE_BIN`, default: our release `store`).
//!
//! They check what every other test relies on: clusters of each supported
//! size start on distinct addresses and agree on a leader, SIGKILL really
//! stops a member and a restart brings it back with its data, dropping a
//! cluster leaves no process behind, and the normalizer makes the outputs of
//! two instances of the same server identical (while the raw outputs differ).
//!
//! Run: `STORE_BIN=/opt/etcd-3.5/etcd cargo test -p integration-tests --test integration harness::`

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use integration_tests::wait::retry_until;
use integration_tests::{Binary, Cluster, ClusterConfig, Differential, Etcdctl};

/// Deadline for a dropped cluster's processes to disappear from /proc.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

fn candidate() -> Binary {
    Binary::candidate().expect("candidate server binary")
}

async fn start(config: ClusterConfig) -> Cluster {
    Cluster::start(candidate(), config)
        .await
        .expect("starting the cluster")
}

#[tokio::test]
async fn clusters_of_every_size_start_and_elect_one_leader() {
    for size in [1, 5] {
        let cluster = start(ClusterConfig::new(size)).await;
        let endpoints: BTreeSet<_> = cluster.endpoints().into_iter().collect();
        assert_eq!(endpoints.len(), size, "one address per member");
        let leader = cluster.leader().await.expect("leader");
        assert!(leader < size);
        let mut ids = BTreeSet::new();
        for i in 0..size {
            ids.insert(cluster.member_id(i).await.expect("member id"));
        }
        assert_eq!(ids.len(), size, "distinct member ids: {ids:?}");
        let ctl = Etcdctl::new(Binary::etcdctl35().expect("etcdctl"), cluster.endpoints());
        let members = ctl.run(&["member", "list"]).await.expect("member list");
        assert!(members.success(), "{members}");
        assert_eq!(members.stdout.lines().count(), size, "{members}");
        assert_eq!(members.stdout.matches("started").count(), size, "{members}");
    }
}

#[tokio::test]
async fn kill_and_restart_keep_the_data() {
    let cluster = start(ClusterConfig::new(1)).await;
    let put = cluster
        .client(0)
        .await
        .expect("client")
        .put("kept", "value", None)
        .await
        .expect("put");
    let revision = put.header().expect("header").revision();
    cluster.kill(0).expect("kill");
    assert!(!cluster.is_running(0));
    assert!(cluster.pid(0).is_none());
    assert!(
        cluster.kill(0).is_err(),
        "killing a stopped member is an error"
    );
    let down = cluster
        .client(0)
        .await
        .expect("client")
        .get("kept", None)
        .await;
    assert!(down.is_err(), "a killed member must not answer: {down:?}");

    cluster.restart_and_wait(0).await.expect("restart");
    assert!(
        cluster.restart(0).is_err(),
        "restarting a running member is an error"
    );
    let got = cluster
        .get_prefix(0, "kept", false)
        .await
        .expect("read after restart");
    assert_eq!(got.kvs().len(), 1);
    assert_eq!(got.kvs()[0].value(), b"value");
    assert_eq!(got.kvs()[0].mod_revision(), revision);
    let log = std::fs::read_to_string(cluster.dir().join("m0.log")).expect("member log");
    assert!(
        log.contains("==== harness: start #2 of m0"),
        "restart is logged"
    );
    let command_line = |start: &str| {
        let marker = format!("==== harness: start #{start} of m0: ");
        let line = log.lines().find(|line| line.starts_with(&marker));
        line.expect("start line")
            .trim_start_matches(&marker)
            .to_string()
    };
    assert_eq!(
        command_line("1"),
        command_line("2"),
        "a restart uses the original flags"
    );
    assert!(command_line("1").contains("--initial-cluster-state=new"));
}

#[tokio::test]
async fn dropping_a_cluster_reaps_every_member() {
    let cluster = start(ClusterConfig::new(3)).await;
    let pids: Vec<u32> = (0..3).filter_map(|i| cluster.pid(i)).collect();
    assert_eq!(pids.len(), 3);
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    retry_until("members to disappear", REAP_TIMEOUT, || async {
        let alive: Vec<_> = pids
            .iter()
            .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        anyhow::ensure!(alive.is_empty(), "still alive: {alive:?}");
        Ok(())
    })
    .await
    .expect("no member survives the drop");
    assert!(!dir.exists(), "the temporary directory is removed");
}

#[tokio::test]
async fn normalized_outputs_of_two_instances_are_identical() {
    let mut pair = Differential::start_with(candidate(), candidate(), ClusterConfig::new(1))
        .await
        .expect("two instances");
    let commands: [&[&str]; 8] = [
        &["put", "n", "1", "-w", "json"],
        &["get", "n", "-w", "json"],
        &["get", "n", "-w", "fields"],
        &["endpoint", "status"],
        &["endpoint", "status", "-w", "json"],
        &["endpoint", "health"],
        &["member", "list"],
        &["member", "list", "-w", "json"],
    ];
    for args in commands {
        let normalized = pair.ctl(args).await;
        assert!(normalized.success(), "{normalized}");
        let raw_a = pair.oracle.ctl35.run(args).await.expect("etcdctl");
        let raw_b = pair.candidate.ctl35.run(args).await.expect("etcdctl");
        assert_ne!(
            raw_a.stdout, raw_b.stdout,
            "raw outputs of {args:?} differ between instances, so the comparison relies on normalization"
        );
    }
    assert_eq!(pair.steps(), commands.len());
}
