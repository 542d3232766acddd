//! Writing a new bbolt file, streaming.
//!
//! [`Writer`] lays out a fresh file: placeholder meta pages 0 and 1, an
//! empty freelist at page 2, then each bucket's pages as its sorted
//! key/value pairs arrive, then the root bucket's pages; [`Writer::finish`]
//! seeks back and writes both meta pages (they name the root page and the
//! high-water mark, known only at the end: hence `Write + Seek`).
//!
//! Each bucket's B+tree is built bottom-up while keys stream in: a leaf
//! page is written as soon as it is full, and its first key goes to a
//! pending branch page one level up, which is written when full in turn.
//! The file is a valid bbolt file as bbolt 1.3.6 itself would accept it:
//! every page below the high-water mark is reachable (`Tx.Check` passes),
//! the freelist is on disk and empty (read as-is whether the opener sets
//! `NoFreelistSync` or not), small buckets (at most a quarter page) are
//! stored inline as bbolt does, values larger than a page get overflow pages.
//!
//! Why an empty on-disk freelist rather than bbolt's "no freelist"
//! marker ([`crate::layout::PGID_NO_FREELIST`]): bbolt 1.3.6 (etcd 3.5.1)
//! opens a file whose meta names a freelist page by reading that page,
//! whatever its `NoFreelistSync` option; with the marker it rebuilds the
//! list by walking every bucket instead. etcd opens its backend with
//! `NoFreelistSync: true` on Linux (server/mvcc/backend/config_linux.go),
//! so its first commit writes the marker and frees page 2; read-only
//! openers (`etcdutl snapshot status`) load the freelist only for
//! `Tx.Check`, which requires every page below the high-water mark to be
//! reachable or free, true here with no free page at all. The empty list is
//! also what older bolt/bbolt versions without the marker can read.
//!
//! # Memory bounds
//!
//! While a bucket is written the writer holds one pending page per tree
//! level (at most `page_size` bytes, or one element when that element is
//! larger than a page, e.g. a 1.5 MiB value), the previous key, and one
//! scratch page. A bucket of N keys needs about `log_fanout(N)` levels
//! (4 for 100 million revision keys). Across buckets it keeps each
//! top-level bucket's name and value (16 bytes, or at most a quarter page
//! for inline buckets) until [`Writer::finish`]. No key or value is held
//! twice: [`BucketWriter::put`] copies it into the pending page only.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};

use crate::error::{Error, InputProblem};
use crate::layout::*;

/// Default fraction of a page filled before a new page is started: etcd's
/// own for its sequentially written `key` bucket (bbolt's default is 0.5).
pub const DEFAULT_FILL_PERCENT: f64 = 0.9;
/// Smallest accepted fill fraction (bbolt's `minFillPercent`).
pub const MIN_FILL_PERCENT: f64 = 0.1;
/// Largest accepted fill fraction (bbolt's `maxFillPercent`).
pub const MAX_FILL_PERCENT: f64 = 1.0;
/// Fewest elements in a branch page (bbolt's `minKeysPerPage`): guarantees
/// each branch level has at most half the pages of the level below.
pub const MIN_BRANCH_ELEMENTS: usize = 2;
/// Page id of the freelist page in files this crate writes.
pub const FREELIST_PAGE: u64 = 2;
/// First page id available to bucket pages.
pub const FIRST_DATA_PAGE: u64 = 3;

/// How the file is laid out.
#[derive(Debug, Clone, Copy)]
pub struct WriterOptions {
    /// Bytes per page: a power of two in [`MIN_PAGE_SIZE`]..=[`MAX_PAGE_SIZE`]
    /// (etcd on amd64 uses 4096).
    pub page_size: u32,
    /// Fraction of a page filled before a new one is started, in
    /// [`MIN_FILL_PERCENT`]..=[`MAX_FILL_PERCENT`].
    pub fill_percent: f64,
    /// Transaction id of the newer meta page (the other gets `txid - 1`); at least 1.
    pub txid: u64,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            page_size: DEFAULT_PAGE_SIZE,
            fill_percent: DEFAULT_FILL_PERCENT,
            txid: 1,
        }
    }
}

