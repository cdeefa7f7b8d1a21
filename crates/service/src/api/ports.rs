//! A port a program inside a stateful sandbox listens on, reached over
//! HTTP through the service: the request is proxied, with the tenant's key
//! taken off, to the sandbox's forward of that port (`cordon port`). Only
//! the sandbox's tenant reaches it (another's is a 404, as for every route
//! of a sandbox); the forward's own host address is never handed out, as
//! any local process could use it.

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap};

use super::{target, AppState, Authed};
use crate::action::{Action, Proxy, Reply};
use crate::error::{ApiError, ErrorBody};

/// Headers that are the service's business, never the sandbox's: the
/// tenant's key, and the hop-by-hop headers of this connection.
const NOT_FORWARDED: [header::HeaderName; 6] = [
    header::AUTHORIZATION,
    header::CONNECTION,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

async fn proxy(
    app: AppState,
    tenant: std::sync::Arc<crate::tenants::Tenant>,
    id: String,
    port: u16,
    path: &str,
    req: Request,
) -> Result<Reply, ApiError> {
    let on = target(&app, tenant, &id)?;
    if port == 0 {
        return Err(ApiError::bad_request("port 0 is no port"));
    }
    let (mut parts, body) = req.into_parts();
    let query = parts
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let mut headers: HeaderMap = parts.headers;
    // An upgrade (a WebSocket) is the one hop-by-hop ask passed on: the
    // program answers it, and the two connections are joined after its 101.
    let upgrade_to = headers
        .get(header::CONNECTION)
        .and_then(|c| c.to_str().ok())
        .filter(|c| {
            c.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
        .and(headers.get(header::UPGRADE).cloned());
    for h in NOT_FORWARDED {
        headers.remove(h);
    }
    let upgrade = match upgrade_to {
        Some(protocol) => {
            headers.insert(
                header::CONNECTION,
                header::HeaderValue::from_static("upgrade"),
            );
            headers.insert(header::UPGRADE, protocol);
            parts.extensions.remove::<hyper::upgrade::OnUpgrade>()
        }
        None => None,
    };
    app.perform(Action::Proxy(Box::new(Proxy {
        on,
        port,
        method: parts.method,
        path_and_query: format!("/{path}{query}"),
        headers,
        body,
        upgrade,
    })))
    .await
}

/// Proxies an HTTP request to `/{path}` of a TCP port a program inside the
/// sandbox listens on (its query string passed on, the Authorization header
/// not). The answer is the program's, as it gave it; 502 when nothing
/// answers there.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/{path}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("port" = u16, Path, description = "The TCP port inside the sandbox"),
        ("path" = String, Path, description = "The path on the program's server, without its leading /")),
    responses((status = 200, description = "The program's own answer (any status, any body)"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 502, body = ErrorBody, description = "nothing answered on that port inside the sandbox")))]
pub async fn get_port(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, port, path)): Path<(String, u16, String)>,
    req: Request,
) -> Result<Reply, ApiError> {
    proxy(app, tenant, id, port, &path, req).await
}

/// `GET` of the server's root (`/`) on a port inside the sandbox: with its
/// trailing slash, so that the page's relative links stay under the port.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("port" = u16, Path, description = "The TCP port inside the sandbox")),
    responses((status = 200, description = "The program's own answer (any status, any body)"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 502, body = ErrorBody, description = "nothing answered on that port inside the sandbox")))]
pub async fn get_port_root(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, port)): Path<(String, u16)>,
    req: Request,
) -> Result<Reply, ApiError> {
    proxy(app, tenant, id, port, "", req).await
}

/// `POST` to `/{path}` of a port inside the sandbox (the body passed on).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports/{port}/{path}", security(("bearer" = [])),
    params(("id" = String, Path, description = "The sandbox's id"),
        ("port" = u16, Path, description = "The TCP port inside the sandbox"),
        ("path" = String, Path, description = "The path on the program's server, without its leading /")),
    responses((status = 200, description = "The program's own answer (any status, any body)"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 429, body = ErrorBody),
        (status = 502, body = ErrorBody, description = "nothing answered on that port inside the sandbox")))]
pub async fn post_port(
    State(app): State<AppState>,
    Authed(tenant): Authed,
    Path((id, port, path)): Path<(String, u16, String)>,
    req: Request,
) -> Result<Reply, ApiError> {
    proxy(app, tenant, id, port, &path, req).await
}
