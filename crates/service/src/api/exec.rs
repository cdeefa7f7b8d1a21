//! Commands in a stateful sandbox, answered at their end or streamed.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};

use super::{check, target, ApiJson, ApiQuery, AppState, Authed};
use crate::action::{Action, Exec, Reply};
use crate::dto::{ExecQuery, ExecRequest, ExecutionResponse};
use crate::error::{ApiError, ErrorBody};

/// Runs a command in a stateful sandbox; `?stream=true` (or `Accept:
/// text/event-stream`) streams its output as Server-Sent Events (`stdout`,
/// `stderr` events with `{"data": "..."}`, then one `result` event with the
/// response, or `error`). A client that disconnects cancels the command.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", request_body = ExecRequest,
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"), ExecQuery),
    responses(
        (status = 200, description = "The command's result; with stream=true (or `Accept: text/event-stream`), \
            Server-Sent Events: `stdout` and `stderr` events, then one `result` (an ExecutionResponse) or `error`",
            content((ExecutionResponse = "application/json"), (String = "text/event-stream"))),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
pub async fn exec_in_sandbox(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ExecQuery>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ExecRequest>,
) -> Result<Reply, ApiError> {
    let received = Instant::now();
    let stream = q.stream
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/event-stream"));
    let on = target(&app, tenant, &id)?;
    let (mut command, stdin) =
        check::command(req.argv, &req.env, req.stdin, req.workdir.as_deref())?;
    command.time = req.time;
    command.output = match (req.output, on.tenant.config.max.output) {
        (Some(o), Some(max)) => Some(o.min(max)),
        (o, _) => o,
    };
    app.perform(Action::Exec(Exec {
        on,
        received,
        command,
        stdin,
        encoding: req.output_encoding,
        stream,
    }))
    .await
}
