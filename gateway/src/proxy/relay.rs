//! The relay stage: copy bytes both ways with half-close, an idle timeout and external stops.
//!
//! # Copying without per-connection buffers
//!
//! An idle connection owns no copy buffer. Each direction is a small state machine:
//!
//! 1. **Reading.** Poll the source with the worker thread's scratch buffer of
//!    [`RELAY_CHUNK_BYTES`] (one per runtime thread, borrowed only inside a synchronous poll,
//!    never across an await). A read that is not ready returns `Pending` without touching the
//!    buffer (the `AsyncRead` contract), so waiting costs nothing. Bytes read are written to
//!    the destination at once; when it takes everything, nothing is kept: loop and read again
//!    (tokio's cooperative budget makes a long burst yield to other tasks).
//! 2. **Draining.** When the destination's send buffer is full, the unwritten tail is copied
//!    into a heap buffer owned by this direction; reading stops (backpressure) until the
//!    destination is writable and the tail has gone, then the buffer is freed.
//! 3. **EOF.** A read of 0 bytes flushes and shuts down the destination's write side (FIN),
//!    so half-closed connections work (`kubectl exec` closing stdin while output still flows).
//!    When the other direction has already ended, the destination is only flushed: the relay
//!    ends and closing both sockets sends that FIN (both sources are at EOF, so nothing unread
//!    turns the close into a reset), one `shutdown(2)` fewer per connection, as HAProxy closes.
//!
//! The destination is flushed whenever the source has nothing more for now (a no-op for TCP,
//! kept for writers that buffer).
//!
//! A connection therefore holds heap memory for its data only while the receiving peer is
//! slower than the sending one; an idle connection costs its task, its two sockets'
//! registrations and this state, not two 8 KiB buffers as `tokio::io::copy_bidirectional` did.
//! Bytes are still copied through user space (one copy in, one out, as before); splice(2)
//! would need a pipe (two descriptors and kernel pipe buffers) per direction.
//!
//! # Idle detection
//!
//! Every read stamps the time of the last byte on either side. A watchdog sleeps until
//! `last activity + idle_timeout` and ends the relay only if no byte moved in between, so the
//! timeout is exact without per-read timers. The same timer first wakes once the relay has
//! lasted [`LongLived::after`], to mark its step (the backend's TCP keepalive) due; the copy,
//! which holds the backend stream, runs it on its next poll.
//!
//! The relay ends when both directions have ended, when either direction fails (a reset), or
//! on the idle timeout, the backend's session token or the shutdown token.
//!
//! # Stop conditions polled only when they fire
//!
//! A task is one future with one waker: every socket event polls all of it. The stop
//! conditions are not cheap to poll: a `CancellationToken`'s `cancelled()` locks the token's
//! mutex and then its `Notify`'s waiter list. The shutdown token a relay gets is its accept
//! loop's child of the process's token, shared by that relay thread's connections; the
//! backend's session token is a child token of the connection's own. Their locks are
//! uncontended but still taken on every poll. The relay therefore polls its stop conditions
//! behind a [`WakeGate`]: they get a waker of their own, which marks the gate and wakes the
//! task, and the gate polls them only when that mark is set (and once at the start, to
//! register). A socket event costs the gate one atomic swap on the connection's own memory.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::task::{waker_ref, ArcWake, AtomicWaker};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Largest read of one step: the size of each runtime thread's scratch buffer, and the most a
/// direction holds on the heap while its destination is not writable (HAProxy's default
/// `tune.bufsize`).
pub const RELAY_CHUNK_BYTES: usize = 16 * 1024;

thread_local! {
    /// The scratch buffer of this runtime thread: every relay polled on the thread reads into
    /// it, one at a time (polls are synchronous, so a borrow never spans two relays).
    static SCRATCH: RefCell<Box<[u8]>> =
        RefCell::new(vec![0; RELAY_CHUNK_BYTES].into_boxed_slice());
}

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

/// When the last byte was read on either leg, as nanoseconds since `origin`; when the
/// long-lived step is due, and whether it is.
#[derive(Debug)]
struct Activity {
    origin: Instant,
    last_nanos: AtomicU64,
    long_lived_after: Duration,
    long_lived_due: AtomicBool,
}

impl Activity {
    fn new(long_lived_after: Duration) -> Self {
        Activity {
            origin: Instant::now(),
            last_nanos: AtomicU64::new(0),
            long_lived_after,
            long_lived_due: AtomicBool::new(false),
        }
    }

