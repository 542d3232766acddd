//! The TOML file format and its validation into [`Config`].
//!
//! Fields that rules apply to are read as [`Spanned`] so that every refusal names the line and
//! column of the value at fault; type and syntax errors come from `toml` with the same detail.
//! Unknown keys are refused (`deny_unknown_fields`): a typo must not silently fall back to a
//! default.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    admin: Option<Spanned<String>>,
    shutdown_grace: Option<Spanned<String>>,
    #[serde(default)]
    frontend: Vec<Spanned<RawFrontend>>,
    vip: Option<Spanned<RawVip>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVip {
    address: Spanned<String>,
    interface: Spanned<String>,
    election: Spanned<String>,
    prefix: Option<Spanned<String>>,
    lease_ttl: Option<Spanned<String>>,
    name: Option<Spanned<String>>,
    ca_file: Option<Spanned<String>>,
    client_cert: Option<Spanned<String>>,
    client_key: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFrontend {
    name: Spanned<String>,
    listen: Spanned<String>,
    balance: Option<Spanned<String>>,
    max_connections: Option<Spanned<usize>>,
    connect_timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    queue_timeout: Option<Spanned<String>>,
    retries: Option<Spanned<u32>>,
    tcp_keepalive: Option<Spanned<String>>,
    client_speaks_first: Option<bool>,
    on_marked_down: Option<Spanned<String>>,
    check: Option<Spanned<RawCheck>>,
    #[serde(default)]
    backend: Vec<Spanned<RawBackend>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    kind: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
    interval: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    fall: Option<Spanned<u32>>,
    rise: Option<Spanned<u32>>,
    slow_start: Option<Spanned<String>>,
    verify: Option<Spanned<String>>,
    ca_file: Option<Spanned<String>>,
    client_cert: Option<Spanned<String>>,
    client_key: Option<Spanned<String>>,
    server_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    name: Spanned<String>,
    address: Spanned<String>,
    check_address: Option<Spanned<String>>,
    weight: Option<Spanned<u32>>,
    max_connections: Option<Spanned<usize>>,
}

/// Turns byte offsets into line/column errors for one source text.
struct Locator<'a> {
    text: &'a str,
}

impl Locator<'_> {
    fn error(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        let before = &self.text[..span.start.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
        ConfigError::Invalid {
            line,
            column,
            message: message.into(),
        }
    }

    fn duration(
        &self,
        value: &Option<Spanned<String>>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match value {
            None => Ok(default),
            Some(spanned) => parse_duration(spanned.get_ref())
                .map_err(|message| self.error(spanned.span(), message)),
        }
    }

    fn nonzero_duration(
        &self,
        value: &Option<Spanned<String>>,
        default: Duration,
        key: &str,
    ) -> Result<Duration, ConfigError> {
        let duration = self.duration(value, default)?;
        match value {
            Some(spanned) if duration.is_zero() => {
                Err(self.error(spanned.span(), format!("`{key}` must be greater than zero")))
            }
            _ => Ok(duration),
        }
    }
}

pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    let raw: RawConfig =
        toml::from_str(text).map_err(|error| ConfigError::Syntax(error.to_string()))?;
    let locator = Locator { text };
    let admin_listen = match &raw.admin {
        None => Some(
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("default admin address parses"),
        ),
        Some(value) if value.get_ref() == "off" => None,
        Some(value) => Some(socket_addr(&locator, value)?),
    };
    let shutdown_grace = locator.duration(&raw.shutdown_grace, DEFAULT_SHUTDOWN_GRACE)?;
    if raw.frontend.is_empty() {
        return Err(locator.error(0..0, "no [[frontend]] is defined"));
    }
    if raw.frontend.len() > MAX_ENTRIES {
        return Err(locator.error(
            raw.frontend[MAX_ENTRIES].span(),
            format!("more than {MAX_ENTRIES} frontends"),
        ));
    }
    let mut names = HashSet::new();
    let mut listens = HashSet::new();
    let mut frontends = Vec::with_capacity(raw.frontend.len());
    for spanned in &raw.frontend {
        let frontend = frontend(&locator, spanned.get_ref())?;
        let raw_frontend = spanned.get_ref();
        if !names.insert(frontend.name.clone()) {
            return Err(locator.error(
                raw_frontend.name.span(),
                format!("duplicate frontend name `{}`", frontend.name),
            ));
        }
        if !listens.insert(frontend.listen) {
            return Err(locator.error(
                raw_frontend.listen.span(),
                format!("address {} is used by two frontends", frontend.listen),
            ));
        }
        frontends.push(frontend);
    }
    let vip = raw
        .vip
        .as_ref()
        .map(|spanned| vip(&locator, spanned.get_ref()))
        .transpose()?;
    Ok(Config {
        admin_listen,
        shutdown_grace,
        frontends,
        vip,
    })
}

