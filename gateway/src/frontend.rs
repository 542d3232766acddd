//! Frontends: listeners, their accept loops and one generation of its service stack.
//!
//! A generation is built from one [`FrontendConfig`]: backends (reused from the previous
//! generation when their address, limits and check are unchanged), the balancer fed by
//! Discover, the connector, and the per-connection service
//! `LoadShed(ConcurrencyLimit(ProxyService))`. A frontend has one listener, or one per relay
//! thread (`--threads`, see [`crate::relays`]), each with an accept loop on its thread that
//! runs the connections it accepts. The loops share the connector (balancer and redispatch)
//! and the concurrency limit's semaphore, so the connection limit is the frontend's; each has
//! its own copy of the proxy service ([`ProxyService::for_accept_loop`]), so what a new
//! connection takes a reference on (its settings, metrics and shutdown token) is its own relay
//! thread's. A reload stops the accept loops, takes their listeners back (so the sockets
//! are never closed when the address stays the same) and starts the next generation on them,
//! each on the same thread, setting the generation's TCP options on the listeners for the
//! connections they accept to inherit (see [`crate::net`]). Connections of the old generation
//! keep running: their futures own everything they need.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::limit::{ConcurrencyLimit, GlobalConcurrencyLimitLayer};
use tower::load_shed::LoadShed;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::backend::{checks, Backend};
use crate::balance::{self, EndpointChange};
use crate::config::FrontendConfig;
use crate::endpoint::Endpoint;
use crate::health::SharedProber;
use crate::metrics::{FrontendMetrics, Metrics};
use crate::net;
use crate::proxy::{self, ClientConnection, ProxyError, ProxyService, ProxySettings};
use crate::relays::RelayPool;

/// Pause after a failed `accept` (usually EMFILE: out of file descriptors) so the loop does not
/// spin while connections close and free descriptors.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// State shared by every frontend of the process.
#[derive(Clone)]
pub struct Shared {
    /// Metric families.
    pub metrics: Arc<Metrics>,
    /// Every relayed connection, for draining on shutdown.
    pub connections: TaskTracker,
    /// Cancelled at the shutdown deadline: closes the remaining relays.
    pub shutdown: CancellationToken,
    /// Seed of the p2c generators (fixed for reproducible runs, random otherwise).
    pub seed: u64,
    /// Where the accept loops, and so the connections, run (`--threads`).
    pub relays: Arc<RelayPool>,
}

/// A backend and the token that stops its health checks.
#[derive(Debug)]
pub struct BackendEntry {
    /// The backend.
    pub backend: Arc<Backend>,
    check_stop: CancellationToken,
}

impl BackendEntry {
    /// Stops the backend's health checks.
    pub fn stop_checks(&self) {
        self.check_stop.cancel();
    }
}

/// One running frontend generation.
pub struct Frontend {
    config: FrontendConfig,
    backends: Vec<BackendEntry>,
    accept_stop: CancellationToken,
    accept_tasks: Vec<JoinHandle<TcpListener>>,
    _discovery: mpsc::Sender<EndpointChange>,
}

impl Frontend {
    /// Starts a generation on `listeners`, the `i`-th registered for thread `i` of the relay
    /// pool ([`RelayPool::register`]). Backends of `previous` whose identity is unchanged are
    /// reused (with their health state and counts); the others stop their checks.
    pub fn start(
        config: FrontendConfig,
        prober: SharedProber,
        listeners: Vec<TcpListener>,
        previous: Vec<BackendEntry>,
        previous_config: Option<&FrontendConfig>,
        shared: &Shared,
    ) -> Frontend {
        let backends =
            reconcile_backends(&config, prober, previous, previous_config, &shared.metrics);
        let endpoints = backends
            .iter()
            .map(|entry| {
                let endpoint = Endpoint::new(
                    Arc::clone(&entry.backend),
                    config.connect_timeout,
                    config.socket_options(),
                );
                (entry.backend.name().to_string(), endpoint)
            })
            .collect();
        let (discover, discovery) = balance::discover(endpoints);
        let seed = shared.seed ^ name_hash(&config.name);
        let balancer = balance::balancer(config.balance, discover, seed);
        let eligible: Arc<[Arc<Backend>]> = backends
            .iter()
            .map(|entry| Arc::clone(&entry.backend))
            .collect();
        let available = move || eligible.iter().any(|backend| backend.is_eligible());
        let connector = proxy::connector(balancer, available, config.retries);
        let settings = ProxySettings {
            idle_timeout: config.idle_timeout,
            queue_timeout: config.queue_timeout,
            connect_timeout: config.connect_timeout,
            retries: config.retries,
            tcp_keepalive: config.tcp_keepalive,
        };
        let metrics = shared.metrics.frontend(&config.name);
        let proxy = ProxyService::new(
            connector,
            settings,
            shared.shutdown.clone(),
            Arc::clone(&metrics),
        );
        let limit = Arc::new(Semaphore::new(config.max_connections));
        let accept_stop = CancellationToken::new();
        let accept_tasks = listeners
            .into_iter()
            .enumerate()
            .map(|(index, listener)| {
                net::configure_listener(&listener, config.socket_options());
                let service = ServiceBuilder::new()
                    .load_shed()
                    .layer(GlobalConcurrencyLimitLayer::with_semaphore(Arc::clone(
                        &limit,
                    )))
                    .service(proxy.for_accept_loop());
                let accept = AcceptLoop {
                    listener,
                    service,
                    stop: accept_stop.clone(),
                    connections: shared.connections.clone(),
                    reporter: Arc::new(Reporter {
                        frontend: config.name.clone(),
                        metrics: Arc::clone(&metrics),
                    }),
                };
                shared.relays.spawn_accept(index, accept.run())
            })
            .collect();
        tracing::info!(frontend = %config.name, listen = %config.listen, backends = backends.len(), "frontend started");
        Frontend {
            config,
            backends,
            accept_stop,
            accept_tasks,
            _discovery: discovery,
        }
    }

