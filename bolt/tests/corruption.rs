//! Corrupt and truncated files give an error or a valid read: never a
//! panic, a hang or a huge allocation.

use std::panic::{catch_unwind, AssertUnwindSafe};

use bolt::{write_to_vec, Db, Error, Meta, PageProblem, Value, WriterOptions};

/// Page size of the sample files: small, so a small file has many pages.
const PAGE: usize = 512;

/// A small file with every kind of page: branch levels, overflow values,
/// inline and empty buckets.
fn sample() -> Vec<u8> {
    let many = (0..400u32)
        .map(|i| {
            (
                format!("key-{i:05}").into_bytes(),
                vec![i as u8; (i % 7 * 13) as usize],
            )
        })
        .collect();
    let big = vec![
        (b"big".to_vec(), vec![0x5a; 3000]),
        (b"small".to_vec(), b"s".to_vec()),
    ];
    let inline = vec![
        (b"x".to_vec(), b"1".to_vec()),
        (b"y".to_vec(), b"2".to_vec()),
    ];
    let opts = WriterOptions {
        page_size: PAGE as u32,
        ..Default::default()
    };
    write_to_vec(
        vec![
            (&b"many"[..], many),
            (&b"big"[..], big),
            (&b"inline"[..], inline),
            (&b"empty"[..], vec![]),
        ],
        opts,
    )
    .unwrap()
}

/// Everything a reader does: open, check, iterate all buckets (nested
/// too), look keys up. Returns the first error.
fn exercise(file: &[u8]) -> Result<u64, Error> {
    let db = Db::open(file)?;
    let check = db.check();
    let mut seen = 0;
    for b in db.buckets() {
        let (name, bucket) = b?;
        seen += walk(bucket.iter())?;
        db.bucket(name)?;
        bucket.get(b"key-00123")?;
        bucket.get(b"big")?;
    }
    check.map(|_| seen)
}

fn walk(iter: bolt::Iter<'_>) -> Result<u64, Error> {
    let mut n = 0;
    for kv in iter {
        let (_, v) = kv?;
        n += 1;
        if let Value::Bucket(b) = v {
            n += walk(b.iter())?;
        }
    }
    Ok(n)
}

/// Runs [`exercise`], turning a panic into a test failure that names the case.
fn must_not_panic(file: &[u8], case: &str) -> Result<u64, Error> {
    catch_unwind(AssertUnwindSafe(|| exercise(file))).unwrap_or_else(|_| panic!("panic on {case}"))
}

/// xorshift64*: a seeded generator, enough for picking bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Rewrites meta page `page`'s struct with `edit` applied and a valid checksum.
fn edit_meta(file: &mut [u8], page: usize, edit: impl FnOnce(&mut Meta)) {
    let at = page * PAGE + 16;
    let mut meta = Meta::decode(&file[at..]).unwrap();
    edit(&mut meta);
    meta.checksum = meta.compute_checksum();
    file[at..at + 64].copy_from_slice(&meta.encode());
}

#[test]
fn sample_is_valid() {
    let file = sample();
    assert_eq!(exercise(&file).unwrap(), 400 + 2 + 2);
    let report = Db::open(&file).unwrap().check().unwrap();
    assert!(report.max_tree_depth >= 3, "{report:?}");
}

#[test]
fn every_truncation() {
    let file = sample();
    let pages = file.len() / PAGE;
    let mut ok = 0;
    for len in 0..file.len() {
        if must_not_panic(&file[..len], &format!("truncation to {len}")).is_ok() {
            ok += 1;
        }
    }
    assert_eq!(
        ok, 0,
        "every truncated file is rejected (the meta names all pages)"
    );
    // Truncations at a page boundary whose meta claims only the pages left:
    // the reader then meets page ids beyond the high-water mark.
    let mut errors = 0;
    for keep in 2..pages {
        let mut cut = file[..keep * PAGE].to_vec();
        for meta in 0..2 {
            edit_meta(&mut cut, meta, |m| m.pgid = keep as u64);
        }
        if must_not_panic(&cut, &format!("cut to {keep} pages")).is_err() {
            errors += 1;
        }
    }
    assert_eq!(errors, pages - 2);
}

