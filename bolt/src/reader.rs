//! Reading a bbolt file held in memory.
//!
//! [`Db::open`] borrows the whole file as a byte slice (read it with
//! `std::fs::read`, or map it yourself): nothing is copied, every key and
//! value returned borrows from that slice. Memory use beyond the file
//! itself is one small stack frame per tree level while iterating
//! (at most [`MAX_TREE_DEPTH`] frames), and one bit per page in
//! [`Db::check`].
//!
//! Every offset, length and page id read from the file is bounds-checked:
//! a corrupt or truncated file yields an [`Error`], never a panic, never an
//! allocation sized by a field of the file, and never an endless walk
//! (trees deeper than [`MAX_TREE_DEPTH`] are rejected, one bucket's
//! iteration may visit at most as many pages as the file has, and keys must
//! strictly increase, so a cycle is reported as an error).

use crate::error::{Error, Location, MetaProblem, PageProblem};
use crate::layout::*;

/// Most levels one bucket's B+tree may have. With 4 KiB pages and at least
/// two elements per branch page, 32 levels would address 2^32 pages (16 TiB);
/// real trees have fewer than 8.
pub const MAX_TREE_DEPTH: usize = 32;

/// Most levels of buckets nested in buckets (the root bucket's children are
/// at level 1). etcd uses level 1 only.
pub const MAX_BUCKET_NESTING: usize = 16;

/// An open bbolt file: the chosen meta page plus the file's bytes.
#[derive(Debug, Clone, Copy)]
pub struct Db<'a> {
    data: &'a [u8],
    meta: Meta,
    meta_page: u64,
}

/// One page (with its overflow pages) or one inline bucket page.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageRef<'a> {
    pub(crate) at: Location,
    pub(crate) header: PageHeader,
    pub(crate) bytes: &'a [u8],
}

/// A leaf element: flags, key, value.
pub(crate) struct LeafElem<'a> {
    pub(crate) flags: u32,
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

/// A bucket: the root bucket, a top-level bucket or a nested one.
#[derive(Debug, Clone, Copy)]
pub struct Bucket<'a> {
    db: Db<'a>,
    header: BucketHeader,
    /// For an inline bucket: its page and where its value is stored.
    inline: Option<PageRef<'a>>,
    /// 0 for the root bucket, 1 for top-level buckets, ...
    nesting: usize,
}

/// A value in a bucket: data, or a nested bucket.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// Plain data.
    Data(&'a [u8]),
    /// A nested bucket (element flag [`BUCKET_LEAF_FLAG`]).
    Bucket(Bucket<'a>),
}

impl<'a> Value<'a> {
    /// The data, if this is not a bucket.
    pub fn data(&self) -> Option<&'a [u8]> {
        match self {
            Value::Data(d) => Some(d),
            Value::Bucket(_) => None,
        }
    }

    /// The bucket, if this is one.
    pub fn bucket(&self) -> Option<Bucket<'a>> {
        match self {
            Value::Data(_) => None,
            Value::Bucket(b) => Some(*b),
        }
    }
}

impl<'a> Db<'a> {
    /// Opens a bbolt file held in `data` (trailing bytes past the meta's
    /// high-water mark, such as a snapshot's SHA-256, are ignored).
    ///
    /// Both meta pages are validated (magic, version, FNV-1a 64 checksum,
    /// page size); the valid one with the higher txid is used.
    pub fn open(data: &'a [u8]) -> Result<Self, Error> {
        let len = data.len() as u64;
        if data.len() < PAGE_HEADER_SIZE + META_SIZE {
            return Err(Error::TooSmall { len });
        }
        let meta0 = read_meta(data, 0);
        let meta1 = match &meta0 {
            Ok(m) => read_meta(data, u64::from(m.page_size)),
            Err(_) => find_meta1(data),
        };
        let (meta, meta_page) = match (meta0, meta1) {
            (Ok(a), Ok(b)) if b.txid > a.txid => (b, 1),
            (Ok(a), _) => (a, 0),
            (Err(_), Ok(b)) => (b, 1),
            (Err(meta0), Err(meta1)) => return Err(Error::NoValidMeta { meta0, meta1 }),
        };
        check_meta_bounds(&meta, len)?;
        Ok(Db {
            data,
            meta,
            meta_page,
        })
    }

