//! Write -> read round trips through the public API.

use std::io::Cursor;

use bolt::{
    write_to_vec, Db, Error, InputProblem, MetaProblem, PageProblem, Value, Writer, WriterOptions,
    MAX_KEY_SIZE,
};

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Reads every bucket back as (name, pairs), checking the file first.
fn read_all(file: &[u8]) -> Vec<(Vec<u8>, Pairs)> {
    let db = Db::open(file).expect("open");
    db.check().expect("check");
    db.buckets()
        .map(|b| {
            let (name, bucket) = b.expect("bucket");
            let pairs = bucket
                .iter()
                .map(|kv| {
                    let (k, v) = kv.expect("entry");
                    (k.to_vec(), v.data().expect("data, not a bucket").to_vec())
                })
                .collect();
            (name.to_vec(), pairs)
        })
        .collect()
}

/// Writes `buckets`, reads them back and compares with the sorted input.
fn round_trip(buckets: Vec<(Vec<u8>, Pairs)>, opts: WriterOptions) -> Vec<u8> {
    let file = write_to_vec(buckets.clone(), opts).expect("write");
    assert_eq!(file.len() % opts.page_size as usize, 0);
    let mut expected = buckets;
    expected.sort();
    for (_, pairs) in &mut expected {
        pairs.sort();
    }
    assert!(
        read_all(&file) == expected,
        "read back differs from written"
    );
    // Point lookups find every key and nothing else.
    let db = Db::open(&file).unwrap();
    for (name, pairs) in &expected {
        let b = db.bucket(name).unwrap().expect("bucket by name");
        for (k, v) in pairs.iter().step_by(pairs.len() / 500 + 1) {
            assert_eq!(b.get(k).unwrap().and_then(|v| v.data()), Some(v.as_slice()));
            let mut absent = k.clone();
            absent.push(0xff);
            if !pairs.iter().any(|(k2, _)| *k2 == absent) {
                assert!(b.get(&absent).unwrap().is_none());
            }
        }
    }
    assert!(db.bucket(b"no such bucket").unwrap().is_none());
    file
}

fn kv(k: impl Into<Vec<u8>>, v: impl Into<Vec<u8>>) -> (Vec<u8>, Vec<u8>) {
    (k.into(), v.into())
}

#[test]
fn no_buckets() {
    let file = round_trip(vec![], WriterOptions::default());
    let db = Db::open(&file).unwrap();
    assert_eq!(db.meta().pgid, 4);
    assert_eq!(db.meta().txid, 1);
    assert_eq!(db.meta_page(), 1);
    assert_eq!(db.check().unwrap().top_level_buckets, 0);
}

#[test]
fn empty_buckets_are_inline() {
    let names = ["key", "meta", "lease", "alarm", "auth"];
    let file = round_trip(
        names
            .iter()
            .map(|n| (n.as_bytes().to_vec(), vec![]))
            .collect(),
        WriterOptions::default(),
    );
    let db = Db::open(&file).unwrap();
    for n in names {
        let b = db.bucket(n.as_bytes()).unwrap().unwrap();
        assert!(b.is_inline());
        assert_eq!(b.iter().count(), 0);
    }
    let report = db.check().unwrap();
    assert_eq!((report.top_level_buckets, report.keys), (5, 0));
}

#[test]
fn many_buckets_in_any_order() {
    // 600 buckets (the root bucket needs several pages), written in reverse
    // order; every third one big enough not to be inline.
    let buckets: Vec<_> = (0..600u32)
        .rev()
        .map(|i| {
            let n = if i % 3 == 0 { 40 } else { i % 5 };
            let pairs = (0..n)
                .map(|j| kv(format!("k{j:03}"), vec![i as u8; 30]))
                .collect();
            (format!("bucket-{i:04}").into_bytes(), pairs)
        })
        .collect();
    let file = round_trip(buckets, WriterOptions::default());
    let report = Db::open(&file).unwrap().check().unwrap();
    assert_eq!(report.top_level_buckets, 600);
    assert!(
        report.max_tree_depth >= 2,
        "root bucket should be a multi-page tree"
    );
}

#[test]
fn hundred_thousand_keys_make_a_multi_level_tree() {
    let pairs: Pairs = (0..100_000u64)
        .map(|i| kv(i.to_be_bytes().to_vec(), format!("value-{i}")))
        .collect();
    let file = round_trip(vec![(b"key".to_vec(), pairs)], WriterOptions::default());
    let report = Db::open(&file).unwrap().check().unwrap();
    assert_eq!(report.keys, 100_000);
    assert!(
        report.max_tree_depth >= 3,
        "depth {}",
        report.max_tree_depth
    );
}

