//! Leases on 3-member clusters across a SIGKILL of the leader, as properties
//! checked the same way against real etcd 3.5 (`etcd35::*`) and the candidate
//! (`candidate::*`).
//!
//! - `lease_with_keys_expires_once_across_a_leader_kill`: a lease
//!   ([`EXPIRY_TTL`]) is granted through the leader and several keys are
//!   attached to it (through the leader and through a follower) while a
//!   `prev_kv` watch is open on every member. The leader (whichever member
//!   leads at that moment) is SIGKILLed during the TTL; the two surviving
//!   members keep their watchers. The new leader must expire the lease
//!   exactly once:
//!   - no read or watch ever shows a key gone before the original TTL has
//!     elapsed (measured from when the grant was *sent*, which is before the
//!     server could start the TTL), and no read ever shows only some keys gone
//!     (the revoke deletes them in one revision);
//!   - the keys are gone, by serializable reads on every surviving member,
//!     within [`EXPIRY_DEADLINE_AFTER_KILL`] of the kill. etcd gives every
//!     lease its full TTL again (plus an election timeout) when a new leader
//!     takes over, so expiry may come up to about two TTLs after the kill;
//!     the deadline adds generous slack for a loaded machine;
//!   - each surviving watcher sees exactly one DELETE per key, with the
//!     key's `prev_kv` (value and lease), all at one revision, the same on
//!     both watchers, received after the original TTL; nothing follows
//!     during [`QUIET_CHECK`];
//!   - every surviving member's revision is that deletion revision (a second
//!     expiry would have to be a no-op), and the lease is gone
//!     (TimeToLive says TTL -1);
//!   - the killed member, restarted, agrees: no keys, same revision, and the
//!     same event history (a historical watch) as every other member.
//! - `keep_alive_through_a_leader_kill_keeps_the_lease`: a lease
//!   ([`KEEP_ALIVE_TTL`]) with keys is kept alive by a keep-alive loop
//!   connected to a follower (sending every [`KEEP_ALIVE_INTERVAL`] on one
//!   LeaseKeepAlive stream; if the stream fails it is reopened on the next
//!   member, as clientv3 with several endpoints does). The leader is
//!   SIGKILLed and keep-alives continue for [`KEEP_ALIVE_ROUNDS_AFTER_KILL`]
//!   × TTL:
//!   - no keep-alive response ever says the lease is gone (TTL <= 0), and
//!     keep-alives are acknowledged again after the kill;
//!   - no DELETE is ever seen by the surviving members' watchers while the
//!     keep-alives run; afterwards TimeToLive > 0 and every key is still
//!     there on both surviving members;
//!   - once keep-alives stop, the keys are gone within
//!     [`STOPPED_EXPIRY_DEADLINE`], but never before the TTL has elapsed
//!     since the last acknowledged keep-alive was sent; each surviving
//!     watcher sees one DELETE per key (with `prev_kv`), all at one
//!     revision, the same on both.
//! - `keep_alive_past_a_cut_off_leader_keeps_the_lease`: the same
//!   keep-alive loop, on the two followers only, while the leader is cut off
//!   from them (`integration_tests::netns` namespaces) for [`CUT_OFF_FOR`], longer than
//!   the TTL, and for [`KEEP_ALIVE_ROUNDS_AFTER_KILL`] × TTL after the links
//!   heal. By the cut-off leader's own deadlines the lease expired, since the
//!   keep-alives went to the new leader; it must revoke nothing, neither while
//!   cut off nor when it is back (etcd 3.5.13's `revokeExpiredLeases` revokes
//!   only after a quorum confirmed its leadership): no keep-alive answer says
//!   the lease is gone, the followers' watchers see no DELETE, and afterwards
//!   every member, the one cut off included, has the lease and its keys.
//!   The candidate only: etcd 3.5.1 fails it with these timings. Its
//!   follower forwards each renewal to the leader it knows over HTTP and
//!   waits for the cut-off leader until its 5 s read timeout, so no
//!   keep-alive gets through for about 6 s after the cut, and the new leader
//!   (which gave the lease TTL + one election timeout when it took over)
//!   revokes it. The store's follower stops waiting for the old leader as
//!   soon as it sees a new one, and asks that one.
//!
//! Every wait is bounded by a named deadline. Run:
//! `STORE_BIN=/path/to/candidate cargo test -p integration-tests --test integration lease_cluster::`

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{
    Client, Event, EventType, GetOptions, KeyValue, LeaseTimeToLiveOptions, PutOptions,
    WatchOptions,
};
use integration_tests::client::{connect, describe_error};
use integration_tests::wait::retry_until;
use integration_tests::watchlease::{event_key, event_revision, next_response, watch_connect};
use integration_tests::{against_both, Cluster, ClusterConfig, Server};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

