//! The segment log: records survive reopening and segment changes, a torn
//! tail is cut, an older segment's corruption is refused, sticky records
//! outlive removed segments.

use std::io;
use std::path::Path;

use super::*;

const STICKY: u8 = 9;
const PLAIN: u8 = 1;
/// Small segments so a few records fill one.
const SEGMENT_BYTES: u64 = 256;

fn options() -> WalOptions {
    WalOptions {
        segment_bytes: SEGMENT_BYTES,
        sticky_kinds: vec![STICKY],
    }
}

/// A replayed record: kind, payload, location.
type Replayed = (u8, Vec<u8>, Location);

/// Opens `dir`, returning the log and every replayed record.
fn open(dir: &Path) -> io::Result<(Wal, Vec<Replayed>)> {
    let mut seen = Vec::new();
    let wal = Wal::open(dir, options(), &mut |kind, payload, at| {
        seen.push((kind, payload.to_vec(), at));
        Ok(())
    })?;
    Ok((wal, seen))
}

fn payload(i: u32) -> Vec<u8> {
    format!("record {i:04} {}", "x".repeat(i as usize % 40)).into_bytes()
}

#[test]
fn records_read_back_after_reopening_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, seen) = open(dir.path()).unwrap();
    assert!(seen.is_empty());
    let mut written = Vec::new();
    for i in 0..40 {
        let p = payload(i);
        let at = wal.append(&[(PLAIN, &p)]).unwrap()[0];
        written.push((PLAIN, p, at));
    }
    assert!(wal.segment_count() > 5, "{wal:?}");
    wal.sync().unwrap();
    for (_, p, at) in &written {
        assert_eq!(&read_at(&wal.file_of(*at).unwrap(), *at).unwrap(), p);
    }
    drop(wal);
    let (wal, seen) = open(dir.path()).unwrap();
    assert_eq!(seen, written);
    let size = std::fs::metadata(wal.segments[&wal.current_segment()].path.clone())
        .unwrap()
        .len();
    assert_eq!(size, SEGMENT_BYTES, "allocated at full size");
}

#[test]
fn a_torn_tail_is_cut_and_what_followed_it_never_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path()).unwrap();
    let a = b"aaaaaaaa".to_vec();
    let b = b"bbbbbbbb".to_vec();
    let c = b"cccccccc".to_vec();
    wal.append(&[(PLAIN, &a)]).unwrap();
    let at_b = wal.append(&[(PLAIN, &b)]).unwrap()[0];
    wal.append(&[(PLAIN, &c)]).unwrap();
    let path = wal.segments[&wal.current_segment()].path.clone();
    drop(wal);
    // B reached the disk only in part; C, after it, did.
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(b"?", at_b.offset + 2).unwrap();
    drop(file);
    let (mut wal, seen) = open(dir.path()).unwrap();
    assert_eq!(
        seen.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
        vec![a.clone()]
    );
    // A record of B's size lands where B was: C must not come back after it.
    let d = b"dddddddd".to_vec();
    wal.append(&[(PLAIN, &d)]).unwrap();
    drop(wal);
    let (_, seen) = open(dir.path()).unwrap();
    assert_eq!(
        seen.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
        vec![a, d]
    );
}

/// Reads the file at `path` whole.
fn read_file(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn the_next_segment_is_prepared_zeroed_once_half_is_used_and_taken_when_the_log_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let spare = dir.path().join(SPARE_NAME);
    let (mut wal, _) = open(dir.path()).unwrap();
    let mut written = Vec::new();
    let mut i = 0;
    let mut append = |wal: &mut Wal| {
        written.push(payload(i));
        wal.append(&[(PLAIN, &payload(i))]).unwrap();
        i += 1;
    };
    while wal.offset <= SEGMENT_BYTES / 2 {
        assert!(wal.spare.is_none(), "prepared before half the segment");
        append(&mut wal);
    }
    assert!(wal.spare.is_some(), "prepared past half the segment");
    let first = wal.current_segment();
    while wal.current_segment() == first {
        append(&mut wal);
    }
    // The roll took the prepared file; the next one waits for half again.
    assert!(wal.spare.is_none());
    assert!(!spare.exists());
    let rolled = wal.segments[&wal.current_segment()].path.clone();
    assert_eq!(read_file(&rolled).len() as u64, SEGMENT_BYTES);
    while wal.offset <= SEGMENT_BYTES / 2 {
        append(&mut wal);
    }
    drop(wal);
    assert_eq!(read_file(&spare), vec![0; SEGMENT_BYTES as usize]);
    let (_, seen) = open(dir.path()).unwrap();
    let payloads: Vec<Vec<u8>> = seen.into_iter().map(|r| r.1).collect();
    assert_eq!(payloads, written);
}

