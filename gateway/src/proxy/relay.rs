//! The relay stage: copy bytes both ways with half-close, an idle timeout and external stops.
//!
//! Idle detection: both legs are wrapped in [`Metered`], which stamps the time of the last
//! byte read on either side. A watchdog sleeps until `last activity + idle_timeout` and ends
//! the relay only if no byte moved in between, so the timeout is exact without per-read timers.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both directions finished (FIN both ways) or a peer reset the connection.
    Closed,
    /// No byte moved in either direction for the idle timeout.
    IdleTimeout,
    /// The backend was disabled or marked down with `shutdown-sessions`.
    BackendClosed,
    /// The gateway's shutdown deadline passed.
    Shutdown,
}

/// The result of one relayed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayOutcome {
    /// Why it ended.
    pub end: RelayEnd,
}

/// When the last byte was read on either leg, as nanoseconds since `origin`.
#[derive(Debug)]
struct Activity {
    origin: Instant,
    last_nanos: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            origin: Instant::now(),
            last_nanos: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let nanos = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.origin + Duration::from_nanos(self.last_nanos.load(Ordering::Relaxed))
    }
}

/// A stream that counts bytes read into a counter and stamps activity.
#[derive(Debug)]
struct Metered<S> {
    inner: S,
    read_bytes: Counter,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            self.read_bytes.inc_by(read as u64);
            self.activity.touch();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Sleeps until `idle_timeout` has passed without activity.
async fn idle_watchdog(activity: Arc<Activity>, idle_timeout: Duration) {
    loop {
        let deadline = activity.last() + idle_timeout;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// Relays between `client` and `backend` until both directions end or a stop condition hits.
/// `to_backend` and `to_client` count the bytes of each direction.
pub async fn relay<C, B>(
    client: C,
    backend: B,
    (to_backend, to_client): (Counter, Counter),
    idle_timeout: Duration,
    backend_closed: CancellationToken,
    shutdown: CancellationToken,
) -> RelayOutcome
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Activity::new());
    let mut client = Metered {
        inner: client,
        read_bytes: to_backend,
        activity: Arc::clone(&activity),
    };
    let mut backend = Metered {
        inner: backend,
        read_bytes: to_client,
        activity: Arc::clone(&activity),
    };
    let end = tokio::select! {
        result = tokio::io::copy_bidirectional(&mut client, &mut backend) => {
            if let Err(error) = result {
                tracing::debug!(%error, "relay ended with an error");
            }
            RelayEnd::Closed
        }
        _ = idle_watchdog(activity, idle_timeout) => RelayEnd::IdleTimeout,
        _ = backend_closed.cancelled_owned() => RelayEnd::BackendClosed,
        _ = shutdown.cancelled_owned() => RelayEnd::Shutdown,
    };
    RelayOutcome { end }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn counters() -> (Counter, Counter) {
        (Counter::default(), Counter::default())
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connection_times_out_and_active_one_does_not() {
        let (mut client, client_end) = tokio::io::duplex(64);
        let (backend_end, mut backend) = tokio::io::duplex(64);
        let idle = Duration::from_secs(60);
        let task = tokio::spawn(relay(
            client_end,
            backend_end,
            counters(),
            idle,
            CancellationToken::new(),
            CancellationToken::new(),
        ));
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(45)).await;
            client.write_all(b"x").await.unwrap();
            let mut byte = [0u8; 1];
            backend.read_exact(&mut byte).await.unwrap();
        }
        assert!(
            !task.is_finished(),
            "activity every 45 s keeps a 60 s idle timeout at bay"
        );
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert_eq!(task.await.unwrap().end, RelayEnd::IdleTimeout);
    }

    #[tokio::test]
    async fn half_close_keeps_the_other_direction() {
        let (mut client, client_end) = tokio::io::duplex(64);
        let (backend_end, mut backend) = tokio::io::duplex(64);
        let (to_backend, to_client) = counters();
        let task = tokio::spawn(relay(
            client_end,
            backend_end,
            (to_backend.clone(), to_client.clone()),
            Duration::from_secs(60),
            CancellationToken::new(),
            CancellationToken::new(),
        ));
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut request = Vec::new();
        backend.read_to_end(&mut request).await.unwrap();
        assert_eq!(request, b"request", "backend sees EOF after the request");
        backend.write_all(b"response").await.unwrap();
        backend.shutdown().await.unwrap();
        let mut response = Vec::new();
        client.read_to_end(&mut response).await.unwrap();
        assert_eq!(response, b"response");
        assert_eq!(task.await.unwrap().end, RelayEnd::Closed);
        assert_eq!((to_backend.get(), to_client.get()), (7, 8));
    }

    #[tokio::test]
    async fn backend_closed_token_ends_relay() {
        let (_client, client_end) = tokio::io::duplex(64);
        let (backend_end, _backend) = tokio::io::duplex(64);
        let closed = CancellationToken::new();
        let task = tokio::spawn(relay(
            client_end,
            backend_end,
            counters(),
            Duration::from_secs(60),
            closed.clone(),
            CancellationToken::new(),
        ));
        closed.cancel();
        assert_eq!(task.await.unwrap().end, RelayEnd::BackendClosed);
    }
}
