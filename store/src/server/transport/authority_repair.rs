//! Requests from etcd clients that send an invalid HTTP/2 `:authority`.
//!
//! Several etcd clients put a whole endpoint URL, or a resolver string, in
//! the `:authority` pseudo-header: etcdctl 3.4 (Debian's `etcd-client`)
//! sends `http://127.0.0.1:2379` for `endpoint status`, `endpoint hashkv`
//! and `defrag`, and clientv3 3.5.0 sent `#initially=[...]` (etcd issue
//! 13192). grpc-go, under etcd, ignores the value; h2, under this store,
//! checks it as RFC 3986 demands and resets the stream with PROTOCOL_ERROR,
//! so those commands failed here and worked against etcd.
//!
//! [`AuthorityRepair`] sits between the socket and h2 on client connections
//! and rewrites such header blocks before h2 sees them. Doing that means
//! following the client's HPACK state: every header block is decoded with a
//! decoder that mirrors the one in h2, so the dynamic table is known.
//!
//! - If the connection's first header block has a valid `:authority` (or
//!   none), it and everything after it go through byte for byte, with no
//!   further decoding: gRPC clients fix the authority per connection, and
//!   decoding every request would cost more than the request itself
//!   (loona-hpack builds a Huffman table per string: measured, serializable
//!   ranges at 1,000 streams fell from ~60,000/s to ~31,000/s).
//! - A block with an invalid `:authority` is re-encoded: every header as a
//!   literal without indexing, the authority reduced to its `host:port`
//!   part (`http://127.0.0.1:2379` -> `127.0.0.1:2379`) or dropped when no
//!   valid authority is left (HTTP/2 makes it optional). From then on every
//!   block on that connection is re-encoded the same way: h2's dynamic table
//!   no longer follows the client's, and literals without indexing never
//!   refer to it or change it.
//!
//! Everything else passes through unchanged: the connection preface, all
//! other frames (streamed, never buffered whole), and connections that do
//! not start with the HTTP/2 preface (HTTP/1.1: the JSON gateway, probes).
//! A block larger than [`MAX_HEADER_BLOCK_BYTES`], a frame sequence h2 will
//! refuse anyway (a CONTINUATION out of place, bad padding) or an HPACK
//! error stops the inspection: the bytes from there on go through as they
//! came, and h2 answers them with its own errors.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use loona_hpack::encoder::encode_integer_into;
use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface of HTTP/2 (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Bytes of an HTTP/2 frame header.
const FRAME_HEADER_BYTES: usize = 9;
/// Largest header block (all HEADERS and CONTINUATION payloads of one
/// request) this layer collects, bytes; h2 itself refuses decoded header
/// lists over 16 KiB.
pub const MAX_HEADER_BLOCK_BYTES: usize = 64 * 1024;
/// Largest frame payload this layer writes (HTTP/2's default
/// SETTINGS_MAX_FRAME_SIZE, which the client server never raises), bytes.
const MAX_FRAME_PAYLOAD_BYTES: usize = 16_384;
/// HPACK dynamic table size h2 announces (its default), bytes: the most a
/// client's table may hold.
const HPACK_TABLE_BYTES: usize = 4096;
/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Bytes of the priority fields of a HEADERS frame with FLAG_PRIORITY.
const PRIORITY_BYTES: usize = 5;

/// What the reader is looking at.
enum Mode {
    /// The first bytes: the HTTP/2 preface or not.
    Preface,
    /// HTTP/2 frames, inspected.
    Frames,
    /// Everything from here on goes through as it is.
    Passthrough,
}

/// A header block being collected (HEADERS, then CONTINUATION frames).
struct Block {
    stream_id: u32,
    /// END_STREAM of the HEADERS frame.
    end_stream: bool,
    /// The HEADERS frame's priority fields, if it had them.
    priority: Option<[u8; PRIORITY_BYTES]>,
    /// The header block fragments, concatenated.
    fragment: Vec<u8>,
    /// The frames as they came, to pass on unchanged.
    raw: Vec<u8>,
}

/// A client connection whose HTTP/2 header blocks get a valid
/// `:authority` before h2 reads them (see the module docs).
pub struct AuthorityRepair<T> {
    inner: T,
    mode: Mode,
    /// Bytes read from the socket, not yet looked at.
    input: BytesMut,
    /// Bytes ready for h2.
    output: BytesMut,
    /// Bytes of the current non-header frame still to pass through.
    passing: usize,
    block: Option<Block>,
    decoder: Decoder<'static>,
    /// Whether a block on this connection was rewritten (every later block
    /// is re-encoded).
    rewriting: bool,
}

impl<T> AuthorityRepair<T> {
    /// Wraps a freshly accepted client connection.
    pub fn new(inner: T) -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE_BYTES);
        Self {
            inner,
            mode: Mode::Preface,
            input: BytesMut::new(),
            output: BytesMut::new(),
            passing: 0,
            block: None,
            decoder,
            rewriting: false,
        }
    }

    /// Moves what can be decided from `input` to `output`.
    fn process(&mut self) {
        loop {
            match self.mode {
                Mode::Preface => {
                    let n = self.input.len().min(PREFACE.len());
                    if self.input[..n] != PREFACE[..n] {
                        self.mode = Mode::Passthrough;
                    } else if n == PREFACE.len() {
                        self.output.put(self.input.split_to(n));
                        self.mode = Mode::Frames;
                    } else {
                        return;
                    }
                }
                Mode::Passthrough => {
                    self.pass_through_everything();
                    return;
                }
                Mode::Frames => {
                    if !self.next_frame() {
                        return;
                    }
                }
            }
        }
    }

    /// Gives up inspecting: what was held back and everything after it
    /// goes through as it came.
    fn pass_through_everything(&mut self) {
        self.mode = Mode::Passthrough;
        if let Some(block) = self.block.take() {
            self.output.extend_from_slice(&block.raw);
        }
        let rest = self.input.split();
        self.output.put(rest);
    }

    /// Handles the next frame (or part of a passing frame); false when more
    /// input is needed.
    fn next_frame(&mut self) -> bool {
        if self.passing > 0 {
            let n = self.passing.min(self.input.len());
            if n == 0 {
                return false;
            }
            self.output.put(self.input.split_to(n));
            self.passing -= n;
            return true;
        }
        if self.input.len() < FRAME_HEADER_BYTES {
            return false;
        }
        let header = &self.input[..FRAME_HEADER_BYTES];
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let kind = header[3];
        let flags = header[4];
        let stream_id =
            u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & !(1 << 31);
        let is_header_frame = kind == TYPE_HEADERS || kind == TYPE_CONTINUATION;
        if !is_header_frame {
            if self.block.is_some() {
                // RFC 9113 6.10: nothing may come between a HEADERS frame
                // and its CONTINUATIONs; h2 reports the error.
                self.pass_through_everything();
                return false;
            }
            self.passing = FRAME_HEADER_BYTES + length;
            return true;
        }
        if length > MAX_HEADER_BLOCK_BYTES {
            self.pass_through_everything();
            return false;
        }
        if self.input.len() < FRAME_HEADER_BYTES + length {
            return false;
        }
        let frame = self.input.split_to(FRAME_HEADER_BYTES + length);
        if self.header_frame(kind, flags, stream_id, &frame).is_none() {
            // Malformed for h2 as well: hand over what was held back, this
            // frame and the rest as they came.
            if let Some(block) = self.block.take() {
                self.output.extend_from_slice(&block.raw);
            }
            self.output.extend_from_slice(&frame);
            self.pass_through_everything();
            return false;
        }
        true
    }

    /// Adds a HEADERS or CONTINUATION frame to the block and passes a
    /// complete block on; `None` (nothing passed on, the frame not kept) if
    /// the frames are ones h2 will refuse.
    fn header_frame(&mut self, kind: u8, flags: u8, stream_id: u32, frame: &[u8]) -> Option<()> {
        let payload = &frame[FRAME_HEADER_BYTES..];
        if kind == TYPE_HEADERS {
            if self.block.is_some() {
                return None;
            }
            let mut at = 0;
            let mut padding = 0;
            if flags & FLAG_PADDED != 0 {
                padding = *payload.first()? as usize;
                at = 1;
            }
            let priority = if flags & FLAG_PRIORITY != 0 {
                let fields: [u8; PRIORITY_BYTES] =
                    payload.get(at..at + PRIORITY_BYTES)?.try_into().ok()?;
                at += PRIORITY_BYTES;
                Some(fields)
            } else {
                None
            };
            let end = payload.len().checked_sub(padding)?;
            let fragment = payload.get(at..end)?.to_vec();
            self.block = Some(Block {
                stream_id,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
                fragment,
                raw: frame.to_vec(),
            });
        } else {
            let block = self.block.as_mut()?;
            if block.stream_id != stream_id
                || block.raw.len() + frame.len() > MAX_HEADER_BLOCK_BYTES
            {
                return None;
            }
            block.fragment.extend_from_slice(payload);
            block.raw.extend_from_slice(frame);
        }
        if flags & FLAG_END_HEADERS != 0 {
            let block = self.block.take()?;
            if let Err(block) = self.finish_block(block) {
                // An HPACK error: h2 gets the block as it came and reports
                // it (the frame is already in `raw`).
                self.output.extend_from_slice(&block.raw);
                self.pass_through_everything();
            }
        }
        Some(())
    }

    /// Decodes a complete block and passes it on, as it came or rewritten;
    /// the block back if it does not decode.
    fn finish_block(&mut self, block: Block) -> Result<(), Block> {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let decoded = self.decoder.decode_with_cb(&block.fragment, |name, value| {
            headers.push((name.into_owned(), value.into_owned()));
        });
        if decoded.is_err() {
            return Err(block);
        }
        let bad = headers
            .iter()
            .any(|(name, value)| name == b":authority" && !valid_authority(value));
        if !self.rewriting && !bad {
            // gRPC clients fix the authority per connection: one valid
            // value means the connection needs no more inspection.
            self.output.extend_from_slice(&block.raw);
            self.mode = Mode::Passthrough;
            return Ok(());
        }
        self.rewriting = true;
        let mut encoded = Vec::with_capacity(block.fragment.len() * 2);
        for (name, value) in &headers {
            let value = if name == b":authority" {
                match repaired_authority(value) {
                    Some(v) => v,
                    None => continue,
                }
            } else {
                Cow::Borrowed(&value[..])
            };
            encode_literal(name, &value, &mut encoded);
        }
        self.write_block(&block, &encoded);
        Ok(())
    }

    /// Writes `encoded` as a HEADERS frame (with CONTINUATIONs if needed)
    /// carrying `block`'s stream, END_STREAM and priority.
    fn write_block(&mut self, block: &Block, encoded: &[u8]) {
        let mut first = true;
        let mut rest = encoded;
        loop {
            let room = if first && block.priority.is_some() {
                MAX_FRAME_PAYLOAD_BYTES - PRIORITY_BYTES
            } else {
                MAX_FRAME_PAYLOAD_BYTES
            };
            let (chunk, after) = rest.split_at(rest.len().min(room));
            let mut flags = 0;
            if after.is_empty() {
                flags |= FLAG_END_HEADERS;
            }
            let (kind, priority) = if first {
                if block.end_stream {
                    flags |= FLAG_END_STREAM;
                }
                if block.priority.is_some() {
                    flags |= FLAG_PRIORITY;
                }
                (TYPE_HEADERS, block.priority)
            } else {
                (TYPE_CONTINUATION, None)
            };
            let length = chunk.len() + priority.map_or(0, |p| p.len());
            self.output.put_slice(&(length as u32).to_be_bytes()[1..]);
            self.output.put_u8(kind);
            self.output.put_u8(flags);
            self.output.put_u32(block.stream_id);
            if let Some(p) = priority {
                self.output.put_slice(&p);
            }
            self.output.put_slice(chunk);
            if after.is_empty() {
                return;
            }
            rest = after;
            first = false;
        }
    }
}