#[test]
fn writes_end_on_a_page_boundary_and_the_next_append_overwrites_the_padding() {
    // Three pages per segment, so padding happens (the other tests' segments
    // are smaller than a page and are never padded).
    let segment_bytes = 3 * WRITE_PAGE_BYTES;
    let options = WalOptions {
        segment_bytes,
        sticky_kinds: vec![STICKY],
    };
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::open(dir.path(), options.clone(), &mut |_, _, _| Ok(())).unwrap();
    let mut written = Vec::new();
    for i in 0..40u32 {
        // Sizes that end anywhere in a page, some crossing into the next.
        let p = vec![b'a' + (i % 26) as u8; 100 + (i as usize * 397) % 3000];
        let framed = (frame::HEADER_BYTES + 1 + p.len()) as u64;
        if wal.offset + framed <= segment_bytes {
            // Bytes other than zeros after the log's end, up to its page's
            // end, so that only the padding can leave zeros there (not
            // before a roll, which would leave them in the older segment).
            let page_end = wal.offset.next_multiple_of(WRITE_PAGE_BYTES);
            let garbage = vec![0xee; (page_end - wal.offset) as usize];
            (wal.segments[&wal.current_segment()].file)
                .write_all_at(&garbage, wal.offset)
                .unwrap();
        }
        let at = wal.append(&[(PLAIN, &p)]).unwrap()[0];
        written.push(p.clone());
        let segment = wal.segments[&wal.current_segment()].path.clone();
        let file = read_file(&segment);
        // The file never grows past its allocation for the padding.
        assert_eq!(file.len() as u64, segment_bytes, "after record {i}");
        // The record is where the log says, and the log's end is its end.
        let start = at.offset as usize;
        assert_eq!(&file[start..start + p.len()], &p[..]);
        assert_eq!(wal.offset, at.offset + p.len() as u64);
        // What follows up to the page's end is zeros again (the clean end).
        let page_end = wal.offset.next_multiple_of(WRITE_PAGE_BYTES) as usize;
        assert!(file[wal.offset as usize..page_end].iter().all(|b| *b == 0));
    }
    assert!(wal.segment_count() > 3, "{wal:?}");
    drop(wal);
    let mut seen = Vec::new();
    Wal::open(dir.path(), options, &mut |_, payload, _| {
        seen.push(payload.to_vec());
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, written);
}

#[test]
fn padding_stops_at_the_allocated_end() {
    let page = WRITE_PAGE_BYTES;
    assert_eq!(padding(0, 2 * page), 0);
    assert_eq!(padding(1, 2 * page), page as usize - 1);
    assert_eq!(padding(page, 2 * page), 0);
    assert_eq!(padding(page + 10, 2 * page), page as usize - 10);
    // The next page boundary is past the allocation: no padding.
    assert_eq!(padding(2 * page + 10, 2 * page), 0);
    assert_eq!(padding(100, 256), 0);
}

#[test]
fn a_spare_left_behind_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let spare = dir.path().join(SPARE_NAME);
    std::fs::write(&spare, vec![0x5a; 3 * SEGMENT_BYTES as usize]).unwrap();
    let (_wal, seen) = open(dir.path()).unwrap();
    assert!(seen.is_empty());
    assert!(!spare.exists());
}

fn purged_dirs(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with(PURGED_PREFIX)
        })
        .count()
}

#[test]
fn purged_segments_left_by_a_stop_are_freed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()).unwrap());
    let leftover = dir
        .path()
        .join(unique_name(PURGED_PREFIX, PURGED_EXTENSION));
    std::fs::create_dir(&leftover).unwrap();
    std::fs::write(leftover.join("0000000000000001.seg"), [1u8; 100]).unwrap();
    let (_, seen) = open(dir.path()).unwrap();
    assert!(seen.is_empty(), "a purged segment is never read back");
    assert_eq!(purged_dirs(dir.path()), 0);
}