#[test]
fn value_and_key_sizes() {
    let big = vec![0xabu8; 1536 * 1024];
    let pairs = vec![
        kv("a", vec![]),
        kv("b", vec![1u8; 4096]),
        kv("c", big.clone()),
        kv("d", vec![2u8; 4000]),
        kv(vec![b'k'; 1536], vec![3u8; 10]),
        kv(vec![b'l'; MAX_KEY_SIZE], vec![4u8; 5000]),
        kv("z", vec![]),
    ];
    let file = round_trip(
        vec![
            (b"sizes".to_vec(), pairs.clone()),
            (b"big".to_vec(), vec![kv("x", big)]),
        ],
        WriterOptions::default(),
    );
    // The 1.5 MiB value spans overflow pages: the file holds it twice plus a little.
    assert!(file.len() > 3 * 1024 * 1024 && file.len() < 4 * 1024 * 1024);
    for fill in [0.1, 0.5, 1.0] {
        for page_size in [512, 4096, 16384, 65536] {
            let opts = WriterOptions {
                page_size,
                fill_percent: fill,
                txid: 7,
            };
            let file = round_trip(vec![(b"sizes".to_vec(), pairs.clone())], opts);
            let db = Db::open(&file).unwrap();
            assert_eq!(
                (db.page_size(), db.meta().txid, db.meta_page()),
                (page_size, 7, 1)
            );
        }
    }
}

#[test]
fn many_small_pairs_per_page_and_tiny_pages() {
    let pairs: Pairs = (0..5000u32)
        .map(|i| kv(i.to_be_bytes().to_vec(), vec![]))
        .collect();
    for page_size in [512, 65536] {
        let opts = WriterOptions {
            page_size,
            fill_percent: 1.0,
            txid: 2,
        };
        round_trip(vec![(b"k".to_vec(), pairs.clone())], opts);
    }
}

#[test]
fn streaming_writer_api() {
    let mut w = Writer::new(Cursor::new(Vec::new()), WriterOptions::default()).unwrap();
    let mut b = w.bucket(b"stream").unwrap();
    for i in 0..20_000u32 {
        b.put(&i.to_be_bytes(), &[1; 100]).unwrap();
    }
    assert_eq!(b.finish().unwrap(), 20_000);
    w.write_sorted(b"other", [("a", "1"), ("b", "2")]).unwrap();
    let (out, summary) = w.finish().unwrap();
    let file = out.into_inner();
    assert_eq!(summary.bytes as usize, file.len());
    assert_eq!((summary.buckets, summary.keys), (2, 20_002));
    let db = Db::open(&file).unwrap();
    assert_eq!(db.size(), summary.bytes);
    assert_eq!(db.meta().root.root, summary.root_page);
    let report = db.check().unwrap();
    assert_eq!(report.keys, 20_002);
    assert_eq!(report.reachable_pages, summary.pages);
    assert_eq!(report.free_pages, 0);
    assert!(report.freelist_synced);
}

#[test]
fn writer_rejects_bad_input() {
    let input = |r: Result<u64, Error>| match r {
        Err(Error::Input { problem, .. }) => problem,
        other => panic!("expected an input error, got {other:?}"),
    };
    let mut w = Writer::new(Cursor::new(Vec::new()), WriterOptions::default()).unwrap();
    assert_eq!(
        input(w.write_sorted(b"b", [("b", ""), ("a", "")])),
        InputProblem::NotSorted { index: 1 }
    );
    let mut w = Writer::new(Cursor::new(Vec::new()), WriterOptions::default()).unwrap();
    assert_eq!(
        input(w.write_sorted(b"b", [("a", ""), ("a", "")])),
        InputProblem::NotSorted { index: 1 }
    );
    let mut w = Writer::new(Cursor::new(Vec::new()), WriterOptions::default()).unwrap();
    assert_eq!(
        input(w.write_unsorted(b"b", vec![kv("a", ""), kv("a", "x")])),
        InputProblem::DuplicateKey
    );
    assert_eq!(
        input(w.write_unsorted(b"b", vec![kv("", "")])),
        InputProblem::EmptyKey
    );
    assert_eq!(
        input(w.write_unsorted(b"b", vec![kv(vec![1; MAX_KEY_SIZE + 1], "")])),
        InputProblem::KeyTooLarge(MAX_KEY_SIZE + 1)
    );
    assert!(matches!(w.finish(), Err(Error::Spoiled(_))));

    let mut w = Writer::new(Cursor::new(Vec::new()), WriterOptions::default()).unwrap();
    w.write_unsorted(b"b", vec![]).unwrap();
    assert_eq!(
        input(w.write_unsorted(b"b", vec![])),
        InputProblem::DuplicateBucket
    );
    assert_eq!(input(w.write_unsorted(b"", vec![])), InputProblem::EmptyKey);
    // Errors before a bucket starts leave the writer usable.
    let (out, _) = w.finish().unwrap();
    assert_eq!(read_all(&out.into_inner()).len(), 1);

    for opts in [
        WriterOptions {
            page_size: 1000,
            ..Default::default()
        },
        WriterOptions {
            fill_percent: 0.05,
            ..Default::default()
        },
        WriterOptions {
            txid: 0,
            ..Default::default()
        },
    ] {
        assert!(matches!(
            Writer::new(Cursor::new(Vec::new()), opts),
            Err(Error::Options(_))
        ));
    }
}

