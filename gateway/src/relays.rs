//! Relay threads: where the accept loops and their connections run.
//!
//! With `--threads 1` the gateway is one thread: one current-thread runtime runs the supervisor,
//! the accept loops, the health checks, the admin API and every connection.
//!
//! With `--threads N` (N > 1; the default is one per CPU) the main thread's runtime keeps the
//! supervisor, the health checks and the admin API, and each of N relay threads runs a
//! current-thread runtime of its own with one accept loop per frontend: every frontend binds N
//! listening sockets to its address with `SO_REUSEPORT` ([`crate::net::bind_listeners`]), the
//! kernel spreads incoming connections over them by a hash of the addresses and ports, and the
//! thread that accepts a connection relays it to its end. A connection so never crosses threads: no
//! hand-off from an accepting thread, no work stealing, and its sockets are registered with the
//! reactor of the thread that polls them, while N threads relay in parallel (HAProxy's `nbthread`).
//!
//! Handing each accepted connection from one accepting thread to the relay threads, round robin,
//! was measured first (docs/benchmarks.md): it cost 1.2-1.5x HAProxy's CPU per new connection,
//! against about HAProxy's own with one thread; a multi-thread tokio runtime with N workers lost
//! more to stealing than it gained (see [`crate::cli::default_threads`]).
//!
//! With one relay thread per CPU the process may run on (the default), each is pinned to its
//! CPU ([`crate::affinity`], `--cpu-affinity`), so the kernel never queues two of them on one
//! CPU while another idles.
//!
//! A listener is registered with the reactor of the thread that accepts on it when it is bound
//! ([`RelayPool::register`]), and a reload hands each listener to the next generation's accept loop
//! on the same thread. A relay thread's runtime runs until [`RelayThreads::stop`]; the supervisor
//! stops the accept loops and drains the connections (or reaches its shutdown deadline) before
//! that.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::affinity;

/// Name of the relay threads (`ps -L`, `/proc/PID/task/*/comm`).
pub const RELAY_THREAD_NAME: &str = "gateway-relay";

/// Period of the tick that holds a relaying runtime's timer horizon ([`hold_timer_horizon`]).
pub const TIMER_HORIZON: Duration = Duration::from_secs(1);

/// A current-thread runtime with I/O and timers: the main thread's with relay threads.
pub fn current_thread_runtime() -> io::Result<Runtime> {
    Builder::new_current_thread().enable_all().build()
}

/// A current-thread runtime that relays connections: a relay thread's or, with `--threads 1`,
/// the only one. It holds its timer horizon ([`hold_timer_horizon`]) while it runs.
pub fn relay_runtime() -> io::Result<Runtime> {
    let runtime = current_thread_runtime()?;
    runtime.spawn(hold_timer_horizon());
    Ok(runtime)
}

