//! etcd's `--config-file` (env `ETCD_CONFIG_FILE`): a YAML mapping whose
//! keys are etcd's flag names.
//!
//! etcd 3.6 reads the file with `sigs.k8s.io/yaml` into its `configYAML`
//! struct: the YAML is converted to JSON and decoded into typed fields, so
//! a scalar becomes a string where the field is a string, a number where a
//! number is expected is an error if given as a string, a key the struct
//! does not know is silently dropped, and TLS settings live in two nested
//! mappings (`client-transport-security`, `peer-transport-security`). When
//! a file is given, every other command-line flag and every `ETCD_*`
//! variable is ignored (etcd logs that once at start-up).
//!
//! Here each key of the file is type-checked against the Go type etcd
//! declares for it ([`KEYS`]), rendered as the equivalent `--flag=value`
//! argument, and the arguments go through the same parser as the command
//! line (with environment variables switched off): one set of defaults,
//! one set of value checks and 3.6's rules for the deprecated spellings for
//! both. Keys etcd itself does not know are reported back so the binary can
//! warn about them; etcd's keys that set no flag (`discovery-config`,
//! `socket-options`) are reported as ignored.

use std::path::{Path, PathBuf};

use serde_norway::Value;

/// Why a config file cannot be used. The messages are etcd's.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file cannot be read.
    #[error("open {}: {reason}", path.display())]
    Read {
        /// The path as given.
        path: PathBuf,
        /// Go's wording of the I/O error.
        reason: String,
    },
    /// The file is not YAML.
    #[error("error converting YAML to JSON: yaml: {0}")]
    Yaml(String),
    /// The document is not a mapping.
    #[error("error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {found} into Go value of type embed.configYAML")]
    NotMapping {
        /// JSON's name for what was found.
        found: &'static str,
    },
    /// A key's value has the wrong type for etcd's field.
    #[error("error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {found} into Go struct field {go_struct}.{field} of type {go_type}")]
    Type {
        /// JSON's name for what was found (`string`, `number -1`, ...).
        found: String,
        /// etcd's struct holding the field.
        go_struct: &'static str,
        /// The key path (`heartbeat-interval`,
        /// `client-transport-security.cert-file`).
        field: String,
        /// The field's Go type.
        go_type: &'static str,
    },
}

