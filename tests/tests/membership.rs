//! Cluster membership changes with etcdctl, as an operator does them.
//!
//! - A live 3-member cluster is grown to 4 (`member add --learner`, a 4th
//!   process started with `--initial-cluster-state existing` and the
//!   `ETCD_INITIAL_CLUSTER` that `member add` printed, wait until the learner
//!   has applied the leader's log, `member promote` retried while the leader
//!   answers "not in sync"), then shrunk back to 3 (`member remove` of an
//!   original member, a follower or, in a second variant, the leader; then
//!   its process is stopped), while a client keeps
//!   writing unique keys. Afterwards every acknowledged write is served by
//!   every remaining member (serializable reads after a linearizable
//!   barrier) with its exact value and mod revision, no key that was never
//!   written appears, and `member list` shows exactly the remaining members,
//!   all started voters with their names. The scenario runs against the
//!   candidate and, with the same assertions, against real etcd 3.5. Before
//!   its promotion the learner serves Status and serializable reads and
//!   refuses the rest at once, as etcd's learner does.
//! - Error cases compared with etcd 3.5 (etcdctl output normalized, and the
//!   gRPC code and message through etcd-client): promoting a voter, promoting
//!   an unstarted learner, removing an unknown id and an already removed one,
//!   adding a member with an existing peer URL, adding a second learner.
//! - `--max-learners` raises that limit (candidate only: etcd 3.5.1 has no
//!   such flag).
//!
//! Run: `STORE_BIN=/root/.cache/etcd-rs/target/release/store cargo test -p integration-tests --test integration membership::`

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{GetOptions, MemberAddOptions};
use integration_tests::client::{connect, describe_error};
use integration_tests::cluster::TRANSIENT_RECONFIG_ERRORS;
use integration_tests::differential::Side;
use integration_tests::net::{allocate_ip, client_url, peer_url};
use integration_tests::wait::retry_until;
use integration_tests::writer::{write_until_stopped, Writes};
use integration_tests::{
    normalize, Binary, Cluster, ClusterConfig, CtlOutput, Differential, Etcdctl, MemberFlags,
    Process,
};
use regex::Regex;

