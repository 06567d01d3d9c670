//! Concurrency leases over HTTP: a request in flight holds a lease of a `concurrency`
//! policy, and gives it back when it ends.
//!
//! | endpoint | answer |
//! |---|---|
//! | `POST /v1/leases` `{"policy", "key", "cost"}` | `201 {"lease", "expires_ms", ...}`, or `429` with `Retry-After` when `limit` leases are live |
//! | `POST /v1/leases/{lease}/extend` | `200 {"lease", "expires_ms"}`: it lives `lease` from now |
//! | `DELETE /v1/leases/{lease}` | `204` |
//!
//! A lease that is unknown, given back already or reclaimed (not given back by its expiry),
//! or whose policy is no longer configured as a `concurrency` one, is `404 unknown_lease`,
//! and so is a token of the right shape that this service did not sign; a token that is
//! not of that shape is `400` naming `lease` (an inline spec's token while inline specs are
//! turned off, `403`).
//!
//! A lease token is `ID.NAMESPACE.KEY.TAG`: the lease's id on its key, then the policy's
//! namespace (its configured name, or `~SPEC` for an inline spec) and the key, both
//! hex-encoded, so that any instance sharing the store finds the key and its policy again
//! from the token alone, and last a 128-bit tag of all three under the store's secret key
//! ([`paceline_store::secret`]; in Redis, one key shared by every instance). The id is no
//! secret (ids count up from the time, and a `429`'s `Retry-After` tells when the oldest
//! lease ends), but without the tag it is useless: only the client the service answered
//! can give back or extend a lease. `POST /v1/decisions` with a `concurrency` policy takes
//! a lease too, and answers its token as `lease`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use paceline_store::secret::{from_hex, to_hex, Tag, TokenKey, TAG_LEN};
use paceline_store::Op;
use serde::{Deserialize, Serialize};
use serde_json::Number;

use crate::api::{
    add_rate_limit_headers, path_parts, read_body, settle, status_of, utf8, Authorized,
    DecisionBody, MAX_BODY,
};
use crate::error::{ApiError, ErrorCode};
use crate::fields::{check_key, cost_field};
use crate::request::{self, Text};
use crate::state::{AppState, Live, Resolved};
use crate::units::ms;

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/leases", post(take))
        .route("/v1/leases/{lease}", axum::routing::delete(give_back))
        .route("/v1/leases/{lease}/extend", post(extend))
}

/// What a concurrency lease's tag signs first: keeps it from passing as another kind.
const PURPOSE: &[u8] = b"paceline concurrency lease";

/// The tag of lease `id` of `key` under the policy of `namespace`.
fn tag(signer: &TokenKey, namespace: &str, key: &str, id: u64) -> Tag {
    signer.tag(&[
        PURPOSE,
        namespace.as_bytes(),
        key.as_bytes(),
        &id.to_be_bytes(),
    ])
}

/// The token of lease `id` of `key` under the policy of `namespace`, signed by `signer`.
pub(crate) fn token(signer: &TokenKey, namespace: &str, key: &str, id: u64) -> String {
    let mut text = String::with_capacity(24 + 2 * (namespace.len() + key.len() + TAG_LEN));
    text.push_str(itoa::Buffer::new().format(id));
    for part in [namespace.as_bytes(), key.as_bytes()] {
        text.push('.');
        text.push_str(&to_hex(part));
    }
    text.push('.');
    text.push_str(&to_hex(&tag(signer, namespace, key, id)));
    text
}

/// A token read back: the lease id, the policy's namespace and the key.
struct Token {
    id: u64,
    namespace: String,
    key: String,
}