    fn long_lived_at(&self) -> Instant {
        self.origin + self.long_lived_after
    }

    fn long_lived_due(&self) -> bool {
        self.long_lived_due.load(Ordering::Relaxed)
    }

    fn mark_long_lived_due(&self) {
        self.long_lived_due.store(true, Ordering::Relaxed);
    }

    fn touch(&self) {
        let nanos = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.origin + Duration::from_nanos(self.last_nanos.load(Ordering::Relaxed))
    }
}

/// Where one direction is.
#[derive(Debug)]
enum Pump {
    /// Waiting for the source; no buffer held. `unflushed`: bytes were written since the
    /// last flush.
    Reading { unflushed: bool },
    /// The destination has not taken `tail[written..]` yet.
    Draining { tail: Box<[u8]>, written: usize },
    /// EOF read: flushing and, with `send_fin`, shutting down the destination's write side
    /// (without: the other direction has ended, and the close that follows sends the FIN).
    ShuttingDown { send_fin: bool },
    /// The destination is shut down for writing.
    Done,
}

/// What a read from the scratch buffer led to.
enum Step {
    /// Everything read was written; read again.
    Written,
    /// The source is at EOF.
    Eof,
    /// The destination took only part: drain the rest.
    Partial(Pump),
}

impl Pump {
    const START: Pump = Pump::Reading { unflushed: false };

