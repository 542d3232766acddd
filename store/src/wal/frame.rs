//! One record on disk: `[length u32 LE][crc32c u32 LE][kind u8][payload]`.
//!
//! `length` counts the kind byte and the payload, so it is never zero: a
//! header of eight zero bytes is the preallocated, never written part of a
//! segment, the clean end of its records. The CRC32C covers the kind and
//! the payload, so a record only partly on disk (a write cut by a crash)
//! fails its check instead of being read as another record.
//!
//! Worked example: kind 1 with payload `ab` is
//! `03 00 00 00 | crc32c([01 61 62]) LE | 01 61 62`, 11 bytes.

/// Bytes before a record's kind: length and checksum.
pub const HEADER_BYTES: usize = 8;

/// Appends the frame of one record to `out`.
pub fn encode_into(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let length = u32::try_from(payload.len() + 1).expect("records are bounded by the caller");
    let crc = crc32c::crc32c_append(crc32c::crc32c(&[kind]), payload);
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

/// What a header says about the bytes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// Eight zero bytes: nothing was written here.
    End,
    /// A record of `length` bytes (kind and payload) whose checksum is `crc`.
    Record {
        /// Kind and payload bytes.
        length: u32,
        /// CRC32C of the kind and payload.
        crc: u32,
    },
}

/// Reads a header.
pub fn decode_header(bytes: &[u8; HEADER_BYTES]) -> Header {
    let length = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(bytes[4..].try_into().expect("4 bytes"));
    if length == 0 && crc == 0 {
        Header::End
    } else {
        Header::Record { length, crc }
    }
}

/// Whether `body` (kind and payload) matches the header's checksum; a
/// record with a zero length never does.
pub fn body_matches(body: &[u8], crc: u32) -> bool {
    !body.is_empty() && crc32c::crc32c(body) == crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worked_example_round_trips() {
        let mut out = Vec::new();
        encode_into(&mut out, 1, b"ab");
        assert_eq!(out.len(), HEADER_BYTES + 3);
        assert_eq!(&out[..4], &[3, 0, 0, 0]);
        assert_eq!(&out[8..], &[1, b'a', b'b']);
        let header = decode_header(out[..8].try_into().unwrap());
        let Header::Record { length, crc } = header else {
            panic!("a record: {header:?}");
        };
        assert_eq!(length, 3);
        assert!(body_matches(&out[8..], crc));
    }

    #[test]
    fn zeros_end_the_records_and_a_changed_byte_fails_the_check() {
        assert_eq!(decode_header(&[0; 8]), Header::End);
        let mut out = Vec::new();
        encode_into(&mut out, 7, b"payload");
        let Header::Record { crc, .. } = decode_header(out[..8].try_into().unwrap()) else {
            panic!("a record");
        };
        for i in 8..out.len() {
            let mut torn = out[8..].to_vec();
            torn[i - 8] ^= 0x40;
            assert!(!body_matches(&torn, crc), "byte {i} changed");
        }
        assert!(!body_matches(&[], 0));
    }
}