/// The lease a token names, once its tag checks out: a well-formed token this service did
/// not sign is answered as an unknown lease, telling a guesser nothing.
fn parse(signer: &TokenKey, token: &str) -> Result<Token, ApiError> {
    let bad = || {
        ApiError::invalid(
            "lease",
            "is not a lease token of this service; use the `lease` a POST /v1/leases answered",
        )
    };
    let mut parts = token.split('.');
    let (Some(id), Some(namespace), Some(key), Some(signed), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(bad());
    };
    let mut given = [0u8; TAG_LEN];
    if !from_hex(signed, &mut given) {
        return Err(bad());
    }
    let unhex = |text: &str| -> Option<String> {
        let mut bytes = vec![0u8; text.len() / 2];
        (!text.is_empty() && from_hex(text, &mut bytes)).then_some(())?;
        String::from_utf8(bytes).ok()
    };
    let token = Token {
        id: id.parse().map_err(|_| bad())?,
        namespace: unhex(namespace).ok_or_else(bad)?,
        key: unhex(key).ok_or_else(bad)?,
    };
    let parts: [&[u8]; 4] = [
        PURPOSE,
        token.namespace.as_bytes(),
        token.key.as_bytes(),
        &token.id.to_be_bytes(),
    ];
    if !signer.verify(&parts, &given) {
        return Err(unknown_lease());
    }
    Ok(token)
}

/// The lease a token names: its id, and its key's policy as the live configuration has it.
/// A policy no longer configured makes the lease unknown.
fn find<'a>(
    live: &'a Live,
    signer: &TokenKey,
    token: &str,
) -> Result<(u64, Resolved<'a>), ApiError> {
    let Token { id, namespace, key } = parse(signer, token)?;
    let spec = namespace.strip_prefix('~').unwrap_or(&namespace);
    match live.resolve(spec, &key, "lease") {
        // A policy that is no longer a concurrency one (a reload changed it) holds no lease.
        Ok(resolved) if resolved.policy.concurrency().is_err() => Err(unknown_lease()),
        Ok(resolved) => Ok((id, resolved)),
        Err(e) if e.status() == StatusCode::NOT_FOUND => Err(unknown_lease()),
        Err(e) => Err(e),
    }
}

fn unknown_lease() -> ApiError {
    ApiError::new(
        ErrorCode::UnknownLease,
        "lease",
        "no such live lease: it was given back already, or reclaimed when it expired; take a new one",
    )
}

/// `POST /v1/leases`'s body, as sent.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object with `policy` and `key`"
)]
struct RawTake<'a> {
    #[serde(borrow)]
    policy: Option<Text<'a>>,
    #[serde(borrow)]
    key: Option<Text<'a>>,
    cost: Option<Number>,
}

const ALLOWED: &[(&str, &str)] = &[
    (
        "policy",
        "a string: a `concurrency` policy's configured name or spec",
    ),
    ("key", "a string"),
    ("cost", "a whole number of at least 1"),
];

/// A lease taken.
#[derive(Serialize)]
struct LeaseBody<'a> {
    /// When the lease is reclaimed unless extended, in ms from now.
    expires_ms: f64,
    /// Set when the store failed and the failure policy answered: the lease is held
    /// nowhere shared.
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<&'static str>,
    lease: Option<String>,
    limit: u64,
    policy: &'a str,
    remaining: u64,
}