/// Applies a `validate_*` rule of `config::vip` to a located value.
fn checked(
    locator: &Locator,
    value: &Spanned<String>,
    rule: impl Fn(&str) -> Result<(), String>,
) -> Result<String, ConfigError> {
    rule(value.get_ref()).map_err(|message| locator.error(value.span(), message))?;
    Ok(value.get_ref().clone())
}

fn vip(locator: &Locator, raw: &RawVip) -> Result<VipConfig, ConfigError> {
    let (address, prefix_len) = parse_vip_address(raw.address.get_ref())
        .map_err(|message| locator.error(raw.address.span(), message))?;
    let interface = checked(locator, &raw.interface, validate_interface)?;
    let (endpoints, uses_tls) = parse_election_endpoints(raw.election.get_ref())
        .map_err(|message| locator.error(raw.election.span(), message))?;
    let prefix = match &raw.prefix {
        None => default_prefix(address),
        Some(value) => checked(locator, value, validate_prefix)?,
    };
    let lease_ttl = locator.duration(&raw.lease_ttl, DEFAULT_VIP_LEASE_TTL)?;
    if let Some(value) = &raw.lease_ttl {
        validate_lease_ttl(lease_ttl).map_err(|message| locator.error(value.span(), message))?;
    }
    let name = match &raw.name {
        None => default_name(),
        Some(value) => checked(locator, value, validate_name)?,
    };
    let client_cert = client_pair(locator, &raw.client_cert, &raw.client_key)?;
    let ca_file = raw
        .ca_file
        .as_ref()
        .map(|file| PathBuf::from(file.get_ref()));
    let tls = match (uses_tls, ca_file.is_some() || client_cert.is_some()) {
        (true, _) => Some(ElectionTls {
            ca_file,
            client_cert,
        }),
        (false, false) => None,
        (false, true) => {
            return Err(locator.error(
                raw.election.span(),
                "TLS files are set but the election endpoints are not etcds://",
            ))
        }
    };
    Ok(VipConfig {
        address,
        prefix_len,
        interface,
        endpoints,
        prefix,
        lease_ttl,
        name,
        tls,
    })
}

fn socket_addr(locator: &Locator, value: &Spanned<String>) -> Result<SocketAddr, ConfigError> {
    value.get_ref().parse().map_err(|_| {
        locator.error(
            value.span(),
            format!("`{}` is not an IP:PORT address", value.get_ref()),
        )
    })
}

fn name(locator: &Locator, value: &Spanned<String>) -> Result<String, ConfigError> {
    let text = value.get_ref();
    let valid = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if valid {
        Ok(text.clone())
    } else {
        Err(locator.error(
            value.span(),
            format!("name `{text}` must be non-empty ASCII letters, digits, `-`, `_` or `.`"),
        ))
    }
}

