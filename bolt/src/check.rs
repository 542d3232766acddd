//! A full consistency check of a bbolt file, the counterpart of bbolt's
//! `Tx.Check` (which `etcdutl snapshot status` runs) plus key-order checks.
//!
//! Memory: two bitmaps of one bit per page below the high-water mark
//! (64 KiB per GiB of 4 KiB pages), and recursion no deeper than
//! [`MAX_TREE_DEPTH`] x [`crate::MAX_BUCKET_NESTING`] frames.

use crate::error::{Error, PageProblem};
use crate::layout::*;
use crate::reader::{Bucket, Db, PageRef, MAX_TREE_DEPTH};

/// What [`Db::check`] found in a consistent file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckReport {
    /// Buckets at every nesting level (not counting the root bucket).
    pub buckets: u64,
    /// Top-level buckets.
    pub top_level_buckets: u64,
    /// Data (non-bucket) entries in all buckets.
    pub keys: u64,
    /// Pages reachable from the meta (meta pages, freelist, trees, overflow).
    pub reachable_pages: u64,
    /// Pages listed in the freelist, or (no freelist on disk) unreachable pages.
    pub free_pages: u64,
    /// Whether the freelist is stored on disk.
    pub freelist_synced: bool,
    /// Levels of the deepest bucket tree (1: a single leaf page).
    pub max_tree_depth: usize,
}

/// One bit per page.
struct PageSet {
    bits: Vec<u64>,
}

impl PageSet {
    fn new(pages: u64) -> Self {
        // pages <= file length / page size, checked when the Db was opened.
        Self {
            bits: vec![0; pages.div_ceil(64) as usize],
        }
    }

    fn contains(&self, id: u64) -> bool {
        self.bits[(id / 64) as usize] & (1 << (id % 64)) != 0
    }

    /// Adds `id`; false if it was already present.
    fn insert(&mut self, id: u64) -> bool {
        let was = self.contains(id);
        self.bits[(id / 64) as usize] |= 1 << (id % 64);
        !was
    }
}

struct Checker<'a> {
    db: Db<'a>,
    reachable: PageSet,
    freed: PageSet,
    report: CheckReport,
    leaf_depth: Option<usize>,
}

impl<'a> Db<'a> {
    /// Walks every page, bucket and key: every page below the high-water
    /// mark must be reachable exactly once or free (when the freelist is on
    /// disk), keys strictly increase and respect their parents' ranges, and
    /// all leaves of a tree are at the same depth. Returns the first problem.
    pub fn check(&self) -> Result<CheckReport, Error> {
        let pgid = self.meta().pgid;
        let mut c = Checker {
            db: *self,
            reachable: PageSet::new(pgid),
            freed: PageSet::new(pgid),
            report: CheckReport::default(),
            leaf_depth: None,
        };
        c.reachable.insert(0);
        c.reachable.insert(1);
        c.read_freelist()?;
        c.bucket(&self.root())?;
        c.unreachable()?;
        c.report.reachable_pages = (0..pgid).filter(|&i| c.reachable.contains(i)).count() as u64;
        Ok(c.report)
    }
}

impl<'a> Checker<'a> {
    fn read_freelist(&mut self) -> Result<(), Error> {
        let id = self.db.meta().freelist;
        if id == PGID_NO_FREELIST {
            return Ok(());
        }
        self.report.freelist_synced = true;
        let page = self.db.page(id)?;
        if page.header.flags != FREELIST_PAGE_FLAG {
            return Err(Error::page(
                id,
                PageProblem::Flags {
                    found: page.header.flags,
                    expected: "freelist",
                },
            ));
        }
        self.mark(&page)?;
        let (first, count) = freelist_count(&page)?;
        for index in 0..count {
            let off = PAGE_HEADER_SIZE + (first + index) * 8;
            let bad = |free| Error::page(id, PageProblem::FreelistEntry { index, id: free });
            let free = u64_at(page.bytes, off).ok_or_else(|| bad(u64::MAX))?;
            if !(2..self.db.meta().pgid).contains(&free) || !self.freed.insert(free) {
                return Err(bad(free));
            }
            self.report.free_pages += 1;
        }
        Ok(())
    }

    /// Marks `page` and its overflow pages reachable.
    fn mark(&mut self, page: &PageRef<'a>) -> Result<(), Error> {
        let first = page.header.id;
        for id in first..=first + u64::from(page.header.overflow) {
            if !self.reachable.insert(id) {
                return Err(Error::page(id, PageProblem::MultipleReferences));
            }
            if self.freed.contains(id) {
                return Err(Error::page(id, PageProblem::ReachableFreed));
            }
        }
        Ok(())
    }

