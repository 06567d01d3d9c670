//! `POST /json`: the RLS request over HTTP/1 for clients without gRPC (a Lua filter, a
//! script), as envoyproxy/ratelimit serves it: the `RateLimitRequest` in protobuf's JSON
//! mapping in, the `RateLimitResponse` in protobuf's JSON mapping out, `200` (OK) or `429`
//! (over the limit), decided exactly as over gRPC.
//!
//! The request takes protobuf's field names and their lowerCamelCase forms (`hits_addend`,
//! `hitsAddend`), a unit by name or number, and a 64-bit `hits_addend` as a number or a
//! string; an unknown field is refused, naming it. The answer leaves out fields at their
//! defaults, names enums (`"OVER_LIMIT"`) and writes durations as seconds (`"59.5s"`), as
//! protobuf's JSON mapping does. A wrong request is `400` in the service's error shape
//! (`field` naming the field); a store failure under `fail_closed` is `503`.
//!
//! The route sits behind the service's token like `/v1/...`: with `--auth-token` set, a
//! caller sends `Authorization: Bearer TOKEN`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as ResponseUnit, Code,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt64Value};
use serde_json::{Map, Value};

use super::decide::RlsError;
use crate::error::{ApiError, ErrorCode};
use crate::extract::{Authorized, JsonBody, JsonSchema, MAX_BODY};
use crate::state::AppState;

/// The `/json` route.
pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/json", post(json))
}

/// `POST /json`'s body: a `RateLimitRequest` in protobuf's JSON mapping.
pub(crate) enum RequestSchema {}

impl JsonSchema for RequestSchema {
    const LIMIT: usize = MAX_BODY;
    type Value<'a> = RateLimitRequest;

    fn read(json: &str) -> Result<RateLimitRequest, ApiError> {
        let value: Value = serde_json::from_str(json)
            .map_err(|e| ApiError::invalid("body", format!("is not JSON: {e}")))?;
        request(&value).map_err(|(field, message)| ApiError::invalid(field, message))
    }
}

/// `POST /json`: one `ShouldRateLimit` over HTTP.
#[utoipa::path(
    post,
    path = "/json",
    tag = "rls",
    operation_id = "rls_json",
    request_body(content = Object, description = "Envoy's `RateLimitRequest` in protobuf's JSON mapping: `{\"domain\", \"descriptors\": [{\"entries\": [{\"key\", \"value\"}], \"limit\"?, \"hits_addend\"?}], \"hits_addend\"?}`"),
    responses(
        (status = 200, description = "OK: Envoy's `RateLimitResponse` in protobuf's JSON mapping (`overallCode`, `statuses`, ...)", body = Object),
        (status = 429, description = "Over the limit: the same answer, `overallCode` `OVER_LIMIT`; nothing counted", body = Object),
        (status = 400, description = "`invalid_argument`: a field of the request is wrong (`field` names it)", body = crate::error::Envelope),
        (status = 401, description = "`unauthenticated`", body = crate::error::Envelope),
        (status = 404, description = "`not_found`: the service serves no RLS rules (no `--rls-config`)", body = crate::error::Envelope),
        (status = 503, description = "`store_unavailable`: the store failed and the failure policy refuses", body = crate::error::Envelope),
    )
)]
async fn json(
    State(state): State<Arc<AppState>>,
    _: Authorized,
    body: JsonBody<RequestSchema>,
) -> Result<Response, ApiError> {
    let Some(rls) = state.rls.clone() else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "path",
            "this service serves no RLS rules; start it with --rls-config",
        ));
    };
    let request = body.read()?;
    let rules = rls.config();
    let answer = super::decide::decide(&state, &rules, &request, rls.response_headers)
        .await
        .map_err(|e| match e {
            RlsError::Invalid { field, message } => ApiError::invalid(field, message),
            RlsError::Unavailable(message) => {
                ApiError::new(ErrorCode::StoreUnavailable, "store", message)
            }
        })?;
    let status = if answer.refused {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    Ok((status, Json(response(&answer.response))).into_response())
}

