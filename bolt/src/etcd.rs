//! etcd schema (filled below).
