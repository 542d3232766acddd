//! etcd's authentication and authorization: users, roles, key permissions,
//! tokens, and the checks every request passes.
//!
//! Layout:
//! - [`state`]: the replicated auth state and etcd's rules for changing it;
//! - [`perm`]: key-range permission coverage;
//! - [`token`]: simple and JWT tokens;
//!
//! The `etcdserverpb.Auth` gRPC service is `crate::server::v3rpc::auth`.
//!
//! Where checks happen (as in etcd):
//! - Writes (Put, DeleteRange, Txn, LeaseRevoke) and auth changes carry the
//!   sender's [`AuthInfo`] inside the Raft command and are checked when
//!   applied, against the auth state at that point of the log, so every
//!   member decides the same and a request racing an auth change is judged
//!   consistently (a stale auth revision is refused with
//!   `auth: revision in header is old`, code Unknown, as etcd 3.5.1 sends it).
//! - Reads (Range, read-only Txn, Watch creation, UserGet/RoleGet/...) are
//!   checked by the serving member against its applied auth state, after
//!   the read barrier for linearizable reads.
//! - Cluster membership changes need root (gRPC-mapped errors); the
//!   maintenance calls Defragment, Snapshot, Hash and HashKV need root and
//!   fail with etcd's raw `auth: ...` errors (code Unknown), as etcd 3.5's
//!   maintenance server returns them unconverted.
//!
//! The state is stored as one record in the `meta` table (written in the
//! same batch as the entry's applied id) and cached in memory.

pub mod perm;
pub mod state;
pub mod token;

use std::sync::{RwLock, RwLockReadGuard};

use etcd_proto::etcdserverpb::request_op::Request as Op;
use etcd_proto::etcdserverpb::{DeleteRangeRequest, PutRequest, TxnRequest};

use crate::codec;
use crate::engine::{EngineError, EngineRead, Table, WriteBatch};
use crate::errors::EtcdError;
use crate::lease::Lessor;
pub use perm::Access;
pub use state::{AuthCommand, AuthInfo, AuthState};
pub use token::TokenProvider;

/// Meta key of the auth state record.
pub const AUTH_STATE_KEY: &[u8] = b"auth/state";

/// etcd's default `--bcrypt-cost` (Go's `bcrypt.DefaultCost`).
pub const DEFAULT_BCRYPT_COST: u32 = 10;

/// What the state machine answers to an applied [`AuthCommand`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AuthReply {
    /// The change was applied.
    Done,
    /// Authenticate succeeded: the simple token registered on every member
    /// (None with JWT, where the serving member signs the token), and the
    /// auth revision it was issued at.
    Authenticated {
        /// The simple token.
        simple_token: Option<String>,
        /// The auth revision.
        revision: u64,
    },
}

/// A member's auth: the applied state, the token provider, the hash cost.
#[derive(Debug)]
pub struct AuthStore {
    state: RwLock<AuthState>,
    /// `--auth-token`.
    pub tokens: TokenProvider,
    /// `--bcrypt-cost`.
    pub bcrypt_cost: u32,
}

impl AuthStore {
    /// A store with the default (empty, disabled) state.
    pub fn new(tokens: TokenProvider, bcrypt_cost: u32) -> Self {
        Self {
            state: RwLock::new(AuthState::default()),
            tokens,
            bcrypt_cost,
        }
    }

    /// Loads the state from `engine` (start-up, snapshot install).
    pub fn load(&self, engine: &dyn EngineRead) -> Result<(), EngineError> {
        let state = match engine.get(Table::Meta, AUTH_STATE_KEY)? {
            Some(bytes) => codec::decode(&bytes)
                .map_err(|e| EngineError::corrupt(format!("auth state: {e}")))?,
            None => AuthState::default(),
        };
        *self.state.write().expect("auth lock") = state;
        Ok(())
    }

