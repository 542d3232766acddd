//! Maintenance: HashKV, snapshot backup and restore, defragmentation, alarms
//! and endpoint status.
//!
//! - HashKV: after the same history (puts, overwrites, deletes, a range
//!   delete, a txn, a compaction, writes after it) every member of a
//!   3-member cluster gives the same hash at the same revision (etcd-client
//!   and `etcdctl endpoint hashkv --cluster`); and a single candidate member
//!   gives the same hashes and errors as a single real etcd member for the
//!   same history (the algorithm is etcd's over etcd's key layout).
//! - Snapshot: `etcdctl snapshot save` against a candidate member, the
//!   backup restored (`store-util snapshot restore`, like `etcdutl`) into 3
//!   fresh data directories, a new 3-member cluster started from them serves
//!   identical data at the same revision with the same HashKV, and takes new
//!   writes; a corrupted or truncated backup is refused by the restore. The
//!   same scenario runs against real etcd 3.5 with `etcdutl`.
//! - `etcdctl defrag`, `alarm list` (empty) and `endpoint status` (version
//!   3.5.x, one leader all members agree on, raft index) on a 3-member
//!   candidate cluster, and compared with etcd 3.5 on single members.
//!
//! The restore tool is `$STORE_UTIL_BIN` if set, else `store-util` next to
//! the candidate binary (`etcdutl` next to it if the candidate is `etcd`).
//!
//! Run: `STORE_BIN=/root/.cache/etcd-rs/target/release/store cargo test -p integration-tests --test integration maintenance::`

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp,
};
use integration_tests::client::{connect, describe_error, hash_kv_when_applied};
use integration_tests::wait::retry_until;
use integration_tests::{Binary, Cluster, ClusterConfig, CtlOutput, Differential, Etcdctl};
use regex::Regex;
use tokio::process::Command;

/// Members of the multi-member clusters.
const MEMBERS: usize = 3;
/// Size of the one large value of the history.
const BIG_VALUE_BYTES: usize = 10 * 1024;
/// The revision the history compacts at (physically), see [`history`].
const COMPACT_REVISION: i64 = 28;
/// The revision after the whole history (writes start at revision 2).
const FINAL_REVISION: i64 = 36;
/// Deadline for a member to have applied a revision (HashKV at a revision a
/// member has not reached yet answers "future revision").
const APPLY_TIMEOUT: Duration = Duration::from_secs(90);
/// Wall-clock bound of one restore-tool run.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(120);
/// Byte flipped in the corrupted copy of the backup, as a fraction of its size.
const CORRUPT_AT_FRACTION: usize = 2;
/// Bytes cut off the end of the truncated copy of the backup.
const TRUNCATED_BYTES: usize = 16;

// ---------------------------------------------------------------------------
// The history every test applies.
// ---------------------------------------------------------------------------

/// One operation of the history. No leases: lease ids are chosen by the
/// server and are part of the hashed key-values.
#[derive(Clone, Debug)]
enum Op {
    Put(String, String),
    Delete(String),
    DeletePrefix(String),
    /// If `key` has `version`, put `then_put` and delete `then_delete`, else
    /// put `else_put`.
    Txn {
        key: String,
        version: i64,
        then_put: String,
        then_delete: String,
        else_put: String,
    },
    Compact(i64),
}

/// Revisions: 20 puts (2..=21), 5 overwrites (..=26), a delete (27), 3 puts
/// (..=30), a range delete (31), a txn (32), a large value (33), the
/// compaction at 28, a put (34), a delete of a key last written before the
/// compaction (35), a put (36).
fn history() -> Vec<Op> {
    let mut ops = Vec::new();
    for i in 1..=20 {
        ops.push(Op::Put(format!("a/{i:02}"), format!("v{i}")));
    }
    for i in 1..=5 {
        ops.push(Op::Put(format!("a/{i:02}"), format!("v{i}-2")));
    }
    ops.push(Op::Delete("a/03".into()));
    for name in ["x", "y", "z"] {
        ops.push(Op::Put(format!("b/{name}"), format!("b-{name}")));
    }
    ops.push(Op::DeletePrefix("b/".into()));
    ops.push(Op::Txn {
        key: "a/01".into(),
        version: 2,
        then_put: "a/txn".into(),
        then_delete: "a/02".into(),
        else_put: "a/else".into(),
    });
    ops.push(Op::Put("c/big".into(), "x".repeat(BIG_VALUE_BYTES)));
    ops.push(Op::Compact(COMPACT_REVISION));
    ops.push(Op::Put("a/01".into(), "v1-3".into()));
    ops.push(Op::Delete("a/10".into()));
    ops.push(Op::Put("d/1".into(), "d1".into()));
    ops
}

