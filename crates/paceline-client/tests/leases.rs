//! Sends leased ahead and answers told with the next call ([`Leases`]), on a knowledge in
//! memory and in Redis, on an injected clock:
//!
//! - requests of a bucket without limit go on leased sends, one call per five requests,
//!   their answers told with the next call (and every one told, every send given back,
//!   when the process finishes);
//! - an answer with limits, and a refusal, are told at once and give every leased send
//!   back;
//! - a dead process's leased sends hold a bucket only until the in-flight lease ends;
//! - two processes leasing sends of a bucket that turns out limited admit no more than
//!   its window allows.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use paceline_client::headers::{Observation, Refusal, Scope};
use paceline_client::knowledge::leases::LEASE_MAX;
use paceline_client::knowledge::{Ask, Knowledge, Leases, Plan, RoundAnswer};
use paceline_client::redis::RedisKnowledge;
use paceline_client::{ClientConfig, ClientCore, Completion, Event, RequestId, Route};
use paceline_testkit::{connect, shared_server, unique_name};

const T0: u64 = 1_700_000_000_000_000;
const MS: u64 = 1_000;

/// Where a process's knowledge is.
enum Brain {
    Memory(Rc<RefCell<Knowledge>>),
    Redis(RedisKnowledge),
}

/// A shared core, its leases and its knowledge: one process.
struct Process {
    core: ClientCore,
    leases: Leases,
    brain: Brain,
    /// Calls made to the knowledge.
    calls: usize,
}

impl Process {
    fn memory(config: &ClientConfig) -> Process {
        Process {
            core: ClientCore::shared(config.clone()),
            leases: Leases::new(),
            brain: Brain::Memory(Rc::new(RefCell::new(Knowledge::new(config.clone())))),
            calls: 0,
        }
    }

    async fn redis(config: &ClientConfig, identity: &str) -> Process {
        let store = connect(&shared_server().url()).await;
        Process {
            core: ClientCore::shared(config.clone()),
            leases: Leases::new(),
            brain: Brain::Redis(RedisKnowledge::new(store, identity, config).on_caller_clock()),
            calls: 0,
        }
    }

    /// One round through the leases: answered here or by one call.
    async fn round(
        &mut self,
        events: &[Event],
        asks: &[Ask],
        now: u64,
        finish: bool,
    ) -> RoundAnswer {
        match self.leases.plan(events, asks, now, finish) {
            Plan::Local(answer) => answer,
            Plan::Call(call) => {
                self.calls += 1;
                let answer = match &mut self.brain {
                    Brain::Memory(k) => k.borrow_mut().round(None, call.events(), call.asks(), now),
                    Brain::Redis(r) => r
                        .round(call.events(), call.asks(), now)
                        .await
                        .expect("Redis answers"),
                };
                self.leases
                    .settle(call, Ok::<_, ()>(answer))
                    .expect("answered")
            }
        }
    }

    /// Tells what happened and asks what may go until nothing more goes now (a queue
    /// refiled under its route's learned bucket asks again at once); answers the requests
    /// that go, and when the first request left waiting would go.
    async fn poll(&mut self, now: u64) -> (Vec<RequestId>, Option<u64>) {
        let mut go = Vec::new();
        for _ in 0..4 {
            let events = self.core.take_events();
            let asks = self.core.asks(now);
            let (_, admission) = self.round(&events, &asks.asks, now, false).await;
            let poll = self.core.granted(asks, admission, now);
            go.extend(poll.go);
            if poll.next.is_none_or(|t| t > now) {
                return (go, poll.next);
            }
        }
        (go, Some(now))
    }

    /// Tells everything held and gives every leased send back.
    async fn finish(&mut self, now: u64) {
        let events = self.core.take_events();
        let _ = self.round(&events, &[], now, true).await;
        assert_eq!((self.leases.held(), self.leases.deferred()), (0, 0));
    }

    fn complete(&mut self, id: RequestId, status: u16, seen: &Observation, now: u64) {
        assert_eq!(
            self.core.complete(id, status, seen, now),
            Completion::Done,
            "no request is refused here but on purpose"
        );
    }