/// Whether h2 accepts `value` as an `:authority`.
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// The `host:port` part of an endpoint URL sent as authority
/// (`http://127.0.0.1:2379` -> `127.0.0.1:2379`); `None` if nothing valid
/// is left (the header is dropped then).
fn repaired_authority(value: &[u8]) -> Option<Cow<'_, [u8]>> {
    if valid_authority(value) {
        return Some(Cow::Borrowed(value));
    }
    let uri = http::Uri::try_from(value).ok()?;
    let authority = uri.authority()?.as_str().as_bytes().to_vec();
    Some(Cow::Owned(authority))
}

/// HPACK "literal header field without indexing, new name" (RFC 7541,
/// 6.2.2), strings without Huffman coding.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    for s in [name, value] {
        // Writing to a Vec cannot fail.
        let _ = encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for AuthorityRepair<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if matches!(this.mode, Mode::Passthrough) && this.input.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            this.input.reserve(READ_CHUNK_BYTES);
            let spare = this.input.spare_capacity_mut();
            let mut read = ReadBuf::uninit(spare);
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                // End of input: whatever is held back goes to h2 as it is.
                this.pass_through_everything();
                if this.output.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            // SAFETY: `ReadBuf` initialized and filled the first `n` bytes
            // of the spare capacity.
            unsafe { this.input.set_len(this.input.len() + n) };
            this.process();
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AuthorityRepair<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loona_hpack::Encoder;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A HEADERS frame (END_HEADERS) on `stream` carrying `block`.
    fn headers_frame(stream: u32, block: &[u8]) -> Vec<u8> {
        let mut f = (block.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[TYPE_HEADERS, FLAG_END_HEADERS]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(block);
        f
    }

    /// A request's headers with `authority`.
    fn request(authority: &[u8]) -> Vec<(&'static [u8], Vec<u8>)> {
        vec![
            (b":method", b"POST".to_vec()),
            (b":scheme", b"http".to_vec()),
            (b":path", b"/etcdserverpb.Maintenance/Status".to_vec()),
            (b":authority", authority.to_vec()),
            (b"content-type", b"application/grpc".to_vec()),
        ]
    }

    /// Sends `bytes` through the layer; what h2 would read.
    async fn through(bytes: Vec<u8>) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        client.write_all(&bytes).await.unwrap();
        drop(client);
        let mut out = Vec::new();
        AuthorityRepair::new(server)
            .read_to_end(&mut out)
            .await
            .unwrap();
        out
    }

    /// The header lists of the HEADERS frames in `bytes` (after the preface).
    fn decoded_blocks(bytes: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut decoder = Decoder::new();
        let mut at = PREFACE.len();
        let mut blocks = Vec::new();
        while at < bytes.len() {
            let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
            assert_eq!(bytes[at + 3], TYPE_HEADERS);
            let payload = &bytes[at + FRAME_HEADER_BYTES..at + FRAME_HEADER_BYTES + len];
            let mut list = Vec::new();
            decoder
                .decode_with_cb(payload, |n, v| list.push((n.into_owned(), v.into_owned())))
                .unwrap();
            blocks.push(list);
            at += FRAME_HEADER_BYTES + len;
        }
        blocks
    }

    fn authority_of(list: &[(Vec<u8>, Vec<u8>)]) -> Option<&[u8]> {
        list.iter()
            .find(|(n, _)| n == b":authority")
            .map(|(_, v)| &v[..])
    }

    #[tokio::test]
    async fn a_valid_authority_passes_byte_for_byte() {
        let mut encoder = Encoder::new();
        let mut bytes = PREFACE.to_vec();
        for stream in [1, 3] {
            let list = request(b"127.0.0.1:2379");
            let block = encoder.encode(list.iter().map(|(n, v)| (*n, &v[..])));
            bytes.extend(headers_frame(stream, &block));
        }
        assert_eq!(through(bytes.clone()).await, bytes);
    }

    /// The client indexes the bad value on its first request and refers
    /// to the table entry on the second: both come out repaired.
    #[tokio::test]
    async fn an_endpoint_url_authority_becomes_host_and_port_on_every_request() {
        let mut encoder = Encoder::new();
        let mut bytes = PREFACE.to_vec();
        for stream in [1, 3] {
            let list = request(b"http://127.0.0.1:2379");
            let block = encoder.encode(list.iter().map(|(n, v)| (*n, &v[..])));
            bytes.extend(headers_frame(stream, &block));
        }
        let out = through(bytes).await;
        let blocks = decoded_blocks(&out);
        assert_eq!(blocks.len(), 2);
        for list in &blocks {
            assert_eq!(authority_of(list), Some(&b"127.0.0.1:2379"[..]));
            assert_eq!(list.len(), 5, "{list:?}");
        }
    }

    #[tokio::test]
    async fn an_authority_with_nothing_valid_is_dropped() {
        let mut encoder = Encoder::new();
        let list = request(b"#initially=[http://127.0.0.1:2379]");
        let block = encoder.encode(list.iter().map(|(n, v)| (*n, &v[..])));
        let mut bytes = PREFACE.to_vec();
        bytes.extend(headers_frame(1, &block));
        let blocks = decoded_blocks(&through(bytes).await);
        assert_eq!(authority_of(&blocks[0]), None);
        assert_eq!(blocks[0].len(), 4);
    }

    #[tokio::test]
    async fn http1_and_other_frames_pass_unchanged() {
        let http1 = b"POST /v3/kv/range HTTP/1.1\r\nHost: x\r\n\r\n{}".to_vec();
        assert_eq!(through(http1.clone()).await, http1);
        // A DATA frame and a SETTINGS frame after the preface.
        let mut bytes = PREFACE.to_vec();
        bytes.extend_from_slice(&[0, 0, 3, 0x0, 0x1, 0, 0, 0, 1, b'a', b'b', b'c']);
        bytes.extend_from_slice(&[0, 0, 0, 0x4, 0x0, 0, 0, 0, 0]);
        assert_eq!(through(bytes.clone()).await, bytes);
    }

    #[tokio::test]
    async fn a_truncated_frame_is_handed_over_as_it_came() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend_from_slice(&[0, 0, 10, TYPE_HEADERS, FLAG_END_HEADERS, 0, 0, 0, 1, 0x82]);
        assert_eq!(through(bytes.clone()).await, bytes);
    }
}