    /// Moves bytes from `from` to `to` until one would block (`Pending`) or the direction
    /// ends (`Ready(Ok)`), or fails. `other_done`: the opposite direction has ended.
    fn poll<F, T>(
        &mut self,
        cx: &mut Context<'_>,
        mut from: Pin<&mut F>,
        mut to: Pin<&mut T>,
        (bytes, activity): (&Counter, &Activity),
        other_done: bool,
    ) -> Poll<io::Result<()>>
    where
        F: AsyncRead + ?Sized,
        T: AsyncWrite + ?Sized,
    {
        loop {
            match self {
                Pump::Done => return Poll::Ready(Ok(())),
                Pump::ShuttingDown { send_fin } => {
                    if *send_fin {
                        ready!(to.as_mut().poll_shutdown(cx))?;
                    } else {
                        ready!(to.as_mut().poll_flush(cx))?;
                    }
                    *self = Pump::Done;
                }
                Pump::Draining { tail, written } => {
                    let n = ready!(to.as_mut().poll_write(cx, &tail[*written..]))?;
                    if n == 0 {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                    }
                    *written += n;
                    if *written == tail.len() {
                        *self = Pump::Reading { unflushed: true };
                    }
                }
                Pump::Reading { unflushed } => {
                    let step = SCRATCH.with_borrow_mut(|scratch| {
                        read_and_write(cx, from.as_mut(), to.as_mut(), scratch, bytes, activity)
                    });
                    match step {
                        Poll::Pending => {
                            if *unflushed && to.as_mut().poll_flush(cx)?.is_ready() {
                                *unflushed = false;
                            }
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                        Poll::Ready(Ok(Step::Written)) => *unflushed = true,
                        Poll::Ready(Ok(Step::Eof)) => {
                            *self = Pump::ShuttingDown {
                                send_fin: !other_done,
                            }
                        }
                        Poll::Ready(Ok(Step::Partial(next))) => *self = next,
                    }
                }
            }
        }
    }
}

/// One read into `scratch` and one write of what was read; keeps the unwritten tail.
fn read_and_write<F, T>(
    cx: &mut Context<'_>,
    from: Pin<&mut F>,
    to: Pin<&mut T>,
    scratch: &mut [u8],
    bytes: &Counter,
    activity: &Activity,
) -> Poll<io::Result<Step>>
where
    F: AsyncRead + ?Sized,
    T: AsyncWrite + ?Sized,
{
    let mut buf = ReadBuf::new(scratch);
    ready!(from.poll_read(cx, &mut buf))?;
    let read = buf.filled();
    if read.is_empty() {
        return Poll::Ready(Ok(Step::Eof));
    }
    bytes.inc_by(read.len() as u64);
    activity.touch();
    let written = match to.poll_write(cx, read) {
        Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
        Poll::Ready(Ok(written)) => written,
        Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
        Poll::Pending => 0,
    };
    Poll::Ready(Ok(if written == read.len() {
        Step::Written
    } else {
        Step::Partial(Pump::Draining {
            tail: read[written..].into(),
            written: 0,
        })
    }))
}

/// Copies both directions until both have ended (`Ok`) or one fails; runs the long-lived
/// `setup` on the backend once the watchdog marked it due.
async fn copy_both<C, B, F>(
    client: &mut C,
    backend: &mut B,
    (to_backend, to_client): (&Counter, &Counter),
    activity: &Activity,
    setup: F,
) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
    F: FnOnce(&B),
{
    let mut upstream = Pump::START;
    let mut downstream = Pump::START;
    let mut setup = Some(setup);
    std::future::poll_fn(|cx| {
        if let Some(setup) = setup.take_if(|_| activity.long_lived_due()) {
            setup(&*backend);
        }
        let up = upstream.poll(
            cx,
            Pin::new(&mut *client),
            Pin::new(&mut *backend),
            (to_backend, activity),
            matches!(downstream, Pump::Done),
        )?;
        let down = downstream.poll(
            cx,
            Pin::new(&mut *backend),
            Pin::new(&mut *client),
            (to_client, activity),
            matches!(upstream, Pump::Done),
        )?;
        if up.is_ready() && down.is_ready() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Sleeps until `idle_timeout` has passed without activity. On the way, once the relay has
/// lasted [`LongLived::after`], marks the long-lived step due and has the task polled again
/// (the copy, polled first, runs it). One timer serves both: a second `Sleep` in every
/// connection's future cost 0.25 KiB per idle connection.
async fn watchdog(activity: &Activity, idle_timeout: Duration) {
    let long_lived_at = activity.long_lived_at();
    loop {
        let idle_at = activity.last() + idle_timeout;
        let now = Instant::now();
        if now >= idle_at {
            return;
        }
        if activity.long_lived_due() {
            tokio::time::sleep_until(idle_at).await;
        } else if now >= long_lived_at {
            activity.mark_long_lived_due();
            std::future::poll_fn(|cx| {
                cx.waker().wake_by_ref();
                Poll::Ready(())
            })
            .await;
        } else {
            tokio::time::sleep_until(idle_at.min(long_lived_at)).await;
        }
    }
}

/// A step for connections that last: `setup` runs on the backend stream once the relay has
/// gone on for `after` (the backend socket's TCP keepalive, see [`crate::net`]).
pub struct LongLived<F> {
    /// How long the relay runs before `setup`.
    pub after: Duration,
    /// The step; never run for a relay that ends sooner.
    pub setup: F,
}

/// Relays between `client` and `backend` until both directions end or a stop condition hits.
/// `to_backend` and `to_client` count the bytes of each direction. Both streams are dropped
/// (closed) when it returns.
pub async fn relay<C, B, F>(
    mut client: C,
    mut backend: B,
    counters: (&Counter, &Counter),
    idle_timeout: Duration,
    backend_closed: &CancellationToken,
    shutdown: &CancellationToken,
    long_lived: LongLived<F>,
) -> RelayOutcome
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(&B),
{
    let activity = Activity::new(long_lived.after);
    let stops = std::pin::pin!(stop_conditions(
        &activity,
        idle_timeout,
        backend_closed,
        shutdown
    ));
    let end = tokio::select! {
        biased;
        result = copy_both(&mut client, &mut backend, counters, &activity, long_lived.setup) => {
            if let Err(error) = result {
                tracing::debug!(%error, "relay ended with an error");
            }
            RelayEnd::Closed
        }
        end = WakeGate::new(stops) => end,
    };
    RelayOutcome { end }
}

/// The first of the idle timeout, the backend's session token and the shutdown token; marks
/// the long-lived step due on the way.
async fn stop_conditions(
    activity: &Activity,
    idle_timeout: Duration,
    backend_closed: &CancellationToken,
    shutdown: &CancellationToken,
) -> RelayEnd {
    tokio::select! {
        _ = watchdog(activity, idle_timeout) => RelayEnd::IdleTimeout,
        _ = backend_closed.cancelled() => RelayEnd::BackendClosed,
        _ = shutdown.cancelled() => RelayEnd::Shutdown,
    }
}

/// A future polled only after a waker it handed out fired (see the module docs).
struct WakeGate<'a, F> {
    inner: Pin<&'a mut F>,
    gate: Arc<Gate>,
}

/// A [`WakeGate`]'s mark and the task to wake.
struct Gate {
    /// A waker handed to the inner future fired since the last poll of it.
    woken: AtomicBool,
    /// The task that polls the gate.
    task: AtomicWaker,
}

impl<'a, F: Future> WakeGate<'a, F> {
    /// Marked, so the first poll polls `inner` (which registers its wakers).
    fn new(inner: Pin<&'a mut F>) -> Self {
        WakeGate {
            inner,
            gate: Arc::new(Gate {
                woken: AtomicBool::new(true),
                task: AtomicWaker::new(),
            }),
        }
    }
}

impl ArcWake for Gate {
    fn wake_by_ref(gate: &Arc<Self>) {
        gate.woken.store(true, Ordering::Release);
        gate.task.wake();
    }
}

impl<F: Future> Future for WakeGate<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Registered before the mark is read: a wake after the read finds this waker.
        self.gate.task.register(cx.waker());
        if !self.gate.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let this = &mut *self;
        let waker = waker_ref(&this.gate);
        this.inner.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// When the tests' relays run their (empty) long-lived step.
    const TEST_LONG_LIVED: Duration = Duration::from_secs(1);

    /// A long-lived step that does nothing, for the tests that are not about it.
    fn no_step<B>() -> LongLived<fn(&B)> {
        LongLived {
            after: TEST_LONG_LIVED,
            setup: |_| {},
        }
    }

    fn counters() -> (Counter, Counter) {
        (Counter::default(), Counter::default())
    }

    /// A relay with a 60 s idle timeout and no stop tokens, on its own task.
    fn spawn_relay<C, B>(
        client_end: C,
        backend_end: B,
        counters: (Counter, Counter),
    ) -> tokio::task::JoinHandle<RelayOutcome>
    where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        B: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        spawn_stoppable_relay(
            client_end,
            backend_end,
            counters,
            (CancellationToken::new(), CancellationToken::new()),
        )
    }

    /// A relay with a 60 s idle timeout and the given (backend session, shutdown) tokens.
    fn spawn_stoppable_relay<C, B>(
        client_end: C,
        backend_end: B,
        counters: (Counter, Counter),
        (backend_closed, shutdown): (CancellationToken, CancellationToken),
    ) -> tokio::task::JoinHandle<RelayOutcome>
    where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        B: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        spawn_relay_with(
            client_end,
            backend_end,
            counters,
            Duration::from_secs(60),
            (backend_closed, shutdown),
            no_step(),
        )
    }