#[test]
fn newest_valid_meta_wins() {
    let opts = WriterOptions {
        txid: 10,
        ..Default::default()
    };
    let file = write_to_vec(vec![(b"a", vec![kv("k", "v")])], opts).unwrap();
    let db = Db::open(&file).unwrap();
    assert_eq!((db.meta_page(), db.meta().txid), (0, 10));

    // Corrupt the newer meta (page 0): the older one (page 1, txid 9) is used.
    let mut bad = file.clone();
    bad[16 + 40] ^= 1; // pgid field
    let db = Db::open(&bad).unwrap();
    assert_eq!((db.meta_page(), db.meta().txid), (1, 9));
    // Page size is then found from meta 1 at the default offset.
    bad[16] ^= 1; // magic
    assert_eq!(Db::open(&bad).unwrap().meta_page(), 1);

    // Both bad: a typed error naming both problems.
    bad[4096 + 16 + 4] = 3; // version of meta 1
    match Db::open(&bad) {
        Err(Error::NoValidMeta { meta0, meta1 }) => {
            assert_eq!(meta0, MetaProblem::Magic(0xED0C_DAEC));
            assert_eq!(meta1, MetaProblem::Version(3));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn nested_buckets_are_reported() {
    // Build a root-bucket leaf by hand: bucket "outer" holding nested inline
    // bucket "inner" with one pair. Reuse the writer for everything else.
    let inner_page = {
        let mut v = vec![0u8; 16 + 16 + 1 + 1];
        v[8..10].copy_from_slice(&2u16.to_le_bytes()); // leaf
        v[10..12].copy_from_slice(&1u16.to_le_bytes()); // count
        v[16 + 4..16 + 8].copy_from_slice(&16u32.to_le_bytes()); // pos
        v[16 + 8..16 + 12].copy_from_slice(&1u32.to_le_bytes()); // ksize
        v[16 + 12..16 + 16].copy_from_slice(&1u32.to_le_bytes()); // vsize
        v[32] = b'x';
        v[33] = b'y';
        v
    };
    let mut inner_value = vec![0u8; 16];
    inner_value.extend_from_slice(&inner_page);
    // Write "outer" with a placeholder value of the right size, then flip its element flag.
    let file = write_to_vec(
        vec![(
            b"outer",
            vec![kv("inner", inner_value.clone()), kv("plain", "p")],
        )],
        WriterOptions::default(),
    )
    .unwrap();
    let mut file = file;
    let pos = file
        .windows(b"inner".len())
        .position(|w| w == b"inner")
        .expect("key in file");
    // The inline page of "outer": elements start 16 bytes after its page header.
    // Element 0 is "inner": its flags are at (data area) - pos; find it by scanning back.
    let elem0 = (0..pos).rev().find(|&e| {
        u32::from_le_bytes(file[e + 4..e + 8].try_into().unwrap()) as usize == pos - e
            && u32::from_le_bytes(file[e + 8..e + 12].try_into().unwrap()) == 5
    });
    let elem0 = elem0.expect("element header");
    file[elem0] = 1; // bucket flag
    let db = Db::open(&file).unwrap();
    let outer = db.bucket(b"outer").unwrap().unwrap();
    let entries: Vec<_> = outer.iter().map(|e| e.unwrap()).collect();
    assert_eq!(entries.len(), 2);
    let Value::Bucket(inner) = entries[0].1 else {
        panic!("expected a nested bucket")
    };
    assert!(inner.is_inline());
    let inner_pairs: Vec<_> = inner.iter().map(|e| e.unwrap()).collect();
    assert_eq!(inner_pairs[0].0, b"x");
    assert_eq!(inner_pairs[0].1.data(), Some(&b"y"[..]));
    assert!(outer.bucket(b"inner").unwrap().is_some());
    let report = db.check().unwrap();
    assert_eq!(
        (report.buckets, report.top_level_buckets, report.keys),
        (2, 1, 2)
    );

    // A data entry at the top level is not a bucket.
    let mut flat = file.clone();
    let top = (0..flat.len() - 16)
        .find(|&e| {
            flat[e] == 1
                && u32::from_le_bytes(flat[e + 8..e + 12].try_into().unwrap()) == 5
                && flat
                    .get(e + u32::from_le_bytes(flat[e + 4..e + 8].try_into().unwrap()) as usize..)
                    .is_some_and(|s| s.starts_with(b"outer"))
        })
        .expect("root element");
    flat[top] = 0;
    assert!(matches!(
        db_err(&flat),
        Error::Page {
            problem: PageProblem::NotABucket { .. },
            ..
        }
    ));
}

/// The first error from opening, checking or iterating `file`.
fn db_err(file: &[u8]) -> Error {
    let db = Db::open(file).unwrap();
    if let Some(Err(e)) = db.buckets().find(|b| b.is_err()) {
        return e;
    }
    db.check().expect_err("check should fail")
}
