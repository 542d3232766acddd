//! Typed errors: what is wrong, and on which page.

use std::fmt;

/// Where in the file a problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// A page of the file, by id.
    Page(u64),
    /// The inline page of a bucket whose value is stored in page `.0`.
    Inline(u64),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Page(id) => write!(f, "page {id}"),
            Location::Inline(id) => write!(f, "inline bucket page (value in page {id})"),
        }
    }
}

/// Why a meta page was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaProblem {
    /// The file ends before the meta struct.
    #[error("truncated: file is {len} bytes")]
    Truncated {
        /// File length, bytes.
        len: u64,
    },
    /// The page header does not carry the meta flag.
    #[error("page flags {0:#06x} are not the meta flag")]
    NotMeta(u16),
    /// Wrong magic number.
    #[error("magic {0:#010x} is not 0xed0cdaed")]
    Magic(u32),
    /// Unsupported format version.
    #[error("version {0} is not 2")]
    Version(u32),
    /// The FNV-1a 64 checksum does not match.
    #[error("checksum {stored:#018x} != computed {computed:#018x}")]
    Checksum {
        /// Checksum stored in the meta.
        stored: u64,
        /// Checksum of the stored fields.
        computed: u64,
    },
    /// The page size is not a power of two in the accepted range.
    #[error("page size {0} is not a power of two in [512, 65536]")]
    PageSize(u32),
    /// The meta was read at an offset that is not its own page size.
    #[error("meta read at offset {offset} but says page size {page_size}")]
    Offset {
        /// Offset the meta was read at, bytes.
        offset: u64,
        /// Page size the meta states, bytes.
        page_size: u32,
    },
}

/// What is wrong with a page or its contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageProblem {
    /// The page id is at or above the meta's high-water mark.
    #[error("page id (plus overflow {overflow}) beyond high-water mark {high_water}")]
    BeyondHighWater {
        /// Overflow pages the header claims.
        overflow: u32,
        /// The meta's `pgid`.
        high_water: u64,
    },
    /// The page (with its overflow) extends past the end of the file.
    #[error("page spans bytes up to {end} but the file has {len}")]
    BeyondFile {
        /// End offset of the page, bytes.
        end: u64,
        /// File length, bytes.
        len: u64,
    },
    /// The page header names another id.
    #[error("header says it is page {found}")]
    IdMismatch {
        /// The id in the header.
        found: u64,
    },
    /// The page has an unexpected type.
    #[error("flags {found:#06x}, expected {expected}")]
    Flags {
        /// The header's flags.
        found: u16,
        /// What was expected there.
        expected: &'static str,
    },
    /// An element header, key or value lies outside the page.
    #[error("element {index} lies outside the page")]
    ElementBounds {
        /// Element index.
        index: usize,
    },
    /// A leaf element has unknown flag bits.
    #[error("element {index} has unknown flags {flags:#x}")]
    ElementFlags {
        /// Element index.
        index: usize,
        /// The element's flags.
        flags: u32,
    },
    /// A branch page with no elements.
    #[error("branch page has no elements")]
    EmptyBranch,
    /// Keys not strictly increasing (within the page or across the bucket).
    #[error("key of element {index} is not greater than the previous key")]
    KeyOrder {
        /// Element index.
        index: usize,
    },
    /// A key outside the range its parent branch element allows.
    #[error("key of element {index} is outside the range of its parent branch element")]
    KeyRange {
        /// Element index.
        index: usize,
    },
    /// An empty key (bbolt never writes one).
    #[error("element {index} has an empty key")]
    EmptyKey {
        /// Element index.
        index: usize,
    },
    /// The tree is deeper than [`crate::MAX_TREE_DEPTH`] (or a branch points at itself).
    #[error("tree deeper than {limit} levels (cycle?)")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// Iterating one bucket visited more pages than the file has (a cycle).
    #[error("bucket iteration visited more than {limit} pages (cycle?)")]
    TooManyPages {
        /// The limit: the meta's high-water mark.
        limit: u64,
    },
    /// Leaves at different depths.
    #[error("leaf at depth {depth}, other leaves at depth {expected}")]
    UnevenDepth {
        /// Depth of this leaf.
        depth: usize,
        /// Depth of the first leaf seen.
        expected: usize,
    },
    /// A bucket value that is not a valid bucket header (plus inline page).
    #[error("element {index}: bad bucket value of {len} bytes")]
    BucketValue {
        /// Element index.
        index: usize,
        /// Value length.
        len: usize,
    },
    /// Buckets nested deeper than [`crate::MAX_BUCKET_NESTING`].
    #[error("buckets nested deeper than {limit}")]
    NestedTooDeep {
        /// The limit.
        limit: usize,
    },
    /// A top-level entry of the root bucket that is not a bucket.
    #[error("element {index} of the root bucket is not a bucket")]
    NotABucket {
        /// Element index.
        index: usize,
    },
    /// The page is reached twice (from two parents, or the freelist and a tree).
    #[error("page referenced more than once")]
    MultipleReferences,
    /// The page is both in the freelist and reachable.
    #[error("page is in the freelist and reachable")]
    ReachableFreed,
    /// The page is neither reachable nor in the freelist.
    #[error("page is neither reachable nor free")]
    UnreachableUnfreed,
    /// A freelist entry names a page outside `2..pgid` or twice.
    #[error("freelist entry {index} (page {id}) is invalid or repeated")]
    FreelistEntry {
        /// Entry index.
        index: usize,
        /// The page id it names.
        id: u64,
    },
}