/// Members per cluster.
const MEMBERS: usize = 3;
/// TTL of the lease that must expire across the leader kill.
const EXPIRY_TTL: Duration = Duration::from_secs(5);
/// Keys attached to each lease.
const KEYS_PER_LEASE: usize = 5;
/// The leader is killed this long after the grant was sent (well inside
/// [`EXPIRY_TTL`]).
const KILL_AFTER_GRANT: Duration = Duration::from_millis(1500);
/// The kill must come at least this long before the TTL (from the grant
/// being sent) ends; a machine too loaded to attach the keys by then fails
/// the setup with a message saying so.
const KILL_MARGIN: Duration = Duration::from_secs(1);
/// The cluster's election timeout (the harness's default, etcd's default).
const ELECTION_TIMEOUT: Duration = integration_tests::cluster::DEFAULT_ELECTION_TIMEOUT;
/// Slack for a loaded 2-core machine on top of the protocol's own bounds.
const LOAD_SLACK: Duration = Duration::from_secs(25);
/// Deadline, from the kill, for the keys of the expiring lease to be gone
/// on every surviving member: a new leader may give the lease its full TTL
/// again plus an election timeout, after an election that itself takes a
/// few election timeouts; then generous slack.
const EXPIRY_DEADLINE_AFTER_KILL: Duration = Duration::from_secs(
    EXPIRY_TTL.as_secs() * 2 + ELECTION_TIMEOUT.as_secs() * 5 + LOAD_SLACK.as_secs(),
);
/// Interval of the serializable reads that watch for the expiry.
const READ_POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Bound of one read, watch creation or other single request.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// After the expected events, how long watchers are watched for extras.
const QUIET_CHECK: Duration = Duration::from_secs(3);
/// Deadline for the restarted member to serve the final state.
const RESTART_CONVERGENCE_TIMEOUT: Duration = Duration::from_secs(90);
/// TTL of the lease kept alive across the leader kill.
const KEEP_ALIVE_TTL: Duration = Duration::from_secs(4);
/// Keep-alive period (clientv3 sends every TTL/3; a little more often here).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Keep-alives run this long before the kill.
const KEEP_ALIVE_BEFORE_KILL: Duration = Duration::from_secs(3);
/// Keep-alives continue for this many TTLs after the kill.
const KEEP_ALIVE_ROUNDS_AFTER_KILL: u32 = 3;
/// Bound for opening a keep-alive stream (the first keep-alive's response
/// comes back through a new leader, which etcd waits for up to its request
/// timeout of 5 s + 2 election timeouts).
const KEEP_ALIVE_OPEN_TIMEOUT: Duration = Duration::from_secs(15);
/// Deadline, from the stop of the keep-alives, for the keys to be gone: the
/// TTL, the leader's expiry check and one Raft round, then generous slack.
const STOPPED_EXPIRY_DEADLINE: Duration = Duration::from_secs(
    KEEP_ALIVE_TTL.as_secs() + ELECTION_TIMEOUT.as_secs() + LOAD_SLACK.as_secs(),
);
/// How long the leader is cut off from the other members while keep-alives
/// go to them: past the TTL (plus its expiry check), so that by its own
/// deadlines, which miss the keep-alives the new leader takes, the lease has
/// expired and it must not revoke it, then or when it is back.
const CUT_OFF_FOR: Duration = Duration::from_secs(KEEP_ALIVE_TTL.as_secs() * 2 + 2);
/// Deadline for the surviving members to agree on a new leader and accept
/// TimeToLive requests again.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Watch recording.
// ---------------------------------------------------------------------------

/// An event and when it was received.
#[derive(Clone, Debug)]
struct Received {
    at: Instant,
    event: Event,
}

/// A watch stream read in the background; every event is recorded with its
/// arrival time, and the first stream failure is kept.
struct WatchRecorder {
    what: String,
    events: Arc<Mutex<Vec<Received>>>,
    failure: Arc<Mutex<Option<String>>>,
    task: JoinHandle<()>,
}

impl WatchRecorder {
    /// Opens a `prev_kv` prefix watch on `endpoint` and waits for its created
    /// response.
    async fn open(what: &str, endpoint: &str, prefix: &str, start: Option<i64>) -> Result<Self> {
        let client = watch_connect(&[endpoint.to_string()]).await?;
        let mut options = WatchOptions::new().with_prefix().with_prev_key();
        if let Some(revision) = start {
            options = options.with_start_revision(revision);
        }
        let (sender, mut stream) = timeout(
            RESPONSE_TIMEOUT,
            client.watch_client().watch(prefix, Some(options)),
        )
        .await
        .with_context(|| format!("{what}: opening the watch"))??
        .split();
        let created = next_response(&mut stream, RESPONSE_TIMEOUT)
            .await
            .with_context(|| format!("{what}: waiting for the created response"))?;
        ensure!(
            created.created() && !created.canceled() && created.events().is_empty(),
            "{what}: expected a created response, got {created:?}"
        );
        let events = Arc::new(Mutex::new(Vec::new()));
        let failure = Arc::new(Mutex::new(None));
        let task = {
            let (events, failure) = (events.clone(), failure.clone());
            tokio::spawn(async move {
                // The client and the request sender live as long as the stream.
                let _keep = (client, sender);
                let outcome = loop {
                    match stream.message().await {
                        Ok(Some(response)) => {
                            if response.canceled() {
                                break format!("watch canceled: {response:?}");
                            }
                            let at = Instant::now();
                            events
                                .lock()
                                .expect("events")
                                .extend(response.events().iter().map(|event| Received {
                                    at,
                                    event: event.clone(),
                                }));
                        }
                        Ok(None) => break "watch stream ended".to_string(),
                        Err(error) => {
                            break format!("watch stream failed: {}", describe_error(&error))
                        }
                    }
                };
                *failure.lock().expect("failure") = Some(outcome);
            })
        };
        Ok(Self {
            what: what.to_string(),
            events,
            failure,
            task,
        })
    }

