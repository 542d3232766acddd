//! The Lock and Election services (`v3lockpb.Lock`,
//! `v3electionpb.Election`), differential against etcd 3.5.1, which serves
//! both: through the Rust `etcd-client` (its `lock`, `unlock`, `campaign`,
//! `proclaim`, `leader`, `observe` and `resign`), with etcdctl's client-side
//! recipes on the same keys, and under auth as a user with and without
//! permission.
//!
//! Each scenario runs on both servers at once and writes a transcript of
//! what it saw (keys, values, revisions, errors with their gRPC code); the
//! oracle's transcript is the expectation. Leases have fixed ids so that
//! the keys (`name/<lease in hex>`) are the same on both.
//!
//! Run: `cargo test --release -p integration-tests --test integration lock_election::`

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::{
    Client, GetOptions, LeaderKey, LeaseGrantOptions, LeaseTimeToLiveOptions, LockOptions,
    ProclaimOptions, ResignOptions, ResponseHeader,
};
use integration_tests::auth::UserClients;
use integration_tests::client::describe_error;
use integration_tests::differential::{assert_grpc_error, assert_ok, differential, Side};
use integration_tests::wait::retry_until;
use integration_tests::watchlease::{assert_same, CtlProcess};
use integration_tests::Differential;
use tokio::task::JoinHandle;

/// Leases with fixed ids, kept for longer than any test runs.
const LEASE_A: i64 = 0x1000;
const LEASE_B: i64 = 0x1001;
/// A lease that ends while its holder waits.
const LEASE_SHORT: i64 = 0x2000;
/// A lease that ends while its key holds a lock.
const LEASE_SHORT_HOLDER: i64 = 0x2001;
/// A lease id never granted.
const MISSING_LEASE: i64 = 0xabcdef;
const LONG_TTL_SECS: i64 = 600;
const SHORT_TTL_SECS: i64 = 3;
/// The TTL etcd gives the lease of a Lock or Campaign without one.
const SESSION_TTL_SECS: i64 = 60;
/// How long a waiter, watcher or expiry may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(60);
/// How long a waiter is given before the test checks it still waits, and
/// how long a Lock is let wait before its caller gives up.
const PATIENCE: Duration = Duration::from_millis(500);

fn same(d: &Differential, what: &str, oracle: &[String], candidate: &[String]) {
    assert_same(what, oracle, candidate, d.candidate.cluster.binary());
}

async fn grant(client: &Client, id: i64, ttl: i64) -> Result<()> {
    client
        .clone()
        .lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(id)))
        .await
        .with_context(|| format!("granting lease {id:x}"))?;
    Ok(())
}

/// The keys under `prefix`, linearizably.
async fn keys_under(client: &Client, prefix: &str) -> Result<Vec<String>> {
    let resp = client
        .clone()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect())
}

/// Waits until exactly `n` keys are under `prefix`.
async fn wait_keys(client: &Client, prefix: &str, n: usize) -> Result<()> {
    retry_until(&format!("{n} keys under {prefix}"), WAIT, || async {
        let keys = keys_under(client, prefix).await?;
        ensure!(keys.len() == n, "keys under {prefix}: {keys:?}");
        Ok(())
    })
    .await
}

