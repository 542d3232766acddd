//! The on-disk layout of a bbolt file: constants, fixed-size structs and
//! their (little-endian) encodings. See the crate docs for the picture.
//!
//! bbolt writes its structs in the host's byte order; every platform etcd
//! ships for except s390x is little-endian, and this crate reads and writes
//! little-endian files only.

/// bbolt's magic number, the first field of a meta page's meta struct.
pub const MAGIC: u32 = 0xED0C_DAED;
/// The file format version bbolt 1.3.x writes and accepts.
pub const VERSION: u32 = 2;

/// Bytes in a page header: id u64, flags u16, count u16, overflow u32.
pub const PAGE_HEADER_SIZE: usize = 16;
/// Bytes in one leaf element: flags u32, pos u32, ksize u32, vsize u32.
pub const LEAF_ELEMENT_SIZE: usize = 16;
/// Bytes in one branch element: pos u32, ksize u32, pgid u64.
pub const BRANCH_ELEMENT_SIZE: usize = 16;
/// Bytes in a bucket header (a bucket's value in its parent): root u64, sequence u64.
pub const BUCKET_HEADER_SIZE: usize = 16;
/// Bytes in the meta struct that follows a meta page's header.
pub const META_SIZE: usize = 64;
/// Bytes of the meta struct covered by its checksum (everything before the checksum field).
pub const META_CHECKSUM_OFFSET: usize = 56;

/// Page flag: a B+tree branch page.
pub const BRANCH_PAGE_FLAG: u16 = 0x01;
/// Page flag: a B+tree leaf page.
pub const LEAF_PAGE_FLAG: u16 = 0x02;
/// Page flag: one of the two meta pages (ids 0 and 1).
pub const META_PAGE_FLAG: u16 = 0x04;
/// Page flag: the freelist page.
pub const FREELIST_PAGE_FLAG: u16 = 0x10;

/// Leaf element flag: the value is a bucket header (a nested bucket), not data.
pub const BUCKET_LEAF_FLAG: u32 = 0x01;

/// The meta's freelist page id when the freelist is not written to disk
/// (bbolt's `NoFreelistSync`, which etcd 3.5 sets on Linux): readers
/// rebuild it as "every page below the high-water mark not reachable".
pub const PGID_NO_FREELIST: u64 = u64::MAX;

/// A freelist page whose `count` is this value stores the real count in its first u64.
pub const FREELIST_COUNT_OVERFLOW: u16 = 0xFFFF;

/// Largest key bbolt accepts, bytes (`bbolt.MaxKeySize`).
pub const MAX_KEY_SIZE: usize = 32_768;
/// Largest value bbolt accepts, bytes (`bbolt.MaxValueSize`, 2 GiB - 2).
pub const MAX_VALUE_SIZE: usize = (1 << 31) - 2;
/// Most elements bbolt puts in one page (its writer asserts `count < 0xFFFF`).
pub const MAX_PAGE_ELEMENTS: usize = 0xFFFE;

/// Smallest page size this crate accepts in a meta page, bytes.
pub const MIN_PAGE_SIZE: u32 = 512;
/// Largest page size this crate accepts in a meta page, bytes (bbolt uses the
/// OS page size: 4 KiB on amd64, up to 64 KiB on ppc64le/arm64 kernels).
pub const MAX_PAGE_SIZE: u32 = 65_536;
/// The page size of files this crate writes by default, bytes.
pub const DEFAULT_PAGE_SIZE: u32 = 4096;

/// FNV-1a 64-bit offset basis.
const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `bytes`: the meta page checksum.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV64_OFFSET, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(FNV64_PRIME)
    })
}

/// Little-endian u16 at `off`; `None` when it does not fit in `b`.
pub(crate) fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

/// Little-endian u32 at `off`; `None` when it does not fit in `b`.
pub(crate) fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes(s.try_into().ok()?))
}

/// Little-endian u64 at `off`; `None` when it does not fit in `b`.
pub(crate) fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    let s = b.get(off..off.checked_add(8)?)?;
    Some(u64::from_le_bytes(s.try_into().ok()?))
}

/// A page header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHeader {
    /// The page's own id (its byte offset is `id * page_size`).
    pub id: u64,
    /// One of the `*_PAGE_FLAG` values.
    pub flags: u16,
    /// Number of elements (leaf/branch), or of free ids (freelist).
    pub count: u16,
    /// Number of extra contiguous pages this page spans.
    pub overflow: u32,
}

