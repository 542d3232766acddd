//! Data directory safety of the candidate, with etcd 3.5 as the reference
//! where it has the same situation:
//!
//! - started on etcd's own data directory (50 keys written by etcd 3.5), the
//!   candidate refuses, names the directory and what it found, and leaves
//!   it usable: etcd starts on it again and still has the keys;
//! - a first start that fails after the data directory was created (client
//!   port busy) does not brick it: the next start serves writes, as etcd's;
//! - `--discovery` on a fresh member is refused with a clear error instead of
//!   bootstrapping a one-member cluster;
//! - a data directory that is a file: both refuse, naming the path.
//!
//! Run: `cargo test --release -p integration-tests --test integration data_dir:: -- --test-threads=2`

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Result};
use integration_tests::etcdctl::Etcdctl;
use integration_tests::net::{
    allocate_ip, allocate_ip_with_client_port_taken, client_url, peer_url,
};
use integration_tests::process::Process;
use integration_tests::wait::retry_until;
use integration_tests::Binary;

/// Deadline for a started member to serve.
const SERVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for a member that must refuse to start to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Keys etcd writes before the candidate is pointed at its directory.
const ETCD_KEYS: usize = 50;

/// etcd's flags for a one-member cluster named `m` on `ip` with `data`.
fn member_args(ip: Ipv4Addr, data: &Path) -> Vec<String> {
    let (client, peer) = (client_url(ip), peer_url(ip));
    vec![
        "--name=m".into(),
        format!("--data-dir={}", data.display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=m={peer}"),
    ]
}

fn ctl(ip: Ipv4Addr) -> Result<Etcdctl> {
    Ok(Etcdctl::new(Binary::etcdctl35()?, vec![client_url(ip)]))
}

/// `etcdctl put` that must succeed within [`SERVE_TIMEOUT`].
async fn put_eventually(ip: Ipv4Addr, key: &str) -> Result<()> {
    let ctl = ctl(ip)?;
    retry_until("a put to succeed", SERVE_TIMEOUT, || async {
        let out = ctl.run(&["put", key, "v"]).await?;
        ensure!(out.success(), "put failed:\n{out}");
        Ok(())
    })
    .await
}

/// Runs `binary args` to its exit (bounded); its exit code and output.
async fn run_to_exit(binary: &Binary, args: &[String], log: &Path) -> Result<(i32, String)> {
    let mut command = Command::new(&binary.path);
    command.args(args);
    let process = Process::spawn("refused", command, log)?;
    let status = process.wait_exit(EXIT_TIMEOUT).await?;
    Ok((status.code().unwrap_or(-1), process.log()))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_etcd_data_dir_is_refused_and_left_intact() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("etcd-data");
    let ip = allocate_ip()?;
    let args = member_args(ip, &data);
    {
        let mut etcd = Command::new(Binary::etcd35()?.path);
        etcd.args(&args);
        let etcd = Process::spawn("etcd", etcd, &dir.path().join("etcd.log"))?;
        put_eventually(ip, "k0").await?;
        let ctl = ctl(ip)?;
        for i in 1..ETCD_KEYS {
            let out = ctl.run(&["put", &format!("k{i}"), "v"]).await?;
            ensure!(out.success(), "put k{i}:\n{out}");
        }
        etcd.kill()?;
    }
    let (code, text) = run_to_exit(&Binary::candidate()?, &args, &dir.path().join("c.log")).await?;
    ensure!(
        code != 0,
        "the candidate started on etcd's data dir:\n{text}"
    );
    for expected in [
        data.display().to_string(),
        "member/wal".into(),
        "etcdctl make-mirror".into(),
    ] {
        ensure!(text.contains(&expected), "no {expected:?} in:\n{text}");
    }
    ensure!(
        !data.join("member/db").exists(),
        "the candidate created its engine"
    );

    let mut etcd = Command::new(Binary::etcd35()?.path);
    etcd.args(&args);
    let _etcd = Process::spawn("etcd-again", etcd, &dir.path().join("etcd2.log"))?;
    let ctl = ctl(ip)?;
    let count = retry_until("etcd to serve its keys again", SERVE_TIMEOUT, || async {
        let out = ctl.run(&["get", "k", "--prefix", "--keys-only"]).await?;
        ensure!(out.success(), "get failed:\n{out}");
        Ok(out.stdout.lines().filter(|l| !l.is_empty()).count())
    })
    .await?;
    ensure!(
        count == ETCD_KEYS,
        "etcd has {count} keys after the refusal"
    );
    Ok(())
}

/// A first start that fails with the client port taken, then a start that
/// must serve writes.
async fn failed_first_start_then_serve(binary: Binary) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (ip, busy) = allocate_ip_with_client_port_taken()?;
    let args = member_args(ip, &dir.path().join("data"));
    let (code, text) = run_to_exit(&binary, &args, &dir.path().join("first.log")).await?;
    ensure!(code != 0, "started with the client port taken:\n{text}");
    drop(busy);
    let mut command = Command::new(&binary.path);
    command.args(&args);
    let _member = Process::spawn("second", command, &dir.path().join("second.log"))?;
    put_eventually(ip, "after-a-failed-start").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_first_start_does_not_brick_the_data_dir() -> Result<()> {
    failed_first_start_then_serve(Binary::etcd35()?).await?;
    failed_first_start_then_serve(Binary::candidate()?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_is_refused_on_a_fresh_member() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ip = allocate_ip()?;
    for (flag, value) in [
        ("--discovery", "http://127.0.0.1:9/token"),
        ("--discovery-srv", "example.com"),
    ] {
        let mut args = member_args(ip, &dir.path().join(flag.trim_start_matches('-')));
        args.retain(|a| !a.starts_with("--initial-cluster="));
        args.push(format!("{flag}={value}"));
        let log = dir
            .path()
            .join(format!("{}.log", flag.trim_start_matches('-')));
        let (code, text) = run_to_exit(&Binary::candidate()?, &args, &log).await?;
        ensure!(code != 0, "{flag}: started anyway:\n{text}");
        let expected = format!("{flag} is not supported by this store");
        ensure!(
            text.contains(&expected),
            "{flag}: no {expected:?} in:\n{text}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_dir_that_is_a_file_is_refused_with_its_path() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x")?;
    for binary in [Binary::etcd35()?, Binary::candidate()?] {
        let ip = allocate_ip()?;
        let log = dir.path().join(format!("{}.log", binary.file_name()));
        let (code, text) = run_to_exit(&binary, &member_args(ip, &file), &log).await?;
        ensure!(
            code != 0,
            "{}: started on a file:\n{text}",
            binary.file_name()
        );
        ensure!(
            text.contains(&file.display().to_string()),
            "{}: the error does not name {}:\n{text}",
            binary.file_name(),
            file.display()
        );
    }
    Ok(())
}

/// The storage format file of a data directory.
const FORMAT_FILE: &str = "member/store-format";

/// A member's data in a newer storage format than the build reads is
/// refused before anything is opened, naming the directory, the format and
/// the formats the build reads; with the format file back, it serves.
#[tokio::test(flavor = "multi_thread")]
async fn a_newer_storage_format_is_refused() -> Result<()> {
    let candidate = Binary::candidate()?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let ip = allocate_ip()?;
    let args = member_args(ip, &data);
    {
        let mut command = Command::new(&candidate.path);
        command.args(&args);
        let member = Process::spawn("first", command, &dir.path().join("first.log"))?;
        put_eventually(ip, "kept").await?;
        member.kill()?;
    }
    let format_file = data.join(FORMAT_FILE);
    let written = std::fs::read_to_string(&format_file)?;
    ensure!(written == "2\n", "format file: {written:?}");
    let engine_files = || -> Result<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(data.join("member/db"))?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        names.sort();
        Ok(names)
    };
    let before = engine_files()?;
    std::fs::write(&format_file, "3\n")?;
    let (code, text) = run_to_exit(&candidate, &args, &dir.path().join("refused.log")).await?;
    ensure!(code != 0, "the candidate started on format 3:\n{text}");
    for expected in [
        data.display().to_string(),
        "storage format 3".into(),
        "reads formats 1 to 2".into(),
    ] {
        ensure!(text.contains(&expected), "no {expected:?} in:\n{text}");
    }
    ensure!(
        engine_files()? == before,
        "the refused start changed the engine's files"
    );
    ensure!(std::fs::read_to_string(&format_file)? == "3\n");

    std::fs::write(&format_file, "2\n")?;
    let mut command = Command::new(&candidate.path);
    command.args(&args);
    let _member = Process::spawn("again", command, &dir.path().join("again.log"))?;
    let ctl = ctl(ip)?;
    retry_until("the kept key", SERVE_TIMEOUT, || async {
        let out = ctl.run(&["get", "kept", "--print-value-only"]).await?;
        ensure!(out.success() && out.stdout == "v\n", "get:\n{out}");
        Ok(())
    })
    .await
}

/// The fixtures of `tests/fixtures/store-format-2` (see its `make.sh`).
fn fixture(name: &str) -> std::path::PathBuf {
    integration_tests::binary::workspace_root()
        .join("tests/fixtures/store-format-2")
        .join(name)
}

/// What the fixtures' history left (see `make.sh`): as root, a=3 and d=5
/// and c=4 on a lease, b deleted, revision 7, history before 4 compacted,
/// auth enabled.
async fn check_fixture_history(ip: Ipv4Addr) -> Result<()> {
    let ctl = ctl(ip)?;
    let root = "--user=root:rootpw";
    retry_until("the fixture's keys", SERVE_TIMEOUT, || async {
        let out = ctl
            .run(&[root, "get", "", "--prefix", "-w", "fields"])
            .await?;
        ensure!(out.success(), "get:\n{out}");
        Ok(())
    })
    .await?;
    let get = ctl.run(&[root, "get", "", "--from-key"]).await?;
    ensure!(get.stdout == "a\n3\nc\n4\nd\n5\n", "keys:\n{get}");
    let json = ctl.run(&[root, "get", "a", "-w", "json"]).await?.json()?;
    ensure!(json["header"]["revision"] == 7, "{json}");
    let kv = &json["kvs"][0];
    ensure!(
        kv["create_revision"] == 2 && kv["mod_revision"] == 4 && kv["version"] == 2,
        "{kv}"
    );
    let compacted = ctl.run(&[root, "get", "a", "--rev=3"]).await?;
    ensure!(
        !compacted.success()
            && compacted
                .stderr
                .contains("required revision has been compacted"),
        "get at revision 3:\n{compacted}"
    );
    let c = ctl.run(&[root, "get", "c", "-w", "json"]).await?.json()?;
    let lease = c["kvs"][0]["lease"].as_i64().unwrap_or(0);
    ensure!(lease != 0, "c has no lease: {c}");
    let leases = ctl.run(&[root, "lease", "list"]).await?;
    ensure!(
        leases.stdout.contains(&format!("{lease:x}")),
        "leases:\n{leases}"
    );
    let anonymous = ctl.run(&["get", "a"]).await?;
    ensure!(!anonymous.success(), "auth is off:\n{anonymous}");
    Ok(())
}

/// Every later build opens a data directory written by the format-2 build
/// and serves its history; and restores its backup file.
#[tokio::test(flavor = "multi_thread")]
async fn the_format_2_fixtures_are_served() -> Result<()> {
    let candidate = Binary::candidate()?;
    let dir = tempfile::tempdir()?;
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(fixture("data-dir.tar.gz"))
        .arg("-C")
        .arg(dir.path())
        .status()?;
    ensure!(untar.success(), "tar: {untar}");
    let data = dir.path().join("data");
    let ip = allocate_ip()?;
    {
        let mut command = Command::new(&candidate.path);
        command.args(member_args(ip, &data));
        let _member = Process::spawn("fixture", command, &dir.path().join("fixture.log"))?;
        check_fixture_history(ip).await?;
    }

    let restored = dir.path().join("restored");
    let ip = allocate_ip()?;
    let util = candidate.path.with_file_name("store-util");
    let restore = Command::new(&util)
        .args(["snapshot", "restore"])
        .arg(fixture("backup.db"))
        .args(["--name=m", &format!("--data-dir={}", restored.display())])
        .arg(format!("--initial-cluster=m={}", peer_url(ip)))
        .arg(format!("--initial-advertise-peer-urls={}", peer_url(ip)))
        .output()?;
    ensure!(restore.status.success(), "restore: {restore:?}");
    let mut command = Command::new(&candidate.path);
    command.args(member_args(ip, &restored));
    let _member = Process::spawn("restored", command, &dir.path().join("restored.log"))?;
    check_fixture_history(ip).await
}