fn rev(header: Option<&ResponseHeader>) -> i64 {
    header.map_or(-1, |h| h.revision())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A Lock's answer or error as a transcript line.
fn lock_line(what: &str, result: &Result<etcd_client::LockResponse, etcd_client::Error>) -> String {
    match result {
        Ok(r) => format!("{what}: key={} rev={}", text(r.key()), rev(r.header())),
        Err(e) => format!("{what}: {}", describe_error(e)),
    }
}

/// Any answer's header revision, or the error, as a transcript line.
fn header_line<T>(
    what: &str,
    result: &Result<T, etcd_client::Error>,
    header: impl Fn(&T) -> Option<&ResponseHeader>,
) -> String {
    match result {
        Ok(r) => format!("{what}: rev={}", rev(header(r))),
        Err(e) => format!("{what}: {}", describe_error(e)),
    }
}

fn leader_key_line(leader: Option<&LeaderKey>) -> String {
    leader.map_or("no leader key".into(), |l| {
        format!(
            "name={} key={} rev={} lease={:x}",
            text(l.name()),
            text(l.key()),
            l.rev(),
            l.lease()
        )
    })
}

/// A Lock of `name` with `lease` in its own task.
fn spawn_lock(
    client: &Client,
    name: &'static str,
    lease: i64,
) -> JoinHandle<Result<etcd_client::LockResponse, etcd_client::Error>> {
    let mut client = client.clone();
    tokio::spawn(async move {
        client
            .lock(name, Some(LockOptions::new().with_lease(lease)))
            .await
    })
}

/// A holder, two waiters served in order, a holder's Unlock, a waiter whose
/// lease ends while it waits (`mutex: session is expired`), a holder whose
/// lease ends, a Lock again with a held lease, Unlock of a key that is not
/// there, a lease that does not exist.
async fn lock_queue(side: &Side) -> Result<Vec<String>> {
    let client = &side.client;
    let mut c = client.clone();
    let mut out = Vec::new();
    grant(client, LEASE_A, LONG_TTL_SECS).await?;
    grant(client, LEASE_B, LONG_TTL_SECS).await?;
    grant(client, LEASE_SHORT, SHORT_TTL_SECS).await?;

    let a = c
        .lock("lk", Some(LockOptions::new().with_lease(LEASE_A)))
        .await;
    out.push(lock_line("A locks", &a));
    let again = c
        .lock("lk", Some(LockOptions::new().with_lease(LEASE_A)))
        .await;
    out.push(lock_line("A locks again", &again));
    let b = spawn_lock(client, "lk", LEASE_B);
    wait_keys(client, "lk/", 2).await?;
    let short = spawn_lock(client, "lk", LEASE_SHORT);
    wait_keys(client, "lk/", 3).await?;
    tokio::time::sleep(PATIENCE).await;
    out.push(format!("B waits while A holds: {}", !b.is_finished()));

    let unlocked = c.unlock(a?.key().to_vec()).await;
    out.push(header_line("A unlocks", &unlocked, |r| r.header()));
    let b = b.await?;
    out.push(lock_line("B locks", &b));

    // The short lease ends while its Lock waits behind B.
    wait_keys(client, "lk/", 1).await?;
    out.push(format!(
        "short waits while B holds: {}",
        !short.is_finished()
    ));
    let unlocked = c.unlock(b?.key().to_vec()).await;
    out.push(header_line("B unlocks", &unlocked, |r| r.header()));
    out.push(lock_line("short locks", &short.await?));

    // A holder whose lease ends passes the lock on.
    grant(client, LEASE_SHORT_HOLDER, SHORT_TTL_SECS).await?;
    let holder = c
        .lock(
            "lx",
            Some(LockOptions::new().with_lease(LEASE_SHORT_HOLDER)),
        )
        .await;
    out.push(lock_line("short holder locks", &holder));
    let next = spawn_lock(client, "lx", LEASE_B);
    out.push(lock_line(
        "B locks when the holder's lease ends",
        &next.await?,
    ));

    let missing = c.unlock("lk/ffff").await;
    out.push(header_line("unlock of no key", &missing, |r| r.header()));
    let no_lease = c
        .lock("lk", Some(LockOptions::new().with_lease(MISSING_LEASE)))
        .await;
    out.push(lock_line("lock with no such lease", &no_lease));
    out.push(format!("keys left: {:?}", keys_under(client, "lk/").await?));
    Ok(out)
}

#[tokio::test]
async fn locks_queue_in_order_and_pass_on_unlock_and_expiry() {
    let d = differential().await;
    let (oracle, candidate) = d.each(lock_queue).await;
    for needle in [
        "A locks: key=lk/1000",
        "B waits while A holds: true",
        "B locks: key=lk/1001",
        "short waits while B holds: true",
        "short locks: gRPC error code=Unknown message=\"mutex: session is expired\"",
        "B locks when the holder's lease ends: key=lx/1001",
        "lock with no such lease: gRPC error code=Unknown message=\"etcdserver: requested lease not found\"",
    ] {
        assert!(
            oracle.iter().any(|l| l.starts_with(needle)),
            "the oracle's transcript lacks {needle:?}:\n{}",
            oracle.join("\n")
        );
    }
    same(&d, "lock queue", &oracle, &candidate);
    // The gRPC metrics count the Lock service's calls by code, as etcd's:
    // rows made at a method's first call and a code's first answer.
    let (oracle, candidate) = d.each(|side| service_metrics(side, "v3lockpb.Lock")).await;
    assert!(
        oracle.iter().any(|l| l.contains(r#"grpc_code="Unknown""#)),
        "{oracle:?}"
    );
    same(&d, "Lock's gRPC metrics", &oracle, &candidate);
}

/// The `grpc_server_*` rows of `service` in a member's `/metrics`.
async fn service_metrics(side: &Side, service: &str) -> Result<Vec<String>> {
    let url = format!("{}/metrics", side.cluster.endpoint(0));
    let text = integration_tests::http::get(&url).await?.body;
    let label = format!(r#"grpc_service="{service}""#);
    let mut rows: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("grpc_server_") && l.contains(&label))
        .map(str::to_string)
        .collect();
    rows.sort();
    Ok(rows)
}

/// A waiter that gives up (its call dropped) leaves the queue: its key is
/// deleted. A Lock without a lease gets a new lease of 60 s.
async fn lock_give_up(side: &Side) -> Result<Vec<String>> {
    let client = &side.client;
    let mut c = client.clone();
    let mut out = Vec::new();
    grant(client, LEASE_A, LONG_TTL_SECS).await?;
    grant(client, LEASE_B, LONG_TTL_SECS).await?;
    let a = c
        .lock("gu", Some(LockOptions::new().with_lease(LEASE_A)))
        .await;
    out.push(lock_line("A locks", &a));
    let mut waiter = client.clone();
    let gave_up = tokio::time::timeout(PATIENCE, async {
        waiter
            .lock("gu", Some(LockOptions::new().with_lease(LEASE_B)))
            .await
    })
    .await;
    out.push(format!("B gave up: {}", gave_up.is_err()));
    wait_keys(client, "gu/", 1).await?;
    out.push(format!(
        "keys after B gave up: {:?}",
        keys_under(client, "gu/").await?
    ));
    let deleted = c.get("gu/1001", None).await?;
    out.push(format!(
        "revision after B gave up: {}",
        rev(deleted.header())
    ));

    // No lease: the key names a new lease of 60 s, not kept alive.
    let own = c.lock("own", None).await?;
    let key = text(own.key());
    let hex = key.strip_prefix("own/").context("a key under own/")?;
    let lease = i64::from_str_radix(hex, 16).context("the key ends in a lease id")?;
    let ttl = c
        .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await?;
    out.push(format!(
        "lock without a lease: rev={} granted ttl={} keys={:?}",
        rev(own.header()),
        ttl.granted_ttl(),
        ttl.keys().iter().map(|k| text(k)).collect::<Vec<_>>() == vec![key.clone()]
    ));
    Ok(out)
}

#[tokio::test]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let d = differential().await;
    let (oracle, candidate) = d.each(lock_give_up).await;
    for needle in [
        "B gave up: true",
        "keys after B gave up: [\"gu/1000\"]",
        &format!("lock without a lease: rev=5 granted ttl={SESSION_TTL_SECS} keys=true"),
    ] {
        assert!(
            oracle.iter().any(|l| l.starts_with(needle)),
            "the oracle's transcript lacks {needle:?}:\n{}",
            oracle.join("\n")
        );
    }
    same(&d, "a waiter gives up", &oracle, &candidate);
}

/// Collects an Observe's answers as transcript lines, in its own task.
fn spawn_observe(client: &Client, name: &'static str) -> tokio::sync::mpsc::Receiver<String> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let mut client = client.clone();
    tokio::spawn(async move {
        let mut stream = match client.observe(name).await {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(format!("observe: {}", describe_error(&e))).await;
                return;
            }
        };
        loop {
            let line = match stream.message().await {
                Ok(Some(r)) => match r.kv() {
                    Some(kv) => format!(
                        "observed: key={} value={} create={} mod={} rev={}",
                        text(kv.key()),
                        text(kv.value()),
                        kv.create_revision(),
                        kv.mod_revision(),
                        rev(r.header())
                    ),
                    None => "observed: no kv".into(),
                },
                Ok(None) => "observe ended".into(),
                Err(e) => format!("observe: {}", describe_error(&e)),
            };
            let end = !line.starts_with("observed: ");
            if tx.send(line).await.is_err() || end {
                return;
            }
        }
    });
    rx
}

/// The next line an observer sent.
async fn observed(rx: &mut tokio::sync::mpsc::Receiver<String>) -> Result<String> {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .context("waiting for the observer")?
        .context("the observer stopped")
}

/// Campaign, Leader, Proclaim and Resign with their errors, a second
/// candidate elected when the first resigns, and an observer started
/// before any candidate that sees every leader and value.
async fn election(side: &Side) -> Result<Vec<String>> {
    let client = &side.client;
    let mut c = client.clone();
    let mut out = Vec::new();
    grant(client, LEASE_A, LONG_TTL_SECS).await?;
    grant(client, LEASE_B, LONG_TTL_SECS).await?;
    let mut observer = spawn_observe(client, "el");

    let none = c.leader("el").await;
    out.push(header_line("leader of no one", &none, |r| r.header()));
    let a = c.campaign("el", "a1", LEASE_A).await?;
    out.push(format!(
        "A campaigns: rev={} {}",
        rev(a.header()),
        leader_key_line(a.leader())
    ));
    out.push(observed(&mut observer).await?);
    let leader = a.leader().context("a leader key")?.clone();
    let again = c.campaign("el", "a1", LEASE_A).await?;
    out.push(format!(
        "A campaigns again: rev={} {}",
        rev(again.header()),
        leader_key_line(again.leader())
    ));
    let with = || Some(ProclaimOptions::new().with_leader(leader.clone()));
    let proclaimed = c.proclaim("a2", with()).await;
    out.push(header_line("A proclaims", &proclaimed, |r| r.header()));
    out.push(observed(&mut observer).await?);
    let stale = LeaderKey::new()
        .with_name("el")
        .with_key(leader.key())
        .with_rev(leader.rev() - 1)
        .with_lease(LEASE_A);
    let wrong = c
        .proclaim("x", Some(ProclaimOptions::new().with_leader(stale.clone())))
        .await;
    out.push(header_line("proclaim with a stale key", &wrong, |r| {
        r.header()
    }));
    let no_key = c.proclaim("x", None).await;
    out.push(header_line("proclaim without a key", &no_key, |r| {
        r.header()
    }));

    let mut b_client = client.clone();
    let b = tokio::spawn(async move { b_client.campaign("el", "b1", LEASE_B).await });
    wait_keys(client, "el/", 2).await?;
    let led = c.leader("el").await?;
    out.push(format!(
        "leader while B waits: {} rev={} B waits: {}",
        led.kv().map_or(String::new(), |kv| text(kv.key())),
        rev(led.header()),
        !b.is_finished()
    ));
    let noop = c
        .resign(Some(ResignOptions::new().with_leader(stale)))
        .await;
    out.push(header_line("resign with a stale key", &noop, |r| {
        r.header()
    }));
    let resigned = c
        .resign(Some(ResignOptions::new().with_leader(leader)))
        .await;
    out.push(header_line("A resigns", &resigned, |r| r.header()));
    let b = b.await??;
    out.push(format!(
        "B campaigns: rev={} {}",
        rev(b.header()),
        leader_key_line(b.leader())
    ));
    out.push(observed(&mut observer).await?);
    let no_lease = c.campaign("el", "z", MISSING_LEASE).await;
    out.push(header_line("campaign with no such lease", &no_lease, |r| {
        r.header()
    }));
    let b_leader = b.leader().context("B's leader key")?.clone();
    let resigned = c
        .resign(Some(ResignOptions::new().with_leader(b_leader)))
        .await;
    out.push(header_line("B resigns", &resigned, |r| r.header()));
    let none = c.leader("el").await;
    out.push(header_line("leader after both resigned", &none, |r| {
        r.header()
    }));
    Ok(out)
}

#[tokio::test]
async fn elections_answer_and_are_observed_as_in_etcd() {
    let d = differential().await;
    let (oracle, candidate) = d.each(election).await;
    for needle in [
        "leader of no one: gRPC error code=Unknown message=\"election: no leader\"",
        "A campaigns: rev=2 name=el key=el/1000 rev=2 lease=1000",
        "observed: key=el/1000 value=a1",
        "observed: key=el/1000 value=a2",
        "proclaim with a stale key: gRPC error code=Unknown message=\"election: not leader\"",
        "proclaim without a key: gRPC error code=Unknown message=\"\\\"leader\\\" field must be provided\"",
        "B campaigns: rev=",
        "observed: key=el/1001 value=b1",
    ] {
        assert!(
            oracle.iter().any(|l| l.starts_with(needle)),
            "the oracle's transcript lacks {needle:?}:\n{}",
            oracle.join("\n")
        );
    }
    same(&d, "election", &oracle, &candidate);
}

/// The services and etcdctl's client-side recipes queue on the same keys:
/// `etcdctl lock` holds while a Lock waits, a Lock holds while `etcdctl
/// lock` waits, and `etcdctl elect -l` sees a Campaign's leader.
async fn with_etcdctl(side: &Side) -> Result<Vec<String>> {
    let client = &side.client;
    let mut c = client.clone();
    let mut out = Vec::new();
    let (ctl, endpoints) = (side.ctl35.binary(), side.cluster.endpoints());
    let spawn = |args: &[&str]| CtlProcess::spawn(ctl, &endpoints, args);
    grant(client, LEASE_A, LONG_TTL_SECS).await?;

    let mut holder = spawn(&["lock", "mx"])?;
    holder
        .wait_stdout("etcdctl's lock key", WAIT, |o| o.contains("mx/"))
        .await?;
    let waiter = spawn_lock(client, "mx", LEASE_A);
    wait_keys(client, "mx/", 2).await?;
    tokio::time::sleep(PATIENCE).await;
    out.push(format!(
        "Lock waits while etcdctl holds: {}",
        !waiter.is_finished()
    ));
    holder.terminate().await?;
    let held = waiter.await?;
    out.push(lock_line("Lock after etcdctl let go", &held));

    let mut ctl_waiter = spawn(&["lock", "mx"])?;
    wait_keys(client, "mx/", 2).await?;
    tokio::time::sleep(PATIENCE).await;
    out.push(format!(
        "etcdctl waits while Lock holds: {}",
        !ctl_waiter.exited() && ctl_waiter.stdout().is_empty()
    ));
    c.unlock(held?.key().to_vec()).await?;
    ctl_waiter
        .wait_stdout("etcdctl's lock key", WAIT, |o| o.contains("mx/"))
        .await?;
    out.push("etcdctl locks after Unlock".into());
    ctl_waiter.terminate().await?;

    let mut observer = spawn(&["elect", "-l", "ex"])?;
    c.campaign("ex", "from-the-service", LEASE_A).await?;
    observer
        .wait_stdout("etcdctl's observer", WAIT, |o| {
            o.contains("from-the-service")
        })
        .await?;
    out.push(format!("etcdctl elect -l: {:?}", observer.stdout()));
    observer.terminate().await?;
    Ok(out)
}

#[tokio::test]
async fn the_services_and_etcdctls_recipes_share_the_keys() {
    let d = differential().await;
    let (oracle, candidate) = d.each(with_etcdctl).await;
    for needle in [
        "Lock waits while etcdctl holds: true",
        "Lock after etcdctl let go: key=mx/1000",
        "etcdctl waits while Lock holds: true",
        "etcdctl elect -l: \"ex/1000\\nfrom-the-service\\n\"",
    ] {
        assert!(
            oracle.iter().any(|l| l.starts_with(needle)),
            "the oracle's transcript lacks {needle:?}:\n{}",
            oracle.join("\n")
        );
    }
    same(&d, "etcdctl and the services", &oracle, &candidate);
}

/// Under auth, the recipes act as the caller: a user with read-write on
/// `alk/` locks and campaigns there, is refused elsewhere (`permission
/// denied`), and a caller without a token is refused (`user name is
/// empty`), every error with code Unknown as etcd sends them.
#[tokio::test]
async fn the_callers_permissions_apply() {
    let mut d = differential().await;
    d.rpc("grant lease A", |mut c| async move {
        let id = LeaseGrantOptions::new().with_id(LEASE_A);
        c.lease_grant(LONG_TTL_SECS, Some(id)).await
    })
    .await
    .expect("lease grant");
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "grant-role", "root", "root"],
        &["user", "add", "alice:alicepw"],
        &["role", "add", "locker"],
        &[
            "role",
            "grant-permission",
            "locker",
            "--prefix=true",
            "readwrite",
            "alk/",
        ],
        &["user", "grant-role", "alice", "locker"],
        &["auth", "enable"],
    ] {
        let out = d.ctl(args).await;
        assert_ok(&out);
    }
    let alice = UserClients::connect(&d, "alice", "alicepw").await;
    let held = alice
        .rpc("alice locks alk", |mut c| async move {
            c.lock("alk", Some(LockOptions::new().with_lease(LEASE_A)))
                .await
        })
        .await
        .expect("alice's lock on her prefix");
    assert_eq!(held.key(), b"alk/1000");
    let denied = alice
        .rpc("alice locks other", |mut c| async move {
            c.lock("other", Some(LockOptions::new().with_lease(LEASE_A)))
                .await
        })
        .await;
    assert_grpc_error(
        &denied,
        tonic::Code::Unknown,
        "etcdserver: permission denied",
    );
    let denied = alice
        .rpc("alice campaigns in other", |mut c| async move {
            c.campaign("other", "v", LEASE_A).await
        })
        .await;
    assert_grpc_error(
        &denied,
        tonic::Code::Unknown,
        "etcdserver: permission denied",
    );
    alice
        .rpc("alice unlocks", |mut c| async move {
            c.unlock("alk/1000").await
        })
        .await
        .expect("alice's unlock");
    let anonymous = d
        .rpc("lock without a token", |mut c| async move {
            c.lock("alk", Some(LockOptions::new().with_lease(LEASE_A)))
                .await
        })
        .await;
    assert_grpc_error(
        &anonymous,
        tonic::Code::Unknown,
        "etcdserver: user name is empty",
    );
}