#[test]
fn random_byte_flips() {
    let file = sample();
    let pages = file.len() / PAGE;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut errs, mut oks) = (0, 0);
    for round in 0..20_000 {
        let mut bad = file.clone();
        for _ in 0..=rng.below(4) {
            // Half the flips hit page headers and element arrays, where structure lives.
            let at = if rng.below(2) == 0 {
                rng.below(pages) * PAGE + rng.below(64)
            } else {
                rng.below(bad.len())
            };
            bad[at] ^= 1 << rng.below(8);
            if rng.below(4) == 0 {
                bad[at] = rng.next() as u8;
            }
        }
        match must_not_panic(&bad, &format!("round {round}")) {
            Ok(_) => oks += 1,
            Err(_) => errs += 1,
        }
    }
    assert!(errs > 1000 && oks > 100, "errors {errs}, ok {oks}");
}

#[test]
fn random_meta_fields_with_valid_checksums() {
    let file = sample();
    let mut rng = Rng(42);
    let mut errs = 0;
    for round in 0..5_000 {
        let mut bad = file.clone();
        let page = rng.below(2);
        let v = match rng.below(3) {
            0 => rng.next(),
            1 => rng.next() % 64,
            _ => u64::MAX - rng.next() % 4,
        };
        edit_meta(&mut bad, page, |m| match rng.below(5) {
            0 => m.pgid = v,
            1 => m.root.root = v,
            2 => m.freelist = v,
            3 => m.page_size = v as u32,
            _ => m.txid = v,
        });
        if must_not_panic(&bad, &format!("meta round {round}")).is_err() {
            errs += 1;
        }
    }
    assert!(errs > 1000, "errors {errs}");
}

/// Offset of the first branch page of `file` and its id.
fn first_branch(file: &[u8]) -> usize {
    (2..file.len() / PAGE)
        .find(|&p| u16::from_le_bytes([file[p * PAGE + 8], file[p * PAGE + 9]]) == 0x01)
        .expect("a branch page")
}

#[test]
fn cycles_are_errors_not_hangs() {
    let file = sample();
    let branch = first_branch(&file);
    let elem = |i: usize| branch * PAGE + 16 + i * 16 + 8;

    // A branch element pointing at its own page.
    let mut own = file.clone();
    own[elem(1)..elem(1) + 8].copy_from_slice(&(branch as u64).to_le_bytes());
    let db = Db::open(&own).unwrap();
    assert!(db.check().is_err());
    let iter_err = db
        .buckets()
        .map(|b| walk(b.unwrap().1.iter()))
        .find(|r| r.is_err());
    assert!(iter_err.is_some(), "iteration must fail on a cycle");

    // Two elements pointing at the same child.
    let mut twice = file.clone();
    let child0 = twice[elem(0)..elem(0) + 8].to_vec();
    twice[elem(1)..elem(1) + 8].copy_from_slice(&child0);
    let db = Db::open(&twice).unwrap();
    assert!(matches!(
        db.check(),
        Err(Error::Page {
            problem: PageProblem::MultipleReferences | PageProblem::KeyRange { .. },
            ..
        })
    ));
    let iter_err = db
        .buckets()
        .map(|b| walk(b.unwrap().1.iter()))
        .find(|r| r.is_err());
    assert!(matches!(
        iter_err,
        Some(Err(Error::Page {
            problem: PageProblem::KeyOrder { .. },
            ..
        }))
    ));

    // A branch element pointing at a meta page.
    let mut meta = file.clone();
    meta[elem(0)..elem(0) + 8].copy_from_slice(&0u64.to_le_bytes());
    assert!(exercise(&meta).is_err());
}

#[test]
fn unreachable_page_is_reported_when_freelist_is_synced() {
    let file = sample();
    let mut grown = file.clone();
    grown.extend_from_slice(&[0u8; PAGE]);
    let pages = (grown.len() / PAGE) as u64;
    for meta in 0..2 {
        edit_meta(&mut grown, meta, |m| m.pgid = pages);
    }
    let err = Db::open(&grown).unwrap().check().unwrap_err();
    assert!(
        matches!(err, Error::Page { problem: PageProblem::UnreachableUnfreed, at } if at == bolt::Location::Page(pages - 1)),
        "{err}"
    );
    // Without a freelist on disk the same page counts as free.
    for meta in 0..2 {
        edit_meta(&mut grown, meta, |m| m.freelist = u64::MAX);
    }
    let report = Db::open(&grown).unwrap().check().unwrap();
    assert_eq!(
        report.free_pages, 2,
        "the old freelist page and the new page"
    );
}