/// Members of the cluster before it is grown and after it is shrunk.
const MEMBERS: usize = 3;
/// Name of the member added by the grow step.
const NEW_MEMBER: &str = "m3";
/// Key prefix of the background writer.
const WRITER_PREFIX: &str = "w/";
/// Pause between two writes of the background writer (it is a steady
/// client, not a load generator).
const WRITE_PAUSE: Duration = Duration::from_millis(20);
/// Deadline for a membership request rejected with a transient error
/// (etcd refuses reconfiguration until every voter has been connected for
/// 5 s, and promotion until the learner is in sync) to be accepted.
const RECONFIG_TIMEOUT: Duration = Duration::from_secs(90);
/// Pause between two attempts of a rejected membership request.
const RECONFIG_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Deadline for the new member to start, learn the cluster and answer Status.
const JOIN_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline for the learner to apply the leader's log up to the index the
/// leader had once the learner answered.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline for the promoted member to serve linearizable reads.
const PROMOTED_READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Acknowledged writes required after the shrink (the cluster still takes
/// writes with its new membership).
const WRITES_AFTER_SHRINK: usize = 20;
/// Deadline for those writes.
const WRITES_AFTER_SHRINK_TIMEOUT: Duration = Duration::from_secs(90);
/// Acknowledged writes required before the grow starts (the writer is
/// running when the membership changes).
const WRITES_BEFORE_GROW: usize = 10;
/// Deadline for those writes.
const WRITES_BEFORE_GROW_TIMEOUT: Duration = Duration::from_secs(60);
/// etcd derives a new member's id from its peer URLs and the Unix time in
/// seconds, so two `member add` with the same URLs in the same second get
/// the same id ("member ID already exist") rather than "Peer URLs already
/// exists": steps re-using a URL wait until this much has passed.
const ETCD_MEMBER_ID_CLOCK: Duration = Duration::from_millis(1100);
/// Deadline for the writer task to stop once told to.
const WRITER_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for a member's serializable reads to reach the barrier revision.
const CONVERGENCE_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline for `member list` to show the final membership on every member.
const MEMBER_LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of the added member's log printed when a test fails.
const LOG_TAIL_LINES: usize = 60;
/// A member id no cluster of these tests has (ids are hashes of peer URLs
/// and the cluster token, or random).
const UNKNOWN_MEMBER_ID: u64 = 0x1234_abcd;

/// The etcd error for promoting a learner that has not caught up.
const NOT_IN_SYNC: &str = "can only promote a learner member which is in sync with leader";

/// etcd's refusal of what a learner does not serve (UNAVAILABLE).
const NOT_FOR_LEARNER: &str = "etcdserver: rpc not supported for learner";

// ---------------------------------------------------------------------------
// A member started outside the harness (the one `member add` adds).
// ---------------------------------------------------------------------------

/// The command line of a member joining an existing cluster, with the same
/// timing flags as the harness's members.
fn joining_args(
    name: &str,
    ip: std::net::Ipv4Addr,
    dir: &Path,
    initial_cluster: &str,
    token: &str,
) -> Vec<String> {
    let mut flags = MemberFlags::new(name, ip, dir, initial_cluster, token);
    flags.existing = true;
    flags.args(&ClusterConfig::new(MEMBERS))
}

// ---------------------------------------------------------------------------
// etcdctl helpers.
// ---------------------------------------------------------------------------

fn ctl(endpoints: &[String]) -> Etcdctl {
    Etcdctl::new(
        Binary::etcdctl35().expect("etcdctl 3.5"),
        endpoints.to_vec(),
    )
}

/// Runs a membership command, retrying (bounded) while it fails with one of
/// `retry_on`; returns the final output, successful or not.
async fn reconfigure(ctl: &Etcdctl, args: &[&str], retry_on: &[&str]) -> Result<CtlOutput> {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let output = ctl.run(args).await?;
        let transient =
            !output.success() && retry_on.iter().any(|error| output.stderr.contains(error));
        if !transient {
            return Ok(output);
        }
        if started.elapsed() >= RECONFIG_TIMEOUT {
            bail!("etcdctl {args:?} still refused after {RECONFIG_TIMEOUT:?} ({attempts} attempts):\n{output}");
        }
        tokio::time::sleep(RECONFIG_RETRY_PAUSE).await;
    }
}