/// The Go type etcd's `configYAML` declares for a key: how its value is
/// checked and rendered as a flag value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoType {
    /// `string`: any scalar, rendered as text.
    Str,
    /// `uint` / `uint64`: a non-negative integer.
    UInt(&'static str),
    /// `int` / `int64`: an integer.
    Int(&'static str),
    /// `bool`.
    Bool,
    /// `[]string`: a sequence of scalars, joined with commas.
    StrList,
    /// `time.Duration` in JSON: an integer count of nanoseconds.
    Nanos,
    /// `securityConfig`: a nested mapping of TLS settings; the prefix is
    /// the one its flags carry (`""` for clients, `"peer-"` for peers).
    Security(&'static str),
}

/// Keys of etcd 3.6's `configYAML` (its `embed.Config` and `configJSON`),
/// with their Go types. Each key is also the name of the flag it sets,
/// but for the one [`flag_of`] renames.
const KEYS: &[(&str, GoType)] = &[
    ("name", GoType::Str),
    ("data-dir", GoType::Str),
    ("wal-dir", GoType::Str),
    ("snapshot-count", GoType::UInt("uint64")),
    (
        "experimental-snapshot-catch-up-entries",
        GoType::UInt("uint64"),
    ),
    ("snapshot-catchup-entries", GoType::UInt("uint64")),
    ("max-snapshots", GoType::UInt("uint")),
    ("max-wals", GoType::UInt("uint")),
    ("heartbeat-interval", GoType::UInt("uint")),
    ("election-timeout", GoType::UInt("uint")),
    ("initial-election-tick-advance", GoType::Bool),
    ("backend-batch-interval", GoType::Nanos),
    ("backend-batch-limit", GoType::Int("int")),
    ("backend-bbolt-freelist-type", GoType::Str),
    ("quota-backend-bytes", GoType::Int("int64")),
    ("max-txn-ops", GoType::UInt("uint")),
    ("max-request-bytes", GoType::UInt("uint")),
    ("max-concurrent-streams", GoType::UInt("uint32")),
    ("self-signed-cert-validity", GoType::UInt("uint")),
    ("cipher-suites", GoType::StrList),
    ("tls-min-version", GoType::Str),
    ("tls-max-version", GoType::Str),
    ("initial-cluster-state", GoType::Str),
    ("discovery-srv", GoType::Str),
    ("discovery-srv-name", GoType::Str),
    ("discovery-proxy", GoType::Str),
    ("discovery", GoType::Str),
    ("initial-cluster", GoType::Str),
    ("initial-cluster-token", GoType::Str),
    ("strict-reconfig-check", GoType::Bool),
    ("auto-compaction-mode", GoType::Str),
    ("auto-compaction-retention", GoType::Str),
    ("grpc-keepalive-min-time", GoType::Nanos),
    ("grpc-keepalive-interval", GoType::Nanos),
    ("grpc-keepalive-timeout", GoType::Nanos),
    ("pre-vote", GoType::Bool),
    ("auth-token", GoType::Str),
    ("bcrypt-cost", GoType::UInt("uint")),
    ("auth-token-ttl", GoType::UInt("uint")),
    ("experimental-initial-corrupt-check", GoType::Bool),
    ("experimental-corrupt-check-time", GoType::Nanos),
    ("corrupt-check-time", GoType::Nanos),
    ("experimental-compact-hash-check-enabled", GoType::Bool),
    ("experimental-compact-hash-check-time", GoType::Nanos),
    ("compact-hash-check-time", GoType::Nanos),
    ("experimental-enable-lease-checkpoint", GoType::Bool),
    ("experimental-enable-lease-checkpoint-persist", GoType::Bool),
    ("experimental-compaction-batch-limit", GoType::Int("int")),
    ("compaction-batch-limit", GoType::Int("int")),
    ("experimental-compaction-sleep-interval", GoType::Nanos),
    ("compaction-sleep-interval", GoType::Nanos),
    ("experimental-watch-progress-notify-interval", GoType::Nanos),
    ("watch-progress-notify-interval", GoType::Nanos),
    ("experimental-warning-apply-duration", GoType::Nanos),
    ("warning-apply-duration", GoType::Nanos),
    (
        "experimental-bootstrap-defrag-threshold-megabytes",
        GoType::UInt("uint"),
    ),
    ("bootstrap-defrag-threshold-megabytes", GoType::UInt("uint")),
    ("warning-unary-request-duration", GoType::Nanos),
    ("experimental-warning-unary-request-duration", GoType::Nanos),
    ("max-learners", GoType::Int("int")),
    ("force-new-cluster", GoType::Bool),
    ("enable-pprof", GoType::Bool),
    ("metrics", GoType::Str),
    ("listen-metrics-urls", GoType::Str),
    ("experimental-enable-distributed-tracing", GoType::Bool),
    ("enable-distributed-tracing", GoType::Bool),
    ("experimental-distributed-tracing-address", GoType::Str),
    ("distributed-tracing-address", GoType::Str),
    ("experimental-distributed-tracing-service-name", GoType::Str),
    ("distributed-tracing-service-name", GoType::Str),
    ("experimental-distributed-tracing-instance-id", GoType::Str),
    ("distributed-tracing-instance-id", GoType::Str),
    (
        "experimental-distributed-tracing-sampling-rate",
        GoType::Int("int"),
    ),
    ("distributed-tracing-sampling-rate", GoType::Int("int")),
    (
        "experimental-peer-skip-client-san-verification",
        GoType::Bool,
    ),
    ("logger", GoType::Str),
    ("log-level", GoType::Str),
    ("log-format", GoType::Str),
    ("log-outputs", GoType::StrList),
    ("enable-log-rotation", GoType::Bool),
    ("log-rotation-config-json", GoType::Str),
    ("enable-grpc-gateway", GoType::Bool),
    ("unsafe-no-fsync", GoType::Bool),
    ("experimental-downgrade-check-time", GoType::Nanos),
    ("downgrade-check-time", GoType::Nanos),
    ("memory-mlock", GoType::Bool),
    ("experimental-memory-mlock", GoType::Bool),
    (
        "experimental-txn-mode-write-with-shared-buffer",
        GoType::Bool,
    ),
    ("experimental-stop-grpc-service-on-defrag", GoType::Bool),
    ("v2-deprecation", GoType::Str),
    ("listen-peer-urls", GoType::Str),
    ("listen-client-urls", GoType::Str),
    ("listen-client-http-urls", GoType::Str),
    ("initial-advertise-peer-urls", GoType::Str),
    ("advertise-client-urls", GoType::Str),
    ("cors", GoType::Str),
    ("host-whitelist", GoType::Str),
    ("client-transport-security", GoType::Security("")),
    ("peer-transport-security", GoType::Security("peer-")),
    ("feature-gates", GoType::Str),
];

/// Keys of etcd 3.6's `embed.Config` that no flag sets (Go values of its
/// embedding API); a file may carry them, they change nothing here.
const NON_FLAG_KEYS: &[&str] = &[
    "discovery-config",
    "socket-options",
    "grpc-additional-server-options",
];

/// The flag a key sets: its own name, but for the one key etcd spells
/// differently from its flag.
fn flag_of(key: &'static str) -> &'static str {
    match key {
        "experimental-snapshot-catch-up-entries" => "experimental-snapshot-catchup-entries",
        other => other,
    }
}

/// Keys of etcd's `securityConfig`, with their Go types.
const SECURITY_KEYS: &[(&str, GoType)] = &[
    ("cert-file", GoType::Str),
    ("key-file", GoType::Str),
    ("client-cert-file", GoType::Str),
    ("client-key-file", GoType::Str),
    ("client-cert-auth", GoType::Bool),
    ("trusted-ca-file", GoType::Str),
    ("auto-tls", GoType::Bool),
    ("allowed-cn", GoType::StrList),
    ("allowed-hostname", GoType::StrList),
    ("skip-client-san-verification", GoType::Bool),
];

/// The flag a `*-transport-security` key sets (`prefix` is `""` for the
/// client block, `"peer-"` for the peer block); `None` where etcd has no
/// such flag for that block (the value is then set aside as ignored).
fn security_flag(prefix: &str, key: &str) -> Option<String> {
    let client = prefix.is_empty();
    match key {
        "allowed-cn" if client => None,
        "allowed-cn" => Some("peer-cert-allowed-cn".into()),
        "allowed-hostname" if client => Some("client-cert-allowed-hostname".into()),
        "allowed-hostname" => Some("peer-cert-allowed-hostname".into()),
        "skip-client-san-verification" if client => None,
        "skip-client-san-verification" => Some("peer-skip-client-san-verification".into()),
        key => Some(format!("{prefix}{key}")),
    }
}

/// A config file turned into command-line arguments.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FileArgs {
    /// `--flag=value` arguments, in file order.
    pub args: Vec<String>,
    /// Keys etcd knows that the store ignores (tuning, v2, ...).
    pub ignored: Vec<String>,
    /// Keys etcd does not know either (etcd drops them silently).
    pub unknown: Vec<String>,
}

/// Reads `path` and converts it ([`parse`]).
pub fn load(path: &Path) -> Result<FileArgs, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigFileError::Read {
        path: path.to_path_buf(),
        reason: go_io_reason(&e),
    })?;
    parse(&text)
}

