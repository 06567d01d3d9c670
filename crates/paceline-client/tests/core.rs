//! The client core against the strict mock API, on virtual time: no real time passes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use http::HeaderMap;
use paceline_client::headers::{Dialect, Discord, GitHub, Observation, Response, Scope};
use paceline_client::{ClientConfig, ClientCore, ClientError, Completion, RequestId, Route};
use paceline_testkit::mock_api::{Inject, Limit, MockApi, SECOND};

const T0: u64 = 1_700_000_000_000_000;
/// One way, client to API.
const LATENCY: u64 = 2_000;

#[derive(Debug)]
enum Ev {
    Arrive(RequestId),
    Respond(RequestId, u16, HeaderMap),
    Submit(Route),
}

/// The core, the mock and the requests in flight between them, on one virtual clock.
struct Sim {
    core: ClientCore,
    api: MockApi,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64)>>,
    payloads: HashMap<u64, Ev>,
    routes: HashMap<RequestId, Route>,
    done: Vec<(RequestId, u16, u64)>,
    failed: Vec<(RequestId, ClientError)>,
    retries: u64,
    /// When each request was sent, in order.
    sent: Vec<(RequestId, u64)>,
    /// One way, client to API.
    latency: u64,
}

impl Sim {
    fn new(config: ClientConfig, api: MockApi) -> Sim {
        Sim {
            core: ClientCore::new(config),
            api,
            now: T0,
            seq: 0,
            events: BinaryHeap::new(),
            payloads: HashMap::new(),
            routes: HashMap::new(),
            done: Vec::new(),
            failed: Vec::new(),
            retries: 0,
            sent: Vec::new(),
            latency: LATENCY,
        }
    }

    fn submit(
        &mut self,
        route: &Route,
        max_wait: Option<Duration>,
    ) -> Result<RequestId, ClientError> {
        let id = self.core.submit(route.clone(), self.now, max_wait)?;
        self.routes.insert(id, route.clone());
        Ok(id)
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq)));
        self.payloads.insert(self.seq, ev);
    }

    fn poll(&mut self) -> Option<u64> {
        let p = self.core.poll(self.now);
        for id in p.go {
            self.sent.push((id, self.now));
            self.at(self.now + self.latency, Ev::Arrive(id));
        }
        self.failed.extend(p.failed);
        p.next
    }

    /// Runs until nothing is left to do or `until` (virtual µs) is reached.
    fn run(&mut self, until: u64) {
        loop {
            let next_poll = self.poll();
            let next_event = self.events.peek().map(|Reverse((t, _))| *t);
            let next = match (next_poll, next_event) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(t) => t,
                    None => return,
                },
            };
            if next > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(next);
            while let Some(&Reverse((t, seq))) = self.events.peek() {
                if t > self.now {
                    break;
                }
                self.events.pop();
                match self.payloads.remove(&seq) {
                    Some(Ev::Arrive(id)) => {
                        let (status, h) = self.api.handle(&self.routes[&id], self.now);
                        self.at(self.now + self.latency, Ev::Respond(id, status, h));
                    }
                    Some(Ev::Respond(id, status, h)) => {
                        let seen = Discord.read(&Response::new(status, &h), self.now);
                        match self.core.complete(id, status, &seen, self.now) {
                            Completion::Done => self.done.push((id, status, self.now)),
                            Completion::Retry => self.retries += 1,
                        }
                    }
                    Some(Ev::Submit(route)) => {
                        if let Err(e) = self.submit(&route, None) {
                            panic!("submit refused: {e}");
                        }
                    }
                    None => {}
                }
            }
        }
    }
}

/// 100 route templates in 10 buckets (10 routes share each bucket id) on 2 major
/// parameters: 20 independent limits.
fn routes(api: &mut MockApi, limit: Limit) -> Vec<Route> {
    let mut out = Vec::new();
    for major in [111u64, 222] {
        for r in 0..100 {
            let route = Route::discord("POST", &format!("/channels/{major}/r{r}"));
            api.route(&route, &format!("bucket-{}", r % 10), limit);
            out.push(route);
        }
    }
    out
}

