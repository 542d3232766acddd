//! Test harness of the gateway: real nginx backends, the gateway binary as a process, and small
//! HTTP(S) clients. Processes and certificates come from the workspace's one test harness
//! (`integration_tests::process`, `integration_tests::pki`). Every wait polls a condition until a
//! generous deadline (the CI machine has two loaded cores); nothing here sleeps for a fixed time
//! to "let things settle".
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use integration_tests::pki::Ca;
use integration_tests::Process;
use rustls::pki_types::{CertificateDer, ServerName};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Debian's nginx; CI installs the `nginx` package.
pub const NGINX: &str = "/usr/sbin/nginx";
/// Deadline for a process to start listening or a state to be reached on a loaded machine.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(30);
/// Deadline of one client request through the gateway.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(15);
/// Pause between two polls of a condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

static NEXT_HOST: AtomicU8 = AtomicU8::new(2);

/// A distinct loopback address per backend of this test process (127.0.0.2, .3, ...).
pub fn next_loopback() -> IpAddr {
    let host = NEXT_HOST.fetch_add(1, Ordering::Relaxed);
    assert!(host < 250, "ran out of loopback addresses");
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

/// Ports [`free_port`] handed out in this test process: the kernel may offer a released
/// ephemeral port again at once, and a test that asked for two (a listener and the admin
/// address) must not get the same one twice.
static HANDED_OUT: Mutex<BTreeSet<(IpAddr, u16)>> = Mutex::new(BTreeSet::new());

/// A port that is free on `ip` right now and was not handed out before in this process.
pub fn free_port(ip: IpAddr) -> u16 {
    loop {
        let port = StdListener::bind((ip, 0))
            .expect("bind an ephemeral port")
            .local_addr()
            .unwrap()
            .port();
        if HANDED_OUT.lock().unwrap().insert((ip, port)) {
            return port;
        }
    }
}

/// A free address on 127.0.0.1.
pub fn free_local_address() -> SocketAddr {
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    SocketAddr::new(ip, free_port(ip))
}

/// Polls `condition` until it holds or `deadline` passes; panics with `what` on timeout.
pub async fn wait_for<F, Fut>(what: &str, deadline: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if condition().await {
            return;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// A test CA and the certificates it signs (the harness's [`Ca`]).
pub struct Pki {
    ca: Ca,
}

/// A server certificate and key in PEM, plus the DER to recognise it on the wire.
pub use integration_tests::pki::Issued as ServerIdentity;

impl Pki {
    pub fn new() -> Pki {
        Pki {
            ca: Ca::new("gateway-test-ca").expect("a test CA"),
        }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A server certificate for `localhost` and 127.0.0.1 with common name `name`.
    pub fn server(&self, name: &str, ip: IpAddr) -> ServerIdentity {
        let sans = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            ip.to_string(),
        ];
        self.ca.server(name, &sans).expect("a server certificate")
    }

    /// A TLS client trusting only this CA.
    pub fn connector(&self) -> TlsConnector {
        let config = self.ca.rustls_client(None).expect("a TLS client config");
        TlsConnector::from(Arc::new(config))
    }
}

/// One nginx process serving HTTPS on its own loopback address.
///
/// Locations: `/` answers the backend's name; `/readyz` answers 200, or 500 while the file
/// `fail` exists in its directory; `/health` answers etcd's health JSON, unhealthy while `fail`
/// exists; `/stream` proxies unbuffered to an optional upstream (for watch-like responses).
pub struct Nginx {
    pub name: String,
    pub address: SocketAddr,
    pub identity: ServerIdentity,
    dir: TempDir,
    process: Option<Process>,
}

impl Nginx {
    pub async fn start(pki: &Pki, name: &str, stream_upstream: Option<SocketAddr>) -> Nginx {
        assert!(
            Path::new(NGINX).exists(),
            "{NGINX} not found: the gateway tests need Debian's nginx (apt-get install nginx)"
        );
        let ip = next_loopback();
        let address = SocketAddr::new(ip, free_port(ip));
        let identity = pki.server(name, ip);
        let dir = tempfile::Builder::new()
            .prefix("gateway-nginx-")
            .tempdir()
            .unwrap();
        fs::write(dir.path().join("server.crt"), &identity.cert_pem).unwrap();
        fs::write(dir.path().join("server.key"), &identity.key_pem).unwrap();
        fs::write(
            dir.path().join("nginx.conf"),
            nginx_conf(dir.path(), name, address, stream_upstream),
        )
        .unwrap();
        let mut nginx = Nginx {
            name: name.to_string(),
            address,
            identity,
            dir,
            process: None,
        };
        nginx.restart().await;
        nginx
    }

    fn spawn(&self) -> Process {
        let dir = self.dir.path();
        let mut command = Command::new(NGINX);
        command
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"));
        Process::spawn(
            &format!("nginx {}", self.name),
            command,
            &dir.join("stderr.log"),
        )
        .unwrap_or_else(|error| panic!("cannot start {NGINX}: {error:#}"))
    }

    /// Starts (again) and waits until the port accepts connections.
    pub async fn restart(&mut self) {
        assert!(self.process.is_none(), "{} is already running", self.name);
        let process = self.spawn();
        let start = Instant::now();
        loop {
            if let Some(status) = process.try_wait().unwrap() {
                let log = fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default();
                let stderr =
                    fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
                panic!("nginx {} exited with {status}: {stderr}\n{log}", self.name);
            }
            if TcpStream::connect(self.address).await.is_ok() {
                break;
            }
            assert!(
                start.elapsed() < STARTUP_DEADLINE,
                "nginx {} did not listen on {}",
                self.name,
                self.address
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        self.process = Some(process);
    }

    /// Kills the process (like a crash) and waits for it to be gone.
    pub fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            let _ = process.kill();
        }
    }

    /// Makes `/readyz` (and `/health`) fail or succeed.
    pub fn set_ready(&self, ready: bool) {
        let flag = self.dir.path().join("fail");
        if ready {
            let _ = fs::remove_file(flag);
        } else {
            fs::write(flag, b"").unwrap();
        }
    }

    /// `host:port` for gateway flags and configuration.
    pub fn host_port(&self) -> String {
        self.address.to_string()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
    }
}

fn nginx_conf(
    dir: &Path,
    name: &str,
    address: SocketAddr,
    stream_upstream: Option<SocketAddr>,
) -> String {
    let dir = dir.display();
    let stream = match stream_upstream {
        Some(upstream) => format!(
            "location = /stream {{ proxy_pass http://{upstream}; proxy_http_version 1.1; \
             proxy_buffering off; proxy_read_timeout 600s; proxy_send_timeout 600s; }}"
        ),
        None => String::new(),
    };
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    default_type text/plain;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_timeout 600s;
    keepalive_requests 100000;
    server {{
        listen {address} ssl;
        ssl_certificate {dir}/server.crt;
        ssl_certificate_key {dir}/server.key;
        location = /readyz {{
            if (-f {dir}/fail) {{ return 500 "failing\n"; }}
            return 200 "ok\n";
        }}
        location = /health {{
            default_type application/json;
            if (-f {dir}/fail) {{ return 503 '{{"health":"false","reason":"test"}}'; }}
            return 200 '{{"health":"true","reason":""}}';
        }}
        {stream}
        location / {{ return 200 "{name}\n"; }}
    }}
}}
"#
    )
}

