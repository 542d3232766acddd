//! [`FailFast`] service.

use std::task::{Context, Poll};

use futures::future::{self, Either, MapErr, TryFutureExt};
use tower::Service;

use super::error::NoHealthyBackend;
use crate::BoxError;

/// Fails requests at once while `available()` is false; see the module docs.
#[derive(Debug)]
pub struct FailFast<S, A> {
    inner: S,
    available: A,
    /// Set by `poll_ready` when the next call must be refused.
    refuse_next: bool,
}

impl<S, A> FailFast<S, A> {
    /// Wraps `inner`.
    pub fn new(inner: S, available: A) -> Self {
        FailFast {
            inner,
            available,
            refuse_next: false,
        }
    }
}

type InnerFuture<F, E> = MapErr<F, fn(E) -> BoxError>;

impl<S, A, Request> Service<Request> for FailFast<S, A>
where
    S: Service<Request>,
    S::Error: Into<BoxError>,
    A: Fn() -> bool,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future =
        Either<InnerFuture<S::Future, S::Error>, future::Ready<Result<S::Response, BoxError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if !(self.available)() {
            self.refuse_next = true;
            return Poll::Ready(Ok(()));
        }
        self.refuse_next = false;
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if std::mem::take(&mut self.refuse_next) {
            return Either::Right(future::ready(Err(NoHealthyBackend.into())));
        }
        let to_box: fn(S::Error) -> BoxError = Into::into;
        Either::Left(self.inner.call(request).map_err(to_box))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use tower::ServiceExt;

    use super::*;

    /// An inner service that is never ready, like tower's balancer with no ready endpoint.
    struct NeverReady;

    impl Service<u8> for NeverReady {
        type Response = u8;
        type Error = BoxError;
        type Future = future::Ready<Result<u8, BoxError>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Pending
        }

        fn call(&mut self, request: u8) -> Self::Future {
            future::ready(Ok(request))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refuses_at_once_when_nothing_is_available() {
        let mut service = FailFast::new(NeverReady, || false);
        let error = service
            .ready()
            .await
            .expect("ready")
            .call(1)
            .await
            .expect_err("refused");
        assert!(error.is::<NoHealthyBackend>(), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_the_inner_service_when_available() {
        let available = Arc::new(AtomicBool::new(true));
        let predicate = {
            let available = Arc::clone(&available);
            move || available.load(Ordering::SeqCst)
        };
        let mut service = FailFast::new(NeverReady, predicate);
        let waited = tokio::time::timeout(std::time::Duration::from_secs(1), service.ready()).await;
        assert!(waited.is_err(), "pending while a backend is available");
        available.store(false, Ordering::SeqCst);
        let error = service
            .ready()
            .await
            .expect("ready")
            .call(1)
            .await
            .expect_err("refused");
        assert!(error.is::<NoHealthyBackend>());
    }

    #[tokio::test]
    async fn passes_through_when_ready() {
        let inner = tower::service_fn(|request: u8| async move { Ok::<_, BoxError>(request + 1) });
        let mut service = FailFast::new(inner, || true);
        assert_eq!(
            service
                .ready()
                .await
                .expect("ready")
                .call(1)
                .await
                .expect("ok"),
            2
        );
    }
}