/// What [`Writer::finish`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// High-water mark: pages in the file.
    pub pages: u64,
    /// File size, bytes (`pages * page_size`).
    pub bytes: u64,
    /// Page id of the root bucket's root page.
    pub root_page: u64,
    /// Top-level buckets written.
    pub buckets: u64,
    /// Key/value pairs written, all buckets.
    pub keys: u64,
}

/// Where pages go: the output, the next free page id, a scratch buffer.
struct Sink<W> {
    out: W,
    page_size: usize,
    threshold: usize,
    next_pgid: u64,
    scratch: Vec<u8>,
}

/// One element of a pending page.
struct Elem {
    ksize: u32,
    vsize: u32,
    /// Leaf: element flags. Branch: child page id.
    extra: u64,
}

/// A page being filled: element headers and concatenated keys and values.
struct PendingPage {
    branch: bool,
    elems: Vec<Elem>,
    data: Vec<u8>,
}

impl PendingPage {
    fn new(branch: bool) -> Self {
        Self {
            branch,
            elems: Vec::new(),
            data: Vec::new(),
        }
    }

    /// Serialized size, bytes.
    fn size(&self) -> usize {
        PAGE_HEADER_SIZE + self.elems.len() * LEAF_ELEMENT_SIZE + self.data.len()
    }

    fn first_key(&self) -> &[u8] {
        let k = self.elems.first().map_or(0, |e| e.ksize as usize);
        &self.data[..k]
    }

    fn push(&mut self, key: &[u8], value: &[u8], extra: u64) {
        self.elems.push(Elem {
            ksize: key.len() as u32,
            vsize: value.len() as u32,
            extra,
        });
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
    }

    /// Writes the page into `buf` (which must be at least `size()` bytes, zeroed) with header id `id`.
    fn serialize(&self, id: u64, overflow: u32, buf: &mut [u8]) {
        let flags = if self.branch {
            BRANCH_PAGE_FLAG
        } else {
            LEAF_PAGE_FLAG
        };
        let header = PageHeader {
            id,
            flags,
            count: self.elems.len() as u16,
            overflow,
        };
        header.encode(buf);
        let data_start = PAGE_HEADER_SIZE + self.elems.len() * LEAF_ELEMENT_SIZE;
        let mut data_off = data_start;
        for (i, e) in self.elems.iter().enumerate() {
            let at = PAGE_HEADER_SIZE + i * LEAF_ELEMENT_SIZE;
            let pos = (data_off - at) as u32;
            let el = &mut buf[at..at + LEAF_ELEMENT_SIZE];
            if self.branch {
                el[0..4].copy_from_slice(&pos.to_le_bytes());
                el[4..8].copy_from_slice(&e.ksize.to_le_bytes());
                el[8..16].copy_from_slice(&e.extra.to_le_bytes());
            } else {
                el[0..4].copy_from_slice(&(e.extra as u32).to_le_bytes());
                el[4..8].copy_from_slice(&pos.to_le_bytes());
                el[8..12].copy_from_slice(&e.ksize.to_le_bytes());
                el[12..16].copy_from_slice(&e.vsize.to_le_bytes());
            }
            data_off += e.ksize as usize + e.vsize as usize;
        }
        buf[data_start..data_off].copy_from_slice(&self.data);
    }
}

impl<W: Write> Sink<W> {
    /// Writes `page` at the next free page id (with overflow pages as needed); returns its id.
    fn write_page(&mut self, page: &PendingPage) -> Result<u64, Error> {
        let pages = page.size().div_ceil(self.page_size);
        let overflow = u32::try_from(pages - 1).map_err(|_| Error::Options("page too large"))?;
        let id = self.next_pgid;
        self.scratch.clear();
        self.scratch.resize(pages * self.page_size, 0);
        page.serialize(id, overflow, &mut self.scratch);
        self.out.write_all(&self.scratch)?;
        self.next_pgid += pages as u64;
        Ok(id)
    }
}

