//! Knowledge shared through Redis.
//!
//! - The twins: random sequences of submissions, polls, answers of every kind, failures,
//!   cancellations and clock steps, run by one core whose knowledge is in memory and ones
//!   whose knowledge is in Redis and in a Redis Cluster, on one virtual clock (the test
//!   kit's differential harness), give the same answers step by step; they make some of
//!   their calls twice under one call id (a lost answer), and a core in memory that never
//!   does answers the same too.
//! - A call made twice under one id admits, ends and learns once, and answers the same
//!   both times, in memory and in Redis alike.
//! - Four processes on one Redis (and on a Redis Cluster) against the strict mock API:
//!   every request answered once, no 429, nearly all the throughput the limits allow.
//! - The async client on Redis: two clients share what either learns.

mod common;
use common::minute_of_five;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use http::HeaderMap;
use paceline_client::headers::{Dialect, Discord, Observation, Refusal, Response, Scope};
use paceline_client::knowledge::{Ask, CallId, Knowledge, RoundAnswer, Wait};
use paceline_client::redis::RedisKnowledge;
use paceline_client::{
    After, Client, ClientConfig, ClientCore, ClientError, Completion, Event, Poll, RequestId, Route,
};
use paceline_store::redis::RedisStore;
use paceline_store::ManualClock;
use paceline_testkit::differential::{self, At, Cases, Differential, Redis, Tick};
use paceline_testkit::mock_api::{Limit, MockApi, SECOND};
use paceline_testkit::{connect, runtime, shared_cluster, shared_server, unique_name};
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000_000;
const LATENCY: u64 = 2_000;

/// Where a core's knowledge is.
enum Brain {
    Memory(Box<Knowledge>),
    Redis(RedisKnowledge),
    /// In Redis, through the process's leases (sends leased ahead, answers held).
    Leased(RedisKnowledge),
}

impl Brain {
    /// One round under the id `call`, made once.
    async fn round(
        &mut self,
        call: CallId,
        events: &[Event],
        asks: &[Ask],
        now: u64,
    ) -> RoundAnswer {
        match self {
            Brain::Memory(k) => k.round(Some(call), events, asks, now),
            Brain::Redis(r) => r
                .round_as(call, events, asks, now)
                .await
                .expect("Redis answers"),
            Brain::Leased(r) => r
                .round_leased(events, asks, now, false)
                .await
                .expect("Redis answers"),
        }
    }

    /// One round under the id `call`, made a second time when `twice` (as after a lost
    /// answer): the second answers as the first did.
    async fn round_twice(
        &mut self,
        call: CallId,
        events: &[Event],
        asks: &[Ask],
        now: u64,
        twice: bool,
    ) -> RoundAnswer {
        let first = self.round(call, events, asks, now).await;
        if twice {
            let again = self.round(call, events, asks, now).await;
            assert_eq!(again, first, "a call made again answers as it did");
        }
        first
    }
}

/// A shared core and its knowledge: one process.
struct Process {
    core: ClientCore,
    brain: Brain,
}

/// A call id no other call of this test binary has (processes of one identity must never
/// share one).
fn next_call() -> CallId {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    CallId::new(u128::from(
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    ))
}

impl Process {
    fn memory(config: &ClientConfig) -> Process {
        Process {
            core: ClientCore::shared(config.clone()),
            brain: Brain::Memory(Box::new(Knowledge::new(config.clone()))),
        }
    }

    fn redis(config: &ClientConfig, store: RedisStore, identity: &str) -> Process {
        Process {
            core: ClientCore::shared(config.clone()),
            brain: Brain::Redis(RedisKnowledge::new(store, identity, config).on_caller_clock()),
        }
    }

    /// Tells the knowledge what happened, in one call (made twice when `twice`); answers
    /// what it concluded of each answer.
    async fn tell_twice(&mut self, now: u64, twice: bool) -> Vec<Option<Taught>> {
        let events = self.core.take_events();
        if events.is_empty() {
            return Vec::new();
        }
        let call = next_call();
        let (answered, _) = self.brain.round_twice(call, &events, &[], now, twice).await;
        answered
            .into_iter()
            .map(|a| a.map(|a| (a.paused_until, a.warn)))
            .collect()
    }

    fn leased(config: &ClientConfig, store: RedisStore, identity: &str) -> Process {
        Process {
            core: ClientCore::shared(config.clone()),
            brain: Brain::Leased(RedisKnowledge::new(store, identity, config).on_caller_clock()),
        }
    }

