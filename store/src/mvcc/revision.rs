//! Revisions and their on-disk key encoding (etcd's layout, so `HashKV`
//! can match etcd byte for byte).
//!
//! A revision is `(main, sub)`: `main` is the store revision a write
//! transaction creates, `sub` numbers the changes inside it (a Txn with
//! three puts writes `(7,0)`, `(7,1)`, `(7,2)`). The key of a change in
//! [`crate::engine::Table::Kv`] is
//!
//! ```text
//! 8 bytes main (big-endian) | '_' | 8 bytes sub (big-endian) [| 't' if tombstone]
//! ```
//!
//! Big-endian makes byte order equal numeric order, so a table scan walks
//! history in revision order.

/// Length of an encoded revision without the tombstone mark.
pub const REVISION_KEY_BYTES: usize = 17;

/// Marker byte appended to the key of a deletion (tombstone).
pub const TOMBSTONE_MARK: u8 = b't';

/// A point in the store's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Revision {
    /// The store revision of the write transaction.
    pub main: i64,
    /// The change's position inside its transaction.
    pub sub: i64,
}

impl Revision {
    /// A revision.
    pub const fn new(main: i64, sub: i64) -> Self {
        Self { main, sub }
    }

    /// The key under which this change is stored.
    pub fn to_key(self, tombstone: bool) -> Vec<u8> {
        let mut k = Vec::with_capacity(REVISION_KEY_BYTES + 1);
        k.extend_from_slice(&self.main.to_be_bytes());
        k.push(b'_');
        k.extend_from_slice(&self.sub.to_be_bytes());
        if tombstone {
            k.push(TOMBSTONE_MARK);
        }
        k
    }

    /// The smallest key of any change at main revision `main` (scan bound).
    pub fn start_key(main: i64) -> Vec<u8> {
        Revision::new(main, 0).to_key(false)
    }

    /// Decodes a stored key into (revision, is_tombstone).
    pub fn from_key(key: &[u8]) -> Option<(Revision, bool)> {
        let tombstone = match key.len() {
            REVISION_KEY_BYTES => false,
            n if n == REVISION_KEY_BYTES + 1 && key[REVISION_KEY_BYTES] == TOMBSTONE_MARK => true,
            _ => return None,
        };
        if key[8] != b'_' {
            return None;
        }
        let main = i64::from_be_bytes(key[0..8].try_into().ok()?);
        let sub = i64::from_be_bytes(key[9..17].try_into().ok()?);
        Some((Revision::new(main, sub), tombstone))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_sort_numerically() {
        let a = Revision::new(2, 0).to_key(false);
        let b = Revision::new(2, 1).to_key(true);
        let c = Revision::new(256, 0).to_key(false);
        assert!(a < b && b < c);
        assert_eq!(Revision::from_key(&a), Some((Revision::new(2, 0), false)));
        assert_eq!(Revision::from_key(&b), Some((Revision::new(2, 1), true)));
        assert_eq!(Revision::from_key(b"short"), None);
        assert_eq!(a.len(), REVISION_KEY_BYTES);
    }
}