/// Keeps a timer due within [`TIMER_HORIZON`] on the current runtime, for as long as it runs.
///
/// tokio's timer wakes its own driver (an `eventfd` write, then one more `epoll_wait`) whenever
/// a timer is registered earlier than the wake-up the driver planned when it last parked. Each
/// new connection registers its queue and connect timeouts (5 s by default), and with only the
/// idle watchdogs (1 h) pending those are the earliest: under the new-connection load, `strace`
/// counted 1.06 `eventfd` writes and 1.35 `epoll_wait`s per connection on a relay thread
/// (HAProxy: no such write, 0.53 `epoll_wait`s). With a tick every second the planned wake-up is
/// never more than a second away, so registering a timeout of a second or more never wakes the
/// driver; an idle thread pays one wake-up a second (HAProxy's own poll timeout is about as long).
pub async fn hold_timer_horizon() {
    let mut tick = tokio::time::interval(TIMER_HORIZON);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// Where the accept loops (and so the connections) run: the current runtime, or one relay
/// thread per listener of a frontend.
#[derive(Debug, Default)]
pub struct RelayPool {
    handles: Vec<Handle>,
}

impl RelayPool {
    /// Everything runs on the current runtime.
    pub fn local() -> Self {
        RelayPool::default()
    }

    /// Listening sockets per frontend: one per relay thread, one without relay threads.
    pub fn listeners_per_frontend(&self) -> usize {
        self.handles.len().max(1)
    }

    /// Registers the `index`-th listener of a frontend with the reactor of the thread that
    /// will accept on it (relay thread `index`, or the current runtime).
    pub async fn register(
        &self,
        index: usize,
        listener: std::net::TcpListener,
    ) -> io::Result<TcpListener> {
        let Some(handle) = self.handles.get(index) else {
            return TcpListener::from_std(listener);
        };
        handle
            .spawn(async move { TcpListener::from_std(listener) })
            .await
            .map_err(io::Error::other)?
    }

    /// Runs the accept loop of a frontend's `index`-th listener on the thread the listener
    /// was registered for ([`RelayPool::register`]).
    pub fn spawn_accept<F>(&self, index: usize, accept_loop: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handles.get(index) {
            Some(handle) => handle.spawn(accept_loop),
            None => tokio::spawn(accept_loop),
        }
    }
}

/// The running relay threads.
#[derive(Debug)]
pub struct RelayThreads {
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl RelayThreads {
    /// Starts one relay thread (named [`RELAY_THREAD_NAME`]) per entry of `cpus`, pinned to
    /// that CPU where it names one ([`crate::affinity`]; a failed pin is logged and the
    /// thread runs unpinned), and returns the pool that spawns onto them.
    pub fn start(cpus: &[Option<usize>]) -> io::Result<(RelayPool, RelayThreads)> {
        let count = cpus.len();
        let mut handles = Vec::with_capacity(count);
        let mut running = RelayThreads {
            stops: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
        };
        for &cpu in cpus {
            let runtime = relay_runtime()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(RELAY_THREAD_NAME.to_string())
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        if let Err(error) = affinity::pin_current_thread(cpu) {
                            tracing::warn!(cpu, %error, "cannot pin a relay thread; it runs unpinned");
                        }
                    }
                    // Either a stop or the sender dropped ends the thread.
                    let _ = runtime.block_on(stopped);
                });
            match thread {
                Ok(thread) => {
                    running.stops.push(stop);
                    running.threads.push(thread);
                }
                Err(error) => {
                    running.stop();
                    return Err(error);
                }
            }
        }
        let pool = RelayPool { handles };
        Ok((pool, running))
    }

    /// Stops every relay thread (tasks still on them are dropped, closing their connections)
    /// and waits for them.
    pub fn stop(self) {
        for stop in self.stops {
            let _ = stop.send(());
        }
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A relaying runtime holds its timer horizon from the start; the main thread's does not.
    #[test]
    fn a_relay_runtime_holds_its_timer_horizon() {
        let relaying = relay_runtime().unwrap();
        assert_eq!(relaying.metrics().num_alive_tasks(), 1);
        relaying.block_on(async { tokio::time::sleep(TIMER_HORIZON * 2).await });
        assert_eq!(relaying.metrics().num_alive_tasks(), 1, "it ticks on");
        let main = current_thread_runtime().unwrap();
        assert_eq!(main.metrics().num_alive_tasks(), 0);
    }

    /// Binds a plain listener on a free loopback port.
    fn std_listener() -> std::net::TcpListener {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        listener
    }

    /// Accepts one connection on `listener` and echoes five bytes; reports its thread.
    async fn echo_once(listener: TcpListener) -> (std::thread::ThreadId, Option<String>) {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 5];
        stream.read_exact(&mut buf).await.unwrap();
        stream.write_all(&buf).await.unwrap();
        let thread = std::thread::current();
        (thread.id(), thread.name().map(str::to_string))
    }

    fn echo_through(address: std::net::SocketAddr) {
        let mut client = std::net::TcpStream::connect(address).unwrap();
        client
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        // By now the accept loop waits; the connection and its bytes must wake it.
        std::thread::sleep(std::time::Duration::from_millis(100));
        client.write_all(b"hello").unwrap();
        let mut echoed = [0u8; 5];
        client
            .read_exact(&mut echoed)
            .expect("the relay thread answered");
        assert_eq!(&echoed, b"hello");
    }

    /// The main runtime registers the listeners and starts the accept loops, then is no longer
    /// driven, so its reactor sees no event from then on: each relay thread accepts and serves
    /// on its own reactor alone (a listener registered with the main runtime's reactor would
    /// never see the connection).
    #[test]
    fn each_listener_is_accepted_on_and_served_by_its_own_relay_thread() {
        let (pool, threads) = RelayThreads::start(&[None, None]).expect("relay threads");
        assert_eq!(pool.listeners_per_frontend(), 2);
        let main = current_thread_runtime().unwrap();
        let listeners = [std_listener(), std_listener()];
        let addresses: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let loops: Vec<_> = main.block_on(async {
            let mut loops = Vec::new();
            for (index, listener) in listeners.into_iter().enumerate() {
                let listener = pool.register(index, listener).await.unwrap();
                loops.push(pool.spawn_accept(index, echo_once(listener)));
            }
            loops
        });
        for address in addresses {
            echo_through(address);
        }
        let served: Vec<_> = main.block_on(async {
            let mut served = Vec::new();
            for accept_loop in loops {
                served.push(accept_loop.await.unwrap());
            }
            served
        });
        for (_, name) in &served {
            assert_eq!(name.as_deref(), Some(RELAY_THREAD_NAME));
        }
        assert_ne!(served[0].0, served[1].0, "one relay thread per listener");
        assert_ne!(served[0].0, std::thread::current().id());
        threads.stop();
    }

    /// A relay thread given a CPU runs its tasks pinned to it; one given none keeps the
    /// process's CPUs.
    #[test]
    fn a_relay_thread_given_a_cpu_runs_pinned_to_it() {
        let allowed = affinity::allowed_cpus().expect("affinity");
        let cpu = *allowed.last().expect("a CPU");
        let (pool, threads) = RelayThreads::start(&[Some(cpu), None]).expect("relay threads");
        let main = current_thread_runtime().unwrap();
        let placed: Vec<_> = main.block_on(async {
            let mut placed = Vec::new();
            for index in 0..2 {
                let task = pool.spawn_accept(index, async { affinity::allowed_cpus().unwrap() });
                placed.push(task.await.unwrap());
            }
            placed
        });
        assert_eq!(placed[0], vec![cpu]);
        assert_eq!(placed[1], allowed);
        threads.stop();
    }

    #[test]
    fn a_local_pool_accepts_on_the_current_runtime() {
        let pool = RelayPool::local();
        assert_eq!(pool.listeners_per_frontend(), 1);
        let runtime = current_thread_runtime().unwrap();
        let listener = std_listener();
        let address = listener.local_addr().unwrap();
        let here = std::thread::current().id();
        let client = std::thread::spawn(move || echo_through(address));
        let (thread, _) = runtime.block_on(async {
            let listener = pool.register(0, listener).await.unwrap();
            pool.spawn_accept(0, echo_once(listener)).await.unwrap()
        });
        client.join().unwrap();
        assert_eq!(thread, here);
    }
}