    /// Tells what happened and asks what may go, in one call (made twice when `twice`).
    async fn poll_twice(&mut self, now: u64, twice: bool) -> Poll {
        let events = self.core.take_events();
        let asks = self.core.asks(now);
        let call = next_call();
        let (_, admission) = self
            .brain
            .round_twice(call, &events, &asks.asks, now, twice)
            .await;
        self.core.granted(asks, admission, now)
    }

    async fn poll(&mut self, now: u64) -> Poll {
        self.poll_twice(now, false).await
    }
}

// The twins ----------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Step {
    Submit {
        route: u8,
        max_wait_ms: Option<u16>,
    },
    /// A poll; its call made twice when `twice`.
    Poll {
        twice: bool,
    },
    /// A response to a request in flight; the call telling of it made twice when `twice`.
    Answer {
        pick: u8,
        kind: u8,
        remaining: u8,
        reset_ms: u16,
        bucket: u8,
        twice: bool,
    },
    Fail {
        pick: u8,
    },
    Cancel {
        pick: u8,
        sent: bool,
    },
    Advance {
        ms: u16,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..6, proptest::option::of(0u16..3000))
            .prop_map(|(route, max_wait_ms)| Step::Submit { route, max_wait_ms }),
        3 => proptest::bool::weighted(0.3).prop_map(|twice| Step::Poll { twice }),
        3 => (
            (any::<u8>(), 0u8..10, 0u8..6, 1u16..3000, 0u8..3),
            proptest::bool::weighted(0.3)
        )
            .prop_map(|((pick, kind, remaining, reset_ms, bucket), twice)| Step::Answer {
                pick,
                kind,
                remaining,
                reset_ms,
                bucket,
                twice,
            }),
        1 => any::<u8>().prop_map(|pick| Step::Fail { pick }),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(pick, sent)| Step::Cancel { pick, sent }),
        2 => (0u16..2500).prop_map(|ms| Step::Advance { ms }),
    ]
}

fn twin_routes() -> Vec<Route> {
    vec![
        Route::discord("GET", "/channels/1/messages"),
        Route::discord("POST", "/channels/1/messages"),
        Route::discord("GET", "/channels/1/pins"),
        Route::discord("GET", "/channels/2/messages"),
        Route::discord("POST", "/interactions/9/tok/callback"),
        Route::generic("GET", "/users/@me"),
    ]
}

/// A response of one of ten kinds: limits with a bucket id, limits without, a success
/// without headers, a 502 without headers, refusals of each scope (with and without a
/// retry-after), a 401, a 403.
fn observation(kind: u8, remaining: u8, reset_ms: u16, bucket: u8) -> (u16, Observation) {
    let limits = Observation {
        bucket: Some(format!("b{bucket}")),
        limit: Some(5),
        remaining: Some(u64::from(remaining.min(5))),
        reset_after: Some(Duration::from_millis(u64::from(reset_ms))),
        ..Observation::default()
    };
    let refusal = |scope, retry_ms: Option<u64>| Refusal {
        scope,
        retry_after: retry_ms.map(Duration::from_millis),
    };
    match kind {
        0 | 1 => (200, limits),
        2 => (
            200,
            Observation {
                bucket: None,
                ..limits
            },
        ),
        3 => (200, Observation::default()),
        4 => (502, Observation::default()),
        5 => (
            429,
            Observation {
                refusal: Some(refusal(Scope::Bucket, Some(u64::from(reset_ms)))),
                remaining: Some(0),
                ..limits
            },
        ),
        6 => (
            429,
            Observation {
                refusal: Some(refusal(Scope::Shared, Some(u64::from(reset_ms)))),
                ..Observation::default()
            },
        ),
        7 => (
            429,
            Observation {
                refusal: Some(refusal(Scope::Global, Some(u64::from(reset_ms) / 4))),
                ..Observation::default()
            },
        ),
        8 => (
            429,
            Observation {
                refusal: Some(refusal(Scope::Bucket, None)),
                ..Observation::default()
            },
        ),
        _ => (
            if remaining.is_multiple_of(2) {
                401
            } else {
                403
            },
            Observation::default(),
        ),
    }
}

fn twin_config() -> ClientConfig {
    let mut config = ClientConfig::discord()
        .global("gcra:rate=5/s,burst=2".parse().unwrap())
        .invalid_budget("fixed_window:limit=6,window=10s".parse().unwrap());
    config.in_flight_lease = Duration::from_secs(4);
    config.missing_retry_after = Duration::from_secs(2);
    config.max_backoff = Duration::from_secs(5);
    config.pioneers_per_major = 1;
    config
}

