//! The supervisor: applies configurations, reloads them and shuts the gateway down.
//!
//! **Reload** (SIGHUP, or the configuration file's content changing) happens in the running
//! process, so there is never a second generation of processes holding old connections (the
//! HAProxy pile-up of openshift/machine-config-operator#1274). A reload is two-phase:
//! *prepare* parses the file, builds every health-check TLS client and binds every new listen
//! address; any failure there leaves the running configuration untouched and is logged with
//! the line at fault. *Commit* then swaps frontend generations, keeping listeners whose address
//! is unchanged and backends whose identity is unchanged. Established connections are never
//! touched by a reload.
//!
//! **Shutdown** (SIGTERM or SIGINT): stop accepting on every listener, let established
//! connections finish until `shutdown_grace`, then close the rest and exit.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin;
use crate::backend::{AdminState, Directory};
use crate::config::{Config, ConfigError, FrontendConfig, VipConfig};
use crate::frontend::{BackendEntry, Frontend, Shared};
use crate::health::{Prober, SharedProber, TlsSetupError};
use crate::metrics::Metrics;
use crate::net;
use crate::relays::RelayPool;
use crate::vip::{Controller, HealthProbe, VipMonitor};

/// How long shutdown waits for the VIP to be released and the election lease revoked: two
/// `ip` commands and one store request, each bounded by its own (shorter) deadline.
pub const VIP_RELEASE_WAIT: Duration = Duration::from_secs(5);
/// How often the configuration file is read to detect changes. Reading a small file once a
/// second costs nothing and needs no inotify dependency; SIGHUP reloads at once.
pub const CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// After the drain deadline, how long closing the remaining relays may take before exit.
pub const FORCED_CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Why a configuration could not be applied (the running one stays).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The configuration itself is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A health-check TLS file could not be loaded.
    #[error("frontend {frontend}: {source}")]
    Tls {
        /// Frontend name.
        frontend: String,
        /// The TLS error.
        source: TlsSetupError,
    },
    /// A listen address could not be bound.
    #[error("frontend {frontend}: cannot listen on {address}: {source}")]
    Bind {
        /// Frontend name.
        frontend: String,
        /// The address.
        address: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Why the gateway could not run.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The initial configuration was refused.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// The admin listener could not be bound.
    #[error("cannot listen on admin address {address}: {source}")]
    AdminBind {
        /// The address.
        address: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Where the configuration comes from.
#[derive(Debug, Clone)]
pub enum ConfigSource {
    /// A TOML file, reloadable.
    File(PathBuf),
    /// Built from flags; not reloadable.
    Flags(Box<Config>),
}

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The configuration.
    pub source: ConfigSource,
    /// Admin address overriding the configuration's (`Some(None)` disables the admin API).
    pub admin: Option<Option<SocketAddr>>,
    /// Fixed p2c seed (random when `None`).
    pub seed: Option<u64>,
}

/// The running frontends.
pub struct Supervisor {
    frontends: Vec<Frontend>,
    shared: Shared,
    directory: Directory,
}

impl Supervisor {
    /// A supervisor with nothing running yet.
    pub fn new(shared: Shared) -> Self {
        Supervisor {
            frontends: Vec::new(),
            shared,
            directory: Directory::default(),
        }
    }

    /// The admin API's view of the backends.
    pub fn directory(&self) -> Directory {
        Arc::clone(&self.directory)
    }

    /// Binds a new frontend's listeners, one per relay thread, each registered with the
    /// reactor of the thread that will accept on it.
    async fn bind(&self, frontend: &FrontendConfig, on_vip: bool) -> io::Result<Vec<TcpListener>> {
        let relays = &self.shared.relays;
        let bound = net::bind_listeners(frontend.listen, on_vip, relays.listeners_per_frontend())?;
        let mut listeners = Vec::with_capacity(bound.len());
        for (index, listener) in bound.into_iter().enumerate() {
            listeners.push(relays.register(index, listener).await?);
        }
        Ok(listeners)
    }

    /// Applies `config`: prepares everything that can fail, then swaps generations.
    pub async fn apply(&mut self, config: &Config) -> Result<(), ApplyError> {
        let mut prepared = Vec::with_capacity(config.frontends.len());
        for frontend in &config.frontends {
            let prober: SharedProber = Arc::new(Prober::new(&frontend.check).map_err(
                |source| ApplyError::Tls {
                    frontend: frontend.name.clone(),
                    source,
                },
            )?);
            let reused = self
                .frontends
                .iter()
                .any(|running| running.config().listen == frontend.listen);
            let on_vip = config
                .vip
                .as_ref()
                .is_some_and(|vip| frontend.listen.ip() == vip.address);
            let listeners = if reused {
                None
            } else {
                Some(
                    self.bind(frontend, on_vip)
                        .await
                        .map_err(|source| ApplyError::Bind {
                            frontend: frontend.name.clone(),
                            address: frontend.listen,
                            source,
                        })?,
                )
            };
            prepared.push((frontend.clone(), prober, listeners));
        }
        let mut listeners: HashMap<SocketAddr, Vec<TcpListener>> = HashMap::new();
        let mut previous: HashMap<String, (Vec<BackendEntry>, FrontendConfig)> = HashMap::new();
        for running in self.frontends.drain(..) {
            let (listener, backends, old_config) = running.stop().await;
            listeners.insert(old_config.listen, listener);
            previous.insert(old_config.name.clone(), (backends, old_config));
        }
        for (frontend, prober, bound) in prepared {
            let bound = bound
                .or_else(|| listeners.remove(&frontend.listen))
                .expect("prepare bound or found the listeners of every frontend");
            let (backends, old_config) = previous
                .remove(&frontend.name)
                .map_or((Vec::new(), None), |(b, c)| (b, Some(c)));
            let started = Frontend::start(
                frontend,
                prober,
                bound,
                backends,
                old_config.as_ref(),
                &self.shared,
            );
            self.frontends.push(started);
        }
        for (backends, _) in previous.values() {
            backends.iter().for_each(BackendEntry::stop_checks);
        }
        let all = self
            .frontends
            .iter()
            .flat_map(|frontend| frontend.backends().cloned())
            .collect();
        *self.directory.write().expect("directory lock poisoned") = all;
        Ok(())
    }

    /// Stops accepting, drains connections until `grace`, closes the rest.
    pub async fn shutdown(mut self, grace: Duration) {
        tracing::info!(
            ?grace,
            "shutting down: no new connections, draining established ones"
        );
        let mut backends = Vec::new();
        for frontend in self.frontends.drain(..) {
            let (listeners, entries, _) = frontend.stop().await;
            drop(listeners);
            backends.extend(entries);
        }
        let connections = self.shared.connections.clone();
        connections.close();
        if tokio::time::timeout(grace, connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = connections.len(),
                "drain deadline passed, closing remaining connections"
            );
            self.shared.shutdown.cancel();
            let _ = tokio::time::timeout(FORCED_CLOSE_WAIT, connections.wait()).await;
        }
        backends.iter().for_each(BackendEntry::stop_checks);
        tracing::info!("shutdown complete");
    }
}