    /// What the knowledge in memory knows of each bucket.
    fn views(&self, now: u64) -> Vec<paceline_client::knowledge::BucketView> {
        match &self.brain {
            Brain::Memory(k) => k.borrow().buckets(now),
            Brain::Redis(_) => panic!("a look at the knowledge is for memory"),
        }
    }

    /// A second process sharing this one's knowledge.
    async fn sibling(&self, config: &ClientConfig, identity: &str) -> Process {
        match &self.brain {
            Brain::Memory(k) => Process {
                core: ClientCore::shared(config.clone()),
                leases: Leases::new(),
                brain: Brain::Memory(Rc::clone(k)),
                calls: 0,
            },
            Brain::Redis(_) => Process::redis(config, identity).await,
        }
    }
}

/// The configuration of these tests: a global limit that never binds here.
fn config() -> ClientConfig {
    ClientConfig::discord().global("gcra:rate=1000/s,burst=100".parse().expect("a policy"))
}

/// A route whose answers name no bucket (as most APIs' do).
fn search() -> Route {
    Route::generic("GET", "/search")
}

/// `left` of `limit` calls, resetting in `reset`; no bucket named.
fn limited(limit: u64, left: u64, reset: Duration) -> Observation {
    Observation {
        limit: Some(limit),
        remaining: Some(left),
        reset_after: Some(reset),
        ..Observation::default()
    }
}

/// Submits one request of `route` at `now` and polls: answers it if it went.
async fn one(p: &mut Process, route: &Route, now: u64) -> Option<RequestId> {
    let id = p.core.submit(route.clone(), now, None).expect("submitted");
    let (go, _) = p.poll(now).await;
    assert!(go.len() <= 1);
    go.first().map(|&g| {
        assert_eq!(g, id);
        g
    })
}

/// A process whose route `search` is known to have no limit, at `now`: its pioneer went
/// and answered.
async fn learned(p: &mut Process, now: u64) {
    let id = one(p, &search(), now).await.expect("the pioneer goes");
    assert_eq!(p.leases.held(), 0, "nothing is leased before an answer");
    p.complete(id, 200, &Observation::default(), now + MS);
}