impl differential::Step<Seen> for Step {
    fn tick(&self, _: &[Seen]) -> Option<Tick> {
        match self {
            Step::Advance { ms } => Some(Tick::By(Duration::from_millis(u64::from(*ms)))),
            _ => None,
        }
    }
}

/// What the knowledge concluded of an answer: a pause until, and a warning of the
/// invalid-request budget (used, of the limit).
type Taught = (Option<u64>, Option<(u64, u64)>);

/// What a process said to a step, and how many of its requests wait and fly after it.
#[derive(Debug, PartialEq)]
struct Seen {
    said: Said,
    waiting: usize,
    in_flight: usize,
}

#[derive(Debug, PartialEq)]
enum Said {
    Submitted(Result<RequestId, ClientError>),
    Polled(Poll),
    /// What the core made of a response, and what the knowledge concluded of it.
    Answered(Completion, Vec<Option<Taught>>),
    /// A failure or a cancellation, or a step with no request to apply to.
    Nothing,
}

/// A process as a twin, with the requests it has in flight and how many it submitted, as
/// its own answers say. One that `repeats` makes a call twice when a step says so.
struct ProcessTwin {
    process: Process,
    repeats: bool,
    flying: Vec<RequestId>,
    submitted: u64,
}

impl ProcessTwin {
    fn new(process: Process, repeats: bool) -> ProcessTwin {
        ProcessTwin {
            process,
            repeats,
            flying: Vec::new(),
            submitted: 0,
        }
    }

    /// The request in flight that `pick` names, taken out of those in flight.
    fn pick(&mut self, pick: u8) -> Option<RequestId> {
        (!self.flying.is_empty()).then(|| self.flying.remove(usize::from(pick) % self.flying.len()))
    }
}

impl differential::Twin<Step> for ProcessTwin {
    type Answer = Seen;

    async fn apply(&mut self, step: &Step, at: At) -> Seen {
        let now = at.now;
        let routes = twin_routes();
        let said = match *step {
            Step::Submit { route, max_wait_ms } => {
                let route = &routes[usize::from(route) % routes.len()];
                let max_wait = max_wait_ms.map(|ms| Duration::from_millis(u64::from(ms)));
                let submitted = self.process.core.submit(route.clone(), now, max_wait);
                if submitted.is_ok() {
                    self.submitted += 1;
                }
                Said::Submitted(submitted)
            }
            Step::Poll { twice } => {
                let poll = self.process.poll_twice(now, twice && self.repeats).await;
                self.flying.extend(poll.go.iter().copied());
                Said::Polled(poll)
            }
            Step::Answer {
                pick,
                kind,
                remaining,
                reset_ms,
                bucket,
                twice,
            } => match self.pick(pick) {
                None => Said::Nothing,
                Some(id) => {
                    let (status, seen) = observation(kind, remaining, reset_ms, bucket);
                    let completion = self.process.core.complete(id, status, &seen, now);
                    let taught = self.process.tell_twice(now, twice && self.repeats).await;
                    Said::Answered(completion, taught)
                }
            },
            Step::Fail { pick } => {
                if let Some(id) = self.pick(pick) {
                    self.process.core.failed(id, now);
                }
                Said::Nothing
            }
            Step::Cancel { pick, sent } => {
                // Any request submitted: waiting, in flight or already done.
                if self.submitted > 0 {
                    let id = u64::from(pick) % self.submitted;
                    self.flying.retain(|&f| f != id);
                    self.process.core.cancel(id, sent, now);
                }
                Said::Nothing
            }
            Step::Advance { .. } => unreachable!("clock steps are the runner's"),
        };
        Seen {
            said,
            waiting: self.process.core.waiting(),
            in_flight: self.process.core.in_flight(),
        }
    }
}

/// Runs `steps` on a core whose knowledge is in memory, one whose knowledge is in Redis
/// and one whose knowledge is in a Redis Cluster (all three making some calls twice), and
/// one in memory that makes every call once: all answer alike.
async fn twins_agree(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let config = twin_config();
    let mut memory = ProcessTwin::new(Process::memory(&config), true);
    let mut twins = Vec::new();
    for redis in Redis::BOTH {
        let store = connect(&redis.url()).await;
        let process = Process::redis(&config, store, &unique_name("twins"));
        twins.push((redis.name(), ProcessTwin::new(process, true)));
    }
    // Never makes a call twice: a twin that counted a repeated call again would part from
    // it.
    twins.push((
        "memory, each call once",
        ProcessTwin::new(Process::memory(&config), false),
    ));
    let clock = ManualClock::new(T0);
    Differential::new(&clock)
        .run(&steps, ("memory", &mut memory), &mut twins)
        .await
        .map(|_| ())
}