/// Submits `n` requests at once spread evenly over `routes`, runs them all, and answers
/// the virtual seconds it took.
fn drain(sim: &mut Sim, routes: &[Route], n: usize) -> f64 {
    for i in 0..n {
        let route = &routes[i % routes.len()];
        sim.submit(route, None).unwrap();
    }
    sim.run(u64::MAX);
    assert_eq!(sim.done.len(), n, "every request answered");
    let mut ids: Vec<_> = sim.done.iter().map(|d| d.0).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "each answered exactly once");
    assert!(
        sim.failed.is_empty(),
        "{:?}",
        &sim.failed[..sim.failed.len().min(3)]
    );
    assert_eq!(sim.core.waiting() + sim.core.in_flight(), 0);
    let last = sim.done.iter().map(|d| d.2).max().unwrap();
    (last - T0) as f64 / 1e6
}

/// Took at most 1/0.9 of the least time the limits allow.
fn near_the_limit(what: &str, took: f64, least: f64) {
    eprintln!("{what}: {took} s against {least} s: {:.3}", least / took);
    assert!(
        least / took >= 0.9,
        "{what}: took {took} s, the limits allow {least} s"
    );
}

#[test]
fn bucket_bound_traffic_gets_no_429_and_nearly_all_it_may() {
    let mut api = MockApi::new(50);
    let limit = Limit {
        limit: 5,
        window: 4 * SECOND,
    };
    let routes = routes(&mut api, limit);
    let mut sim = Sim::new(ClientConfig::discord(), api);
    let n = 10_000;
    let took = drain(&mut sim, &routes, n);
    assert_eq!(sim.api.counts.bucket_429, 0);
    assert_eq!(sim.api.counts.global_429, 0);
    assert_eq!(sim.retries, 0);
    // Each of the 20 limits serves 500 requests, 5 per 4 s window starting at its first
    // request: the last can start 99 windows after the first. The client learns which of
    // the 200 routes share a bucket as it goes (one pioneer at a time per major
    // parameter), so the first half minute runs below the limits.
    let least = 99.0 * 4.0;
    near_the_limit("bucket-bound", took, least);
}

#[test]
fn global_bound_traffic_gets_no_429_and_nearly_all_it_may() {
    let mut api = MockApi::new(50);
    let limit = Limit {
        limit: 10,
        window: SECOND,
    };
    let routes = routes(&mut api, limit);
    let mut sim = Sim::new(ClientConfig::discord(), api);
    let n = 10_000;
    let took = drain(&mut sim, &routes, n);
    assert_eq!(
        (sim.api.counts.bucket_429, sim.api.counts.global_429),
        (0, 0)
    );
    // 50 per second.
    let least = n as f64 / 50.0;
    near_the_limit("global-bound", took, least);
}

#[test]
fn one_pioneer_per_unknown_bucket_then_the_queue_moves_to_the_learned_bucket() {
    let mut api = MockApi::new(50);
    let a = Route::discord("POST", "/channels/1/messages");
    let b = Route::discord("PATCH", "/channels/1/messages/9");
    api.route(
        &a,
        "shared-id",
        Limit {
            limit: 3,
            window: SECOND,
        },
    );
    api.route(
        &b,
        "shared-id",
        Limit {
            limit: 3,
            window: SECOND,
        },
    );
    let mut sim = Sim::new(ClientConfig::new(), api);
    for _ in 0..3 {
        sim.submit(&a, None).unwrap();
    }
    let go = sim.core.poll(sim.now).go;
    assert_eq!(go.len(), 1, "one pioneer while the bucket is unknown");
    // Requeue the pioneer through the simulation.
    sim.sent.push((go[0], sim.now));
    sim.at(sim.now + LATENCY, Ev::Arrive(go[0]));
    // Route b learns the same bucket id: both routes then share its 3 per second.
    for _ in 0..3 {
        sim.submit(&b, None).unwrap();
    }
    sim.run(u64::MAX);
    assert_eq!(sim.done.len(), 6);
    assert_eq!(sim.api.counts.bucket_429, 0);
}