    fn events(&self) -> Vec<Received> {
        self.events.lock().expect("events").clone()
    }

    /// An error if the stream has failed or ended.
    fn check_alive(&self) -> Result<()> {
        match &*self.failure.lock().expect("failure") {
            Some(failure) => bail!("{}: {failure}", self.what),
            None => Ok(()),
        }
    }

    /// Waits until at least `count` events were received.
    async fn wait_events(&self, count: usize, deadline: Duration) -> Result<Vec<Received>> {
        let start = Instant::now();
        loop {
            let events = self.events();
            if events.len() >= count {
                return Ok(events);
            }
            self.check_alive()?;
            if start.elapsed() >= deadline {
                bail!(
                    "{}: {} of {count} events within {deadline:?}:\n{}",
                    self.what,
                    events.len(),
                    render_events(&events)
                );
            }
            sleep(READ_POLL_INTERVAL).await;
        }
    }
}

impl Drop for WatchRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A key-value pair as one comparable line fragment.
fn render_kv(kv: &KeyValue) -> String {
    format!(
        "key={:?} create={} mod={} version={} lease={:x} value={:?}",
        String::from_utf8_lossy(kv.key()),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease(),
        String::from_utf8_lossy(kv.value()),
    )
}

/// An event as one comparable line.
fn render_event(event: &Event) -> String {
    let kind = match event.event_type() {
        EventType::Put => "PUT",
        EventType::Delete => "DELETE",
    };
    format!(
        "{kind} {} prev_kv={}",
        event.kv().map_or("kv=None".to_string(), render_kv),
        event
            .prev_kv()
            .map_or("None".to_string(), |kv| format!("{{{}}}", render_kv(kv)))
    )
}

fn render_events(events: &[Received]) -> String {
    events
        .iter()
        .map(|received| format!("  {}\n", render_event(&received.event)))
        .collect()
}

fn leased_key(prefix: &str, i: usize) -> String {
    format!("{prefix}k{i}")
}

fn leased_value(i: usize) -> String {
    format!("value-{i}")
}

/// Keys present under `prefix` on member `i` by a serializable read, and the
/// member's revision.
async fn serializable_keys(cluster: &Cluster, i: usize, prefix: &str) -> Result<(usize, i64)> {
    let response = timeout(RESPONSE_TIMEOUT, cluster.get_prefix(i, prefix, true))
        .await
        .with_context(|| format!("serializable read on member {i} timed out"))??;
    let revision = response.header().context("get without header")?.revision();
    Ok((response.kvs().len(), revision))
}

/// Checks the `KEYS_PER_LEASE` PUT events of the attach phase: each key once,
/// with its value and the lease.
fn check_puts(what: &str, puts: &[Received], prefix: &str, lease: i64) -> Result<()> {
    ensure!(
        puts.len() == KEYS_PER_LEASE,
        "{what}: expected {KEYS_PER_LEASE} PUT events first:\n{}",
        render_events(puts)
    );
    for (i, received) in puts.iter().enumerate() {
        let event = &received.event;
        let kv = event.kv().context("event without kv")?;
        ensure!(
            event.event_type() == EventType::Put
                && event_key(event) == leased_key(prefix, i)
                && kv.value() == leased_value(i).as_bytes()
                && kv.lease() == lease,
            "{what}: event {i} should be the PUT of {} with lease {lease:x}: {}",
            leased_key(prefix, i),
            render_event(event)
        );
    }
    Ok(())
}

/// Checks the DELETE events of an expiry: one per key, all at one revision,
/// each with the key's `prev_kv` (value and lease). Returns the revision.
fn check_expiry_deletes(what: &str, deletes: &[Received], prefix: &str, lease: i64) -> Result<i64> {
    ensure!(
        deletes.len() == KEYS_PER_LEASE,
        "{what}: expected exactly {KEYS_PER_LEASE} DELETE events:\n{}",
        render_events(deletes)
    );
    let revision = event_revision(&deletes[0].event);
    let mut keys: Vec<String> = Vec::new();
    for received in deletes {
        let event = &received.event;
        let prev = event.prev_kv().with_context(|| {
            format!(
                "{what}: DELETE without prev_kv: {}",
                render_event(&received.event)
            )
        })?;
        let key = event_key(event);
        let index = (0..KEYS_PER_LEASE)
            .find(|&i| leased_key(prefix, i) == key)
            .with_context(|| {
                format!(
                    "{what}: DELETE of an unexpected key: {}",
                    render_event(event)
                )
            })?;
        ensure!(
            event.event_type() == EventType::Delete
                && event_revision(event) == revision
                && prev.key() == key.as_bytes()
                && prev.value() == leased_value(index).as_bytes()
                && prev.lease() == lease,
            "{what}: every DELETE must be at revision {revision} with the key's prev_kv \
             (value {:?}, lease {lease:x}): {}",
            leased_value(index),
            render_event(event)
        );
        keys.push(key);
    }
    keys.sort();
    keys.dedup();
    ensure!(
        keys.len() == KEYS_PER_LEASE,
        "{what}: a key was deleted twice:\n{}",
        render_events(deletes)
    );
    Ok(revision)
}