    /// The meta in use.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Which meta page (0 or 1) is in use.
    pub fn meta_page(&self) -> u64 {
        self.meta_page
    }

    /// Bytes per page.
    pub fn page_size(&self) -> u32 {
        self.meta.page_size
    }

    /// Size of the database proper, bytes: high-water mark times page size
    /// (what bbolt's `Tx.Size` reports and `Tx.WriteTo` writes).
    pub fn size(&self) -> u64 {
        self.meta.pgid * u64::from(self.meta.page_size)
    }

    /// The whole file given to [`Db::open`].
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    /// The root bucket, whose entries are the top-level buckets.
    pub fn root(&self) -> Bucket<'a> {
        Bucket {
            db: *self,
            header: self.meta.root,
            inline: None,
            nesting: 0,
        }
    }

    /// Iterates the top-level buckets in name order.
    pub fn buckets(&self) -> Buckets<'a> {
        Buckets {
            inner: self.root().iter(),
        }
    }

    /// The top-level bucket `name`, if present.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket<'a>>, Error> {
        self.root().bucket(name)
    }

    /// Page `id` with its overflow pages, bounds-checked.
    pub(crate) fn page(&self, id: u64) -> Result<PageRef<'a>, Error> {
        let ps = u64::from(self.meta.page_size);
        let high_water = self.meta.pgid;
        let err = |problem| Error::page(id, problem);
        if id >= high_water {
            return Err(err(PageProblem::BeyondHighWater {
                overflow: 0,
                high_water,
            }));
        }
        // id < pgid and pgid * ps <= len (checked at open): no overflow here.
        let start = id * ps;
        let header = PageHeader::decode(&self.data[start as usize..]).ok_or(err(
            PageProblem::BeyondFile {
                end: start + PAGE_HEADER_SIZE as u64,
                len: self.data.len() as u64,
            },
        ))?;
        if header.id != id {
            return Err(err(PageProblem::IdMismatch { found: header.id }));
        }
        let pages = u64::from(header.overflow) + 1;
        if id + pages > high_water {
            return Err(err(PageProblem::BeyondHighWater {
                overflow: header.overflow,
                high_water,
            }));
        }
        let end = (id + pages) * ps;
        Ok(PageRef {
            at: Location::Page(id),
            header,
            bytes: &self.data[start as usize..end as usize],
        })
    }

    /// Page `id`, which must be a leaf or a non-empty branch page.
    pub(crate) fn tree_page(&self, id: u64) -> Result<PageRef<'a>, Error> {
        let page = self.page(id)?;
        page.check_tree_kind()?;
        Ok(page)
    }
}

/// Reads and validates the meta page at byte `offset`.
fn read_meta(data: &[u8], offset: u64) -> Result<Meta, MetaProblem> {
    let truncated = MetaProblem::Truncated {
        len: data.len() as u64,
    };
    let start = usize::try_from(offset).map_err(|_| truncated.clone())?;
    let page = data.get(start..).ok_or(truncated.clone())?;
    let header = PageHeader::decode(page).ok_or(truncated.clone())?;
    let meta = page
        .get(PAGE_HEADER_SIZE..)
        .and_then(Meta::decode)
        .ok_or(truncated)?;
    if header.flags != META_PAGE_FLAG {
        return Err(MetaProblem::NotMeta(header.flags));
    }
    if meta.magic != MAGIC {
        return Err(MetaProblem::Magic(meta.magic));
    }
    if meta.version != VERSION {
        return Err(MetaProblem::Version(meta.version));
    }
    let computed = meta.compute_checksum();
    if meta.checksum != computed {
        return Err(MetaProblem::Checksum {
            stored: meta.checksum,
            computed,
        });
    }
    let ps = meta.page_size;
    if !ps.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&ps) {
        return Err(MetaProblem::PageSize(ps));
    }
    if offset != 0 && offset != u64::from(ps) {
        return Err(MetaProblem::Offset {
            offset,
            page_size: ps,
        });
    }
    Ok(meta)
}