#[test]
fn redis_decides_as_memory_does() {
    let steps = proptest::collection::vec(step(), 1..200);
    Cases::new(150)
        .regressions(file!())
        .run(&steps, |steps| runtime().block_on(twins_agree(steps)));
}

// A call made twice -----------------------------------------------------------------------

/// Polls `core` through `brain` at `now` until it has nothing more to ask now (a queue
/// refiled under its route's learned bucket asks again at once), each round under a new
/// id; answers the requests that go.
async fn settle(brain: &mut Brain, core: &mut ClientCore, now: u64) -> Vec<RequestId> {
    let mut go = Vec::new();
    for _ in 0..4 {
        let events = core.take_events();
        let asks = core.asks(now);
        let (_, admission) = brain.round(next_call(), &events, &asks.asks, now).await;
        let poll = core.granted(asks, admission, now);
        go.extend(poll.go);
        if poll.next.is_none_or(|t| t > now) {
            break;
        }
    }
    go
}

/// Two processes of one identity on `brain`, making some of their calls twice under one
/// id; answers every round's answer, for the twins to compare.
async fn calls_made_twice(mut brain: Brain) -> Vec<RoundAnswer> {
    let config = ClientConfig::new();
    let mut a = ClientCore::shared(config.clone());
    let mut b = ClientCore::shared(config);
    let route = Route::discord("GET", "/channels/1/messages");
    let mut answers = Vec::new();

    // A's pioneer, its call made twice: one admission, the same answer both times.
    let pioneer = a.submit(route.clone(), T0, None).unwrap();
    let asks = a.asks(T0);
    let answer = brain
        .round_twice(next_call(), &[], &asks.asks, T0, true)
        .await;
    answers.push(answer.clone());
    assert_eq!(a.granted(asks, answer.1, T0).go, vec![pioneer]);

    // B's request waits for the pioneer's answer.
    let held = b.submit(route.clone(), T0 + 1, None).unwrap();
    let asks = b.asks(T0 + 1);
    let answer = brain.round(next_call(), &[], &asks.asks, T0 + 1).await;
    answers.push(answer.clone());
    assert_eq!(answer.1.grants[0].admitted, vec![]);
    assert_eq!(answer.1.grants[0].wait, Wait::Event);
    b.granted(asks, answer.1, T0 + 1);

    // The pioneer's answer, told twice: 4 of the bucket's 5 calls are left.
    a.complete(pioneer, 200, &minute_of_five(4), T0 + 2);
    let events = a.take_events();
    let answer = brain
        .round_twice(next_call(), &events, &[], T0 + 2, true)
        .await;
    answers.push(answer);

    // Two more of A's, their call made twice: two calls spent, not four.
    let two = vec![
        a.submit(route.clone(), T0 + 3, None).unwrap(),
        a.submit(route.clone(), T0 + 3, None).unwrap(),
    ];
    let asks = a.asks(T0 + 3);
    let repeated = asks.asks.clone();
    let fourth = next_call();
    let answer = brain
        .round_twice(fourth, &[], &asks.asks, T0 + 3, true)
        .await;
    answers.push(answer.clone());
    assert_eq!(a.granted(asks, answer.1.clone(), T0 + 3).go, two);
    let first_of_two = answer;

    // B asks for three: two calls are left.
    let more = [
        b.submit(route.clone(), T0 + 4, None).unwrap(),
        b.submit(route.clone(), T0 + 4, None).unwrap(),
    ];
    let go = settle(&mut brain, &mut b, T0 + 4).await;
    assert_eq!(go, vec![held, more[0]], "two calls left");

    // A gives one of its two back unsent, told twice: one call comes back, not two. (B
    // asks again a second later.)
    let t1 = T0 + 2_000_000;
    a.cancel(two[0], false, t1);
    let events = a.take_events();
    let answer = brain.round_twice(next_call(), &events, &[], t1, true).await;
    answers.push(answer);
    let last = b.submit(route.clone(), t1, None).unwrap();
    let go = settle(&mut brain, &mut b, t1).await;
    assert_eq!(go, vec![more[1]], "one call came back");
    assert_eq!(b.waiting(), 1, "{last} waits for the reset");

    // Past the in-flight lease, the id of a call is free again: a new round.
    let later = T0 + 3 + 60_000_000;
    let answer = brain.round(fourth, &[], &repeated, later).await;
    assert_ne!(answer, first_of_two, "a new round");
    answers.push(answer);
    answers
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_made_twice_counts_once_in_memory_and_in_redis() {
    let config = ClientConfig::new();
    let memory = calls_made_twice(Brain::Memory(Box::new(Knowledge::new(config.clone())))).await;
    let store = connect(&shared_server().url()).await;
    let knowledge = RedisKnowledge::new(store, unique_name("Bot twice"), &config).on_caller_clock();
    let redis = calls_made_twice(Brain::Redis(knowledge)).await;
    assert_eq!(memory, redis);
}

#[test]
fn a_request_admitted_while_its_route_moved_leaves_every_queue() {
    // A shared core asks about a request; before the answer, a response of its route
    // names a bucket and the request moves there; the knowledge, not told yet, admits it
    // where it was. It goes once, and no queue keeps it.
    let config = ClientConfig::new();
    let mut knowledge = Knowledge::new(config.clone());
    let mut core = ClientCore::shared(config);
    let route = Route::generic("GET", "/things");
    fn step(core: &mut ClientCore, knowledge: &mut Knowledge, now: u64) -> Poll {
        for event in core.take_events() {
            event.apply(knowledge, now);
        }
        let asks = core.asks(now);
        let admission = knowledge.admit(&asks.asks, now);
        core.granted(asks, admission, now)
    }
    let first = core.submit(route.clone(), T0, None).unwrap();
    let second = core.submit(route.clone(), T0, None).unwrap();
    assert_eq!(
        step(&mut core, &mut knowledge, T0).go,
        vec![first],
        "the pioneer"
    );
    // No limits in the answer: the route is unlimited.
    core.complete(first, 200, &Observation::default(), T0 + 1);
    assert_eq!(step(&mut core, &mut knowledge, T0 + 1).go, vec![second]);
    let third = core.submit(route.clone(), T0 + 2, None).unwrap();
    let asks = core.asks(T0 + 2);
    assert_eq!(asks.asks.len(), 1);
    // The second's answer names a bucket: the third moves to it.
    let named = Observation {
        bucket: Some("b".into()),
        limit: Some(5),
        remaining: Some(3),
        reset_after: Some(Duration::from_secs(1)),
        ..Observation::default()
    };
    core.complete(second, 200, &named, T0 + 3);
    let admission = knowledge.admit(&asks.asks, T0 + 3);
    let poll = core.granted(asks, admission, T0 + 3);
    assert_eq!(poll.go, vec![third]);
    assert_eq!(core.waiting(), 0);
    assert_eq!(core.in_flight(), 1);
    let later = step(&mut core, &mut knowledge, T0 + 4);
    assert!(later.go.is_empty(), "{later:?}");
    assert!(core.asks(T0 + 5).asks.is_empty());
    assert_eq!(core.buckets_held(), 0, "no queue holds it");
}

// Four processes against the mock --------------------------------------------------------

#[derive(Debug)]
enum Ev {
    Arrive(usize, RequestId),
    Respond(usize, RequestId, u16, HeaderMap),
}

/// Processes, the mock and the requests in flight between them, on one virtual clock.
struct Sim {
    processes: Vec<Process>,
    next: Vec<Option<u64>>,
    api: MockApi,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64)>>,
    payloads: HashMap<u64, Ev>,
    routes: HashMap<(usize, RequestId), Route>,
    done: usize,
    failed: Vec<ClientError>,
    retries: u64,
}

