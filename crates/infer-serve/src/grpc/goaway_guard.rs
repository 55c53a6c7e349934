//! A filter on the bytes a gRPC client sends, between the socket and hyper's HTTP/2 server,
//! that keeps h2's graceful shutdown graceful.
//!
//! h2's graceful shutdown (hyper's `graceful_shutdown`) is the one RFC 9113 §6.8 recommends:
//! GOAWAY(2^31-1, NO_ERROR) and a PING; when the client acknowledges the PING, a second GOAWAY
//! names the last stream the server opened, and HEADERS of any later stream are ignored. A
//! client may still open such a stream: gRPC's C core writes the PING ACK before the HEADERS of
//! a call it had already given a stream ID, followed at once by a stream WINDOW_UPDATE. h2
//! (0.4.20) ignores those HEADERS but not the WINDOW_UPDATE: the stream is unknown and "idle",
//! so it answers with GOAWAY(PROTOCOL_ERROR) and closes the connection, failing every call
//! still in flight on it (`UNAVAILABLE: GOAWAY received; Error code: 1` on the client), the
//! calls the drain is there to finish.
//!
//! [`GoawayGuard`] follows the client's frames (9-byte headers; payloads pass through
//! untouched, without a copy) and, once the client has acknowledged h2's shutdown PING while
//! the server drains, drops stream WINDOW_UPDATEs for streams above the last one opened before
//! that acknowledgement: exactly the streams h2 ignores, whose frames RFC 9113 says to ignore.
//! The client's stream above that ID is failed by the client itself as never processed (gRPC
//! retries it on a new connection). Nothing else is changed. The test
//! `serve::grpc_drain_survives_a_late_stream` plays that frame sequence against the server.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const PING: u8 = 0x6;
const WINDOW_UPDATE: u8 = 0x8;
const ACK: u8 = 0x1;
/// The payload of the PING h2 sends with its first GOAWAY of a graceful shutdown
/// (`h2::frame::Ping::SHUTDOWN`, public only behind h2's `unstable` feature).
pub(crate) const H2_SHUTDOWN_PING: [u8; 8] = [0x0b, 0x7b, 0xa2, 0xf0, 0x8b, 0x9b, 0xfe, 0x54];

/// Where the filter is in the client's byte stream, and what it has learnt.
#[derive(Debug)]
pub(crate) struct Filter {
    /// Bytes of the connection preface still to pass.
    preface_left: usize,
    /// A frame header split across reads: held back until complete (a dropped frame must not
    /// have sent a byte).
    head: [u8; FRAME_HEADER_LEN],
    head_len: usize,
    /// Payload bytes of the current frame still to pass (or drop).
    payload_left: usize,
    dropping: bool,
    /// The payload of a PING ACK being read: bytes seen so far.
    ping: Option<([u8; 8], usize)>,
    /// The highest stream ID the client opened with HEADERS before `limit` was set.
    opened: u32,
    /// Set when the client acknowledged h2's shutdown PING during the drain: h2 ignores
    /// streams above it from then on.
    limit: Option<u32>,
    /// The server is draining (only then is a shutdown PING ACK h2's).
    draining: Arc<AtomicBool>,
}

impl Filter {
    pub(crate) fn new(draining: Arc<AtomicBool>) -> Filter {
        Filter {
            preface_left: PREFACE_LEN,
            head: [0; FRAME_HEADER_LEN],
            head_len: 0,
            payload_left: 0,
            dropping: false,
            ping: None,
            opened: 0,
            limit: None,
            draining,
        }
    }

