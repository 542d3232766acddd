//! [`SharedBalancer`]: one frontend's balancer, shared by its connections without a worker task.
//!
//! tower's `Buffer` lets many callers use one service by sending each request over a channel
//! to a worker task, which waits for readiness, calls the service and sends the response future
//! back: a channel round trip and two task wake-ups for every new connection. Here each
//! connection's connect future uses the service itself instead:
//!
//! 1. it takes a fair (first in, first out) async mutex around the service;
//! 2. holding it, it waits until the service is ready (the balancer has a ready endpoint, or
//!    [`FailFast`](crate::failfast::FailFast) refuses at once) and calls it;
//! 3. it releases the mutex and awaits the returned connect future on its own.
//!
//! Only the lock holder is registered with the balancer's wakers; the other connections wait
//! on the mutex in arrival order, which is the order and back-pressure the buffer's queue gave.
//! Uncontended, taking the mutex is one atomic operation on the connection's own task. A waiter
//! that gives up (queue timeout, shutdown) leaves the queue when its future is dropped. The
//! number of waiters is bounded by the frontend's connection limit: each holds one of its
//! permits. An error from the service reaches only the connection that met it; unlike a
//! buffer's worker, nothing is closed for the connections after it.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::sync::Mutex;
use tower::util::BoxService;
use tower::{Service, ServiceExt};

use crate::endpoint::{BackendConnection, ConnectRequest};
use crate::BoxError;

/// The type-erased fail-fast balancer of one frontend.
pub type GuardedBalancer = BoxService<ConnectRequest, BackendConnection, BoxError>;

/// A cloneable handle on one frontend's balancer; see the module docs.
#[derive(Clone)]
pub struct SharedBalancer {
    inner: Arc<Mutex<GuardedBalancer>>,
}

impl SharedBalancer {
    /// Shares `balancer`.
    pub fn new(balancer: GuardedBalancer) -> Self {
        SharedBalancer {
            inner: Arc::new(Mutex::new(balancer)),
        }
    }
}

impl Service<ConnectRequest> for SharedBalancer {
    type Response = BackendConnection;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<BackendConnection, BoxError>>;

    /// Always ready: waiting for the balancer happens in the call's future, in the queue of
    /// the mutex.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: ConnectRequest) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let connect = {
                let mut balancer = inner.lock().await;
                balancer.ready().await?.call(request)
            };
            connect.await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::future;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::backend::Backend;

    /// A service ready only after `polls_left` polls, counting its calls.
    struct SlowToReady {
        polls_left: usize,
        calls: Arc<AtomicUsize>,
        address: std::net::SocketAddr,
    }

    impl Service<ConnectRequest> for SlowToReady {
        type Response = BackendConnection;
        type Error = BoxError;
        type Future = BoxFuture<'static, Result<BackendConnection, BoxError>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            if self.polls_left == 0 {
                return Poll::Ready(Ok(()));
            }
            self.polls_left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }

        fn call(&mut self, _request: ConnectRequest) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let address = self.address;
            Box::pin(async move {
                let stream = TcpStream::connect(address).await?;
                let backend = test_backend(address);
                let slot = backend.open_slot();
                Ok(BackendConnection { stream, slot })
            })
        }
    }

    fn test_backend(address: std::net::SocketAddr) -> Arc<Backend> {
        let frontend = crate::config::Config::from_toml(&format!(
            "[[frontend]]\nname = \"f\"\nlisten = \"127.0.0.1:0\"\n\
             [[frontend.backend]]\nname = \"b\"\naddress = \"{address}\"\n"
        ))
        .expect("valid configuration")
        .frontends
        .remove(0);
        let config = frontend.backends[0].clone();
        Backend::new(
            &frontend,
            config,
            crate::metrics::Metrics::new().backend("f", "b"),
        )
    }

    /// Every concurrent caller is served once the service turns ready; none is lost or
    /// left waiting although only the lock holder polls the service.
    #[tokio::test]
    async fn concurrent_callers_all_connect() {
        const CALLERS: usize = 8;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let accepting = tokio::spawn(async move {
            let mut accepted = Vec::new();
            for _ in 0..CALLERS {
                accepted.push(listener.accept().await.expect("accept"));
            }
            accepted
        });
        let calls = Arc::new(AtomicUsize::new(0));
        let shared = SharedBalancer::new(BoxService::new(SlowToReady {
            polls_left: 3,
            calls: Arc::clone(&calls),
            address,
        }));
        let attempts = (0..CALLERS).map(|port| {
            shared.clone().oneshot(ConnectRequest {
                client: std::net::SocketAddr::from(([127, 0, 0, 1], 1000 + port as u16)),
            })
        });
        let connected = tokio::time::timeout(Duration::from_secs(10), future::join_all(attempts))
            .await
            .expect("every caller is served");
        assert!(
            connected.iter().all(Result::is_ok),
            "every connect succeeds"
        );
        assert_eq!(calls.load(Ordering::SeqCst), CALLERS);
        assert_eq!(accepting.await.expect("accept task").len(), CALLERS);
    }
}