fn frontend(locator: &Locator, raw: &RawFrontend) -> Result<FrontendConfig, ConfigError> {
    let balance = match &raw.balance {
        None => BalancePolicy::LeastConnections,
        Some(value) => match value.get_ref().as_str() {
            "least-connections" | "leastconn" => BalancePolicy::LeastConnections,
            "peak-ewma" => BalancePolicy::PeakEwma,
            "round-robin" | "roundrobin" => BalancePolicy::RoundRobin,
            other => {
                return Err(locator.error(
                    value.span(),
                    format!(
                    "unknown balance `{other}`: use least-connections, peak-ewma or round-robin"
                ),
                ))
            }
        },
    };
    let on_marked_down = match &raw.on_marked_down {
        None => OnMarkedDown::KeepSessions,
        Some(value) => match value.get_ref().as_str() {
            "keep-sessions" => OnMarkedDown::KeepSessions,
            "shutdown-sessions" => OnMarkedDown::ShutdownSessions,
            other => {
                return Err(locator.error(
                    value.span(),
                    format!(
                        "unknown on_marked_down `{other}`: use keep-sessions or shutdown-sessions"
                    ),
                ))
            }
        },
    };
    let max_connections = positive(
        locator,
        &raw.max_connections,
        DEFAULT_MAX_CONNECTIONS,
        "max_connections",
    )?;
    let retries = raw.retries.as_ref().map_or(Ok(DEFAULT_RETRIES), |value| {
        if *value.get_ref() > MAX_RETRIES {
            Err(locator.error(
                value.span(),
                format!("`retries` must be at most {MAX_RETRIES}"),
            ))
        } else {
            Ok(*value.get_ref())
        }
    })?;
    let check = match &raw.check {
        None => CheckConfig::with_kind(CheckKind::Https),
        Some(spanned) => check(locator, spanned.get_ref())?,
    };
    let backends = backends(locator, raw)?;
    Ok(FrontendConfig {
        name: name(locator, &raw.name)?,
        listen: socket_addr(locator, &raw.listen)?,
        balance,
        max_connections,
        connect_timeout: locator.nonzero_duration(
            &raw.connect_timeout,
            DEFAULT_CONNECT_TIMEOUT,
            "connect_timeout",
        )?,
        idle_timeout: locator.nonzero_duration(
            &raw.idle_timeout,
            DEFAULT_IDLE_TIMEOUT,
            "idle_timeout",
        )?,
        queue_timeout: locator.duration(&raw.queue_timeout, DEFAULT_QUEUE_TIMEOUT)?,
        retries,
        tcp_keepalive: locator.nonzero_duration(
            &raw.tcp_keepalive,
            DEFAULT_TCP_KEEPALIVE,
            "tcp_keepalive",
        )?,
        client_speaks_first: raw.client_speaks_first.unwrap_or(true),
        on_marked_down,
        check,
        backends,
    })
}

fn positive(
    locator: &Locator,
    value: &Option<Spanned<usize>>,
    default: usize,
    key: &str,
) -> Result<usize, ConfigError> {
    match value {
        None => Ok(default),
        Some(spanned) if *spanned.get_ref() == 0 => {
            Err(locator.error(spanned.span(), format!("`{key}` must be at least 1")))
        }
        Some(spanned) => Ok(*spanned.get_ref()),
    }
}

fn backends(locator: &Locator, raw: &RawFrontend) -> Result<Vec<BackendConfig>, ConfigError> {
    if raw.backend.is_empty() {
        return Err(locator.error(
            raw.name.span(),
            format!(
                "frontend `{}` has no [[frontend.backend]]",
                raw.name.get_ref()
            ),
        ));
    }
    if raw.backend.len() > MAX_ENTRIES {
        return Err(locator.error(
            raw.backend[MAX_ENTRIES].span(),
            format!("more than {MAX_ENTRIES} backends"),
        ));
    }
    let mut names = HashSet::new();
    let mut backends = Vec::with_capacity(raw.backend.len());
    for spanned in &raw.backend {
        let raw = spanned.get_ref();
        let backend_name = name(locator, &raw.name)?;
        if !names.insert(backend_name.clone()) {
            return Err(locator.error(
                raw.name.span(),
                format!("duplicate backend name `{backend_name}`"),
            ));
        }
        let address = host_port(locator, &raw.address)?;
        let check_address = raw
            .check_address
            .as_ref()
            .map(|value| host_port(locator, value))
            .transpose()?;
        let weight = match &raw.weight {
            None => DEFAULT_WEIGHT,
            Some(value) if *value.get_ref() > MAX_WEIGHT => {
                return Err(locator.error(
                    value.span(),
                    format!("`weight` must be at most {MAX_WEIGHT}"),
                ))
            }
            Some(value) => *value.get_ref(),
        };
        let max_connections = match &raw.max_connections {
            None => None,
            Some(_) => Some(positive(
                locator,
                &raw.max_connections,
                0,
                "max_connections",
            )?),
        };
        backends.push(BackendConfig {
            name: backend_name,
            address,
            check_address,
            weight,
            max_connections,
        });
    }
    Ok(backends)
}

fn host_port(locator: &Locator, value: &Spanned<String>) -> Result<String, ConfigError> {
    validate_host_port(value.get_ref()).map_err(|message| locator.error(value.span(), message))?;
    Ok(value.get_ref().clone())
}