fn read_config(source: &ConfigSource) -> Result<(Config, Option<String>), ConfigError> {
    match source {
        ConfigSource::Flags(config) => Ok((config.as_ref().clone(), None)),
        ConfigSource::File(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            Ok((Config::from_toml(&text)?, Some(text)))
        }
    }
}

/// Runs the gateway until SIGTERM/SIGINT, its connections spawned through `relays`; returns
/// after the drain.
pub async fn run(options: RunOptions, relays: RelayPool) -> Result<(), GatewayError> {
    let (mut config, mut last_text) = read_config(&options.source).map_err(ApplyError::from)?;
    let metrics = Arc::new(Metrics::new());
    let shared = Shared {
        metrics: Arc::clone(&metrics),
        connections: TaskTracker::new(),
        shutdown: CancellationToken::new(),
        seed: options.seed.unwrap_or_else(rand::random),
        relays: Arc::new(relays),
    };
    let mut terminate = signal(SignalKind::terminate()).map_err(GatewayError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(GatewayError::Signals)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(GatewayError::Signals)?;
    let mut supervisor = Supervisor::new(shared);
    supervisor.apply(&config).await?;
    let vip = config
        .vip
        .clone()
        .map(|vip_config| start_vip(vip_config, &metrics, supervisor.directory()));
    let admin_stop = CancellationToken::new();
    let admin_address = options.admin.unwrap_or(config.admin_listen);
    if let Some(address) = admin_address {
        let listener = net::bind_listener(address)
            .map_err(|source| GatewayError::AdminBind { address, source })?;
        let context = admin::AdminContext::new(Arc::clone(&metrics), supervisor.directory())
            .with_vip(vip.as_ref().map(|running| Arc::clone(&running.monitor)));
        tokio::spawn(admin::serve(listener, context, admin_stop.clone()));
        tracing::info!(%address, "admin API listening");
    }
    let path = match &options.source {
        ConfigSource::File(path) => Some(path.clone()),
        ConfigSource::Flags(_) => None,
    };
    let mut poll = tokio::time::interval(CONFIG_POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!("gateway running");
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => match &path {
                Some(path) => reload(&mut supervisor, &metrics, path, &mut config, &mut last_text, true).await,
                None => tracing::info!("SIGHUP ignored: configuration comes from flags"),
            },
            _ = poll.tick(), if path.is_some() => {
                let path = path.as_ref().expect("guarded by the select condition");
                reload(&mut supervisor, &metrics, path, &mut config, &mut last_text, false).await;
            }
        }
    }
    if let Some(running) = vip {
        running.stop().await;
    }
    admin_stop.cancel();
    supervisor.shutdown(config.shutdown_grace).await;
    Ok(())
}