/// The gateway binary running as a child process.
pub struct Gateway {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub dir: TempDir,
    process: Process,
}

impl Gateway {
    /// Starts `gateway ARGS --admin ADMIN` and waits until admin and listener answer.
    pub async fn start_with_args(listen: SocketAddr, args: &[String]) -> Gateway {
        let dir = tempfile::Builder::new()
            .prefix("gateway-proc-")
            .tempdir()
            .unwrap();
        let admin = free_local_address();
        let mut all: Vec<String> = args.to_vec();
        all.extend(["--admin".to_string(), admin.to_string()]);
        let process = spawn_gateway(&all, &dir.path().join("gateway.log"));
        let mut gateway = Gateway {
            listen,
            admin,
            dir,
            process,
        };
        gateway.wait_ready().await;
        gateway
    }

    /// Starts the gateway with the configuration file `config_text` (kept as `config_path()`).
    pub async fn start_with_config(listen: SocketAddr, config_text: &str) -> Gateway {
        Gateway::start_with_config_and_args(listen, config_text, &[]).await
    }

    /// [`Gateway::start_with_config`] with more flags (`--threads N`).
    pub async fn start_with_config_and_args(
        listen: SocketAddr,
        config_text: &str,
        extra: &[&str],
    ) -> Gateway {
        let dir = tempfile::Builder::new()
            .prefix("gateway-proc-")
            .tempdir()
            .unwrap();
        let config = dir.path().join("gateway.toml");
        fs::write(&config, config_text).unwrap();
        let admin = free_local_address();
        let mut args = vec![
            "--config".to_string(),
            config.display().to_string(),
            "--admin".to_string(),
            admin.to_string(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let process = spawn_gateway(&args, &dir.path().join("gateway.log"));
        let mut gateway = Gateway {
            listen,
            admin,
            dir,
            process,
        };
        gateway.wait_ready().await;
        gateway
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.toml")
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    async fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.process.try_wait().unwrap() {
                panic!("gateway exited with {status}:\n{}", self.log());
            }
            let admin_up = http_get(self.admin, "/healthz")
                .await
                .is_ok_and(|(status, _)| status == 200);
            if admin_up && TcpStream::connect(self.listen).await.is_ok() {
                return;
            }
            assert!(
                start.elapsed() < STARTUP_DEADLINE,
                "gateway did not start:\n{}",
                self.log()
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The `/proc/PID/task/TID` directories of the runtime's relay threads (`--threads`),
    /// found by name (the gateway starts no blocking-pool threads, which would carry the same
    /// name).
    fn relay_thread_tasks(&self) -> Vec<PathBuf> {
        let pid = self.process.pid().expect("running");
        fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the gateway's threads")
            .filter_map(|task| task.ok().map(|task| task.path()))
            .filter(|task| {
                fs::read_to_string(task.join("comm"))
                    .is_ok_and(|name| name.trim_end() == gateway::relays::RELAY_THREAD_NAME)
            })
            .collect()
    }

    /// The number of relay threads.
    pub fn relay_threads(&self) -> usize {
        self.relay_thread_tasks().len()
    }

    /// The CPUs each relay thread may run on (`Cpus_allowed_list` in its `status`), in no
    /// particular order of threads.
    pub fn relay_thread_cpus(&self) -> Vec<Vec<usize>> {
        self.relay_thread_tasks()
            .into_iter()
            .map(|task| {
                let status = fs::read_to_string(task.join("status")).expect("thread status");
                let list = status
                    .lines()
                    .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
                    .expect("Cpus_allowed_list");
                parse_cpu_list(list.trim())
            })
            .collect()
    }

    /// Listening TCP sockets on `self.listen` (an IPv4 address), counted in `/proc/net/tcp`:
    /// one per relay thread (`SO_REUSEPORT`), or one. Every test listens on a port of its own.
    pub fn listening_sockets(&self) -> usize {
        let SocketAddr::V4(listen) = self.listen else {
            panic!("listening_sockets reads /proc/net/tcp (IPv4 only)");
        };
        let local = format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(listen.ip().octets()),
            listen.port()
        );
        const LISTEN_STATE: &str = "0A";
        fs::read_to_string("/proc/net/tcp")
            .expect("/proc/net/tcp")
            .lines()
            .skip(1)
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .filter(|fields| fields.get(1) == Some(&local.as_str()))
            .filter(|fields| fields.get(3) == Some(&LISTEN_STATE))
            .count()
    }

    pub fn signal(&self, signal: i32) {
        let pid = self.process.pid().expect("running") as i32;
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let result = unsafe { libc::kill(pid, signal) };
        assert_eq!(result, 0, "kill({pid}, {signal}) failed");
    }

    /// Waits for the process to exit within `deadline`.
    pub async fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        self.process
            .wait_exit(deadline)
            .await
            .unwrap_or_else(|error| panic!("gateway: {error:#}\n{}", self.log()))
    }

    /// The backends as the admin API reports them.
    pub async fn backends(&self) -> Vec<serde_json::Value> {
        let (status, body) = http_get(self.admin, "/api/backends")
            .await
            .expect("admin API answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// The admin API's view of the backend named `name`.
    pub async fn backend(&self, name: &str) -> Option<serde_json::Value> {
        self.backends()
            .await
            .into_iter()
            .find(|backend| backend["name"] == name)
    }

    /// Waits until the backend `name` is (or is not) serving new connections.
    pub async fn wait_serving(&self, name: &str, serving: bool) {
        let what = format!("backend {name} serving={serving}");
        wait_for(&what, STARTUP_DEADLINE, || async {
            self.backend(name).await.is_some_and(|backend| {
                let up = backend["health"] == "up"
                    && backend["admin"] == "enabled"
                    && backend["suspect"] == false;
                up == serving
            })
        })
        .await;
    }
}

/// Parses the kernel's CPU list format (`0-2,5`).
pub fn parse_cpu_list(list: &str) -> Vec<usize> {
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((first, last)) => {
                first.parse::<usize>().expect("CPU")..=last.parse::<usize>().expect("CPU")
            }
            None => {
                let cpu = part.parse::<usize>().expect("CPU");
                cpu..=cpu
            }
        })
        .collect()
}

fn spawn_gateway(args: &[String], log: &Path) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gateway"));
    command.args(args).env("GATEWAY_LOG", "info,gateway=debug");
    Process::spawn("gateway", command, log).expect("start the gateway binary")
}

/// A TLS connection through the gateway, with the certificate the server presented.
pub struct TlsClient {
    pub stream: TlsStream<TcpStream>,
    pub peer_certificate: CertificateDer<'static>,
}

impl TlsClient {
    /// Connects and completes the TLS handshake (verifying against the test CA as `localhost`).
    pub async fn connect(pki: &Pki, address: SocketAddr) -> std::io::Result<TlsClient> {
        tokio::time::timeout(REQUEST_DEADLINE, async {
            let tcp = TcpStream::connect(address).await?;
            let name = ServerName::try_from("localhost").unwrap();
            let stream = pki.connector().connect(name, tcp).await?;
            let peer_certificate = stream
                .get_ref()
                .1
                .peer_certificates()
                .expect("server sent a certificate")[0]
                .clone();
            Ok(TlsClient {
                stream,
                peer_certificate,
            })
        })
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS connect timed out"))?
    }

