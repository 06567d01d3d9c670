//! A strict mock of a Discord-like API on virtual time, for the client limiter's tests.
//!
//! It enforces limits the client only learns from headers: routes map to bucket ids
//! (several routes share one), each bucket is limited per major parameter (a window of
//! `window` starting at the first request after the last reset, as Discord's), and a
//! global limit per token (at most `global` requests in any aligned second). It counts
//! every request, and every 429 by kind. It can inject failures on purpose.

#![allow(dead_code)]

use std::collections::HashMap;

use http::{HeaderMap, HeaderValue};
use paceline_client::Route;

pub const SECOND: u64 = 1_000_000;

#[derive(Clone, Copy, Debug)]
pub struct Limit {
    pub limit: u64,
    pub window: u64,
}

/// What the mock does with the next request to a route, when told to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inject {
    /// A global 429 without any rate-limit header, only `Retry-After` (seconds).
    HeaderlessGlobal429(u64),
    /// A 502 from a proxy in front: no headers at all.
    BadGateway,
    /// A `shared`-scope 429 with `Retry-After` (seconds).
    Shared429(u64),
}

#[derive(Default, Debug)]
pub struct Counts {
    pub requests: u64,
    pub ok: u64,
    pub bucket_429: u64,
    pub global_429: u64,
    pub injected: u64,
}

pub struct MockApi {
    /// Route key → (bucket id, limit).
    routes: HashMap<String, (String, Limit)>,
    /// (bucket id, major) → (reset_at, remaining).
    windows: HashMap<(String, String), (u64, u64)>,
    global: u64,
    /// Aligned second → requests in it.
    global_seen: HashMap<u64, u64>,
    inject: HashMap<String, Vec<Inject>>,
    pub counts: Counts,
    /// Every accepted request: (time, bucket, major).
    pub accepted: Vec<(u64, String, String)>,
}

impl MockApi {
    pub fn new(global: u64) -> MockApi {
        MockApi {
            routes: HashMap::new(),
            windows: HashMap::new(),
            global,
            global_seen: HashMap::new(),
            inject: HashMap::new(),
            counts: Counts::default(),
            accepted: Vec::new(),
        }
    }

    pub fn route(&mut self, route: &Route, bucket: &str, limit: Limit) {
        self.routes
            .insert(route.key().to_string(), (bucket.to_string(), limit));
    }

    pub fn inject(&mut self, route: &Route, what: Inject) {
        self.inject
            .entry(route.key().to_string())
            .or_default()
            .push(what);
    }

    /// The request arrives at `now`: the status and headers it gets.
    pub fn handle(&mut self, route: &Route, now: u64) -> (u16, HeaderMap) {
        self.counts.requests += 1;
        let mut h = HeaderMap::new();
        if let Some(list) = self.inject.get_mut(route.key()) {
            if !list.is_empty() {
                let what = list.remove(0);
                self.counts.injected += 1;
                return match what {
                    Inject::HeaderlessGlobal429(s) => {
                        h.insert("retry-after", HeaderValue::from(s));
                        (429, h)
                    }
                    Inject::BadGateway => (502, h),
                    Inject::Shared429(s) => {
                        let (bucket, _) = &self.routes[route.key()];
                        h.insert("x-ratelimit-bucket", HeaderValue::from_str(bucket).unwrap());
                        h.insert("x-ratelimit-scope", HeaderValue::from_static("shared"));
                        h.insert("retry-after", HeaderValue::from(s));
                        (429, h)
                    }
                };
            }
        }
        let sec = now / SECOND;
        let in_second = self.global_seen.entry(sec).or_insert(0);
        if !route.is_global_exempt() && *in_second >= self.global {
            self.counts.global_429 += 1;
            h.insert("x-ratelimit-global", HeaderValue::from_static("true"));
            h.insert("x-ratelimit-scope", HeaderValue::from_static("global"));
            let left = (sec + 1) * SECOND - now;
            h.insert("retry-after", HeaderValue::from_str(&secs(left)).unwrap());
            return (429, h);
        }
        let Some((bucket, limit)) = self.routes.get(route.key()).cloned() else {
            // No limit on this route: no headers.
            if !route.is_global_exempt() {
                *in_second += 1;
            }
            self.counts.ok += 1;
            return (200, h);
        };
        let key = (bucket.clone(), route.major().to_string());
        let w = self.windows.entry(key).or_insert((0, 0));
        if now >= w.0 {
            *w = (now + limit.window, limit.limit);
        }
        h.insert(
            "x-ratelimit-bucket",
            HeaderValue::from_str(&bucket).unwrap(),
        );
        h.insert("x-ratelimit-limit", HeaderValue::from(limit.limit));
        h.insert(
            "x-ratelimit-reset-after",
            HeaderValue::from_str(&secs(w.0 - now)).unwrap(),
        );
        if w.1 == 0 {
            self.counts.bucket_429 += 1;
            h.insert("x-ratelimit-remaining", HeaderValue::from(0u64));
            h.insert("x-ratelimit-scope", HeaderValue::from_static("user"));
            h.insert(
                "retry-after",
                HeaderValue::from_str(&secs(w.0 - now)).unwrap(),
            );
            return (429, h);
        }
        w.1 -= 1;
        h.insert("x-ratelimit-remaining", HeaderValue::from(w.1));
        if !route.is_global_exempt() {
            *in_second += 1;
        }
        self.counts.ok += 1;
        self.accepted.push((now, bucket, route.major().to_string()));
        (200, h)
    }
}

/// µs as seconds with millisecond precision, rounded up (as Discord sends them).
fn secs(us: u64) -> String {
    let ms = us.div_ceil(1000);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}
