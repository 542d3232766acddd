//! Leadership transfer (`Maintenance.MoveLeader`, `etcdctl move-leader`),
//! against reference etcd 3.5 and the candidate.
//!
//! - `move_leader_matches_etcd`: the same steps on a 3-member etcd 3.5
//!   cluster and a 3-member candidate cluster; etcdctl 3.5 and 3.4 outputs
//!   and etcd-client results are compared after normalization (member ids
//!   are replaced by their role: old leader, target, ...). Steps: move to a
//!   follower (then every member reports it as leader and a write right
//!   after succeeds), move to the leader itself, `-w json`, a non-member id,
//!   id 0, a learner, only a follower endpoint given ("no leader endpoint"),
//!   MoveLeader sent to a follower ("not leader"), and moving back and forth.
//! - `transfers_under_writes_*`: 3 and 5 members, etcd and the candidate:
//!   leadership moves to every follower in turn, then back, while a client
//!   keeps writing unique keys through every endpoint; afterwards every
//!   acknowledged write is served by every member with its value and mod
//!   revision, and nothing that was not written. (Writes may fail during a
//!   transfer, on etcd they do; only acknowledged ones must survive.)
//! - `leader_stop_hands_over_*`: SIGTERM to the leader of 3 members while a
//!   client writes: it hands leadership over before it stops, as etcd's
//!   `Stop` does (both log etcd's `leadership transfer finished`), exits 0,
//!   and the two others serve every acknowledged write.
//! - `failed_transfer_leaves_a_working_cluster_candidate`: the target is
//!   killed after it has caught up; the transfer fails with etcd's
//!   "leader transfer took too long", and the old leader keeps leading
//!   (heartbeats resumed, no election) and serves writes and reads; once the
//!   target is back, a transfer to it succeeds. Candidate only: etcd ends
//!   such a transfer only when the client's deadline passes, so the two
//!   errors race with the client's own.
//!
//! How long each transfer took is printed (never asserted).
//!
//! Run: `STORE_BIN=/path/to/store cargo test --release -p integration-tests --test integration move_leader::`

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{GetOptions, MemberAddOptions};
use integration_tests::client::{connect, connect_with_timeout, describe, describe_error};
use integration_tests::cluster::TRANSIENT_RECONFIG_ERRORS;
use integration_tests::net::{allocate_ip, peer_url};
use integration_tests::wait::{permanent, retry_until};
use integration_tests::writer::{write_until_stopped, Writes};
use integration_tests::{normalize, Binary, Cluster, ClusterConfig, CtlOutput, Etcdctl};

