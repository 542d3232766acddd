//! Relay threads: where accepted connections run.
//!
//! With `--threads 1` (the default) the gateway is one thread: one current-thread runtime runs
//! the supervisor, the accept loops, the health checks, the admin API and every connection.
//!
//! With `--threads N` (N > 1) the main thread's runtime keeps the supervisor, the accept loops,
//! the health checks and the admin API, and the accept loops hand every accepted connection,
//! round robin, to one of N relay threads, each running a current-thread runtime of its own
//! ([`RelayPool::spawn`]). A connection stays on its thread from the connect stage to its
//! end: no work stealing and no cross-thread wake-up per relayed read, while N threads relay
//! in parallel (HAProxy's `nbthread`). For that the accepted socket is detached from the
//! accepting runtime's reactor and registered with the relay thread's
//! ([`RelayPool::detach`], [`ClientStream`]); otherwise the accepting thread would take every
//! readiness event of the client's socket and wake the relay thread for it. A multi-thread tokio runtime with N workers was
//! measured first and lost more to stealing than it gained (see `cli::DEFAULT_THREADS`).
//!
//! A relay thread's runtime runs until [`RelayThreads::stop`]; the supervisor drains the
//! connections (or reaches its shutdown deadline) before that.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::net::TcpStream;
use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::cli::RELAY_THREAD_NAME;
use crate::proxy::ClientStream;

/// A current-thread runtime with I/O and timers: the relay threads' and, with `--threads 1`,
/// the only one.
pub fn current_thread_runtime() -> io::Result<Runtime> {
    Builder::new_current_thread().enable_all().build()
}

/// Where connection tasks are spawned: the current runtime, or the relay threads in turn.
#[derive(Debug, Default)]
pub struct RelayPool {
    handles: Vec<Handle>,
    next: AtomicUsize,
}

impl RelayPool {
    /// Connections run on the runtime that accepts them.
    pub fn local() -> Self {
        RelayPool::default()
    }

    /// Relay threads in use (0: the accepting runtime's).
    pub fn threads(&self) -> usize {
        self.handles.len()
    }

    /// Prepares an accepted socket for [`RelayPool::spawn`]: kept as it is when connections run
    /// on the accepting runtime, detached from its reactor when a relay thread will run it
    /// (see [`ClientStream`]).
    pub fn detach(&self, stream: TcpStream) -> io::Result<ClientStream> {
        if self.handles.is_empty() {
            return Ok(ClientStream::Registered(stream));
        }
        stream.into_std().map(ClientStream::Detached)
    }

    /// Spawns a connection's task, tracked by `tracker`, on the next relay thread (or on the
    /// current runtime when the pool has none).
    pub fn spawn<F>(&self, tracker: &TaskTracker, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.handles.is_empty() {
            tracker.spawn(task);
            return;
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        tracker.spawn_on(task, &self.handles[turn]);
    }
}

/// The running relay threads.
#[derive(Debug)]
pub struct RelayThreads {
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl RelayThreads {
    /// Starts `count` relay threads (named [`RELAY_THREAD_NAME`]) and returns the pool that
    /// spawns onto them.
    pub fn start(count: usize) -> io::Result<(RelayPool, RelayThreads)> {
        let mut handles = Vec::with_capacity(count);
        let mut running = RelayThreads {
            stops: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
        };
        for _ in 0..count {
            let runtime = current_thread_runtime()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(RELAY_THREAD_NAME.to_string())
                .spawn(move || {
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
        let pool = RelayPool {
            handles,
            next: AtomicUsize::new(0),
        };
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
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    #[test]
    fn connections_go_round_robin_and_stay_on_their_thread() {
        let (pool, threads) = RelayThreads::start(2).expect("relay threads");
        assert_eq!(pool.threads(), 2);
        let runtime = current_thread_runtime().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tracker = TaskTracker::new();
        for i in 0..4 {
            let seen = Arc::clone(&seen);
            let task = async move {
                let before = std::thread::current().id();
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                let after = std::thread::current().id();
                let name = std::thread::current().name().map(str::to_string);
                seen.lock().unwrap().push((i, before, after, name));
            };
            runtime.block_on(async { pool.spawn(&tracker, task) });
        }
        tracker.close();
        runtime.block_on(tracker.wait());
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_by_key(|entry| entry.0);
        for (_, before, after, name) in &seen {
            assert_eq!(before, after, "a connection moved between threads");
            assert_eq!(name.as_deref(), Some(RELAY_THREAD_NAME));
        }
        assert_eq!(seen[0].1, seen[2].1, "round robin: 0 and 2 share a thread");
        assert_eq!(seen[1].1, seen[3].1);
        assert_ne!(seen[0].1, seen[1].1);
        threads.stop();
    }

    #[test]
    fn a_local_pool_spawns_on_the_current_runtime() {
        let pool = RelayPool::local();
        assert_eq!(pool.threads(), 0);
        let runtime = Builder::new_current_thread().build().unwrap();
        let tracker = TaskTracker::new();
        let ran = Arc::new(AtomicBool::new(false));
        let here = std::thread::current().id();
        let flag = Arc::clone(&ran);
        runtime.block_on(async {
            pool.spawn(&tracker, async move {
                assert_eq!(std::thread::current().id(), here);
                flag.store(true, Ordering::Relaxed);
            });
            tracker.close();
            tracker.wait().await;
        });
        assert!(ran.load(Ordering::Relaxed));
    }

    /// The accepting runtime stops being driven once it has handed the connection over, so
    /// its reactor sees no event from then on: the relay thread serves the connection only if
    /// the socket was registered with its own reactor (with the accepting runtime's, the
    /// relay task's first read would wait for ever).
    #[test]
    fn a_handed_over_socket_is_woken_by_its_relay_threads_reactor() {
        use std::io::{Read, Write};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let (pool, threads) = RelayThreads::start(1).expect("relay threads");
        let accepting = current_thread_runtime().unwrap();
        let listener = accepting
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let tracker = TaskTracker::new();
        accepting.block_on(async {
            let (stream, _) = listener.accept().await.unwrap();
            let stream = pool.detach(stream).unwrap();
            assert!(matches!(stream, ClientStream::Detached(_)));
            pool.spawn(&tracker, async move {
                let mut stream = stream.register().unwrap();
                let mut buf = [0u8; 5];
                stream.read_exact(&mut buf).await.unwrap();
                stream.write_all(&buf).await.unwrap();
            });
        });
        client
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        // By now the relay task waits for its first read; the bytes must wake it.
        std::thread::sleep(std::time::Duration::from_millis(100));
        client.write_all(b"hello").unwrap();
        let mut echoed = [0u8; 5];
        client
            .read_exact(&mut echoed)
            .expect("the relay thread answered");
        assert_eq!(&echoed, b"hello");
        tracker.close();
        threads.stop();
    }

    #[test]
    fn a_local_pool_keeps_the_socket_registered() {
        let runtime = current_thread_runtime().unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (stream, _) = listener.accept().await.unwrap();
            let stream = RelayPool::local().detach(stream).unwrap();
            assert!(matches!(stream, ClientStream::Registered(_)));
        });
    }
}