    /// Filters `data` in place (frames are only ever removed, so the output never outruns the
    /// input) and returns the length of the output. A frame header that does not end in `data`
    /// is kept in the filter, not in the output; [`Filter::take_head`] hands it back to be put
    /// before the next bytes.
    pub(crate) fn run(&mut self, data: &mut [u8]) -> usize {
        debug_assert_eq!(self.head_len, 0, "a held header goes before new bytes");
        let (mut r, mut w) = (0, 0);
        while r < data.len() {
            let left = data.len() - r;
            if self.preface_left > 0 {
                let k = self.preface_left.min(left);
                keep(data, r, k, w);
                (r, w, self.preface_left) = (r + k, w + k, self.preface_left - k);
            } else if self.payload_left > 0 {
                let k = self.payload_left.min(left);
                if let Some((buf, seen)) = &mut self.ping {
                    let n = k.min(buf.len() - *seen);
                    buf[*seen..*seen + n].copy_from_slice(&data[r..r + n]);
                    *seen += n;
                }
                if !self.dropping {
                    keep(data, r, k, w);
                    w += k;
                }
                (r, self.payload_left) = (r + k, self.payload_left - k);
                if self.payload_left == 0 {
                    self.end_frame();
                }
            } else if left < FRAME_HEADER_LEN {
                self.head[..left].copy_from_slice(&data[r..]);
                self.head_len = left;
                r = data.len();
            } else {
                let mut head = [0; FRAME_HEADER_LEN];
                head.copy_from_slice(&data[r..r + FRAME_HEADER_LEN]);
                self.start_frame(&head);
                if !self.dropping {
                    keep(data, r, FRAME_HEADER_LEN, w);
                    w += FRAME_HEADER_LEN;
                }
                r += FRAME_HEADER_LEN;
                if self.payload_left == 0 {
                    self.end_frame();
                }
            }
        }
        w
    }

    /// The bytes of a frame header held back by [`Filter::run`], to be filtered again in
    /// front of the next bytes read.
    pub(crate) fn take_head(&mut self) -> Option<([u8; FRAME_HEADER_LEN], usize)> {
        let len = std::mem::take(&mut self.head_len);
        (len > 0).then_some((self.head, len))
    }

    fn start_frame(&mut self, head: &[u8; FRAME_HEADER_LEN]) {
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        self.payload_left = len;
        self.dropping = false;
        self.ping = None;
        match kind {
            HEADERS if self.limit.is_none() => self.opened = self.opened.max(stream),
            PING if flags & ACK != 0 && len == H2_SHUTDOWN_PING.len() => {
                self.ping = Some(([0; 8], 0));
            }
            WINDOW_UPDATE if stream != 0 => {
                self.dropping = self.limit.is_some_and(|limit| stream > limit);
            }
            _ => {}
        }
    }

    fn end_frame(&mut self) {
        if let Some((payload, 8)) = self.ping.take() {
            if payload == H2_SHUTDOWN_PING && self.limit.is_none() && self.draining.load(Relaxed) {
                self.limit = Some(self.opened);
            }
        }
        self.dropping = false;
    }
}

/// Moves `data[r..r + k]` to `w` (no copy until a frame was dropped: then `w < r`).
fn keep(data: &mut [u8], r: usize, k: usize, w: usize) {
    if r != w {
        data.copy_within(r..r + k, w);
    }
}

/// A connection's byte stream with [`Filter`] on its read side; writes pass through.
pub(crate) struct GoawayGuard<T> {
    inner: T,
    filter: Filter,
    /// Filtered bytes that did not fit the caller's buffer, handed out first.
    ready: Vec<u8>,
}

