//! [`FailFastLayer`].

use tower::Layer;

use super::service::FailFast;

/// Wraps a service in [`FailFast`] with an availability predicate.
#[derive(Clone)]
pub struct FailFastLayer<A> {
    available: A,
}

impl<A> FailFastLayer<A> {
    /// `available` returns whether any backend can take connections.
    pub fn new(available: A) -> Self {
        FailFastLayer { available }
    }
}

impl<S, A: Clone> Layer<S> for FailFastLayer<A> {
    type Service = FailFast<S, A>;

    fn layer(&self, inner: S) -> FailFast<S, A> {
        FailFast::new(inner, self.available.clone())
    }
}
