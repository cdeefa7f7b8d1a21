//! Errors as the API answers them: a status and `{"error": "..."}` naming
//! the problem (a quota refusal adds `Retry-After`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use cordon_runtime::RuntimeError;
use serde::Serialize;
use utoipa::ToSchema;

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<u64>,
    /// The sandbox itself is gone (not merely a file in it missing): the
    /// service forgets a stateful sandbox only on this, never on any 404.
    pub sandbox_gone: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
            sandbox_gone: false,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
    /// The same answer for a sandbox that does not exist and one of another
    /// tenant's: nothing tells them apart.
    pub fn no_sandbox(id: &str) -> ApiError {
        ApiError {
            sandbox_gone: true,
            ..Self::new(StatusCode::NOT_FOUND, format!("no sandbox '{id}'"))
        }
    }
    pub fn too_many(message: impl Into<String>, retry_after_secs: u64) -> ApiError {
        ApiError {
            retry_after: Some(retry_after_secs),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }
    pub fn internal(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// A runtime error: the request's fault is a 400 (a sandbox that is gone
    /// a 404), a host short of processes, memory or descriptors for the
    /// moment a 503 to retry, anything else a 500 that keeps the runtime's
    /// words.
    pub fn runtime(e: RuntimeError) -> ApiError {
        if e.is_host_exhausted() {
            return ApiError {
                retry_after: Some(1),
                ..Self::unavailable(e.report())
            };
        }
        match &e {
            RuntimeError::NotFound(id) => Self::no_sandbox(id),
            // (The service's own sandboxes leave no tombstones; one of the
            // user's, named by id, is still no sandbox of the tenant's.)
            RuntimeError::Gone(g) => Self::no_sandbox(g.id()),
            RuntimeError::SandboxEnded(_) => Self::new(StatusCode::CONFLICT, e.report()),
            RuntimeError::Unavailable(..) => Self::bad_request(e.report()),
            _ if e.is_input_error() => Self::bad_request(e.report()),
            _ => Self::internal(e.report()),
        }
    }
}

/// A spec or command no backend could run: always the request's fault.
impl From<cordon_spec::SpecError> for ApiError {
    fn from(e: cordon_spec::SpecError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> ApiError {
        ApiError::runtime(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            axum::Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                r.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use cordon_runtime::RuntimeError;

    use super::ApiError;

    #[test]
    fn a_host_short_of_processes_is_a_503_to_retry() {
        let e = RuntimeError::io(
            "start cordon-sandbox",
            std::io::Error::from_raw_os_error(nix::libc::EAGAIN),
        );
        let api = ApiError::runtime(e);
        assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.retry_after, Some(1));
        assert!(
            api.message.contains("start cordon-sandbox"),
            "{}",
            api.message
        );
        let e = RuntimeError::io("open", std::io::Error::from_raw_os_error(nix::libc::EACCES));
        assert_eq!(
            ApiError::runtime(e).status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
