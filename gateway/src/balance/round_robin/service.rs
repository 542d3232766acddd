//! [`RoundRobin`] service.

use std::collections::HashMap;
use std::hash::Hash;
use std::task::{Context, Poll};

use futures::future::{MapErr, TryFutureExt};
use tower::discover::{Change, Discover};
use tower::ready_cache::ReadyCache;
use tower::Service;

use crate::BoxError;

/// An endpoint with a weight (positive while it should receive traffic).
pub trait Weighted {
    /// The current weight.
    fn weight(&self) -> f64;
}

impl Weighted for crate::endpoint::Endpoint {
    fn weight(&self) -> f64 {
        self.backend().effective_weight(tokio::time::Instant::now())
    }
}

/// Smooth weighted round robin over discovered endpoints; see the module docs.
pub struct RoundRobin<D, Request>
where
    D: Discover,
    D::Key: Hash,
{
    discover: D,
    services: ReadyCache<D::Key, D::Service, Request>,
    scores: HashMap<D::Key, f64>,
    chosen: Option<usize>,
}

impl<D, Request> RoundRobin<D, Request>
where
    D: Discover + Unpin,
    D::Key: Hash + Clone + Eq,
    D::Service: Service<Request> + Weighted,
    D::Error: Into<BoxError>,
    <D::Service as Service<Request>>::Error: Into<BoxError>,
{
    /// A balancer over `discover`.
    pub fn new(discover: D) -> Self {
        RoundRobin {
            discover,
            services: ReadyCache::default(),
            scores: HashMap::new(),
            chosen: None,
        }
    }

    fn update_from_discover(&mut self, cx: &mut Context<'_>) -> Result<(), BoxError> {
        while let Poll::Ready(Some(change)) =
            std::pin::Pin::new(&mut self.discover).poll_discover(cx)
        {
            match change.map_err(Into::into)? {
                Change::Insert(key, service) => self.services.push(key, service),
                Change::Remove(key) => {
                    self.services.evict(&key);
                    self.scores.remove(&key);
                }
            }
        }
        Ok(())
    }

    fn promote_pending(&mut self, cx: &mut Context<'_>) {
        loop {
            match self.services.poll_pending(cx) {
                Poll::Ready(Ok(())) | Poll::Pending => return,
                Poll::Ready(Err(error)) => tracing::debug!(%error, "dropping failed endpoint"),
            }
        }
    }

    fn pick(&mut self) -> Option<usize> {
        let mut total = 0.0;
        let mut best: Option<(usize, f64)> = None;
        for index in 0..self.services.ready_len() {
            let (key, service) = self
                .services
                .get_ready_index(index)
                .expect("index below ready_len");
            let weight = service.weight().max(0.0);
            total += weight;
            let score = self.scores.entry(key.clone()).or_insert(0.0);
            *score += weight;
            if best.is_none_or(|(_, best_score)| *score > best_score) {
                best = Some((index, *score));
            }
        }
        let (index, _) = best?;
        let (key, _) = self
            .services
            .get_ready_index(index)
            .expect("index below ready_len");
        *self.scores.get_mut(key).expect("score inserted above") -= total;
        Some(index)
    }
}

impl<D, Request> Service<Request> for RoundRobin<D, Request>
where
    D: Discover + Unpin,
    D::Key: Hash + Clone + Eq,
    D::Service: Service<Request> + Weighted,
    D::Error: Into<BoxError>,
    <D::Service as Service<Request>>::Error: Into<BoxError>,
{
    type Response = <D::Service as Service<Request>>::Response;
    type Error = BoxError;
    type Future = MapErr<
        <D::Service as Service<Request>>::Future,
        fn(<D::Service as Service<Request>>::Error) -> BoxError,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.update_from_discover(cx)?;
        self.promote_pending(cx);
        loop {
            if let Some(index) = self.chosen.take() {
                if let Ok(true) = self.services.check_ready_index(cx, index) {
                    self.chosen = Some(index);
                    return Poll::Ready(Ok(()));
                }
            }
            self.chosen = self.pick();
            if self.chosen.is_none() {
                return Poll::Pending;
            }
        }
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let index = self
            .chosen
            .take()
            .expect("RoundRobin::call before poll_ready returned Ready");
        let to_box: fn(<D::Service as Service<Request>>::Error) -> BoxError = Into::into;
        self.services
            .call_ready_index(index, request)
            .map_err(to_box)
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures::future;
    use tower::ServiceExt;

    use super::*;

    struct Named {
        name: &'static str,
        weight: f64,
    }

    impl Weighted for Named {
        fn weight(&self) -> f64 {
            self.weight
        }
    }

    impl Service<()> for Named {
        type Response = &'static str;
        type Error = Infallible;
        type Future = future::Ready<Result<&'static str, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: ()) -> Self::Future {
            future::ready(Ok(self.name))
        }
    }

    #[tokio::test]
    async fn smooth_weighted_sequence() {
        let endpoints = [("a", 5.0), ("b", 1.0), ("c", 1.0)]
            .into_iter()
            .map(|(name, weight)| {
                Ok::<_, Infallible>(Change::Insert(name, Named { name, weight }))
            });
        let mut balancer = RoundRobin::new(futures::stream::iter(endpoints));
        let mut picks = Vec::new();
        for _ in 0..7 {
            picks.push(
                balancer
                    .ready()
                    .await
                    .expect("ready")
                    .call(())
                    .await
                    .expect("ok"),
            );
        }
        // Ties are broken by ready-set order, which calls permute; the shape is fixed:
        // five a, one b, one c, and never three a in a row (plain weighted RR gives five).
        let count = |name| picks.iter().filter(|pick| **pick == name).count();
        assert_eq!((count("a"), count("b"), count("c")), (5, 1, 1), "{picks:?}");
        assert!(
            !picks.windows(3).any(|w| w.iter().all(|pick| *pick == "a")),
            "{picks:?}"
        );
        assert_eq!(picks[..2], ["a", "a"]);
    }
}
