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
use serde_json::{json, Value};
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn, ParameterStyle};
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, SchemaType,
};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{RefOr, Required};
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
        crate::policies::runtime::read,
        crate::policies::runtime::put,
        crate::policies::runtime::delete,
        crate::policies::reset_key,
        crate::reload::reload,
        crate::dashboard::data,
        crate::dashboard_page::page,
        crate::health::healthz,
        crate::health::readyz,
        crate::health::metrics,
        crate::rls::json::json,
        document,
    ),
    components(schemas(crate::error::ErrorCode)),
    modifiers(&BearerToken),
    security((), ("bearer" = [])),
    tags(
        (name = "decisions", description = "May I act now, and if not, when?"),
        (name = "leases", description = "Concurrency leases: requests in flight"),
        (name = "policies", description = "The policies in force (the config file's, and those set at run time) and their keys"),
        (name = "queues", description = "Rate-limited job queues: producers and workers"),
        (name = "service", description = "Health, readiness, metrics, the dashboard, reloads"),
        (name = "rls", description = "Envoy's rate limit service over HTTP (`--rls-config`): the same decisions as its gRPC"),
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
    refine(&mut doc);
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

/// What the handlers refuse across fields, said in JSON Schema where the derive has no
/// attribute for it (`oneOf`, `if`/`then`, `not`), so that every request the document
/// calls valid is one the service takes, and every one it calls invalid one the service
/// refuses. Each rule names the check it mirrors.
fn refine(doc: &mut utoipa::openapi::OpenApi) {
    let nothing = || json!({"type": "null"});
    let num = || json!({"type": "number"});
    if let Some(components) = doc.components.as_mut() {
        let schemas = &mut components.schemas;
        // `decisions::decide` (`Ask::validate`, `SetAsk::validate`, `fields::op_field`):
        // one limit (`policy` and `key`, no `limits`; `op` `pace` by default) or a set
        // (`limits`, 1 to MAX_LIMITS of them, no `policy` nor `key`; `op` `limit` by
        // default; a limit named twice counts once, with both costs); `max_wait_ms` only
        // with `pace`.
        let with_wait = json!({"required": ["max_wait_ms"], "properties": {"max_wait_ms": num()}});
        keyword(
            schemas.get_mut("DecisionRequest"),
            "oneOf",
            json!([
                {
                    "title": "One limit",
                    "required": ["policy", "key"],
                    "properties": {
                        "policy": {"type": "string"},
                        "key": {"type": "string"},
                        "limits": nothing(),
                    },
                    "if": with_wait,
                    "then": {"properties": {"op": {"enum": ["pace", null]}}},
                },
                {
                    "title": "A set of limits decided as one",
                    "required": ["limits"],
                    "properties": {
                        "limits": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": paceline_store::MAX_LIMITS,
                        },
                        "policy": nothing(),
                        "key": nothing(),
                    },
                    "if": with_wait,
                    "then": {"required": ["op"], "properties": {"op": {"const": "pace"}}},
                },
            ]),
        );
        // `queues::requests::FailBody::check` and `Failure::from_parts`: a hand-back alone;
        // a fatal failure without a delay or a pause; a delay or a pause, not both.
        keyword(
            schemas.get_mut("FailRequest"),
            "allOf",
            json!([
                {
                    "if": {"required": ["release"], "properties": {"release": {"const": true}}},
                    "then": {"properties": {
                        "error": nothing(),
                        "retry_after_ms": nothing(),
                        "pause_group_ms": nothing(),
                        "fatal": nothing(),
                    }},
                },
                {
                    "if": {"required": ["fatal"], "properties": {"fatal": {"const": true}}},
                    "then": {"properties": {"retry_after_ms": nothing(), "pause_group_ms": nothing()}},
                },
                {
                    "not": {
                        "required": ["retry_after_ms", "pause_group_ms"],
                        "properties": {"retry_after_ms": num(), "pause_group_ms": num()},
                    },
                },
            ]),
        );
        // `queues::requests::ProgressBody::read`: a report is any JSON but `null`.
        keyword(
            property(schemas.get_mut("ProgressRequest"), "progress"),
            "not",
            nothing(),
        );
        // `Schedule::zone`: an IANA time zone's name, as the queue's build knows them.
        if let Some(RefOr::T(Schema::Object(zone))) =
            property(schemas.get_mut("ScheduleRequest"), "timezone")
        {
            let names = paceline_queue::schedule::time_zones().map(Value::from);
            zone.enum_values = Some(std::iter::once(Value::Null).chain(names).collect());
        }
    }
    for (path, item) in doc.paths.paths.iter_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
        ];
        for operation in operations.into_iter().flatten() {
            let parameters = operation.parameters.get_or_insert_with(Vec::new);
            for p in parameters.iter_mut() {
                refine_parameter(p);
            }
            if path == "/v1/queues/{queue}/jobs" && item_is_listing(parameters) {
                one_listing(parameters);
            }
            if parameters.is_empty() {
                operation.parameters = None;
            }
            // The batches (`decisions::BatchSchema`, `queues::requests::JobsArray`) take an
            // array of up to 1000 of anything: each item is read on its own, and one that
            // is wrong is its own entry's error (with its status) in the `200`'s array.
            let item = match path.as_str() {
                "/v1/decisions/batch" => "DecisionRequest",
                "/v1/queues/{queue}/jobs/batch" => "EnqueueRequest",
                _ => continue,
            };
            let content = operation
                .request_body
                .as_mut()
                .and_then(|b| b.content.get_mut("application/json"));
            if let Some(content) = content {
                let each = ObjectBuilder::new()
                    .schema_type(SchemaType::AnyValue)
                    .description(Some(format!(
                        "Read on its own as a `{item}`: one that is not answers its own \
                         error entry"
                    )));
                let array = ArrayBuilder::new()
                    .items(each)
                    .max_items(Some(crate::decisions::MAX_BATCH));
                content.schema = Some(RefOr::T(Schema::Array(array.build())));
            }
        }
    }
}

