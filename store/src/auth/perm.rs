//! Key permissions: does the union of a user's granted ranges cover a request?
//!
//! etcd grants a role permissions on a single key (`range_end` empty), on a
//! half-open range `[key, range_end)`, or on everything from `key` on
//! (`range_end` = `"\0"`). A request is allowed if the range it touches is
//! *covered* by the union of the user's permissions of the right type (READ
//! is granted by READ and READWRITE, WRITE by WRITE and READWRITE), possibly
//! across several grants and roles.
//!
//! Everything is an interval here: a single key `k` is `[k, k + "\0")`, the
//! smallest interval that contains `k` and nothing else, and an open end is
//! `+inf`. Coverage: sort the granted intervals by start, sweep from the
//! request's start, extending the covered prefix while the next interval
//! starts at or before it; the request is covered once the prefix reaches
//! its end.
//!
//! Worked example: grants `[a, c)` and `[c, f)` together cover a request for
//! `[b, e)` although neither does alone; a grant of the single key `c` plus
//! `[c\0, f)` covers `[c, f)` too.

use etcd_proto::authpb::permission::Type as PermType;
use serde::{Deserialize, Serialize};

/// One granted permission, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    /// READ, WRITE or READWRITE (etcd's `authpb.Permission.Type`).
    pub kind: i32,
    /// First key.
    pub key: Vec<u8>,
    /// End of the range (exclusive); empty for a single key, `"\0"` for
    /// "every key from `key` on".
    pub range_end: Vec<u8>,
}

/// What an operation needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reading keys (Range, Watch, Txn compares).
    Read,
    /// Writing keys (Put, DeleteRange).
    Write,
}

impl Permission {
    /// True if this permission grants `access`.
    pub fn grants(&self, access: Access) -> bool {
        let kind = PermType::try_from(self.kind).unwrap_or(PermType::Read);
        matches!(
            (kind, access),
            (PermType::Readwrite, _)
                | (PermType::Read, Access::Read)
                | (PermType::Write, Access::Write)
        )
    }

    fn interval(&self) -> Interval {
        interval(&self.key, &self.range_end)
    }
}

/// `[start, end)`; `end = None` is `+inf`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Interval {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

/// The interval of `key`/`range_end` as etcd reads them in both grants and
/// requests.
fn interval(key: &[u8], range_end: &[u8]) -> Interval {
    let end = match range_end {
        [] => {
            let mut e = key.to_vec();
            e.push(0);
            Some(e)
        }
        [0] => None,
        end => Some(end.to_vec()),
    };
    Interval {
        start: key.to_vec(),
        end,
    }
}

/// True if the permissions in `granted` that give `access` cover the
/// request `key`/`range_end` (etcd request conventions: empty `range_end`
/// is the single key, `"\0"` is "from `key` on").
pub fn covers<'a>(
    granted: impl IntoIterator<Item = &'a Permission>,
    access: Access,
    key: &[u8],
    range_end: &[u8],
) -> bool {
    let mut want = interval(key, range_end);
    if let Some(end) = &want.end {
        if end.as_slice() <= key {
            // An empty request range (end before start) reads nothing; etcd
            // judges it by its first key.
            want = interval(key, &[]);
        }
    }
    let mut spans: Vec<Interval> = granted
        .into_iter()
        .filter(|p| p.grants(access))
        .map(Permission::interval)
        .collect();
    spans.sort_by(|a, b| a.start.cmp(&b.start));
    // `reached`: every key in [want.start, reached) is covered.
    let mut reached = want.start.clone();
    for span in spans {
        if span.start > reached {
            break;
        }
        match span.end {
            None => return true,
            Some(end) if end > reached => reached = end,
            Some(_) => {}
        }
        if want.end.as_ref().is_some_and(|e| reached >= *e) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kind: PermType, key: &str, end: &str) -> Permission {
        Permission {
            kind: kind as i32,
            key: key.as_bytes().to_vec(),
            range_end: end.as_bytes().to_vec(),
        }
    }

    #[test]
    fn single_keys_ranges_and_open_ends() {
        let g = [
            p(PermType::Read, "foo", ""),
            p(PermType::Readwrite, "dir/", "dir0"),
            p(PermType::Write, "a", "z"),
            p(PermType::Read, "m", "\0"),
        ];
        assert!(covers(&g, Access::Read, b"foo", b""));
        assert!(covers(&g, Access::Write, b"foo", b""), "inside [a, z)");
        assert!(!covers(&g, Access::Write, b"zz", b""));
        assert!(!covers(&g, Access::Read, b"fo", b""));
        assert!(!covers(&g, Access::Read, b"foo0", b""));
        assert!(covers(&g, Access::Read, b"dir/", b"dir0"));
        assert!(covers(&g, Access::Read, b"dir/x", b""));
        assert!(!covers(&g, Access::Read, b"dir", b"dis"));
        assert!(covers(&g, Access::Write, b"b", b""));
        assert!(covers(&g, Access::Write, b"a", b"z"));
        assert!(!covers(&g, Access::Write, b"a", b"za"));
        assert!(!covers(&g, Access::Write, b"z", b""));
        assert!(covers(&g, Access::Read, b"m1", b""));
        assert!(covers(&g, Access::Read, b"m", b"\0"));
        assert!(covers(&g, Access::Read, b"zzz", b"\xff"));
        assert!(!covers(&g, Access::Read, b"l", b"\0"));
        assert!(!covers(&[], Access::Read, b"k", b""));
    }

    #[test]
    fn union_of_grants_covers_what_none_covers_alone() {
        let g = [
            p(PermType::Read, "a", "c"),
            p(PermType::Readwrite, "c", "f"),
        ];
        assert!(covers(&g, Access::Read, b"b", b"e"));
        assert!(!covers(&g, Access::Read, b"b", b"g"));
        assert!(!covers(&g, Access::Write, b"b", b"e"));
        let points = [p(PermType::Read, "c", ""), p(PermType::Read, "c\0", "f")];
        assert!(covers(&points, Access::Read, b"c", b"f"));
        let gap = [p(PermType::Read, "a", "c"), p(PermType::Read, "d", "f")];
        assert!(!covers(&gap, Access::Read, b"b", b"e"));
    }

    #[test]
    fn an_empty_request_range_is_judged_by_its_key() {
        let g = [p(PermType::Read, "k", "")];
        assert!(covers(&g, Access::Read, b"k", b"a"));
        assert!(!covers(&g, Access::Read, b"j", b"a"));
    }
}