fn check(locator: &Locator, raw: &RawCheck) -> Result<CheckConfig, ConfigError> {
    let kind = match &raw.kind {
        None => CheckKind::Https,
        Some(value) => match value.get_ref().as_str() {
            "none" => CheckKind::None,
            "tcp" => CheckKind::Tcp,
            "http" => CheckKind::Http,
            "https" => CheckKind::Https,
            "etcd" | "etcd-https" => CheckKind::EtcdHttps,
            "etcd-http" => CheckKind::EtcdHttp,
            other => {
                return Err(locator.error(
                    value.span(),
                    format!("unknown check kind `{other}`: use none, tcp, http, https, etcd-http or etcd-https"),
                ))
            }
        },
    };
    let mut check = CheckConfig::with_kind(kind);
    if let Some(path) = &raw.path {
        if !path.get_ref().starts_with('/') {
            return Err(locator.error(path.span(), "check `path` must start with `/`"));
        }
        check.path = path.get_ref().clone();
    }
    check.interval = locator.duration(&raw.interval, DEFAULT_CHECK_INTERVAL)?;
    if check.interval < MIN_CHECK_INTERVAL {
        let span = raw.interval.as_ref().map_or(0..0, |value| value.span());
        return Err(locator.error(
            span,
            format!("check `interval` must be at least {MIN_CHECK_INTERVAL:?}"),
        ));
    }
    check.timeout = locator.nonzero_duration(&raw.timeout, check.interval, "timeout")?;
    if check.timeout > check.interval {
        let span = raw.timeout.as_ref().map_or(0..0, |value| value.span());
        return Err(locator.error(span, "check `timeout` must not exceed `interval`"));
    }
    check.fall = fall_rise(locator, &raw.fall, DEFAULT_FALL, "fall")?;
    check.rise = fall_rise(locator, &raw.rise, DEFAULT_RISE, "rise")?;
    check.slow_start = locator.duration(&raw.slow_start, DEFAULT_SLOW_START)?;
    check.tls.verify = match &raw.verify {
        None => Verify::None,
        Some(value) => match value.get_ref().as_str() {
            "none" => Verify::None,
            "ca" => match &raw.ca_file {
                Some(file) => Verify::CaFile(PathBuf::from(file.get_ref())),
                None => {
                    return Err(locator.error(value.span(), "`verify = \"ca\"` needs `ca_file`"))
                }
            },
            other => {
                return Err(locator.error(
                    value.span(),
                    format!("unknown verify `{other}`: use none or ca"),
                ))
            }
        },
    };
    if let (Some(file), Verify::None) = (&raw.ca_file, &check.tls.verify) {
        return Err(locator.error(file.span(), "`ca_file` is set but `verify` is not \"ca\""));
    }
    check.tls.client_cert = client_pair(locator, &raw.client_cert, &raw.client_key)?;
    check.tls.server_name = raw.server_name.clone();
    Ok(check)
}

/// A client certificate and its key: both or neither.
fn client_pair(
    locator: &Locator,
    cert: &Option<Spanned<String>>,
    key: &Option<Spanned<String>>,
) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some((
            PathBuf::from(cert.get_ref()),
            PathBuf::from(key.get_ref()),
        ))),
        (Some(cert), None) => Err(locator.error(cert.span(), "`client_cert` needs `client_key`")),
        (None, Some(key)) => Err(locator.error(key.span(), "`client_key` needs `client_cert`")),
    }
}

