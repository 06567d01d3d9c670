//! The header dialects against fixtures of each, malformed values included.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use paceline_client::headers::{
    dialect, Auto, Dialect, Discord, GitHub, Ietf, Response, RetryAfter, Scope,
};
use proptest::prelude::*;

const NOW: u64 = 1_700_000_000_000_000;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

#[test]
fn discord_success_and_reset_forms() {
    let h = headers(&[
        ("X-RateLimit-Limit", "5"),
        ("X-RateLimit-Remaining", "1"),
        ("X-RateLimit-Reset", "1700000001.5"),
        ("X-RateLimit-Bucket", "abcd1234"),
    ]);
    let o = Discord.read(&Response::new(200, &h), NOW);
    assert_eq!(o.bucket.as_deref(), Some("abcd1234"));
    assert_eq!((o.limit, o.remaining), (Some(5), Some(1)));
    // Only the absolute reset: turned into the time left.
    assert_eq!(o.reset_after, Some(Duration::from_millis(1500)));
    assert!(o.refusal.is_none() && o.problems.is_empty());

    // Reset-After wins over Reset.
    let h = headers(&[
        ("X-RateLimit-Remaining", "0"),
        ("X-RateLimit-Reset", "1700000100"),
        ("X-RateLimit-Reset-After", "0.25"),
    ]);
    let o = Discord.read(&Response::new(200, &h), NOW);
    assert_eq!(o.reset_after, Some(Duration::from_millis(250)));
    assert!(o.has_limits());
}

#[test]
fn discord_refusals_by_scope() {
    // A user-scope 429 with the body's retry_after.
    let h = headers(&[
        ("X-RateLimit-Bucket", "b"),
        ("X-RateLimit-Remaining", "0"),
        ("X-RateLimit-Reset-After", "2"),
        ("X-RateLimit-Scope", "user"),
    ]);
    let body =
        br#"{"message": "You are being rate limited.", "retry_after": 1.5, "global": false}"#;
    let o = Discord.read(&Response::new(429, &h).with_body(body), NOW);
    let r = o.refusal.unwrap();
    assert_eq!(r.scope, Scope::Bucket);
    assert_eq!(r.retry_after, Some(Duration::from_millis(1500)));

    // Global by header, by body, by scope.
    for (pairs, body) in [
        (
            vec![("X-RateLimit-Global", "true"), ("Retry-After", "3")],
            None,
        ),
        (
            vec![("X-RateLimit-Bucket", "b")],
            Some(&br#"{"retry_after": 3, "global": true}"#[..]),
        ),
        (
            vec![("X-RateLimit-Scope", "global"), ("Retry-After", "3")],
            None,
        ),
    ] {
        let h = headers(&pairs);
        let mut resp = Response::new(429, &h);
        if let Some(b) = body {
            resp = resp.with_body(b);
        }
        let r = Discord.read(&resp, NOW).refusal.unwrap();
        assert_eq!(r.scope, Scope::Global, "{pairs:?}");
        assert_eq!(r.retry_after, Some(Duration::from_secs(3)));
    }

    // A 429 with a Retry-After and no rate-limit headers at all: global (nostrum #709).
    let h = headers(&[("Retry-After", "7")]);
    let r = Discord.read(&Response::new(429, &h), NOW).refusal.unwrap();
    assert_eq!(
        (r.scope, r.retry_after),
        (Scope::Global, Some(Duration::from_secs(7)))
    );

    // Shared scope: the bucket's reset when no Retry-After.
    let h = headers(&[
        ("X-RateLimit-Bucket", "b"),
        ("X-RateLimit-Remaining", "3"),
        ("X-RateLimit-Reset-After", "4"),
        ("X-RateLimit-Scope", "shared"),
    ]);
    let r = Discord.read(&Response::new(429, &h), NOW).refusal.unwrap();
    assert_eq!(
        (r.scope, r.retry_after),
        (Scope::Shared, Some(Duration::from_secs(4)))
    );
}

#[test]
fn discord_malformed_values_are_ignored_and_named() {
    let h = headers(&[
        ("X-RateLimit-Limit", "ten"),
        ("X-RateLimit-Remaining", "-1"),
        ("X-RateLimit-Reset-After", "NaN"),
        ("X-RateLimit-Reset", "soon"),
        ("Retry-After", "later"),
    ]);
    let o = Discord.read(&Response::new(429, &h).with_body(b"<html>"), NOW);
    assert_eq!((o.limit, o.remaining, o.reset_after), (None, None, None));
    let named: Vec<&str> = o.problems.iter().map(|p| p.header).collect();
    for header in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset-after",
        "x-ratelimit-reset",
        "retry-after",
    ] {
        assert!(named.contains(&header), "{header} not named in {named:?}");
    }
    // Still a refusal, with no retry-after: the client backs off on its own.
    assert_eq!(o.refusal.unwrap().retry_after, None);
    // Absurd durations are capped at a day.
    let h = headers(&[
        ("X-RateLimit-Remaining", "0"),
        ("X-RateLimit-Reset-After", "1e300"),
    ]);
    let o = Discord.read(&Response::new(200, &h), NOW);
    assert_eq!(o.reset_after, Some(Duration::from_secs(86_400)));
}