impl Sim {
    fn new(processes: Vec<Process>, api: MockApi) -> Sim {
        let n = processes.len();
        Sim {
            processes,
            next: vec![Some(T0); n],
            api,
            now: T0,
            seq: 0,
            events: BinaryHeap::new(),
            payloads: HashMap::new(),
            routes: HashMap::new(),
            done: 0,
            failed: Vec::new(),
            retries: 0,
        }
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq)));
        self.payloads.insert(self.seq, ev);
    }

    async fn poll(&mut self, p: usize) {
        let poll = self.processes[p].poll(self.now).await;
        for id in poll.go {
            self.at(self.now + LATENCY, Ev::Arrive(p, id));
        }
        self.failed.extend(poll.failed.into_iter().map(|(_, e)| e));
        self.next[p] = poll.next;
    }

    /// Runs until nothing is left to do.
    async fn run(&mut self) {
        loop {
            for p in 0..self.processes.len() {
                if self.next[p].is_some_and(|t| t <= self.now) {
                    self.poll(p).await;
                }
            }
            let next_poll = self.next.iter().flatten().min().copied();
            let next_event = self.events.peek().map(|Reverse((t, _))| *t);
            let Some(next) = [next_poll, next_event].into_iter().flatten().min() else {
                return;
            };
            self.now = self.now.max(next);
            while let Some(&Reverse((t, seq))) = self.events.peek() {
                if t > self.now {
                    break;
                }
                self.events.pop();
                match self.payloads.remove(&seq) {
                    Some(Ev::Arrive(p, id)) => {
                        let (status, h) = self.api.handle(&self.routes[&(p, id)], self.now);
                        self.at(self.now + LATENCY, Ev::Respond(p, id, status, h));
                    }
                    Some(Ev::Respond(p, id, status, h)) => {
                        let seen = Discord.read(&Response::new(status, &h), self.now);
                        match self.processes[p].core.complete(id, status, &seen, self.now) {
                            Completion::Done => self.done += 1,
                            Completion::Retry => self.retries += 1,
                        }
                        // The process tells the knowledge and looks again.
                        self.next[p] = Some(self.now);
                    }
                    None => {}
                }
            }
        }
    }
}

