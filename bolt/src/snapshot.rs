//! etcd's snapshot wrapper: a bbolt file followed by the SHA-256 of it.
//!
//! `etcdctl snapshot save` receives the backend as a stream whose last 32
//! bytes are the SHA-256 of everything before them (etcd's maintenance
//! server appends it, `client/v3/snapshot` checks it). `etcdutl snapshot
//! restore` (etcdutl/snapshot/v3_snapshot.go, `copyAndVerifyDB`) treats a
//! file as carrying that trailer when `size % 512 == 32` (`hasChecksum`):
//! it truncates the 32 bytes and compares the hash, refusing a file without
//! trailer unless `--skip-hash-check`. `etcdutl snapshot status` opens the
//! file with bbolt directly (the trailer is past the high-water mark, so
//! bbolt ignores it) and runs `Tx.Check`.

use std::io::{Read, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

use crate::error::Error;

/// Bytes of the SHA-256 trailer.
pub const SHA256_SIZE: usize = 32;
/// etcd's `hasChecksum` rule: a file carries the trailer when its size modulo this is [`SHA256_SIZE`].
pub const CHECKSUM_ALIGN: u64 = 512;
/// Read buffer for [`append_sha256`], bytes.
const HASH_CHUNK: usize = 64 * 1024;

/// Whether a file of `len` bytes carries a trailer by etcd's rule.
pub fn has_checksum(len: u64) -> bool {
    len % CHECKSUM_ALIGN == SHA256_SIZE as u64
}

/// SHA-256 of `db`: the trailer etcd expects after it.
pub fn sha256(db: &[u8]) -> [u8; SHA256_SIZE] {
    Sha256::digest(db).into()
}

/// Splits a snapshot file into the bbolt database and checks its trailer.
pub fn split_and_verify(file: &[u8]) -> Result<&[u8], Error> {
    let len = file.len() as u64;
    if !has_checksum(len) {
        return Err(Error::NoChecksum { len });
    }
    let (db, trailer) = file.split_at(file.len() - SHA256_SIZE);
    let actual = sha256(db);
    if actual != trailer {
        return Err(Error::ChecksumMismatch {
            expected: hex(trailer),
            actual: hex(&actual),
        });
    }
    Ok(db)
}

/// Hashes `file` from its start to its end and appends the SHA-256 there,
/// making it a snapshot `etcdutl snapshot restore` accepts. The database
/// size must be a multiple of 512 bytes (any bbolt file is). Returns the hash.
pub fn append_sha256<F: Read + Write + Seek>(file: &mut F) -> Result<[u8; SHA256_SIZE], Error> {
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_CHUNK];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let hash: [u8; SHA256_SIZE] = hasher.finalize().into();
    file.seek(SeekFrom::End(0))?;
    file.write_all(&hash)?;
    file.flush()?;
    Ok(hash)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_then_verify() {
        let db = vec![7u8; 4096 * 3];
        let mut f = std::io::Cursor::new(db.clone());
        append_sha256(&mut f).unwrap();
        let file = f.into_inner();
        assert_eq!(file.len(), db.len() + 32);
        assert_eq!(split_and_verify(&file).unwrap(), &db[..]);
    }

    #[test]
    fn rejects_missing_or_wrong_trailer() {
        let db = vec![7u8; 4096];
        assert!(matches!(
            split_and_verify(&db),
            Err(Error::NoChecksum { len: 4096 })
        ));
        let mut file = db.clone();
        file.extend_from_slice(&sha256(&db));
        file[10] ^= 1;
        assert!(matches!(
            split_and_verify(&file),
            Err(Error::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn sha256_known_vector() {
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