#[test]
fn headerless_global_429_pauses_everything_and_requeues_the_request() {
    let mut api = MockApi::new(50);
    let a = Route::discord("GET", "/channels/1/pins");
    let b = Route::discord("GET", "/guilds/2/roles");
    api.route(
        &a,
        "ba",
        Limit {
            limit: 10,
            window: SECOND,
        },
    );
    api.route(
        &b,
        "bb",
        Limit {
            limit: 10,
            window: SECOND,
        },
    );
    api.inject(&a, Inject::HeaderlessGlobal429(2));
    let mut sim = Sim::new(ClientConfig::discord(), api);
    let first = sim.submit(&a, None).unwrap();
    sim.run(T0 + 10 * LATENCY);
    assert_eq!(sim.retries, 1, "requeued, not failed");
    assert!(sim.done.is_empty());
    let refused_at = sim.now;
    sim.submit(&b, None).unwrap();
    sim.run(u64::MAX);
    assert_eq!(sim.done.len(), 2);
    assert!(sim.done.iter().all(|d| d.1 == 200));
    // Nothing was sent during the two seconds' pause.
    let resent = sim.sent.iter().filter(|s| s.0 == first).nth(1).unwrap().1;
    let b_sent = sim.sent.iter().find(|s| s.0 != first).unwrap().1;
    assert!(
        resent >= T0 + 2 * LATENCY + 2 * SECOND,
        "resent at {}",
        resent - T0
    );
    assert!(b_sent >= T0 + 2 * LATENCY + 2 * SECOND && b_sent > refused_at);
}

#[test]
fn a_502_without_headers_releases_the_pioneer_after_a_backoff() {
    let mut api = MockApi::new(50);
    let a = Route::discord("GET", "/channels/1/pins");
    api.route(
        &a,
        "ba",
        Limit {
            limit: 10,
            window: SECOND,
        },
    );
    api.inject(&a, Inject::BadGateway);
    let mut sim = Sim::new(ClientConfig::new(), api);
    for _ in 0..4 {
        sim.submit(&a, None).unwrap();
    }
    sim.run(u64::MAX);
    assert_eq!(sim.done.len(), 4, "the queue moved on");
    let statuses: Vec<u16> = sim.done.iter().map(|d| d.1).collect();
    assert_eq!(statuses.iter().filter(|&&s| s == 502).count(), 1);
    // The next pioneer went a backoff (1 s) after the 502 came back.
    let second = sim.sent[1].1;
    assert_eq!(second, T0 + 2 * LATENCY + SECOND);
}

#[test]
fn a_dropped_connection_fails_only_its_request() {
    let mut core = ClientCore::new(ClientConfig::new());
    let a = Route::discord("GET", "/channels/1/pins");
    let first = core.submit(a.clone(), T0, None).unwrap();
    let second = core.submit(a.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![first]);
    core.failed(first, T0);
    // Only that request failed; its pioneer slot is free, and the next request becomes the
    // pioneer after a short backoff (as after a 502 without headers), not hammering a
    // failing route.
    assert!(core.poll(T0 + 1).go.is_empty());
    assert_eq!((core.waiting(), core.in_flight()), (1, 0));
    assert_eq!(core.poll(T0 + SECOND).go, vec![second]);
    assert_eq!((core.waiting(), core.in_flight()), (0, 1));
}