/// On a 3-member cluster, an Observe through a follower goes on across a
/// Raft leader change (MoveLeader) and sees the values proclaimed and the
/// next election leader after it; a Lock through a follower waits and is
/// served across it too.
#[tokio::test]
async fn observe_and_lock_go_on_across_a_raft_leader_change() -> Result<()> {
    use integration_tests::{Binary, Cluster, ClusterConfig};
    let cluster = Cluster::start(Binary::candidate()?, ClusterConfig::new(3)).await?;
    let leader = cluster.leader().await?;
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let mut c = cluster.client(follower).await?;
    grant(&c, LEASE_A, LONG_TTL_SECS).await?;
    grant(&c, LEASE_B, LONG_TTL_SECS).await?;
    let mut observer = spawn_observe(&c, "rl");
    let a = c.campaign("rl", "a1", LEASE_A).await?;
    let seen = observed(&mut observer).await?;
    ensure!(seen.contains("key=rl/1000 value=a1"), "{seen}");
    let held = c
        .lock("rlk", Some(LockOptions::new().with_lease(LEASE_A)))
        .await?;
    let waiter = spawn_lock(&c, "rlk", LEASE_B);
    wait_keys(&c, "rlk/", 2).await?;

    let target = cluster.member_id(other).await?;
    cluster.client(leader).await?.move_leader(target).await?;
    retry_until("the new leader", WAIT, || async {
        ensure!(cluster.leader().await? == other, "leader not moved yet");
        Ok(())
    })
    .await?;

    let leader_key = a.leader().context("A's leader key")?.clone();
    let with = Some(ProclaimOptions::new().with_leader(leader_key.clone()));
    c.proclaim("a2", with).await?;
    let seen = observed(&mut observer).await?;
    ensure!(seen.contains("key=rl/1000 value=a2"), "{seen}");
    let mut b_client = c.clone();
    let b = tokio::spawn(async move { b_client.campaign("rl", "b1", LEASE_B).await });
    wait_keys(&c, "rl/", 2).await?;
    c.resign(Some(ResignOptions::new().with_leader(leader_key)))
        .await?;
    b.await??;
    let seen = observed(&mut observer).await?;
    ensure!(seen.contains("key=rl/1001 value=b1"), "{seen}");

    c.unlock(held.key().to_vec()).await?;
    let next = waiter.await?;
    ensure!(
        matches!(&next, Ok(r) if r.key() == b"rlk/1001"),
        "{}",
        lock_line("B's lock", &next)
    );
    Ok(())
}