/// Meta page 1 when meta page 0 is unusable: tried at the default page
/// size first, then at every other accepted page size.
fn find_meta1(data: &[u8]) -> Result<Meta, MetaProblem> {
    let first = read_meta(data, u64::from(DEFAULT_PAGE_SIZE));
    if first.is_ok() {
        return first;
    }
    let mut ps = MIN_PAGE_SIZE;
    while ps <= MAX_PAGE_SIZE {
        if ps != DEFAULT_PAGE_SIZE {
            if let Ok(m) = read_meta(data, u64::from(ps)) {
                return Ok(m);
            }
        }
        ps *= 2;
    }
    first
}

/// The chosen meta's high-water mark fits the file; root and freelist are real pages.
fn check_meta_bounds(meta: &Meta, len: u64) -> Result<(), Error> {
    let ps = u64::from(meta.page_size);
    let fits = meta.pgid.checked_mul(ps).is_some_and(|end| end <= len);
    if !fits || meta.pgid < 2 {
        return Err(Error::HighWaterBeyondFile {
            txid: meta.txid,
            pgid: meta.pgid,
            page_size: meta.page_size,
            len,
        });
    }
    let pointer = |what, id: u64| Error::MetaPointer {
        txid: meta.txid,
        what,
        id,
        pgid: meta.pgid,
    };
    if !(2..meta.pgid).contains(&meta.root.root) {
        return Err(pointer("root", meta.root.root));
    }
    if meta.freelist != PGID_NO_FREELIST && !(2..meta.pgid).contains(&meta.freelist) {
        return Err(pointer("freelist", meta.freelist));
    }
    Ok(())
}

impl<'a> PageRef<'a> {
    fn err(&self, problem: PageProblem) -> Error {
        Error::at(self.at, problem)
    }

    pub(crate) fn count(&self) -> usize {
        usize::from(self.header.count)
    }

    pub(crate) fn is_branch(&self) -> bool {
        self.header.flags == BRANCH_PAGE_FLAG
    }

    /// A tree page must be a leaf or a non-empty branch.
    pub(crate) fn check_tree_kind(&self) -> Result<(), Error> {
        match self.header.flags {
            LEAF_PAGE_FLAG => Ok(()),
            BRANCH_PAGE_FLAG if self.header.count > 0 => Ok(()),
            BRANCH_PAGE_FLAG => Err(self.err(PageProblem::EmptyBranch)),
            found => Err(self.err(PageProblem::Flags {
                found,
                expected: "leaf or branch",
            })),
        }
    }

    /// Element `index`'s header fields and its key/value bytes, bounds-checked.
    /// Returns (header offset, key, bytes after key up to `vsize`).
    fn element(
        &self,
        index: usize,
        pos_off: usize,
        ksize: u32,
        vsize: u32,
    ) -> Option<(&'a [u8], &'a [u8])> {
        let elem = PAGE_HEADER_SIZE + index * LEAF_ELEMENT_SIZE;
        let pos = u32_at(self.bytes, elem + pos_off)?;
        let kstart = elem.checked_add(pos as usize)?;
        let kend = kstart.checked_add(ksize as usize)?;
        let vend = kend.checked_add(vsize as usize)?;
        let key = self.bytes.get(kstart..kend)?;
        let value = self.bytes.get(kend..vend)?;
        Some((key, value))
    }

