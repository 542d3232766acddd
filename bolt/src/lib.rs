//! Reads and writes bbolt database files: the format of etcd 3.5's backend
//! (`member/snap/db`) and of `etcdctl snapshot save` files (which add a
//! SHA-256 trailer, see [`snapshot`]). The layout below was learned from
//! bbolt 1.3.6 (the version etcd 3.5.1 uses); the code is this crate's own.
//!
//! - [`Db`]: opens a file held in memory, picks the valid meta page with the
//!   higher txid, iterates buckets ([`Db::buckets`], [`Bucket::iter`]),
//!   looks keys up ([`Bucket::get`]) and verifies everything ([`Db::check`]).
//! - [`Writer`]: builds a new file from sorted key streams, bucket by bucket.
//! - [`etcd`]: etcd 3.5.1's backend schema (buckets, keys, value encodings).
//!
//! # File layout
//!
//! A file is an array of fixed-size pages (`page_size`, 4096 on amd64);
//! page `id` starts at byte `id * page_size`. All integers are
//! little-endian. Every page starts with a 16-byte header:
//!
//! | offset | size | field      | meaning                                            |
//! |-------:|-----:|------------|----------------------------------------------------|
//! | 0      | 8    | `id`       | the page's own id                                  |
//! | 8      | 2    | `flags`    | 0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist   |
//! | 10     | 2    | `count`    | elements (leaf/branch) or free ids (freelist)      |
//! | 12     | 4    | `overflow` | extra contiguous pages this page spans             |
//!
//! A page with `overflow = n` occupies pages `id..=id+n`; its elements and
//! data simply run on across them (that is how values larger than a page,
//! such as etcd's 1.5 MiB requests, are stored).
//!
//! **Meta pages** (ids 0 and 1, flag 0x04) hold after the header the 64-byte
//! meta struct: `magic u32 = 0xED0CDAED`, `version u32 = 2`, `page_size u32`,
//! `flags u32`, root bucket header (`root u64`, `sequence u64`),
//! `freelist u64` (page id, or `0xFFFF_FFFF_FFFF_FFFF` when the freelist is
//! not on disk: bbolt's `NoFreelistSync`, which etcd sets on Linux),
//! `pgid u64` (high-water mark: pages in use), `txid u64`, and `checksum
//! u64` = FNV-1a 64 of the 56 bytes before it. Each commit writes the meta
//! page `txid % 2`; a reader uses the valid one with the higher txid.
//!
//! **Leaf pages** (0x02) hold `count` 16-byte elements `flags u32, pos u32,
//! ksize u32, vsize u32`, then the keys and values. `pos` is the distance
//! from the element's own first byte to its key; the value follows the key.
//! Element flag 0x01 marks a nested bucket: the value is a bucket header
//! (`root u64, sequence u64`); if `root` is 0 the bucket is *inline* and a
//! leaf page (header with id 0, elements, data) follows the header inside
//! the value (bbolt inlines buckets whose page is at most `page_size / 4`).
//!
//! **Branch pages** (0x01) hold `count` 16-byte elements `pos u32, ksize
//! u32, pgid u64`, then the keys: element `i` points at child page `pgid`
//! whose keys are `>=` key `i` and `<` key `i + 1`.
//!
//! **Freelist page** (0x10) holds `count` u64 page ids; if `count` is
//! 0xFFFF the first u64 is the real count and the ids follow it.
//!
//! The **root bucket** (named by the meta) is a B+tree whose keys are the
//! top-level bucket names, each element flagged 0x01. bbolt never stores an
//! empty key, keys are at most 32768 bytes and values at most 2^31 - 2.
//!
//! # Worked example
//!
//! A file with one bucket `meta` holding `term = 00 00 00 00 00 00 00 02`,
//! as [`Writer`] lays it out with 4096-byte pages:
//!
//! ```text
//! page 0  meta   header {id 0, flags 0x04}; meta {magic ED0CDAED, version 2,
//!                page_size 4096, root {root 3, seq 0}, freelist 2, pgid 4,
//!                txid 0, checksum fnv1a64(first 56 bytes)}
//! page 1  meta   same with txid 1 (the one readers pick)
//! page 2  free   header {id 2, flags 0x10, count 0}
//! page 3  leaf   header {id 3, flags 0x02, count 1}
//!                element {flags 1, pos 16, ksize 4, vsize 60}   (bytes 16..32)
//!                "meta" (bytes 32..36)
//!                value: bucket header {root 0, seq 0}            (inline bucket)
//!                       + page {id 0, flags 0x02, count 1, overflow 0}
//!                       + element {flags 0, pos 16, ksize 4, vsize 8}
//!                       + "term" + 00 00 00 00 00 00 00 02
//! ```
//!
//! ```
//! use bolt::{Db, Writer, WriterOptions};
//! let mut w = Writer::new(std::io::Cursor::new(Vec::new()), WriterOptions::default())?;
//! w.write_sorted(b"meta", [(b"term".as_slice(), 2u64.to_be_bytes().as_slice())])?;
//! let (file, summary) = w.finish()?;
//! let file = file.into_inner();
//! assert_eq!((summary.pages, summary.root_page, file.len()), (4, 3, 4 * 4096));
//! // Page 3 as drawn above: header, one element, the key, the 60-byte value.
//! let p3 = &file[3 * 4096..];
//! assert_eq!(&p3[..16], &[3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0]);
//! assert_eq!(&p3[16..32], &[1, 0, 0, 0, 16, 0, 0, 0, 4, 0, 0, 0, 60, 0, 0, 0]);
//! assert_eq!(&p3[32..36], b"meta");
//! assert_eq!(&p3[36 + 16..36 + 32], &[0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0]);
//! assert_eq!(&p3[36 + 48..36 + 60], b"term\0\0\0\0\0\0\0\x02");
//! let db = Db::open(&file)?;
//! let meta = db.bucket(b"meta")?.expect("bucket");
//! assert!(meta.is_inline());
//! let term = meta.get(b"term")?.and_then(|v| v.data());
//! assert_eq!(term, Some(&2u64.to_be_bytes()[..]));
//! db.check()?;
//! # Ok::<(), bolt::Error>(())
//! ```
//!
//! # Bounds
//!
//! Reading borrows the file (no copy); see [`reader`] for the limits
//! ([`MAX_TREE_DEPTH`], [`MAX_BUCKET_NESTING`], page-visit budget) that
//! make corrupt files fail with an [`Error`] rather than panic or loop.
//! Writing holds one pending page per tree level; see [`writer`].

pub mod check;
pub mod error;
pub mod etcd;
pub mod layout;
pub mod reader;
pub mod snapshot;
pub mod writer;

pub use check::CheckReport;
pub use error::{Error, InputProblem, Location, MetaProblem, PageProblem};
pub use layout::{
    BucketHeader, Meta, PageHeader, DEFAULT_PAGE_SIZE, MAX_KEY_SIZE, MAX_PAGE_SIZE, MAX_VALUE_SIZE,
    MIN_PAGE_SIZE,
};
pub use reader::{Bucket, Buckets, Db, Iter, Value, MAX_BUCKET_NESTING, MAX_TREE_DEPTH};
pub use snapshot::{append_sha256, has_checksum, sha256, split_and_verify};
pub use writer::{
    write_to_vec, BucketWriter, Summary, Writer, WriterOptions, DEFAULT_FILL_PERCENT,
};