/// The running VIP controller.
struct RunningVip {
    monitor: Arc<VipMonitor>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl RunningVip {
    /// Releases the VIP first on shutdown, so the next holder takes over while this gateway
    /// drains its connections.
    async fn stop(self) {
        self.stop.cancel();
        if tokio::time::timeout(VIP_RELEASE_WAIT, self.task)
            .await
            .is_err()
        {
            tracing::warn!(wait = ?VIP_RELEASE_WAIT, "the VIP controller did not stop in time; the address lifetime ends the VIP");
        }
    }
}

fn start_vip(config: VipConfig, metrics: &Metrics, directory: Directory) -> RunningVip {
    let monitor = Arc::new(VipMonitor::new(&config, metrics.vip()));
    let stop = CancellationToken::new();
    let healthy: HealthProbe = Arc::new(move || any_backend_up(&directory));
    tracing::info!(vip = %config.address, interface = %config.interface, name = %config.name, "competing for the VIP");
    let controller = Controller::new(config, Arc::clone(&monitor), healthy, stop.clone());
    RunningVip {
        monitor,
        stop,
        task: tokio::spawn(controller.run()),
    }
}

/// The VIP's health: some backend is up by its checks and enabled by the operator.
fn any_backend_up(directory: &Directory) -> bool {
    directory
        .read()
        .expect("directory lock poisoned")
        .iter()
        .map(|backend| backend.status())
        .any(|status| status.health == "up" && status.admin == AdminState::Enabled)
}

/// Reloads from `path` when forced (SIGHUP) or when its content changed since the last attempt.
async fn reload(
    supervisor: &mut Supervisor,
    metrics: &Metrics,
    path: &std::path::Path,
    config: &mut Config,
    last_text: &mut Option<String>,
    forced: bool,
) {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) => {
            if forced {
                tracing::error!(path = %path.display(), %error, "reload failed, keeping the running configuration");
                metrics.reload(false);
            }
            return;
        }
    };
    if !forced && last_text.as_deref() == Some(text.as_str()) {
        return;
    }
    *last_text = Some(text.clone());
    let result = match Config::from_toml(&text) {
        Ok(mut next) => {
            if next.vip != config.vip {
                tracing::warn!(
                    "the [vip] section changes only on restart; keeping the running VIP"
                );
                next.vip = config.vip.clone();
            }
            supervisor.apply(&next).await.map(|()| next)
        }
        Err(error) => Err(ApplyError::Config(error)),
    };
    match result {
        Ok(next) => {
            if next.admin_listen != config.admin_listen {
                tracing::warn!("the admin address changes only on restart");
            }
            *config = next;
            metrics.reload(true);
            tracing::info!(path = %path.display(), "configuration reloaded");
        }
        Err(error) => {
            metrics.reload(false);
            tracing::error!(path = %path.display(), "reload failed, keeping the running configuration: {error}");
        }
    }
}
