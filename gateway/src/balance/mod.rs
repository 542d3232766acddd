//! Balancers: pick the backend endpoint for each new connection.
//!
//! Backends reach the balancer through tower's [`Discover`](tower::discover::Discover): each
//! frontend generation (start or reload) feeds one `Change::Insert` per backend. Endpoints that
//! are not ready (down, drained, disabled, suspect, at their limit) wait in tower's
//! `ReadyCache` and come back when their backend's change channel wakes them.
//!
//! * [`BalancePolicy::LeastConnections`] and [`BalancePolicy::PeakEwma`] use tower's
//!   power-of-two-choices [`Balance`] with the endpoint's [`Load`](tower::load::Load) (see
//!   [`crate::load`] for the costs). Its randomness comes from a [`SeededRng`], so a test (or
//!   an operator reproducing a distribution) can fix the seed.
//! * [`BalancePolicy::RoundRobin`] uses [`RoundRobin`], smooth weighted round robin over the
//!   ready endpoints.

mod round_robin;
mod seeded_rng;

use std::convert::Infallible;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tower::balance::p2c::Balance;
use tower::discover::Change;
use tower::util::BoxService;

pub use round_robin::{RoundRobin, Weighted};
pub use seeded_rng::SeededRng;

use crate::config::{BalancePolicy, MAX_ENTRIES};
use crate::endpoint::{BackendConnection, ConnectRequest, Endpoint};
use crate::BoxError;

/// Capacity of one generation's discovery channel: every backend is inserted once.
pub const DISCOVERY_CAPACITY: usize = MAX_ENTRIES;

/// A change announced to the balancer.
pub type EndpointChange = Result<Change<String, Endpoint>, Infallible>;
/// The discovery stream of one frontend generation.
pub type EndpointDiscover = ReceiverStream<EndpointChange>;
/// A type-erased balancer.
pub type BoxBalancer = BoxService<ConnectRequest, BackendConnection, BoxError>;

/// A discovery stream announcing `endpoints`, and the sender that keeps it open (dropping it
/// ends the stream; the balancer keeps its endpoints).
pub fn discover(
    endpoints: Vec<(String, Endpoint)>,
) -> (EndpointDiscover, mpsc::Sender<EndpointChange>) {
    assert!(
        endpoints.len() <= DISCOVERY_CAPACITY,
        "{} backends exceed the discovery capacity {DISCOVERY_CAPACITY}",
        endpoints.len()
    );
    let (sender, receiver) = mpsc::channel(DISCOVERY_CAPACITY.max(1));
    for (name, endpoint) in endpoints {
        sender
            .try_send(Ok(Change::Insert(name, endpoint)))
            .expect("discovery channel has room for every backend");
    }
    (ReceiverStream::new(receiver), sender)
}

/// Builds the balancer of `policy` over `discover`, seeding p2c with `seed`.
pub fn balancer(policy: BalancePolicy, discover: EndpointDiscover, seed: u64) -> BoxBalancer {
    match policy {
        BalancePolicy::LeastConnections | BalancePolicy::PeakEwma => {
            BoxService::new(Balance::from_rng(discover, SeededRng::new(seed)))
        }
        BalancePolicy::RoundRobin => BoxService::new(RoundRobin::new(discover)),
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::task::{Context, Poll};

    use futures::future;
    use tower::load::Load;
    use tower::{Service, ServiceExt};

    use super::*;

    /// An always-ready endpoint with a fixed load.
    struct Fixed {
        name: &'static str,
        load: f64,
    }

    impl Load for Fixed {
        type Metric = f64;

        fn load(&self) -> f64 {
            self.load
        }
    }

    impl Service<()> for Fixed {
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

    async fn picks(seed: u64, count: usize) -> Vec<&'static str> {
        let endpoints = [("light", 1.0), ("medium", 2.0), ("heavy", 3.0)]
            .into_iter()
            .map(|(name, load)| Ok::<_, Infallible>(Change::Insert(name, Fixed { name, load })));
        let mut balancer =
            Balance::from_rng(futures::stream::iter(endpoints), SeededRng::new(seed));
        let mut picks = Vec::with_capacity(count);
        for _ in 0..count {
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
        picks
    }

    #[tokio::test]
    async fn p2c_is_reproducible_and_never_picks_the_most_loaded() {
        let first = picks(42, 200).await;
        assert_eq!(first, picks(42, 200).await, "same seed, same choices");
        assert!(
            !first.contains(&"heavy"),
            "the heaviest endpoint loses every comparison"
        );
        let light = first.iter().filter(|pick| **pick == "light").count();
        // light wins 2 of the 3 possible pairs, medium 1: expect about 2/3 light.
        assert!(
            (100..=170).contains(&light),
            "light picked {light} of 200 times"
        );
        assert_ne!(
            first,
            picks(7, 200).await,
            "another seed gives another sequence"
        );
    }
}