#[test]
fn second_review_cases() {
    let seen = |bucket: &str, left: u64| Observation {
        bucket: Some(bucket.into()),
        limit: Some(4),
        remaining: Some(left),
        reset_after: Some(Duration::from_secs(10)),
        ..Observation::default()
    };
    // A pioneer that lands on a known bucket counts against our tally too, whatever the
    // server's count says (here it overtook a request still on its way).
    let mut core = ClientCore::new(ClientConfig::discord());
    let a = Route::discord("GET", "/channels/1/a");
    let b = Route::discord("GET", "/channels/1/b");
    let a1 = core.submit(a.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![a1]);
    core.complete(a1, 200, &seen("x", 3), T0 + 1_000);
    // (Discord's global limit spaces requests 20 ms apart.)
    let a2 = core.submit(a.clone(), T0 + 20_000, None).unwrap();
    assert_eq!(core.poll(T0 + 20_000).go, vec![a2]);
    let b1 = core.submit(b.clone(), T0 + 40_000, None).unwrap();
    let a3 = core.submit(a.clone(), T0 + 40_000, None).unwrap();
    let go = core.poll(T0 + 40_000).go;
    assert_eq!(
        go,
        vec![b1],
        "the pioneer goes, a3 keeps the last call back"
    );
    core.complete(b1, 200, &seen("x", 2), T0 + 50_000);
    let go = core.poll(T0 + 60_000).go;
    assert_eq!(go, vec![a3]);
    let a4 = core.submit(a.clone(), T0 + 60_000, None).unwrap();
    assert!(
        !core.poll(T0 + 100_000).go.contains(&a4),
        "a1, a2, b1 and a3 spend the 4 calls"
    );

    // A request whose answer never comes holds its bucket for one further window at most.
    let mut core = ClientCore::new(ClientConfig::new());
    let r = Route::discord("GET", "/guilds/5");
    let one = |left: u64| Observation {
        bucket: Some("g".into()),
        limit: Some(1),
        remaining: Some(left),
        reset_after: Some(Duration::from_secs(1)),
        ..Observation::default()
    };
    let first = core.submit(r.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![first]);
    core.complete(first, 200, &one(0), T0);
    let leaked = core.submit(r.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0 + SECOND).go, vec![leaked]);
    let next = core.submit(r.clone(), T0 + SECOND, None).unwrap();
    let p = core.poll(T0 + 2 * SECOND);
    assert!(
        p.go.is_empty() && p.next.is_some(),
        "{p:?}: waits, with a time to wake"
    );
    assert_eq!(core.poll(T0 + 3 * SECOND).go, vec![next]);

    // Pioneers failing on connection errors back off and do not starve a known bucket of
    // limit 1.
    let mut core = ClientCore::new(ClientConfig::discord());
    let react = Route::discord("PUT", "/channels/1/messages/2/reactions/x/@me");
    let pins = Route::discord("GET", "/channels/1/pins");
    let r0 = core.submit(react.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![r0]);
    let limit1 = Observation {
        bucket: Some("react".into()),
        limit: Some(1),
        remaining: Some(0),
        reset_after: Some(Duration::from_millis(250)),
        ..Observation::default()
    };
    core.complete(r0, 204, &limit1, T0);
    for _ in 0..50 {
        core.submit(pins.clone(), T0, None).unwrap();
    }
    let mut reacted = 0;
    let mut reactions = std::collections::HashSet::new();
    let mut now = T0;
    for _ in 0..20 {
        reactions.insert(core.submit(react.clone(), now, None).unwrap());
        now += 300_000;
        for id in core.poll(now).go {
            if reactions.contains(&id) {
                reacted += 1;
                core.complete(id, 204, &limit1, now);
            } else {
                // The pins route's connection keeps breaking.
                core.failed(id, now);
            }
        }
    }
    assert!(
        reacted >= 10,
        "the limit-1 bucket went {reacted} times in 20 windows"
    );
}

#[test]
fn a_cancelled_request_gives_back_what_it_held() {
    let config = ClientConfig::new().global("gcra:rate=1/s,burst=1".parse().unwrap());
    let mut core = ClientCore::new(config);
    let a = Route::discord("GET", "/channels/1/pins");
    let b = Route::discord("GET", "/channels/2/pins");
    let first = core.submit(a.clone(), T0, None).unwrap();
    let waiting = core.submit(a.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![first]);
    // A waiting request leaves its queue.
    core.cancel(waiting, false, T0);
    assert_eq!(core.waiting(), 0);
    // The pioneer, cancelled before it was sent: its pioneer slot and its global token
    // come back, so another request goes now instead of a second later.
    core.cancel(first, false, T0);
    let other = core.submit(b.clone(), T0, None).unwrap();
    let again = core.submit(a.clone(), T0, None).unwrap();
    let go = core.poll(T0).go;
    assert_eq!(go.len(), 1, "one global token, given back once: {go:?}");
    assert!(go[0] == other || go[0] == again);
    // A sent request keeps its token.
    let sent = go[0];
    core.cancel(sent, true, T0);
    let next = core.poll(T0 + 1);
    assert!(next.go.is_empty(), "the token was spent: {next:?}");
    assert!(next.next.unwrap() >= T0 + SECOND);
}

