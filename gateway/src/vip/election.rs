//! etcd's election recipe over the plain KV, Lease and Watch APIs.
//!
//! This is the algorithm of etcd's `client/v3/concurrency` `Election`, written against the v3
//! API only, so it runs on the store (which has no `v3election` service) and on etcd alike:
//!
//! 1. **Lease.** The candidate grants a lease of the configured TTL and keeps it alive from a
//!    task of its own ([`keep_alive`]), which publishes each proof of life
//!    ([`LeaseState::Alive`], see `super::fence`) on a watch channel.
//! 2. **Key.** It creates `<prefix>/<lease id in hex>` attached to the lease, in a transaction
//!    guarded by `create_revision(key) == 0`, so a retry never moves an existing key to the back
//!    of the queue. The key's create revision is its place in the queue.
//! 3. **Wait.** The holder is the key with the lowest create revision under the prefix. A
//!    candidate looks up the key created just before its own (`max_create_revision = own - 1`,
//!    sorted by create revision, descending, limit 1) and watches that one key for its deletion,
//!    starting at the revision of the lookup + 1 so that no deletion is missed; then it looks
//!    again. With no earlier key left, it holds. Each candidate watches one predecessor, so a
//!    holder's departure wakes one candidate, not all of them.
//! 4. **Leave.** Revoking the lease deletes the key at once (resigning, shutdown); a dead
//!    candidate's key goes when its lease expires, at most one TTL after its last keep-alive.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
    WatchStream,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::error::ElectionError;
use super::fence::{renew_interval, LeaseProof};
use crate::config::VipConfig;

/// Deadline of one unary request to the store (grant, transaction, range, revoke, watch
/// creation): a healthy store answers in milliseconds, a partitioned one never.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline of the TCP (and TLS) connect to one store member.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 ping interval on the store connection, so a dead member is noticed and the
/// balanced channel moves to another one.
pub const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(2);
/// How long an HTTP/2 ping may stay unanswered.
pub const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause before reopening a broken keep-alive stream: short, since the lease's TTL runs.
pub const KEEPALIVE_REOPEN_PAUSE: Duration = Duration::from_millis(100);

/// What the keep-alive task knows about the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Provably alive until `proof.alive_until`.
    Alive(LeaseProof),
    /// Gone: the store said so, or the last proof ran out without a new one.
    Expired,
}

/// One client per configured store member (each dials lazily, on its first request), in
/// order starting with member `first` (modulo their number).
///
/// One client per member rather than one balanced channel over all of them: a balanced channel
/// keeps sending part of the requests to a member it cannot connect to (a blackholed member
/// fails every one of them), while a candidate that moves to the next member after a failure
/// converges on a member that works.
pub async fn connect(config: &VipConfig, first: usize) -> Result<Vec<Client>, ElectionError> {
    let count = config.endpoints.len();
    let mut clients = Vec::with_capacity(count);
    for offset in 0..count {
        let endpoint = &config.endpoints[(first + offset) % count];
        clients.push(connect_one(config, endpoint).await?);
    }
    Ok(clients)
}