    /// A relay on its own task that owns what `relay` borrows.
    fn spawn_relay_with<C, B, F>(
        client_end: C,
        backend_end: B,
        (to_backend, to_client): (Counter, Counter),
        idle_timeout: Duration,
        (backend_closed, shutdown): (CancellationToken, CancellationToken),
        long_lived: LongLived<F>,
    ) -> tokio::task::JoinHandle<RelayOutcome>
    where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        B: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: FnOnce(&B) + Send + 'static,
    {
        tokio::spawn(async move {
            relay(
                client_end,
                backend_end,
                (&to_backend, &to_client),
                idle_timeout,
                &backend_closed,
                &shutdown,
                long_lived,
            )
            .await
        })
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connection_times_out_and_active_one_does_not() {
        let (mut client, client_end) = tokio::io::duplex(64);
        let (backend_end, mut backend) = tokio::io::duplex(64);
        let idle = Duration::from_secs(60);
        let task = spawn_relay_with(
            client_end,
            backend_end,
            counters(),
            idle,
            (CancellationToken::new(), CancellationToken::new()),
            no_step(),
        );
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
        let task = spawn_relay(
            client_end,
            backend_end,
            (to_backend.clone(), to_client.clone()),
        );
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

    /// Bulk data both ways at once, the source's pipe larger than a read and the
    /// destination's far smaller: nearly every write is partial, so the direction goes
    /// through the draining state again and again.
    async fn bulk_both_ways(client_pipe: usize, backend_pipe: usize) {
        const PAYLOAD_BYTES: usize = 3 * RELAY_CHUNK_BYTES + 12_345;
        let upload: Vec<u8> = (0..PAYLOAD_BYTES).map(|i| (i % 251) as u8).collect();
        let download: Vec<u8> = (0..PAYLOAD_BYTES).map(|i| (i % 241) as u8).collect();
        let (client, client_end) = tokio::io::duplex(client_pipe);
        let (backend_end, backend) = tokio::io::duplex(backend_pipe);
        let (to_backend, to_client) = counters();
        let task = spawn_relay(
            client_end,
            backend_end,
            (to_backend.clone(), to_client.clone()),
        );
        let peer = |mut stream: tokio::io::DuplexStream, send: Vec<u8>| async move {
            let (mut read, mut write) = tokio::io::split(&mut stream);
            let sending = async {
                write.write_all(&send).await.unwrap();
                write.shutdown().await.unwrap();
            };
            let mut received = Vec::new();
            let receiving = read.read_to_end(&mut received);
            let ((), result) = tokio::join!(sending, receiving);
            result.unwrap();
            received
        };
        let (at_backend, at_client) = tokio::join!(
            peer(backend, download.clone()),
            peer(client, upload.clone())
        );
        assert!(at_backend == upload, "upload arrives intact");
        assert!(at_client == download, "download arrives intact");
        assert_eq!(task.await.unwrap().end, RelayEnd::Closed);
        let expected = PAYLOAD_BYTES as u64;
        assert_eq!((to_backend.get(), to_client.get()), (expected, expected));
    }

    /// Pipe sizes of the bulk tests: a source pipe holding several reads, a destination pipe
    /// holding a fraction of one.
    const LARGE_PIPE_BYTES: usize = 4 * RELAY_CHUNK_BYTES;
    const SMALL_PIPE_BYTES: usize = 1000;

    #[tokio::test]
    async fn bulk_upload_into_a_slow_backend_arrives_intact() {
        bulk_both_ways(LARGE_PIPE_BYTES, SMALL_PIPE_BYTES).await;
    }

    #[tokio::test]
    async fn bulk_download_into_a_slow_client_arrives_intact() {
        bulk_both_ways(SMALL_PIPE_BYTES, LARGE_PIPE_BYTES).await;
    }

    /// A connected loopback TCP pair: (the peer, the relay's end).
    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (end, _) = listener.accept().await.unwrap();
        (peer, end)
    }

    /// Over TCP, whichever side closes first: its EOF reaches the other side by `shutdown(2)`,
    /// and the other side's EOF by the close when the relay ends, a FIN both times (a reset
    /// would fail the last read).
    #[tokio::test]
    async fn tcp_peers_see_both_fins_whoever_closes_first() {
        for client_first in [true, false] {
            let (mut client, client_end) = tcp_pair().await;
            let (mut backend, backend_end) = tcp_pair().await;
            let task = spawn_relay(client_end, backend_end, counters());
            let (first, second) = if client_first {
                (&mut client, &mut backend)
            } else {
                (&mut backend, &mut client)
            };
            first.write_all(b"first").await.unwrap();
            first.shutdown().await.unwrap();
            let mut got = Vec::new();
            second.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"first");
            second.write_all(b"second").await.unwrap();
            second.shutdown().await.unwrap();
            let mut got = Vec::new();
            first.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"second", "client first: {client_first}");
            assert_eq!(task.await.unwrap().end, RelayEnd::Closed);
        }
    }

    /// A reset on one side ends the relay at once, even while the other side is idle.
    #[tokio::test]
    async fn reset_ends_relay() {
        let (client, client_end) = tcp_pair().await;
        let (_backend, backend_end) = tcp_pair().await;
        let task = spawn_relay(client_end, backend_end, counters());
        socket2::SockRef::from(&client)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(client);
        assert_eq!(task.await.unwrap().end, RelayEnd::Closed);
    }

    #[tokio::test]
    async fn backend_closed_token_ends_relay() {
        let (_client, client_end) = tokio::io::duplex(64);
        let (backend_end, _backend) = tokio::io::duplex(64);
        let closed = CancellationToken::new();
        let task = spawn_stoppable_relay(
            client_end,
            backend_end,
            counters(),
            (closed.clone(), CancellationToken::new()),
        );
        closed.cancel();
        assert_eq!(task.await.unwrap().end, RelayEnd::BackendClosed);
    }

    /// The stop conditions behind the gate still fire after the relay has been polled by
    /// socket events (their first poll, which registers them, long past).
    #[tokio::test]
    async fn shutdown_token_ends_a_busy_relay() {
        let (mut client, client_end) = tokio::io::duplex(64);
        let (backend_end, mut backend) = tokio::io::duplex(64);
        let shutdown = CancellationToken::new();
        let task = spawn_stoppable_relay(
            client_end,
            backend_end,
            counters(),
            (CancellationToken::new(), shutdown.clone()),
        );
        for _ in 0..10 {
            client.write_all(b"ping").await.unwrap();
            let mut ping = [0u8; 4];
            backend.read_exact(&mut ping).await.unwrap();
        }
        shutdown.cancel();
        assert_eq!(task.await.unwrap().end, RelayEnd::Shutdown);
    }

    /// The long-lived step runs once, on the backend stream, after its delay, also on a
    /// connection that is silent all along; a relay that ends sooner never runs it.
    #[tokio::test(start_paused = true)]
    async fn the_long_lived_step_runs_once_after_its_delay() {
        let runs = Arc::new(AtomicU64::new(0));
        let spawn = |runs: Arc<AtomicU64>| {
            let (client, client_end) = tokio::io::duplex(64);
            let (backend_end, backend) = tokio::io::duplex(64);
            let task = spawn_relay_with(
                client_end,
                backend_end,
                counters(),
                Duration::from_secs(60),
                (CancellationToken::new(), CancellationToken::new()),
                LongLived {
                    after: TEST_LONG_LIVED,
                    setup: move |_: &tokio::io::DuplexStream| {
                        runs.fetch_add(1, Ordering::Relaxed);
                    },
                },
            );
            (client, backend, task)
        };
        let (client, backend, short) = spawn(Arc::clone(&runs));
        drop((client, backend));
        assert_eq!(short.await.unwrap().end, RelayEnd::Closed);
        tokio::time::sleep(TEST_LONG_LIVED * 2).await;
        assert_eq!(runs.load(Ordering::Relaxed), 0, "a short relay skips it");

        let (_client, _backend, long) = spawn(Arc::clone(&runs));
        tokio::time::sleep(TEST_LONG_LIVED / 2).await;
        assert_eq!(runs.load(Ordering::Relaxed), 0, "not before its delay");
        tokio::time::sleep(TEST_LONG_LIVED).await;
        assert_eq!(
            runs.load(Ordering::Relaxed),
            1,
            "run on a silent connection"
        );
        tokio::time::sleep(TEST_LONG_LIVED * 10).await;
        assert_eq!(runs.load(Ordering::Relaxed), 1, "run once");
        assert!(!long.is_finished());
    }

    /// An idle timeout shorter than the long-lived delay ends the relay on time: the one
    /// timer sleeps until the earlier of the two.
    #[tokio::test(start_paused = true)]
    async fn an_idle_timeout_before_the_long_lived_delay_still_ends_the_relay() {
        let (_client, client_end) = tokio::io::duplex(64);
        let (backend_end, _backend) = tokio::io::duplex(64);
        let idle = TEST_LONG_LIVED / 4;
        let started = Instant::now();
        let outcome = spawn_relay_with(
            client_end,
            backend_end,
            counters(),
            idle,
            (CancellationToken::new(), CancellationToken::new()),
            no_step(),
        )
        .await
        .unwrap();
        assert_eq!(outcome.end, RelayEnd::IdleTimeout);
        let elapsed = started.elapsed();
        assert!(
            elapsed >= idle && elapsed < TEST_LONG_LIVED,
            "ended after {elapsed:?}"
        );
    }

    /// A waker that counts its wakes.
    struct CountingWaker(AtomicU64);

    impl ArcWake for CountingWaker {
        fn wake_by_ref(waker: &Arc<Self>) {
            waker.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_gate_polls_its_future_only_after_the_future_s_waker_fired() {
        let polls = AtomicU64::new(0);
        let inner_waker = std::sync::Mutex::new(None::<std::task::Waker>);
        let fire = AtomicBool::new(false);
        let inner = std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::Relaxed);
            *inner_waker.lock().unwrap() = Some(cx.waker().clone());
            if fire.load(Ordering::Relaxed) {
                Poll::Ready("fired")
            } else {
                Poll::Pending
            }
        });
        let inner = std::pin::pin!(inner);
        let mut gate = WakeGate::new(inner);
        let task = Arc::new(CountingWaker(AtomicU64::new(0)));
        let task_waker = futures::task::waker(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        for _ in 0..5 {
            assert!(Pin::new(&mut gate).poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1, "polled once, to register");
        assert_eq!(task.0.load(Ordering::Relaxed), 0);
        fire.store(true, Ordering::Relaxed);
        let registered = inner_waker.lock().unwrap().take();
        registered.expect("registered").wake();
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            1,
            "the inner wake wakes the task"
        );
        assert_eq!(Pin::new(&mut gate).poll(&mut cx), Poll::Ready("fired"));
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }
}
