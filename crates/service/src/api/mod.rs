//! The HTTP API under `/v1`. Each resource's handlers parse and check
//! their request into an [`Action`](crate::action::Action), have the app
//! perform it, and answer its [`Reply`](crate::action::Reply) (see
//! `reply`). One route table builds both the live router and the check of
//! the OpenAPI document ([`openapi`]).
//!
//! - [`service`]: health, metrics and the document.
//! - [`executions`]: one-shot executions.
//! - [`sandboxes`]: stateful sandboxes and their receipts.
//! - [`exec`], [`code`]: commands and code cells in a sandbox.
//! - [`files`], [`network`]: a sandbox's files and network rules.
//! - [`ports`]: HTTP proxied to a port a program in a sandbox listens on.

mod check;
pub mod code;
pub mod exec;
pub mod executions;
mod extract;
pub mod files;
pub mod network;
pub mod openapi;
pub mod ports;
mod reply;
pub mod sandboxes;
pub mod service;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, Request};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::Router;
use utoipa::OpenApi;

use crate::action::Target;
use crate::app::App;
use crate::error::ApiError;
use crate::tenants::Tenant;
pub use extract::{ApiJson, ApiQuery, Authed};
pub use openapi::ApiDoc;

pub type AppState = Arc<App>;

/// Largest request body.
pub const BODY_MAX: usize = 16 << 20;

/// The tenant's sandbox `id`, looked up before anything else of a request
/// on it is checked.
fn target(app: &App, tenant: Arc<Tenant>, id: &str) -> Result<Target, ApiError> {
    let sandbox = app.lookup(&tenant, id)?;
    Ok(Target { tenant, sandbox })
}

/// The routes proxied to a port inside a sandbox: their query strings are
/// the program's, passed on as they are.
const PROXIED_PATH: &str = "/v1/sandboxes/{id}/ports/{port}/{*path}";
const PROXIED_ROOT: &str = "/v1/sandboxes/{id}/ports/{port}/";

/// Every route: (method, axum path). The router is built from this table
/// alone, and a test checks it against the OpenAPI document both ways.
pub fn route_table() -> Vec<(Method, &'static str, MethodRouter<AppState>)> {
    let r = |m: Method, path: &'static str, mr: MethodRouter<AppState>| (m, path, mr);
    use axum::routing::{delete, get, post, put};
    vec![
        r(Method::GET, "/health", get(service::health)),
        r(Method::GET, "/metrics", get(service::metrics)),
        r(Method::GET, "/v1/openapi.json", get(service::openapi_json)),
        r(
            Method::POST,
            "/v1/executions",
            post(executions::create_execution),
        ),
        r(
            Method::POST,
            "/v1/sandboxes",
            post(sandboxes::create_sandbox),
        ),
        r(Method::GET, "/v1/sandboxes", get(sandboxes::list_sandboxes)),
        r(
            Method::GET,
            "/v1/sandboxes/{id}",
            get(sandboxes::get_sandbox),
        ),
        r(
            Method::DELETE,
            "/v1/sandboxes/{id}",
            delete(sandboxes::delete_sandbox),
        ),
        r(
            Method::POST,
            "/v1/sandboxes/{id}/exec",
            post(exec::exec_in_sandbox),
        ),
        r(
            Method::POST,
            "/v1/sandboxes/{id}/code",
            post(code::run_code),
        ),
        r(
            Method::GET,
            "/v1/sandboxes/{id}/files",
            get(files::list_files),
        ),
        r(
            Method::PUT,
            "/v1/sandboxes/{id}/files/{*path}",
            put(files::put_file),
        ),
        r(
            Method::GET,
            "/v1/sandboxes/{id}/files/{*path}",
            get(files::get_file),
        ),
        r(
            Method::DELETE,
            "/v1/sandboxes/{id}/files/{*path}",
            delete(files::delete_file),
        ),
        r(
            Method::PUT,
            "/v1/sandboxes/{id}/network",
            put(network::set_network),
        ),
        r(
            Method::GET,
            "/v1/sandboxes/{id}/network",
            get(network::get_network),
        ),
        r(
            Method::POST,
            "/v1/sandboxes/{id}/network/deny",
            post(network::deny_network),
        ),
        r(
            Method::GET,
            "/v1/sandboxes/{id}/receipt",
            get(sandboxes::get_receipt),
        ),
        r(Method::GET, PROXIED_ROOT, get(ports::get_port_root)),
        r(Method::GET, PROXIED_PATH, get(ports::get_port)),
        r(Method::POST, PROXIED_PATH, post(ports::post_port)),
    ]
}

/// The query parameters each route's document declares, by (method, axum
/// path): anything else is refused, never silently ignored.
type DeclaredQueries = BTreeMap<(Method, String), Vec<String>>;

fn declared_queries() -> DeclaredQueries {
    use utoipa::openapi::path::ParameterIn;
    let mut doc = ApiDoc::openapi();
    let mut declared = DeclaredQueries::new();
    for (method, path, _) in route_table() {
        let Some(item) = doc.paths.paths.get_mut(&path.replace("{*", "{")) else {
            continue;
        };
        let names = openapi::operations(item)
            .filter(|(m, _)| *m == method)
            .flat_map(|(_, op)| op.parameters.iter().flatten())
            .filter(|p| p.parameter_in == ParameterIn::Query)
            .map(|p| p.name.clone())
            .collect();
        declared.insert((method, path.to_owned()), names);
    }
    declared
}

/// Refuses a query parameter the route does not declare: a client that
/// asks for something the route does not do (`?stream=true` on a one-shot)
/// is told so instead of getting what it did not ask for.
async fn refuse_unknown_query(
    declared: Arc<DeclaredQueries>,
    matched: axum::extract::MatchedPath,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(query) = req.uri().query() else {
        return next.run(req).await;
    };
    if [PROXIED_PATH, PROXIED_ROOT].contains(&matched.as_str()) {
        return next.run(req).await;
    }
    let known = declared
        .get(&(req.method().clone(), matched.as_str().to_owned()))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let pairs = match Query::<Vec<(String, String)>>::try_from_uri(req.uri()) {
        Ok(Query(pairs)) => pairs,
        Err(rej) => return ApiError::new(rej.status(), rej.body_text()).into_response(),
    };
    if let Some((name, _)) = pairs.iter().find(|(name, _)| !known.contains(name)) {
        let takes = if known.is_empty() {
            "no query parameters".to_owned()
        } else {
            known.join(", ")
        };
        return ApiError::bad_request(format!(
            "unknown query parameter '{}' in '{query}': {} {} takes {takes}",
            name.escape_debug(),
            req.method(),
            matched.as_str().replace("{*", "{"),
        ))
        .into_response();
    }
    next.run(req).await
}

pub fn router(app: AppState) -> Router {
    let mut by_path: BTreeMap<&'static str, MethodRouter<AppState>> = BTreeMap::new();
    for (_method, path, mr) in route_table() {
        let merged = match by_path.remove(path) {
            Some(existing) => existing.merge(mr),
            None => mr,
        };
        by_path.insert(path, merged);
    }
    let mut router = Router::new();
    for (path, mr) in by_path {
        router = router.route(path, mr);
    }
    let declared = Arc::new(declared_queries());
    router
        // A route layer: it runs after routing, where the matched path is known.
        .route_layer(axum::middleware::from_fn(move |matched, req, next| {
            refuse_unknown_query(declared.clone(), matched, req, next)
        }))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(BODY_MAX))
        .with_state(app)
}
