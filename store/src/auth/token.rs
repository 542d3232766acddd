//! Auth tokens, as etcd's `--auth-token` offers them.
//!
//! **simple** (etcd's default): an opaque `<16 random letters>.<raft index>`.
//! The member that checked the password proposes an Authenticate command;
//! every member registers the token when it applies that entry, so the
//! token works on any member. A member that has not applied the entry yet
//! waits for it (the index is in the token). Tokens live in memory only, for
//! `--auth-token-ttl` seconds after their last use, and are dropped when
//! their user is deleted or changes password, or when auth is disabled.
//!
//! **jwt**: `jwt,pub-key=<pem>,priv-key=<pem>,sign-method=<alg>,ttl=<dur>`.
//! A signed token carrying `username`, `revision` and `exp`; any member
//! verifies it with the public key, nothing is stored. Its revision is the
//! auth revision at sign-in, so any later auth change makes it stale and
//! requests fail with etcd's `auth: revision in header is old` until the
//! client authenticates again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::duration::{parse_go_duration, DurationError};
use crate::errors::EtcdError;

/// Letters in a simple token's random prefix (etcd: 16).
pub const SIMPLE_TOKEN_PREFIX_LEN: usize = 16;

/// etcd's default `--auth-token-ttl`.
pub const DEFAULT_SIMPLE_TOKEN_TTL: Duration = Duration::from_secs(300);

/// etcd's default JWT lifetime.
pub const DEFAULT_JWT_TTL: Duration = Duration::from_secs(300);

/// Simple tokens kept before expired ones are swept on the next insert.
const SIMPLE_TOKEN_SWEEP_AT: usize = 4_096;

/// A random simple-token prefix.
pub fn random_prefix() -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut rng = rand::thread_rng();
    (0..SIMPLE_TOKEN_PREFIX_LEN)
        .map(|_| LETTERS[rng.gen_range(0..LETTERS.len())] as char)
        .collect()
}

/// The Raft index a simple token was issued at, if it is one.
pub fn simple_token_index(token: &str) -> Option<u64> {
    let (prefix, index) = token.rsplit_once('.')?;
    if prefix.len() != SIMPLE_TOKEN_PREFIX_LEN {
        return None;
    }
    index.parse().ok()
}

/// Registered simple tokens: token -> (user, expiry).
///
/// Expired tokens are dropped when used, and swept when the registry
/// reaches a size: at least [`SIMPLE_TOKEN_SWEEP_AT`], and twice the live
/// tokens left by the last sweep. With many live tokens (etcd sets no
/// limit: they live `ttl` after their last use) a sweep therefore follows
/// as many inserts as it visits, so an insert costs `O(1)` amortized, not a
/// scan of every token.
#[derive(Debug)]
pub struct SimpleTokens {
    ttl: Duration,
    tokens: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    map: HashMap<String, (String, Instant)>,
    /// Size at which the next insert sweeps expired tokens.
    sweep_at: usize,
    /// Sweeps so far (for tests).
    sweeps: u64,
}

impl Registry {
    fn sweep_if_due(&mut self, now: Instant) {
        if self.map.len() < self.sweep_at.max(SIMPLE_TOKEN_SWEEP_AT) {
            return;
        }
        self.map.retain(|_, (_, expiry)| *expiry > now);
        self.sweep_at = 2 * self.map.len();
        self.sweeps += 1;
    }
}

impl SimpleTokens {
    /// An empty registry whose tokens live `ttl` after their last use.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            tokens: Mutex::new(Registry::default()),
        }
    }

    /// Registers `token` for `user`.
    pub fn insert(&self, token: String, user: String) {
        let now = Instant::now();
        let mut tokens = self.tokens.lock().expect("token lock");
        tokens.sweep_if_due(now);
        tokens.map.insert(token, (user, now + self.ttl));
    }

    /// The user of a live token, extending its life.
    pub fn user(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut tokens = self.tokens.lock().expect("token lock");
        match tokens.map.get_mut(token) {
            Some((user, expiry)) if *expiry > now => {
                *expiry = now + self.ttl;
                Some(user.clone())
            }
            Some(_) => {
                tokens.map.remove(token);
                None
            }
            None => None,
        }
    }

    /// Drops every token of `user`.
    pub fn invalidate_user(&self, user: &str) {
        self.tokens
            .lock()
            .expect("token lock")
            .map
            .retain(|_, (u, _)| u != user);
    }

    /// Drops every token.
    pub fn clear(&self) {
        self.tokens.lock().expect("token lock").map.clear();
    }
}

/// The claims of etcd's JWT tokens.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JwtClaims {
    /// The user.
    pub username: String,
    /// The auth revision at sign-in.
    pub revision: u64,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
}