/// Applies `op`; the response's `Debug` form (for a differential comparison).
async fn apply(mut client: Client, op: Op) -> Result<String, etcd_client::Error> {
    Ok(match op {
        Op::Put(key, value) => format!("{:?}", client.put(key, value, None).await?),
        Op::Delete(key) => format!("{:?}", client.delete(key, None).await?),
        Op::DeletePrefix(prefix) => format!(
            "{:?}",
            client
                .delete(prefix, Some(DeleteOptions::new().with_prefix()))
                .await?
        ),
        Op::Txn {
            key,
            version,
            then_put,
            then_delete,
            else_put,
        } => {
            let txn = Txn::new()
                .when([Compare::version(key, CompareOp::Equal, version)])
                .and_then([
                    TxnOp::put(then_put, "txn", None),
                    TxnOp::delete(then_delete, None),
                ])
                .or_else([TxnOp::put(else_put, "else", None)]);
            format!("{:?}", client.txn(txn).await?)
        }
        Op::Compact(revision) => format!(
            "{:?}",
            client
                .compact(revision, Some(CompactionOptions::new().with_physical()))
                .await?
        ),
    })
}

/// Applies the whole history through `client`; returns the revision after it.
async fn apply_history(client: &Client) -> Result<i64> {
    for op in history() {
        apply(client.clone(), op.clone())
            .await
            .with_context(|| format!("applying {op:?}"))?;
    }
    let revision = linearizable_revision(client).await?;
    ensure!(
        revision == FINAL_REVISION,
        "revision after the history is {revision}, expected {FINAL_REVISION}"
    );
    Ok(revision)
}

/// The current revision, read linearizably (a barrier).
async fn linearizable_revision(client: &Client) -> Result<i64> {
    let response = client
        .clone()
        .get(
            "\0",
            Some(GetOptions::new().with_all_keys().with_count_only()),
        )
        .await?;
    Ok(response
        .header()
        .context("range without header")?
        .revision())
}

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

fn ctl(endpoints: &[String]) -> Etcdctl {
    Etcdctl::new(
        Binary::etcdctl35().expect("etcdctl 3.5"),
        endpoints.to_vec(),
    )
}

/// One key-value pair with every field, comparable across clusters.
type Kv = (String, Vec<u8>, i64, i64, i64, i64);

/// Every key of `endpoint` (serializable: what that member stores) once it
/// has applied `revision`, with the revision the read was served at.
async fn all_keys(endpoint: &str, revision: i64) -> Result<(Vec<Kv>, i64)> {
    retry_until(
        &format!("all keys of {endpoint} at revision {revision}"),
        APPLY_TIMEOUT,
        || async move {
            let response = connect(&[endpoint.to_string()])
                .await?
                .get(
                    "\0",
                    Some(GetOptions::new().with_all_keys().with_serializable()),
                )
                .await?;
            let served = response
                .header()
                .context("range without header")?
                .revision();
            ensure!(
                served >= revision,
                "{endpoint} has applied revision {served} < {revision}"
            );
            let kvs = response
                .kvs()
                .iter()
                .map(|kv| {
                    (
                        String::from_utf8_lossy(kv.key()).into_owned(),
                        kv.value().to_vec(),
                        kv.create_revision(),
                        kv.mod_revision(),
                        kv.version(),
                        kv.lease(),
                    )
                })
                .collect();
            Ok((kvs, served))
        },
    )
    .await
}

/// The restore tool for `server`: `$STORE_UTIL_BIN`, else `store-util` next
/// to it, or `etcdutl` next to an `etcd` binary.
fn restore_tool(server: &Binary) -> Binary {
    if let Some(path) = std::env::var_os("STORE_UTIL_BIN").filter(|path| !path.is_empty()) {
        if server.file_name() != "etcd" {
            return Binary::at(
                "candidate restore tool",
                PathBuf::from(path),
                "set STORE_UTIL_BIN",
            )
            .expect("restore tool");
        }
    }
    let dir = server.path.parent().unwrap_or(Path::new("/"));
    let name = if server.file_name() == "etcd" {
        "etcdutl"
    } else {
        "store-util"
    };
    Binary::at(
        &format!("restore tool for {}", server.role),
        dir.join(name),
        "build it with `cargo build --release -p store` (it is the store-util binary), \
         or set STORE_UTIL_BIN",
    )
    .expect("restore tool")
}

