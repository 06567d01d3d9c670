//! The answer's headers and body: the IETF `RateLimit` and `RateLimit-Policy` fields
//! (draft-ietf-httpapi-ratelimit-headers-11: RFC 9651 structured-field lists, one item per
//! limit named by a string, `q` on `RateLimit-Policy`, `r` and `t` on `RateLimit`; the
//! optional `w`, `qu` and `pk` are not sent) and RFC 9457 problem details.
//!
//! ```text
//! RateLimit-Policy: "per-second";q=20, "per-day";q=10000
//! RateLimit: "per-second";r=0;t=2, "per-day";r=9980;t=30873
//! ```

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, StatusCode};
use paceline_core::Decision;
use serde::Serialize;

/// `RateLimit-Policy`: each limit's quota.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: each limit's state for this request.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The media type of RFC 9457 problem details.
pub const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The largest integer a structured field holds (15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Whole seconds, rounded up: a client that waits them is never early.
pub(crate) fn seconds_up(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Sets `RateLimit-Policy` and `RateLimit` listing every limit of `limits` under its name,
/// in order (a list of items: the name as a string, then `q`, the quota, in the policy
/// field, and `r`, the remaining quota, and `t`, the seconds until the limit resets, in the
/// state field; numbers capped at the 15 digits a structured field holds), and
/// `Retry-After` (whole seconds, at least 1) when `combined` refused.
///
/// ```
/// use paceline_core::{Decision, Op, Policy};
/// let policy: Policy = "gcra:rate=1/s,burst=2".parse()?;
/// let d = policy.apply(&mut None, 0, Op::Limit, 1)?;
/// let mut headers = http::HeaderMap::new();
/// paceline_tower::headers::insert(&mut headers, &[("per-second", &d)], &d);
/// assert_eq!(headers["ratelimit-policy"], "\"per-second\";q=2");
/// assert_eq!(headers["ratelimit"], "\"per-second\";r=1;t=1");
/// # Ok::<(), paceline_core::InputError>(())
/// ```
pub fn insert(headers: &mut HeaderMap, limits: &[(&str, &Decision)], combined: &Decision) {
    let quotas = limits.iter().map(|(name, d)| (*name, [("q", d.limit)]));
    if let Some(policy) = field(quotas, Names::Plain) {
        headers.insert(RATELIMIT_POLICY, policy);
    }
    insert_state(headers, limits, combined);
}

/// The `RateLimit-Policy` field of limits `(name, quota)`, which depends on the limits
/// alone: a layer writes it once and sends a copy with every answer.
pub fn policy_field(limits: &[(&str, u64)]) -> Option<HeaderValue> {
    field(
        limits.iter().map(|(name, quota)| (*name, [("q", *quota)])),
        Names::Plain,
    )
}

/// [`insert`] without `RateLimit-Policy`: `RateLimit`, and `Retry-After` when `combined`
/// refused.
pub fn insert_state(headers: &mut HeaderMap, limits: &[(&str, &Decision)], combined: &Decision) {
    insert_state_of(headers, limits.iter().copied(), Names::Plain, combined);
}

/// How a field's names come: as they are, or already structured-field strings
/// ([`sf_string`]: the layer quotes its names once, when built).
#[derive(Clone, Copy)]
pub(crate) enum Names {
    Plain,
    Quoted,
}

/// [`insert_state`] of the limits an iterator yields, their names as `names` says.
pub(crate) fn insert_state_of<'a>(
    headers: &mut HeaderMap,
    limits: impl Iterator<Item = (&'a str, &'a Decision)> + Clone,
    names: Names,
    combined: &Decision,
) {
    if let Some(v) = state_field(limits, names) {
        headers.insert(RATELIMIT, v);
    }
    if !combined.allowed {
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from(seconds_up(combined.delay).max(1)),
        );
    }
}

/// The `RateLimit` field of the limits an iterator yields, their names as `names` says.
pub(crate) fn state_field<'a>(
    limits: impl Iterator<Item = (&'a str, &'a Decision)> + Clone,
    names: Names,
) -> Option<HeaderValue> {
    let members =
        limits.map(|(name, d)| (name, [("r", d.remaining), ("t", seconds_up(d.reset_after))]));
    field(members, names)
}

