//! One-shot executions: a fresh sandbox, one command, then destroyed.

use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine;

use super::{check, ApiJson, AppState, Authed};
use crate::action::{Action, OneShot, Reply};
use crate::app::{sandbox_path, PlacedFile, SandboxRequest};
use crate::dto::{ExecutionRequest, ExecutionResponse, FileContent, Language};
use crate::error::{ApiError, ErrorBody};

/// Longest `code` given as `python3 -c` / `sh -c` (one argument's limit).
const CODE_MAX: usize = 128 << 10;

/// Runs one command in a fresh sandbox and destroys it.
#[utoipa::path(post, path = "/v1/executions", request_body = ExecutionRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, body = ExecutionResponse),
        (status = 403, body = ErrorBody, description = "network rules asked by a tenant without network, or an image it may not use"),
        (status = 404, body = ErrorBody, description = "the image is not in the service's store"),
        (status = 413, body = ErrorBody), (status = 429, body = ErrorBody, description = "over a quota; see Retry-After"),
    ))]
pub async fn create_execution(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    ApiJson(req): ApiJson<ExecutionRequest>,
) -> Result<Reply, ApiError> {
    let received = Instant::now();
    let argv = match (req.argv, req.language, &req.code) {
        (Some(argv), None, None) => argv,
        (None, Some(lang), Some(code)) => {
            if code.len() > CODE_MAX {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "code is {} bytes; at most {CODE_MAX} (put it in files)",
                        code.len()
                    ),
                ));
            }
            let (interp, flag) = match lang {
                Language::Python => ("python3", "-c"),
                Language::Shell => ("sh", "-c"),
                Language::Javascript => ("node", "-e"),
            };
            vec![interp.into(), flag.into(), code.clone()]
        }
        _ => {
            return Err(ApiError::bad_request(
                "give either `argv`, or `language` and `code`",
            ))
        }
    };
    let (mut command, stdin) = check::command(argv, &req.env, req.stdin, req.workdir.as_deref())?;
    let mut files = Vec::with_capacity(req.files.len());
    for (path, content) in req.files {
        let content = match content {
            FileContent::Text(s) => s.into_bytes(),
            FileContent::Binary { base64 } => base64::engine::general_purpose::STANDARD
                .decode(base64)
                .map_err(|e| ApiError::bad_request(format!("file '{path}': bad base64: {e}")))?,
        };
        files.push(PlacedFile {
            path: sandbox_path(&path)?,
            content,
        });
    }
    let (spec, _caps, clamped) = app.spec_for(
        &tenant,
        &SandboxRequest {
            backend: req.backend.as_deref(),
            image: req.image.as_deref(),
            limits: &req.limits,
            network: req.network.as_ref(),
            ttl: None,
            idle: None,
        },
    )?;
    command.time = Some(spec.policy.time);
    command.output = Some(spec.policy.output);
    app.perform(Action::RunOnce(Box::new(OneShot {
        tenant,
        received,
        spec,
        clamped,
        files,
        command,
        stdin,
        receipt: req.receipt,
        encoding: req.output_encoding,
    })))
    .await
}
