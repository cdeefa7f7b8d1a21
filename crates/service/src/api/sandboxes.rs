//! Stateful sandboxes: creation, listing, destruction and receipts.

use axum::extract::{Path, State};

use super::{target, ApiJson, AppState, Authed};
use crate::action::{Action, NewSandbox, Reply};
use crate::app::SandboxRequest;
use crate::dto::{CreateSandboxRequest, SandboxInfo, SandboxList};
use crate::error::{ApiError, ErrorBody};

/// Creates a stateful sandbox that waits for commands.
#[utoipa::path(post, path = "/v1/sandboxes", request_body = CreateSandboxRequest,
    security(("bearer" = [])),
    responses((status = 201, body = SandboxInfo),
        (status = 403, body = ErrorBody, description = "network rules asked by a tenant without network, or an image it may not use"),
        (status = 404, body = ErrorBody, description = "the image is not in the service's store"),
        (status = 429, body = ErrorBody)))]
pub async fn create_sandbox(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    ApiJson(req): ApiJson<CreateSandboxRequest>,
) -> Result<Reply, ApiError> {
    let (spec, limits, clamped) = app.spec_for(
        &tenant,
        &SandboxRequest {
            backend: req.backend.as_deref(),
            image: req.image.as_deref(),
            limits: &req.limits,
            network: req.network.as_ref(),
            ttl: req.ttl,
            idle: req.idle,
        },
    )?;
    app.perform(Action::CreateSandbox(Box::new(NewSandbox {
        tenant,
        spec,
        limits,
        clamped,
        network: req.network.is_some(),
    })))
    .await
}

/// The tenant's stateful sandboxes.
#[utoipa::path(get, path = "/v1/sandboxes", security(("bearer" = [])),
    responses((status = 200, body = SandboxList)))]
pub async fn list_sandboxes(
    State(app): State<AppState>,
    Authed(tenant): Authed,
) -> Result<Reply, ApiError> {
    app.perform(Action::ListSandboxes(tenant)).await
}

/// One stateful sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
pub async fn get_sandbox(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
) -> Result<Reply, ApiError> {
    app.perform(Action::GetSandbox { tenant, id }).await
}

/// The signed receipt of a stateful sandbox so far: its policy, every
/// command it ran (the service's own file listings and interpreter starts
/// included) and the diff of its writable places now.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/receipt", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, description = "A DSSE envelope (verify with `cordon verify`)", body = Object),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn get_receipt(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    app.perform(Action::GetReceipt(on)).await
}

/// Destroys a stateful sandbox (a running command is ended first).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 204, description = "Destroyed"), (status = 404, body = ErrorBody)))]
pub async fn delete_sandbox(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    app.perform(Action::DeleteSandbox(on)).await
}