/// A member id no cluster of these tests has (ids are hashes of peer URLs
/// and the cluster token).
const UNKNOWN_MEMBER_ID: u64 = 0x1234_abcd;
/// Deadline for every running member to agree on the expected leader after
/// a transfer was acknowledged (followers learn of it a moment later).
const LEADER_AGREEMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Key prefix of the background writer.
const WRITER_PREFIX: &str = "w/";
/// Pause between two writes of the background writer.
const WRITE_PAUSE: Duration = Duration::from_millis(5);
/// Acknowledged writes required before the first transfer and after each
/// one (so writes surround every transfer).
const WRITES_BETWEEN_TRANSFERS: usize = 20;
/// Deadline for those writes.
const WRITES_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for the writer to stop once told to.
const WRITER_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for a member's serializable reads to reach the barrier revision.
const CONVERGENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// Per-request timeout of the etcd-client that sends MoveLeader: longer
/// than any server-side bound, so the server's answer is what we see.
const MOVE_LEADER_CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for a learner to be added (etcd refuses reconfiguration for a
/// few seconds after start).
const RECONFIG_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the cluster is watched after a failed transfer: three default
/// election timeouts, during which a leader whose heartbeats were left off
/// would lose its followers.
const AFTER_FAILURE_WATCH: Duration = Duration::from_secs(3);

fn ctl35(endpoints: Vec<String>) -> Etcdctl {
    Etcdctl::new(Binary::etcdctl35().expect("etcdctl 3.5"), endpoints)
}

/// etcdctl 3.4 with `host:port` endpoints: given URLs, its per-endpoint
/// clients (move-leader's Status probes, `endpoint status`) send the whole
/// URL as the HTTP/2 `:authority`, which etcd's Go server accepts and the
/// candidate's HTTP/2 stack (h2) resets as malformed.
fn ctl34(endpoints: Vec<String>) -> Etcdctl {
    let endpoints = endpoints
        .iter()
        .map(|e| e.trim_start_matches("http://").to_string())
        .collect();
    Etcdctl::new(Binary::etcdctl34().expect("etcdctl 3.4"), endpoints)
}

/// Member ids as etcdctl prints them (lowercase hex, no padding), replaced
/// by role names, then the usual normalization.
fn with_roles(text: &str, roles: &[(u64, &str)]) -> String {
    let mut text = text.to_string();
    for (id, role) in roles {
        text = text.replace(&format!("{id:x}"), role);
    }
    normalize(&text)
}

fn ctl_with_roles(output: &CtlOutput, roles: &[(u64, &str)]) -> String {
    format!(
        "exit code: {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        output.code,
        with_roles(&output.stdout, roles),
        with_roles(&output.stderr, roles)
    )
}

/// Waits until every running member reports member `expected` as leader.
async fn wait_leader(cluster: &Cluster, expected: usize) -> Result<()> {
    let expected_id = cluster.member_id(expected).await?;
    retry_until(
        &format!("every member to report m{expected} as leader"),
        LEADER_AGREEMENT_TIMEOUT,
        || async {
            for i in cluster.running() {
                let leader = cluster.status(i).await?.leader();
                ensure!(
                    leader == expected_id,
                    "m{i} reports leader {leader:x}, expected {expected_id:x}"
                );
            }
            Ok(())
        },
    )
    .await
}

/// `etcdctl move-leader` through every endpoint; prints how long it took.
async fn move_leader_ctl(ctl: &Etcdctl, cluster: &Cluster, target: usize) -> Result<CtlOutput> {
    let id = cluster.member_id(target).await?;
    let started = Instant::now();
    let output = ctl.run(&["move-leader", &format!("{id:x}")]).await?;
    eprintln!(
        "{}: etcdctl move-leader to m{target} took {:?}",
        cluster.binary().role,
        started.elapsed()
    );
    Ok(output)
}

// ---------------------------------------------------------------------------
// Outputs compared with etcd.
// ---------------------------------------------------------------------------

/// What one side printed or answered at each step, normalized.
type Transcript = Vec<(String, String)>;

/// Runs the comparison scenario on one cluster and returns its transcript.
/// Assertions that do not need the other side are made here.
async fn scenario(cluster: &Cluster) -> Result<Transcript> {
    let role = cluster.binary().role.clone();
    let mut out: Transcript = Vec::new();
    let all = cluster.endpoints();
    let ctl = ctl35(all.clone());

    let leader = cluster.leader().await?;
    let target = cluster.follower().await?;
    let other = (0..cluster.size())
        .find(|i| *i != leader && *i != target)
        .context("a third member")?;
    let (leader_id, target_id, other_id) = (
        cluster.member_id(leader).await?,
        cluster.member_id(target).await?,
        cluster.member_id(other).await?,
    );
    let roles = [
        (leader_id, "<OLD_LEADER>"),
        (target_id, "<TARGET>"),
        (other_id, "<OTHER>"),
    ];

    // To a follower: the target leads, on every member's word, and takes a
    // write at once.
    let output = move_leader_ctl(&ctl, cluster, target).await?;
    ensure!(output.success(), "{role}: move-leader failed:\n{output}");
    out.push((
        "move-leader to a follower".into(),
        ctl_with_roles(&output, &roles),
    ));
    wait_leader(cluster, target).await?;
    let status = ctl.run(&["endpoint", "status", "-w", "json"]).await?;
    let leaders: BTreeSet<u64> = status
        .json()?
        .as_array()
        .context("endpoint status JSON is a list")?
        .iter()
        .filter_map(|e| e["Status"]["leader"].as_u64())
        .collect();
    ensure!(
        leaders == BTreeSet::from([target_id]),
        "{role}: endpoint status reports leaders {leaders:x?}, expected {target_id:x}:\n{status}"
    );
    let output = ctl.run(&["put", "after-move", "v1"]).await?;
    out.push((
        "put right after the move".into(),
        ctl_with_roles(&output, &roles),
    ));

    // To the leader itself.
    let output = move_leader_ctl(&ctl, cluster, target).await?;
    out.push((
        "move-leader to the leader".into(),
        ctl_with_roles(&output, &roles),
    ));
    let output = ctl
        .run(&["move-leader", "-w", "json", &format!("{target_id:x}")])
        .await?;
    out.push((
        "move-leader -w json to the leader".into(),
        ctl_with_roles(&output, &roles),
    ));

    // Bad targets.
    for (what, id) in [("a non-member", UNKNOWN_MEMBER_ID), ("id 0", 0)] {
        let output = ctl.run(&["move-leader", &format!("{id:x}")]).await?;
        out.push((
            format!("move-leader to {what}"),
            ctl_with_roles(&output, &roles),
        ));
    }
    let output = ctl.run(&["move-leader", "not-hex"]).await?;
    out.push((
        "move-leader with a bad id".into(),
        ctl_with_roles(&output, &roles),
    ));
    let learner_id = add_learner(cluster).await?;
    let learner_roles = [&roles[..], &[(learner_id, "<LEARNER>")]].concat();
    let output = ctl
        .run(&["move-leader", &format!("{learner_id:x}")])
        .await?;
    out.push((
        "move-leader to a learner".into(),
        ctl_with_roles(&output, &learner_roles),
    ));

    // Only a follower's endpoint given.
    let output = ctl35(vec![cluster.endpoint(other)])
        .run(&["move-leader", &format!("{leader_id:x}")])
        .await?;
    out.push((
        "move-leader through a follower endpoint only".into(),
        ctl_with_roles(&output, &roles),
    ));

    // The RPC itself, sent to a follower and to the leader.
    let mut follower =
        connect_with_timeout(&[cluster.endpoint(other)], MOVE_LEADER_CLIENT_TIMEOUT).await?;
    let result = follower.move_leader(leader_id).await;
    out.push((
        "MoveLeader sent to a follower".into(),
        with_roles(&describe(&result), &roles),
    ));
    let mut current =
        connect_with_timeout(&[cluster.endpoint(target)], MOVE_LEADER_CLIENT_TIMEOUT).await?;
    let result = current.move_leader(UNKNOWN_MEMBER_ID).await;
    out.push((
        "MoveLeader to a non-member".into(),
        with_roles(&describe(&result), &roles),
    ));
    let result = current.move_leader(learner_id).await;
    out.push((
        "MoveLeader to a learner".into(),
        with_roles(&describe(&result), &learner_roles),
    ));

    // Back and forth: back to the old leader over the RPC, to the target
    // again with etcdctl 3.4, and back once more with `-w json`.
    let started = Instant::now();
    let result = current.move_leader(leader_id).await;
    ensure!(result.is_ok(), "{role}: MoveLeader failed: {result:?}");
    eprintln!(
        "{role}: MoveLeader (etcd-client) back to m{leader} took {:?}",
        started.elapsed()
    );
    out.push((
        "MoveLeader back to the old leader".into(),
        with_roles(&describe(&result), &roles),
    ));
    wait_leader(cluster, leader).await?;
    let output = move_leader_ctl(&ctl34(all.clone()), cluster, target).await?;
    ensure!(output.success(), "{role}: move-leader failed:\n{output}");
    out.push((
        "move-leader (etcdctl 3.4) to the target again".into(),
        ctl_with_roles(&output, &roles),
    ));
    wait_leader(cluster, target).await?;
    let output = ctl
        .run(&["move-leader", "-w", "json", &format!("{leader_id:x}")])
        .await?;
    out.push((
        "move-leader -w json back to the old leader".into(),
        ctl_with_roles(&output, &roles),
    ));
    wait_leader(cluster, leader).await?;

    let output = ctl.run(&["get", "after-move"]).await?;
    out.push(("get at the end".into(), ctl_with_roles(&output, &roles)));
    Ok(out)
}

/// Adds an unstarted learner (nothing listens at its address) and returns
/// its id.
async fn add_learner(cluster: &Cluster) -> Result<u64> {
    let peer = peer_url(allocate_ip()?);
    let client = cluster.client_all().await?;
    retry_until("a learner to be added", RECONFIG_TIMEOUT, || {
        let (mut client, peer) = (client.clone(), peer.clone());
        async move {
            let options = MemberAddOptions::new().with_is_learner();
            match client.member_add([peer], Some(options)).await {
                Ok(response) => Ok(response.member().context("no member")?.id()),
                Err(error) => {
                    let text = describe_error(&error);
                    if TRANSIENT_RECONFIG_ERRORS.iter().any(|e| text.contains(e)) {
                        bail!("refused for now: {text}")
                    }
                    Err(permanent(text))
                }
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_matches_etcd() {
    let (oracle, candidate) = tokio::join!(
        Cluster::start(
            Binary::etcd35().expect("reference etcd 3.5"),
            ClusterConfig::new(3)
        ),
        Cluster::start(
            Binary::candidate().expect("candidate server"),
            ClusterConfig::new(3)
        )
    );
    let (oracle, candidate) = (
        oracle.expect("starting the etcd cluster"),
        candidate.expect("starting the candidate cluster"),
    );
    let expected = scenario(&oracle).await.expect("scenario on etcd 3.5");
    let actual = scenario(&candidate)
        .await
        .expect("scenario on the candidate");
    assert_eq!(expected.len(), actual.len());
    for ((step, expected), (_, actual)) in expected.iter().zip(&actual) {
        eprintln!("=== {step}\n{expected}");
        assert_eq!(
            expected, actual,
            "{step}: output differs\n===== reference etcd =====\n{expected}\n===== candidate =====\n{actual}"
        );
    }
}

// ---------------------------------------------------------------------------
// Transfers under writes.
// ---------------------------------------------------------------------------

async fn wait_for_writes(acknowledged: &AtomicUsize, at_least: usize) -> Result<()> {
    retry_until(
        &format!("{at_least} acknowledged writes"),
        WRITES_TIMEOUT,
        || async {
            let n = acknowledged.load(Ordering::Relaxed);
            ensure!(n >= at_least, "{n} acknowledged so far");
            Ok(())
        },
    )
    .await
}

/// Checks that member `i` serves every acknowledged write exactly and
/// nothing that was not attempted, once it has applied `barrier`.
async fn check_writes(cluster: &Cluster, i: usize, barrier: i64, writes: &Writes) -> Result<()> {
    let response = retry_until(
        &format!("m{i} to apply revision {barrier}"),
        CONVERGENCE_TIMEOUT,
        || async {
            let response = cluster
                .client(i)
                .await?
                .get(
                    WRITER_PREFIX,
                    Some(GetOptions::new().with_prefix().with_serializable()),
                )
                .await?;
            let revision = response.header().context("no header")?.revision();
            ensure!(revision >= barrier, "m{i} is at revision {revision}");
            Ok(response)
        },
    )
    .await?;
    writes.check(&format!("m{i}"), &response)?;
    Ok(())
}

/// The background writer of these tests: unique keys through every
/// endpoint, counted as they are acknowledged.
struct Writer {
    stop: Arc<AtomicBool>,
    acknowledged: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<Writes>,
}

impl Writer {
    /// Starts writing and waits for the first [`WRITES_BETWEEN_TRANSFERS`].
    async fn start(cluster: &Cluster) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(write_until_stopped(
            cluster.endpoints(),
            WRITER_PREFIX,
            WRITE_PAUSE,
            stop.clone(),
            acknowledged.clone(),
        ));
        let writer = Writer {
            stop,
            acknowledged,
            task,
        };
        writer.more("before the first fault").await;
        writer
    }

    /// Waits for [`WRITES_BETWEEN_TRANSFERS`] more acknowledged writes.
    async fn more(&self, when: &str) {
        let so_far = self.acknowledged.load(Ordering::Relaxed);
        wait_for_writes(&self.acknowledged, so_far + WRITES_BETWEEN_TRANSFERS)
            .await
            .unwrap_or_else(|e| panic!("writes {when}: {e:#}"));
    }

    /// Stops writing; then a linearizable barrier write through `members`,
    /// and each of them must serve every acknowledged write.
    async fn finish_and_check(self, cluster: &Cluster, members: &[usize]) -> Writes {
        let role = cluster.binary().role.clone();
        self.stop.store(true, Ordering::Relaxed);
        let writes = tokio::time::timeout(WRITER_STOP_TIMEOUT, self.task)
            .await
            .expect("the writer stops")
            .expect("the writer task");
        let endpoints: Vec<String> = members.iter().map(|&i| cluster.endpoint(i)).collect();
        let barrier = connect(&endpoints)
            .await
            .expect("client")
            .put("barrier", "", None)
            .await
            .expect("barrier write")
            .header()
            .expect("header")
            .revision();
        for &i in members {
            check_writes(cluster, i, barrier, &writes)
                .await
                .unwrap_or_else(|e| panic!("{role}: {e:#}"));
        }
        writes
    }
}

async fn transfers_under_writes(binary: Binary, size: usize) {
    let cluster = Cluster::start(binary, ClusterConfig::new(size))
        .await
        .expect("starting the cluster");
    let role = cluster.binary().role.clone();
    let ctl = ctl35(cluster.endpoints());
    let writer = Writer::start(&cluster).await;

    // To every follower in turn, then back to the first leader.
    let first = cluster.leader().await.expect("leader");
    let mut targets: Vec<usize> = (0..size).filter(|i| *i != first).collect();
    targets.push(first);
    for target in targets {
        let output = move_leader_ctl(&ctl, &cluster, target)
            .await
            .expect("etcdctl move-leader");
        assert!(
            output.success(),
            "{role}: move-leader to m{target} failed:\n{output}"
        );
        wait_leader(&cluster, target)
            .await
            .expect("the target leads");
        writer.more("after the transfer").await;
    }

    let all: Vec<usize> = (0..size).collect();
    let writes = writer.finish_and_check(&cluster, &all).await;
    eprintln!(
        "{role}, {size} members: {} writes acknowledged, {} failed: {:?}",
        writes.acknowledged.len(),
        writes.errors.len(),
        writes.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_under_writes_3_candidate() {
    transfers_under_writes(Binary::candidate().expect("candidate server"), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_under_writes_3_etcd() {
    transfers_under_writes(Binary::etcd35().expect("reference etcd 3.5"), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_under_writes_5_candidate() {
    transfers_under_writes(Binary::candidate().expect("candidate server"), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_under_writes_5_etcd() {
    transfers_under_writes(Binary::etcd35().expect("reference etcd 3.5"), 5).await;
}

// ---------------------------------------------------------------------------
// A graceful stop of the leader.
// ---------------------------------------------------------------------------

/// What the stopping leader logs once it has handed over: etcd's words
/// (`etcdserver/server.go`), which the store uses too.
const TRANSFER_FINISHED_LOG: &str = "leadership transfer finished";
/// SIGTERM's number on Linux.
const SIGTERM: i32 = 15;

/// Deadline of the leader's graceful stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

async fn leader_stop_hands_over(binary: Binary) {
    let cluster = Cluster::start(binary, ClusterConfig::new(3))
        .await
        .expect("starting the cluster");
    let role = cluster.binary().role.clone();
    let writer = Writer::start(&cluster).await;

    let leader = cluster.leader().await.expect("leader");
    let stopped = Instant::now();
    let status = cluster
        .terminate(leader, STOP_TIMEOUT)
        .await
        .expect("SIGTERM to the leader");
    eprintln!("{role}: the leader stopped after {:?}", stopped.elapsed());
    // etcd re-raises the signal once it has cleaned up; the store exits 0.
    let graceful = status.success() || status.signal() == Some(SIGTERM);
    assert!(graceful, "{role}: the leader exited with {status}");
    assert!(
        cluster.log(leader).contains(TRANSFER_FINISHED_LOG),
        "{role}: the stopping leader did not hand leadership over:\n{}",
        cluster.log_tail(leader)
    );
    let successor = cluster.leader().await.expect("a new leader");
    assert_ne!(successor, leader);
    writer.more("after the stop").await;
    writer.finish_and_check(&cluster, &cluster.running()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_stop_hands_over_candidate() {
    leader_stop_hands_over(Binary::candidate().expect("candidate server")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_stop_hands_over_etcd() {
    leader_stop_hands_over(Binary::etcd35().expect("reference etcd 3.5")).await;
}

// ---------------------------------------------------------------------------
// A transfer that cannot succeed.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_transfer_leaves_a_working_cluster_candidate() {
    let cluster = Cluster::start(
        Binary::candidate().expect("candidate server"),
        ClusterConfig::new(3),
    )
    .await
    .expect("starting the cluster");
    let leader = cluster.leader().await.expect("leader");
    let target = cluster.follower().await.expect("follower");
    let target_id = cluster.member_id(target).await.expect("target id");
    // The target has everything, then dies: the leader still sees it caught
    // up (nothing is written afterwards), so the transfer gets as far as
    // asking it to campaign.
    cluster
        .client_all()
        .await
        .expect("client")
        .put("before", "1", None)
        .await
        .expect("write before");
    cluster
        .wait_member_ready(target)
        .await
        .expect("target ready");
    cluster.kill(target).expect("killing the target");
    let term_before = cluster.status(leader).await.expect("status").raft_term();

    let mut client = connect_with_timeout(&[cluster.endpoint(leader)], MOVE_LEADER_CLIENT_TIMEOUT)
        .await
        .expect("client");
    let started = Instant::now();
    let result = client.move_leader(target_id).await;
    eprintln!("failed transfer answered after {:?}", started.elapsed());
    assert_eq!(
        describe(&result),
        "gRPC error code=Unavailable message=\"etcdserver: request timed out, leader transfer took too long\""
    );

    // The old leader keeps leading: no election while we watch, so its
    // heartbeats are back on.
    tokio::time::sleep(AFTER_FAILURE_WATCH).await;
    wait_leader(&cluster, leader)
        .await
        .expect("the old leader leads");
    let status = cluster.status(leader).await.expect("status");
    assert_eq!(
        status.raft_term(),
        term_before,
        "an election happened after the failed transfer"
    );
    let mut running = connect(&cluster.running_endpoints()).await.expect("client");
    running.put("after", "2", None).await.expect("write after");
    let got = running.get("after", None).await.expect("linearizable read");
    assert_eq!(got.kvs().len(), 1);

    // With the target back, the transfer works.
    cluster
        .restart_and_wait(target)
        .await
        .expect("restarting the target");
    let output = move_leader_ctl(&ctl35(cluster.endpoints()), &cluster, target)
        .await
        .expect("etcdctl move-leader");
    assert!(output.success(), "{output}");
    wait_leader(&cluster, target)
        .await
        .expect("the target leads");
    cluster
        .client_all()
        .await
        .expect("client")
        .put("last", "3", None)
        .await
        .expect("write at the end");
}