impl PageHeader {
    /// Decodes the header at the start of `b`; `None` if `b` is shorter than a header.
    pub fn decode(b: &[u8]) -> Option<Self> {
        Some(Self {
            id: u64_at(b, 0)?,
            flags: u16_at(b, 8)?,
            count: u16_at(b, 10)?,
            overflow: u32_at(b, 12)?,
        })
    }

    /// Writes the header into the first [`PAGE_HEADER_SIZE`] bytes of `b`.
    pub fn encode(&self, b: &mut [u8]) {
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..10].copy_from_slice(&self.flags.to_le_bytes());
        b[10..12].copy_from_slice(&self.count.to_le_bytes());
        b[12..16].copy_from_slice(&self.overflow.to_le_bytes());
    }
}

/// A bucket header: a bucket's value in its parent (the root bucket's is in the meta).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketHeader {
    /// Page id of the bucket's B+tree root; 0 for an inline bucket.
    pub root: u64,
    /// The bucket's `NextSequence` counter (etcd leaves it 0).
    pub sequence: u64,
}

impl BucketHeader {
    /// Decodes a header from the first 16 bytes of `b`.
    pub fn decode(b: &[u8]) -> Option<Self> {
        Some(Self {
            root: u64_at(b, 0)?,
            sequence: u64_at(b, 8)?,
        })
    }

    /// The 16-byte encoding.
    pub fn encode(&self) -> [u8; BUCKET_HEADER_SIZE] {
        let mut b = [0u8; BUCKET_HEADER_SIZE];
        b[0..8].copy_from_slice(&self.root.to_le_bytes());
        b[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        b
    }
}

/// The meta struct stored after the header of pages 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Must be [`MAGIC`].
    pub magic: u32,
    /// Must be [`VERSION`].
    pub version: u32,
    /// Bytes per page.
    pub page_size: u32,
    /// Unused by bbolt 1.3 (0).
    pub flags: u32,
    /// The root bucket, whose keys are the top-level bucket names.
    pub root: BucketHeader,
    /// Page id of the freelist, or [`PGID_NO_FREELIST`].
    pub freelist: u64,
    /// High-water mark: one past the largest page id in use (file holds `pgid * page_size` bytes).
    pub pgid: u64,
    /// Id of the transaction that wrote this meta.
    pub txid: u64,
    /// FNV-1a 64 of the first [`META_CHECKSUM_OFFSET`] bytes of the struct.
    pub checksum: u64,
}

impl Meta {
    /// Decodes the 64-byte meta struct at the start of `b`.
    pub fn decode(b: &[u8]) -> Option<Self> {
        Some(Self {
            magic: u32_at(b, 0)?,
            version: u32_at(b, 4)?,
            page_size: u32_at(b, 8)?,
            flags: u32_at(b, 12)?,
            root: BucketHeader::decode(b.get(16..32)?)?,
            freelist: u64_at(b, 32)?,
            pgid: u64_at(b, 40)?,
            txid: u64_at(b, 48)?,
            checksum: u64_at(b, 56)?,
        })
    }

    /// The 64-byte encoding, with the checksum field as stored in `self`.
    pub fn encode(&self) -> [u8; META_SIZE] {
        let mut b = [0u8; META_SIZE];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..12].copy_from_slice(&self.page_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..32].copy_from_slice(&self.root.encode());
        b[32..40].copy_from_slice(&self.freelist.to_le_bytes());
        b[40..48].copy_from_slice(&self.pgid.to_le_bytes());
        b[48..56].copy_from_slice(&self.txid.to_le_bytes());
        b[56..64].copy_from_slice(&self.checksum.to_le_bytes());
        b
    }

    /// The checksum this meta should carry.
    pub fn compute_checksum(&self) -> u64 {
        fnv1a64(&self.encode()[..META_CHECKSUM_OFFSET])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_known_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn meta_round_trip() {
        let mut m = Meta {
            magic: MAGIC,
            version: VERSION,
            page_size: 4096,
            flags: 0,
            root: BucketHeader {
                root: 3,
                sequence: 0,
            },
            freelist: 2,
            pgid: 4,
            txid: 1,
            checksum: 0,
        };
        m.checksum = m.compute_checksum();
        assert_eq!(Meta::decode(&m.encode()), Some(m));
    }
}
