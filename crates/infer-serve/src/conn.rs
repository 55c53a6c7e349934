//! Slow and idle clients: what the accept loop (`http::accept_loop`) knows of each connection,
//! the per-connection watchdog that closes one whose headers come too slowly or that stays idle
//! too long, and the request-body reader with a minimum rate. The bounds are `runtime.toml`'s
//! `[server]` `header_read_timeout_s`, `idle_timeout_s`, `body_read_timeout_s` and
//! `body_min_bytes_per_s`; the cap on open connections (`max_connections`) is the accept
//! loop's.

use crate::error::ApiError;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use infer_spec::runtime::Server;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Milliseconds since the first call, plus one: 0 stays free to mean "never".
fn now_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Why the watchdog closed a connection (the `reason` label of
/// `infer_serve_connections_closed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// A request's headers did not arrive within `header_read_timeout_s` of their first byte.
    HeaderTimeout,
    /// No request in progress for `idle_timeout_s`.
    IdleTimeout,
    /// Closed to make room for a new connection at `max_connections`.
    Evicted,
}

impl Closed {
    pub const ALL: [Closed; 3] = [Closed::HeaderTimeout, Closed::IdleTimeout, Closed::Evicted];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::HeaderTimeout => "header_timeout",
            Closed::IdleTimeout => "idle_timeout",
            Closed::Evicted => "evicted",
        }
    }
}

/// One open connection, as its service, its I/O and the accept loop see it.
#[derive(Debug)]
pub(crate) struct Conn {
    /// Notified on each request (the gRPC drain waits for a first request a while).
    pub seen: Notify,
    /// Requests being handled on this connection (from their headers to their answer).
    busy: AtomicUsize,
    /// `now_ms()` when the connection last had no request in progress: accepted, or its last
    /// request answered.
    idle_since: AtomicU64,
    /// `now_ms()` of the first byte read while no request was in progress (a request's head
    /// arriving; HTTP/1.1 only), 0 when none.
    head_since: AtomicU64,
    /// Whether reads start the header timeout (HTTP/1.1; HTTP/2 reads PINGs and SETTINGS
    /// between calls).
    heads: bool,
    /// The accept loop asked this connection to close.
    evicted: AtomicBool,
    /// Wakes the watchdog: a head started arriving, or the connection was evicted.
    wake: Notify,
}

impl Conn {
    /// A connection just accepted; `heads`: reads while no request is in progress start the
    /// header timeout (HTTP/1.1).
    pub(crate) fn new(heads: bool) -> Conn {
        Conn {
            seen: Notify::new(),
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(now_ms()),
            head_since: AtomicU64::new(0),
            heads,
            evicted: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    /// A request arrived: the connection is busy until the guard drops.
    pub(crate) fn request(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Relaxed);
        self.head_since.store(0, Relaxed);
        self.seen.notify_one();
        Busy(self.clone())
    }

    /// True when no request is in progress.
    pub(crate) fn is_idle(&self) -> bool {
        self.busy.load(Relaxed) == 0
    }

    /// When the connection's current idle spell began (`now_ms()` units; smaller is older).
    pub(crate) fn idle_since(&self) -> u64 {
        self.idle_since.load(Relaxed)
    }

    /// Asks the connection to close (the accept loop makes room); its watchdog returns
    /// [`Closed::Evicted`].
    pub(crate) fn evict(&self) {
        self.evicted.store(true, Relaxed);
        self.wake.notify_one();
    }

    fn on_read(&self) {
        if self.heads && self.busy.load(Relaxed) == 0 && self.head_since.load(Relaxed) == 0 {
            self.head_since.store(now_ms(), Relaxed);
            self.wake.notify_one();
        }
    }

    /// Resolves when the connection must close: evicted, headers too slow (from their first
    /// byte), or no request in progress for `idle`.
    pub(crate) async fn watchdog(&self, header: Duration, idle: Duration) -> Closed {
        let (header_ms, idle_ms) = (header.as_millis() as u64, idle.as_millis() as u64);
        loop {
            if self.evicted.load(Relaxed) {
                return Closed::Evicted;
            }
            let wait = if self.is_idle() {
                let head = self.head_since.load(Relaxed);
                let (deadline, why) = if head != 0 {
                    (head + header_ms, Closed::HeaderTimeout)
                } else {
                    (self.idle_since.load(Relaxed) + idle_ms, Closed::IdleTimeout)
                };
                let now = now_ms();
                if now >= deadline {
                    return why;
                }
                Duration::from_millis(deadline - now)
            } else {
                // A request in progress: its body has its own bound; look again later (the
                // idle spell after it starts when it is answered, later than now).
                idle
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified() => {}
            }
        }
    }
}

/// A request in progress on a [`Conn`].
pub(crate) struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Relaxed) == 1 {
            self.0.idle_since.store(now_ms(), Relaxed);
            self.0.head_since.store(0, Relaxed);
        }
    }
}