type Field = (String, String);

fn object<'v>(value: &'v Value, field: &str) -> Result<&'v Map<String, Value>, Field> {
    value
        .as_object()
        .ok_or_else(|| (field.to_string(), "must be an object".to_string()))
}

/// The value of `name` (or its lowerCamelCase form `camel`) in `map`.
fn get<'v>(map: &'v Map<String, Value>, name: &str, camel: &str) -> Option<&'v Value> {
    map.get(name)
        .or_else(|| map.get(camel))
        .filter(|v| !v.is_null())
}

/// Refuses a field of `map` that is not in `known` (each a name and its camel form).
fn known_fields(map: &Map<String, Value>, known: &[&str], at: &str) -> Result<(), Field> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err((
            format!("{at}{k}"),
            format!("is not a field here; use {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// An unsigned integer: a JSON number, or a string of digits (protobuf's JSON mapping
/// allows both), at most `max`.
fn unsigned(value: &Value, field: &str, max: u64) -> Result<u64, Field> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    n.filter(|n| *n <= max).ok_or_else(|| {
        (
            field.to_string(),
            format!("must be a whole number from 0 to {max}"),
        )
    })
}

fn string(value: &Value, field: &str) -> Result<String, Field> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| (field.to_string(), "must be a string".to_string()))
}

/// A `RateLimitRequest` from protobuf's JSON mapping.
fn request(value: &Value) -> Result<RateLimitRequest, Field> {
    let map = object(value, "body")?;
    known_fields(
        map,
        &["domain", "descriptors", "hits_addend", "hitsAddend"],
        "",
    )?;
    let mut out = RateLimitRequest::default();
    if let Some(v) = get(map, "domain", "domain") {
        out.domain = string(v, "domain")?;
    }
    if let Some(v) = get(map, "hits_addend", "hitsAddend") {
        out.hits_addend =
            u32::try_from(unsigned(v, "hits_addend", u64::from(u32::MAX))?).unwrap_or(u32::MAX);
    }
    if let Some(v) = get(map, "descriptors", "descriptors") {
        let list = v.as_array().ok_or_else(|| {
            (
                "descriptors".to_string(),
                "must be an array of descriptors".to_string(),
            )
        })?;
        for (i, d) in list.iter().enumerate() {
            out.descriptors.push(descriptor(d, i)?);
        }
    }
    Ok(out)
}

