//! Backups in etcd 3.5's snapshot format, both ways.
//!
//! - `snapshot_status_matches_etcd`: the same workload (puts, overwrites,
//!   deletes, a txn, a compaction, leases with attached keys, users and
//!   roles with permissions; auth stays disabled) on etcd 3.5 and on the
//!   store; `etcdctl snapshot save` against both; `etcdutl snapshot status
//!   -w json` reports the same revision for both files and one key more in
//!   the store's (etcd 3.6's `meta/storageVersion`), and
//!   `store-util snapshot status -w json` prints what etcdutl prints.
//! - `store_snapshot_restores_into_etcd`: store snapshot -> `etcdutl
//!   snapshot restore` -> a real etcd 3.5 serves every key (value, create
//!   and mod revision, version, lease), the revision, the leases (ids and
//!   keys), users, roles and auth status as the store did.
//! - `etcd_snapshot_restores_into_store_members`: etcd 3.5 snapshot ->
//!   `store-util snapshot restore` -> 3 store members started on the
//!   restored data dirs serve the same (every member, serializable reads)
//!   and take new writes.
//! - `damaged_snapshots_are_refused`: a corrupted and a truncated etcd
//!   snapshot are refused by `store-util snapshot restore`, with an error
//!   naming the problem and no data dir created.
//! - `auth_enabled_snapshots_restore_both_ways`: the workload plus root and
//!   `auth enable`; store -> etcdutl -> etcd, then that etcd's snapshot ->
//!   store-util -> store, compared as root at each step (snapshot without
//!   credentials refused; the restored store refuses unauthenticated writes).
//! - `client_snapshot_stream_is_etcds`: a raw `Maintenance.Snapshot`
//!   stream written to a file passes `etcdutl snapshot status`; the
//!   stream's shape (32 KiB chunks, remaining bytes, SHA-256 as the last
//!   message) is etcd's.
//! - `python_etcd3_test_snapshot_passes`: python-etcd3 0.12.0's own
//!   `test_snapshot` (`tests/fixtures/python-etcd3-test-snapshot.py`, in
//!   the virtualenv setup.sh makes) against etcd 3.5 and the store.
//!
//! Run: `cargo build --release -p store && cargo test --release -p integration-tests --test integration etcd_snapshot::`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use integration_tests::binary::etcd35_dir;
use integration_tests::etcdctl::txn_script;
use integration_tests::{Binary, Cluster, ClusterConfig, CtlOutput, Etcdctl};
use sha2::Digest;
use tokio::process::Command;

/// Bound of one restore / status tool run.
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// The workload compacts at this revision.
const COMPACT_AT: i64 = 10;
/// etcd's Snapshot chunk size.
const CHUNK: usize = 32 * 1024;

fn ctl(endpoints: &[String]) -> Etcdctl {
    Etcdctl::new(
        Binary::etcdctl35().expect("etcdctl 3.5"),
        endpoints.to_vec(),
    )
}

async fn ok(ctl: &Etcdctl, args: &[&str]) -> CtlOutput {
    let out = ctl.run(args).await.expect("running etcdctl");
    assert!(out.success(), "etcdctl {args:?} failed:\n{out}");
    out
}

