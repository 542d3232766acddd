//! Keys and values of the generated load.
//!
//! Keys are `<prefix><zero-padded number>`, padded so the whole key is
//! `--key-size` bytes (longer if the prefix and number need more), with the
//! number drawn uniformly from `0..--key-space-size` by a seeded RNG, or
//! `index % key-space-size` with `--sequential-keys`. Values carry the send
//! time in their first 8 bytes so watchers can measure delivery latency.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Bytes of a value taken by the embedded timestamp.
pub const STAMP_BYTES: usize = 8;
/// Mixed into the run seed to derive independent per-client streams.
const CLIENT_SEED_STRIDE: u64 = 0x9E37_79B9_7F4A_7C15;

/// Generates keys for one client.
pub struct KeyGen {
    prefix: String,
    key_size: usize,
    key_space: u64,
    sequential: bool,
    rng: StdRng,
}

impl KeyGen {
    /// A generator for client number `client` of a run seeded with `seed`.
    pub fn new(
        prefix: &str,
        key_size: usize,
        key_space: u64,
        sequential: bool,
        seed: u64,
        client: u64,
    ) -> KeyGen {
        KeyGen {
            prefix: prefix.to_string(),
            key_size,
            key_space: key_space.max(1),
            sequential,
            rng: client_rng(seed, client),
        }
    }

    /// The key for operation number `index`.
    pub fn key(&mut self, index: u64) -> Vec<u8> {
        let n = if self.sequential {
            index % self.key_space
        } else {
            self.rng.gen_range(0..self.key_space)
        };
        self.key_of(n)
    }

    /// Up to `count` distinct keys for operation `index` (fewer if the key space is smaller):
    /// consecutive numbers starting at the one [`KeyGen::key`] would pick.
    pub fn distinct_keys(&mut self, index: u64, count: usize) -> Vec<Vec<u8>> {
        let first = if self.sequential {
            index.wrapping_mul(count as u64) % self.key_space
        } else {
            self.rng.gen_range(0..self.key_space)
        };
        let count = (count as u64).min(self.key_space);
        (0..count)
            .map(|j| self.key_of((first + j) % self.key_space))
            .collect()
    }

    /// The key holding number `n` of the key space.
    pub fn key_of(&self, n: u64) -> Vec<u8> {
        key_with_prefix(&self.prefix, self.key_size, n)
    }

    /// The RNG of this client, for workload decisions.
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

/// `<prefix><n>` zero-padded to `key_size` bytes.
pub fn key_with_prefix(prefix: &str, key_size: usize, n: u64) -> Vec<u8> {
    let width = key_size.saturating_sub(prefix.len());
    format!("{prefix}{n:0width$}").into_bytes()
}

/// An independent, reproducible RNG for client `client` of seed `seed`.
pub fn client_rng(seed: u64, client: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ client.wrapping_add(1).wrapping_mul(CLIENT_SEED_STRIDE))
}

/// The end of the range of keys starting with `prefix` (etcd's "prefix end").
pub use etcd_proto::keys::prefix_end;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// A value of `size` bytes (at least [`STAMP_BYTES`]) stamped with the current time.
pub fn stamped_value(size: usize) -> Vec<u8> {
    let nanos = u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut v = nanos.to_be_bytes().to_vec();
    v.resize(size.max(STAMP_BYTES), b'v');
    v
}

/// Time since the stamp in `value` was written (None if it carries no stamp).
pub fn since_stamp(value: &[u8]) -> Option<Duration> {
    let bytes: [u8; STAMP_BYTES] = value.get(..STAMP_BYTES)?.try_into().ok()?;
    let sent = Duration::from_nanos(u64::from_be_bytes(bytes));
    epoch().elapsed().checked_sub(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_padded_and_bounded() {
        let mut g = KeyGen::new("k/", 10, 5, true, 1, 0);
        assert_eq!(g.key(7), b"k/00000002".to_vec());
        let mut r = KeyGen::new("k/", 4, 3, false, 1, 0);
        for i in 0..100 {
            let k = r.key(i);
            assert!(k == b"k/00" || k == b"k/01" || k == b"k/02");
        }
    }

    #[test]
    fn distinct_keys_never_repeat() {
        let mut g = KeyGen::new("k/", 4, 3, false, 1, 0);
        for i in 0..50 {
            let mut ks = g.distinct_keys(i, 5);
            assert_eq!(ks.len(), 3);
            ks.sort();
            ks.dedup();
            assert_eq!(ks.len(), 3);
        }
    }

    #[test]
    fn stamps_round_trip() {
        let v = stamped_value(16);
        assert_eq!(v.len(), 16);
        assert!(since_stamp(&v).unwrap() < Duration::from_secs(5));
        assert!(since_stamp(b"abc").is_none());
    }
}
