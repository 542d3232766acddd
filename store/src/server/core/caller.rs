//! Who is calling: the credentials of a client request, as etcd reads them.
//!
//! A request is authenticated by its `token` metadata (etcd also accepts
//! `authorization`); without one, by the common name of its verified client
//! certificate; otherwise it is anonymous ([`AuthInfo::default`], refused
//! with `user name is empty` by every check while auth is enabled). A token
//! that does not verify is `invalid auth token`, which makes etcd clients
//! re-authenticate. While auth is disabled only a token is looked at (a
//! stale simple token is still invalid, as in etcd).

use tokio::time::Instant;
use tonic::metadata::MetadataMap;

use crate::auth::token::simple_token_index;
use crate::auth::{AuthInfo, TokenProvider};
use crate::errors::EtcdError;
use crate::server::core::Core;
use crate::tls::ClientPeer;

/// Metadata keys that carry a token (etcd's `token`, and the grpc-gateway's
/// `authorization`).
pub const TOKEN_KEYS: [&str; 2] = ["token", "authorization"];

impl Core {
    /// The credentials of `req`.
    pub async fn caller<T>(&self, req: &tonic::Request<T>) -> Result<AuthInfo, EtcdError> {
        let peer = req
            .extensions()
            .get::<axum::extract::ConnectInfo<ClientPeer>>()
            .map(|c| &c.0);
        self.caller_of(req.metadata(), peer).await
    }

    /// The credentials carried by `metadata` or the client certificate.
    pub async fn caller_of(
        &self,
        metadata: &MetadataMap,
        peer: Option<&ClientPeer>,
    ) -> Result<AuthInfo, EtcdError> {
        let token = TOKEN_KEYS
            .iter()
            .find_map(|k| metadata.get(*k))
            .and_then(|v| v.to_str().ok());
        if let Some(token) = token {
            // Checked even while auth is disabled, as etcd does: simple
            // tokens die with `auth disable`, and a client holding one is
            // told so and drops it.
            self.wait_for_simple_token(token).await;
            return self.auth.info_from_token(token);
        }
        if !self.auth.enabled() {
            return Ok(AuthInfo::default());
        }
        if let Some(cn) = peer.and_then(|p| p.common_name.clone()) {
            let revision = self.auth.state().revision;
            return Ok(AuthInfo {
                username: cn,
                revision,
            });
        }
        Ok(AuthInfo::default())
    }

    /// A simple token names the log index of its Authenticate entry; a
    /// member that has not applied it yet waits (bounded by the request
    /// timeout) instead of calling the token invalid.
    async fn wait_for_simple_token(&self, token: &str) {
        if !matches!(self.auth.tokens, TokenProvider::Simple(_)) {
            return;
        }
        if let Some(index) = simple_token_index(token) {
            let deadline = Instant::now() + self.config.request_timeout;
            // On timeout the lookup that follows answers "invalid token".
            let _ = self.wait_applied(index, deadline).await;
        }
    }

    /// etcd's `IsAdminPermitted` for `req`'s caller (cluster changes).
    pub async fn check_admin<T>(&self, req: &tonic::Request<T>) -> Result<(), EtcdError> {
        let info = self.caller(req).await?;
        self.auth.state().check_admin(&info)
    }
}