/// The workload, through etcdctl, identical on any server. Returns the
/// lease ids granted (with keys, without keys).
async fn workload(c: &Etcdctl) -> (String, String) {
    for i in 0..6 {
        ok(c, &["put", &format!("a/{i}"), &format!("v{i}")]).await; // 2..=7
    }
    ok(c, &["put", "a/0", "v0-2"]).await; // 8
    ok(c, &["put", "a/1", "v1-2"]).await; // 9
    ok(c, &["del", "a/2"]).await; // 10
    ok(c, &["compact", &COMPACT_AT.to_string()]).await;
    let script = txn_script(
        &["version(\"a/0\") = \"2\""],
        &["put b/txn yes", "del a/3"],
        &["put b/txn no"],
    );
    let out = c
        .run_with_stdin(&["txn"], &script)
        .await
        .expect("etcdctl txn");
    assert!(out.success() && out.stdout.starts_with("SUCCESS"), "{out}"); // 11
    let grant = ok(c, &["lease", "grant", "600"]).await;
    let with_keys = grant
        .stdout
        .split_whitespace()
        .nth(1)
        .expect("lease id")
        .to_string();
    let grant = ok(c, &["lease", "grant", "900"]).await;
    let without = grant
        .stdout
        .split_whitespace()
        .nth(1)
        .expect("lease id")
        .to_string();
    ok(c, &["put", "l/1", "x", &format!("--lease={with_keys}")]).await; // 12
    ok(c, &["put", "l/2", "y", &format!("--lease={with_keys}")]).await; // 13
    ok(c, &["del", "a/0"]).await; // 14
    ok(c, &["put", "a/0", "reborn"]).await; // 15
    ok(c, &["user", "add", "alice:alice-pw"]).await;
    ok(c, &["user", "add", "bob", "--no-password"]).await;
    ok(c, &["role", "add", "reader"]).await;
    ok(c, &["role", "add", "writer"]).await;
    ok(
        c,
        &["role", "grant-permission", "reader", "read", "a/", "b/"],
    )
    .await;
    ok(
        c,
        &[
            "role",
            "grant-permission",
            "writer",
            "readwrite",
            "--prefix",
            "l/",
        ],
    )
    .await;
    ok(c, &["role", "grant-permission", "writer", "write", "b/txn"]).await;
    ok(c, &["user", "grant-role", "alice", "reader"]).await;
    ok(c, &["user", "grant-role", "alice", "writer"]).await;
    ok(c, &["user", "grant-role", "bob", "reader"]).await;
    (with_keys, without)
}

/// Everything a backup carries that a client can see, comparable across servers.
#[derive(Debug, PartialEq, Eq)]
struct Dump {
    revision: i64,
    /// Each key as etcdctl prints it in JSON (base64 key/value, revisions, version, lease).
    kvs: Vec<serde_json::Value>,
    /// Lease id -> (granted TTL, attached keys).
    leases: BTreeMap<i64, (i64, Vec<String>)>,
    /// `user get` / `role get` / `auth status` text.
    auth: Vec<String>,
}

/// The dump of the member(s) `c` talks to (`serializable`: what that member stores).
async fn dump(c: &Etcdctl, serializable: bool) -> Result<Dump> {
    dump_as(c, None, serializable).await
}

/// etcdctl `args` with `--user=creds` if given.
async fn run_as(c: &Etcdctl, creds: Option<&str>, args: &[&str]) -> Result<CtlOutput> {
    let user = creds.map(|u| format!("--user={u}"));
    let mut all: Vec<&str> = user.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    c.run(&all).await
}

/// [`dump`] as user `creds` (`name:password`) when auth is enabled.
async fn dump_as(c: &Etcdctl, creds: Option<&str>, serializable: bool) -> Result<Dump> {
    let consistency = if serializable {
        "--consistency=s"
    } else {
        "--consistency=l"
    };
    let get = run_as(
        c,
        creds,
        &["get", "", "--prefix", "-w", "json", consistency],
    )
    .await?;
    ensure!(get.success(), "get: {get}");
    let json = get.json()?;
    let revision = json["header"]["revision"].as_i64().context("revision")?;
    let kvs = json["kvs"].as_array().cloned().unwrap_or_default();
    let list = run_as(c, creds, &["lease", "list", "-w", "json"]).await?;
    ensure!(list.success(), "lease list: {list}");
    let mut leases = BTreeMap::new();
    for l in list.json()?["leases"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let id = l["id"].as_i64().context("lease id")?;
        let ttl = run_as(
            c,
            creds,
            &[
                "lease",
                "timetolive",
                &format!("{id:x}"),
                "--keys",
                "-w",
                "json",
            ],
        )
        .await?;
        ensure!(ttl.success(), "timetolive: {ttl}");
        let t = ttl.json()?;
        let mut keys: Vec<String> = t["keys"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|k| k.as_str().unwrap_or_default().to_string())
            .collect();
        keys.sort();
        leases.insert(id, (t["granted-ttl"].as_i64().unwrap_or(-1), keys));
    }
    let mut auth = Vec::new();
    for args in [
        vec!["user", "list"],
        vec!["user", "get", "alice"],
        vec!["user", "get", "bob"],
        vec!["role", "list"],
        vec!["role", "get", "reader"],
        vec!["role", "get", "writer"],
        vec!["auth", "status"],
    ] {
        let out = run_as(c, creds, &args).await?;
        ensure!(out.success(), "{args:?}: {out}");
        auth.push(out.stdout);
    }
    Ok(Dump {
        revision,
        kvs,
        leases,
        auth,
    })
}