/// Runs `tool snapshot restore <file> ...` for one member.
async fn restore(
    tool: &Binary,
    file: &Path,
    name: &str,
    data_dir: &Path,
    initial_cluster: &str,
    token: &str,
    peer: &str,
) -> Result<CtlOutput> {
    let output = tokio::time::timeout(
        RESTORE_TIMEOUT,
        Command::new(&tool.path)
            .arg("snapshot")
            .arg("restore")
            .arg(file)
            .arg(format!("--name={name}"))
            .arg(format!("--data-dir={}", data_dir.display()))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg(format!("--initial-cluster-token={token}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| {
        format!(
            "{} did not finish within {RESTORE_TIMEOUT:?}",
            tool.path.display()
        )
    })?
    .with_context(|| format!("running {}", tool.path.display()))?;
    Ok(CtlOutput {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        code: output.status.code(),
    })
}

// ---------------------------------------------------------------------------
// (a) HashKV.
// ---------------------------------------------------------------------------

async fn hashkv_equal_on_every_member(binary: Binary) {
    let cluster = Cluster::start(binary, ClusterConfig::new(MEMBERS))
        .await
        .expect("starting the cluster");
    let client = cluster.client_all().await.expect("client");
    let revision = apply_history(&client).await.expect("history");

    let mut hashes = Vec::new();
    for i in 0..MEMBERS {
        let at_final = hash_kv_when_applied(&cluster.endpoint(i), revision, APPLY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("member {i}: {e:#}"));
        let current = hash_kv_when_applied(&cluster.endpoint(i), 0, APPLY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("member {i}: {e:#}"));
        let earlier = hash_kv_when_applied(&cluster.endpoint(i), revision - 1, APPLY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("member {i}: {e:#}"));
        assert_eq!(
            at_final.1, COMPACT_REVISION,
            "member {i}: HashKV compact revision"
        );
        assert_eq!(
            (current.0, current.1),
            (at_final.0, at_final.1),
            "member {i}: HashKV at 0 (current) and at the current revision {revision}"
        );
        assert_ne!(
            at_final.0,
            earlier.0,
            "member {i}: the hash at {revision} must differ from the hash at {} (a put happened)",
            revision - 1
        );
        hashes.push((at_final.0, earlier.0));
    }
    let distinct: BTreeSet<_> = hashes.iter().collect();
    assert_eq!(
        distinct.len(),
        1,
        "HashKV (at {revision}, at {}) per member differs: {hashes:?}",
        revision - 1
    );

    let output = ctl(&cluster.endpoints())
        .run(&[
            "endpoint",
            "hashkv",
            "--cluster",
            &format!("--rev={revision}"),
            "-w",
            "json",
        ])
        .await
        .expect("etcdctl endpoint hashkv");
    assert!(output.success(), "{output}");
    let json = output.json().expect("json");
    let entries = json.as_array().expect("an array of endpoints");
    assert_eq!(entries.len(), MEMBERS, "{output}");
    let mut endpoints = BTreeSet::new();
    for entry in entries {
        endpoints.insert(entry["Endpoint"].as_str().unwrap_or_default().to_string());
        assert_eq!(
            entry["HashKV"]["hash"].as_u64(),
            Some(u64::from(hashes[0].0)),
            "etcdctl endpoint hashkv --cluster: {output}"
        );
        assert_eq!(
            entry["HashKV"]["compact_revision"].as_i64(),
            Some(COMPACT_REVISION),
            "{output}"
        );
    }
    assert_eq!(
        endpoints,
        cluster.endpoints().into_iter().collect::<BTreeSet<_>>(),
        "--cluster must reach every member's advertised client URL: {output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashkv_equal_on_every_member_candidate() {
    hashkv_equal_on_every_member(Binary::candidate().expect("candidate server binary")).await;
}

/// The same against real etcd 3.5: the assertions hold for the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashkv_equal_on_every_member_etcd() {
    hashkv_equal_on_every_member(Binary::etcd35().expect("reference etcd 3.5")).await;
}

/// HashKV outcome: hash, compact revision and header revision, or the gRPC error.
async fn hash_kv_outcome(client: &Client, revision: i64) -> String {
    match client.clone().hash_kv(revision).await {
        Ok(response) => format!(
            "hash={} compact_revision={} header_revision={:?}",
            response.hash(),
            response.compact_version(),
            response.header().map(|header| header.revision())
        ),
        Err(error) => describe_error(&error),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashkv_matches_etcd() {
    let mut diff = Differential::start()
        .await
        .expect("starting etcd and the candidate");
    // (what, oracle outcome, candidate outcome), all compared at the end so
    // a report shows every difference.
    let mut rows: Vec<(String, String, String)> = Vec::new();
    rows.push((
        "empty store, revision 0 (current)".to_string(),
        hash_kv_outcome(&diff.oracle.client, 0).await,
        hash_kv_outcome(&diff.candidate.client, 0).await,
    ));
    for op in history() {
        if matches!(op, Op::Compact(_)) {
            for revision in [0, 20] {
                rows.push((
                    format!("before the compaction, revision {revision}"),
                    hash_kv_outcome(&diff.oracle.client, revision).await,
                    hash_kv_outcome(&diff.candidate.client, revision).await,
                ));
            }
        }
        diff.rpc(&format!("{op:?}"), |client| apply(client, op.clone()))
            .await
            .unwrap_or_else(|e| panic!("{op:?} fails on etcd: {e}"));
    }
    // 0 is "current"; 28 is the compaction revision itself; 27 and 1 are
    // compacted; 37 and 100 are in the future.
    for revision in [
        0,
        FINAL_REVISION,
        35,
        33,
        30,
        29,
        COMPACT_REVISION,
        27,
        1,
        37,
        100,
    ] {
        rows.push((
            format!("after the history, revision {revision}"),
            hash_kv_outcome(&diff.oracle.client, revision).await,
            hash_kv_outcome(&diff.candidate.client, revision).await,
        ));
    }
    let table: Vec<String> = rows
        .iter()
        .map(|(what, expected, actual)| {
            let mark = if expected == actual {
                "same"
            } else {
                "DIFFERENT"
            };
            format!("{mark}: {what}:\n    oracle:    {expected}\n    candidate: {actual}")
        })
        .collect();
    assert!(
        rows.iter().all(|(_, expected, actual)| expected == actual),
        "HashKV after the same history differs between etcd and the candidate:\n{}",
        table.join("\n")
    );
    let compared: Vec<&String> = rows.iter().map(|(_, expected, _)| expected).collect();
    assert!(
        compared
            .iter()
            .any(|line| line.contains("compact_revision=28")),
        "the history must have compacted: {compared:#?}"
    );
    assert!(
        compared
            .iter()
            .any(|line| line.contains("required revision has been compacted")),
        "{compared:#?}"
    );
    assert!(
        compared.iter().any(|line| line.contains("future revision")),
        "{compared:#?}"
    );
    let output = diff.ctl(&["endpoint", "hashkv"]).await;
    assert!(output.success(), "{output}");
    let output = diff.ctl(&["endpoint", "hashkv", "--rev=31"]).await;
    assert!(output.success(), "{output}");
}

// ---------------------------------------------------------------------------
// (b) Snapshot save and restore.
// ---------------------------------------------------------------------------

async fn snapshot_save_and_restore(binary: Binary) {
    let tool = restore_tool(&binary);
    let old = Cluster::start(binary.clone(), ClusterConfig::new(MEMBERS))
        .await
        .expect("starting the cluster");
    let old_client = old.client_all().await.expect("client");
    let revision = apply_history(&old_client).await.expect("history");
    let backup_dir = tempfile::Builder::new()
        .prefix("etcd-it-backup-")
        .tempdir()
        .expect("backup directory");
    let backup = backup_dir.path().join("backup.db");
    let saved = ctl(&[old.endpoint(1)])
        .run(&["snapshot", "save", &backup.display().to_string()])
        .await
        .expect("etcdctl snapshot save");
    assert!(saved.success(), "etcdctl snapshot save failed:\n{saved}");
    assert!(
        saved
            .stdout
            .contains(&format!("Snapshot saved at {}", backup.display())),
        "{saved}"
    );
    let size = std::fs::metadata(&backup).expect("backup file").len();
    assert!(size > BIG_VALUE_BYTES as u64, "backup of {size} bytes");

    let (old_kvs, old_revision) = all_keys(&old.endpoint(0), revision)
        .await
        .expect("old cluster's keys");
    assert_eq!(old_revision, revision);
    assert!(old_kvs.iter().any(|kv| kv.0 == "c/big"), "{old_kvs:?}");
    let old_hash = hash_kv_when_applied(&old.endpoint(0), revision, APPLY_TIMEOUT)
        .await
        .expect("old HashKV");

    // A new cluster: start it (the harness picks addresses, names and the
    // token), stop it, replace every data directory by a restore of the
    // backup, start it again with the same flags.
    let new = Cluster::start(binary.clone(), ClusterConfig::new(MEMBERS))
        .await
        .expect("starting the new cluster");
    let initial_cluster = new.flag(0, "initial-cluster").expect("--initial-cluster");
    let token = new
        .flag(0, "initial-cluster-token")
        .expect("--initial-cluster-token");
    new.kill_all().expect("stopping the new cluster");
    for i in 0..MEMBERS {
        let data_dir = new.dir().join(format!("m{i}.etcd"));
        std::fs::remove_dir_all(&data_dir)
            .unwrap_or_else(|e| panic!("removing {}: {e}", data_dir.display()));
        let peer = new.peer_url(i);
        let output = restore(
            &tool,
            &backup,
            &format!("m{i}"),
            &data_dir,
            &initial_cluster,
            &token,
            &peer,
        )
        .await
        .expect("running the restore tool");
        assert!(
            output.success(),
            "{} snapshot restore for m{i} failed:\n{output}",
            tool.path.display()
        );
        assert!(
            data_dir.is_dir(),
            "restore created no {}",
            data_dir.display()
        );
    }
    for i in 0..MEMBERS {
        new.restart(i).expect("starting a restored member");
    }
    new.wait_healthy()
        .await
        .expect("the restored cluster becomes healthy");

    let new_client = new.client_all().await.expect("client");
    let new_revision = linearizable_revision(&new_client).await.expect("barrier");
    assert_eq!(
        new_revision, revision,
        "the restored cluster must be at the backup's revision"
    );
    for i in 0..MEMBERS {
        let (kvs, _) = all_keys(&new.endpoint(i), revision)
            .await
            .unwrap_or_else(|e| panic!("restored member {i}: {e:#}"));
        assert!(
            kvs == old_kvs,
            "restored member {i} serves different data:\n old: {:?}\n new: {:?}",
            summary(&old_kvs),
            summary(&kvs)
        );
        let hash = hash_kv_when_applied(&new.endpoint(i), revision, APPLY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("restored member {i}: {e:#}"));
        assert_eq!(
            (hash.0, hash.1),
            (old_hash.0, old_hash.1),
            "restored member {i}: HashKV (hash, compact revision) at {revision} differs from the old cluster's"
        );
    }

    // New writes work, on every member.
    let put = new_client
        .clone()
        .put("after/restore", "yes", None)
        .await
        .expect("a write to the restored cluster");
    let written = put.header().expect("header").revision();
    assert_eq!(written, revision + 1, "the first write after the restore");
    for i in 0..MEMBERS {
        let (kvs, _) = all_keys(&new.endpoint(i), written)
            .await
            .unwrap_or_else(|e| panic!("restored member {i}: {e:#}"));
        assert!(
            kvs.iter()
                .any(|kv| kv.0 == "after/restore" && kv.1 == b"yes" && kv.3 == written),
            "restored member {i} lacks the new write: {:?}",
            summary(&kvs)
        );
    }

    // A corrupted and a truncated backup are refused.
    let bytes = std::fs::read(&backup).expect("reading the backup");
    let mut corrupted = bytes.clone();
    corrupted[bytes.len() / CORRUPT_AT_FRACTION] ^= 0xff;
    let truncated = bytes[..bytes.len() - TRUNCATED_BYTES].to_vec();
    for (what, content) in [("corrupted", corrupted), ("truncated", truncated)] {
        let file = backup_dir.path().join(format!("{what}.db"));
        std::fs::write(&file, content).expect("writing the damaged backup");
        let data_dir = backup_dir.path().join(format!("{what}.etcd"));
        let output = restore(
            &tool,
            &file,
            "m0",
            &data_dir,
            &initial_cluster,
            &token,
            &new.peer_url(0),
        )
        .await
        .expect("running the restore tool");
        assert!(
            !output.success(),
            "{} snapshot restore must refuse a {what} backup:\n{output}",
            tool.path.display()
        );
        assert!(
            !output.stderr.trim().is_empty() || !output.stdout.trim().is_empty(),
            "the refusal of a {what} backup must say why:\n{output}"
        );
    }
}

/// Keys with value lengths and revisions, for a readable report.
fn summary(kvs: &[Kv]) -> Vec<String> {
    kvs.iter()
        .map(|(key, value, create, modified, version, lease)| {
            format!(
                "{key} ({} bytes) create={create} mod={modified} version={version} lease={lease}",
                value.len()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_save_and_restore_candidate() {
    snapshot_save_and_restore(Binary::candidate().expect("candidate server binary")).await;
}

/// The same against real etcd 3.5 and etcdutl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_save_and_restore_etcd() {
    snapshot_save_and_restore(Binary::etcd35().expect("reference etcd 3.5")).await;
}

// ---------------------------------------------------------------------------
// (c) Defragment, alarms, endpoint status.
// ---------------------------------------------------------------------------

async fn defrag_alarms_and_status(binary: Binary) {
    let cluster = Cluster::start(binary, ClusterConfig::new(MEMBERS))
        .await
        .expect("starting the cluster");
    let client = cluster.client_all().await.expect("client");
    let revision = apply_history(&client).await.expect("history");
    let endpoints = cluster.endpoints();
    let etcdctl = ctl(&endpoints);

    let output = etcdctl.run(&["defrag"]).await.expect("etcdctl defrag");
    assert!(output.success(), "etcdctl defrag failed:\n{output}");
    for endpoint in &endpoints {
        assert!(
            output
                .stdout
                .contains(&format!("Finished defragmenting etcd member[{endpoint}]")),
            "defrag of {endpoint} not reported:\n{output}"
        );
    }
    for i in 0..MEMBERS {
        let (kvs, _) = all_keys(&cluster.endpoint(i), revision)
            .await
            .unwrap_or_else(|e| panic!("member {i} after defrag: {e:#}"));
        assert!(kvs.iter().any(|kv| kv.0 == "c/big"), "member {i}: {kvs:?}");
    }

    let output = etcdctl
        .run(&["alarm", "list"])
        .await
        .expect("etcdctl alarm list");
    assert!(output.success(), "{output}");
    assert_eq!(output.stdout.trim(), "", "no alarm is raised:\n{output}");

    let output = etcdctl
        .run(&["endpoint", "status", "-w", "json"])
        .await
        .expect("etcdctl endpoint status");
    assert!(output.success(), "{output}");
    let json = output.json().expect("json");
    let statuses = json.as_array().expect("an array of endpoints");
    assert_eq!(statuses.len(), MEMBERS, "{output}");
    let mut ids = BTreeSet::new();
    let mut leaders = BTreeSet::new();
    // etcd 3.5.1 or the store presenting etcd 3.6.
    let version_3_5 = Regex::new(r"^3\.[56]\.\d+$").expect("valid pattern");
    for entry in statuses {
        let status = &entry["Status"];
        let version = status["version"].as_str().unwrap_or_default();
        assert!(
            version_3_5.is_match(version),
            "version {version:?} is not 3.5.x or 3.6.x: {output}"
        );
        ids.insert(status["header"]["member_id"].as_u64().unwrap_or(0));
        leaders.insert(status["leader"].as_u64().unwrap_or(0));
        assert!(
            status["raftIndex"].as_u64().unwrap_or(0) >= FINAL_REVISION as u64,
            "raft index must count at least the history's entries: {output}"
        );
        assert!(status["raftTerm"].as_u64().unwrap_or(0) > 0, "{output}");
        assert!(status["dbSize"].as_i64().unwrap_or(0) > 0, "{output}");
        assert_eq!(
            status["header"]["revision"].as_i64(),
            Some(revision),
            "{output}"
        );
    }
    assert_eq!(ids.len(), MEMBERS, "distinct member ids: {output}");
    assert_eq!(
        leaders.len(),
        1,
        "every member names the same leader: {output}"
    );
    let leader = *leaders.iter().next().expect("one leader");
    assert!(
        ids.contains(&leader),
        "the leader {leader:x} is a member: {output}"
    );

    let simple = etcdctl
        .run(&["endpoint", "status"])
        .await
        .expect("etcdctl endpoint status");
    assert!(simple.success(), "{simple}");
    let line = Regex::new(
        r"^http://\S+:2379, [0-9a-f]+, 3\.[56]\.\d+, [^,]+, (true|false), false, \d+, (\d+), \d+, $",
    )
    .expect("valid pattern");
    let mut leader_lines = 0;
    for text in simple.stdout.lines() {
        let captures = line
            .captures(text)
            .unwrap_or_else(|| panic!("unexpected endpoint status line {text:?}:\n{simple}"));
        leader_lines += usize::from(&captures[1] == "true");
        assert!(captures[2].parse::<u64>().unwrap_or(0) > 0, "{simple}");
    }
    assert_eq!(simple.stdout.lines().count(), MEMBERS, "{simple}");
    assert_eq!(leader_lines, 1, "exactly one leader:\n{simple}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_alarms_and_status_candidate() {
    defrag_alarms_and_status(Binary::candidate().expect("candidate server binary")).await;
}

/// The same against real etcd 3.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_alarms_and_status_etcd() {
    defrag_alarms_and_status(Binary::etcd35().expect("reference etcd 3.5")).await;
}

/// etcdctl defrag, alarm list / disarm and endpoint status compared with
/// etcd on single members after the same history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_commands_match_etcd() {
    let mut diff = Differential::start()
        .await
        .expect("starting etcd and the candidate");
    for op in history() {
        diff.rpc(&format!("{op:?}"), |client| apply(client, op.clone()))
            .await
            .unwrap_or_else(|e| panic!("{op:?} fails on etcd: {e}"));
    }
    let output = diff.ctl(&["defrag"]).await;
    assert!(output.stdout.contains("Finished defragmenting"), "{output}");
    let output = diff.ctl(&["alarm", "list"]).await;
    assert!(output.success() && output.stdout.is_empty(), "{output}");
    let output = diff.ctl(&["alarm", "disarm"]).await;
    assert!(output.success(), "{output}");
    let output = diff.ctl(&["endpoint", "status"]).await;
    assert!(output.stdout.contains(", 3.<5|6>.<PATCH>, "), "{output}");
    diff.ctl(&["endpoint", "status", "-w", "json"]).await;
    diff.ctl(&["endpoint", "health"]).await;
    let output = diff.ctl(&["get", "", "--prefix", "--keys-only"]).await;
    assert!(output.stdout.contains("c/big"), "{output}");
}

/// Raises or clears `alarm` for the member behind `client`.
async fn set_alarm(
    client: Client,
    action: etcd_client::AlarmAction,
    alarm: etcd_client::AlarmType,
) -> Result<etcd_client::AlarmResponse, etcd_client::Error> {
    let mut c = client.clone();
    let member = c.status().await?.header().map_or(0, |h| h.member_id());
    let mut options = etcd_client::AlarmOptions::new();
    options.with_member(member);
    c.alarm(action, alarm, Some(options)).await.map(|mut r| {
        // Compared without the member id (each side has its own).
        r.take_header();
        r
    })
}

/// With the CORRUPT alarm raised, etcd refuses every write, compaction
/// and lease grant or revoke (`etcdserver: corrupt cluster`, DataLoss) and
/// still serves reads; once disarmed, writes flow again. Compared step by
/// step with etcd 3.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_alarm_refuses_writes_as_etcd() {
    use etcd_client::{AlarmAction, AlarmType};
    let mut diff = Differential::start()
        .await
        .expect("starting etcd and the candidate");
    diff.rpc("put before", |mut c| async move {
        c.put("k", "v0", None).await.map(|_| ())
    })
    .await
    .expect("put before the alarm");
    let lease = diff
        .rpc("grant before", |mut c| async move {
            c.lease_grant(60, Some(etcd_client::LeaseGrantOptions::new().with_id(7)))
                .await
                .map(|r| r.id())
        })
        .await
        .expect("grant before the alarm");
    diff.rpc("raise CORRUPT", |c| {
        set_alarm(c, AlarmAction::Activate, AlarmType::Corrupt)
    })
    .await
    .expect("raise");
    for side in [&diff.oracle, &diff.candidate] {
        // Member ids differ between the two, so each is checked alone.
        let output = side.ctl35.run(&["alarm", "list"]).await.expect("etcdctl");
        assert!(output.stdout.contains("alarm:CORRUPT"), "{output}");
    }
    let refused = [
        diff.rpc("put", |mut c| async move {
            c.put("k", "v1", None).await.map(|_| ())
        })
        .await,
        diff.rpc("delete", |mut c| async move {
            c.delete("k", None).await.map(|_| ())
        })
        .await,
        diff.rpc("txn", |mut c| async move {
            c.txn(Txn::new().and_then([TxnOp::put("t", "1", None)]))
                .await
                .map(|_| ())
        })
        .await,
        diff.rpc("compact", |mut c| async move {
            c.compact(1, None).await.map(|_| ())
        })
        .await,
        diff.rpc("grant", |mut c| async move {
            c.lease_grant(60, None).await.map(|_| ())
        })
        .await,
        diff.rpc("revoke", move |mut c| async move {
            c.lease_revoke(lease).await.map(|_| ())
        })
        .await,
    ];
    for r in refused {
        let e = r.expect_err("refused under CORRUPT");
        assert_eq!(
            describe_error(&e),
            "gRPC error code=DataLoss message=\"etcdserver: corrupt cluster\""
        );
    }
    // Reads still answer: linearizable, serializable, a read-only txn.
    let got = diff.get("get", "k").await.expect("get under CORRUPT");
    assert_eq!(got.kvs()[0].value(), b"v0");
    diff.rpc("serializable get", |mut c| async move {
        c.get("k", Some(GetOptions::new().with_serializable()))
            .await
    })
    .await
    .expect("serializable get");
    diff.rpc("read-only txn", |mut c| async move {
        c.txn(Txn::new().and_then([TxnOp::get("k", None)])).await
    })
    .await
    .expect("read-only txn");
    let output = diff.ctl(&["put", "k", "v2"]).await;
    assert!(!output.success(), "{output}");
    diff.rpc("disarm CORRUPT", |c| {
        set_alarm(c, AlarmAction::Deactivate, AlarmType::Corrupt)
    })
    .await
    .expect("disarm");
    diff.rpc("put after", |mut c| async move {
        c.put("k", "v3", None).await.map(|_| ())
    })
    .await
    .expect("put after the alarm is disarmed");
    let got = diff.get("get after", "k").await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"v3");
}

/// etcdctl 3.4 (Debian's `etcd-client`) dials one endpoint for `endpoint
/// status`, `endpoint hashkv` and `defrag` and sends the whole URL as the
/// HTTP/2 `:authority` (`http://127.0.0.1:2379`), which etcd's grpc-go
/// ignores and h2 refuses (store::server::transport::authority_repair repairs it). Each
/// command must succeed on `binary` and name the endpoint, and the connection
/// must keep serving later requests.
async fn etcdctl34_per_endpoint_commands(binary: Binary) {
    let cluster = Cluster::start(binary, ClusterConfig::new(1))
        .await
        .expect("cluster");
    let endpoint = cluster.endpoint(0);
    let ctl34 = Etcdctl::new(
        Binary::etcdctl34().expect("etcdctl 3.4"),
        vec![endpoint.clone()],
    );
    for args in [
        &["put", "k", "v"][..],
        &["endpoint", "status"],
        &["endpoint", "hashkv"],
        &["defrag"],
        &["endpoint", "status", "-w", "json"],
    ] {
        let out = ctl34.run(args).await.expect("etcdctl 3.4 runs");
        assert!(out.success(), "etcdctl 3.4 {args:?} failed:\n{out}");
        if args[0] != "put" {
            assert!(
                out.stdout.contains(&endpoint),
                "etcdctl 3.4 {args:?} does not name {endpoint}:\n{out}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl34_per_endpoint_commands_candidate() {
    etcdctl34_per_endpoint_commands(Binary::candidate().expect("candidate server binary")).await;
}

/// The same against real etcd 3.5: the assertions hold for the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl34_per_endpoint_commands_etcd() {
    etcdctl34_per_endpoint_commands(Binary::etcd35().expect("reference etcd 3.5")).await;
}

/// Values written by the reported-size test: 8 MiB in all.
const SIZE_VALUES: usize = 8;
/// Value size of the reported-size test (under etcd's 1.5 MiB request limit).
const SIZE_VALUE_BYTES: usize = 1024 * 1024;
/// How long the files may take to show the writes (etcd commits its
/// bbolt file every 100 ms).
const SIZE_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How far Status `dbSize` may be from the files on disk: what the engine
/// writes out between the listing and the Status (its WAL buffer, a flush).
const SIZE_SLACK_BYTES: u64 = 256 * 1024;

/// Bytes of the database files in `data_dir`: etcd's bbolt file, or our
/// engine's table and write-ahead log files.
fn db_files_bytes(binary: &Binary, data_dir: &Path) -> Result<u64> {
    if binary.file_name() == "etcd" {
        return Ok(std::fs::metadata(data_dir.join("member/snap/db"))?.len());
    }
    let mut total = 0;
    for entry in std::fs::read_dir(data_dir.join("member/db"))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".sst") || name.ends_with(".log") {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// Status `dbSize` is what the database files hold (etcd: its bbolt file;
/// the store: its engine's table and WAL files, which it used to leave out,
/// reporting 52 MB with 165 MiB on disk), after 8 MiB of writes and after
/// a defragment.
async fn reported_db_size_is_on_disk(binary: Binary) {
    let cluster = Cluster::start(binary.clone(), ClusterConfig::new(1))
        .await
        .expect("one member");
    let mut client = cluster.client(0).await.expect("client");
    for n in 0..SIZE_VALUES {
        let value = vec![b'a' + n as u8; SIZE_VALUE_BYTES];
        client
            .put(format!("size/{n}"), value, None)
            .await
            .expect("put");
    }
    let written = (SIZE_VALUES * SIZE_VALUE_BYTES) as u64;
    for step in ["after the writes", "after a defragment"] {
        if step == "after a defragment" {
            client.defragment().await.expect("defragment");
        }
        let data_dir = cluster.data_dir(0);
        // etcd commits its bbolt file every 100 ms: the writes reach the
        // file, and its size, shortly after they are answered.
        retry_until(step, SIZE_SETTLE_TIMEOUT, || {
            let (binary, data_dir, mut client) = (binary.clone(), data_dir.clone(), client.clone());
            async move {
                let on_disk = db_files_bytes(&binary, &data_dir)?;
                let reported = client.status().await?.db_size() as u64;
                ensure!(
                    reported.abs_diff(on_disk) <= SIZE_SLACK_BYTES,
                    "{step}: dbSize {reported} bytes, the files hold {on_disk}"
                );
                ensure!(
                    step != "after the writes" || on_disk >= written / 2,
                    "{step}: the files hold {on_disk} bytes of the {written} written"
                );
                anyhow::Ok(())
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
}

#[tokio::test]
async fn reported_db_size_is_on_disk_candidate() {
    reported_db_size_is_on_disk(Binary::candidate().expect("candidate server binary")).await;
}

/// The same against real etcd 3.5.
#[tokio::test]
async fn reported_db_size_is_on_disk_etcd() {
    reported_db_size_is_on_disk(Binary::etcd35().expect("reference etcd 3.5")).await;
}

/// Answers whose shape etcd fixes beyond their values: Defragment and every
/// Snapshot chunk carry no response header, and LeaseTimeToLive reports
/// the whole seconds left (a lease granted 600 s reports 599 within its
/// first second: etcd truncates).
async fn header_less_answers_and_whole_seconds_left(binary: Binary) {
    let cluster = Cluster::start(binary, ClusterConfig::new(1))
        .await
        .expect("one member");
    let mut client = cluster.client(0).await.expect("client");
    client.put("k", "v", None).await.expect("put");
    let defragmented = client.defragment().await.expect("defragment");
    assert!(
        defragmented.header().is_none(),
        "Defragment answered with a header"
    );
    let mut chunks = client.snapshot().await.expect("snapshot");
    let mut count = 0;
    while let Some(chunk) = chunks.message().await.expect("snapshot chunk") {
        assert!(
            chunk.header().is_none(),
            "snapshot chunk {count} has a header"
        );
        count += 1;
    }
    assert!(
        count >= 2,
        "a snapshot is its data then its checksum: {count} chunks"
    );

    let granted = client.lease_grant(600, None).await.expect("grant");
    let asked = std::time::Instant::now();
    let ttl = client
        .lease_time_to_live(granted.id(), None)
        .await
        .expect("time to live")
        .ttl();
    if asked.elapsed() < Duration::from_millis(500) {
        assert_eq!(ttl, 599, "whole seconds left of 600 just granted");
    } else {
        assert!(ttl < 600, "whole seconds left of 600 granted: {ttl}");
    }
}

#[tokio::test]
async fn header_less_answers_and_whole_seconds_left_candidate() {
    header_less_answers_and_whole_seconds_left(
        Binary::candidate().expect("candidate server binary"),
    )
    .await;
}

/// The same against real etcd 3.5.
#[tokio::test]
async fn header_less_answers_and_whole_seconds_left_etcd() {
    header_less_answers_and_whole_seconds_left(Binary::etcd35().expect("reference etcd 3.5")).await;
}
