//! The deployment files under `deploy/` run the store with flags it accepts:
//! kubeadm's etcd static pod, the systemd unit and the kubeadm
//! `ClusterConfiguration` snippets are parsed here with the binary's own
//! argument parser, so a flag renamed or dropped breaks this test instead of
//! a cluster.

use std::path::{Path, PathBuf};

use serde_norway::Value;
use store::config::Parsed;
use store::Config;

/// A file under `deploy/`, found from cargo's `CARGO_MANIFEST_DIR` when it
/// runs the tests (a build shared by two checkouts carries the path of the
/// one that compiled it), else the compiled one.
fn deploy(path: &str) -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../deploy")
        .join(path)
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(deploy(path)).expect("deploy file exists");
    serde_norway::from_str(&text).expect("deploy file is YAML")
}

/// Parses `args` (after the program name) as the store does.
fn parse(args: &[String]) -> Parsed {
    let mut all = vec!["store".to_string()];
    all.extend(args.iter().cloned());
    Config::from_args(all).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .expect("a list")
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

/// The value of `--flag=` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    let prefix = format!("--{name}=");
    args.iter()
        .find_map(|a| a.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no --{name} in {args:?}"))
}

#[test]
fn kubeadm_static_pod_command_is_accepted() {
    let pod = yaml("kubernetes/etcd.yaml");
    let container = &pod["spec"]["containers"][0];
    let command = strings(&container["command"]);
    assert_eq!(
        command[0], "etcd",
        "kubeadm runs `etcd`; the image links it to store"
    );
    let args = &command[1..];
    let parsed = parse(args);
    let config = parsed.config;
    assert_eq!(config.name, "cp1");
    assert_eq!(config.data_dir(), PathBuf::from("/var/lib/etcd"));
    assert!(config.client_cert_auth && config.peer_client_cert_auth);
    assert_eq!(config.initial_members().expect("initial cluster").len(), 1);
    assert!(config.gates.initial_corrupt_check());
    assert_eq!(
        config.progress_notify_interval().expect("interval"),
        std::time::Duration::from_secs(5)
    );
    assert!(parsed.deprecations.is_empty(), "{:?}", parsed.deprecations);
    assert!(
        parsed.ignored.is_empty(),
        "flags of kubeadm's manifest the store ignores: {:?}",
        parsed.ignored
    );

    // Probes reach the metrics listener the command opens.
    let metrics = url::Url::parse(flag(args, "listen-metrics-urls")).expect("metrics URL");
    for probe in ["livenessProbe", "startupProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(
            get["port"].as_u64(),
            metrics.port().map(u64::from),
            "{probe}"
        );
        assert_eq!(get["host"].as_str(), metrics.host_str(), "{probe}");
    }
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(container["startupProbe"]["httpGet"]["path"], "/readyz");

    // The data directory and the certificates' directory are mounted.
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    let cert_dir = Path::new(flag(args, "cert-file"))
        .parent()
        .expect("cert dir");
    assert!(mounts.contains(&"/var/lib/etcd"), "{mounts:?}");
    assert!(
        mounts.iter().any(|m| Path::new(m) == cert_dir),
        "{mounts:?}"
    );
}

/// The arguments of a systemd unit's `ExecStart=` (with `\` continuations).
fn exec_start(path: &str) -> Vec<String> {
    let text = std::fs::read_to_string(deploy(path)).expect("unit exists");
    let joined = text.replace("\\\n", " ");
    let line = joined
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    line.split_whitespace().map(str::to_string).collect()
}

#[test]
fn systemd_unit_is_accepted() {
    let args = exec_start("systemd/etcd-rs.service");
    assert!(args[0].ends_with("/store"));
    let config = parse(&args[1..]).config;
    assert_eq!(config.data_dir(), PathBuf::from("/var/lib/etcd"));
    assert!(config.client_tls().enabled() && config.peer_tls().enabled());
    let members = config.initial_members().expect("initial cluster");
    assert_eq!(members.len(), 3);
}

#[test]
fn kubeadm_configurations_match_the_manifest() {
    let stacked = yaml("kubeadm/stacked.yaml");
    let local = &stacked["etcd"]["local"];
    let extra: Vec<String> = local["extraArgs"]
        .as_sequence()
        .expect("extraArgs")
        .iter()
        .map(|a| {
            let name = a["name"].as_str().expect("name");
            let value = a["value"].as_str().expect("value");
            format!("--{name}={value}")
        })
        .collect();
    parse(&extra);
    let image = format!(
        "{}/etcd:{}",
        local["imageRepository"].as_str().expect("repository"),
        local["imageTag"].as_str().expect("tag")
    );
    let pod = yaml("kubernetes/etcd.yaml");
    assert_eq!(
        pod["spec"]["containers"][0]["image"].as_str(),
        Some(image.as_str())
    );

    let external = yaml("kubeadm/external.yaml");
    let endpoints = strings(&external["etcd"]["external"]["endpoints"]);
    let unit = exec_start("systemd/etcd-rs.service");
    let advertised = flag(&unit, "advertise-client-urls");
    assert!(
        endpoints.iter().any(|e| e == advertised),
        "{endpoints:?} / {advertised}"
    );
}