    /// Leaf element `index`.
    pub(crate) fn leaf(&self, index: usize) -> Result<LeafElem<'a>, Error> {
        let bounds = || self.err(PageProblem::ElementBounds { index });
        let elem = PAGE_HEADER_SIZE + index * LEAF_ELEMENT_SIZE;
        let flags = u32_at(self.bytes, elem).ok_or_else(bounds)?;
        let ksize = u32_at(self.bytes, elem + 8).ok_or_else(bounds)?;
        let vsize = u32_at(self.bytes, elem + 12).ok_or_else(bounds)?;
        let (key, value) = self.element(index, 4, ksize, vsize).ok_or_else(bounds)?;
        if flags & !BUCKET_LEAF_FLAG != 0 {
            return Err(self.err(PageProblem::ElementFlags { index, flags }));
        }
        if key.is_empty() {
            return Err(self.err(PageProblem::EmptyKey { index }));
        }
        Ok(LeafElem { flags, key, value })
    }

    /// Branch element `index`: its key and child page id.
    pub(crate) fn branch(&self, index: usize) -> Result<(&'a [u8], u64), Error> {
        let bounds = || self.err(PageProblem::ElementBounds { index });
        let elem = PAGE_HEADER_SIZE + index * BRANCH_ELEMENT_SIZE;
        let ksize = u32_at(self.bytes, elem + 4).ok_or_else(bounds)?;
        let child = u64_at(self.bytes, elem + 8).ok_or_else(bounds)?;
        let (key, _) = self.element(index, 0, ksize, 0).ok_or_else(bounds)?;
        if key.is_empty() {
            return Err(self.err(PageProblem::EmptyKey { index }));
        }
        Ok((key, child))
    }

    /// The bucket stored as leaf element `index` with value `value`.
    pub(crate) fn open_bucket(
        &self,
        db: Db<'a>,
        index: usize,
        value: &'a [u8],
        nesting: usize,
    ) -> Result<Bucket<'a>, Error> {
        if nesting > MAX_BUCKET_NESTING {
            return Err(self.err(PageProblem::NestedTooDeep {
                limit: MAX_BUCKET_NESTING,
            }));
        }
        let bad = || {
            self.err(PageProblem::BucketValue {
                index,
                len: value.len(),
            })
        };
        let header = BucketHeader::decode(value).ok_or_else(bad)?;
        if header.root != 0 {
            if value.len() != BUCKET_HEADER_SIZE {
                return Err(bad());
            }
            return Ok(Bucket {
                db,
                header,
                inline: None,
                nesting,
            });
        }
        let bytes = &value[BUCKET_HEADER_SIZE..];
        let page_header = PageHeader::decode(bytes).ok_or_else(bad)?;
        let containing = match self.at {
            Location::Page(id) | Location::Inline(id) => id,
        };
        let page = PageRef {
            at: Location::Inline(containing),
            header: page_header,
            bytes,
        };
        if page_header.flags != LEAF_PAGE_FLAG {
            return Err(page.err(PageProblem::Flags {
                found: page_header.flags,
                expected: "leaf (inline bucket)",
            }));
        }
        Ok(Bucket {
            db,
            header,
            inline: Some(page),
            nesting,
        })
    }
}

impl<'a> Bucket<'a> {
    /// The bucket's header (root page id, 0 when inline; sequence).
    pub fn header(&self) -> BucketHeader {
        self.header
    }

    /// Whether the bucket is stored inline in its parent's leaf.
    pub fn is_inline(&self) -> bool {
        self.inline.is_some()
    }

    /// Iterates the bucket's entries in key order.
    pub fn iter(&self) -> Iter<'a> {
        let mut it = Iter {
            db: self.db,
            stack: Vec::new(),
            prev: None,
            visited: 0,
            nesting: self.nesting,
            pending: None,
            done: false,
        };
        match self.inline {
            Some(page) => it.stack.push(Frame { page, next: 0 }),
            None => {
                if let Err(e) = it.push_page(self.header.root) {
                    it.pending = Some(e);
                }
            }
        }
        it
    }

    /// The root page of the bucket's tree (its inline page if inline).
    pub(crate) fn root_page(&self) -> Result<PageRef<'a>, Error> {
        match self.inline {
            Some(page) => Ok(page),
            None => self.db.tree_page(self.header.root),
        }
    }

    pub(crate) fn nesting(&self) -> usize {
        self.nesting
    }

    /// The value stored under `key`, if any (binary search down the tree).
    pub fn get(&self, key: &[u8]) -> Result<Option<Value<'a>>, Error> {
        let mut page = self.root_page()?;
        for _ in 0..MAX_TREE_DEPTH {
            if page.is_branch() {
                let child = search_branch(&page, key)?;
                page = self.db.tree_page(child)?;
                continue;
            }
            return match search_leaf(&page, key)? {
                None => Ok(None),
                Some((index, elem)) => self.value_of(&page, index, elem).map(Some),
            };
        }
        Err(page.err(PageProblem::TooDeep {
            limit: MAX_TREE_DEPTH,
        }))
    }

    /// The nested bucket `name`, if present (`None` also when `name` holds data).
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket<'a>>, Error> {
        Ok(self.get(name)?.and_then(|v| v.bucket()))
    }

    fn value_of(
        &self,
        page: &PageRef<'a>,
        index: usize,
        elem: LeafElem<'a>,
    ) -> Result<Value<'a>, Error> {
        if elem.flags & BUCKET_LEAF_FLAG != 0 {
            let b = page.open_bucket(self.db, index, elem.value, self.nesting + 1)?;
            Ok(Value::Bucket(b))
        } else {
            Ok(Value::Data(elem.value))
        }
    }
}