#[test]
fn max_wait_fails_at_once_when_the_wait_is_known_and_at_the_deadline_when_not() {
    let mut core = ClientCore::new(ClientConfig::new());
    let a = Route::discord("GET", "/channels/1/pins");
    let first = core.submit(a.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![first]);
    // Behind a pioneer the wait is unknown: the request waits, and fails at its deadline.
    let unknown = core
        .submit(a.clone(), T0, Some(Duration::from_secs(1)))
        .unwrap();
    let p = core.poll(T0 + SECOND);
    assert_eq!(
        p.failed,
        vec![(
            unknown,
            ClientError::WaitExceeded {
                max_wait: Duration::from_secs(1),
                would_wait: None
            }
        )]
    );
    // The pioneer learns: nothing left for 5 s.
    let seen = Observation {
        bucket: Some("b".into()),
        limit: Some(5),
        remaining: Some(0),
        reset_after: Some(Duration::from_secs(5)),
        ..Observation::default()
    };
    assert_eq!(
        core.complete(first, 200, &seen, T0 + SECOND),
        Completion::Done
    );
    let err = core
        .submit(a.clone(), T0 + SECOND, Some(Duration::from_secs(1)))
        .unwrap_err();
    assert_eq!(
        err,
        ClientError::WaitExceeded {
            max_wait: Duration::from_secs(1),
            would_wait: Some(Duration::from_secs(5))
        }
    );
    assert!(err.to_string().contains("max_wait"), "{err}");
    // Within its deadline, it waits and goes at the reset.
    let ok = core
        .submit(a.clone(), T0 + SECOND, Some(Duration::from_secs(6)))
        .unwrap();
    assert!(core.poll(T0 + SECOND).go.is_empty());
    assert_eq!(core.poll(T0 + 6 * SECOND).go, vec![ok]);
}

#[test]
fn the_invalid_request_budget_fails_fast_when_spent() {
    let config =
        ClientConfig::new().invalid_budget("fixed_window:limit=3,window=10m".parse().unwrap());
    let mut core = ClientCore::new(config);
    let a = Route::discord("GET", "/guilds/1");
    let shared = Observation {
        refusal: Some(paceline_client::headers::Refusal {
            scope: Scope::Shared,
            retry_after: Some(Duration::from_millis(1)),
        }),
        ..Observation::default()
    };
    let mut now = T0;
    // Shared-scope 429s do not count.
    for _ in 0..5 {
        let id = core.submit(a.clone(), now, None).unwrap();
        now += 10_000;
        assert_eq!(core.poll(now).go, vec![id]);
        core.complete(id, 429, &shared, now);
        now += 10_000;
        let again = core.poll(now).go;
        assert_eq!(again, vec![id]);
        core.complete(id, 200, &Observation::default(), now);
    }
    // Three 401s spend it.
    for _ in 0..3 {
        let id = core.submit(a.clone(), now, None).unwrap();
        assert_eq!(core.poll(now).go, vec![id]);
        assert_eq!(
            core.complete(id, 401, &Observation::default(), now),
            Completion::Done
        );
    }
    let err = core.submit(a.clone(), now, None).unwrap_err();
    assert!(
        matches!(err, ClientError::InvalidBudget { retry_after } if retry_after > Duration::ZERO)
    );
    assert!(err.to_string().contains("invalid-request budget"));
}

#[test]
fn a_refusal_without_retry_after_backs_off_60_s_then_doubles() {
    let mut core = ClientCore::new(ClientConfig::new());
    let a = Route::generic("POST", "/repos/o/r/issues");
    let id = core.submit(a.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![id]);
    let mut h = HeaderMap::new();
    h.insert("x-ratelimit-remaining", "100".parse().unwrap());
    let body = br#"{"message":"You have exceeded a secondary rate limit"}"#;
    let seen = GitHub.read(&Response::new(403, &h).with_body(body), T0);
    assert_eq!(core.complete(id, 403, &seen, T0), Completion::Retry);
    assert!(core.poll(T0 + 60 * SECOND - 1).go.is_empty());
    assert_eq!(core.poll(T0 + 60 * SECOND).go, vec![id]);
    let t1 = T0 + 60 * SECOND;
    assert_eq!(core.complete(id, 403, &seen, t1), Completion::Retry);
    assert!(core.poll(t1 + 120 * SECOND - 1).go.is_empty());
    assert_eq!(core.poll(t1 + 120 * SECOND).go, vec![id]);
}