    /// The configuration of this generation.
    pub fn config(&self) -> &FrontendConfig {
        &self.config
    }

    /// The backends of this generation.
    pub fn backends(&self) -> impl Iterator<Item = &Arc<Backend>> {
        self.backends.iter().map(|entry| &entry.backend)
    }

    /// Stops accepting and returns the listeners (in their threads' order) and backends
    /// (checks still running) for the next generation. Established connections are not touched.
    pub async fn stop(self) -> (Vec<TcpListener>, Vec<BackendEntry>, FrontendConfig) {
        self.accept_stop.cancel();
        let mut listeners = Vec::with_capacity(self.accept_tasks.len());
        for accept_task in self.accept_tasks {
            listeners.push(accept_task.await.expect("accept loop does not panic"));
        }
        (listeners, self.backends, self.config)
    }
}

fn name_hash(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    hasher.finish()
}

/// Whether a backend built under `old` can serve as `new`'s backend of the same name.
fn reusable(
    old: &FrontendConfig,
    new: &FrontendConfig,
    backend: &Backend,
    wanted: &crate::config::BackendConfig,
) -> bool {
    let current = backend.config();
    current.address == wanted.address
        && current.check_address == wanted.check_address
        && current.max_connections == wanted.max_connections
        && old.check == new.check
        && old.balance == new.balance
        && old.on_marked_down == new.on_marked_down
}

fn reconcile_backends(
    config: &FrontendConfig,
    prober: SharedProber,
    previous: Vec<BackendEntry>,
    previous_config: Option<&FrontendConfig>,
    metrics: &Metrics,
) -> Vec<BackendEntry> {
    let mut previous: HashMap<String, BackendEntry> = previous
        .into_iter()
        .map(|entry| (entry.backend.name().to_string(), entry))
        .collect();
    let mut entries = Vec::with_capacity(config.backends.len());
    for wanted in &config.backends {
        let old = previous.remove(&wanted.name);
        match (old, previous_config) {
            (Some(entry), Some(old_config))
                if reusable(old_config, config, &entry.backend, wanted) =>
            {
                let old_weight = old_config
                    .backends
                    .iter()
                    .find(|b| b.name == wanted.name)
                    .map(|b| b.weight);
                if old_weight != Some(wanted.weight) {
                    entry.backend.set_weight(wanted.weight);
                }
                entries.push(entry);
            }
            (old, _) => {
                if let Some(entry) = old {
                    entry.stop_checks();
                }
                let backend = Backend::new(
                    config,
                    wanted.clone(),
                    metrics.backend(&config.name, &wanted.name),
                );
                let check_stop = CancellationToken::new();
                checks::spawn(
                    Arc::clone(&backend),
                    Arc::clone(&prober),
                    config.check.interval,
                    check_stop.clone(),
                );
                entries.push(BackendEntry {
                    backend,
                    check_stop,
                });
            }
        }
    }
    for entry in previous.values() {
        entry.stop_checks();
    }
    entries
}

type FrontendService = LoadShed<ConcurrencyLimit<ProxyService>>;

struct AcceptLoop {
    listener: TcpListener,
    service: FrontendService,
    stop: CancellationToken,
    connections: TaskTracker,
    reporter: Arc<Reporter>,
}

/// What an accept loop's connections report a rejection with: one per accept loop, so the
/// reference count a connection takes is on its own relay thread's memory.
struct Reporter {
    frontend: String,
    metrics: Arc<FrontendMetrics>,
}

impl AcceptLoop {
    async fn run(mut self) -> TcpListener {
        loop {
            let accepted = tokio::select! {
                _ = self.stop.cancelled() => return self.listener,
                accepted = self.listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(frontend = %self.reporter.frontend, %error, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    continue;
                }
            };
            self.reporter.metrics.connections.inc();
            let service = match self.service.ready().await {
                Ok(service) => service,
                Err(error) => {
                    tracing::error!(frontend = %self.reporter.frontend, %error, "frontend service failed");
                    continue;
                }
            };
            let connection = service.call(ClientConnection { stream, peer });
            let reporter = Arc::clone(&self.reporter);
            // On this thread's runtime: the connection is relayed where it was accepted.
            self.connections.spawn(async move {
                if let Err(error) = connection.await {
                    report_rejection(&reporter.frontend, peer, &reporter.metrics, error);
                }
            });
        }
    }
}

fn report_rejection(
    frontend: &str,
    peer: std::net::SocketAddr,
    metrics: &FrontendMetrics,
    error: crate::BoxError,
) {
    if error.is::<tower::load_shed::error::Overloaded>() {
        metrics.rejected_max_connections.inc();
        tracing::debug!(%frontend, client = %peer, "closed: frontend max_connections reached");
        return;
    }
    match error.downcast_ref::<ProxyError>() {
        Some(ProxyError::NoHealthyBackend) => {
            tracing::debug!(%frontend, client = %peer, "closed: no healthy backend")
        }
        _ => tracing::info!(%frontend, client = %peer, %error, "closed without a backend"),
    }
}