/// Every error this crate returns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is too short to hold two meta pages.
    #[error("file is {len} bytes: too short for a bbolt file")]
    TooSmall {
        /// File length, bytes.
        len: u64,
    },
    /// Neither meta page is valid.
    #[error("no valid meta page: meta 0: {meta0}; meta 1: {meta1}")]
    NoValidMeta {
        /// Why meta page 0 was rejected.
        meta0: MetaProblem,
        /// Why meta page 1 was rejected.
        meta1: MetaProblem,
    },
    /// The chosen meta describes a database larger than the file.
    #[error("meta (txid {txid}) has high-water mark {pgid} pages of {page_size} bytes but the file has {len} bytes")]
    HighWaterBeyondFile {
        /// The meta's txid.
        txid: u64,
        /// The meta's high-water mark, pages.
        pgid: u64,
        /// Page size, bytes.
        page_size: u32,
        /// File length, bytes.
        len: u64,
    },
    /// The chosen meta's root or freelist page is not below its high-water mark (or is a meta page).
    #[error("meta (txid {txid}): {what} page {id} outside 2..{pgid}")]
    MetaPointer {
        /// The meta's txid.
        txid: u64,
        /// "root" or "freelist".
        what: &'static str,
        /// The page id.
        id: u64,
        /// The high-water mark.
        pgid: u64,
    },
    /// A structural problem in a page.
    #[error("{at}: {problem}")]
    Page {
        /// Where.
        at: Location,
        /// What.
        problem: PageProblem,
    },
    /// The writer was given an invalid key or value.
    #[error("bucket {bucket:?}: {problem}")]
    Input {
        /// The bucket (lossy UTF-8).
        bucket: String,
        /// What is wrong.
        problem: InputProblem,
    },
    /// Invalid writer options.
    #[error("invalid writer option: {0}")]
    Options(&'static str),
    /// The writer cannot finish the file (a bucket was left unfinished).
    #[error("file spoiled: {0}")]
    Spoiled(&'static str),
    /// The snapshot file has no SHA-256 trailer (size % 512 != 32).
    #[error("snapshot of {len} bytes has no sha256 trailer (size % 512 != 32)")]
    NoChecksum {
        /// File length, bytes.
        len: u64,
    },
    /// The snapshot's SHA-256 trailer does not match its content.
    #[error("snapshot sha256 mismatch: trailer {expected}, content {actual}")]
    ChecksumMismatch {
        /// The trailer, hex.
        expected: String,
        /// The content's hash, hex.
        actual: String,
    },
    /// Reading or writing failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// What is wrong with the writer's input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputProblem {
    /// Keys (and bucket names) must not be empty.
    #[error("empty key")]
    EmptyKey,
    /// Key longer than [`crate::MAX_KEY_SIZE`].
    #[error("key of {0} bytes is longer than 32768")]
    KeyTooLarge(usize),
    /// Value longer than [`crate::MAX_VALUE_SIZE`].
    #[error("value of {0} bytes is larger than 2^31-2")]
    ValueTooLarge(usize),
    /// Keys of a sorted stream are not strictly increasing.
    #[error("key {index} is not greater than the previous key")]
    NotSorted {
        /// Index of the offending key in the stream.
        index: u64,
    },
    /// The same key twice.
    #[error("duplicate key")]
    DuplicateKey,
    /// The same top-level bucket twice.
    #[error("bucket written twice")]
    DuplicateBucket,
}

impl Error {
    pub(crate) fn page(id: u64, problem: PageProblem) -> Self {
        Error::Page {
            at: Location::Page(id),
            problem,
        }
    }

    pub(crate) fn at(at: Location, problem: PageProblem) -> Self {
        Error::Page { at, problem }
    }

    pub(crate) fn input(bucket: &[u8], problem: InputProblem) -> Self {
        Error::Input {
            bucket: String::from_utf8_lossy(bucket).into_owned(),
            problem,
        }
    }
}