async fn connect_one(config: &VipConfig, endpoint: &str) -> Result<Client, ElectionError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(HTTP2_PING_INTERVAL, HTTP2_PING_TIMEOUT)
        .with_keep_alive_while_idle(true);
    if let Some(tls) = &config.tls {
        let mut tls_options = TlsOptions::new();
        if let Some(ca) = &tls.ca_file {
            tls_options = tls_options.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let Some((cert, key)) = &tls.client_cert {
            tls_options = tls_options.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        options = options.with_tls(tls_options);
    }
    Client::connect([endpoint], Some(options))
        .await
        .map_err(|source| ElectionError::Store {
            operation: "connect to the store",
            source,
        })
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, ElectionError> {
    std::fs::read(path).map_err(|source| ElectionError::TlsFile {
        path: path.to_path_buf(),
        source,
    })
}

/// Runs a store request with [`REQUEST_TIMEOUT`].
async fn request<T>(
    operation: &'static str,
    future: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ElectionError> {
    tokio::time::timeout(REQUEST_TIMEOUT, future)
        .await
        .map_err(|_| ElectionError::Timeout {
            operation,
            timeout: REQUEST_TIMEOUT,
        })?
        .map_err(|source| ElectionError::Store { operation, source })
}

/// One candidacy: a lease, its keep-alive task and the election key. Requests go to the first
/// client; the keep-alive task and the own-key watch move through the others when one fails.
pub struct Candidacy {
    client: Client,
    clients: Vec<Client>,
    lease_id: i64,
    prefix: String,
    key: String,
    create_revision: i64,
    lease: watch::Receiver<LeaseState>,
    keeper: JoinHandle<()>,
}

impl Drop for Candidacy {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl Candidacy {
    /// Grants the lease, starts keeping it alive and creates the election key (steps 1 and 2).
    pub async fn join(
        clients: Vec<Client>,
        config: &VipConfig,
    ) -> Result<Candidacy, ElectionError> {
        let mut client = clients
            .first()
            .cloned()
            .ok_or(ElectionError::MalformedAnswer("connect: no store endpoint"))?;
        let ttl_seconds = i64::try_from(config.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        let sent = Instant::now();
        let grant = request(
            "grant the election lease",
            client.lease_grant(ttl_seconds, None),
        )
        .await?;
        if grant.ttl() != ttl_seconds {
            return Err(ElectionError::UnexpectedTtl {
                requested: ttl_seconds,
                granted: grant.ttl(),
            });
        }
        let proof = LeaseProof::new(sent, config.lease_ttl);
        let (state, lease) = watch::channel(LeaseState::Alive(proof));
        let keeper = tokio::spawn(keep_alive(
            clients.clone(),
            grant.id(),
            config.lease_ttl,
            state,
        ));
        let mut candidacy = Candidacy {
            client,
            clients,
            lease_id: grant.id(),
            prefix: config.prefix.clone(),
            key: format!("{}/{:x}", config.prefix, grant.id()),
            create_revision: 0,
            lease,
            keeper,
        };
        candidacy.create_revision = candidacy.create_key(&config.name).await?;
        Ok(candidacy)
    }

    /// The lease id.
    pub fn lease_id(&self) -> i64 {
        self.lease_id
    }

    /// The lease's state, as the keep-alive task proves it.
    pub fn lease(&self) -> watch::Receiver<LeaseState> {
        self.lease.clone()
    }

    /// Creates the key unless it exists; returns its create revision.
    async fn create_key(&mut self, name: &str) -> Result<i64, ElectionError> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                self.key.as_str(),
                name,
                Some(PutOptions::new().with_lease(self.lease_id)),
            )])
            .or_else([TxnOp::get(self.key.as_str(), None)]);
        let response = request("create the election key", self.client.txn(txn)).await?;
        if response.succeeded() {
            return response
                .header()
                .map(|header| header.revision())
                .ok_or(ElectionError::MalformedAnswer("create the election key"));
        }
        match response.op_responses().first() {
            Some(TxnOpResponse::Get(get)) => {
                get.kvs().first().map(|kv| kv.create_revision()).ok_or(
                    ElectionError::MalformedAnswer("read the existing election key"),
                )
            }
            _ => Err(ElectionError::MalformedAnswer(
                "read the existing election key",
            )),
        }
    }

    /// Waits until this candidate's key is the oldest under the prefix (step 3). Reports the
    /// current holder's name through `on_holder` on each look.
    pub async fn wait_for_turn(
        &self,
        on_holder: impl Fn(Option<String>),
    ) -> Result<(), ElectionError> {
        let mut client = self.client.clone();
        let range = format!("{}/", self.prefix);
        loop {
            let options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1)
                .with_max_create_revision(self.create_revision - 1);
            let earlier = request(
                "look up the previous candidate",
                client.get(range.as_str(), Some(options)),
            )
            .await?;
            let Some(predecessor) = earlier.kvs().first() else {
                return self.confirm_own_key().await;
            };
            let revision = earlier.header().map(|header| header.revision()).ok_or(
                ElectionError::MalformedAnswer("look up the previous candidate"),
            )?;
            on_holder(self.holder_name().await?);
            let key = String::from_utf8_lossy(predecessor.key()).into_owned();
            let mut watch = KeyWatch::open(&mut client, key, revision + 1).await?;
            watch.deleted().await?;
        }
    }

    /// After the wait: the own key must still be there with its create revision (a lease that
    /// expired during the wait took the key with it).
    async fn confirm_own_key(&self) -> Result<(), ElectionError> {
        let mut client = self.client.clone();
        let own = request(
            "read the own election key",
            client.get(self.key.as_str(), None),
        )
        .await?;
        match own.kvs().first() {
            Some(kv) if kv.create_revision() == self.create_revision => Ok(()),
            _ => Err(ElectionError::WatchEnded {
                key: self.key.clone(),
                reason: "the own election key is gone".to_string(),
            }),
        }
    }

    /// The holder's name: the value of the oldest key under the prefix.
    pub async fn holder_name(&self) -> Result<Option<String>, ElectionError> {
        let mut client = self.client.clone();
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let range = format!("{}/", self.prefix);
        let first = request(
            "look up the holder",
            client.get(range.as_str(), Some(options)),
        )
        .await?;
        Ok(first
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    /// A watch that reports the deletion of the own key (from its creation on); `attempt`
    /// picks the member (0: the first, then the next ones in turn).
    pub async fn watch_own_key(&self, attempt: usize) -> Result<KeyWatch, ElectionError> {
        let mut client = self.clients[attempt % self.clients.len()].clone();
        KeyWatch::open(&mut client, self.key.clone(), self.create_revision + 1).await
    }

    /// Revokes the lease, which deletes the key (step 4). Failures are logged: the lease then
    /// expires by itself within one TTL.
    pub async fn resign(self) {
        let mut client = self.client.clone();
        if let Err(error) = request(
            "revoke the election lease",
            client.lease_revoke(self.lease_id),
        )
        .await
        {
            tracing::warn!(%error, lease = format!("{:x}", self.lease_id), "resigning failed, the lease expires by itself");
        }
    }
}

/// A watch of one key, waiting for its deletion.
pub struct KeyWatch {
    key: String,
    stream: WatchStream,
}

impl KeyWatch {
    /// Watches `key` from `start_revision` on.
    pub async fn open(
        client: &mut Client,
        key: String,
        start_revision: i64,
    ) -> Result<KeyWatch, ElectionError> {
        let options = WatchOptions::new().with_start_revision(start_revision);
        let stream = request(
            "watch an election key",
            client.watch(key.as_str(), Some(options)),
        )
        .await?;
        Ok(KeyWatch { key, stream })
    }

    /// Returns when the key is deleted; an error when the watch ends first. Cancel-safe.
    pub async fn deleted(&mut self) -> Result<(), ElectionError> {
        loop {
            let message = self
                .stream
                .message()
                .await
                .map_err(|source| ElectionError::Store {
                    operation: "watch an election key",
                    source,
                })?;
            let Some(response) = message else {
                return Err(self.ended("the store closed the stream"));
            };
            if response.canceled() {
                let reason = format!("cancelled by the store: {}", response.cancel_reason());
                return Err(self.ended(&reason));
            }
            if response
                .events()
                .iter()
                .any(|event| event.event_type() == EventType::Delete)
            {
                return Ok(());
            }
        }
    }

    fn ended(&self, reason: &str) -> ElectionError {
        ElectionError::WatchEnded {
            key: self.key.clone(),
            reason: reason.to_string(),
        }
    }
}

/// Keeps lease `id` alive, one keep-alive every `TTL / RENEW_DIVISOR`, publishing each proof.
/// A broken or silent stream is reopened on the next member until the last proof runs out;
/// then, or when the store answers TTL 0, the lease is `Expired`.
async fn keep_alive(
    clients: Vec<Client>,
    id: i64,
    ttl: Duration,
    state: watch::Sender<LeaseState>,
) {
    let interval = renew_interval(ttl);
    let mut attempt = 0usize;
    loop {
        let mut client = clients[attempt % clients.len()].clone();
        attempt += 1;
        let LeaseState::Alive(proof) = *state.borrow() else {
            return;
        };
        if Instant::now() >= proof.alive_until {
            state.send_replace(LeaseState::Expired);
            return;
        }
        if let Ok(Ok((mut keeper, mut stream))) =
            tokio::time::timeout(REQUEST_TIMEOUT, client.lease_keep_alive(id)).await
        {
            loop {
                let sent = Instant::now();
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match tokio::time::timeout(interval, stream.message()).await {
                    Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                        let granted = Duration::from_secs(answer.ttl().unsigned_abs());
                        state.send_replace(LeaseState::Alive(LeaseProof::new(sent, granted)));
                    }
                    Ok(Ok(Some(_))) => {
                        state.send_replace(LeaseState::Expired);
                        return;
                    }
                    _ => break,
                }
                tokio::time::sleep_until(sent + interval).await;
            }
        }
        tokio::time::sleep(KEEPALIVE_REOPEN_PAUSE).await;
    }
}