    /// Sends a keep-alive GET and reads one `Content-Length` response; returns the body.
    pub async fn get(&mut self, path: &str) -> std::io::Result<String> {
        tokio::time::timeout(REQUEST_DEADLINE, async {
            let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
            self.stream.write_all(request.as_bytes()).await?;
            read_response(&mut self.stream).await
        })
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out"))?
    }
}

async fn read_response<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed mid-response",
            ));
        }
        buffer.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&buffer).into_owned();
        let Some(header_end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length = text[..header_end]
            .lines()
            .find_map(|line| {
                line.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            })
            .expect("response has Content-Length");
        if buffer.len() >= header_end + 4 + length {
            return Ok(text[header_end + 4..header_end + 4 + length].to_string());
        }
    }
}

/// One request on a new connection through the gateway: returns the backend name that answered
/// and checks that the certificate seen by the client is that backend's own (TLS passthrough).
pub async fn request_backend(
    pki: &Pki,
    gateway: SocketAddr,
    backends: &[&Nginx],
) -> std::io::Result<String> {
    let mut client = TlsClient::connect(pki, gateway).await?;
    let body = client.get("/").await?;
    let name = body.trim().to_string();
    let backend = backends
        .iter()
        .find(|backend| backend.name == name)
        .unwrap_or_else(|| panic!("unknown backend answered: {name:?}"));
    assert_eq!(
        client.peer_certificate, backend.identity.der,
        "the client must see the certificate of the backend that answered (TLS passthrough)"
    );
    Ok(name)
}