/// Go's wording of common I/O errors (`open x: no such file or directory`).
fn go_io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        std::io::ErrorKind::IsADirectory => "is a directory".into(),
        _ => e.to_string(),
    }
}

/// Converts a config file's text into flag arguments.
pub fn parse(text: &str) -> Result<FileArgs, ConfigFileError> {
    let doc: Value =
        serde_norway::from_str(text).map_err(|e| ConfigFileError::Yaml(yaml_reason(&e)))?;
    let map = match doc {
        Value::Mapping(m) => m,
        // An empty file is an empty configuration, as in etcd.
        Value::Null => return Ok(FileArgs::default()),
        other => {
            return Err(ConfigFileError::NotMapping {
                found: json_kind(&other),
            })
        }
    };
    let mut out = FileArgs::default();
    for (k, v) in map {
        let key = scalar_text(&k).unwrap_or_default();
        match KEYS.iter().find(|(name, _)| *name == key) {
            Some((name, ty)) => push_key(&mut out, name, *ty, &v)?,
            None if NON_FLAG_KEYS.contains(&key.as_str()) => out.ignored.push(key),
            None => out.unknown.push(key),
        }
    }
    Ok(out)
}

/// serde_norway's message without its location suffix, as go-yaml words it
/// (`line N: ...`).
fn yaml_reason(e: &serde_norway::Error) -> String {
    let msg = e.to_string();
    match e.location() {
        Some(loc) => {
            let what = msg.split(" at line ").next().unwrap_or(&msg);
            format!("line {}: {what}", loc.line())
        }
        None => msg,
    }
}

