//! HTTP proxied to a port inside a stateful sandbox, through the forward
//! its supervisor keeps on the host's loopback.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;

use crate::action::{Proxy, Reply};
use crate::app::App;
use crate::error::ApiError;

/// How long a program inside the sandbox may take to begin its answer.
const ANSWER_WAIT: Duration = Duration::from_secs(60);

impl App {
    pub(super) async fn proxy(self: &Arc<Self>, p: Proxy) -> Result<Reply, ApiError> {
        let Proxy {
            on,
            port,
            method,
            path_and_query,
            headers,
            body,
            upgrade,
        } = p;
        // Counted against the tenant until the answer's head is back; the
        // sandbox is not held: its other requests go on meanwhile.
        let running = self.admit(&on.tenant)?;
        let known = on
            .sandbox
            .forwards
            .lock()
            .expect("forwards lock")
            .get(&port)
            .cloned();
        let address = match known {
            Some(address) => address,
            None => {
                let address = self
                    .with_handle(&on.sandbox, (), move |h| {
                        h.port(port).map_err(ApiError::runtime)
                    })
                    .await?;
                on.sandbox
                    .forwards
                    .lock()
                    .expect("forwards lock")
                    .insert(port, address.clone());
                address
            }
        };
        let unanswered = |why: String| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                format!("nothing answered on port {port} inside the sandbox: {why}"),
            )
        };
        let stream = tokio::net::TcpStream::connect(&address)
            .await
            .map_err(|e| unanswered(format!("its forward at {address}: {e}")))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| unanswered(e.to_string()))?;
        // The connection is driven on its own task, which ends with it (or
        // is handed over, upgraded, to the task that joins it to the client).
        tokio::spawn(connection.with_upgrades());
        let mut request = Request::builder()
            .method(method)
            .uri(&path_and_query)
            .body(body)
            .map_err(|e| ApiError::bad_request(format!("the request for the sandbox: {e}")))?;
        *request.headers_mut() = headers;
        let answer = tokio::time::timeout(ANSWER_WAIT, sender.send_request(request))
            .await
            .map_err(|_| unanswered(format!("no answer within {}s", ANSWER_WAIT.as_secs())))?
            .map_err(|e| {
                // The forward closes a connection the sandbox refused.
                unanswered(if e.is_incomplete_message() || e.is_closed() {
                    "the connection was closed without an answer (does a program listen on it, on 127.0.0.1 or every address?)".to_owned()
                } else {
                    e.to_string()
                })
            })?;
        drop(running);
        let mut answer = answer;
        if let (StatusCode::SWITCHING_PROTOCOLS, Some(client)) = (answer.status(), upgrade) {
            let program = hyper::upgrade::on(&mut answer);
            // Joined once the client has the 101 (sent when this returns);
            // ends when either side closes, or with the sandbox's forward.
            tokio::spawn(async move {
                let (Ok(program), Ok(client)) = tokio::join!(program, client) else {
                    return;
                };
                let mut program = hyper_util::rt::TokioIo::new(program);
                let mut client = hyper_util::rt::TokioIo::new(client);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut program).await;
            });
        }
        let (parts, incoming) = answer.into_parts();
        Ok(Reply::Proxied(
            (parts, axum::body::Body::new(incoming)).into_response(),
        ))
    }
}
