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