/// The event history under `prefix` from `start` on member `i`, read with a
/// historical `prev_kv` watch until `count` events arrived.
async fn history(
    cluster: &Cluster,
    i: usize,
    prefix: &str,
    start: i64,
    count: usize,
) -> Result<Vec<String>> {
    let recorder = WatchRecorder::open(
        &format!("history watch on member {i}"),
        &cluster.endpoint(i),
        prefix,
        Some(start),
    )
    .await?;
    let events = recorder.wait_events(count, RESPONSE_TIMEOUT).await?;
    sleep(QUIET_CHECK).await;
    let events_after = recorder.events();
    ensure!(
        events_after.len() == events.len(),
        "history watch on member {i}: more than the {count} expected events:\n{}",
        render_events(&events_after)
    );
    Ok(events
        .iter()
        .map(|received| render_event(&received.event))
        .collect())
}

/// TimeToLive of `lease` through member `i`, retried while the cluster has
/// no leader (errors only; the answer itself is returned as is).
async fn time_to_live(cluster: &Cluster, i: usize, lease: i64) -> Result<i64> {
    retry_until(
        &format!("TimeToLive of lease {lease:x} through member {i}"),
        FAILOVER_TIMEOUT,
        || async {
            let response = cluster
                .client(i)
                .await?
                .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
                .await
                .map_err(|e| anyhow::anyhow!(describe_error(&e)))?;
            Ok(response.ttl())
        },
    )
    .await
}

/// A `prev_kv` watch of `prefix` on every member (see [`WatchRecorder::open`]).
async fn watch_every_member(cluster: &Cluster, prefix: &str) -> Result<Vec<Option<WatchRecorder>>> {
    let members: Vec<usize> = (0..cluster.size()).collect();
    let watchers = watch_members(cluster, prefix, &members).await?;
    Ok(watchers.into_iter().map(Some).collect())
}

/// A `prev_kv` watch of `prefix` on each of `members`, in that order.
async fn watch_members(
    cluster: &Cluster,
    prefix: &str,
    members: &[usize],
) -> Result<Vec<WatchRecorder>> {
    let mut watchers = Vec::new();
    for &i in members {
        let what = format!("watch on member {i}");
        watchers.push(WatchRecorder::open(&what, &cluster.endpoint(i), prefix, None).await?);
    }
    Ok(watchers)
}

/// Grants a lease of [`KEEP_ALIVE_TTL`] through `client` and attaches
/// [`KEYS_PER_LEASE`] keys under `prefix` to it; returns its id.
async fn grant_with_keys(client: &Client, prefix: &str) -> Result<i64> {
    let lease = client
        .clone()
        .lease_grant(KEEP_ALIVE_TTL.as_secs() as i64, None)
        .await?
        .id();
    for i in 0..KEYS_PER_LEASE {
        let options = PutOptions::new().with_lease(lease);
        let (key, value) = (leased_key(prefix, i), leased_value(i));
        client.clone().put(key, value, Some(options)).await?;
    }
    Ok(lease)
}

// ---------------------------------------------------------------------------
// Scenario a: expiry across a leader kill.
// ---------------------------------------------------------------------------