fn fall_rise(
    locator: &Locator,
    value: &Option<Spanned<u32>>,
    default: u32,
    key: &str,
) -> Result<u32, ConfigError> {
    match value {
        None => Ok(default),
        Some(spanned) if (1..=MAX_FALL_RISE).contains(spanned.get_ref()) => Ok(*spanned.get_ref()),
        Some(spanned) => Err(locator.error(
            spanned.span(),
            format!("`{key}` must be between 1 and {MAX_FALL_RISE}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[[frontend]]
name = "apiserver"
listen = "127.0.0.1:6443"

[[frontend.backend]]
name = "cp1"
address = "127.0.0.2:8443"
"#;

    #[test]
    fn minimal_file_gets_haproxy_defaults() {
        let config = Config::from_toml(MINIMAL).expect("valid");
        let frontend = &config.frontends[0];
        assert_eq!(frontend.balance, BalancePolicy::LeastConnections);
        assert_eq!(frontend.check.kind, CheckKind::Https);
        assert_eq!(frontend.check.path, "/readyz");
        assert_eq!(frontend.check.interval, Duration::from_secs(2));
        assert_eq!((frontend.check.fall, frontend.check.rise), (3, 2));
        assert!(frontend.idle_timeout >= Duration::from_secs(3600));
        assert!(frontend.client_speaks_first, "TLS: the client speaks first");
        assert_eq!(config.admin_listen, Some("127.0.0.1:9100".parse().unwrap()));
    }

    #[test]
    fn a_frontend_can_say_its_server_speaks_first() {
        let text = MINIMAL.replace(
            "listen = \"127.0.0.1:6443\"\n",
            "listen = \"127.0.0.1:6443\"\nclient_speaks_first = false\n",
        );
        let config = Config::from_toml(&text).expect("valid");
        assert!(!config.frontends[0].client_speaks_first);
        assert!(!config.frontends[0].socket_options().client_speaks_first);
    }

    fn error_line(text: &str) -> (usize, String) {
        match Config::from_toml(text) {
            Err(ConfigError::Invalid { line, message, .. }) => (line, message),
            Err(ConfigError::Syntax(message)) => {
                let line = message
                    .split("line ")
                    .nth(1)
                    .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                    .and_then(|digits| digits.parse().ok())
                    .expect("syntax errors name a line");
                (line, message)
            }
            other => panic!("expected a located error, got {other:?}"),
        }
    }

    #[test]
    fn bad_address_names_its_line() {
        let text = MINIMAL.replace("127.0.0.2:8443", "127.0.0.2");
        let (line, message) = error_line(&text);
        assert_eq!(line, 8);
        assert!(message.contains("HOST:PORT"), "{message}");
    }

    #[test]
    fn bad_duration_and_fall_name_their_lines() {
        let text = format!("{MINIMAL}\n[frontend.check]\ninterval = \"2x\"\n");
        assert_eq!(error_line(&text).0, 11);
        let text = format!("{MINIMAL}\n[frontend.check]\nfall = 0\n");
        let (line, message) = error_line(&text);
        assert_eq!(line, 11);
        assert!(message.contains("fall"), "{message}");
    }

    #[test]
    fn syntax_error_and_unknown_key_name_their_lines() {
        let text = MINIMAL.replace("name = \"cp1\"", "name = cp1");
        assert_eq!(error_line(&text).0, 7);
        let text = MINIMAL.replace("name = \"cp1\"", "nmae = \"cp1\"");
        let (line, message) = error_line(&text);
        assert_eq!(line, 7);
        assert!(message.contains("nmae"), "{message}");
    }

    const VIP: &str = r#"
[vip]
address = "10.0.0.100/32"
interface = "eth0"
election = "etcd://10.0.0.1:2379,10.0.0.2:2379"
lease_ttl = "4s"
name = "cp1"
"#;

    #[test]
    fn vip_section_parses_with_defaults() {
        let config = Config::from_toml(&format!("{MINIMAL}{VIP}")).expect("valid");
        let vip = config.vip.expect("a VIP");
        assert_eq!(vip.address, std::net::Ipv4Addr::new(10, 0, 0, 100));
        assert_eq!(vip.prefix_len, 32);
        assert_eq!(vip.endpoints.len(), 2);
        assert_eq!(vip.prefix, "/gateway/vip/10.0.0.100");
        assert_eq!(vip.lease_ttl, Duration::from_secs(4));
        assert_eq!(vip.tls, None);
        assert!(Config::from_toml(MINIMAL).unwrap().vip.is_none());
    }

    #[test]
    fn ipv6_vip_parses() {
        let text = format!("{MINIMAL}{VIP}").replace("10.0.0.100/32", "fd00:10::100/128");
        let vip = Config::from_toml(&text).expect("valid").vip.expect("a VIP");
        let address: std::net::IpAddr = "fd00:10::100".parse().unwrap();
        assert_eq!((vip.address, vip.prefix_len), (address, 128));
        assert_eq!(vip.prefix, "/gateway/vip/fd00:10::100");
    }

    #[test]
    fn bad_vip_values_name_their_lines() {
        let text = format!("{MINIMAL}{VIP}").replace("10.0.0.100/32", "fe80::1/128");
        let (line, message) = error_line(&text);
        assert_eq!(
            (line, message.contains("link-local")),
            (11, true),
            "{message}"
        );
        let text = format!("{MINIMAL}{VIP}").replace("\"4s\"", "\"1s\"");
        assert_eq!(error_line(&text).0, 14);
        let text = format!("{MINIMAL}{VIP}ca_file = \"/ca.pem\"\n");
        let (line, message) = error_line(&text);
        assert_eq!(line, 13);
        assert!(message.contains("etcds://"), "{message}");
    }

    #[test]
    fn duplicate_backend_names_are_refused() {
        let text = format!(
            "{MINIMAL}\n[[frontend.backend]]\nname = \"cp1\"\naddress = \"127.0.0.3:8443\"\n"
        );
        let (line, message) = error_line(&text);
        assert_eq!(line, 11);
        assert!(message.contains("duplicate"), "{message}");
    }
}