fn descriptor(value: &Value, i: usize) -> Result<RateLimitDescriptor, Field> {
    let at = format!("descriptors[{i}]");
    let map = object(value, &at)?;
    known_fields(
        map,
        &[
            "entries",
            "limit",
            "hits_addend",
            "hitsAddend",
            "is_negative_hits",
            "isNegativeHits",
        ],
        &format!("{at}."),
    )?;
    let mut out = RateLimitDescriptor::default();
    if let Some(v) = get(map, "entries", "entries") {
        let list = v.as_array().ok_or_else(|| {
            (
                format!("{at}.entries"),
                "must be an array of {\"key\", \"value\"}".to_string(),
            )
        })?;
        for (j, e) in list.iter().enumerate() {
            let field = format!("{at}.entries[{j}]");
            let entry = object(e, &field)?;
            known_fields(entry, &["key", "value"], &format!("{field}."))?;
            out.entries.push(Entry {
                key: match entry.get("key").filter(|v| !v.is_null()) {
                    Some(v) => string(v, &format!("{field}.key"))?,
                    None => String::new(),
                },
                value: match entry.get("value").filter(|v| !v.is_null()) {
                    Some(v) => string(v, &format!("{field}.value"))?,
                    None => String::new(),
                },
            });
        }
    }
    if let Some(v) = get(map, "limit", "limit") {
        let field = format!("{at}.limit");
        let limit = object(v, &field)?;
        known_fields(
            limit,
            &["requests_per_unit", "requestsPerUnit", "unit"],
            &format!("{field}."),
        )?;
        let requests = match get(limit, "requests_per_unit", "requestsPerUnit") {
            Some(v) => unsigned(
                v,
                &format!("{field}.requests_per_unit"),
                u64::from(u32::MAX),
            )?,
            None => 0,
        };
        let unit = match limit.get("unit").filter(|v| !v.is_null()) {
            None => RateLimitUnit::Unknown as i32,
            Some(Value::String(name)) => RateLimitUnit::from_str_name(name)
                .map(|u| u as i32)
                .ok_or_else(|| {
                    (
                        format!("{field}.unit"),
                        format!("`{name}` is no unit; use SECOND, MINUTE, HOUR or DAY"),
                    )
                })?,
            Some(other) => {
                i32::try_from(unsigned(other, &format!("{field}.unit"), 100)?).unwrap_or_default()
            }
        };
        out.limit = Some(RateLimitOverride {
            requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
            unit,
        });
    }
    if let Some(v) = get(map, "hits_addend", "hitsAddend") {
        out.hits_addend = Some(UInt64Value {
            value: unsigned(v, &format!("{at}.hits_addend"), u64::MAX)?,
        });
    }
    if let Some(v) = get(map, "is_negative_hits", "isNegativeHits") {
        out.is_negative_hits = v.as_bool().ok_or_else(|| {
            (
                format!("{at}.is_negative_hits"),
                "must be true or false".to_string(),
            )
        })?;
    }
    Ok(out)
}

/// A `RateLimitResponse` in protobuf's JSON mapping (defaults left out).
pub(crate) fn response(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".into(), code(r.overall_code));
    if !r.statuses.is_empty() {
        let statuses = r
            .statuses
            .iter()
            .map(|s| {
                let mut m = Map::new();
                if s.code != 0 {
                    m.insert("code".into(), code(s.code));
                }
                if let Some(limit) = &s.current_limit {
                    let mut l = Map::new();
                    if !limit.name.is_empty() {
                        l.insert("name".into(), Value::from(limit.name.clone()));
                    }
                    if limit.requests_per_unit != 0 {
                        l.insert(
                            "requestsPerUnit".into(),
                            Value::from(limit.requests_per_unit),
                        );
                    }
                    if limit.unit != 0 {
                        let unit = ResponseUnit::try_from(limit.unit)
                            .map(|u| Value::from(u.as_str_name()))
                            .unwrap_or_else(|_| Value::from(limit.unit));
                        l.insert("unit".into(), unit);
                    }
                    m.insert("currentLimit".into(), Value::Object(l));
                }
                if s.limit_remaining != 0 {
                    m.insert("limitRemaining".into(), Value::from(s.limit_remaining));
                }
                if let Some(d) = &s.duration_until_reset {
                    m.insert("durationUntilReset".into(), Value::from(duration(d)));
                }
                Value::Object(m)
            })
            .collect();
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !r.response_headers_to_add.is_empty() {
        let headers = r
            .response_headers_to_add
            .iter()
            .map(|h| serde_json::json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out)
}

fn code(c: i32) -> Value {
    Code::try_from(c)
        .map(|c| Value::from(c.as_str_name()))
        .unwrap_or_else(|_| Value::from(c))
}

/// A protobuf `Duration` as its JSON mapping: seconds with 0, 3, 6 or 9 decimals and `s`.
fn duration(d: &ProtoDuration) -> String {
    let nanos = d.nanos.unsigned_abs();
    if nanos == 0 {
        format!("{}s", d.seconds)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}.{:03}s", d.seconds, nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}.{:06}s", d.seconds, nanos / 1_000)
    } else {
        format!("{}.{:09}s", d.seconds, nanos)
    }
}
