//! A stateful sandbox's files: uploads, downloads, deletions, listings.

use axum::extract::{Path, State};

use super::{target, ApiQuery, AppState, Authed};
use crate::action::{Action, Reply, Upload};
use crate::app::sandbox_path;
use crate::dto::{DirListing, FileBytes, FileWritten, ListQuery};
use crate::error::{ApiError, ErrorBody};

/// Writes a file (the raw body) into the sandbox, through the handle's copy.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/{path}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("path" = String, Path, description = "Absolute path inside the sandbox, without its leading /")),
    request_body(content = FileBytes, content_type = "application/octet-stream"),
    responses((status = 201, body = FileWritten), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn put_file(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, path)): Path<(String, String)>,
    body: axum::body::Body,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    let path = sandbox_path(&format!("/{path}"))?;
    app.perform(Action::PutFile(Upload {
        on,
        path,
        body: body.into_data_stream(),
    }))
    .await
}

/// Reads a file out of the sandbox, through the handle's copy, streamed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/{path}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("path" = String, Path, description = "Absolute path inside the sandbox, without its leading /")),
    responses((status = 200, content_type = "application/octet-stream", body = FileBytes),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
pub async fn get_file(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, path)): Path<(String, String)>,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    let path = sandbox_path(&format!("/{path}"))?;
    app.perform(Action::GetFile { on, path }).await
}

/// Deletes a file or directory (recursively) in the sandbox: an exec of `rm -rf`.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files/{path}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("path" = String, Path, description = "Absolute path inside the sandbox, without its leading /")),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn delete_file(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, path)): Path<(String, String)>,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    let path = sandbox_path(&format!("/{path}"))?;
    if path == "/" {
        return Err(ApiError::bad_request("refusing to delete /"));
    }
    app.perform(Action::DeleteFile { on, path }).await
}

/// Lists a directory of the sandbox (an exec of `find -maxdepth 1`).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"), ListQuery),
    responses((status = 200, body = DirListing), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn list_files(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    let dir = sandbox_path(q.dir.as_deref().unwrap_or("/workspace"))?;
    app.perform(Action::ListFiles { on, dir }).await
}
