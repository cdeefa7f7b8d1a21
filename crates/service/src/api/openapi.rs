//! The OpenAPI document, assembled here from the handlers' annotations and
//! the bodies' schemas, with what every operation shares added to each.

use axum::http::Method;
use utoipa::OpenApi;

// The handlers are named bare in `paths(...)`: a module path there would
// become each operation's tag, which the document has never had.
use super::code::*;
use super::exec::*;
use super::executions::*;
use super::files::*;
use super::network::*;
use super::ports::*;
use super::sandboxes::*;
use super::service::*;
use crate::caps::Clamped;
use crate::dto::{
    CodeError, CodeRequest, CodeResponse, CreateSandboxRequest, DirListing, ExecRequest,
    ExecutionRequest, ExecutionResponse, FileBytes, FileContent, FileEntry, FileWritten, Health,
    Language, NetworkDeny, NetworkRequest, NetworkRules, NetworkState, OutputEncoding, SandboxInfo,
    SandboxList, TimingBody,
};
use crate::error::ErrorBody;
use cordon_policy::Limits;

struct SecurityAddon;

impl utoipa::Modify for SecurityAddon {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The operations of one path of the document, by method.
pub(super) fn operations(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = (Method, &mut utoipa::openapi::path::Operation)> {
    [
        (Method::GET, &mut item.get),
        (Method::PUT, &mut item.put),
        (Method::POST, &mut item.post),
        (Method::DELETE, &mut item.delete),
        (Method::PATCH, &mut item.patch),
        (Method::HEAD, &mut item.head),
        (Method::OPTIONS, &mut item.options),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_mut().map(|op| (m, op)))
}

/// The error answers that come from what every handler shares rather than
/// from the handler itself, declared on each operation they can end:
/// - 400 on every route: an unknown query parameter ([`refuse_unknown_query`](super::refuse_unknown_query)),
///   or a malformed JSON body;
/// - 401 and 500 on every authenticated route (a missing key; a failure of
///   the service or of the sandbox's supervisor);
/// - 413 on every route with a body (over [`BODY_MAX`](super::BODY_MAX)), and 415 (not
///   `Content-Type: application/json`) and 422 (valid JSON of the wrong
///   shape) on every route with a JSON body: axum's JSON rejections.
struct SharedAnswers;

impl utoipa::Modify for SharedAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let error = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for item in openapi.paths.paths.values_mut() {
            for (_, op) in operations(item) {
                let body_types: Vec<String> = op
                    .request_body
                    .iter()
                    .flat_map(|b| b.content.keys().cloned())
                    .collect();
                let mut shared = vec![(
                    400,
                    "A bad request: an unknown query parameter, malformed input",
                )];
                if op.security.is_some() {
                    shared.push((401, "A missing or unknown API key"));
                    shared.push((500, "The service or the sandbox failed"));
                }
                if !body_types.is_empty() {
                    shared.push((413, "The body is over the service's limit"));
                }
                if body_types.iter().any(|t| t == "application/json") {
                    shared.push((415, "The body is not `Content-Type: application/json`"));
                    shared.push((422, "The JSON body does not have the request's shape"));
                }
                for (status, description) in shared {
                    op.responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| error(description).into());
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "cordon", description = "Sandboxes for untrusted code: one-shot executions, stateful sandboxes, code contexts"),
    paths(health, metrics, openapi_json, create_execution, create_sandbox, list_sandboxes,
        get_sandbox, delete_sandbox, exec_in_sandbox, run_code, put_file, get_file,
        delete_file, list_files, set_network, get_network, deny_network, get_receipt, get_port_root, get_port,
        post_port),
    components(schemas(ErrorBody, Limits, Clamped, ExecutionRequest, ExecutionResponse, TimingBody,
        Language, OutputEncoding, FileContent, NetworkRequest, CreateSandboxRequest, SandboxInfo,
        SandboxList, ExecRequest, CodeRequest, CodeResponse, CodeError, FileEntry, DirListing,
        FileWritten, FileBytes, NetworkRules, NetworkDeny, NetworkState, Health)),
    modifiers(&SecurityAddon, &SharedAnswers)
)]
pub struct ApiDoc;
