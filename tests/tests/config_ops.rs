//! Operator-facing configuration of the candidate: etcd's `--config-file`
//! (file wins over flags and `ETCD_*` variables; etcd's errors for a bad
//! file), zap-style logging to files, and `--force-new-cluster` disaster
//! recovery of a three-member cluster from one surviving member.
//!
//! Run: `cargo test --release -p integration-tests --test integration config_ops:: -- --test-threads=2`

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use integration_tests::cluster::{member_name, MemberFlags};
use integration_tests::etcdctl::Etcdctl;
use integration_tests::net::{allocate_ip, client_url, peer_url};
use integration_tests::process::Process;
use integration_tests::wait::retry_until;
use integration_tests::{Binary, Cluster, ClusterConfig};

/// Deadline for a started or restarted member to serve.
const SERVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Keys written before the forced restart.
const KEYS_BEFORE: usize = 25;

fn ctl(endpoints: Vec<String>) -> Result<Etcdctl> {
    Ok(Etcdctl::new(Binary::etcdctl35()?, endpoints))
}

/// `etcdctl <args>` that must succeed; its stdout.
async fn ok(ctl: &Etcdctl, args: &[&str]) -> Result<String> {
    let out = ctl.run(args).await?;
    ensure!(out.success(), "etcdctl {args:?} failed:\n{out}");
    Ok(out.stdout)
}

/// The members `member list -w json` reports, as (name, id) pairs.
async fn members(ctl: &Etcdctl) -> Result<Vec<(String, u64)>> {
    let out = ctl.run(&["member", "list", "-w", "json"]).await?;
    ensure!(out.success(), "member list failed:\n{out}");
    let json = out.json()?;
    let list = json["members"].as_array().context("members array")?;
    Ok(list
        .iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap_or_default().to_string();
            (name, m["ID"].as_u64().unwrap_or_default())
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn config_file_wins_over_flags_and_env_and_logs_json_to_files() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ip = allocate_ip()?;
    let log_file = dir.path().join("member.jsonl");
    let yaml = format!(
        "name: from-file\n\
         data-dir: {data}\n\
         listen-client-urls: {client}\n\
         advertise-client-urls: {client}\n\
         listen-peer-urls: {peer}\n\
         initial-advertise-peer-urls: {peer}\n\
         initial-cluster: from-file={peer}\n\
         initial-cluster-token: config-file-test\n\
         heartbeat-interval: 100\n\
         election-timeout: 1000\n\
         enable-v2: false\n\
         client-transport-security:\n  client-cert-auth: false\n  auto-tls: false\n\
         log-outputs: [stderr, {log}]\n",
        data = dir.path().join("m.etcd").display(),
        client = client_url(ip),
        peer = peer_url(ip),
        log = log_file.display(),
    );
    let file = dir.path().join("etcd.yaml");
    std::fs::write(&file, yaml)?;
    let mut command = Command::new(Binary::candidate()?.path);
    command
        .arg(format!("--config-file={}", file.display()))
        .arg("--name=from-flag")
        .env("ETCD_NAME", "from-env")
        .env("ETCD_HEARTBEAT_INTERVAL", "not-a-number");
    let _member = Process::spawn("from-file", command, &dir.path().join("m.log"))?;
    let ctl = ctl(vec![client_url(ip)])?;
    let list = retry_until("the member to serve", SERVE_TIMEOUT, || members(&ctl)).await?;
    ensure!(
        list.len() == 1 && list[0].0 == "from-file",
        "members: {list:?}"
    );

    let text = std::fs::read_to_string(&log_file)?;
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or(""))
        .with_context(|| format!("log file is not JSON lines:\n{text}"))?;
    for field in ["level", "ts", "caller", "msg"] {
        ensure!(first.get(field).is_some(), "no {field:?} in {first}");
    }
    ensure!(
        text.contains("loaded server configuration, other configuration command line flags and environment variables will be ignored if provided"),
        "etcd's config-file notice missing:\n{text}"
    );
    Ok(())
}