    /// The applied state.
    pub fn state(&self) -> RwLockReadGuard<'_, AuthState> {
        self.state.read().expect("auth lock")
    }

    /// True while auth is enabled.
    pub fn enabled(&self) -> bool {
        self.state().enabled
    }

    /// Applies `cmd` (sent by `by`, None for a member's own commands) at
    /// log `index`: returns the answer and, if the state changed, the
    /// state to [`install`](Self::install) once `batch` is durable.
    pub fn prepare(
        &self,
        cmd: &AuthCommand,
        by: Option<&AuthInfo>,
        index: u64,
        batch: &mut WriteBatch,
    ) -> Result<(AuthReply, Pending), EtcdError> {
        let mut next = self.state().clone();
        let applied = next.apply(cmd, by)?;
        let reply = match &applied {
            state::Applied::Authenticated { revision, .. } => {
                let simple_token = match (&self.tokens, cmd) {
                    (TokenProvider::Simple(_), AuthCommand::Authenticate { token_prefix, .. }) => {
                        Some(format!("{token_prefix}.{index}"))
                    }
                    _ => None,
                };
                AuthReply::Authenticated {
                    simple_token,
                    revision: *revision,
                }
            }
            _ => AuthReply::Done,
        };
        let changed = next != *self.state();
        if changed {
            batch.put(Table::Meta, AUTH_STATE_KEY.to_vec(), codec::encode(&next));
        }
        Ok((
            reply.clone(),
            Pending {
                state: changed.then_some(next),
                applied,
                reply,
            },
        ))
    }

    /// Makes a prepared change visible (after its batch was written).
    pub fn install(&self, pending: Pending) {
        if let Some(state) = pending.state {
            *self.state.write().expect("auth lock") = state;
        }
        let TokenProvider::Simple(simple) = &self.tokens else {
            return;
        };
        match pending.applied {
            state::Applied::InvalidateUser(user) => simple.invalidate_user(&user),
            state::Applied::DropAllTokens => simple.clear(),
            state::Applied::Authenticated { name, .. } => {
                if let AuthReply::Authenticated {
                    simple_token: Some(token),
                    ..
                } = pending.reply
                {
                    simple.insert(token, name);
                }
            }
            state::Applied::Done => {}
        }
    }

    /// The user and revision behind `token`.
    pub fn info_from_token(&self, token: &str) -> Result<AuthInfo, EtcdError> {
        match &self.tokens {
            TokenProvider::Simple(simple) => {
                let username = simple.user(token).ok_or(EtcdError::InvalidAuthToken)?;
                Ok(AuthInfo {
                    username,
                    revision: self.state().revision,
                })
            }
            TokenProvider::Jwt(jwt) => {
                let claims = jwt.verify(token).ok_or(EtcdError::InvalidAuthToken)?;
                Ok(AuthInfo {
                    username: claims.username,
                    revision: claims.revision,
                })
            }
        }
    }

    /// etcd's checks of a Put sent by `info` against the applied state
    /// (called by the state machine before applying it): write access to
    /// the key and to every key already on its lease, read access with
    /// `prev_kv`.
    pub fn check_put(
        &self,
        info: &AuthInfo,
        r: &PutRequest,
        lessor: &Lessor,
    ) -> Result<(), EtcdError> {
        let state = self.state();
        if skips_checks(&state, info) {
            return Ok(());
        }
        state.check_keys(info, Access::Write, &r.key, &[])?;
        check_lease_keys(&state, info, lessor, r.lease)?;
        if r.prev_kv {
            state.check_keys(info, Access::Read, &r.key, &[])?;
        }
        Ok(())
    }

    /// etcd's checks of a DeleteRange: write access to the range, read
    /// access with `prev_kv`.
    pub fn check_delete_range(
        &self,
        info: &AuthInfo,
        r: &DeleteRangeRequest,
    ) -> Result<(), EtcdError> {
        let state = self.state();
        if skips_checks(&state, info) {
            return Ok(());
        }
        state.check_keys(info, Access::Write, &r.key, &r.range_end)?;
        if r.prev_kv {
            state.check_keys(info, Access::Read, &r.key, &r.range_end)?;
        }
        Ok(())
    }

    /// etcd's checks of a writing Txn (see [`check_txn`]).
    pub fn check_txn(&self, info: &AuthInfo, r: &TxnRequest) -> Result<(), EtcdError> {
        check_txn(&self.state(), info, r)
    }

    /// True if `info`'s requests are checked (auth is enabled, or they
    /// carry credentials).
    pub fn checks(&self, info: &AuthInfo) -> bool {
        !skips_checks(&self.state(), info)
    }

    /// etcd's checks of a LeaseRevoke: write access to every key on it.
    pub fn check_lease_revoke(
        &self,
        info: &AuthInfo,
        lease: i64,
        lessor: &Lessor,
    ) -> Result<(), EtcdError> {
        let state = self.state();
        if skips_checks(&state, info) {
            return Ok(());
        }
        check_lease_keys(&state, info, lessor, lease)
    }
}

/// While auth is disabled, a request that carries no credentials is not
/// checked (one with credentials still is: a stale revision is refused).
fn skips_checks(state: &AuthState, info: &AuthInfo) -> bool {
    !state.enabled && info.revision == 0
}

/// A prepared auth change, installed after its batch is written.
#[derive(Debug)]
pub struct Pending {
    state: Option<AuthState>,
    applied: state::Applied,
    reply: AuthReply,
}

/// etcd's `checkLeasePuts`: whoever attaches a key to, or revokes, a lease
/// must be allowed to write every key already attached to it.
fn check_lease_keys(
    state: &AuthState,
    info: &AuthInfo,
    lessor: &Lessor,
    lease: i64,
) -> Result<(), EtcdError> {
    if lease == 0 {
        return Ok(());
    }
    for key in lessor.keys(lease).unwrap_or_default() {
        state.check_keys(info, Access::Write, &key, &[])?;
    }
    Ok(())
}

/// etcd's `checkTxnAuth`: every compare needs read access; the operations
/// of both branches (taken or not) need theirs.
pub fn check_txn(state: &AuthState, info: &AuthInfo, txn: &TxnRequest) -> Result<(), EtcdError> {
    if skips_checks(state, info) {
        return Ok(());
    }
    for c in &txn.compare {
        state.check_keys(info, Access::Read, &c.key, &c.range_end)?;
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match &op.request {
            Some(Op::RequestRange(r)) => {
                state.check_keys(info, Access::Read, &r.key, &r.range_end)?
            }
            Some(Op::RequestPut(p)) => state.check_keys(info, Access::Write, &p.key, &[])?,
            Some(Op::RequestDeleteRange(d)) => {
                if d.prev_kv {
                    state.check_keys(info, Access::Read, &d.key, &d.range_end)?;
                }
                state.check_keys(info, Access::Write, &d.key, &d.range_end)?;
            }
            Some(Op::RequestTxn(t)) => check_txn(state, info, t)?,
            None => {}
        }
    }
    Ok(())
}
