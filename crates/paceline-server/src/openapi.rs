//! The service's OpenAPI 3.1 document, derived from the handlers and the types they read
//! and answer: `GET /openapi.json`, checked in as `docs/openapi.json`.
//!
//! Each route module describes its own operations (`#[utoipa::path]` on its handlers,
//! `ToSchema` on its bodies); this is the one place that lists them all, as the router is
//! for the routes. A handler or a body that changes changes the document: regenerate the
//! checked-in copy with
//! `PACELINE_WRITE_OPENAPI=1 cargo test -p paceline-server --test openapi`.

use std::sync::{Arc, OnceLock};

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::Required;
use utoipa::{Modify, OpenApi};

use crate::state::AppState;

/// The document's routes: `GET /openapi.json`, served to anyone (it holds no data).
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/openapi.json", get(document))
}

/// `GET /openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "service",
    operation_id = "openapi",
    security(()),
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json", body = Object))
)]
async fn document() -> impl IntoResponse {
    // Derived once: it is the same for the life of the process.
    static TEXT: OnceLock<String> = OnceLock::new();
    (
        [(header::CONTENT_TYPE, "application/json")],
        TEXT.get_or_init(openapi_json).as_str(),
    )
}

/// The document as JSON, pretty-printed with a final newline, as `docs/openapi.json`
/// holds it.
pub fn openapi_json() -> String {
    let mut text = whole()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"the document did not print: {e}\"}}"));
    text.push('\n');
    text
}

/// The whole API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "paceline",
        description = "Distributed rate limiting, pacing and a rate-limited job queue over HTTP: \
            the API of `paceline serve`. Every `/v1` endpoint asks for the service's token \
            (`Authorization: Bearer TOKEN`) when it has one. Every failure answers \
            `{\"error\": {\"code\", \"field\", \"message\"}}`; the codes and their statuses \
            are listed in the `ErrorCode` schema.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    paths(
        crate::decisions::decide,
        crate::decisions::batch,
        crate::leases::take,
        crate::leases::extend,
        crate::leases::give_back,
        crate::policies::policies,
        crate::policies::reset_key,
        crate::reload::reload,
        crate::dashboard::data,
        crate::dashboard_page::page,
        crate::health::healthz,
        crate::health::readyz,
        crate::health::metrics,
        document,
    ),
    components(schemas(crate::error::ErrorCode)),
    modifiers(&BearerToken),
    security((), ("bearer" = [])),
    tags(
        (name = "decisions", description = "May I act now, and if not, when?"),
        (name = "leases", description = "Concurrency leases: requests in flight"),
        (name = "policies", description = "The configured policies and their keys"),
        (name = "queues", description = "Rate-limited job queues: producers and workers"),
        (name = "service", description = "Health, readiness, metrics, the dashboard, reloads"),
    )
)]
struct ApiDoc;

/// The operations whose body may be left out (`POST .../pause` with none pauses until
/// resumed); the derive marks every body it is given as required.
const OPTIONAL_BODIES: &[&str] = &[
    "/v1/queues/{queue}/pause",
    "/v1/queues/{queue}/groups/{group}/pause",
];

/// The whole document: [`ApiDoc`] and the queues' operations.
fn whole() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.merge(crate::queues::QueuesDoc::openapi());
    for path in OPTIONAL_BODIES {
        let body = doc
            .paths
            .paths
            .get_mut(*path)
            .and_then(|item| item.post.as_mut())
            .and_then(|operation| operation.request_body.as_mut());
        if let Some(body) = body {
            body.required = Some(Required::False);
        }
    }
    doc
}

/// The service's token as a security scheme: `Authorization: Bearer TOKEN`, needed only
/// when the service is started with one.
struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}