/// A structured field listing `members`: each a name (written as a structured-field string
/// unless `names` says it is one) and its parameters (numbers capped at the 15 digits a
/// structured field holds). Measured first, then written into one allocation of the exact
/// size, which the value keeps.
fn field<'a, const N: usize>(
    members: impl Iterator<Item = (&'a str, [(&'static str, u64); N])> + Clone,
    names: Names,
) -> Option<HeaderValue> {
    let mut digits = itoa::Buffer::new();
    let mut len = 0;
    for (i, (name, pairs)) in members.clone().enumerate() {
        len += usize::from(i > 0) * 2;
        len += match names {
            Names::Plain => sf_len(name),
            Names::Quoted => name.len(),
        };
        for (key, number) in pairs {
            len += key.len() + 2 + digits.format(number.min(SF_INTEGER_MAX)).len();
        }
    }
    let mut text = Vec::with_capacity(len);
    for (i, (name, pairs)) in members.enumerate() {
        if i > 0 {
            text.extend_from_slice(b", ");
        }
        match names {
            Names::Plain => push_sf_string(&mut text, name),
            Names::Quoted => text.extend_from_slice(name.as_bytes()),
        }
        for (key, number) in pairs {
            text.push(b';');
            text.extend_from_slice(key.as_bytes());
            text.push(b'=');
            text.extend_from_slice(digits.format(number.min(SF_INTEGER_MAX)).as_bytes());
        }
    }
    debug_assert_eq!(
        text.len(),
        len,
        "a field is written as long as it was measured"
    );
    HeaderValue::from_maybe_shared(Bytes::from(text)).ok()
}

/// `name` as a structured-field string: quoted, printable ASCII, with `"` and `\`
/// escaped; anything else is written `?`.
pub(crate) fn sf_string(name: &str) -> String {
    let mut text = Vec::with_capacity(sf_len(name));
    push_sf_string(&mut text, name);
    // Printable ASCII only, so never the empty fallback.
    String::from_utf8(text).unwrap_or_default()
}

/// The length of `name` as a structured-field string.
fn sf_len(name: &str) -> usize {
    let escapes = name.bytes().filter(|b| matches!(b, b'"' | b'\\')).count();
    2 + name.chars().count() + escapes
}

/// Appends `name` as a structured-field string ([`sf_string`]).
fn push_sf_string(text: &mut Vec<u8>, name: &str) {
    text.push(b'"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                text.push(b'\\');
                text.push(c as u8);
            }
            ' '..='~' => text.push(c as u8),
            _ => text.push(b'?'),
        }
    }
    text.push(b'"');
}

/// An RFC 9457 problem details object (`application/problem+json`), with paceline's
/// extension members.
#[derive(Debug, Serialize)]
pub struct Problem {
    /// `about:blank`: the status says it all.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The status's reason phrase.
    pub title: &'static str,
    /// The HTTP status code.
    pub status: u16,
    /// What happened, for people.
    pub detail: String,
    /// For a refusal: when to retry, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<f64>,
    /// For a refusal: the names of the limits that refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub violated: Vec<String>,
}

impl Problem {
    /// A problem of `status`, explained by `detail`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Problem {
        Problem {
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail: detail.into(),
            retry_after_ms: None,
            violated: Vec::new(),
        }
    }

    /// The `429` of a refusal by the limits named `violated`, retried after `retry_after`.
    pub fn too_many_requests(violated: Vec<String>, retry_after: Duration) -> Problem {
        let names: Vec<String> = violated.iter().map(|n| format!("`{n}`")).collect();
        let mut problem = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "refused by the {} limit{}; retry in {} s",
                names.join(" and "),
                if names.len() > 1 { "s" } else { "" },
                seconds_up(retry_after).max(1)
            ),
        );
        // Milliseconds with microsecond precision, as `paceline serve` writes times.
        problem.retry_after_ms = Some(paceline_core::round_to_micros(retry_after) as f64 / 1000.0);
        problem.violated = violated;
        problem
    }

    /// The problem as JSON bytes.
    pub fn to_bytes(&self) -> Bytes {
        // A struct of strings and numbers always serialises.
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_names_and_huge_times_still_make_valid_structured_fields() {
        let mut d = Decision::from_micros(false, f64::INFINITY, u64::MAX, f64::INFINITY, 7);
        d.delay = Duration::MAX;
        let mut headers = HeaderMap::new();
        insert(&mut headers, &[("a\"b\\c é\t", &d)], &d);
        let state = headers["ratelimit"].to_str().unwrap();
        assert_eq!(
            state,
            "\"a\\\"b\\\\c ??\";r=999999999999999;t=999999999999999"
        );
        assert_eq!(headers["retry-after"], u64::MAX.to_string().as_str());
    }
}