/// `per_major` route templates in 10 buckets on each of 2 major parameters: 20 limits.
fn mock_routes(api: &mut MockApi, limit: Limit, per_major: u64) -> Vec<Route> {
    let mut out = Vec::new();
    for major in [111u64, 222] {
        for r in 0..per_major {
            let route = Route::discord("POST", &format!("/channels/{major}/r{r}"));
            api.route(&route, &format!("bucket-{}", r % 10), limit);
            out.push(route);
        }
    }
    out
}

/// Four processes on `url` share `n` requests spread over the routes, submitted at once;
/// answers the virtual seconds they took.
async fn four_processes(url: &str, api: MockApi, routes: &[Route], n: usize) -> (Sim, f64) {
    let mut processes = Vec::new();
    let identity = unique_name("four");
    for _ in 0..4 {
        processes.push(Process::redis(
            &ClientConfig::discord(),
            connect(url).await,
            &identity,
        ));
    }
    run_four(processes, api, routes, n).await
}

/// [`four_processes`] leasing sends ahead (under `config`).
async fn four_leasing(
    url: &str,
    config: &ClientConfig,
    api: MockApi,
    routes: &[Route],
    n: usize,
) -> (Sim, f64) {
    let mut processes = Vec::new();
    let identity = unique_name("four-leasing");
    for _ in 0..4 {
        processes.push(Process::leased(config, connect(url).await, &identity));
    }
    run_four(processes, api, routes, n).await
}

async fn run_four(processes: Vec<Process>, api: MockApi, routes: &[Route], n: usize) -> (Sim, f64) {
    let mut sim = Sim::new(processes, api);
    for i in 0..n {
        let p = i % 4;
        let route = &routes[(i / 4) % routes.len()];
        let id = sim.processes[p]
            .core
            .submit(route.clone(), T0, None)
            .expect("submitted");
        sim.routes.insert((p, id), route.clone());
    }
    sim.run().await;
    assert_eq!(sim.done, n, "every request answered once");
    assert!(
        sim.failed.is_empty(),
        "{:?}",
        &sim.failed[..sim.failed.len().min(3)]
    );
    for p in &sim.processes {
        assert_eq!(p.core.waiting() + p.core.in_flight(), 0);
    }
    let took = (sim.now - T0) as f64 / 1e6;
    (sim, took)
}