/// A JWT signer/verifier from `--auth-token jwt,...`.
pub struct Jwt {
    algorithm: Algorithm,
    signing: Option<EncodingKey>,
    verifying: DecodingKey,
    ttl: Duration,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("algorithm", &self.algorithm)
            .field("can_sign", &self.signing.is_some())
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// `--auth-token`: which token provider a member runs.
#[derive(Debug)]
pub enum TokenProvider {
    /// `simple`.
    Simple(SimpleTokens),
    /// `jwt,...`.
    Jwt(Jwt),
}

/// A malformed `--auth-token` value.
#[derive(Debug, thiserror::Error)]
pub enum TokenConfigError {
    /// Neither `simple` nor `jwt`.
    #[error("invalid --auth-token: unknown token type {0:?}")]
    UnknownType(String),
    /// A `sign-method` jsonwebtoken does not offer.
    #[error("invalid --auth-token: unsupported sign-method {0:?}")]
    SignMethod(String),
    /// An option without `=`.
    #[error("invalid --auth-token: option {0:?} is not key=value")]
    NotKeyValue(String),
    /// An option jwt does not take.
    #[error("invalid --auth-token: unknown jwt option {0:?}")]
    UnknownOption(String),
    /// A required option is missing.
    #[error("invalid --auth-token: {0}")]
    Missing(&'static str),
    /// `ttl=` does not parse.
    #[error("invalid --auth-token: ttl: {0}")]
    Ttl(#[from] DurationError),
    /// A key file cannot be read.
    #[error("invalid --auth-token: {path}: {source}")]
    ReadKey {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A key file does not hold a key of the sign method's kind.
    #[error("invalid --auth-token: {0}")]
    Key(#[from] jsonwebtoken::errors::Error),
}

impl TokenProvider {
    /// Parses `--auth-token` (`simple` or `jwt,key=value,...`).
    pub fn from_flag(flag: &str, simple_ttl: Duration) -> Result<Self, TokenConfigError> {
        let mut parts = flag.split(',');
        match parts.next().unwrap_or("") {
            "simple" | "" => Ok(TokenProvider::Simple(SimpleTokens::new(simple_ttl))),
            "jwt" => Ok(TokenProvider::Jwt(Jwt::from_options(parts)?)),
            other => Err(TokenConfigError::UnknownType(other.to_string())),
        }
    }
}

fn algorithm(name: &str) -> Result<Algorithm, TokenConfigError> {
    Ok(match name {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        "HS256" => Algorithm::HS256,
        "HS384" => Algorithm::HS384,
        "HS512" => Algorithm::HS512,
        other => return Err(TokenConfigError::SignMethod(other.to_string())),
    })
}

fn read(path: &PathBuf) -> Result<Vec<u8>, TokenConfigError> {
    std::fs::read(path).map_err(|source| TokenConfigError::ReadKey {
        path: path.display().to_string(),
        source,
    })
}

impl Jwt {
    fn from_options<'a>(options: impl Iterator<Item = &'a str>) -> Result<Self, TokenConfigError> {
        let mut public = None;
        let mut private = None;
        let mut method = None;
        let mut ttl = DEFAULT_JWT_TTL;
        for opt in options {
            let (k, v) = opt
                .split_once('=')
                .ok_or_else(|| TokenConfigError::NotKeyValue(opt.to_string()))?;
            match k {
                "pub-key" => public = Some(PathBuf::from(v)),
                "priv-key" => private = Some(PathBuf::from(v)),
                "sign-method" => method = Some(algorithm(v)?),
                "ttl" => ttl = parse_go_duration(v)?,
                other => return Err(TokenConfigError::UnknownOption(other.to_string())),
            }
        }
        let algorithm = method.ok_or(TokenConfigError::Missing("jwt needs sign-method"))?;
        let (signing, verifying) = keys(algorithm, public.as_ref(), private.as_ref())?;
        Ok(Self {
            algorithm,
            signing,
            verifying,
            ttl,
        })
    }

    /// Signs a token for `username` at auth `revision`.
    pub fn sign(&self, username: &str, revision: u64) -> Result<String, EtcdError> {
        let key = self.signing.as_ref().ok_or(EtcdError::AuthFailed)?;
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            + self.ttl;
        let claims = JwtClaims {
            username: username.to_string(),
            revision,
            exp: exp.as_secs(),
        };
        jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key).map_err(|e| {
            tracing::error!(error = %e, "failed to sign a JWT");
            EtcdError::AuthFailed
        })
    }

    /// The claims of a valid, unexpired token.
    pub fn verify(&self, token: &str) -> Option<JwtClaims> {
        let validation = Validation::new(self.algorithm);
        jsonwebtoken::decode::<JwtClaims>(token, &self.verifying, &validation)
            .ok()
            .map(|t| t.claims)
    }
}

type PemEncoder = fn(&[u8]) -> jsonwebtoken::errors::Result<EncodingKey>;
type PemDecoder = fn(&[u8]) -> jsonwebtoken::errors::Result<DecodingKey>;

/// Loads the key pair. HMAC methods use the private key file's bytes as the
/// shared secret; asymmetric ones need the public key (and the private key
/// to sign: without it a member can only verify, as in etcd).
fn keys(
    algorithm: Algorithm,
    public: Option<&PathBuf>,
    private: Option<&PathBuf>,
) -> Result<(Option<EncodingKey>, DecodingKey), TokenConfigError> {
    match algorithm {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
            let path = private.ok_or(TokenConfigError::Missing("HMAC needs priv-key"))?;
            let secret = read(path)?;
            Ok((
                Some(EncodingKey::from_secret(&secret)),
                DecodingKey::from_secret(&secret),
            ))
        }
        _ => {
            let public = read(public.ok_or(TokenConfigError::Missing("jwt needs pub-key"))?)?;
            let private = private.map(read).transpose()?;
            let (enc, dec): (PemEncoder, PemDecoder) = match algorithm {
                Algorithm::ES256 | Algorithm::ES384 => {
                    (EncodingKey::from_ec_pem, DecodingKey::from_ec_pem)
                }
                Algorithm::EdDSA => (EncodingKey::from_ed_pem, DecodingKey::from_ed_pem),
                _ => (EncodingKey::from_rsa_pem, DecodingKey::from_rsa_pem),
            };
            let signing = private.as_deref().map(enc).transpose()?;
            Ok((signing, dec(&public)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_tokens_expire_and_are_invalidated() {
        let t = SimpleTokens::new(Duration::from_secs(300));
        t.insert("abc.1".into(), "alice".into());
        t.insert("abd.2".into(), "bob".into());
        assert_eq!(t.user("abc.1").as_deref(), Some("alice"));
        t.invalidate_user("alice");
        assert_eq!(t.user("abc.1"), None);
        assert_eq!(t.user("abd.2").as_deref(), Some("bob"));
        t.clear();
        assert_eq!(t.user("abd.2"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn simple_tokens_live_ttl_after_last_use() {
        let t = SimpleTokens::new(Duration::from_secs(10));
        t.insert("tok.1".into(), "alice".into());
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(t.user("tok.1").is_some(), "use extends the life");
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(t.user("tok.1").is_some());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(t.user("tok.1").is_none());
    }

    /// 100,000 live tokens: sweeps happen at doubling sizes (a handful),
    /// not on every insert past the first threshold; expired ones go.
    #[test]
    fn many_live_tokens_are_swept_rarely() {
        const LIVE: usize = 100_000;
        let tokens = SimpleTokens::new(Duration::from_secs(3600));
        for i in 0..LIVE {
            tokens.insert(format!("{i}"), "u".into());
        }
        let registry = tokens.tokens.lock().expect("lock");
        assert_eq!(registry.map.len(), LIVE);
        // 4,096, 8,192, ... 65,536: five sweeps.
        assert!(registry.sweeps <= 5, "{} sweeps", registry.sweeps);
        drop(registry);
        let short = SimpleTokens::new(Duration::ZERO);
        for i in 0..2 * SIMPLE_TOKEN_SWEEP_AT {
            short.insert(format!("{i}"), "u".into());
        }
        let registry = short.tokens.lock().expect("lock");
        assert!(
            registry.map.len() <= SIMPLE_TOKEN_SWEEP_AT,
            "expired tokens swept"
        );
    }

    #[test]
    fn simple_token_index_parses_etcd_format() {
        let p = random_prefix();
        assert_eq!(p.len(), SIMPLE_TOKEN_PREFIX_LEN);
        assert_eq!(simple_token_index(&format!("{p}.42")), Some(42));
        assert_eq!(simple_token_index("short.42"), None);
        assert_eq!(simple_token_index("eyJhbGciOiJSUzI1NiJ9.e30.sig"), None);
    }

    #[test]
    fn hmac_jwt_round_trips_and_rejects_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("secret");
        std::fs::write(&key, b"0123456789abcdef0123456789abcdef").unwrap();
        let flag = format!("jwt,priv-key={},sign-method=HS256,ttl=1m", key.display());
        let TokenProvider::Jwt(jwt) =
            TokenProvider::from_flag(&flag, DEFAULT_SIMPLE_TOKEN_TTL).unwrap()
        else {
            panic!("not jwt")
        };
        let token = jwt.sign("alice", 7).unwrap();
        let claims = jwt.verify(&token).unwrap();
        assert_eq!((claims.username.as_str(), claims.revision), ("alice", 7));
        let mut forged = token.clone();
        forged.push('x');
        assert!(jwt.verify(&forged).is_none());
    }

    #[test]
    fn bad_flags_are_refused() {
        for flag in [
            "bogus",
            "jwt,sign-method=RS256",
            "jwt,sign-method=XX1",
            "jwt,ttl",
        ] {
            assert!(
                TokenProvider::from_flag(flag, DEFAULT_SIMPLE_TOKEN_TTL).is_err(),
                "{flag}"
            );
        }
    }
}
