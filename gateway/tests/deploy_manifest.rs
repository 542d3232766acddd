//! The gateway's deployment files under `deploy/` (static pod, systemd unit)
//! use flags the binary accepts: their command lines go through the
//! gateway's own parser and configuration builder.

use std::path::PathBuf;

use clap::Parser;
use gateway::cli::Cli;

fn deploy(path: &str) -> String {
    // Cargo's CARGO_MANIFEST_DIR when it runs the tests: a build shared by
    // two checkouts carries the path of the one that compiled it.
    let file: PathBuf = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../deploy")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The `- item` lines of the static pod's `command:` list.
fn pod_command(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| l.trim() != "- command:")
        .skip(1)
        .take_while(|l| l.starts_with("    - "))
        .map(|l| l.trim_start_matches("    - ").trim().to_string())
        .collect()
}

/// The arguments of `ExecStart=` (with `\` continuations).
fn exec_start(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    let line = joined
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    line.split_whitespace().map(str::to_string).collect()
}

fn check(args: Vec<String>) {
    assert!(args[0].ends_with("gateway"), "{args:?}");
    let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert_eq!(cli.backends.len(), 3, "{args:?}");
    assert!(cli.listen.is_some());
    cli.run_options()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

#[test]
fn static_pod_command_is_accepted() {
    check(pod_command(&deploy("kubernetes/gateway.yaml")));
}

#[test]
fn systemd_unit_is_accepted() {
    check(exec_start(&deploy("systemd/gateway.service")));
}