/// A path's parameters: a job's `id` is looked up as sent (one that names no job of the
/// queue, of any shape, is a `404 unknown_job`, never a `400`), so it has no pattern; an
/// `offset` reads any number of digits (`queues::requests::saturating`: past the last
/// job it lists none), so it is no 64-bit integer.
fn refine_parameter(p: &mut Parameter) {
    let Some(RefOr::T(Schema::Object(schema))) = p.schema.as_mut() else {
        return;
    };
    match (p.name.as_str(), &p.parameter_in) {
        ("id", ParameterIn::Path) => schema.pattern = None,
        ("offset", ParameterIn::Query) => schema.format = None,
        _ => {}
    }
}

/// Whether these are the jobs listing's parameters (its query's fields one by one).
fn item_is_listing(parameters: &[Parameter]) -> bool {
    parameters
        .iter()
        .any(|p| p.name == "state" && matches!(p.parameter_in, ParameterIn::Query))
}

/// `GET .../jobs` (`job::check_listing`): `group` filters the waiting jobs only. The
/// query's fields go together, so they become one object (`style: form`, `explode`: the
/// same `?state=waiting&group=G&offset=0&limit=100`), which can say so.
fn one_listing(parameters: &mut Vec<Parameter>) {
    let mut listing =
        ObjectBuilder::new().additional_properties(Some(AdditionalProperties::FreeForm(false)));
    let mut kept = Vec::new();
    for p in parameters.drain(..) {
        if !matches!(p.parameter_in, ParameterIn::Query) {
            kept.push(p);
            continue;
        }
        if let Some(mut schema) = p.schema {
            if let (RefOr::T(Schema::Object(s)), Some(d)) = (&mut schema, p.description) {
                s.description = Some(d);
            }
            listing = listing.property(&p.name, schema);
            if matches!(p.required, Required::True) {
                listing = listing.required(&p.name);
            }
        }
    }
    let mut listing = RefOr::T(Schema::Object(listing.build()));
    keyword(
        Some(&mut listing),
        "allOf",
        json!([{
            "if": {"required": ["group"]},
            "then": {"properties": {"state": {"const": "waiting"}}},
        }]),
    );
    kept.push(
        ParameterBuilder::new()
            .name("listing")
            .parameter_in(ParameterIn::Query)
            .description(Some(
                "`state` (required), `group` (waiting jobs only: one group's line), `offset` \
                 and `limit`, each a query parameter of its own",
            ))
            .required(Required::True)
            .style(Some(ParameterStyle::Form))
            .explode(Some(true))
            .schema(Some(listing))
            .build(),
    );
    *parameters = kept;
}

/// A component schema's property.
fn property<'a>(
    schema: Option<&'a mut RefOr<Schema>>,
    name: &str,
) -> Option<&'a mut RefOr<Schema>> {
    match schema {
        Some(RefOr::T(Schema::Object(o))) => o.properties.get_mut(name),
        _ => None,
    }
}

/// Adds a JSON Schema keyword the derive has no attribute for to an object schema. One
/// keyword per schema: they are kept in a map of no fixed order.
fn keyword(schema: Option<&mut RefOr<Schema>>, name: &str, value: Value) {
    if let Some(RefOr::T(Schema::Object(o))) = schema {
        o.extensions
            .get_or_insert_with(Default::default)
            .insert(name.to_string(), value);
    }
}