/// Renders one top-level key as arguments.
fn push_key(
    out: &mut FileArgs,
    name: &'static str,
    ty: GoType,
    v: &Value,
) -> Result<(), ConfigFileError> {
    if let GoType::Security(prefix) = ty {
        return push_security(out, name, prefix, v);
    }
    if let Some(text) = render(v, ty, "configYAML", name)? {
        out.args.push(format!("--{}={text}", flag_of(name)));
    }
    Ok(())
}

/// Renders a `*-transport-security` block as its flags.
fn push_security(
    out: &mut FileArgs,
    block: &'static str,
    prefix: &'static str,
    v: &Value,
) -> Result<(), ConfigFileError> {
    let map = match v {
        Value::Null => return Ok(()),
        Value::Mapping(m) => m,
        other => {
            return Err(type_error(
                other,
                "configYAML",
                block,
                "embed.securityConfig",
            ))
        }
    };
    for (k, v) in map {
        let key = scalar_text(k).unwrap_or_default();
        let Some((_, ty)) = SECURITY_KEYS.iter().find(|(n, _)| *n == key) else {
            out.unknown.push(format!("{block}.{key}"));
            continue;
        };
        let path = format!("{block}.{key}");
        let Some(text) = render(v, *ty, "securityConfig", &path)? else {
            continue;
        };
        match security_flag(prefix, &key) {
            Some(flag) => out.args.push(format!("--{flag}={text}")),
            None => out.ignored.push(path),
        }
    }
    Ok(())
}

/// A value checked against `ty` and rendered as flag text; `None` for
/// YAML null (the field keeps its default, as in Go).
fn render(
    v: &Value,
    ty: GoType,
    go_struct: &'static str,
    field: &str,
) -> Result<Option<String>, ConfigFileError> {
    let bad = || type_error(v, go_struct, field, go_type_name(ty));
    let text = match (ty, v) {
        (_, Value::Null) => return Ok(None),
        (GoType::Str, v) => scalar_text(v).ok_or_else(bad)?,
        (GoType::UInt(_), Value::Number(n)) => n.as_u64().ok_or_else(bad)?.to_string(),
        (GoType::Int(_), Value::Number(n)) => n.as_i64().ok_or_else(bad)?.to_string(),
        (GoType::Nanos, Value::Number(n)) => format!("{}ns", n.as_u64().ok_or_else(bad)?),
        (GoType::Bool, Value::Bool(b)) => b.to_string(),
        (GoType::StrList, Value::Sequence(items)) => items
            .iter()
            .map(|i| scalar_text(i).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()?
            .join(","),
        _ => return Err(bad()),
    };
    Ok(Some(text))
}

/// A scalar as text (sigs.k8s.io/yaml turns scalars into strings for
/// string fields); `None` for sequences, mappings and null.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Tagged(t) => scalar_text(&t.value),
        Value::Null | Value::Sequence(_) | Value::Mapping(_) => None,
    }
}

fn type_error(
    v: &Value,
    go_struct: &'static str,
    field: &str,
    go_type: &'static str,
) -> ConfigFileError {
    let found = match v {
        Value::Number(n) => format!("number {n}"),
        other => json_kind(other).to_string(),
    };
    ConfigFileError::Type {
        found,
        go_struct,
        field: field.to_string(),
        go_type,
    }
}

/// JSON's name for a value's kind, as Go's decoder reports it.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "array",
        Value::Mapping(_) => "object",
        Value::Tagged(t) => json_kind(&t.value),
    }
}