/// Runs `binary --config-file <file>`; its exit code and output.
fn run_with_file(binary: &Path, file: &Path) -> Result<(Option<i32>, String)> {
    let out = Command::new(binary)
        .arg(format!("--config-file={}", file.display()))
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.code(), text))
}

#[test]
fn bad_config_files_fail_like_etcd() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cases = [
        ("type.yaml", "heartbeat-interval: abc\n", "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal string into Go struct field configYAML.heartbeat-interval of type uint"),
        ("syntax.yaml", "name: [\n", "error converting YAML to JSON: yaml: line "),
    ];
    let etcd = Binary::etcd35()?.path;
    let store = Binary::candidate()?.path;
    for (name, content, expected) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, content)?;
        for binary in [&etcd, &store] {
            let (code, text) = run_with_file(binary, &file)?;
            ensure!(code == Some(1), "{binary:?} {name}: exit {code:?}\n{text}");
            ensure!(
                text.contains(expected),
                "{binary:?} {name}: no {expected:?} in\n{text}"
            );
        }
    }
    let missing = dir.path().join("missing.yaml");
    for binary in [&etcd, &store] {
        let (code, text) = run_with_file(binary, &missing)?;
        let expected = format!("open {}: no such file or directory", missing.display());
        ensure!(
            code == Some(1) && text.contains(&expected),
            "{binary:?}: {code:?}\n{text}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn force_new_cluster_restarts_one_member_with_the_data() -> Result<()> {
    let config = ClusterConfig::new(3);
    let binary = Binary::candidate()?;
    let cluster = Cluster::start(binary.clone(), config.clone()).await?;
    let all = ctl(cluster.endpoints())?;
    for i in 0..KEYS_BEFORE {
        ok(&all, &["put", &format!("k{i:02}"), &format!("v{i}")]).await?;
    }
    let survivor_id = cluster.member_id(0).await?;
    cluster.kill_all()?;

    let flag = |f: &str| cluster.flag(0, f).with_context(|| format!("--{f} of m0"));
    let flags = MemberFlags::new(
        &member_name(0),
        cluster.ip(0),
        cluster.dir(),
        &flag("initial-cluster")?,
        &flag("initial-cluster-token")?,
    );
    let mut args = flags.args(&config);
    args.push("--force-new-cluster".into());
    let log = cluster.dir().join("m0-forced.log");
    let forced = Process::start(&binary, "m0-forced", &log, &args)?;
    let one = ctl(vec![cluster.endpoint(0)])?;
    retry_until("the forced member to accept writes", SERVE_TIMEOUT, || {
        ok(&one, &["put", "after", "forced"])
    })
    .await
    .with_context(|| forced.log_tail())?;
    check_alone(&one, survivor_id).await?;

    // The one-member configuration is durable: a plain restart keeps it.
    forced.kill()?;
    args.pop();
    let _plain = Process::start(
        &binary,
        "m0-plain",
        &cluster.dir().join("m0-plain.log"),
        &args,
    )?;
    retry_until("the member to serve again", SERVE_TIMEOUT, || {
        ok(&one, &["put", "after", "restart"])
    })
    .await?;
    check_alone(&one, survivor_id).await
}

/// The member serves every key written before, is the only member and
/// leads.
async fn check_alone(one: &Etcdctl, id: u64) -> Result<()> {
    let keys = ok(one, &["get", "k", "--prefix", "--keys-only"]).await?;
    let count = keys.lines().filter(|l| l.starts_with('k')).count();
    ensure!(
        count == KEYS_BEFORE,
        "{count} of {KEYS_BEFORE} keys:\n{keys}"
    );
    let list = members(one).await?;
    ensure!(list.len() == 1 && list[0].1 == id, "members: {list:?}");
    let status = ok(one, &["endpoint", "status", "-w", "json"]).await?;
    let status: serde_json::Value = serde_json::from_str(&status)?;
    let leader = status[0]["Status"]["leader"].as_u64();
    ensure!(
        leader == Some(id),
        "leader {leader:?}, member {id}: {status}"
    );
    Ok(())
}

/// `scripts/stack.sh` with the addresses, state directory and binaries of
/// this test; `down` runs when dropped (also during a panic).
struct Stack {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
}

impl Stack {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ips = (0..3)
            .map(|_| allocate_ip().map(|ip| ip.to_string()))
            .collect::<Result<Vec<_>>>()?;
        let release = integration_tests::binary::release_dir()?;
        let env = vec![
            ("STACK_MEMBER_IPS", ips.join(" ")),
            ("STACK_GATEWAY_IP", allocate_ip()?.to_string()),
            ("STACK_DIR", dir.path().join("stack").display().to_string()),
            ("STORE_BIN", Binary::candidate()?.path.display().to_string()),
            ("GATEWAY_BIN", release.join("gateway").display().to_string()),
            ("ETCDCTL", Binary::etcdctl35()?.path.display().to_string()),
        ];
        Ok(Self { dir, env })
    }

    fn run(&self, action: &str) -> Result<std::process::Output> {
        let script = integration_tests::binary::manifest_dir().join("../scripts/stack.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg(action)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()?;
        Ok(out)
    }

    fn state(&self) -> std::path::PathBuf {
        self.dir.path().join("stack")
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.run("down");
    }
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// `stack.sh up`, use, `status`, `down`; with `apiservers`, through
/// KUBE_APISERVER (the stand-in, `tests/fixtures/stand-in-kube-apiserver`)
/// as well.
async fn stack_round_trip(apiservers: bool) -> Result<()> {
    let mut stack = Stack::new()?;
    if apiservers {
        let stand_in =
            integration_tests::binary::manifest_dir().join("fixtures/stand-in-kube-apiserver");
        stack
            .env
            .push(("KUBE_APISERVER", stand_in.display().to_string()));
    }
    let up = stack.run("up")?;
    ensure!(up.status.success(), "stack.sh up:\n{}", text(&up));
    let gateway = format!("http://{}:2379", stack.env[1].1);
    ensure!(
        text(&up).contains(&gateway),
        "endpoints not printed:\n{}",
        text(&up)
    );
    let through = ctl(vec![gateway])?;
    ok(&through, &["put", "stack-key", "stack-value"]).await?;
    let got = ok(&through, &["get", "stack-key", "--print-value-only"]).await?;
    ensure!(
        got.trim() == "stack-value",
        "get through the gateway: {got:?}"
    );
    let processes = if apiservers { 8 } else { 4 };
    if apiservers {
        let endpoint = format!("https://{}:6443", stack.env[1].1);
        ensure!(
            text(&up).contains(&endpoint),
            "control-plane endpoint not printed:\n{}",
            text(&up)
        );
        let ready = Command::new("curl")
            .args(["-sk", "--max-time", "5"])
            .arg(format!("{endpoint}/readyz"))
            .output()?;
        ensure!(
            text(&ready) == "ok",
            "/readyz through the gateway: {ready:?}"
        );
        let stored = ok(
            &through,
            &[
                "get",
                "/registry/stand-in-apiserver/",
                "--prefix",
                "--keys-only",
            ],
        )
        .await?;
        ensure!(
            stored.lines().filter(|l| !l.is_empty()).count() == 3,
            "each apiserver wrote through its member:\n{stored}"
        );
    }

    let pids: Vec<u32> = std::fs::read_to_string(stack.state().join("pids"))?
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    ensure!(pids.len() == processes, "recorded pids: {pids:?}");
    let status = text(&stack.run("status")?);
    ensure!(
        status.matches(" running ").count() == processes,
        "status:\n{status}"
    );

    let down = stack.run("down")?;
    ensure!(down.status.success(), "stack.sh down:\n{}", text(&down));
    for pid in pids {
        ensure!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} still runs"
        );
    }
    ensure!(!stack.state().exists(), "state directory left behind");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn stack_script_serves_through_the_gateway_and_stops_its_processes() -> Result<()> {
    stack_round_trip(false).await
}

/// The stacked topology with apiservers: one per member, and the gateway in
/// apiserver mode as the control-plane endpoint.
#[tokio::test(flavor = "multi_thread")]
async fn stack_script_runs_apiservers_behind_a_gateway_in_apiserver_mode() -> Result<()> {
    stack_round_trip(true).await
}

/// The store's RocksDB database in a data directory, and its table of
/// revisions (`store::data_dir::ENGINE_DIR`, `store::engine::Table::Kv`).
/// The test opens it with the `rocksdb` crate, not through the store's
/// engine, so this test binary does not link (and wait for) the store.
const ENGINE_DIR: &str = "member/db";
const KV_TABLE: &str = "kv";

/// Length of a revision key in the `kv` table: 8-byte main revision, `_`,
/// 8-byte sub revision (etcd's layout).
const REVISION_KEY_BYTES: usize = 17;

/// Adds, in the stopped member's engine, a record no log entry wrote: the
/// stored record holding `from`, with `to` in its place (same length, so
/// it stays well-formed), under the next sub-revision of the same
/// revision. Replaying log entries at start-up does not remove it, so the
/// member's HashKV differs from its peers': silent corruption of one
/// replica.
fn corrupt_value(data_dir: &Path, from: &[u8], to: &[u8]) -> Result<()> {
    let path = data_dir.join(ENGINE_DIR);
    let options = rocksdb::Options::default();
    // Every column family has to be named to open the database for writing.
    let tables = rocksdb::DB::list_cf(&options, &path)?;
    let db = rocksdb::DB::open_cf(&options, &path, &tables)?;
    let kv = db.cf_handle(KV_TABLE).context("the engine's kv table")?;
    let mut found = Vec::new();
    for record in db.iterator_cf(kv, rocksdb::IteratorMode::Start) {
        let (k, v) = record?;
        if let Some(at) = v.windows(from.len()).position(|w| w == from) {
            let mut changed = v.to_vec();
            changed[at..at + to.len()].copy_from_slice(to);
            found.push((k.to_vec(), changed));
        }
    }
    ensure!(!found.is_empty(), "no stored value holds {from:?}");
    let mut batch = rocksdb::WriteBatch::default();
    for (mut k, v) in found {
        ensure!(k.len() == REVISION_KEY_BYTES, "revision key {k:?}");
        let sub = u64::from_be_bytes(k[9..].try_into()?);
        k[9..].copy_from_slice(&(sub + 1).to_be_bytes());
        batch.put_cf(kv, k, v);
    }
    let mut synced = rocksdb::WriteOptions::default();
    synced.set_sync(true);
    db.write_opt(batch, &synced)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupted_member_is_refused_at_start_and_alarmed_by_the_leader() -> Result<()> {
    let config = ClusterConfig::new(3);
    let binary = Binary::candidate()?;
    let cluster = Cluster::start(binary.clone(), config.clone()).await?;
    let all = ctl(cluster.endpoints())?;
    ok(&all, &["put", "victim", "pristine-value"]).await?;
    let m2 = ctl(vec![cluster.endpoint(2)])?;
    retry_until("m2 to apply the write", SERVE_TIMEOUT, || async {
        let out = ok(
            &m2,
            &["get", "victim", "--consistency=s", "--print-value-only"],
        )
        .await?;
        ensure!(out.trim() == "pristine-value", "m2 has {out:?}");
        Ok(())
    })
    .await?;
    // m2 stops gracefully, so its engine's files hold every write it
    // applied (after a kill -9 the last few milliseconds of them are only
    // in its Raft log, which the value is not corrupted in).
    let stopped = cluster.terminate(2, SERVE_TIMEOUT).await?;
    ensure!(stopped.success(), "m2 did not stop cleanly: {stopped}");
    cluster.kill_all()?;
    let flag = |f: &str| cluster.flag(0, f).with_context(|| format!("--{f}"));
    let args = |i: usize| -> Result<Vec<String>> {
        let flags = MemberFlags::new(
            &member_name(i),
            cluster.ip(i),
            cluster.dir(),
            &flag("initial-cluster")?,
            &flag("initial-cluster-token")?,
        );
        Ok(flags.args(&config))
    };
    corrupt_value(&cluster.dir().join("m2.etcd"), b"pristine", b"tampered")?;

    // The healthy members run the leader's periodic check.
    let mut running = Vec::new();
    for i in 0..2 {
        let mut a = args(i)?;
        a.push("--experimental-corrupt-check-time=1s".into());
        let log = cluster.dir().join(format!("m{i}-checked.log"));
        running.push(Process::start(&binary, &format!("m{i}-checked"), &log, &a)?);
    }
    let healthy = ctl(vec![cluster.endpoint(0), cluster.endpoint(1)])?;
    retry_until("the two healthy members to serve", SERVE_TIMEOUT, || {
        ok(&healthy, &["put", "again", "x"])
    })
    .await?;

    // The corrupted member refuses to start with the initial check.
    let mut a = args(2)?;
    a.push("--experimental-initial-corrupt-check=true".into());
    let log = cluster.dir().join("m2-initial-check.log");
    let refused = Process::start(&binary, "m2-initial-check", &log, &a)?;
    let status = refused.wait_exit(SERVE_TIMEOUT).await?;
    ensure!(!status.success(), "m2 started: {}", refused.log_tail());
    let text = refused.log();
    ensure!(
        text.contains("found data inconsistency with peers"),
        "no etcd error in m2's log:\n{text}"
    );

    // Started without it (as a follower: its log is behind the others'),
    // the leader finds it and raises CORRUPT for it.
    let m2_id = cluster.member_id(2).await?;
    let plain = cluster.dir().join("m2-plain.log");
    let _m2 = Process::start(&binary, "m2-plain", &plain, &args(2)?)?;
    let expected = format!("memberID:{m2_id} alarm:CORRUPT");
    retry_until("the CORRUPT alarm", SERVE_TIMEOUT, || async {
        let out = ok(&healthy, &["alarm", "list"]).await?;
        ensure!(
            out.contains(&expected),
            "alarms: {out:?}, expected {expected}"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// Retention of the auto-compaction test (etcd's periodic mode samples the
/// revision every tenth of it and compacts to the sample one retention old).
const AUTO_COMPACTION_RETENTION: Duration = Duration::from_secs(2);
/// How long a member may take to compact for the first and second time.
const AUTO_COMPACTION_DEADLINE: Duration = Duration::from_secs(20);

/// Writes to `cluster` until it has compacted twice; returns each
/// compaction seen as (compact revision, revision we had observed one
/// retention before we saw it).
async fn watch_auto_compaction(cluster: &Cluster) -> Result<Vec<(i64, i64)>> {
    let mut client = cluster.client(0).await?;
    let started = std::time::Instant::now();
    // (when, revision) of every write, oldest first.
    let mut seen: Vec<(std::time::Instant, i64)> = Vec::new();
    let mut compactions = Vec::new();
    // etcd answers -1 before its first compaction, the store 0.
    let mut last = client.hash_kv(0).await?.compact_version();
    while compactions.len() < 2 {
        ensure!(
            started.elapsed() < AUTO_COMPACTION_DEADLINE,
            "{} compacted {} times in {AUTO_COMPACTION_DEADLINE:?}; writes {:?}",
            cluster.binary().role,
            compactions.len(),
            seen.last()
        );
        let put = client.put("auto", "v", None).await?;
        seen.push((
            std::time::Instant::now(),
            put.header().context("header")?.revision(),
        ));
        let compacted = client.hash_kv(0).await?.compact_version();
        if compacted != last {
            // The compactor sampled this revision at least one retention
            // before now, so it cannot exceed the first revision we saw
            // at or after that moment.
            let bound_time = std::time::Instant::now() - AUTO_COMPACTION_RETENTION;
            let bound = seen
                .iter()
                .find(|(t, _)| *t >= bound_time)
                .map_or(i64::MAX, |(_, r)| *r);
            compactions.push((compacted, bound));
            last = compacted;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(compactions)
}

/// `--auto-compaction-mode=periodic --auto-compaction-retention=2s`: etcd
/// and the store both compact on their own, repeatedly, never into the
/// last retention's history.
#[tokio::test(flavor = "multi_thread")]
async fn periodic_auto_compaction_keeps_the_retention_as_etcd() -> Result<()> {
    let mut config = ClusterConfig::new(1);
    config.extra_args = vec![
        "--auto-compaction-mode=periodic".into(),
        format!(
            "--auto-compaction-retention={}s",
            AUTO_COMPACTION_RETENTION.as_secs()
        ),
    ];
    for binary in [Binary::etcd35()?, Binary::candidate()?] {
        let cluster = Cluster::start(binary, config.clone()).await?;
        let compactions = watch_auto_compaction(&cluster).await?;
        for (compacted, bound) in &compactions {
            ensure!(
                0 < *compacted && compacted <= bound,
                "{}: compacted {compacted}, newer than one retention ago ({bound}): {compactions:?}",
                cluster.binary().role
            );
        }
        ensure!(compactions[0].0 < compactions[1].0, "{compactions:?}");
    }
    Ok(())
}

/// An unknown mode or a malformed retention stops the member at start, as
/// in etcd, naming the problem.
#[test]
fn bad_auto_compaction_flags_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    for (flags, want) in [
        (
            [
                "--auto-compaction-mode=hourly",
                "--auto-compaction-retention=1",
            ],
            "unsupported compaction mode hourly",
        ),
        (
            [
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=soon",
            ],
            "error parsing CompactionRetention",
        ),
    ] {
        let out = Command::new(Binary::candidate()?.path)
            .args(flags)
            .arg(format!(
                "--data-dir={}",
                dir.path().join("m.etcd").display()
            ))
            .arg("--listen-client-urls=http://127.0.0.1:0")
            .arg("--advertise-client-urls=http://127.0.0.1:2379")
            .arg("--listen-peer-urls=http://127.0.0.1:0")
            .output()?;
        let text = text(&out);
        ensure!(!out.status.success(), "{flags:?} accepted:\n{text}");
        ensure!(text.contains(want), "{flags:?}: no {want:?} in\n{text}");
        ensure!(
            !dir.path().join("m.etcd").exists(),
            "{flags:?} wrote a data dir"
        );
    }
    Ok(())
}

/// `store --version` prints etcd's four lines (the labels tools parse,
/// compared with etcd 3.5's own), presenting etcd 3.6.14; flags etcd 3.6
/// removed or does not know are refused as Go's flag package refuses them
/// (status 2); a bad feature gate fails verification (status 1).
#[test]
fn version_and_refused_flags_answer_as_etcd_36() -> Result<()> {
    let store = Binary::candidate()?.path;
    let labels = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.split(':').next().unwrap_or_default().to_string())
            .collect()
    };
    let ours = Command::new(&store).arg("--version").output()?;
    let theirs = Command::new(Binary::etcd35()?.path)
        .arg("--version")
        .output()?;
    let (ours_text, theirs_text) = (text(&ours), text(&theirs));
    ensure!(ours.status.success(), "{ours_text}");
    ensure!(
        labels(&ours_text) == labels(&theirs_text),
        "{ours_text}\nvs etcd's\n{theirs_text}"
    );
    ensure!(
        ours_text.starts_with("etcd Version: 3.6.14\n"),
        "{ours_text}"
    );
    for (args, code, want) in [
        (
            &["--enable-v2=false"][..],
            2,
            "flag provided but not defined: -enable-v2",
        ),
        (
            &["--proxy", "on"][..],
            2,
            "flag provided but not defined: -proxy",
        ),
        (
            &["--feature-gates=Nope=true"][..],
            1,
            "unrecognized feature gate: Nope",
        ),
        (
            &[
                "--experimental-initial-corrupt-check=true",
                "--feature-gates=InitialCorruptCheck=true",
            ][..],
            1,
            "cannot specify both flags",
        ),
    ] {
        let out = Command::new(&store).args(args).output()?;
        let text = text(&out);
        ensure!(
            out.status.code() == Some(code) && text.contains(want),
            "{args:?}: {:?}\n{text}",
            out.status.code()
        );
    }
    Ok(())
}