#[test]
fn ietf_fields() {
    let h = headers(&[
        (
            "RateLimit-Policy",
            r#""burst";q=100;w=60,"daily";q=1000;w=86400"#,
        ),
        ("RateLimit", r#""burst";r=0;t=30"#),
        ("RateLimit", r#""daily";r=0;t=3600"#),
    ]);
    let o = Ietf.read(&Response::new(429, &h), NOW);
    // Both spent: the later reset binds.
    assert_eq!(o.bucket.as_deref(), Some("daily"));
    assert_eq!((o.limit, o.remaining), (Some(1000), Some(0)));
    let r = o.refusal.unwrap();
    assert_eq!(
        (r.scope, r.retry_after),
        (Scope::Bucket, Some(Duration::from_secs(3600)))
    );

    // Retry-After as an HTTP date, on a 503.
    let h = headers(&[("Retry-After", "Tue, 14 Nov 2023 22:13:40 GMT")]);
    let o = Ietf.read(&Response::new(503, &h), NOW);
    // 1_700_000_020 s is 2023-11-14T22:13:40Z: 20 s after NOW.
    assert_eq!(
        o.refusal.unwrap().retry_after,
        Some(Duration::from_secs(20))
    );
    // A plain 503 without Retry-After is not a refusal.
    assert!(Ietf
        .read(&Response::new(503, &HeaderMap::new()), NOW)
        .refusal
        .is_none());

    // Malformed structured fields: named, ignored.
    let h = headers(&[
        ("RateLimit", "burst;r=oops"),
        ("RateLimit-Policy", "(\"a\")"),
    ]);
    let o = Ietf.read(&Response::new(200, &h), NOW);
    assert!(o.bucket.is_none());
    assert_eq!(o.problems.len(), 2, "{:?}", o.problems);
    let h = headers(&[("RateLimit", r#""x";r=-5;t=1"#)]);
    let o = Ietf.read(&Response::new(200, &h), NOW);
    assert!(o.bucket.is_none() && !o.problems.is_empty());
}

#[test]
fn github_primary_and_secondary_limits() {
    let reset = (NOW / 1_000_000 + 90).to_string();
    let h = headers(&[
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-used", "5000"),
        ("x-ratelimit-reset", &reset),
        ("x-ratelimit-resource", "core"),
    ]);
    let o = GitHub.read(&Response::new(403, &h), NOW);
    assert_eq!(o.bucket.as_deref(), Some("core"));
    let r = o.refusal.unwrap();
    assert_eq!(
        (r.scope, r.retry_after),
        (Scope::Bucket, Some(Duration::from_secs(90)))
    );

    // Secondary limit with Retry-After.
    let h = headers(&[("x-ratelimit-remaining", "4000"), ("retry-after", "30")]);
    let r = GitHub.read(&Response::new(403, &h), NOW).refusal.unwrap();
    assert_eq!(
        (r.scope, r.retry_after),
        (Scope::Global, Some(Duration::from_secs(30)))
    );

    // Secondary limit without Retry-After (hub4j/github-api #1805): no retry-after given.
    let h = headers(&[("x-ratelimit-remaining", "4000")]);
    let body = br#"{"message":"You have exceeded a secondary rate limit."}"#;
    let r = GitHub
        .read(&Response::new(403, &h).with_body(body), NOW)
        .refusal
        .unwrap();
    assert_eq!((r.scope, r.retry_after), (Scope::Global, None));

    // A plain 403 (no permission) is no refusal.
    let o = GitHub.read(
        &Response::new(403, &h).with_body(b"{\"message\":\"Forbidden\"}"),
        NOW,
    );
    assert!(o.refusal.is_none());
}

#[test]
fn retry_after_and_auto() {
    let h = headers(&[("Retry-After", "120")]);
    let r = RetryAfter
        .read(&Response::new(429, &h), NOW)
        .refusal
        .unwrap();
    assert_eq!(
        (r.scope, r.retry_after),
        (Scope::Global, Some(Duration::from_secs(120)))
    );
    assert!(RetryAfter
        .read(&Response::new(200, &h), NOW)
        .refusal
        .is_none());

    let discord = headers(&[
        ("X-RateLimit-Bucket", "b"),
        ("X-RateLimit-Remaining", "1"),
        ("X-RateLimit-Reset-After", "1"),
    ]);
    assert_eq!(
        Auto.read(&Response::new(200, &discord), NOW)
            .bucket
            .as_deref(),
        Some("b")
    );
    let ietf = headers(&[("RateLimit", r#""p";r=1;t=1"#)]);
    assert_eq!(
        Auto.read(&Response::new(200, &ietf), NOW).bucket.as_deref(),
        Some("p")
    );
    let github = headers(&[
        ("x-ratelimit-resource", "search"),
        ("x-ratelimit-remaining", "1"),
    ]);
    assert_eq!(
        Auto.read(&Response::new(200, &github), NOW)
            .bucket
            .as_deref(),
        Some("search")
    );

    for name in ["discord", "ietf", "github", "retry-after", "auto"] {
        assert_eq!(dialect(name).unwrap().name(), name);
    }
    let e = dialect("soap").unwrap_err();
    assert_eq!(e.field(), "dialect");
    assert!(e
        .message()
        .contains("discord, ietf, github, retry-after, auto"));
}

const NAMES: &[&str] = &[
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
    "x-ratelimit-bucket",
    "x-ratelimit-global",
    "x-ratelimit-scope",
    "x-ratelimit-resource",
    "x-ratelimit-used",
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
];

proptest! {
    /// No header value, status or body makes a dialect panic.
    #[test]
    fn dialects_never_panic(
        values in proptest::collection::vec((0..NAMES.len(), proptest::collection::vec(0x20u8..0xff, 0..40)), 0..8),
        status in prop::sample::select(vec![200u16, 401, 403, 429, 502, 503]),
        body in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
        now in any::<u64>(),
    ) {
        let mut h = HeaderMap::new();
        for (i, bytes) in &values {
            if let Ok(v) = HeaderValue::from_bytes(bytes) {
                h.append(NAMES[*i], v);
            }
        }
        let mut resp = Response::new(status, &h);
        if let Some(b) = &body {
            resp = resp.with_body(b);
        }
        for d in ["discord", "ietf", "github", "retry-after", "auto"] {
            let o = dialect(d).unwrap().read(&resp, now);
            if let Some(r) = o.reset_after {
                prop_assert!(r <= Duration::from_secs(86_400));
            }
        }
    }
}
