//! Redispatch: retry a failed connect on another backend (HAProxy `retries` + `option
//! redispatch`).

use futures::future;
use tower::retry::Policy;

use crate::endpoint::{ConnectError, ConnectRequest};
use crate::BoxError;

/// Retries connect failures, at most `remaining` times per client connection. Other errors
/// (no healthy backend, closed balancer) are final. The backend that failed is marked suspect
/// before the error reaches this policy, so the balancer does not pick it again.
#[derive(Debug, Clone)]
pub struct Redispatch {
    remaining: u32,
}

impl Redispatch {
    /// A policy allowing `retries` redispatches.
    pub fn new(retries: u32) -> Self {
        Redispatch { remaining: retries }
    }
}

impl<Response> Policy<ConnectRequest, Response, BoxError> for Redispatch {
    type Future = future::Ready<()>;

    fn retry(
        &mut self,
        _request: &mut ConnectRequest,
        result: &mut Result<Response, BoxError>,
    ) -> Option<Self::Future> {
        let Err(error) = result else {
            return None;
        };
        if self.remaining == 0 || !error.is::<ConnectError>() {
            return None;
        }
        self.remaining -= 1;
        Some(future::ready(()))
    }

    fn clone_request(&mut self, request: &ConnectRequest) -> Option<ConnectRequest> {
        Some(request.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect_error() -> BoxError {
        Box::new(ConnectError::TimedOut {
            backend: "b".into(),
            address: "127.0.0.1:1".into(),
        })
    }

    #[test]
    fn retries_connect_errors_a_bounded_number_of_times() {
        let mut policy = Redispatch::new(2);
        let mut request = ConnectRequest {
            client: "127.0.0.1:5".parse().unwrap(),
        };
        let mut result: Result<(), BoxError> = Err(connect_error());
        assert!(policy.retry(&mut request, &mut result).is_some());
        assert!(policy.retry(&mut request, &mut result).is_some());
        assert!(policy.retry(&mut request, &mut result).is_none());
    }

    #[test]
    fn other_errors_are_final() {
        let mut policy = Redispatch::new(2);
        let mut request = ConnectRequest {
            client: "127.0.0.1:5".parse().unwrap(),
        };
        let mut result: Result<(), BoxError> = Err(Box::new(crate::failfast::NoHealthyBackend));
        assert!(policy.retry(&mut request, &mut result).is_none());
        let mut ok: Result<(), BoxError> = Ok(());
        assert!(policy.retry(&mut request, &mut ok).is_none());
    }
}