/// One tree level: the pending page and how many pages it already wrote.
struct Level {
    page: PendingPage,
    written: u64,
}

/// A B+tree built bottom-up from sorted elements.
struct TreeBuilder {
    levels: Vec<Level>,
}

impl TreeBuilder {
    fn new() -> Self {
        Self {
            levels: vec![Level {
                page: PendingPage::new(false),
                written: 0,
            }],
        }
    }

    /// Appends an element to level `level`, writing the pending page first if it is full.
    fn add<W: Write>(
        &mut self,
        sink: &mut Sink<W>,
        level: usize,
        key: &[u8],
        value: &[u8],
        extra: u64,
    ) -> Result<(), Error> {
        let page = &self.levels[level].page;
        let elem_size = LEAF_ELEMENT_SIZE + key.len() + value.len();
        let min = if page.branch { MIN_BRANCH_ELEMENTS } else { 1 };
        let full = page.elems.len() >= MAX_PAGE_ELEMENTS
            || (page.elems.len() >= min && page.size() + elem_size > sink.threshold);
        if full {
            self.flush(sink, level)?;
        }
        self.levels[level].page.push(key, value, extra);
        Ok(())
    }

    /// Writes level `level`'s pending page (if any) and adds it to the level above.
    fn flush<W: Write>(&mut self, sink: &mut Sink<W>, level: usize) -> Result<(), Error> {
        let branch = level > 0;
        let page = std::mem::replace(&mut self.levels[level].page, PendingPage::new(branch));
        if page.elems.is_empty() {
            return Ok(());
        }
        let id = sink.write_page(&page)?;
        self.levels[level].written += 1;
        if self.levels.len() == level + 1 {
            self.levels.push(Level {
                page: PendingPage::new(true),
                written: 0,
            });
        }
        self.add(sink, level + 1, page.first_key(), &[], id)
    }

    /// Writes all pending pages; returns the root page id.
    fn finish<W: Write>(mut self, sink: &mut Sink<W>) -> Result<u64, Error> {
        let mut level = 0;
        loop {
            let top = level + 1 == self.levels.len();
            if top && self.levels[level].written == 0 {
                return sink.write_page(&self.levels[level].page);
            }
            self.flush(sink, level)?;
            level += 1;
        }
    }
}

/// Writes a new bbolt file; see the module docs.
pub struct Writer<W: Write + Seek> {
    sink: Sink<W>,
    opts: WriterOptions,
    /// Offset of page 0 in `out`.
    start: u64,
    /// Top-level bucket name -> bucket value (header, or header + inline page).
    buckets: BTreeMap<Vec<u8>, Vec<u8>>,
    keys: u64,
    /// Why the file cannot be finished, if a bucket was abandoned.
    spoiled: Option<&'static str>,
}