#[test]
fn a_request_refused_more_than_max_retries_times_is_the_callers() {
    let mut core = ClientCore::new(ClientConfig::new());
    let a = Route::generic("GET", "/x");
    let id = core.submit(a, T0, None).unwrap();
    let mut h = HeaderMap::new();
    h.insert("retry-after", "1".parse().unwrap());
    let mut now = T0;
    for round in 0..=3 {
        assert_eq!(core.poll(now).go, vec![id], "round {round}");
        let seen = paceline_client::headers::RetryAfter.read(&Response::new(429, &h), now);
        let c = core.complete(id, 429, &seen, now);
        assert_eq!(
            c,
            if round < 3 {
                Completion::Retry
            } else {
                Completion::Done
            }
        );
        now += SECOND;
    }
    assert_eq!(core.waiting() + core.in_flight(), 0);
}

#[test]
fn idle_buckets_and_routes_are_forgotten() {
    let mut core = ClientCore::new(ClientConfig::new());
    let seen = |bucket: String| Observation {
        bucket: Some(bucket),
        limit: Some(5),
        remaining: Some(4),
        reset_after: Some(Duration::from_secs(1)),
        ..Observation::default()
    };
    let mut now = T0;
    for i in 0..200u64 {
        let route = Route::generic("GET", &format!("/things/{i}/x{i}"));
        let id = core.submit(route, now, None).unwrap();
        assert_eq!(core.poll(now).go, vec![id]);
        core.complete(id, 200, &seen(format!("b{i}")), now);
        now += 1_000;
    }
    assert_eq!(core.buckets_held(), 200);
    // Asked about no more for 10 s, two windows after their reset, a poll drops them all:
    // nothing waits, their knowledge is stale.
    core.poll(now + 11 * SECOND);
    assert_eq!(core.buckets_held(), 0);
}

#[test]
fn review_cases() {
    // A remaining of u64::MAX in a header does not overflow.
    let mut core = ClientCore::new(ClientConfig::new());
    let a = Route::discord("GET", "/channels/1/pins");
    let id = core.submit(a.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![id]);
    let huge = Observation {
        bucket: Some("h".into()),
        remaining: Some(u64::MAX),
        reset_after: Some(Duration::from_secs(1)),
        ..Observation::default()
    };
    assert_eq!(core.complete(id, 200, &huge, T0), Completion::Done);
}

#[test]
fn a_limit_1_bucket_is_not_starved_by_an_unknown_route_in_backoff() {
    let mut core = ClientCore::new(ClientConfig::discord());
    let reactions = Route::discord("PUT", "/channels/1/messages/2/reactions/x/@me");
    let pins = Route::discord("GET", "/channels/1/pins");
    let r = core.submit(reactions.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![r]);
    let one = Observation {
        bucket: Some("react".into()),
        limit: Some(1),
        remaining: Some(0),
        reset_after: Some(Duration::from_millis(250)),
        ..Observation::default()
    };
    core.complete(r, 204, &one, T0 + 1_000);
    // pins: its pioneer gets 502s without headers, so it stays unknown and backs off.
    let mut now = T0 + 300_000;
    let p = core.submit(pins.clone(), now, None).unwrap();
    let go = core.poll(now).go;
    assert_eq!(go, vec![p]);
    core.complete(p, 502, &Observation::default(), now);
    let p2 = core.submit(pins, now, None).unwrap();
    let mut reacted = 0;
    for _ in 0..8 {
        core.submit(reactions.clone(), now, None).unwrap();
        now += 300_000;
        for id in core.poll(now).go {
            if id == p2 {
                core.failed(p2, now);
            } else {
                reacted += 1;
                let spent = Observation {
                    remaining: Some(0),
                    ..one.clone()
                };
                core.complete(id, 204, &spent, now);
            }
        }
    }
    assert!(
        reacted >= 6,
        "the limit-1 bucket went {reacted} times in 8 windows"
    );
}

#[test]
fn the_servers_word_on_a_new_window_ends_local_pacing() {
    let mut core = ClientCore::new(ClientConfig::new());
    let a = Route::discord("GET", "/guilds/3/roles");
    let seen = |left: u64, reset_ms: u64| Observation {
        bucket: Some("r".into()),
        limit: Some(5),
        remaining: Some(left),
        reset_after: Some(Duration::from_millis(reset_ms)),
        ..Observation::default()
    };
    let id = core.submit(a.clone(), T0, None).unwrap();
    assert_eq!(core.poll(T0).go, vec![id]);
    core.complete(id, 200, &seen(0, 5_000), T0);
    // The reset passes: one request goes (paced), its answer says 4 are left in a new
    // window: the four waiting go at once.
    let t = T0 + 5 * SECOND;
    let ids: Vec<_> = (0..5)
        .map(|_| core.submit(a.clone(), t, None).unwrap())
        .collect();
    assert_eq!(core.poll(t).go, vec![ids[0]]);
    core.complete(ids[0], 200, &seen(4, 5_000), t + 1_000);
    assert_eq!(core.poll(t + 1_000).go, ids[1..].to_vec());
}