#[test]
fn a_bad_record_in_an_older_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path()).unwrap();
    let mut first = None;
    for i in 0..20 {
        let at = wal.append(&[(PLAIN, &payload(i))]).unwrap()[0];
        first.get_or_insert(at);
    }
    let first = first.unwrap();
    assert_ne!(first.segment, wal.current_segment());
    let path = wal.segments[&first.segment].path.clone();
    drop(wal);
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(b"?", first.offset).unwrap();
    drop(file);
    let e = open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("corrupt record"), "{e}");
}

#[test]
fn sticky_records_outlive_removed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = open(dir.path()).unwrap();
    wal.append(&[(STICKY, b"vote 1")]).unwrap();
    wal.append(&[(STICKY, b"vote 2")]).unwrap();
    for i in 0..30 {
        wal.append(&[(PLAIN, &payload(i))]).unwrap();
    }
    wal.sync().unwrap();
    let current = wal.current_segment();
    assert_eq!(
        wal.remove_segments_before(u64::MAX).unwrap(),
        (current - 1) as usize
    );
    assert_eq!(wal.segment_count(), 1);
    // The removed segments went through a directory of purged segments,
    // freed at once since they are small.
    assert_eq!(purged_dirs(dir.path()), 0);
    drop(wal);
    let (_, seen) = open(dir.path()).unwrap();
    let sticky: Vec<&[u8]> = seen
        .iter()
        .filter(|r| r.0 == STICKY)
        .map(|r| r.1.as_slice())
        .collect();
    assert_eq!(sticky, vec![&b"vote 2"[..]]);
}

/// Seeded random appends and reopenings, some after cutting the newest
/// segment at a random byte (a crash in the middle of a write): what is
/// replayed is always a prefix of what was appended, and everything
/// appended before the last sync is in it.
#[test]
fn reopening_after_random_cuts_keeps_a_synced_prefix() {
    use rand::{Rng, SeedableRng};
    const ROUNDS: usize = 60;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let dir = tempfile::tempdir().unwrap();
    let mut expected: Vec<Vec<u8>> = Vec::new();
    let mut next = 0u32;
    for _ in 0..ROUNDS {
        let (mut wal, seen) = open(dir.path()).unwrap();
        let replayed: Vec<Vec<u8>> = seen.into_iter().map(|r| r.1).collect();
        assert_eq!(replayed, expected);
        for _ in 0..rng.gen_range(1..6) {
            let batch: Vec<Vec<u8>> = (0..rng.gen_range(1..4))
                .map(|_| {
                    next += 1;
                    payload(next)
                })
                .collect();
            let records: Vec<(u8, &[u8])> = batch.iter().map(|p| (PLAIN, &p[..])).collect();
            wal.append(&records).unwrap();
            expected.extend(batch);
        }
        wal.sync().unwrap();
        let synced = expected.len();
        // Unsynced records, then a cut somewhere in the newest segment's
        // unsynced part (or none).
        let (segment_before, before_unsynced) = (wal.current_segment(), wal.offset);
        let mut unsynced = Vec::new();
        for _ in 0..rng.gen_range(0..3) {
            next += 1;
            let p = payload(next);
            wal.append(&[(PLAIN, &p)]).unwrap();
            unsynced.push(p);
        }
        let (path, end) = (
            wal.segments[&wal.current_segment()].path.clone(),
            wal.offset,
        );
        let same_segment = wal.current_segment() == segment_before;
        drop(wal);
        if !unsynced.is_empty() && same_segment && rng.gen_bool(0.5) {
            let cut = rng.gen_range(before_unsynced..end);
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len(cut).unwrap();
            drop(file);
            // Which unsynced records survive the cut: those wholly before it.
            let (_, seen) = open(dir.path()).unwrap();
            let replayed: Vec<Vec<u8>> = seen.into_iter().map(|r| r.1).collect();
            assert!(replayed.len() >= synced, "synced records kept");
            assert_eq!(
                replayed[..],
                expected_with(&expected, &unsynced)[..replayed.len()]
            );
            expected = replayed;
        } else {
            expected.extend(unsynced);
        }
    }
}

fn expected_with(expected: &[Vec<u8>], unsynced: &[Vec<u8>]) -> Vec<Vec<u8>> {
    expected.iter().chain(unsynced).cloned().collect()
}
