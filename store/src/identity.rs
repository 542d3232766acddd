//! etcd's member and cluster identities: deterministic ids derived from
//! the peer URLs and the cluster token, so every member (and etcd itself)
//! computes the same ids for the same `--initial-cluster`.

/// etcd's member ID: the first 8 bytes (big-endian) of
/// SHA-1(sorted peer URLs joined, then the cluster token).
pub fn member_id(peer_urls: &[String], cluster_token: &str) -> u64 {
    use sha1::{Digest, Sha1};
    let mut urls: Vec<&str> = peer_urls.iter().map(String::as_str).collect();
    urls.sort_unstable();
    let mut hasher = Sha1::new();
    hasher.update(urls.concat().as_bytes());
    hasher.update(cluster_token.as_bytes());
    let digest = hasher.finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("sha1 is 20 bytes"))
}

/// etcd's cluster ID: SHA-1 over the sorted member IDs (8 bytes each,
/// big-endian), first 8 bytes.
pub fn cluster_id(member_ids: &[u64]) -> u64 {
    use sha1::{Digest, Sha1};
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let mut hasher = Sha1::new();
    for id in ids {
        hasher.update(id.to_be_bytes());
    }
    let digest = hasher.finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("sha1 is 20 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_deterministic_and_order_free() {
        let a = member_id(&["http://127.0.0.1:2380".into()], "etcd-cluster");
        assert_eq!(
            a,
            member_id(&["http://127.0.0.1:2380".into()], "etcd-cluster")
        );
        assert_ne!(
            a,
            member_id(&["http://127.0.0.1:2380".into()], "other-token")
        );
        assert_eq!(cluster_id(&[1, 2, 3]), cluster_id(&[3, 1, 2]));
    }
}
