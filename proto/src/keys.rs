//! etcd's key-range conventions shared by every client of the API.

/// The `range_end` that makes a range cover every key starting with
/// `prefix` (etcd's `GetPrefixRangeEnd`): the prefix with its last byte
/// below 0xff incremented and what follows dropped; `\0` (to the end of the
/// keyspace) if every byte is 0xff or the prefix is empty.
///
/// Example: `job/` gives `job0`; `a\xff` gives `b`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_as_etcd_computes_them() {
        assert_eq!(prefix_end(b"job/"), b"job0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }
}