/// A connection's I/O that tells its [`Conn`] when bytes arrive (the header timeout starts
/// with a request's first byte).
pub(crate) struct Watched<T> {
    inner: T,
    conn: Arc<Conn>,
}

impl<T> Watched<T> {
    pub(crate) fn new(inner: T, conn: Arc<Conn>) -> Watched<T> {
        Watched { inner, conn }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.conn.on_read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What a body says of its size before it has all arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Size {
    /// Nothing (an HTTP/1.1 chunked body).
    Unknown,
    /// Its length (`Content-Length`, already charged by the caller).
    Known(usize),
    /// A gRPC message: its 5-byte prefix announces its length.
    GrpcMessage,
}

/// Reads a request body of at most `limit` bytes, at the pace `[server]` demands: whole
/// within `body_read_timeout_s`, plus one second per `body_min_bytes_per_s` bytes delivered.
/// Too large: 413; too slow: 408 (`ApiError::BodyTimeout`). Every byte is charged to `charge`
/// before it is kept ([`crate::budget`]), an announced size at once: when the requests in flight
/// hold the memory budget, the body is refused (503, gRPC `RESOURCE_EXHAUSTED`) and nothing
/// more of it is read. A body of known size is copied, frame by frame, into one buffer of that
/// size (the transport's buffers go back as it is read); one of unknown size is kept as its
/// frames and joined at the end, the copy charged while both exist.
pub(crate) async fn read_body(
    body: Incoming,
    limit: usize,
    srv: &Server,
    charge: &mut crate::budget::Reservation,
    size: Size,
) -> Result<Bytes, ApiError> {
    let start = tokio::time::Instant::now();
    let grace = Duration::from_secs(srv.body_read_timeout_s);
    let rate = srv.body_min_bytes_per_s;
    let mut body = body;
    let mut frames: Vec<Bytes> = Vec::new();
    let mut sized: Option<BytesMut> = match size {
        Size::Known(n) => Some(BytesMut::with_capacity(n.min(limit))),
        _ => None,
    };
    let mut total: usize = 0;
    loop {
        let earned = if rate == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(total as f64 / rate as f64)
        };
        let deadline = start + grace + earned;
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(ApiError::BodyTimeout {
                    received: total as u64,
                    seconds: start.elapsed().as_secs(),
                })
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ApiError::BadRequest(format!(
                    "reading the request body: {e}"
                )))
            }
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        total = total.saturating_add(data.len());
        if total > limit {
            return Err(ApiError::PayloadTooLarge {
                limit: limit as u64,
            });
        }
        // A gRPC message's prefix, once its first frame is here: the whole size, charged now.
        if size == Size::GrpcMessage && sized.is_none() && frames.is_empty() && data.len() >= 5 {
            let announced = 5 + u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
            if announced > limit {
                return Err(ApiError::PayloadTooLarge {
                    limit: limit as u64,
                });
            }
            charge.grow(announced as u64, "the request message")?;
            sized = Some(BytesMut::with_capacity(announced));
        }
        // Bytes charged ahead (an announced length) are not charged twice.
        let charged = usize::try_from(charge.bytes()).unwrap_or(usize::MAX);
        if total > charged {
            charge.grow((total - charged) as u64, "the request body")?;
        }
        match &mut sized {
            Some(buf) => buf.extend_from_slice(&data),
            None => frames.push(data),
        }
    }
    if let Some(buf) = sized {
        return Ok(buf.freeze());
    }
    // One frame (the usual small body) is handed on without a copy; several are joined.
    if frames.len() <= 1 {
        return Ok(frames.pop().unwrap_or_default());
    }
    let mut joined = charge.split(total as u64, "joining the request body")?;
    let mut got = BytesMut::with_capacity(total);
    for f in frames.drain(..) {
        got.extend_from_slice(&f);
    }
    drop(frames);
    joined.release();
    Ok(got.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_watchdog_times_out_heads_and_idle_connections() {
        let header = Duration::from_millis(200);
        let idle = Duration::from_millis(600);
        // Nothing read: idle.
        let c = Arc::new(Conn::new(true));
        let t = Instant::now();
        assert_eq!(c.watchdog(header, idle).await, Closed::IdleTimeout);
        assert!(
            t.elapsed() >= Duration::from_millis(550),
            "{:?}",
            t.elapsed()
        );
        // A head's first byte starts the (shorter) header timeout.
        let c = Arc::new(Conn::new(true));
        let t = Instant::now();
        let watch = c.watchdog(header, idle);
        let read = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            c.on_read();
            std::future::pending::<()>().await
        };
        tokio::select! {
            why = watch => assert_eq!(why, Closed::HeaderTimeout),
            _ = read => unreachable!(),
        }
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_millis(550),
            "{took:?}"
        );
        // A request in progress is not idle; evicting it still closes it.
        let busy = c.request();
        assert!(!c.is_idle());
        c.evict();
        assert_eq!(c.watchdog(header, idle).await, Closed::Evicted);
        drop(busy);
        assert!(c.is_idle());
    }
}