/// Checks the workload really produced what the comparison relies on.
fn check_workload_dump(d: &Dump) {
    assert_eq!(d.revision, 15, "{d:?}");
    assert_eq!(d.kvs.len(), 7, "a/0 a/1 a/4 a/5 b/txn l/1 l/2: {d:?}");
    assert_eq!(d.leases.len(), 2, "{d:?}");
    assert!(d.leases.values().any(|(_, keys)| keys.len() == 2), "{d:?}");
    assert!(
        d.auth[1].contains("reader") && d.auth[1].contains("writer"),
        "{d:?}"
    );
}

async fn save(c: &Etcdctl, file: &Path) {
    let out = ok(c, &["snapshot", "save", &file.display().to_string()]).await;
    assert!(out.stdout.contains("Snapshot saved at"), "{out}");
}

async fn tool(path: &Path, args: &[String]) -> CtlOutput {
    let output = tokio::time::timeout(
        TOOL_TIMEOUT,
        Command::new(path).args(args).kill_on_drop(true).output(),
    )
    .await
    .expect("tool timed out")
    .expect("running the tool");
    CtlOutput {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        code: output.status.code(),
    }
}

fn etcdutl() -> PathBuf {
    etcd35_dir().join("etcdutl")
}

fn store_util(candidate: &Binary) -> PathBuf {
    std::env::var_os("STORE_UTIL_BIN")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| candidate.path.parent().expect("dir").join("store-util"))
}

async fn status_json(tool_path: &Path, file: &Path) -> serde_json::Value {
    let out = tool(
        tool_path,
        &[
            "snapshot".into(),
            "status".into(),
            file.display().to_string(),
            "-w".into(),
            "json".into(),
        ],
    )
    .await;
    assert!(
        out.success(),
        "{} snapshot status failed:\n{out}",
        tool_path.display()
    );
    out.json().expect("status JSON")
}

/// `tool snapshot restore file` for member `i` of `cluster`, which must be stopped.
async fn restore_member(tool_path: &Path, file: &Path, cluster: &Cluster, i: usize) -> CtlOutput {
    let name = cluster.flag(i, "name").expect("--name");
    let data_dir = PathBuf::from(cluster.flag(i, "data-dir").expect("--data-dir"));
    std::fs::remove_dir_all(&data_dir).expect("removing the data dir");
    tool(
        tool_path,
        &[
            "snapshot".into(),
            "restore".into(),
            file.display().to_string(),
            format!("--name={name}"),
            format!("--data-dir={}", data_dir.display()),
            format!(
                "--initial-cluster={}",
                cluster.flag(i, "initial-cluster").expect("flag")
            ),
            format!(
                "--initial-cluster-token={}",
                cluster.flag(i, "initial-cluster-token").expect("flag")
            ),
            format!("--initial-advertise-peer-urls={}", cluster.peer_url(i)),
        ],
    )
    .await
}

/// Stops `cluster`, restores every member from `file` with `tool_path`,
/// starts it again and waits until it is healthy.
async fn restore_cluster(tool_path: &Path, file: &Path, cluster: &Cluster) {
    restore_cluster_no_wait(tool_path, file, cluster).await;
    cluster
        .wait_healthy()
        .await
        .expect("restored cluster healthy");
}

