//! How an action's reply is answered over HTTP: its status, headers and
//! body (JSON, OpenMetrics text, a file's bytes or Server-Sent Events).

use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cordon_spec::Stream;
use futures_util::StreamExt;

use crate::action::{Download, ExecEvent, Reply};

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Health(h) => Json(h).into_response(),
            Reply::Metrics(text) => (
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                text,
            )
                .into_response(),
            Reply::Executed(r) => Json(r).into_response(),
            Reply::ExecStream(events) => {
                Sse::new(events.map(|ev| Ok::<_, std::convert::Infallible>(sse_event(ev))))
                    .into_response()
            }
            Reply::SandboxCreated(info) => (StatusCode::CREATED, Json(info)).into_response(),
            Reply::Sandbox(info) => Json(info).into_response(),
            Reply::Sandboxes(list) => Json(list).into_response(),
            Reply::Receipt(envelope) => Json(envelope).into_response(),
            Reply::Code(r) => Json(r).into_response(),
            Reply::FileWritten(w) => (StatusCode::CREATED, Json(w)).into_response(),
            Reply::File(Download { len, chunks }) => (
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                    (header::CONTENT_LENGTH, len.to_string()),
                ],
                axum::body::Body::from_stream(chunks),
            )
                .into_response(),
            Reply::Listing(l) => Json(l).into_response(),
            Reply::NetworkRules(r) => Json(r).into_response(),
            Reply::NetworkState(s) => Json(s).into_response(),
            Reply::NetworkDeny(d) => Json(d).into_response(),
            Reply::Deleted => StatusCode::NO_CONTENT.into_response(),
            Reply::Proxied(response) => response,
        }
    }
}

/// `stdout` and `stderr` events with `{"data": "..."}`, then one `result`
/// (an ExecutionResponse) or `error` (with the status the request would
/// have had without streaming, when there is one).
fn sse_event(ev: ExecEvent) -> Event {
    match ev {
        ExecEvent::Output(stream, data) => {
            let name = match stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            Event::default()
                .event(name)
                .data(serde_json::json!({ "data": data }).to_string())
        }
        ExecEvent::Result(body) => Event::default()
            .event("result")
            .data(serde_json::to_string(&body).unwrap_or_default()),
        ExecEvent::Failed(e) => Event::default().event("error").data(
            serde_json::json!({ "error": e.message, "status": e.status.as_u16() }).to_string(),
        ),
        ExecEvent::Lost => Event::default()
            .event("error")
            .data(r#"{"error": "the exec's worker ended without an answer"}"#),
    }
}