impl<T> GoawayGuard<T> {
    pub(crate) fn new(inner: T, draining: Arc<AtomicBool>) -> GoawayGuard<T> {
        GoawayGuard {
            inner,
            filter: Filter::new(draining),
            ready: Vec::new(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for GoawayGuard<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.ready.is_empty() {
            let n = this.ready.len().min(buf.remaining());
            buf.put_slice(&this.ready[..n]);
            this.ready.drain(..n);
            return Poll::Ready(Ok(()));
        }
        loop {
            let start = buf.filled().len();
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let read = buf.filled().len() - start;
            if read == 0 {
                // End of stream: a header cut short goes to h2 as it is, which reports it.
                if let Some((head, len)) = this.filter.take_head() {
                    this.ready.extend_from_slice(&head[..len]);
                    let n = len.min(buf.remaining());
                    buf.put_slice(&this.ready[..n]);
                    this.ready.drain(..n);
                }
                return Poll::Ready(Ok(()));
            }
            match this.filter.take_head() {
                // The common case: filtered where hyper's buffer holds it.
                None => {
                    let n = this.filter.run(&mut buf.filled_mut()[start..]);
                    buf.set_filled(start + n);
                }
                // A header split across reads (rare): filter it with what follows, aside.
                Some((head, len)) => {
                    let mut bytes = Vec::with_capacity(len + read);
                    bytes.extend_from_slice(&head[..len]);
                    bytes.extend_from_slice(&buf.filled()[start..]);
                    let n = this.filter.run(&mut bytes);
                    bytes.truncate(n);
                    buf.set_filled(start);
                    let fit = n.min(buf.remaining());
                    buf.put_slice(&bytes[..fit]);
                    this.ready = bytes.split_off(fit);
                }
            }
            if buf.filled().len() > start {
                return Poll::Ready(Ok(()));
            }
            // Everything read was dropped or held back: read again rather than report EOF.
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GoawayGuard<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Runs `input` through a filter in reads of `chunk` bytes, as the guard does.
    fn filtered(input: &[u8], chunk: usize, draining: bool) -> Vec<u8> {
        let mut f = Filter::new(Arc::new(AtomicBool::new(draining)));
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            let mut bytes = Vec::new();
            if let Some((head, len)) = f.take_head() {
                bytes.extend_from_slice(&head[..len]);
            }
            bytes.extend_from_slice(piece);
            let n = f.run(&mut bytes);
            out.extend_from_slice(&bytes[..n]);
        }
        if let Some((head, len)) = f.take_head() {
            out.extend_from_slice(&head[..len]);
        }
        out
    }

    fn conversation(ack: [u8; 8]) -> (Vec<u8>, Vec<u8>) {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let before = [
            preface,
            frame(0x4, 0, 0, &[]),
            frame(HEADERS, 0x4, 1, &[0x83, 0x86]),
            frame(0x0, 0x1, 1, &[0; 40_000]),
            frame(WINDOW_UPDATE, 0, 1, &[0, 0, 0x10, 0]),
            frame(HEADERS, 0x4, 3, &[0x83]),
            frame(PING, ACK, 0, &ack),
            frame(WINDOW_UPDATE, 0, 3, &[0, 0, 0x10, 0]),
            frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0x10, 0]),
            frame(HEADERS, 0x4, 5, &[0x83]),
            frame(0x0, 0x1, 5, &[7; 9]),
        ]
        .concat();
        let late = frame(WINDOW_UPDATE, 0, 5, &[0, 0, 0x10, 0]);
        let mut input = before.clone();
        input.extend_from_slice(&late);
        input.extend_from_slice(&frame(0x3, 0, 5, &[0, 0, 0, 8]));
        let mut expected = before;
        expected.extend_from_slice(&frame(0x3, 0, 5, &[0, 0, 0, 8]));
        (input, expected)
    }

    #[test]
    fn after_the_shutdown_ack_window_updates_of_later_streams_are_dropped_and_nothing_else() {
        let (input, expected) = conversation(H2_SHUTDOWN_PING);
        for chunk in [1, 2, 5, 8, 9, 10, 17, 100, 4096, input.len()] {
            assert_eq!(
                filtered(&input, chunk, true),
                expected,
                "reads of {chunk} bytes"
            );
        }
    }

    #[test]
    fn another_ping_or_no_drain_changes_nothing() {
        let (input, _) = conversation([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(filtered(&input, 7, true), input);
        let (input, _) = conversation(H2_SHUTDOWN_PING);
        assert_eq!(filtered(&input, 7, false), input);
    }
}