/// The child of branch `page` whose range holds `key` (bbolt's rule: the
/// last element whose key is <= `key`, or the first element).
fn search_branch(page: &PageRef<'_>, key: &[u8]) -> Result<u64, Error> {
    // Invariant: element `lo` key <= key or lo == 0; elements >= hi have key > key.
    let (mut lo, mut hi) = (0usize, page.count());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if page.branch(mid)?.0 <= key {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(page.branch(lo)?.1)
}

/// The element of leaf `page` whose key is `key`.
fn search_leaf<'a>(page: &PageRef<'a>, key: &[u8]) -> Result<Option<(usize, LeafElem<'a>)>, Error> {
    let (mut lo, mut hi) = (0usize, page.count());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let elem = page.leaf(mid)?;
        match elem.key.cmp(key) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Ok(Some((mid, elem))),
        }
    }
    Ok(None)
}

struct Frame<'a> {
    page: PageRef<'a>,
    next: usize,
}

/// Iterator over one bucket's entries in key order; yields each entry as
/// `(key, value)` or the first error (after which it ends).
pub struct Iter<'a> {
    db: Db<'a>,
    stack: Vec<Frame<'a>>,
    prev: Option<&'a [u8]>,
    visited: u64,
    nesting: usize,
    pending: Option<Error>,
    done: bool,
}

impl<'a> Iter<'a> {
    /// Loads tree page `id` onto the stack, enforcing the depth and page-visit limits.
    fn push_page(&mut self, id: u64) -> Result<(), Error> {
        if self.stack.len() >= MAX_TREE_DEPTH {
            return Err(Error::page(
                id,
                PageProblem::TooDeep {
                    limit: MAX_TREE_DEPTH,
                },
            ));
        }
        self.visited += 1;
        if self.visited > self.db.meta.pgid {
            return Err(Error::page(
                id,
                PageProblem::TooManyPages {
                    limit: self.db.meta.pgid,
                },
            ));
        }
        let page = self.db.tree_page(id)?;
        self.stack.push(Frame { page, next: 0 });
        Ok(())
    }

    fn step(&mut self) -> Result<Option<(&'a [u8], Value<'a>)>, Error> {
        loop {
            let Some(top) = self.stack.last_mut() else {
                return Ok(None);
            };
            let page = top.page;
            let index = top.next;
            if index >= page.count() {
                self.stack.pop();
                continue;
            }
            top.next += 1;
            if page.is_branch() {
                let (_, child) = page.branch(index)?;
                self.push_page(child)?;
                continue;
            }
            let elem = page.leaf(index)?;
            if self.prev.is_some_and(|p| p >= elem.key) {
                return Err(page.err(PageProblem::KeyOrder { index }));
            }
            self.prev = Some(elem.key);
            let value = if elem.flags & BUCKET_LEAF_FLAG != 0 {
                Value::Bucket(page.open_bucket(self.db, index, elem.value, self.nesting + 1)?)
            } else {
                Value::Data(elem.value)
            };
            return Ok(Some((elem.key, value)));
        }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = Result<(&'a [u8], Value<'a>), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(e) = self.pending.take() {
            self.done = true;
            return Some(Err(e));
        }
        match self.step() {
            Ok(Some(item)) => Some(Ok(item)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Iterator over the top-level buckets: `(name, bucket)` in name order.
pub struct Buckets<'a> {
    inner: Iter<'a>,
}

impl<'a> Iterator for Buckets<'a> {
    type Item = Result<(&'a [u8], Bucket<'a>), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let (name, value) = match self.inner.next()? {
            Ok(item) => item,
            Err(e) => return Some(Err(e)),
        };
        match value {
            Value::Bucket(b) => Some(Ok((name, b))),
            Value::Data(_) => {
                self.inner.done = true;
                let frame = self.inner.stack.last();
                let (at, index) = frame
                    .map_or((Location::Page(self.inner.db.meta.root.root), 0), |f| {
                        (f.page.at, f.next.saturating_sub(1))
                    });
                Some(Err(Error::at(at, PageProblem::NotABucket { index })))
            }
        }
    }
}