#[tokio::test(flavor = "current_thread")]
async fn requests_of_a_bucket_without_limit_go_on_leased_sends_and_their_answers_ride_the_next_call(
) {
    for redis in [false, true] {
        let mut p = if redis {
            Process::redis(&config(), &unique_name("lease")).await
        } else {
            Process::memory(&config())
        };
        let mut now = T0;
        learned(&mut p, now).await;
        assert_eq!(p.calls, 1);
        now += MS;
        // Then one call admits a request and leases four sends ahead; the next four go on
        // them, without a call, their answers held for the next call.
        let n = 20;
        for i in 0..n {
            now += MS;
            let id = one(&mut p, &search(), now).await.expect("goes at once");
            assert_eq!(p.calls, 2 + i / (LEASE_MAX + 1), "request {i}");
            assert_eq!(
                p.leases.held(),
                LEASE_MAX - i % (LEASE_MAX + 1),
                "request {i}"
            );
            now += MS;
            p.complete(id, 200, &Observation::default(), now);
        }
        assert_eq!(p.calls, 1 + n / (LEASE_MAX + 1));
        let (held, deferred) = (p.leases.held(), p.leases.deferred());
        assert!(deferred > 0, "the last answers wait for a call");
        if !redis {
            // In flight for the knowledge: the answers not told (the last one is still
            // the core's) and the sends leased.
            let views = p.views(now);
            assert_eq!(views.len(), 1);
            assert_eq!(views[0].in_flight, deferred + 1 + held, "{views:?}");
        }
        // Finishing tells every answer held and gives every send back, in one call.
        now += MS;
        p.finish(now).await;
        assert_eq!(p.calls, 2 + n / (LEASE_MAX + 1));
        if !redis {
            assert_eq!(p.views(now)[0].in_flight, 0);
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_round_that_asks_nothing_tells_the_answers_held() {
    let mut p = Process::memory(&config());
    let mut now = T0;
    learned(&mut p, now).await;
    for _ in 0..3 {
        now += MS;
        let id = one(&mut p, &search(), now).await.expect("goes");
        p.complete(id, 200, &Observation::default(), now + MS);
    }
    assert_eq!(p.leases.deferred(), 2);
    let calls = p.calls;
    // Nothing waits: the last answer goes in a call of its own, with those held.
    now += 2 * MS;
    let (go, _) = p.poll(now).await;
    assert!(go.is_empty());
    assert_eq!((p.calls, p.leases.deferred()), (calls + 1, 0));
    // The sends leased stay for the next requests, until they are kept too long.
    assert_eq!(p.leases.held(), LEASE_MAX - 2);
    assert_eq!(p.views(now)[0].in_flight, LEASE_MAX - 2);
}

#[tokio::test(flavor = "current_thread")]
async fn an_answer_with_limits_is_told_at_once_and_gives_the_leased_sends_back() {
    let mut p = Process::memory(&config());
    let mut now = T0;
    learned(&mut p, now).await;
    now += MS;
    let id = one(&mut p, &search(), now).await.expect("goes");
    assert_eq!(p.leases.held(), LEASE_MAX);
    let calls = p.calls;
    // The route turns out limited: 2 calls left of 10 for a minute.
    now += MS;
    p.complete(id, 200, &limited(10, 2, Duration::from_secs(60)), now);
    let next = one(&mut p, &search(), now).await;
    assert!(next.is_some(), "one of the 2 left");
    assert_eq!(
        (p.calls, p.leases.held()),
        (calls + 1, 0),
        "told at once, sends back"
    );
    let view = &p.views(now)[0];
    assert_eq!(
        (view.limit, view.remaining, view.in_flight),
        (Some(10), Some(1), 1),
        "{view:?}"
    );
    // And no more is leased of it.
    now += MS;
    let second = one(&mut p, &search(), now).await;
    assert!(second.is_some());
    assert_eq!(p.leases.held(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn a_refusal_is_told_at_once_and_gives_every_leased_send_back() {
    let mut p = Process::memory(&config());
    let mut now = T0;
    learned(&mut p, now).await;
    now += MS;
    let id = one(&mut p, &search(), now).await.expect("goes");
    assert_eq!(p.leases.held(), LEASE_MAX);
    let calls = p.calls;
    now += MS;
    let refused = Observation {
        refusal: Some(Refusal {
            scope: Scope::Global,
            retry_after: Some(Duration::from_secs(1)),
        }),
        ..Observation::default()
    };
    assert_eq!(p.core.complete(id, 429, &refused, now), Completion::Retry);
    let (go, next) = p.poll(now).await;
    assert!(go.is_empty(), "the retry waits out the refusal");
    assert!(next.is_some_and(|t| t >= now + 900 * MS), "{next:?}");
    assert_eq!((p.calls, p.leases.held()), (calls + 1, 0));
    assert_eq!(p.views(now)[0].in_flight, 0, "every send given back");
}

/// A process leases sends of `search` (no limit) at T0 and dies holding them (and its
/// request). A second then learns that the route is limited (10 a second) and spends the
/// window. Answers what the second is told 1.02 s later, past the window but before a
/// further one, on a knowledge in Redis or in memory, with an in-flight lease of `lease`.
async fn after_a_dead_lease(redis: bool, lease: Duration) -> (usize, Option<u64>) {
    let mut config = config();
    config.in_flight_lease = lease;
    let identity = unique_name("dead");
    let mut a = if redis {
        Process::redis(&config, &identity).await
    } else {
        Process::memory(&config)
    };
    let mut b = a.sibling(&config, &identity).await;
    let second = Duration::from_secs(1);
    let mut now = T0;
    learned(&mut a, now).await;
    now += MS;
    one(&mut a, &search(), now).await.expect("goes");
    assert_eq!(a.leases.held(), LEASE_MAX);
    drop(a);
    // The second's request goes (the route has no limit, as far as anyone knows); its
    // answer says 9 of 10 are left this second, which the dead process's requests may
    // still be spending.
    now += MS;
    let id = one(&mut b, &search(), now).await.expect("goes");
    now += MS;
    b.complete(id, 200, &limited(10, 9, second), now);
    for _ in 0..10 {
        b.core.submit(search(), now, None).expect("submitted");
    }
    let (go, _) = b.poll(now).await;
    assert_eq!(
        go.len(),
        9 - 1 - LEASE_MAX,
        "the dead process's requests count"
    );
    for (i, id) in go.into_iter().enumerate() {
        b.complete(id, 200, &limited(10, 8 - i as u64, second), now);
    }
    b.finish(now).await;
    let reset = now + 1_000 * MS;
    let (go, next) = b.poll(reset + 20 * MS).await;
    (go.len(), next)
}

#[tokio::test(flavor = "current_thread")]
async fn a_dead_process_leased_sends_hold_a_bucket_only_until_the_in_flight_lease_ends() {
    for redis in [false, true] {
        // Within the lease its requests may still be on their way: the window is not
        // assumed over until a further one has passed.
        let (go, next) = after_a_dead_lease(redis, Duration::from_secs(60)).await;
        assert_eq!(go, 0, "redis {redis}");
        assert_eq!(next, Some(T0 + 3 * MS + 2_000 * MS), "redis {redis}");
        // Past the lease they are forgotten: the window is over, its releases start.
        let (go, _) = after_a_dead_lease(redis, Duration::from_secs(1)).await;
        assert!(go >= 1, "redis {redis}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn two_processes_leasing_a_bucket_that_turns_out_limited_admit_no_more_than_its_window() {
    let identity = unique_name("two");
    let mut ps = [
        Process::redis(&config(), &identity).await,
        Process::redis(&config(), &identity).await,
    ];
    let window = Duration::from_secs(600);
    // The server: no limit for its first 12 requests, then a window of 20 calls, which
    // it says.
    const FREE: u64 = 12;
    const LIMIT: u64 = 20;
    let mut seen = 0;
    let mut accepted = 0;
    let mut refused = 0;
    let mut serve = || {
        seen += 1;
        if seen <= FREE {
            accepted += 1;
            return (200, Observation::default());
        }
        let counted = seen - FREE;
        if counted > LIMIT {
            refused += 1;
            let mut o = limited(LIMIT, 0, window);
            o.refusal = Some(Refusal {
                scope: Scope::Bucket,
                retry_after: Some(window),
            });
            (429, o)
        } else {
            accepted += 1;
            (200, limited(LIMIT, LIMIT - counted, window))
        }
    };
    let mut now = T0;
    learned(&mut ps[0], now).await;
    let _ = serve();
    // The processes take turns, one request each; answers come two requests late, so
    // requests are always in flight.
    let mut flying: Vec<(usize, RequestId)> = Vec::new();
    let mut calls_while_free = 0;
    for i in 0..80 {
        if i == FREE as usize - 2 {
            calls_while_free = ps.iter().map(|p| p.calls).sum();
        }
        now += MS;
        let p = i % 2;
        if let Some(id) = one(&mut ps[p], &search(), now).await {
            flying.push((p, id));
        }
        if flying.len() > 2 {
            let (q, id) = flying.remove(0);
            let (status, seen) = serve();
            let _ = ps[q].core.complete(id, status, &seen, now);
        }
    }
    for (q, id) in flying {
        let (status, seen) = serve();
        let _ = ps[q].core.complete(id, status, &seen, now);
    }
    assert_eq!(refused, 0, "no request beyond the window's");
    assert!(
        accepted >= FREE + LIMIT - 4,
        "{accepted}: the window's calls went"
    );
    // While the route had no limit, most requests went on leased sends.
    assert!(
        calls_while_free <= 6,
        "{calls_while_free} calls for 10 requests"
    );
}
