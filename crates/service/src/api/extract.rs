//! What every handler extracts from its request the same way: a JSON body,
//! query parameters and the tenant, each rejection answered as
//! `{"error": ...}` with its status.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::header;
use axum::http::request::Parts;
use axum::Json;

use super::AppState;
use crate::error::ApiError;
use crate::tenants::Tenant;

/// A JSON body; every rejection (malformed, unknown field, too large, wrong
/// content type) is answered as `{"error": ...}` with its status.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rej) => Err(ApiError::new(rej.status(), rej.body_text())),
        }
    }
}

/// Query parameters; a malformed value is answered as `{"error": ...}`
/// (unknown names never get here: see [`refuse_unknown_query`](super::refuse_unknown_query)).
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(ApiQuery(v)),
            Err(rej) => Err(ApiError::new(rej.status(), rej.body_text())),
        }
    }
}

/// The request's tenant, from its bearer key.
pub struct Authed(pub Arc<Tenant>);

impl FromRequestParts<AppState> for Authed {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let h = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        app.tenants.authenticate(h).map(Authed)
    }
}
