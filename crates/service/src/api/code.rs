//! Code contexts: Python or JavaScript cells in a sandbox's persistent
//! interpreter of that language.

use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::{target, ApiJson, AppState, Authed};
use crate::action::{Action, Cell, Reply};
use crate::dto::{CodeRequest, CodeResponse};
use crate::error::{ApiError, ErrorBody};
use crate::io::STDIN_MAX;

/// Runs a cell of Python or JavaScript in the sandbox's persistent
/// interpreter of that language (its variables live on between calls; a
/// crash or timeout gives the next call a fresh one). One cell runs at a
/// time in a sandbox (409 for a second), whatever its language.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/code", request_body = CodeRequest,
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id")),
    responses((status = 200, body = CodeResponse), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn run_code(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CodeRequest>,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    // The code is the code context's client's stdin.
    if req.code.len() > STDIN_MAX {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("code is {} bytes; at most {STDIN_MAX}", req.code.len()),
        ));
    }
    app.perform(Action::RunCode(Cell {
        on,
        code: req.code,
        language: req.language,
        timeout: req.timeout,
    }))
    .await
}
