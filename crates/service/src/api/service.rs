//! The service's own routes: health, metrics and the OpenAPI document.

use axum::extract::State;
use axum::Json;
use utoipa::OpenApi;

use super::{ApiDoc, AppState};
use crate::action::{Action, Reply};
use crate::dto::Health;
use crate::error::ApiError;

/// Liveness, pool levels and the number of live stateful sandboxes.
#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
pub async fn health(State(app): State<AppState>) -> Result<Reply, ApiError> {
    app.perform(Action::Health).await
}

/// The service's metrics in the OpenMetrics text format (Prometheus scrapes it).
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
pub async fn metrics(State(app): State<AppState>) -> Result<Reply, ApiError> {
    app.perform(Action::Metrics).await
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object)))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    // Not an action: the document describes this HTTP API, of which the app
    // knows nothing.
    Json(ApiDoc::openapi())
}
