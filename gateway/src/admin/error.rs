//! Admin API errors.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Why an admin request was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No such frontend/backend in the running configuration.
    #[error("no backend {backend} in frontend {frontend}")]
    UnknownBackend {
        /// Frontend name.
        frontend: String,
        /// Backend name.
        backend: String,
    },
    /// The action is not drain, disable or enable.
    #[error("unknown action {0}: use drain, disable or enable")]
    UnknownAction(String),
    /// The weight is out of range.
    #[error("weight {weight} is above the maximum {max}")]
    WeightOutOfRange {
        /// Requested weight.
        weight: u32,
        /// The maximum.
        max: u32,
    },
    /// The gateway runs without a virtual IP.
    #[error("no virtual IP is configured")]
    NoVip,
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = match self {
            AdminError::UnknownBackend { .. } | AdminError::NoVip => StatusCode::NOT_FOUND,
            AdminError::UnknownAction(_) | AdminError::WeightOutOfRange { .. } => {
                StatusCode::BAD_REQUEST
            }
        };
        (status, format!("{self}\n")).into_response()
    }
}
