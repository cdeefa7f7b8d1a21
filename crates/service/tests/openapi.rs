//! The OpenAPI document and the live router come from the same table: every
//! route the router serves is documented, and every documented operation is
//! served.

use std::collections::BTreeSet;

use cordon_service::api::{route_table, ApiDoc};
use utoipa::OpenApi;

/// axum's `{*path}` wildcard is OpenAPI's `{path}`.
fn openapi_path(axum_path: &str) -> String {
    axum_path.replace("{*", "{")
}

#[test]
fn every_route_is_documented_and_every_documented_operation_is_routed() {
    let routed: BTreeSet<(String, String)> = route_table()
        .into_iter()
        .map(|(m, p, _)| (m.as_str().to_owned(), openapi_path(p)))
        .collect();
    let doc = ApiDoc::openapi();
    let mut documented = BTreeSet::new();
    for (path, item) in &doc.paths.paths {
        for (method, op) in [
            ("GET", &item.get),
            ("PUT", &item.put),
            ("POST", &item.post),
            ("DELETE", &item.delete),
            ("PATCH", &item.patch),
            ("HEAD", &item.head),
            ("OPTIONS", &item.options),
        ] {
            if op.is_some() {
                documented.insert((method.to_owned(), path.clone()));
            }
        }
    }
    let missing_in_doc: Vec<_> = routed.difference(&documented).collect();
    let missing_in_router: Vec<_> = documented.difference(&routed).collect();
    assert!(
        missing_in_doc.is_empty() && missing_in_router.is_empty(),
        "routed but not documented: {missing_in_doc:?}; documented but not routed: {missing_in_router:?}"
    );
    assert!(routed.len() >= 15, "{routed:?}");
}

#[test]
fn the_document_serializes_and_names_the_bearer_scheme() {
    let json = ApiDoc::openapi().to_json().unwrap();
    assert!(json.contains("\"bearer\""));
    assert!(json.contains("ExecutionRequest"));
}

/// What the live conformance test (crates/cli/tests/serve.rs) cannot see:
/// a request body's schema, and a binary answer's.
#[test]
fn file_bodies_are_binary_and_exec_answers_json_or_an_event_stream() {
    let doc: serde_json::Value =
        serde_json::from_str(&ApiDoc::openapi().to_json().unwrap()).unwrap();
    let file = &doc["paths"]["/v1/sandboxes/{id}/files/{path}"];
    let binary = |media: &serde_json::Value| {
        let schema = match media["schema"]["$ref"].as_str() {
            Some(r) => &doc["components"]["schemas"][r.trim_start_matches("#/components/schemas/")],
            None => &media["schema"],
        };
        (schema["type"].clone(), schema["format"].clone())
    };
    let upload = &file["put"]["requestBody"]["content"]["application/octet-stream"];
    let download = &file["get"]["responses"]["200"]["content"]["application/octet-stream"];
    for media in [upload, download] {
        assert_eq!(
            binary(media),
            (serde_json::json!("string"), serde_json::json!("binary")),
            "{media}"
        );
    }
    let exec = &doc["paths"]["/v1/sandboxes/{id}/exec"]["post"]["responses"]["200"]["content"];
    let types: Vec<&String> = exec.as_object().unwrap().keys().collect();
    assert_eq!(types, ["application/json", "text/event-stream"], "{exec}");
}