async fn lease_with_keys_expires_once_across_a_leader_kill(server: Server) {
    let cluster = server.start(ClusterConfig::new(MEMBERS)).await;
    let run = async {
        let prefix = "expiring/";
        let leader = cluster.leader().await?;
        let follower = (0..MEMBERS).find(|&i| i != leader).context("no follower")?;
        // A watcher on every member: whichever member leads at the kill, the
        // two others survive with their watchers.
        let mut watchers = watch_every_member(&cluster, prefix).await?;

        let mut leader_client = cluster.client(leader).await?;
        let mut follower_client = cluster.client(follower).await?;
        let grant_sent = Instant::now();
        let grant = leader_client
            .lease_grant(EXPIRY_TTL.as_secs() as i64, None)
            .await?;
        let lease = grant.id();
        ensure!(
            grant.ttl() == EXPIRY_TTL.as_secs() as i64,
            "granted TTL {} instead of {EXPIRY_TTL:?}",
            grant.ttl()
        );
        let mut first_put_revision = None;
        for i in 0..KEYS_PER_LEASE {
            // Alternately through the leader and through a follower.
            let client = if i % 2 == 0 {
                &mut leader_client
            } else {
                &mut follower_client
            };
            let response = client
                .put(
                    leased_key(prefix, i),
                    leased_value(i),
                    Some(PutOptions::new().with_lease(lease)),
                )
                .await?;
            first_put_revision.get_or_insert(response.header().context("no header")?.revision());
        }
        let first_put_revision = first_put_revision.context("no puts")?;

        // Kill the leader during the TTL, with the keys attached.
        sleep(KILL_AFTER_GRANT.saturating_sub(grant_sent.elapsed())).await;
        let leader = cluster.leader().await?;
        let kill_at = Instant::now();
        ensure!(
            kill_at + KILL_MARGIN <= grant_sent + EXPIRY_TTL,
            "setting up took too long: the kill would come {:?} after the grant was sent, \
             not at least {KILL_MARGIN:?} before the TTL of {EXPIRY_TTL:?} ends",
            kill_at - grant_sent
        );
        cluster.kill(leader)?;
        watchers[leader] = None;
        let survivors: Vec<usize> = (0..MEMBERS).filter(|&i| i != leader).collect();
        let watchers: Vec<WatchRecorder> = watchers.into_iter().flatten().collect();
        let ttl_over = grant_sent + EXPIRY_TTL;
        eprintln!(
            "{server:?}: killed leader member {leader} {:?} after the grant",
            kill_at - grant_sent
        );

        // Serializable reads on every survivor until the keys are gone there.
        let mut gone_at: Vec<Option<Instant>> = vec![None; MEMBERS];
        loop {
            for &i in &survivors {
                let read = serializable_keys(&cluster, i, prefix).await;
                let done = Instant::now();
                let (present, _) = read.with_context(|| format!("reading member {i}"))?;
                ensure!(
                    present == KEYS_PER_LEASE || present == 0,
                    "member {i} shows {present} of the {KEYS_PER_LEASE} leased keys: \
                     the expiry is not atomic"
                );
                if present == 0 {
                    ensure!(
                        done >= ttl_over,
                        "member {i}: keys gone {:?} after the grant was sent, before the TTL of {EXPIRY_TTL:?}",
                        done - grant_sent
                    );
                    gone_at[i].get_or_insert(done);
                } else {
                    ensure!(
                        gone_at[i].is_none(),
                        "member {i}: the keys came back after they were gone"
                    );
                }
            }
            for watcher in &watchers {
                watcher.check_alive()?;
            }
            if survivors.iter().all(|&i| gone_at[i].is_some()) {
                break;
            }
            if kill_at.elapsed() >= EXPIRY_DEADLINE_AFTER_KILL {
                bail!(
                    "keys of lease {lease:x} still present {EXPIRY_DEADLINE_AFTER_KILL:?} after \
                     the leader was killed (gone on members {:?})",
                    survivors
                        .iter()
                        .filter(|&&i| gone_at[i].is_some())
                        .collect::<Vec<_>>()
                );
            }
            sleep(READ_POLL_INTERVAL).await;
        }
        for &i in &survivors {
            eprintln!(
                "{server:?}: keys gone on member {i} {:?} after the grant, {:?} after the kill",
                gone_at[i].expect("gone") - grant_sent,
                gone_at[i].expect("gone") - kill_at
            );
        }

        // Each surviving watcher: one DELETE per key, at one revision, with
        // prev_kv, received after the TTL; the same revision on all; nothing
        // after.
        let mut revisions = Vec::new();
        for watcher in &watchers {
            let events = watcher
                .wait_events(2 * KEYS_PER_LEASE, RESPONSE_TIMEOUT)
                .await?;
            sleep(QUIET_CHECK).await;
            watcher.check_alive()?;
            let events_after = watcher.events();
            ensure!(
                events_after.len() == events.len(),
                "{}: events after the expiry's deletes (expired more than once?):\n{}",
                watcher.what,
                render_events(&events_after)
            );
            let (puts, deletes) = events.split_at(KEYS_PER_LEASE);
            check_puts(&watcher.what, puts, prefix, lease)?;
            let revision = check_expiry_deletes(&watcher.what, deletes, prefix, lease)?;
            for received in deletes {
                ensure!(
                    received.at >= ttl_over,
                    "{}: DELETE received {:?} after the grant was sent, before the TTL of {EXPIRY_TTL:?}",
                    watcher.what,
                    received.at - grant_sent
                );
            }
            revisions.push(revision);
        }
        let deleted_at = revisions[0];
        ensure!(
            revisions.iter().all(|&r| r == deleted_at),
            "the watchers saw the expiry at different revisions: {revisions:?}"
        );

        // Every survivor: no keys, revision = the deletion's, lease gone.
        for &i in &survivors {
            let (present, revision) = serializable_keys(&cluster, i, prefix).await?;
            ensure!(
                present == 0 && revision == deleted_at,
                "member {i}: {present} keys at revision {revision}; expected none at the \
                 expiry's revision {deleted_at} (a later revision means more writes)"
            );
            let ttl = time_to_live(&cluster, i, lease).await?;
            ensure!(
                ttl == -1,
                "member {i}: TimeToLive of the expired lease says TTL {ttl}, expected -1"
            );
        }

        // The killed member, restarted, agrees.
        cluster
            .restart_and_wait(leader)
            .await
            .context("restarting the killed leader")?;
        let (present, revision) = retry_until(
            &format!("restarted member {leader} to apply the expiry"),
            RESTART_CONVERGENCE_TIMEOUT,
            || async {
                let (present, revision) = serializable_keys(&cluster, leader, prefix).await?;
                ensure!(revision >= deleted_at, "at revision {revision}");
                Ok((present, revision))
            },
        )
        .await?;
        ensure!(
            present == 0 && revision == deleted_at,
            "restarted member {leader}: {present} keys at revision {revision}; expected none at \
             the expiry's revision {deleted_at}"
        );
        let reference: Vec<String> = watchers[0]
            .events()
            .iter()
            .map(|received| render_event(&received.event))
            .collect();
        for i in 0..MEMBERS {
            let seen = history(&cluster, i, prefix, first_put_revision, 2 * KEYS_PER_LEASE).await?;
            ensure!(
                seen == reference,
                "member {i}'s history differs from what the watchers saw:\nmember {i}:\n{}\nwatchers:\n{}",
                seen.join("\n"),
                reference.join("\n")
            );
        }
        Ok::<_, anyhow::Error>(())
    };
    // On a panic the cluster's drop prints every member's log tail.
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

// ---------------------------------------------------------------------------
// Scenario b: keep-alive across a leader kill.
// ---------------------------------------------------------------------------

/// What the keep-alive loop observed.
#[derive(Debug, Default)]
struct KeepAliveLog {
    /// Send times of acknowledged keep-alives (TTL > 0), in order.
    acked: Vec<Instant>,
    /// Stream failures and reopenings, for the report.
    errors: Vec<String>,
    /// A keep-alive response saying the lease is gone.
    lost: Option<String>,
}

impl KeepAliveLog {
    /// The acknowledged keep-alives' send times relative to `origin` and the
    /// stream errors, for a failure report.
    fn render(&self, origin: Instant) -> String {
        let offset = |at: Instant| {
            let ms = |d: Duration| d.as_millis() as i64;
            ms(at.saturating_duration_since(origin)) - ms(origin.saturating_duration_since(at))
        };
        let acked: Vec<i64> = self.acked.iter().map(|&at| offset(at)).collect();
        format!("acknowledged (ms) {acked:?}; errors {:?}", self.errors)
    }
}

/// While a lease is kept alive: no keep-alive answer said it is gone, and
/// every watcher is up and saw nothing after the puts. `fault` at `since`
/// names what the keep-alives are going through, for the report.
fn check_kept_alive(
    log: &Mutex<KeepAliveLog>,
    watchers: &[WatchRecorder],
    since: Instant,
    fault: &str,
) -> Result<()> {
    let log = log.lock().expect("log");
    if let Some(lost) = &log.lost {
        bail!(
            "the lease was lost {:?} after {fault}: {lost}",
            since.elapsed()
        );
    }
    for watcher in watchers {
        watcher.check_alive()?;
        let events = watcher.events();
        ensure!(
            events.len() <= KEYS_PER_LEASE,
            "{}: events while the lease is kept alive ({:?} after {fault}):\n{}keep-alives: {}",
            watcher.what,
            since.elapsed(),
            render_events(&events),
            log.render(since)
        );
    }
    Ok(())
}

/// A keep-alive loop over `clients` (member index, client), as clientv3
/// keeps a lease alive: one keep-alive every [`KEEP_ALIVE_INTERVAL`] on a
/// LeaseKeepAlive stream, responses read as they come (matched to requests
/// in order). The stream is opened on the first client; if it fails it is
/// reopened on the next one (round robin), so the loop also survives the
/// loss of its own member. Runs until `stop` is notified.
fn keep_alive_loop(
    clients: Vec<(usize, Client)>,
    lease: i64,
    log: Arc<Mutex<KeepAliveLog>>,
    stop: Arc<tokio::sync::Notify>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut clients = clients;
        let count = clients.len();
        let mut current = 0;
        loop {
            let (member, client) = &mut clients[current];
            let member = *member;
            current = (current + 1) % count;
            let opened_at = Instant::now();
            let opened = tokio::select! {
                _ = stop.notified() => return,
                opened = timeout(KEEP_ALIVE_OPEN_TIMEOUT, client.lease_keep_alive(lease)) => opened,
            };
            let (mut keeper, mut stream) = match opened {
                Ok(Ok(pair)) => pair,
                Ok(Err(error)) => {
                    let text = describe_error(&error);
                    {
                        let mut log = log.lock().expect("log");
                        if text.contains("lease not found") {
                            log.lost = Some(format!(
                                "reopening the keep-alive stream on member {member}: {text}"
                            ));
                            return;
                        }
                        log.errors.push(format!("open on member {member}: {text}"));
                    }
                    sleep(KEEP_ALIVE_INTERVAL).await;
                    continue;
                }
                Err(_) => {
                    log.lock().expect("log").errors.push(format!(
                        "open on member {member}: no response within {KEEP_ALIVE_OPEN_TIMEOUT:?}"
                    ));
                    continue;
                }
            };
            // Opening sent one keep-alive and read its (positive) response.
            log.lock().expect("log").acked.push(opened_at);
            let mut in_flight: VecDeque<Instant> = VecDeque::new();
            let mut ticker = tokio::time::interval(KEEP_ALIVE_INTERVAL);
            ticker.tick().await;
            loop {
                tokio::select! {
                    _ = stop.notified() => return,
                    _ = ticker.tick() => {
                        in_flight.push_back(Instant::now());
                        if let Err(error) = keeper.keep_alive().await {
                            log.lock().expect("log").errors.push(format!(
                                "send on member {member}: {}", describe_error(&error)
                            ));
                            break;
                        }
                    }
                    message = stream.message() => match message {
                        Ok(Some(response)) => {
                            let sent = in_flight.pop_front();
                            let mut log = log.lock().expect("log");
                            if response.ttl() <= 0 {
                                log.lost = Some(format!(
                                    "keep-alive response from member {member} with TTL {}: {response:?}",
                                    response.ttl()
                                ));
                                return;
                            }
                            match sent {
                                Some(sent) => log.acked.push(sent),
                                None => log.errors.push(format!(
                                    "response without a request from member {member}: {response:?}"
                                )),
                            }
                        }
                        Ok(None) => {
                            log.lock().expect("log").errors.push(format!("stream on member {member} ended"));
                            break;
                        }
                        Err(error) => {
                            log.lock().expect("log").errors.push(format!(
                                "stream on member {member}: {}", describe_error(&error)
                            ));
                            break;
                        }
                    }
                }
            }
        }
    })
}