fn near_the_limit(what: &str, took: f64, least: f64) {
    eprintln!("{what}: {took} s against {least} s: {:.3}", least / took);
    assert!(
        least / took >= 0.9,
        "{what}: took {took} s, the limits allow {least} s"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn four_processes_on_one_redis_share_bucket_limits_without_a_429() {
    let mut api = MockApi::new(50);
    let limit = Limit {
        limit: 5,
        window: 4 * SECOND,
    };
    let routes = mock_routes(&mut api, limit, 100);
    let (sim, took) = four_processes(&shared_server().url(), api, &routes, 4_000).await;
    assert_eq!(sim.api.counts.bucket_429, 0);
    assert_eq!(sim.api.counts.global_429, 0);
    assert_eq!(sim.retries, 0);
    // Each of the 20 limits serves 200 requests, 5 per 4 s window: the last can start 39
    // windows after the first.
    near_the_limit("four processes, bucket-bound", took, 39.0 * 4.0);
}

#[tokio::test(flavor = "current_thread")]
async fn four_processes_on_one_redis_share_the_global_limit_without_a_429() {
    let mut api = MockApi::new(50);
    let limit = Limit {
        limit: 1_000,
        window: 10 * SECOND,
    };
    let routes = mock_routes(&mut api, limit, 100);
    let (sim, took) = four_processes(&shared_server().url(), api, &routes, 2_000).await;
    assert_eq!(sim.api.counts.global_429, 0);
    assert_eq!(sim.api.counts.bucket_429, 0);
    // 50 per second for the token, whichever process sends.
    near_the_limit("four processes, global-bound", took, 2_000.0 / 50.0);
}

/// Four processes leasing sends of routes without limit share a global limit of 40 a
/// second and bursts of 10 (never over the mock's 50 in an aligned second).
async fn four_leasing_share_the_global_limit(url: &str) {
    let api = MockApi::new(50);
    let mut routes = Vec::new();
    for major in [111u64, 222] {
        for r in 0..20 {
            routes.push(Route::discord("GET", &format!("/guilds/{major}/r{r}")));
        }
    }
    // No route has a limit of its own: each answers without headers.
    let config = ClientConfig::discord().global("gcra:rate=40/s,burst=10".parse().unwrap());
    let n = 1_000;
    let (sim, took) = four_leasing(url, &config, api, &routes, n).await;
    assert_eq!(sim.api.counts.global_429, 0);
    assert_eq!(sim.api.counts.bucket_429, 0);
    assert_eq!(sim.retries, 0);
    near_the_limit(
        "four processes leasing, global-bound",
        took,
        n as f64 / 40.0,
    );
}

#[tokio::test(flavor = "current_thread")]
async fn four_processes_leasing_sends_on_one_redis_share_the_global_limit_without_a_429() {
    four_leasing_share_the_global_limit(&shared_server().url()).await;
}

#[tokio::test(flavor = "current_thread")]
async fn four_processes_leasing_sends_on_a_redis_cluster_share_the_global_limit_without_a_429() {
    four_leasing_share_the_global_limit(&shared_cluster().url()).await;
}

#[tokio::test(flavor = "current_thread")]
async fn four_processes_on_a_redis_cluster_share_limits_without_a_429() {
    let mut api = MockApi::new(50);
    let limit = Limit {
        limit: 5,
        window: 4 * SECOND,
    };
    let routes = mock_routes(&mut api, limit, 100);
    let (sim, took) = four_processes(&shared_cluster().url(), api, &routes, 4_000).await;
    assert_eq!(sim.api.counts.bucket_429, 0);
    assert_eq!(sim.api.counts.global_429, 0);
    assert_eq!(sim.retries, 0);
    near_the_limit("four processes on a cluster", took, 39.0 * 4.0);
}

// The async client on Redis ------------------------------------------------------------

fn limits(bucket: &str, remaining: u64) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-ratelimit-bucket", bucket.parse().unwrap());
    h.insert("x-ratelimit-limit", "5".parse().unwrap());
    h.insert(
        "x-ratelimit-remaining",
        remaining.to_string().parse().unwrap(),
    );
    h.insert("x-ratelimit-reset-after", "60".parse().unwrap());
    h
}

#[tokio::test(flavor = "current_thread")]
async fn two_clients_on_one_redis_share_what_either_learns() {
    let url = shared_server().url();
    let token = unique_name("Bot token");
    let open = || Client::open(&url, &token, ClientConfig::new(), Discord);
    let a = open().await.expect("opened");
    let b = open().await.expect("opened");
    let route = Route::discord("GET", "/channels/7/messages");
    // A's pioneer learns the bucket: one call left of 5, for a minute.
    let permit = a.acquire(route.clone()).await.expect("admitted");
    assert!(matches!(
        permit.complete(200, &limits("b7", 1), None),
        After::Done
    ));
    a.flush().await;
    // B knows it: its first request goes, its second would wait the minute out.
    let permit = b
        .acquire_within(route.clone(), Some(Duration::from_secs(5)))
        .await
        .expect("the call left");
    permit.complete(200, &limits("b7", 0), None);
    b.flush().await;
    let refused = b
        .acquire_within(route.clone(), Some(Duration::from_secs(5)))
        .await
        .expect_err("the bucket is spent for every process");
    match refused {
        ClientError::WaitExceeded {
            would_wait: Some(w),
            ..
        } => assert!(w > Duration::from_secs(30), "{w:?}"),
        other => panic!("{other:?}"),
    }
    // And so does A.
    assert!(matches!(
        a.acquire_within(route, Some(Duration::from_secs(5))).await,
        Err(ClientError::WaitExceeded { .. })
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn a_memory_url_opens_a_client_of_its_own() {
    let client = Client::open("memory://", "Bot x", ClientConfig::new(), Discord)
        .await
        .expect("opened");
    let permit = client
        .acquire(Route::generic("GET", "/x"))
        .await
        .expect("admitted");
    permit.failed();
    let err = Client::open("ftp://x", "Bot x", ClientConfig::new(), Discord)
        .await
        .expect_err("not a store URL");
    assert!(err.to_string().contains("ftp://x"), "{err}");
}

/// A store shared across processes that holds no Redis store (here, one that hides it) is
/// refused: never knowledge kept in this process, which the others would not share.
#[tokio::test(flavor = "current_thread")]
async fn a_shared_store_without_redis_is_refused() {
    let store: paceline_store::SharedStore = std::sync::Arc::new(paceline_testkit::NotRedis::new());
    match Client::with_store(&store, "Bot x", ClientConfig::new(), Discord) {
        Err(paceline_store::Error::Input(e)) => {
            assert_eq!(e.field(), "store");
            assert!(e.message().contains("`redis` feature"), "{e}");
        }
        Err(e) => panic!("not an input error: {e}"),
        Ok(_) => panic!("knowledge no other process would share"),
    }
}

// The adapters on Redis ----------------------------------------------------------------

/// Four routes on one bucket id of 5 calls per 200 ms, and Discord's global limit: one
/// process alone could spend them; two must share.
fn roles_api() -> MockApi {
    let mut api = MockApi::new(50);
    for r in 0..4 {
        let route = Route::discord("PUT", &format!("/guilds/5/members/{r}/roles/9"));
        api.route(
            &route,
            "roles",
            Limit {
                limit: 5,
                window: SECOND / 5,
            },
        );
    }
    api
}

/// Under the mock's 50 per aligned second, with room for loopback jitter.
fn roles_config() -> ClientConfig {
    ClientConfig::discord().global("gcra:rate=45/s,burst=1".parse().unwrap())
}

#[cfg(feature = "reqwest")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_through_the_middleware_on_one_redis_meet_no_429() {
    use paceline_client::middleware::Limited;
    let mock = paceline_testkit::mock_api::MockServer::start(roles_api()).await;
    let url = shared_server().url();
    let token = unique_name("Bot middleware");
    let mut tasks = tokio::task::JoinSet::new();
    for _process in 0..2 {
        let limits = Client::open(&url, &token, roles_config(), Discord)
            .await
            .expect("opened");
        let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(Limited::discord(limits))
            .build();
        for t in 0..4u64 {
            let (http, base) = (http.clone(), mock.url());
            tasks.spawn(async move {
                for i in 0..5 {
                    let r = http
                        .put(format!("{base}/guilds/5/members/{}/roles/9", (t + i) % 4))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                }
            });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let counts = &mock.api.lock().unwrap().counts;
    assert_eq!(
        (counts.bucket_429, counts.global_429, counts.requests),
        (0, 0, 40)
    );
}

#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_through_the_tower_layer_on_a_redis_cluster_meet_no_429() {
    use paceline_client::layer::LimitedLayer;
    use paceline_core::Clock;
    use std::sync::{Arc, Mutex};
    use tower::{Layer, ServiceExt};
    let api = Arc::new(Mutex::new(roles_api()));
    let upstream = {
        let api = Arc::clone(&api);
        tower::service_fn(move |request: http::Request<()>| {
            let api = Arc::clone(&api);
            async move {
                let route = Route::discord(request.method().as_str(), request.uri().path());
                let now = paceline_store::SystemClock::new().now_micros();
                let (status, headers) = api.lock().unwrap().handle(&route, now);
                let mut response = http::Response::new(());
                *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
                *response.headers_mut() = headers;
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    let url = shared_cluster().url();
    let token = unique_name("Bot layer");
    let mut tasks = tokio::task::JoinSet::new();
    for _process in 0..2 {
        let limits = Client::open(&url, &token, roles_config(), Discord)
            .await
            .expect("opened");
        let service = LimitedLayer::discord(limits).layer(upstream.clone());
        for i in 0..15 {
            let service = service.clone();
            tasks.spawn(async move {
                let request = http::Request::put(format!("/guilds/5/members/{}/roles/9", i % 4))
                    .body(())
                    .unwrap();
                service.oneshot(request).await.unwrap().status()
            });
        }
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
    let counts = &api.lock().unwrap().counts;
    assert_eq!(
        (counts.bucket_429, counts.global_429, counts.requests),
        (0, 0, 30)
    );
}