impl<W: Write + Seek> Writer<W> {
    /// Starts a file at `out`'s current position: writes placeholder meta pages and the freelist page.
    pub fn new(mut out: W, opts: WriterOptions) -> Result<Self, Error> {
        let ps = opts.page_size;
        if !ps.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&ps) {
            return Err(Error::Options(
                "page_size must be a power of two in [512, 65536]",
            ));
        }
        if !(MIN_FILL_PERCENT..=MAX_FILL_PERCENT).contains(&opts.fill_percent) {
            return Err(Error::Options("fill_percent must be in [0.1, 1.0]"));
        }
        if opts.txid == 0 {
            return Err(Error::Options("txid must be at least 1"));
        }
        let start = out.stream_position()?;
        let page_size = ps as usize;
        let mut first = vec![0u8; FIRST_DATA_PAGE as usize * page_size];
        let freelist = PageHeader {
            id: FREELIST_PAGE,
            flags: FREELIST_PAGE_FLAG,
            count: 0,
            overflow: 0,
        };
        freelist.encode(&mut first[FREELIST_PAGE as usize * page_size..]);
        out.write_all(&first)?;
        Ok(Self {
            sink: Sink {
                out,
                page_size,
                threshold: (f64::from(ps) * opts.fill_percent) as usize,
                next_pgid: FIRST_DATA_PAGE,
                scratch: Vec::new(),
            },
            opts,
            start,
            buckets: BTreeMap::new(),
            keys: 0,
            spoiled: None,
        })
    }

    /// Starts top-level bucket `name`; feed it keys in strictly increasing
    /// order with [`BucketWriter::put`], then call [`BucketWriter::finish`].
    /// Dropping it unfinished spoils the file ([`Writer::finish`] fails).
    pub fn bucket(&mut self, name: &[u8]) -> Result<BucketWriter<'_, W>, Error> {
        check_key(name, name)?;
        if self.buckets.contains_key(name) {
            return Err(Error::input(name, InputProblem::DuplicateBucket));
        }
        Ok(BucketWriter {
            writer: self,
            name: name.to_vec(),
            inline: Some(PendingPage::new(false)),
            tree: TreeBuilder::new(),
            last: Vec::new(),
            count: 0,
            finished: false,
        })
    }

    /// Writes bucket `name` from pairs already in strictly increasing key order; returns the pair count.
    pub fn write_sorted<I, K, V>(&mut self, name: &[u8], pairs: I) -> Result<u64, Error>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut b = self.bucket(name)?;
        for (k, v) in pairs {
            b.put(k.as_ref(), v.as_ref())?;
        }
        b.finish()
    }

    /// Writes bucket `name` from pairs in any order (sorted here, in place); duplicate keys are an error.
    pub fn write_unsorted(
        &mut self,
        name: &[u8],
        mut pairs: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<u64, Error> {
        pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if pairs.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(Error::input(name, InputProblem::DuplicateKey));
        }
        self.write_sorted(name, pairs)
    }

    /// Writes the root bucket and both meta pages; returns the output and a summary.
    pub fn finish(mut self) -> Result<(W, Summary), Error> {
        if let Some(why) = self.spoiled {
            return Err(Error::Spoiled(why));
        }
        let mut root = TreeBuilder::new();
        for (name, value) in &self.buckets {
            root.add(&mut self.sink, 0, name, value, u64::from(BUCKET_LEAF_FLAG))?;
        }
        let root_page = root.finish(&mut self.sink)?;
        let ps = u64::from(self.opts.page_size);
        let pages = self.sink.next_pgid;
        let out = &mut self.sink.out;
        out.seek(SeekFrom::Start(self.start))?;
        let txid = self.opts.txid;
        let mut metas = vec![0u8; 2 * ps as usize];
        for t in [txid - 1, txid] {
            let page = t % 2;
            let off = (page * ps) as usize;
            write_meta(
                &mut metas[off..off + ps as usize],
                page,
                self.opts.page_size,
                root_page,
                pages,
                t,
            );
        }
        out.write_all(&metas)?;
        out.seek(SeekFrom::Start(self.start + pages * ps))?;
        out.flush()?;
        let summary = Summary {
            pages,
            bytes: pages * ps,
            root_page,
            buckets: self.buckets.len() as u64,
            keys: self.keys,
        };
        Ok((self.sink.out, summary))
    }
}

/// Encodes meta page `page` (header + meta struct with checksum) into `buf`.
fn write_meta(buf: &mut [u8], page: u64, page_size: u32, root: u64, pgid: u64, txid: u64) {
    PageHeader {
        id: page,
        flags: META_PAGE_FLAG,
        count: 0,
        overflow: 0,
    }
    .encode(buf);
    let mut meta = Meta {
        magic: MAGIC,
        version: VERSION,
        page_size,
        flags: 0,
        root: BucketHeader { root, sequence: 0 },
        freelist: FREELIST_PAGE,
        pgid,
        txid,
        checksum: 0,
    };
    meta.checksum = meta.compute_checksum();
    buf[PAGE_HEADER_SIZE..PAGE_HEADER_SIZE + META_SIZE].copy_from_slice(&meta.encode());
}

