//! Admin API handlers.

use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{Html, IntoResponse};
use axum::Json;

use super::error::AdminError;
use super::status_page::render;
use super::AdminContext;
use crate::backend::{AdminState, BackendStatus};
use crate::config::MAX_WEIGHT;
use crate::vip::VipStatus;

/// Content type of the OpenMetrics text format.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub(super) async fn metrics(State(context): State<AdminContext>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        context.metrics.encode(),
    )
}

fn statuses(context: &AdminContext) -> Vec<BackendStatus> {
    context
        .backends()
        .iter()
        .map(|backend| backend.status())
        .collect()
}

pub(super) async fn list(State(context): State<AdminContext>) -> Json<Vec<BackendStatus>> {
    Json(statuses(&context))
}

pub(super) async fn status_page(State(context): State<AdminContext>) -> Html<String> {
    let vip = context.vip.as_ref().map(|monitor| monitor.snapshot());
    Html(render(&statuses(&context), vip.as_ref()))
}

pub(super) async fn vip(
    State(context): State<AdminContext>,
) -> Result<Json<VipStatus>, AdminError> {
    let monitor = context.vip.as_ref().ok_or(AdminError::NoVip)?;
    Ok(Json(monitor.snapshot()))
}

pub(super) async fn act(
    State(context): State<AdminContext>,
    Path((frontend, backend, action)): Path<(String, String, String)>,
) -> Result<Json<BackendStatus>, AdminError> {
    let state = match action.as_str() {
        "drain" => AdminState::Draining,
        "disable" => AdminState::Disabled,
        "enable" => AdminState::Enabled,
        _ => return Err(AdminError::UnknownAction(action)),
    };
    let backend = context.find(&frontend, &backend)?;
    backend.set_admin_state(state);
    Ok(Json(backend.status()))
}

/// Body of the weight request.
#[derive(serde::Deserialize)]
pub(super) struct WeightBody {
    weight: u32,
}

pub(super) async fn set_weight(
    State(context): State<AdminContext>,
    Path((frontend, backend)): Path<(String, String)>,
    Json(body): Json<WeightBody>,
) -> Result<Json<BackendStatus>, AdminError> {
    if body.weight > MAX_WEIGHT {
        return Err(AdminError::WeightOutOfRange {
            weight: body.weight,
            max: MAX_WEIGHT,
        });
    }
    let backend = context.find(&frontend, &backend)?;
    backend.set_weight(body.weight);
    Ok(Json(backend.status()))
}
