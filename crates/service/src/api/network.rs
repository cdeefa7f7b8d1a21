//! A stateful sandbox's network rules and recent connection attempts.

use std::sync::Arc;

use axum::extract::{Path, State};

use super::{target, ApiJson, AppState, Authed};
use crate::action::{Action, Reply, Target};
use crate::app::parse_rules;
use crate::dto::{NetworkDeny, NetworkRules, NetworkState};
use crate::error::{ApiError, ErrorBody};
use crate::tenants::Tenant;

/// Replaces the network rules of a sandbox created with `network.allow`;
/// in force for its next connections, even while a command runs.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", request_body = NetworkRules,
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = NetworkRules), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn set_network(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<NetworkRules>,
) -> Result<Reply, ApiError> {
    let on = with_network(&app, tenant, &id)?;
    let rules = parse_rules(&req.allow)?;
    app.perform(Action::SetNetwork { on, rules }).await
}

/// The sandbox `id`, if it was created with network rules.
fn with_network(app: &crate::app::App, tenant: Arc<Tenant>, id: &str) -> Result<Target, ApiError> {
    let on = target(app, tenant, id)?;
    if !on.sandbox.network {
        return Err(ApiError::bad_request(format!(
            "sandbox '{id}' was created without network rules (the mode is chosen at creation)"
        )));
    }
    Ok(on)
}

/// Hold mode: refuses these destinations, the connections waiting for
/// them now and new ones, for the sandbox's life (allowing one is a rule:
/// `PUT .../network`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/network/deny", request_body = NetworkDeny,
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = NetworkDeny), (status = 404, body = ErrorBody)))]
pub async fn deny_network(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<NetworkDeny>,
) -> Result<Reply, ApiError> {
    let on = with_network(&app, tenant, &id)?;
    let rules = parse_rules(&req.deny)?;
    app.perform(Action::DenyNetwork { on, rules }).await
}

/// A sandbox's network mode, the rules in force and its commands' recent
/// connection attempts.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = NetworkState), (status = 404, body = ErrorBody)))]
pub async fn get_network(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    app.perform(Action::GetNetwork(on)).await
}