/// A key (or bucket name) bbolt accepts.
fn check_key(bucket: &[u8], key: &[u8]) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::input(bucket, InputProblem::EmptyKey));
    }
    if key.len() > MAX_KEY_SIZE {
        return Err(Error::input(bucket, InputProblem::KeyTooLarge(key.len())));
    }
    Ok(())
}

/// Streams one top-level bucket's pairs into a [`Writer`].
pub struct BucketWriter<'w, W: Write + Seek> {
    writer: &'w mut Writer<W>,
    name: Vec<u8>,
    /// Pairs held while the bucket still fits inline (at most a quarter page).
    inline: Option<PendingPage>,
    tree: TreeBuilder,
    last: Vec<u8>,
    count: u64,
    finished: bool,
}

impl<W: Write + Seek> BucketWriter<'_, W> {
    /// Adds a pair; keys must strictly increase.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        check_key(&self.name, key)?;
        if value.len() > MAX_VALUE_SIZE {
            return Err(Error::input(
                &self.name,
                InputProblem::ValueTooLarge(value.len()),
            ));
        }
        if self.count > 0 && key <= self.last.as_slice() {
            let index = self.count;
            return Err(Error::input(&self.name, InputProblem::NotSorted { index }));
        }
        self.last.clear();
        self.last.extend_from_slice(key);
        self.count += 1;
        let max_inline = self.writer.opts.page_size as usize / 4;
        if let Some(page) = &mut self.inline {
            if page.size() + LEAF_ELEMENT_SIZE + key.len() + value.len() <= max_inline {
                page.push(key, value, 0);
                return Ok(());
            }
            let page = self
                .inline
                .take()
                .unwrap_or_else(|| PendingPage::new(false));
            self.spill(&page)?;
        }
        self.tree.add(&mut self.writer.sink, 0, key, value, 0)
    }

    /// Moves the pairs held for inlining into the tree.
    fn spill(&mut self, page: &PendingPage) -> Result<(), Error> {
        let mut off = 0;
        for e in &page.elems {
            let k = &page.data[off..off + e.ksize as usize];
            off += e.ksize as usize;
            let v = &page.data[off..off + e.vsize as usize];
            off += e.vsize as usize;
            self.tree.add(&mut self.writer.sink, 0, k, v, 0)?;
        }
        Ok(())
    }

    /// Completes the bucket; returns its pair count.
    pub fn finish(mut self) -> Result<u64, Error> {
        let value = match self.inline.take() {
            Some(page) => {
                let mut value = BucketHeader::default().encode().to_vec();
                let start = value.len();
                value.resize(start + page.size(), 0);
                page.serialize(0, 0, &mut value[start..]);
                value
            }
            None => {
                let tree = std::mem::replace(&mut self.tree, TreeBuilder::new());
                let root = tree.finish(&mut self.writer.sink)?;
                BucketHeader { root, sequence: 0 }.encode().to_vec()
            }
        };
        let name = std::mem::take(&mut self.name);
        self.writer.buckets.insert(name, value);
        self.writer.keys += self.count;
        self.finished = true;
        Ok(self.count)
    }
}

impl<W: Write + Seek> Drop for BucketWriter<'_, W> {
    fn drop(&mut self) {
        if !self.finished {
            self.writer.spoiled = Some("a bucket was abandoned before BucketWriter::finish");
        }
    }
}

/// Writes a whole file into memory: buckets in any order, pairs in any
/// order (sorted here). For large data prefer [`Writer`] with sorted streams.
pub fn write_to_vec<N, I>(buckets: I, opts: WriterOptions) -> Result<Vec<u8>, Error>
where
    N: AsRef<[u8]>,
    I: IntoIterator<Item = (N, Vec<(Vec<u8>, Vec<u8>)>)>,
{
    let mut w = Writer::new(std::io::Cursor::new(Vec::new()), opts)?;
    for (name, pairs) in buckets {
        w.write_unsorted(name.as_ref(), pairs)?;
    }
    let (out, _) = w.finish()?;
    Ok(out.into_inner())
}