/// A plain HTTP/1.1 request to the admin API; returns status and body.
pub async fn http_request(
    address: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    tokio::time::timeout(REQUEST_DEADLINE, async {
        let mut stream = TcpStream::connect(address).await?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text.get(9..12).and_then(|code| code.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
        Ok((status, body))
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "admin request timed out"))?
}

pub async fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_request(address, "GET", path, "").await
}

/// A TOML configuration with one frontend, fast checks and the given backends.
pub fn config_toml(
    listen: SocketAddr,
    backends: &[&Nginx],
    extra_frontend: &str,
    extra_check: &str,
) -> String {
    let mut text = format!(
        "shutdown_grace = \"30s\"\n\n[[frontend]]\nname = \"api\"\nlisten = \"{listen}\"\n{extra_frontend}\n\n\
         [frontend.check]\nkind = \"https\"\npath = \"/readyz\"\ninterval = \"{}ms\"\nfall = {}\nrise = {}\nslow_start = \"0s\"\n{extra_check}\n",
        FAST_INTERVAL.as_millis(),
        FAST_FALL,
        FAST_RISE,
    );
    for backend in backends {
        text.push_str(&format!(
            "\n[[frontend.backend]]\nname = \"{}\"\naddress = \"{}\"\n",
            backend.name,
            backend.host_port()
        ));
    }
    text
}

/// Check interval used by tests that wait for state changes (HAProxy's default is 2 s).
pub const FAST_INTERVAL: Duration = Duration::from_millis(300);
/// `fall` used with [`FAST_INTERVAL`].
pub const FAST_FALL: u32 = 3;
/// `rise` used with [`FAST_INTERVAL`].
pub const FAST_RISE: u32 = 2;