fn go_type_name(ty: GoType) -> &'static str {
    match ty {
        GoType::Str => "string",
        GoType::UInt(name) => name,
        GoType::Int(name) => name,
        GoType::Bool => "bool",
        GoType::StrList => "[]string",
        GoType::Nanos => "time.Duration",
        GoType::Security(_) => "embed.securityConfig",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_flags_and_scalars_become_strings() {
        let f = parse(
            "name: 5\nheartbeat-interval: 200\nlog-outputs: [stderr, /tmp/x.log]\n\
             grpc-keepalive-timeout: 20000000000\nforce-new-cluster: true\n\
             client-transport-security:\n  cert-file: /c.pem\n  client-cert-auth: true\n  auto-tls: false\n\
             peer-transport-security:\n  key-file: /k.pem\n\
             enable-v2: false\nno-such-key: 1\n",
        )
        .unwrap();
        assert_eq!(
            f.args,
            [
                "--name=5",
                "--heartbeat-interval=200",
                "--log-outputs=stderr,/tmp/x.log",
                "--grpc-keepalive-timeout=20000000000ns",
                "--force-new-cluster=true",
                "--cert-file=/c.pem",
                "--client-cert-auth=true",
                "--auto-tls=false",
                "--peer-key-file=/k.pem",
            ]
        );
        assert!(f.ignored.is_empty());
        // etcd 3.6 has no v2 API: its key is unknown there too.
        assert_eq!(f.unknown, ["enable-v2", "no-such-key"]);
    }

    #[test]
    fn etcd_36_keys_become_their_flags() {
        let f = parse(
            "feature-gates: InitialCorruptCheck=true\nwatch-progress-notify-interval: 5000000000\n\
             experimental-snapshot-catch-up-entries: 100\nmax-learners: 2\n\
             peer-transport-security: {allowed-cn: [a, b], skip-client-san-verification: true}\n\
             client-transport-security: {allowed-cn: [c], allowed-hostname: [h]}\n\
             socket-options: {}\n",
        )
        .unwrap();
        assert_eq!(
            f.args,
            [
                "--feature-gates=InitialCorruptCheck=true",
                "--watch-progress-notify-interval=5000000000ns",
                "--experimental-snapshot-catchup-entries=100",
                "--max-learners=2",
                "--peer-cert-allowed-cn=a,b",
                "--peer-skip-client-san-verification=true",
                "--client-cert-allowed-hostname=h",
            ]
        );
        assert_eq!(
            f.ignored,
            ["client-transport-security.allowed-cn", "socket-options"]
        );
        for (key, _) in KEYS
            .iter()
            .filter(|(_, t)| !matches!(t, GoType::Security(_)))
        {
            assert!(crate::etcd_flags::find(flag_of(key)).is_some(), "{key}");
        }
    }

    #[test]
    fn wrong_types_get_etcds_messages() {
        let e = parse("heartbeat-interval: abc\n").unwrap_err();
        assert_eq!(e.to_string(), "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal string into Go struct field configYAML.heartbeat-interval of type uint");
        let e = parse("snapshot-count: -1\n").unwrap_err();
        assert!(e.to_string().contains("cannot unmarshal number -1 into Go struct field configYAML.snapshot-count of type uint64"), "{e}");
        let e = parse("log-outputs: stderr\n").unwrap_err();
        assert!(e.to_string().ends_with("of type []string"), "{e}");
        let e = parse("client-transport-security:\n  client-cert-auth: yes-please\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("securityConfig.client-transport-security.client-cert-auth of type bool"),
            "{e}"
        );
        let e = parse("- a\n").unwrap_err();
        assert!(matches!(e, ConfigFileError::NotMapping { found: "array" }));
    }

    #[test]
    fn bad_yaml_and_missing_files_are_errors() {
        let e = parse("name: [\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("error converting YAML to JSON: yaml: line "),
            "{e}"
        );
        let e = load(Path::new("/nonexistent/etcd.yaml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "open /nonexistent/etcd.yaml: no such file or directory"
        );
        assert!(parse("").unwrap().args.is_empty());
        assert_eq!(
            parse("peer-transport-security: {auto-tls: true}\n")
                .unwrap()
                .args,
            ["--peer-auto-tls=true"]
        );
    }
}