/// The value of `NAME="value"` in `member add`'s output.
fn printed_var(output: &CtlOutput, name: &str) -> Result<String> {
    let pattern = Regex::new(&format!(r#"(?m)^{name}="([^"]*)"$"#)).expect("valid pattern");
    Ok(pattern
        .captures(&output.stdout)
        .with_context(|| format!("member add printed no {name}:\n{output}"))?[1]
        .to_string())
}

/// The member id in `Member <hex> added to|promoted in|removed from cluster <hex>`.
fn printed_member_id(output: &CtlOutput, verb: &str) -> Result<u64> {
    let pattern = Regex::new(&format!(
        r"(?m)^Member +([0-9a-f]+) {verb} cluster +[0-9a-f]+$"
    ))
    .expect("valid pattern");
    let hex = &pattern
        .captures(&output.stdout)
        .with_context(|| format!("no `Member <id> {verb} cluster <id>` line:\n{output}"))?[1];
    Ok(u64::from_str_radix(hex, 16)?)
}

/// One member as `member list -w json` shows it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Listed {
    id: u64,
    name: String,
    peer_urls: Vec<String>,
    client_urls: Vec<String>,
    is_learner: bool,
}

async fn member_list(endpoint: &str) -> Result<Vec<Listed>> {
    let output = ctl(&[endpoint.to_string()])
        .run(&["member", "list", "-w", "json"])
        .await?;
    ensure!(
        output.success(),
        "member list through {endpoint} failed:\n{output}"
    );
    let json = output.json()?;
    let strings = |value: &serde_json::Value| -> Vec<String> {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut members: Vec<Listed> = json["members"]
        .as_array()
        .with_context(|| format!("member list without members:\n{output}"))?
        .iter()
        .map(|member| Listed {
            id: member["ID"].as_u64().unwrap_or(0),
            name: member["name"].as_str().unwrap_or("").to_string(),
            peer_urls: strings(&member["peerURLs"]),
            client_urls: strings(&member["clientURLs"]),
            is_learner: member["isLearner"].as_bool().unwrap_or(false),
        })
        .collect();
    members.sort();
    Ok(members)
}

// ---------------------------------------------------------------------------
// Grow to 4 and shrink to 3 under writes.
// ---------------------------------------------------------------------------

async fn member_status(endpoint: &str) -> Result<etcd_client::StatusResponse> {
    Ok(connect(&[endpoint.to_string()]).await?.status().await?)
}

/// Checks what the learner at `endpoint` serves: Status and a
/// serializable Get; a linearizable Get, a Put, MemberList and a Watch are
/// refused with [`NOT_FOR_LEARNER`] (etcd's `isRPCSupportedForLearner` and
/// its stream interceptor).
async fn check_learner_serves_reads_only(endpoint: &str) -> Result<()> {
    let mut client = connect(&[endpoint.to_string()]).await?;
    ensure!(client.status().await?.is_learner(), "not a learner");
    let serializable = GetOptions::new().with_serializable();
    client.get("health", Some(serializable)).await?;
    let refused = [
        (
            "linearizable get",
            client.get("health", None).await.map(drop),
        ),
        ("put", client.put("learner", "v", None).await.map(drop)),
        ("member list", client.member_list().await.map(drop)),
        ("watch", client.watch("learner", None).await.map(drop)),
    ];
    for (what, answer) in refused {
        match answer {
            Err(etcd_client::Error::GRpcStatus(status))
                if status.code() == tonic::Code::Unavailable
                    && status.message() == NOT_FOR_LEARNER => {}
            other => bail!("{what} on a learner: {other:?}"),
        }
    }
    Ok(())
}

/// Checks that `endpoint`, read serializably once it has applied
/// `barrier`, serves every acknowledged write exactly and nothing unattempted.
async fn check_writes(endpoint: &str, barrier: i64, writes: &Writes) -> Result<usize> {
    let response = connect(&[endpoint.to_string()])
        .await?
        .get(
            WRITER_PREFIX,
            Some(GetOptions::new().with_prefix().with_serializable()),
        )
        .await?;
    let revision = response
        .header()
        .context("range without header")?
        .revision();
    ensure!(
        revision >= barrier,
        "{endpoint} has applied revision {revision}, barrier is {barrier}"
    );
    writes.check(endpoint, &response)
}

/// Which original member the shrink removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    /// A follower, chosen before the writer starts (the writer never talks
    /// to it).
    Follower,
    /// The leader at the time of the removal (the writer talks to every
    /// original member, the removed one included).
    Leader,
}

async fn grow_and_shrink_under_writes(binary: Binary, which: Victim) {
    let cluster = Cluster::start(binary.clone(), ClusterConfig::new(MEMBERS))
        .await
        .expect("starting the cluster");
    let token = cluster
        .flag(0, "initial-cluster-token")
        .expect("cluster token");
    let originals: Vec<String> = cluster.endpoints();
    let follower = match which {
        Victim::Follower => Some(
            cluster
                .follower()
                .await
                .expect("a follower to remove later"),
        ),
        Victim::Leader => None,
    };
    let writer_endpoints: Vec<String> = (0..MEMBERS)
        .filter(|&i| Some(i) != follower)
        .map(|i| cluster.endpoint(i))
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(write_until_stopped(
        writer_endpoints,
        WRITER_PREFIX,
        WRITE_PAUSE,
        stop.clone(),
        acknowledged.clone(),
    ));

    wait_for_writes(
        &acknowledged,
        0,
        WRITES_BEFORE_GROW,
        WRITES_BEFORE_GROW_TIMEOUT,
        "before the grow",
    )
    .await;

    // Grow: add a learner, start it, wait until it caught up, promote it.
    let ip = allocate_ip().expect("address for the new member");
    let new_peer = peer_url(ip);
    let new_endpoint = client_url(ip);
    let ctl_originals = ctl(&originals);
    let added = reconfigure(
        &ctl_originals,
        &[
            "member",
            "add",
            NEW_MEMBER,
            "--learner",
            &format!("--peer-urls={new_peer}"),
        ],
        &TRANSIENT_RECONFIG_ERRORS,
    )
    .await
    .expect("etcdctl member add");
    assert!(added.success(), "member add --learner failed:\n{added}");
    let new_id = printed_member_id(&added, "added to").expect("added member id");
    assert_eq!(
        printed_var(&added, "ETCD_NAME").unwrap(),
        NEW_MEMBER,
        "{added}"
    );
    assert_eq!(
        printed_var(&added, "ETCD_INITIAL_ADVERTISE_PEER_URLS").unwrap(),
        new_peer,
        "{added}"
    );
    assert_eq!(
        printed_var(&added, "ETCD_INITIAL_CLUSTER_STATE").unwrap(),
        "existing",
        "{added}"
    );
    let initial_cluster = printed_var(&added, "ETCD_INITIAL_CLUSTER").unwrap();
    let mut expected_initial: Vec<String> = (0..MEMBERS)
        .map(|i| format!("m{i}={}", cluster.peer_url(i)))
        .chain([format!("{NEW_MEMBER}={new_peer}")])
        .collect();
    expected_initial.sort();
    let mut printed_initial: Vec<String> = initial_cluster.split(',').map(str::to_string).collect();
    printed_initial.sort();
    assert_eq!(
        printed_initial, expected_initial,
        "ETCD_INITIAL_CLUSTER printed by member add:\n{added}"
    );

    let listed = member_list(&originals[0])
        .await
        .expect("member list with the learner");
    let learner = listed.iter().find(|member| member.id == new_id);
    assert!(
        matches!(learner, Some(member) if member.is_learner && member.name.is_empty() && member.peer_urls == [new_peer.clone()]),
        "member list right after `member add --learner` must show {new_id:x} as an unstarted learner: {listed:#?}"
    );

    let extra = Process::start(
        &binary,
        NEW_MEMBER,
        &cluster.dir().join(format!("{NEW_MEMBER}.log")),
        &joining_args(NEW_MEMBER, ip, cluster.dir(), &initial_cluster, &token),
    )
    .expect("starting the new member");
    let status = retry_until("the new member to answer Status", JOIN_TIMEOUT, || async {
        member_status(&new_endpoint).await
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}\n{}{}",
            extra.log_tail_lines(LOG_TAIL_LINES),
            cluster.log_tails()
        )
    });
    assert_eq!(
        status.header().map(|header| header.member_id()),
        Some(new_id),
        "the new member's id must be the one `member add` announced"
    );
    assert!(
        status.is_learner(),
        "the new member must report itself as a learner: {status:?}"
    );

    let leader = cluster.leader().await.expect("leader");
    let target = cluster
        .status(leader)
        .await
        .expect("leader status")
        .raft_index();
    retry_until(
        "the learner to apply the leader's log",
        CATCH_UP_TIMEOUT,
        || async {
            extra.ensure_running()?;
            let applied = member_status(&new_endpoint).await?.raft_applied_index();
            ensure!(
                applied >= target,
                "learner applied index {applied} < leader index {target}"
            );
            Ok(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", extra.log_tail_lines(LOG_TAIL_LINES)));
    check_learner_serves_reads_only(&new_endpoint)
        .await
        .unwrap_or_else(|e| panic!("{binary:?}: {e:#}"));

    let new_hex = format!("{new_id:x}");
    let mut retry_promote = TRANSIENT_RECONFIG_ERRORS.to_vec();
    retry_promote.push(NOT_IN_SYNC);
    let promoted = reconfigure(
        &ctl_originals,
        &["member", "promote", &new_hex],
        &retry_promote,
    )
    .await
    .expect("etcdctl member promote");
    assert!(promoted.success(), "member promote failed:\n{promoted}");
    assert_eq!(
        printed_member_id(&promoted, "promoted in").unwrap(),
        new_id,
        "{promoted}"
    );
    retry_until(
        "the promoted member to serve linearizable reads",
        PROMOTED_READY_TIMEOUT,
        || async {
            extra.ensure_running()?;
            let mut client = connect(std::slice::from_ref(&new_endpoint)).await?;
            let status = client.status().await?;
            ensure!(!status.is_learner(), "still a learner: {status:?}");
            client.get("health", None).await?;
            Ok(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", extra.log_tail_lines(LOG_TAIL_LINES)));
    let after_grow = acknowledged.load(Ordering::Relaxed);

    // Shrink: remove one of the original members, then stop its process.
    let victim = match follower {
        Some(follower) => follower,
        None => retry_until(
            "the leader to be one of the original members",
            PROMOTED_READY_TIMEOUT,
            || async {
                let leader = member_status(&new_endpoint).await?.leader();
                for i in 0..MEMBERS {
                    if cluster.member_id(i).await? == leader {
                        return Ok(i);
                    }
                }
                bail!("the leader is {leader:x}, the added member")
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}")),
    };
    let victim_id = cluster.member_id(victim).await.expect("victim id");
    let stays: Vec<usize> = (0..MEMBERS).filter(|&i| i != victim).collect();
    let mut remaining: Vec<String> = stays.iter().map(|&i| cluster.endpoint(i)).collect();
    remaining.push(new_endpoint.clone());
    let victim_hex = format!("{victim_id:x}");
    let removed = reconfigure(
        &ctl(&remaining),
        &["member", "remove", &victim_hex],
        &TRANSIENT_RECONFIG_ERRORS,
    )
    .await
    .expect("etcdctl member remove");
    assert!(removed.success(), "member remove failed:\n{removed}");
    assert_eq!(
        printed_member_id(&removed, "removed from").unwrap(),
        victim_id,
        "{removed}"
    );
    cluster.kill(victim).expect("stopping the removed member");

    let shrunk_at = acknowledged.load(Ordering::Relaxed);
    wait_for_writes(
        &acknowledged,
        shrunk_at,
        WRITES_AFTER_SHRINK,
        WRITES_AFTER_SHRINK_TIMEOUT,
        "after the shrink",
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let writes = tokio::time::timeout(WRITER_STOP_TIMEOUT, writer)
        .await
        .expect("the writer stops")
        .expect("the writer task");
    eprintln!(
        "{} removing {which:?} m{victim}: {} acknowledged writes ({} before the grow finished, {} before the shrink), {} errors: {:?}",
        binary.role,
        writes.acknowledged.len(),
        after_grow,
        shrunk_at,
        writes.errors.len(),
        writes.errors.iter().take(5).collect::<Vec<_>>()
    );
    assert!(
        writes.acknowledged.len() >= WRITES_BEFORE_GROW + WRITES_AFTER_SHRINK,
        "only {} writes acknowledged during the whole scenario",
        writes.acknowledged.len()
    );

    // No acknowledged write is lost, on any remaining member.
    let barrier = connect(&remaining)
        .await
        .expect("client")
        .get(
            WRITER_PREFIX,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("linearizable barrier read")
        .header()
        .expect("header")
        .revision();
    let last_acknowledged = writes
        .acknowledged
        .values()
        .map(|(_, revision)| *revision)
        .max()
        .unwrap_or(0);
    assert!(
        barrier >= last_acknowledged,
        "barrier revision {barrier} < last acknowledged revision {last_acknowledged}"
    );
    for endpoint in &remaining {
        let served = retry_until(
            &format!("{endpoint} to serve every acknowledged write"),
            CONVERGENCE_TIMEOUT,
            || check_writes(endpoint, barrier, &writes),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e:#}\n{}{}",
                extra.log_tail_lines(LOG_TAIL_LINES),
                cluster.log_tails()
            )
        });
        assert!(served >= writes.acknowledged.len());
    }

    // member list: exactly the remaining members, started voters with names.
    let mut expected_names: Vec<String> = stays.iter().map(|i| format!("m{i}")).collect();
    expected_names.push(NEW_MEMBER.to_string());
    expected_names.sort();
    for endpoint in &remaining {
        retry_until(
            &format!("member list through {endpoint}"),
            MEMBER_LIST_TIMEOUT,
            || async {
                let members = member_list(endpoint).await?;
                let mut names: Vec<String> =
                    members.iter().map(|member| member.name.clone()).collect();
                names.sort();
                ensure!(
                    names == expected_names,
                    "names {names:?}, expected {expected_names:?}: {members:#?}"
                );
                ensure!(
                    members
                        .iter()
                        .all(|member| !member.is_learner && !member.client_urls.is_empty()),
                    "every member must be a started voter: {members:#?}"
                );
                ensure!(
                    members.iter().all(|member| member.id != victim_id),
                    "removed member {victim_id:x} still listed: {members:#?}"
                );
                ensure!(
                    members.iter().any(|member| member.id == new_id),
                    "added member {new_id:x} missing: {members:#?}"
                );
                let new = members
                    .iter()
                    .find(|member| member.id == new_id)
                    .expect("checked");
                ensure!(
                    new.peer_urls == [new_peer.clone()]
                        && new.client_urls == [new_endpoint.clone()],
                    "{new:#?}"
                );
                Ok(())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
    let simple = ctl(&remaining)
        .run(&["member", "list"])
        .await
        .expect("member list");
    assert!(simple.success(), "{simple}");
    assert_eq!(simple.stdout.lines().count(), MEMBERS, "{simple}");
    assert!(
        simple
            .stdout
            .lines()
            .all(|line| line.contains(", started, ") && line.ends_with(", false")),
        "{simple}"
    );
    assert!(
        !simple.stdout.contains(&victim_hex),
        "removed member still listed:\n{simple}"
    );
}

/// Waits until `count` writes were acknowledged after the first `from`.
async fn wait_for_writes(
    acknowledged: &AtomicUsize,
    from: usize,
    count: usize,
    deadline: Duration,
    when: &str,
) {
    retry_until(
        &format!("{count} acknowledged writes {when}"),
        deadline,
        || {
            let done = acknowledged.load(Ordering::Relaxed) - from;
            async move {
                ensure!(done >= count, "{done} of {count} writes");
                Ok(())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_and_shrink_under_writes_candidate() {
    let binary = Binary::candidate().expect("candidate server binary");
    grow_and_shrink_under_writes(binary, Victim::Follower).await;
}

/// The same scenario against real etcd 3.5: the assertions hold for the
/// reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_and_shrink_under_writes_etcd() {
    let binary = Binary::etcd35().expect("reference etcd 3.5");
    grow_and_shrink_under_writes(binary, Victim::Follower).await;
}

/// The shrink removes the leader (it steps down; the writer talked to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_and_shrink_removing_the_leader_candidate() {
    let binary = Binary::candidate().expect("candidate server binary");
    grow_and_shrink_under_writes(binary, Victim::Leader).await;
}

/// The same against real etcd 3.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_and_shrink_removing_the_leader_etcd() {
    let binary = Binary::etcd35().expect("reference etcd 3.5");
    grow_and_shrink_under_writes(binary, Victim::Leader).await;
}

// ---------------------------------------------------------------------------
// Error cases, compared with etcd.
// ---------------------------------------------------------------------------

/// `normalize` plus the member and cluster ids of `Member <id> ... cluster <id>`.
fn normalized(output: &CtlOutput) -> CtlOutput {
    let ids =
        Regex::new(r"Member +[0-9a-f]+ (added to|promoted in|removed from) cluster +[0-9a-f]+")
            .expect("valid pattern");
    let normalized = output.normalized();
    CtlOutput {
        stdout: ids
            .replace_all(
                &normalized.stdout,
                "Member <MEMBER_ID> $1 cluster <CLUSTER_ID>",
            )
            .into_owned(),
        stderr: ids
            .replace_all(
                &normalized.stderr,
                "Member <MEMBER_ID> $1 cluster <CLUSTER_ID>",
            )
            .into_owned(),
        code: normalized.code,
    }
}

/// `member list` of `side` as normalized lines in a stable order (members
/// are listed by id, and ids differ between the two servers).
async fn sorted_member_list(side: &Side) -> Vec<String> {
    let output = side
        .ctl35
        .run(&["member", "list"])
        .await
        .expect("member list");
    assert!(output.success(), "{output}");
    let mut lines: Vec<String> = normalize(&output.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// The id of `side`'s member named `name`.
async fn member_id_of(side: &Side, name: &str) -> u64 {
    let mut client = side.client.clone();
    let members = client.member_list().await.expect("member list");
    members
        .members()
        .iter()
        .find(|member| member.name() == name)
        .unwrap_or_else(|| panic!("no member {name}: {members:?}"))
        .id()
}

/// Runs `args` followed by a side-specific `last` argument (oracle's,
/// candidate's) on both sides, retrying transient reconfiguration refusals;
/// asserts that the normalized outputs are identical and returns the
/// oracle's.
async fn compare_ctl(step: &str, sides: [&Side; 2], args: &[&str], last: [&str; 2]) -> CtlOutput {
    let (mut oracle_args, mut candidate_args) = (args.to_vec(), args.to_vec());
    oracle_args.push(last[0]);
    candidate_args.push(last[1]);
    let (expected, actual) = tokio::join!(
        reconfigure(&sides[0].ctl35, &oracle_args, &TRANSIENT_RECONFIG_ERRORS),
        reconfigure(&sides[1].ctl35, &candidate_args, &TRANSIENT_RECONFIG_ERRORS)
    );
    let expected = normalized(&expected.expect("etcdctl on the oracle"));
    let actual = normalized(&actual.expect("etcdctl on the candidate"));
    assert_eq!(
        expected, actual,
        "{step}: etcdctl output differs\n===== oracle (reference etcd) =====\n{expected}\n===== candidate =====\n{actual}"
    );
    expected
}

/// Compares the gRPC outcome (code and message) of one membership RPC.
fn compare_rpc<T: std::fmt::Debug>(
    step: &str,
    oracle: &Result<T, etcd_client::Error>,
    candidate: &Result<T, etcd_client::Error>,
) -> String {
    let describe = |result: &Result<T, etcd_client::Error>| match result {
        Ok(_) => "ok".to_string(),
        Err(error) => describe_error(error),
    };
    let (expected, actual) = (describe(oracle), describe(candidate));
    assert_eq!(
        expected, actual,
        "{step}: etcd-client outcome differs (oracle left, candidate right)"
    );
    expected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_errors_match_etcd() {
    let d = Differential::start_with(
        Binary::etcd35().expect("reference etcd 3.5"),
        Binary::candidate().expect("candidate server binary"),
        ClusterConfig::new(MEMBERS),
    )
    .await
    .expect("starting both clusters");
    let (oracle, candidate) = (&d.oracle, &d.candidate);
    let sides = [oracle, candidate];

    // An unstarted learner (its address is reserved but nothing listens).
    let learner_peers: Vec<String> = sides
        .iter()
        .map(|_| peer_url(allocate_ip().expect("address")))
        .collect();
    let mut learner_ids = Vec::new();
    for (side, peer) in sides.iter().zip(&learner_peers) {
        let output = reconfigure(
            &side.ctl35,
            &[
                "member",
                "add",
                "lrn",
                "--learner",
                &format!("--peer-urls={peer}"),
            ],
            &TRANSIENT_RECONFIG_ERRORS,
        )
        .await
        .expect("member add --learner");
        assert!(
            output.success(),
            "{}: member add --learner failed:\n{output}",
            side.cluster.binary().role
        );
        learner_ids.push(format!(
            "{:x}",
            printed_member_id(&output, "added to").expect("learner id")
        ));
    }
    let learner_added = Instant::now();
    let (expected, actual) = (
        sorted_member_list(oracle).await,
        sorted_member_list(candidate).await,
    );
    assert_eq!(
        expected, actual,
        "member list with an unstarted learner (oracle left, candidate right)"
    );
    assert!(
        expected
            .iter()
            .any(|line| line.contains(", unstarted, , ") && line.ends_with(", true")),
        "{expected:#?}"
    );

    // A second learner.
    let second: Vec<String> = sides
        .iter()
        .map(|_| peer_url(allocate_ip().expect("address")))
        .collect();
    let output = compare_ctl(
        "second learner",
        sides,
        &["member", "add", "lrn2", "--learner"],
        [
            &format!("--peer-urls={}", second[0]),
            &format!("--peer-urls={}", second[1]),
        ],
    )
    .await;
    assert!(
        output
            .stderr
            .contains("etcdserver: too many learner members in cluster"),
        "{output}"
    );

    // An existing peer URL: a voter's, and the learner's.
    let m0_peers: Vec<String> = sides.iter().map(|side| side.cluster.peer_url(0)).collect();
    let output = compare_ctl(
        "existing peer URL",
        sides,
        &["member", "add", "dup"],
        [
            &format!("--peer-urls={}", m0_peers[0]),
            &format!("--peer-urls={}", m0_peers[1]),
        ],
    )
    .await;
    assert!(
        output
            .stderr
            .contains("etcdserver: Peer URLs already exists"),
        "{output}"
    );
    tokio::time::sleep(ETCD_MEMBER_ID_CLOCK.saturating_sub(learner_added.elapsed())).await;
    let output = compare_ctl(
        "the learner's peer URL",
        sides,
        &["member", "add", "dup"],
        [
            &format!("--peer-urls={}", learner_peers[0]),
            &format!("--peer-urls={}", learner_peers[1]),
        ],
    )
    .await;
    assert!(
        output
            .stderr
            .contains("etcdserver: Peer URLs already exists"),
        "{output}"
    );

    // Promote a voter, and the learner that is not in sync.
    let voters = [
        format!("{:x}", member_id_of(oracle, "m1").await),
        format!("{:x}", member_id_of(candidate, "m1").await),
    ];
    let output = compare_ctl(
        "promote a voter",
        sides,
        &["member", "promote"],
        [&voters[0], &voters[1]],
    )
    .await;
    assert!(
        output
            .stderr
            .contains("etcdserver: can only promote a learner member"),
        "{output}"
    );
    let output = compare_ctl(
        "promote an unstarted learner",
        sides,
        &["member", "promote"],
        [&learner_ids[0], &learner_ids[1]],
    )
    .await;
    assert!(output.stderr.contains(NOT_IN_SYNC), "{output}");

    // Remove an unknown id.
    let unknown = format!("{UNKNOWN_MEMBER_ID:x}");
    let output = compare_ctl(
        "remove an unknown id",
        sides,
        &["member", "remove"],
        [&unknown, &unknown],
    )
    .await;
    assert!(
        output.stderr.contains("etcdserver: member not found"),
        "{output}"
    );

    // The same through etcd-client: gRPC code and message.
    let mut outcomes = Vec::new();
    for side in sides {
        let mut client = side.client.clone();
        let voter = member_id_of(side, "m2").await;
        let m0_peer = side.cluster.peer_url(0);
        let fresh = peer_url(allocate_ip().expect("address"));
        outcomes.push([
            client.member_promote(voter).await.map(|_| ()),
            client.member_remove(UNKNOWN_MEMBER_ID).await.map(|_| ()),
            client.member_add([m0_peer], None).await.map(|_| ()),
            client
                .member_add([fresh], Some(MemberAddOptions::new().with_is_learner()))
                .await
                .map(|_| ()),
        ]);
    }
    for (i, step) in [
        "promote a voter",
        "remove an unknown id",
        "add an existing peer URL",
        "add a second learner",
    ]
    .iter()
    .enumerate()
    {
        let outcome = compare_rpc(step, &outcomes[0][i], &outcomes[1][i]);
        assert_ne!(outcome, "ok", "{step} must fail on etcd");
    }

    // Remove the learner, then remove it again.
    let output = compare_ctl(
        "remove the learner",
        sides,
        &["member", "remove"],
        [&learner_ids[0], &learner_ids[1]],
    )
    .await;
    assert!(output.success(), "{output}");
    let output = compare_ctl(
        "remove the removed learner again",
        sides,
        &["member", "remove"],
        [&learner_ids[0], &learner_ids[1]],
    )
    .await;
    assert!(!output.success(), "{output}");
    let (expected, actual) = (
        sorted_member_list(oracle).await,
        sorted_member_list(candidate).await,
    );
    assert_eq!(
        expected, actual,
        "member list after removing the learner (oracle left, candidate right)"
    );
    assert_eq!(expected.len(), MEMBERS, "{expected:#?}");
}

/// `--max-learners` (etcd 3.6; 3.5.1 knows only its default of one): a
/// cluster started with 2 takes two learners and refuses a third with
/// etcd's error.
#[tokio::test]
async fn max_learners_bounds_the_learners_member_add_takes() {
    let mut config = ClusterConfig::new(1);
    config.extra_args = vec!["--max-learners=2".to_string()];
    let cluster = Cluster::start(Binary::candidate().expect("candidate"), config)
        .await
        .expect("cluster");
    let mut client = cluster.client(0).await.expect("client");
    let learner = || Some(MemberAddOptions::new().with_is_learner());
    for _ in 0..2 {
        let url = peer_url(allocate_ip().expect("address"));
        client
            .member_add([url], learner())
            .await
            .expect("a learner within the limit");
    }
    let url = peer_url(allocate_ip().expect("address"));
    let refused = client
        .member_add([url], learner())
        .await
        .expect_err("a third learner");
    assert_eq!(
        describe_error(&refused),
        "gRPC error code=FailedPrecondition message=\"etcdserver: too many learner members in cluster\""
    );
}