async fn take(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    body: Body,
) -> Response {
    match take_lease(&state, &live, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn take_lease(state: &AppState, live: &Live, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(state, body, MAX_BODY).await?;
    let fields: RawTake = request::object(
        utf8(&bytes)?,
        "a JSON object with `policy` and `key`",
        ALLOWED,
    )?;
    let spec = fields.policy.as_deref().ok_or_else(|| {
        ApiError::invalid(
            "policy",
            "is required: a `concurrency` policy's name or spec",
        )
    })?;
    let key = fields
        .key
        .as_deref()
        .ok_or_else(|| ApiError::invalid("key", "is required"))?;
    check_key(key, "key")?;
    let cost = cost_field(fields.cost.as_ref(), "cost")?.unwrap_or(1);
    let resolved = live.resolve(spec, key, "policy")?;
    let lease = resolved
        .policy
        .concurrency()
        .map_err(|e| ApiError::input(&e))?
        .lease();
    let name = resolved.name.unwrap_or("inline");
    let outcome = state
        .store
        .decide(&resolved.policy, &resolved.store_key, Op::Limit, cost)
        .await;
    let d = settle(state, resolved.metrics, key, outcome)?;
    let namespace = resolved.namespace(key);
    let mut response = if d.allowed {
        let body = LeaseBody {
            expires_ms: ms(lease),
            fallback: d.fallback.map(|f| f.name()),
            lease: d
                .lease
                .map(|id| token(&state.lease_key, namespace, key, id)),
            limit: d.limit,
            policy: name,
            remaining: d.remaining,
        };
        (StatusCode::CREATED, axum::Json(body)).into_response()
    } else {
        (status_of(&d), axum::Json(DecisionBody::new(name, &d, None))).into_response()
    };
    add_rate_limit_headers(response.headers_mut(), name, &d);
    Ok(response)
}

/// An extension: the lease and its new life.
#[derive(Serialize)]
struct ExtendedBody<'a> {
    expires_ms: f64,
    lease: &'a str,
}

async fn extend(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    on_lease(&state, &live, path, |store, resolved, id| async move {
        match store
            .extend(&resolved.policy, &resolved.store_key, id)
            .await
        {
            Ok(Some(left)) => Ok(Some(ms(left))),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await
    .map(|(token, expires_ms)| {
        let body = ExtendedBody {
            expires_ms,
            lease: &token,
        };
        (StatusCode::OK, axum::Json(body)).into_response()
    })
    .unwrap_or_else(IntoResponse::into_response)
}

async fn give_back(
    State(state): State<Arc<AppState>>,
    Authorized(live): Authorized,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    on_lease(&state, &live, path, |store, resolved, id| async move {
        let released = store
            .release(&resolved.policy, &resolved.store_key, id)
            .await?;
        Ok(released.then_some(()))
    })
    .await
    .map(|_| StatusCode::NO_CONTENT.into_response())
    .unwrap_or_else(IntoResponse::into_response)
}

/// Finds the lease a path names and runs `call` on it with the store: its token and what
/// `call` answered, `404 unknown_lease` when it answered `None` (the lease is not live), or
/// the error of a bad token or a failed store.
async fn on_lease<'a, T, F, Fut>(
    state: &'a AppState,
    live: &'a Live,
    path: Result<Path<String>, PathRejection>,
    call: F,
) -> Result<(String, T), ApiError>
where
    F: FnOnce(&'a paceline_store::SharedStore, Resolved<'a>, u64) -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, paceline_store::Error>>,
{
    let token = path_parts(path, "the lease")?;
    let (id, resolved) = find(live, &state.lease_key, &token)?;
    match call(&state.store, resolved, id).await {
        Ok(Some(answer)) => Ok((token, answer)),
        Ok(None) => Err(unknown_lease()),
        Err(e) => Err(ApiError::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_read_back_and_anything_else_is_refused() {
        let signer = TokenKey::random().expect("a key");
        for (namespace, key, id) in [
            ("db-slots", "tenant:42", 1_700_000_000_000_000),
            ("~concurrency:limit=2,lease=30s", "{t}.é\u{1}", 0),
        ] {
            let t = token(&signer, namespace, key, id);
            assert!(
                t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'),
                "{t}"
            );
            let back = parse(&signer, &t).unwrap_or_else(|e| panic!("{t}: {e:?}"));
            assert_eq!(
                (back.id, back.namespace.as_str(), back.key.as_str()),
                (id, namespace, key)
            );
        }
        let tag = "00112233445566778899aabbccddeeff";
        for bad in [
            "",
            "1",
            "1.61",
            "x.61.61",
            "1.6.61",
            "1.61.zz",
            "1.61.61.61",
            "1..61",
            "1.ff.61",
            &format!("1.61.61.{tag}.61"),
            &format!("x.61.61.{tag}"),
            "1.61.61.0011",
        ] {
            let e = parse(&signer, bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} was read"));
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn a_token_another_key_signed_or_a_neighbour_id_is_an_unknown_lease() {
        let signer = TokenKey::random().expect("a key");
        let t = token(&signer, "db-slots", "tenant:42", 1_700_000_000_000_000);
        let elsewhere = token(
            &TokenKey::random().expect("a key"),
            "db-slots",
            "tenant:42",
            1_700_000_000_000_000,
        );
        let (id, rest) = t.split_once('.').expect("an id");
        let neighbours = [
            format!("{}.{rest}", 1_700_000_000_000_001u64),
            format!("{}.{rest}", 1_699_999_999_999_999u64),
        ];
        assert_eq!(id, "1700000000000000");
        for forged in neighbours.iter().chain([&elsewhere]) {
            let e = parse(&signer, forged)
                .err()
                .unwrap_or_else(|| panic!("{forged} was read"));
            assert_eq!(e.status(), StatusCode::NOT_FOUND, "{forged}");
        }
    }
}