async fn keep_alive_through_a_leader_kill_keeps_the_lease(server: Server) {
    let cluster = server.start(ClusterConfig::new(MEMBERS)).await;
    let run = async {
        let prefix = "kept/";
        let leader = cluster.leader().await?;
        let follower = (0..MEMBERS).find(|&i| i != leader).context("no follower")?;
        // A watcher on every member: whichever member leads at the kill, the
        // two others survive with their watchers.
        let mut watchers = watch_every_member(&cluster, prefix).await?;

        let client = connect(&[cluster.endpoint(follower)]).await?;
        let lease = grant_with_keys(&client, prefix).await?;
        // The keep-alive loop talks to the follower, and fails over to the
        // other members only if its stream there breaks.
        let mut clients = vec![(follower, client.clone())];
        for i in (0..MEMBERS).filter(|&i| i != follower) {
            clients.push((i, connect(&[cluster.endpoint(i)]).await?));
        }
        let log = Arc::new(Mutex::new(KeepAliveLog::default()));
        let stop = Arc::new(tokio::sync::Notify::new());
        let keep_alive = keep_alive_loop(clients, lease, log.clone(), stop.clone());
        sleep(KEEP_ALIVE_BEFORE_KILL).await;

        let leader = cluster.leader().await?;
        let kill_at = Instant::now();
        cluster.kill(leader)?;
        watchers[leader] = None;
        let survivors: Vec<usize> = (0..MEMBERS).filter(|&i| i != leader).collect();
        let watchers: Vec<WatchRecorder> = watchers.into_iter().flatten().collect();
        eprintln!(
            "{server:?}: killed leader member {leader}; keep-alives go to member {follower}{}",
            if leader == follower {
                " (the leader moved there, so the loop fails over)"
            } else {
                ""
            }
        );
        let keep_until = kill_at + KEEP_ALIVE_TTL * KEEP_ALIVE_ROUNDS_AFTER_KILL;
        while Instant::now() < keep_until {
            check_kept_alive(&log, &watchers, kill_at, "the kill")?;
            sleep(READ_POLL_INTERVAL).await;
        }

        // Still alive: TimeToLive > 0, every key on both survivors, and the
        // watchers saw the puts and nothing else.
        for &i in &survivors {
            let ttl = time_to_live(&cluster, i, lease).await?;
            ensure!(
                ttl > 0,
                "member {i}: TimeToLive says TTL {ttl} for the lease kept alive through the kill"
            );
            let (present, _) = serializable_keys(&cluster, i, prefix).await?;
            ensure!(
                present == KEYS_PER_LEASE,
                "member {i}: {present} of the {KEYS_PER_LEASE} keys of the kept-alive lease"
            );
        }
        let linearizable = connect(&[cluster.endpoint(survivors[0])])
            .await?
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await?;
        ensure!(
            linearizable.kvs().len() == KEYS_PER_LEASE,
            "linearizable read shows {} of the {KEYS_PER_LEASE} keys",
            linearizable.kvs().len()
        );
        for watcher in &watchers {
            let events = watcher.events();
            check_puts(&watcher.what, &events, prefix, lease)?;
        }

        // Stop the keep-alives.
        stop.notify_one();
        timeout(RESPONSE_TIMEOUT, keep_alive)
            .await
            .context("the keep-alive loop did not stop")??;
        let stopped_at = Instant::now();
        let (last_acked, acked_after_kill, errors) = {
            let log = log.lock().expect("log");
            if let Some(lost) = &log.lost {
                bail!("the lease was lost: {lost}");
            }
            (
                *log.acked.last().context("no keep-alive acknowledged")?,
                log.acked.iter().filter(|&&sent| sent > kill_at).count(),
                log.errors.clone(),
            )
        };
        eprintln!(
            "{server:?}: {acked_after_kill} keep-alives acknowledged after the kill; stream errors: {errors:?}"
        );
        ensure!(
            acked_after_kill > 0,
            "no keep-alive sent after the kill was acknowledged (errors: {errors:?})"
        );

        // The keys disappear within a bound, never before the TTL since the
        // last acknowledged keep-alive was sent.
        let not_before = last_acked + KEEP_ALIVE_TTL;
        let mut gone_at: Vec<Option<Instant>> = vec![None; MEMBERS];
        loop {
            for &i in &survivors {
                let read = serializable_keys(&cluster, i, prefix).await;
                let done = Instant::now();
                let (present, _) = read.with_context(|| format!("reading member {i}"))?;
                ensure!(
                    present == KEYS_PER_LEASE || present == 0,
                    "member {i} shows {present} of the {KEYS_PER_LEASE} leased keys: \
                     the expiry is not atomic"
                );
                if present == 0 {
                    ensure!(
                        done >= not_before,
                        "member {i}: keys gone {:?} after the last acknowledged keep-alive was sent, \
                         before the TTL of {KEEP_ALIVE_TTL:?}",
                        done - last_acked
                    );
                    gone_at[i].get_or_insert(done);
                }
            }
            if survivors.iter().all(|&i| gone_at[i].is_some()) {
                break;
            }
            if stopped_at.elapsed() >= STOPPED_EXPIRY_DEADLINE {
                bail!(
                    "keys still present {STOPPED_EXPIRY_DEADLINE:?} after the keep-alives stopped"
                );
            }
            sleep(READ_POLL_INTERVAL).await;
        }
        eprintln!(
            "{server:?}: keys gone {:?} after the keep-alives stopped",
            survivors
                .iter()
                .map(|&i| gone_at[i].expect("gone") - stopped_at)
                .collect::<Vec<_>>()
        );
        let mut revisions = Vec::new();
        for watcher in &watchers {
            let events = watcher
                .wait_events(2 * KEYS_PER_LEASE, RESPONSE_TIMEOUT)
                .await?;
            sleep(QUIET_CHECK).await;
            let events_after = watcher.events();
            ensure!(
                events_after.len() == events.len(),
                "{}: events after the expiry's deletes:\n{}",
                watcher.what,
                render_events(&events_after)
            );
            let deletes = &events[KEYS_PER_LEASE..];
            revisions.push(check_expiry_deletes(&watcher.what, deletes, prefix, lease)?);
            for received in deletes {
                ensure!(
                    received.at >= not_before,
                    "{}: DELETE received {:?} after the last acknowledged keep-alive was sent",
                    watcher.what,
                    received.at - last_acked
                );
            }
        }
        ensure!(
            revisions.iter().all(|&r| r == revisions[0]),
            "the watchers saw the expiry at different revisions: {revisions:?}"
        );
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

// ---------------------------------------------------------------------------
// Scenario c: keep-alive while the leader is cut off, and after it returns.
// ---------------------------------------------------------------------------

async fn keep_alive_past_a_cut_off_leader_keeps_the_lease(server: Server) {
    let config = ClusterConfig {
        namespaces: true,
        ..ClusterConfig::new(MEMBERS)
    };
    let cluster = server.start(config).await;
    let run = async {
        let prefix = "cut/";
        let leader = cluster.leader().await?;
        let followers: Vec<usize> = (0..MEMBERS).filter(|&i| i != leader).collect();
        let watchers = watch_members(&cluster, prefix, &followers).await?;
        let client = connect(&[cluster.endpoint(followers[0])]).await?;
        let lease = grant_with_keys(&client, prefix).await?;
        // Keep-alives go to the followers only: the leader is about to be
        // cut off from them (the test still reaches it).
        let mut clients = vec![(followers[0], client.clone())];
        clients.push((
            followers[1],
            connect(&[cluster.endpoint(followers[1])]).await?,
        ));
        let log = Arc::new(Mutex::new(KeepAliveLog::default()));
        let stop = Arc::new(tokio::sync::Notify::new());
        let keep_alive = keep_alive_loop(clients, lease, log.clone(), stop.clone());
        sleep(KEEP_ALIVE_BEFORE_KILL).await;

        let leader = cluster.leader().await?;
        let network = cluster.network()?;
        let cut_at = Instant::now();
        network.isolate(leader)?;
        eprintln!("{server:?}: cut leader member {leader} off for {CUT_OFF_FOR:?}");
        let heal_at = cut_at + CUT_OFF_FOR;
        let keep_until = heal_at + KEEP_ALIVE_TTL * KEEP_ALIVE_ROUNDS_AFTER_KILL;
        let mut healed = false;
        while Instant::now() < keep_until {
            if !healed && Instant::now() >= heal_at {
                network.heal_all()?;
                healed = true;
            }
            let fault = format!("the cut (healed: {healed})");
            check_kept_alive(&log, &watchers, cut_at, &fault)?;
            sleep(READ_POLL_INTERVAL).await;
        }
        stop.notify_one();
        timeout(RESPONSE_TIMEOUT, keep_alive)
            .await
            .context("the keep-alive loop did not stop")??;
        let (acked_after_heal, errors) = {
            let log = log.lock().expect("log");
            let acked = log.acked.iter().filter(|&&sent| sent > heal_at).count();
            (acked, log.errors.clone())
        };
        eprintln!(
            "{server:?}: {acked_after_heal} keep-alives acknowledged after the heal; stream errors: {errors:?}"
        );
        ensure!(
            acked_after_heal > 0,
            "no keep-alive sent after the heal was acknowledged (errors: {errors:?})"
        );
        // Every member, the one that was cut off included, still has the
        // lease and its keys.
        for i in 0..MEMBERS {
            let ttl = time_to_live(&cluster, i, lease).await?;
            ensure!(ttl > 0, "member {i}: TimeToLive says TTL {ttl}");
            retry_until(
                &format!("member {i} to show the lease's {KEYS_PER_LEASE} keys"),
                RESTART_CONVERGENCE_TIMEOUT,
                || async {
                    let (present, revision) = serializable_keys(&cluster, i, prefix).await?;
                    ensure!(
                        present == KEYS_PER_LEASE,
                        "{present} keys at revision {revision}"
                    );
                    Ok(())
                },
            )
            .await?;
        }
        for watcher in &watchers {
            check_puts(&watcher.what, &watcher.events(), prefix, lease)?;
        }
        Ok::<_, anyhow::Error>(())
    };
    run.await.unwrap_or_else(|e| panic!("{server:?}: {e:#}"));
}

against_both!(
    lease_with_keys_expires_once_across_a_leader_kill,
    keep_alive_through_a_leader_kill_keeps_the_lease,
);

/// The candidate only: etcd 3.5.1 loses the lease (see the module
/// documentation).
#[tokio::test]
async fn candidate_keeps_a_lease_alive_past_a_cut_off_leader() {
    keep_alive_past_a_cut_off_leader_keeps_the_lease(Server::Candidate).await;
}