fn backup_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("etcd-it-etcdsnap-")
        .tempdir()
        .expect("temp dir")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_status_matches_etcd() {
    let candidate = Binary::candidate().expect("candidate");
    let store = Cluster::start(candidate.clone(), ClusterConfig::new(1))
        .await
        .expect("store");
    let etcd = Cluster::start(Binary::etcd35().expect("etcd"), ClusterConfig::new(1))
        .await
        .expect("etcd");
    let dir = backup_dir();
    let mut statuses = Vec::new();
    for (what, cluster) in [("store", &store), ("etcd", &etcd)] {
        let c = ctl(&cluster.endpoints());
        workload(&c).await;
        check_workload_dump(&dump(&c, false).await.expect("dump"));
        let file = dir.path().join(format!("{what}.db"));
        save(&c, &file).await;
        let by_etcdutl = status_json(&etcdutl(), &file).await;
        let by_store_util = status_json(&store_util(&candidate), &file).await;
        assert_eq!(
            by_etcdutl, by_store_util,
            "store-util status of the {what} file"
        );
        statuses.push(by_etcdutl);
    }
    assert_eq!(statuses[0]["revision"], 15, "{statuses:?}");
    // The store's file has etcd 3.6's layout: 3.5's plus the one key
    // `meta/storageVersion`.
    let keys = |s: &serde_json::Value| s["totalKey"].as_i64().expect("totalKey");
    assert_eq!(
        (&statuses[0]["revision"], keys(&statuses[0])),
        (&statuses[1]["revision"], keys(&statuses[1]) + 1),
        "etcdutl snapshot status of the store's file vs etcd 3.5's: {statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_snapshot_restores_into_etcd() {
    let store = Cluster::start(
        Binary::candidate().expect("candidate"),
        ClusterConfig::new(3),
    )
    .await
    .expect("store");
    let c = ctl(&store.endpoints());
    workload(&c).await;
    let before = dump(&c, false).await.expect("store dump");
    check_workload_dump(&before);
    let dir = backup_dir();
    let file = dir.path().join("store.db");
    save(&ctl(&[store.endpoint(1)]), &file).await;
    drop(store);

    let etcd = Cluster::start(Binary::etcd35().expect("etcd"), ClusterConfig::new(1))
        .await
        .expect("etcd");
    restore_cluster(&etcdutl(), &file, &etcd).await;
    let after = dump(&ctl(&etcd.endpoints()), false)
        .await
        .expect("etcd dump");
    assert_eq!(after, before, "etcd restored from the store's snapshot");
    // etcd takes writes on it, at the next revision.
    let put = ok(
        &ctl(&etcd.endpoints()),
        &["put", "after", "restore", "-w", "json"],
    )
    .await;
    assert_eq!(
        put.header_revision().expect("revision"),
        before.revision + 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_snapshot_restores_into_store_members() {
    let candidate = Binary::candidate().expect("candidate");
    let etcd = Cluster::start(Binary::etcd35().expect("etcd"), ClusterConfig::new(1))
        .await
        .expect("etcd");
    let c = ctl(&etcd.endpoints());
    workload(&c).await;
    let before = dump(&c, false).await.expect("etcd dump");
    check_workload_dump(&before);
    let dir = backup_dir();
    let file = dir.path().join("etcd.db");
    save(&c, &file).await;
    drop(etcd);

    let store = Cluster::start(candidate.clone(), ClusterConfig::new(3))
        .await
        .expect("store");
    restore_cluster(&store_util(&candidate), &file, &store).await;
    for i in 0..store.size() {
        let after = dump(&ctl(&[store.endpoint(i)]), true)
            .await
            .unwrap_or_else(|e| panic!("member {i}: {e:#}"));
        assert_eq!(
            after, before,
            "store member {i} restored from etcd's snapshot"
        );
    }
    let all = ctl(&store.endpoints());
    let put = ok(&all, &["put", "after", "restore", "-w", "json"]).await;
    let written = put.header_revision().expect("revision");
    assert_eq!(written, before.revision + 1);
    ok(
        &all,
        &[
            "put",
            "l/3",
            "z",
            &format!("--lease={:x}", before.leases.keys().next().expect("lease")),
        ],
    )
    .await;
    for i in 0..store.size() {
        let endpoint = store.endpoint(i);
        let endpoint = &endpoint;
        integration_tests::wait::retry_until(
            &format!("member {i} has the new writes"),
            Duration::from_secs(30),
            || async move {
                let d = dump(&ctl(std::slice::from_ref(endpoint)), true).await?;
                ensure!(d.revision == written + 1, "member {i} at {}", d.revision);
                Ok(())
            },
        )
        .await
        .expect("new writes replicated");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_snapshots_are_refused() {
    let candidate = Binary::candidate().expect("candidate");
    let etcd = Cluster::start(Binary::etcd35().expect("etcd"), ClusterConfig::new(1))
        .await
        .expect("etcd");
    let c = ctl(&etcd.endpoints());
    workload(&c).await;
    let dir = backup_dir();
    let file = dir.path().join("etcd.db");
    save(&c, &file).await;
    let bytes = std::fs::read(&file).expect("read");
    let mut corrupted = bytes.clone();
    corrupted[bytes.len() / 2] ^= 0xff;
    let truncated = bytes[..bytes.len() - 100].to_vec();
    // A damaged page under a valid trailer: only the full check finds it.
    let mut bad_page = bytes[..bytes.len() - 32].to_vec();
    // The root bucket's page (named by the meta page with the higher txid)
    // gets invalid page flags.
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
    let page_size = u32::from_le_bytes(bad_page[24..28].try_into().expect("4")) as usize;
    let meta = if u64_at(&bad_page, page_size + 64) > u64_at(&bad_page, 64) {
        page_size
    } else {
        0
    };
    let root = u64_at(&bad_page, meta + 32) as usize;
    bad_page[root * page_size + 8] = 0x7f;
    let sum = sha2::Sha256::digest(&bad_page);
    bad_page.extend_from_slice(&sum);
    for (what, content, expect) in [
        ("corrupted", corrupted, "sha256 mismatch"),
        ("truncated", truncated, "no sha256 trailer"),
        ("bad-page", bad_page, "page"),
    ] {
        let damaged = dir.path().join(format!("{what}.db"));
        std::fs::write(&damaged, content).expect("write");
        let data_dir = dir.path().join(format!("{what}.etcd"));
        let out = tool(
            &store_util(&candidate),
            &[
                "snapshot".into(),
                "restore".into(),
                damaged.display().to_string(),
                "--name=m0".into(),
                format!("--data-dir={}", data_dir.display()),
            ],
        )
        .await;
        assert!(!out.success(), "a {what} file must be refused:\n{out}");
        assert!(
            out.stderr.contains(expect),
            "the refusal of the {what} file must name the problem ({expect}):\n{out}"
        );
        assert!(!data_dir.exists(), "no data dir for a refused {what} file");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_snapshot_stream_is_etcds() {
    let store = Cluster::start(
        Binary::candidate().expect("candidate"),
        ClusterConfig::new(1),
    )
    .await
    .expect("store");
    let c = ctl(&store.endpoints());
    workload(&c).await;
    // Enough data for several chunks.
    let big = "x".repeat(60 * 1024);
    for i in 0..3 {
        ok(&c, &["put", &format!("big/{i}"), &big]).await;
    }
    let mut client = store.client(0).await.expect("client");
    let mut stream = client.snapshot().await.expect("snapshot stream");
    let mut messages = Vec::new();
    while let Some(m) = stream.message().await.expect("snapshot message") {
        messages.push((m.remaining_bytes(), m.blob().to_vec()));
    }
    assert!(messages.len() >= 3, "{} messages", messages.len());
    let (db_msgs, last) = messages.split_at(messages.len() - 1);
    let db: Vec<u8> = db_msgs.iter().flat_map(|(_, b)| b.clone()).collect();
    let mut sent = 0u64;
    for (remaining, blob) in db_msgs {
        assert!(blob.len() <= CHUNK);
        sent += blob.len() as u64;
        assert_eq!(*remaining, db.len() as u64 - sent, "remaining_bytes");
    }
    assert_eq!(last[0].0, 0);
    assert_eq!(
        last[0].1,
        sha2::Sha256::digest(&db).to_vec(),
        "the last message is the SHA-256"
    );
    // python-etcd3's test_snapshot: the raw stream in a file, then `snapshot status`.
    let dir = backup_dir();
    let file = dir.path().join("raw.db");
    std::fs::write(
        &file,
        messages
            .iter()
            .flat_map(|(_, b)| b.clone())
            .collect::<Vec<u8>>(),
    )
    .expect("write");
    let st = status_json(&etcdutl(), &file).await;
    assert_eq!(st["revision"], 18, "{st}");
}

/// Root credentials of the auth-enabled scenario.
const ROOT: &str = "root:root-pw";

/// The workload, then root and `auth enable`.
async fn workload_with_auth(c: &Etcdctl) {
    workload(c).await;
    ok(c, &["role", "add", "root"]).await;
    ok(c, &["user", "add", ROOT]).await;
    ok(c, &["user", "grant-role", "root", "root"]).await;
    ok(c, &["auth", "enable"]).await;
}

/// Waits until `c` serves the dump as root (a restored server just started;
/// the harness' health check reads without credentials).
async fn dump_when_up(c: &Etcdctl) -> Dump {
    integration_tests::wait::retry_until(
        "the restored server to serve root",
        Duration::from_secs(60),
        || dump_as(c, Some(ROOT), false),
    )
    .await
    .expect("dump as root")
}

/// Stops `cluster`, restores every member from `file`, starts it again
/// (auth is on: readiness is checked by [`dump_when_up`]).
async fn restore_cluster_no_wait(tool_path: &Path, file: &Path, cluster: &Cluster) {
    cluster.kill_all().expect("stopping the cluster");
    for i in 0..cluster.size() {
        let out = restore_member(tool_path, file, cluster, i).await;
        assert!(
            out.success(),
            "{} snapshot restore failed:\n{out}",
            tool_path.display()
        );
    }
    for i in 0..cluster.size() {
        cluster.restart(i).expect("starting a restored member");
    }
}

/// With auth enabled (root credentials throughout): store -> etcd and
/// etcd -> store keep the enabled flag, users, roles and auth revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_enabled_snapshots_restore_both_ways() {
    let candidate = Binary::candidate().expect("candidate");
    let dir = backup_dir();

    // store -> etcd
    let store = Cluster::start(candidate.clone(), ClusterConfig::new(1))
        .await
        .expect("store");
    let c = ctl(&store.endpoints());
    workload_with_auth(&c).await;
    let before = dump_as(&c, Some(ROOT), false).await.expect("store dump");
    assert!(
        before.auth[6].contains("Authentication Status: true"),
        "{before:?}"
    );
    let denied = c
        .run(&["snapshot", "save", "/dev/null"])
        .await
        .expect("etcdctl");
    assert!(
        !denied.success(),
        "snapshot without credentials once auth is on"
    );
    let file = dir.path().join("store-auth.db");
    let saved = run_as(
        &c,
        Some(ROOT),
        &["snapshot", "save", &file.display().to_string()],
    )
    .await
    .expect("snapshot save");
    assert!(saved.success(), "{saved}");
    drop(store);
    let etcd = Cluster::start(Binary::etcd35().expect("etcd"), ClusterConfig::new(1))
        .await
        .expect("etcd");
    restore_cluster_no_wait(&etcdutl(), &file, &etcd).await;
    let in_etcd = dump_when_up(&ctl(&etcd.endpoints())).await;
    assert_eq!(
        in_etcd, before,
        "etcd restored from the auth-enabled store snapshot"
    );

    // etcd -> store
    let file = dir.path().join("etcd-auth.db");
    let saved = run_as(
        &ctl(&etcd.endpoints()),
        Some(ROOT),
        &["snapshot", "save", &file.display().to_string()],
    )
    .await
    .expect("snapshot save");
    assert!(saved.success(), "{saved}");
    drop(etcd);
    let store = Cluster::start(candidate.clone(), ClusterConfig::new(1))
        .await
        .expect("store");
    restore_cluster_no_wait(&store_util(&candidate), &file, &store).await;
    let in_store = dump_when_up(&ctl(&store.endpoints())).await;
    assert_eq!(
        in_store, before,
        "store restored from the auth-enabled etcd snapshot"
    );
    let denied = ctl(&store.endpoints())
        .run(&["put", "x", "y"])
        .await
        .expect("etcdctl");
    assert!(
        !denied.success(),
        "auth is enabled on the restored store:\n{denied}"
    );
}

/// Where setup.sh installs python-etcd3 (`ETCD3_VENV` there and here).
const PYTHON_ETCD3_VENV: &str = "/opt/python-etcd3-venv";

/// python-etcd3's own `test_snapshot` (the client saves a snapshot, then
/// etcdutl checks it) passes against the store, as against etcd 3.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_etcd3_test_snapshot_passes() {
    let venv = std::env::var("ETCD3_VENV").unwrap_or_else(|_| PYTHON_ETCD3_VENV.to_string());
    let python = Path::new(&venv).join("bin/python");
    assert!(
        python.exists(),
        "{} missing: run scripts/setup.sh (it installs python-etcd3)",
        python.display()
    );
    let script =
        integration_tests::binary::manifest_dir().join("fixtures/python-etcd3-test-snapshot.py");
    let etcdutl = etcd35_dir().join("etcdutl");
    for binary in [
        Binary::etcd35().expect("etcd"),
        Binary::candidate().expect("store"),
    ] {
        let cluster = Cluster::start(binary, ClusterConfig::new(1))
            .await
            .expect("cluster");
        let ip = cluster.ip(0).to_string();
        let out = tokio::time::timeout(
            TOOL_TIMEOUT,
            Command::new(&python)
                .arg(&script)
                .args([ip.as_str(), "2379"])
                .arg(&etcdutl)
                .output(),
        )
        .await
        .expect("python-etcd3 finished")
        .expect("python-etcd3 runs");
        assert!(
            out.status.success(),
            "{}: python-etcd3's test_snapshot failed:\n{}{}",
            cluster.binary().role,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