    fn bucket(&mut self, bucket: &Bucket<'a>) -> Result<(), Error> {
        let saved_depth = self.leaf_depth.take();
        let root = bucket.root_page()?;
        if !bucket.is_inline() {
            self.mark(&root)?;
        }
        self.tree(bucket, root, 1, None, None)?;
        self.leaf_depth = saved_depth;
        Ok(())
    }

    /// Checks the subtree at `page` (already marked), whose keys must lie in `[lo, hi)`.
    fn tree(
        &mut self,
        bucket: &Bucket<'a>,
        page: PageRef<'a>,
        depth: usize,
        lo: Option<&'a [u8]>,
        hi: Option<&'a [u8]>,
    ) -> Result<(), Error> {
        if depth > MAX_TREE_DEPTH {
            return Err(Error::at(
                page.at,
                PageProblem::TooDeep {
                    limit: MAX_TREE_DEPTH,
                },
            ));
        }
        if page.is_branch() {
            return self.branch(bucket, page, depth, lo, hi);
        }
        let expected = *self.leaf_depth.get_or_insert(depth);
        self.report.max_tree_depth = self.report.max_tree_depth.max(depth);
        if expected != depth {
            return Err(Error::at(
                page.at,
                PageProblem::UnevenDepth { depth, expected },
            ));
        }
        let mut prev: Option<&[u8]> = None;
        for index in 0..page.count() {
            let elem = page.leaf(index)?;
            check_key(&page, index, elem.key, prev, lo, hi)?;
            prev = Some(elem.key);
            if elem.flags & BUCKET_LEAF_FLAG == 0 {
                if bucket.nesting() == 0 {
                    return Err(Error::at(page.at, PageProblem::NotABucket { index }));
                }
                self.report.keys += 1;
                continue;
            }
            let child = page.open_bucket(self.db, index, elem.value, bucket.nesting() + 1)?;
            self.report.buckets += 1;
            if bucket.nesting() == 0 {
                self.report.top_level_buckets += 1;
            }
            self.bucket(&child)?;
        }
        Ok(())
    }

    fn branch(
        &mut self,
        bucket: &Bucket<'a>,
        page: PageRef<'a>,
        depth: usize,
        lo: Option<&'a [u8]>,
        hi: Option<&'a [u8]>,
    ) -> Result<(), Error> {
        let count = page.count();
        let mut prev: Option<&[u8]> = None;
        for index in 0..count {
            let (key, child_id) = page.branch(index)?;
            check_key(&page, index, key, prev, lo, hi)?;
            prev = Some(key);
            let next = if index + 1 < count {
                Some(page.branch(index + 1)?.0)
            } else {
                hi
            };
            let child = self.db.tree_page(child_id)?;
            self.mark(&child)?;
            self.tree(bucket, child, depth + 1, Some(key), next)?;
        }
        Ok(())
    }

    /// Every page below the high-water mark is reachable or free.
    fn unreachable(&mut self) -> Result<(), Error> {
        for id in 2..self.db.meta().pgid {
            if self.reachable.contains(id) || self.freed.contains(id) {
                continue;
            }
            if self.report.freelist_synced {
                return Err(Error::page(id, PageProblem::UnreachableUnfreed));
            }
            self.report.free_pages += 1;
        }
        Ok(())
    }
}

/// Index of the first id and the number of ids in a freelist page.
fn freelist_count(page: &PageRef<'_>) -> Result<(usize, usize), Error> {
    if page.header.count != FREELIST_COUNT_OVERFLOW {
        return Ok((0, page.count()));
    }
    let bounds = || Error::at(page.at, PageProblem::ElementBounds { index: 0 });
    let count = u64_at(page.bytes, PAGE_HEADER_SIZE).ok_or_else(bounds)?;
    // Every id must fit in the page: bounds the loop by the page's size.
    let room = ((page.bytes.len() - PAGE_HEADER_SIZE) / 8 - 1) as u64;
    if count > room {
        return Err(Error::at(
            page.at,
            PageProblem::ElementBounds {
                index: room as usize,
            },
        ));
    }
    Ok((1, count as usize))
}

/// `key` is after `prev` and inside `[lo, hi)`.
fn check_key(
    page: &PageRef<'_>,
    index: usize,
    key: &[u8],
    prev: Option<&[u8]>,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
) -> Result<(), Error> {
    if prev.is_some_and(|p| p >= key) {
        return Err(Error::at(page.at, PageProblem::KeyOrder { index }));
    }
    if lo.is_some_and(|l| key < l) || hi.is_some_and(|h| key >= h) {
        return Err(Error::at(page.at, PageProblem::KeyRange { index }));
    }
    Ok(())
}