#[test]
fn generic_routes_discover_several_at_once() {
    let mut core = ClientCore::new(ClientConfig::new());
    for name in ["ann", "bob", "cy", "di"] {
        core.submit(Route::generic("GET", &format!("/users/{name}")), T0, None)
            .unwrap();
    }
    assert_eq!(core.poll(T0).go.len(), 4);
}

#[test]
fn a_refusal_whose_pause_ends_past_the_deadline_is_the_callers() {
    let mut core = ClientCore::new(ClientConfig::new());
    let a = Route::generic("GET", "/x");
    let id = core.submit(a, T0, Some(Duration::from_secs(1))).unwrap();
    assert_eq!(core.poll(T0).go, vec![id]);
    let mut h = HeaderMap::new();
    h.insert("retry-after", "5".parse().unwrap());
    let seen = paceline_client::headers::RetryAfter.read(&Response::new(429, &h), T0);
    // Refused at once, with 5 s to wait against a deadline 1 s away.
    assert_eq!(core.complete(id, 429, &seen, T0 + 10), Completion::Done);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Whatever the layout of routes over buckets, the limits, the latency, when the
    /// requests come and which failures the mock injects: every request is answered
    /// exactly once, none is refused by the mock's limits, only injected failures reach
    /// the caller, and nothing is left in the core.
    #[test]
    fn any_traffic_is_answered_once_without_429(
        majors in 1u64..=3,
        templates in 1usize..=10,
        ids in 1usize..=4,
        limit in 1u64..=6,
        window_ms in 50u64..=3_000,
        global in 20u64..=100,
        latency_us in 200u64..=20_000,
        arrivals in proptest::collection::vec((0usize..1000, 0u64..5_000), 1..120),
        injected in proptest::collection::vec((0usize..1000, 0u8..3), 0..4),
    ) {
        let mut api = MockApi::new(global);
        let mut routes = Vec::new();
        for major in 0..majors {
            for t in 0..templates {
                let route = Route::discord("POST", &format!("/channels/{}/t{t}", 100 + major));
                api.route(&route, &format!("b{}", t % ids), Limit { limit, window: window_ms * 1_000 });
                routes.push(route);
            }
        }
        // Failures on purpose: a headerless global 429, a 502 without headers, a shared
        // 429; they may be answered as they are, but never lose or repeat a request.
        for (pick, kind) in injected {
            let what = match kind {
                0 => Inject::HeaderlessGlobal429(1),
                1 => Inject::BadGateway,
                _ => Inject::Shared429(1),
            };
            api.inject(&routes[pick % routes.len()], what);
        }
        let config = ClientConfig::discord()
            .global(format!("gcra:rate={global}/s,burst=1").parse().unwrap());
        let mut sim = Sim::new(config, api);
        sim.latency = latency_us;
        let n = arrivals.len();
        for (pick, at_ms) in arrivals {
            let route = routes[pick % routes.len()].clone();
            sim.at(T0 + at_ms * 1_000, Ev::Submit(route));
        }
        sim.run(u64::MAX);
        proptest::prop_assert_eq!(sim.done.len(), n);
        let mut ids: Vec<_> = sim.done.iter().map(|d| d.0).collect();
        ids.sort_unstable();
        ids.dedup();
        proptest::prop_assert_eq!(ids.len(), n);
        let own_failures = sim.done.iter().filter(|d| d.1 != 200).count() as u64;
        proptest::prop_assert!(own_failures <= sim.api.counts.injected);
        proptest::prop_assert_eq!(sim.api.counts.bucket_429, 0);
        proptest::prop_assert_eq!(sim.api.counts.global_429, 0);
        proptest::prop_assert_eq!(sim.core.waiting() + sim.core.in_flight(), 0);
    }
}
