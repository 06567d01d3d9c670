//! The client limiter's core: a pure state machine on injected time, no I/O.
//!
//! The caller (the async [`Client`](crate::Client), or a proxy, or a test) tells the core
//! what happens and asks it what may go:
//!
//! 1. [`submit`](ClientCore::submit) a request for a [`Route`]: it waits in its bucket's
//!    queue (FIFO);
//! 2. [`poll`](ClientCore::poll) at `now`: the requests that may be sent now, those that
//!    failed (a deadline passed, the invalid-request budget is spent), and when to poll
//!    again;
//! 3. send each request that may go, then report its end: [`complete`](ClientCore::complete)
//!    with what the response said (an [`Observation`] from a [`Dialect`](crate::headers::Dialect)),
//!    [`failed`](ClientCore::failed) when the connection broke, or
//!    [`cancel`](ClientCore::cancel) when the caller gave up.
//!
//! The rules, per identity (one bot token):
//!
//! - **Buckets.** A route maps to the bucket id its responses name; routes that name one
//!   bucket share it, per major parameter. Before a route's bucket is known, its requests
//!   wait in a queue of their own, and exactly one *pioneer* is in flight; its headers
//!   name the bucket, and the queue joins that bucket's, in submission order. At most
//!   [`ClientConfig::pioneers_per_major`] pioneers per major parameter are in flight, and
//!   only while every known bucket of it has a call left; known buckets keep that many
//!   calls back while unknown routes wait to send their pioneers (not while those back
//!   off after an error), so that a route which turns out to share a known bucket does
//!   not find it spent.
//! - **Known buckets** admit as many requests as the last response said remain (each
//!   admission counts one down), then wait for the announced reset. At a reset the core
//!   assumes the limit is back and releases waiting requests **paced over the window**
//!   (one every `window / limit`), not all at once, until a response of the new window
//!   says how many remain.
//! - **The global limit** (a paceline [`Policy`](paceline_core::Policy), Discord's 50/s)
//!   is applied to every request that is about to go, except routes exempt from it.
//! - **Refusals** ([`Refusal`](crate::headers::Refusal)): a global one pauses every bucket
//!   for the retry-after; a bucket or shared one pauses the bucket. The refused request
//!   goes back to the head of its queue (up to [`ClientConfig::max_retries`] times; after
//!   that its response is the caller's). With no retry-after, the core waits
//!   [`ClientConfig::missing_retry_after`] and doubles it for each refusal in a row.
//! - **Invalid requests** (401, 403, and 429s other than `shared`) count against a
//!   paceline policy (Discord: 10,000 per 10 minutes); at 80 % a warning is logged, at the
//!   budget requests fail fast with [`ClientError::InvalidBudget`].
//! - **No response headers** on an error (a 502 from a proxy): a pioneer's slot is released
//!   after [`ClientConfig::headerless_backoff`], so a queue never hangs. A success without
//!   headers marks the route as unlimited.
//! - **A broken connection** fails that request only: its slot is released at once.
//! - **A cancelled request** gives back what it held: its place in the queue, its pioneer
//!   slot, and, if it was never sent, its count in the bucket and (when no request was
//!   admitted after it) its global token.
//! - **Deadlines** (`max_wait`): a refused request whose pause ends past its deadline
//!   is the caller's, with the server's refusal; a request whose estimated start is later than its deadline
//!   fails at once with [`ClientError::WaitExceeded`] saying how long it would have
//!   waited; one still waiting at its deadline fails then.
//!
//! Times are microseconds since the Unix epoch, as everywhere in paceline.
//!
//! ```
//! use paceline_client::headers::{Dialect, Discord, Response};
//! use paceline_client::{ClientConfig, ClientCore, Route};
//! use http::HeaderMap;
//!
//! let mut core = ClientCore::new(ClientConfig::discord());
//! let route = Route::discord("POST", "/channels/1/messages");
//! let first = core.submit(route.clone(), 0, None)?;
//! let second = core.submit(route.clone(), 0, None)?;
//! // The bucket is unknown: one pioneer goes, the other waits for its headers.
//! assert_eq!(core.poll(0).go, vec![first]);
//!
//! let mut h = HeaderMap::new();
//! h.insert("x-ratelimit-bucket", "b1".parse().unwrap());
//! h.insert("x-ratelimit-limit", "5".parse().unwrap());
//! h.insert("x-ratelimit-remaining", "4".parse().unwrap());
//! h.insert("x-ratelimit-reset-after", "5".parse().unwrap());
//! // 20 ms later (the global limit of 50/s spaces requests 20 ms apart):
//! let seen = Discord.read(&Response::new(200, &h), 20_000);
//! core.complete(first, 200, &seen, 20_000);
//! assert_eq!(core.poll(20_000).go, vec![second]);
//! # Ok::<(), paceline_client::ClientError>(())
//! ```

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use crate::config::ClientConfig;
use crate::error::ClientError;
use crate::headers::{Observation, Scope};
use crate::hooks::{Origin, RateLimited, RequestOptions, Then};
use crate::knowledge::Event;
use crate::knowledge::{
    is_own, micros, own_bucket, refusal_wait, Admission, Admitted, Ask, BucketKey, BucketView,
    Knowledge, Known, Wait, MAX_ROUTES,
};
use crate::route::Route;

/// A request's handle in the core, in submission order.
pub type RequestId = u64;

/// What to do with a request whose response came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The request is finished: give its response to the caller.
    Done,
    /// The server refused it because of a limit and it is back at the head of its queue:
    /// wait for it to be admitted again, then send it again.
    Retry,
}

/// What [`ClientCore::poll`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Poll {
    /// Requests that may be sent now, in the order admitted.
    pub go: Vec<RequestId>,
    /// Requests that failed without being sent.
    pub failed: Vec<(RequestId, ClientError)>,
    /// When to poll again if nothing else happens (`None`: only after an event).
    pub next: Option<u64>,
}

/// The questions a shared core puts to the knowledge ([`ClientCore::asks`]): one [`Ask`]
/// per waiting queue, and which requests each asks for.
#[derive(Clone, Debug, Default)]
pub struct Asks {
    /// What to ask the knowledge.
    pub asks: Vec<Ask>,
    ids: Vec<Vec<RequestId>>,
    failed: Vec<(RequestId, ClientError)>,
    /// When the first queue not asked about (told to wait) may be asked again.
    held_until: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReqState {
    Waiting,
    Admitted(Admitted),
}

#[derive(Debug)]
struct Req {
    route: Route,
    /// The queue it waits in, or the bucket it was admitted under.
    bucket: BucketKey,
    state: ReqState,
    submitted: u64,
    deadline: Option<(u64, Duration)>,
    retries: u32,
    /// It fails rather than wait ([`RequestOptions::give_up`]).
    give_up: bool,
    /// A [`RateLimited`] told that it waits (since it last went back to its queue).
    told: bool,
    /// The scope last told of it.
    scope: Option<Scope>,
}

/// The most requests of one queue a poll asks about at once (a shared core asks fewer:
/// every one asked about is sent to Redis).
const ASK_AT_MOST: usize = 8;
const SHARED_ASK_AT_MOST: usize = 32;

/// How soon a shared core asks again when it waits for a response that another process
/// may receive: 20 ms.
pub const SHARED_REPOLL_US: u64 = 20_000;

/// How long a shared core with requests waiting goes without asking: 1 s, so that its
/// wish to send a pioneer stays known to the other processes.
const SHARED_ASK_EVERY_US: u64 = 1_000_000;

/// The most [`RateLimited`] events a core keeps until they are taken; beyond, the oldest
/// are dropped.
pub const MAX_RATE_LIMITED: usize = 4_096;

/// The API client limiter's state for one identity (one token). See the module docs.
///
/// A core made by [`ClientCore::new`] holds its own [`Knowledge`]: [`poll`](Self::poll)
/// decides everything. One made by [`ClientCore::shared`] keeps only its requests, and
/// the knowledge lives elsewhere (in Redis, shared by every process of the identity):
/// [`asks`](Self::asks) says what to ask it, [`granted`](Self::granted) takes its answer,
/// and [`take_events`](Self::take_events) what to tell it, before the next ask.
#[derive(Debug)]
pub struct ClientCore {
    config: ClientConfig,
    queues: HashMap<BucketKey, VecDeque<RequestId>>,
    requests: HashMap<RequestId, Req>,
    /// Queues with a request waiting (ordered, so that polls are deterministic).
    waiting: BTreeSet<BucketKey>,
    deadlines: BTreeSet<(u64, RequestId)>,
    next_id: RequestId,
    /// The knowledge, when this core holds it.
    local: Option<Knowledge>,
    /// What a shared core has to tell the knowledge.
    outbox: Vec<Event>,
    /// A shared core's own route → bucket map, from its responses and the knowledge's
    /// refilings, so that its requests are filed where the knowledge looks for them.
    routes: HashMap<Arc<str>, Arc<str>>,
    /// The last queue that had a request admitted: the next asks start after it.
    cursor: Option<BucketKey>,
    /// Queues that had every request asked about admitted: they may have more that can go.
    again: Vec<BucketKey>,
    /// A shared core's queues told to wait until a time: that time, and when they were
    /// told. They are not asked about again before it (nor for longer than a second, so
    /// that the knowledge keeps hearing of them), unless something happens here.
    held: HashMap<BucketKey, (u64, u64)>,
    /// A shared core's count of refusals without a retry-after in a row (the knowledge
    /// keeps the real one), to tell whether a refused request's pause outlasts its
    /// deadline.
    missing_in_a_row: u32,
    /// What limits did to requests, until [`take_rate_limited`](Self::take_rate_limited).
    rate_limited: VecDeque<RateLimited>,
}

impl ClientCore {
    /// An empty core that holds its own knowledge: nothing known, nothing waiting.
    pub fn new(config: ClientConfig) -> ClientCore {
        let local = Some(Knowledge::new(config.clone()));
        ClientCore::with(config, local)
    }

    /// An empty core whose knowledge lives elsewhere: see [`ClientCore`].
    pub fn shared(config: ClientConfig) -> ClientCore {
        ClientCore::with(config, None)
    }

    fn with(config: ClientConfig, local: Option<Knowledge>) -> ClientCore {
        ClientCore {
            config,
            queues: HashMap::new(),
            requests: HashMap::new(),
            waiting: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            next_id: 0,
            local,
            outbox: Vec::new(),
            routes: HashMap::new(),
            held: HashMap::new(),
            cursor: None,
            again: Vec::new(),
            missing_in_a_row: 0,
            rate_limited: VecDeque::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Whether the knowledge lives elsewhere.
    pub fn is_shared(&self) -> bool {
        self.local.is_none()
    }

    /// What this core's knowledge holds of each bucket at `now` (µs); `None` when the
    /// knowledge lives elsewhere (in Redis).
    pub fn buckets(&self, now: u64) -> Option<Vec<BucketView>> {
        self.local.as_ref().map(|k| k.buckets(now))
    }

    /// The queue a request for `route` waits in: its learned bucket, or its own.
    fn queue_key(&self, route: &Route) -> BucketKey {
        let major = Arc::clone(route.major_arc());
        let routes = self.local.as_ref().map_or(&self.routes, |k| &k.routes);
        match routes.get(route.key()) {
            Some(id) => (Arc::clone(id), major),
            None => (own_bucket(route.key()), major),
        }
    }

    /// Puts a request for `route` in its queue at `now`, with `max_wait` (or the
    /// configuration's) as its deadline. Fails at once when the invalid-request budget is
    /// spent, or when the core can tell the wait would pass the deadline (a shared core
    /// tells at its next ask).
    pub fn submit(
        &mut self,
        route: Route,
        now: u64,
        max_wait: Option<Duration>,
    ) -> Result<RequestId, ClientError> {
        let options = RequestOptions {
            max_wait,
            ..RequestOptions::default()
        };
        self.submit_with(route, now, options)
    }

    /// [`submit`](Self::submit) with the request's own [`RequestOptions`]: its deadline,
    /// and whether it fails with [`ClientError::RateLimited`] rather than wait (at once
    /// when the core can tell it would wait, else at the poll that learns it). A request
    /// that must wait is told as a [`RateLimited`] event.
    pub fn submit_with(
        &mut self,
        route: Route,
        now: u64,
        options: RequestOptions,
    ) -> Result<RequestId, ClientError> {
        if let Some(retry_after) = self.local.as_ref().and_then(|k| k.budget_spent(now)) {
            return Err(ClientError::InvalidBudget { retry_after });
        }
        let key = self.queue_key(&route);
        let position = self.queues.get(&key).map_or(0, VecDeque::len);
        let max_wait = options.max_wait.or(self.config.max_wait);
        let id = self.next_id;
        self.next_id += 1;
        let mut held = None;
        if let Some(k) = &self.local {
            let exempt = route.is_global_exempt();
            match k.estimate(route.key(), &key.1, &key.0, position, exempt, now) {
                Some(start) if start > now => {
                    let scope = self.local_scope(&route, &key, position, start, now);
                    held = Some((Some(Duration::from_micros(start - now)), scope));
                }
                Some(_) => {}
                // Behind its unknown bucket's pioneer: it waits for that answer.
                None => held = Some((None, Some(Scope::Bucket))),
            }
        }
        if let Some((wait, scope)) = held {
            let failure = if options.give_up {
                Some(ClientError::RateLimited { scope, wait })
            } else {
                match (max_wait, wait) {
                    (Some(max_wait), Some(w)) if w > max_wait => Some(ClientError::WaitExceeded {
                        max_wait,
                        would_wait: Some(w),
                    }),
                    _ => None,
                }
            };
            let then = if failure.is_some() {
                Then::Fail
            } else {
                Then::Wait
            };
            self.tell(RateLimited {
                id,
                route: route.clone(),
                bucket: bucket_name(&key),
                scope,
                wait,
                then,
                origin: Origin::Local,
            });
            if let Some(e) = failure {
                return Err(e);
            }
        }
        self.queues.entry(key.clone()).or_default().push_back(id);
        let deadline = max_wait.map(|d| (now.saturating_add(micros(d)), d));
        if let Some((at, _)) = deadline {
            self.deadlines.insert((at, id));
        }
        self.waiting.insert(key.clone());
        self.requests.insert(
            id,
            Req {
                route,
                bucket: key,
                state: ReqState::Waiting,
                submitted: now,
                deadline,
                retries: 0,
                give_up: options.give_up,
                told: held.is_some(),
                scope: held.and_then(|(_, scope)| scope),
            },
        );
        Ok(id)
    }

    /// Which limit holds a request of `route` at `position` in queue `key` until `start`,
    /// as this core's knowledge tells: its bucket if the bucket alone holds it that long
    /// (its calls, its pause, or its last calls kept back for pioneers until its window
    /// ends), else the global limit (its policy, or a global refusal's pause). `None` for a
    /// shared core.
    fn local_scope(
        &self,
        route: &Route,
        key: &BucketKey,
        position: usize,
        start: u64,
        now: u64,
    ) -> Option<Scope> {
        let k = self.local.as_ref()?;
        if route.is_global_exempt()
            || (self.config.global.is_none() && k.global_paused_until <= now)
        {
            return Some(Scope::Bucket);
        }
        let filed: BucketKey = (k.resolve(route.key(), &key.0), Arc::clone(&key.1));
        if let Some(b) = k.buckets.get(&filed) {
            // A known bucket keeping its last calls back for pioneers of its major
            // parameter holds the request until its window ends.
            if let Known::Limited {
                reset_at, window, ..
            } = b.known
            {
                if start == reset_at || start == reset_at.saturating_add(window) {
                    return Some(Scope::Bucket);
                }
            }
        }
        if k.global_paused_until >= start {
            return Some(Scope::Global);
        }
        match k.estimate(route.key(), &key.1, &key.0, position, true, now) {
            Some(own) if own >= start => Some(Scope::Bucket),
            None => Some(Scope::Bucket),
            Some(_) => Some(Scope::Global),
        }
    }

    /// Keeps `event` until [`take_rate_limited`](Self::take_rate_limited).
    fn tell(&mut self, event: RateLimited) {
        if self.rate_limited.len() >= MAX_RATE_LIMITED {
            self.rate_limited.pop_front();
        }
        self.rate_limited.push_back(event);
    }

    /// What limits did to requests since the last call, in order: waits, failures and the
    /// upstream's refusals (see [`crate::hooks`]). At most [`MAX_RATE_LIMITED`] are kept.
    pub fn take_rate_limited(&mut self) -> Vec<RateLimited> {
        self.rate_limited.drain(..).collect()
    }

    /// Whether [`RateLimited`] events wait to be taken.
    pub fn has_rate_limited(&self) -> bool {
        !self.rate_limited.is_empty()
    }

    /// The requests that may be sent at `now`, those that failed, and when to poll again.
    ///
    /// A shared core only fails the requests whose deadline passed: what may go is the
    /// knowledge's to say ([`asks`](Self::asks), [`granted`](Self::granted)).
    pub fn poll(&mut self, now: u64) -> Poll {
        let asks = self.asks(now);
        let Some(k) = self.local.as_mut() else {
            let mut out = Poll {
                failed: asks.failed,
                ..Poll::default()
            };
            out.next = self.deadlines.first().map(|&(at, _)| at);
            return out;
        };
        let admission = k.admit(&asks.asks, now);
        let mut out = self.granted(asks, admission, now);
        // A queue whose every request asked about went may have more that can: ask again,
        // those queues only.
        while !self.again.is_empty() {
            let only: HashSet<BucketKey> = std::mem::take(&mut self.again).into_iter().collect();
            let asks = self.asks_in(now, Some(&only));
            let Some(k) = self.local.as_mut() else {
                break;
            };
            let admission = k.admit(&asks.asks, now);
            let more = self.granted(asks, admission, now);
            out.go.extend(more.go);
            out.failed.extend(more.failed);
            out.next = match (out.next, more.next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        out
    }

    /// Fails the requests whose deadline passed, and answers what to ask the knowledge at
    /// `now`: each waiting queue's first requests.
    pub fn asks(&mut self, now: u64) -> Asks {
        self.asks_in(now, None)
    }

    /// [`asks`](Self::asks), of the queues in `only` if given.
    fn asks_in(&mut self, now: u64, only: Option<&HashSet<BucketKey>>) -> Asks {
        let mut out = Asks::default();
        self.expire_deadlines(now, &mut out.failed);
        let at_most = if self.is_shared() {
            SHARED_ASK_AT_MOST
        } else {
            ASK_AT_MOST
        };
        // Round-robin: the queues after the last one served go first, so that a limit
        // every queue shares (the global one) serves them in turn, not in name order.
        let (after, before): (Vec<&BucketKey>, Vec<&BucketKey>) = match &self.cursor {
            Some(c) => (
                self.waiting
                    .range((Bound::Excluded(c), Bound::Unbounded))
                    .collect(),
                self.waiting.range(..=c).collect(),
            ),
            None => (self.waiting.iter().collect(), Vec::new()),
        };
        for key in after.into_iter().chain(before) {
            if only.is_some_and(|only| !only.contains(key)) {
                continue;
            }
            let Some(queue) = self.queues.get(key) else {
                continue;
            };
            if let Some(&(until, told)) = self.held.get(key) {
                let again = told.saturating_add(SHARED_ASK_EVERY_US);
                if until > now && now < again {
                    let t = until.min(again);
                    out.held_until = Some(out.held_until.map_or(t, |n: u64| n.min(t)));
                    continue;
                }
            }
            let mut ids = Vec::new();
            let mut requests = Vec::new();
            for &id in queue.iter().take(at_most) {
                if let Some(req) = self.requests.get(&id) {
                    if req.state != ReqState::Waiting {
                        continue;
                    }
                    ids.push(id);
                    requests.push((
                        Arc::clone(req.route.key_arc()),
                        req.route.is_global_exempt(),
                    ));
                }
            }
            if ids.is_empty() {
                continue;
            }
            out.asks.push(Ask {
                major: Arc::clone(&key.1),
                bucket: Arc::clone(&key.0),
                requests,
            });
            out.ids.push(ids);
        }
        out
    }

    /// Takes the knowledge's answer to `asks` (asked at `now`): the requests admitted go,
    /// or, when they left meanwhile (a caller gave up), are given back.
    pub fn granted(&mut self, asks: Asks, admission: Admission, now: u64) -> Poll {
        let mut out = Poll {
            failed: asks.failed,
            ..Poll::default()
        };
        let mut next: Option<u64> = None;
        let mut earliest = |t: u64| next = Some(next.map_or(t, |n: u64| n.min(t)));
        if let Some(t) = asks.held_until {
            earliest(t);
        }
        if let Some(retry_after) = admission.spent {
            for ask in &asks.asks {
                let key: BucketKey = (Arc::clone(&ask.bucket), Arc::clone(&ask.major));
                let queue = self.queues.remove(&key).unwrap_or_default();
                self.waiting.remove(&key);
                for id in queue {
                    self.forget(id);
                    out.failed
                        .push((id, ClientError::InvalidBudget { retry_after }));
                }
            }
        }
        let shared = self.is_shared();
        let at_most = if shared {
            SHARED_ASK_AT_MOST
        } else {
            ASK_AT_MOST
        };
        for ((ask, ids), grant) in asks.asks.iter().zip(&asks.ids).zip(admission.grants) {
            let key: BucketKey = (Arc::clone(&ask.bucket), Arc::clone(&ask.major));
            for ((&id, admitted), (route, _)) in ids.iter().zip(&grant.admitted).zip(&ask.requests)
            {
                self.admit_request(id, &key, route, *admitted, &mut out.go);
            }
            // The next asks start after a queue that took a global token (one spared by the
            // global limit would bring the name order back).
            if ask.requests[..grant.admitted.len().min(ask.requests.len())]
                .iter()
                .any(|(_, exempt)| !exempt)
            {
                self.cursor = Some(key.clone());
            }
            let rest = ids.get(grant.admitted.len()).copied();
            if let Some((route, bucket)) = &grant.moved {
                let to: BucketKey = (Arc::clone(bucket), Arc::clone(&ask.major));
                self.learned_route(route, bucket);
                self.move_route(&key, &to, route);
                earliest(now);
            }
            if shared {
                match grant.wait {
                    Wait::Until(t) if grant.moved.is_none() => {
                        self.held.insert(key.clone(), (t, now));
                    }
                    _ => {
                        self.held.remove(&key);
                    }
                }
            }
            match grant.wait {
                Wait::Until(t) => {
                    earliest(t);
                    // A shared core learns only now how long its request would wait.
                    if shared {
                        if let Some(id) = rest {
                            self.fail_if_late(id, t, now, &mut out.failed);
                        }
                    }
                }
                Wait::Event if shared => earliest(now + SHARED_REPOLL_US),
                Wait::Event => {}
                // The queue holds more than was asked about.
                Wait::Nothing if grant.moved.is_none() && ids.len() == at_most => {
                    // A core that holds its knowledge asks again within this poll.
                    if shared {
                        earliest(now);
                    } else {
                        self.again.push(key.clone());
                    }
                }
                Wait::Nothing => {}
            }
            // The requests asked about that did not go wait: told so, or failed if they
            // would rather give up.
            let start = match grant.wait {
                Wait::Until(t) => Some(Some(t)),
                Wait::Event => Some(None),
                Wait::Nothing => None,
            };
            if let (Some(start), None) = (start, &grant.moved) {
                for &id in ids.iter().skip(grant.admitted.len()) {
                    self.held_back(id, &key, start, now, &mut out.failed);
                }
            }
            if self.queues.get(&key).is_none_or(VecDeque::is_empty) {
                self.queues.remove(&key);
                self.waiting.remove(&key);
            }
        }
        if shared && !self.waiting.is_empty() {
            earliest(now + SHARED_ASK_EVERY_US);
        }
        if let Some(t) = self.deadlines.first().map(|&(at, _)| at) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        out.next = next;
        out
    }

    /// Fails a waiting request at once if its deadline comes before `start`.
    fn fail_if_late(
        &mut self,
        id: RequestId,
        start: u64,
        now: u64,
        failed: &mut Vec<(RequestId, ClientError)>,
    ) {
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        let Some((at, max_wait)) = req.deadline else {
            return;
        };
        if req.state != ReqState::Waiting || at >= start {
            return;
        }
        let would_wait = Some(Duration::from_micros(start.saturating_sub(now)));
        self.fail_waiting(id, max_wait, would_wait, failed);
    }

    /// A waiting request in queue `key` was asked about and may not go before `start`
    /// (`None`: an answer): it fails if it would rather give up, else it is told to wait
    /// (once).
    fn held_back(
        &mut self,
        id: RequestId,
        key: &BucketKey,
        start: Option<u64>,
        now: u64,
        failed: &mut Vec<(RequestId, ClientError)>,
    ) {
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        if req.state != ReqState::Waiting || (req.told && !req.give_up) {
            return;
        }
        let (route, give_up) = (req.route.clone(), req.give_up);
        let wait = start.map(|t| Duration::from_micros(t.saturating_sub(now)));
        let scope = match start {
            Some(t) => self.local_scope(&route, key, 0, t, now),
            None if self.is_shared() => None,
            None => Some(Scope::Bucket),
        };
        self.tell(RateLimited {
            id,
            route,
            bucket: bucket_name(key),
            scope,
            wait,
            then: if give_up { Then::Fail } else { Then::Wait },
            origin: Origin::Local,
        });
        if give_up {
            self.unqueue(id);
            self.forget(id);
            failed.push((id, ClientError::RateLimited { scope, wait }));
        } else if let Some(req) = self.requests.get_mut(&id) {
            req.told = true;
            req.scope = scope;
        }
    }

    /// Takes a waiting request out of the core: it fails, its deadline passed or known
    /// to pass.
    fn fail_waiting(
        &mut self,
        id: RequestId,
        max_wait: Duration,
        would_wait: Option<Duration>,
        failed: &mut Vec<(RequestId, ClientError)>,
    ) {
        if let Some(req) = self.requests.get(&id) {
            let event = RateLimited {
                id,
                route: req.route.clone(),
                bucket: bucket_name(&req.bucket),
                scope: req.scope,
                wait: would_wait,
                then: Then::Fail,
                origin: Origin::Local,
            };
            self.tell(event);
        }
        self.unqueue(id);
        self.forget(id);
        failed.push((
            id,
            ClientError::WaitExceeded {
                max_wait,
                would_wait,
            },
        ));
    }

    /// Marks an admitted request as gone, or gives its admission back if it left.
    fn admit_request(
        &mut self,
        id: RequestId,
        key: &BucketKey,
        route: &Arc<str>,
        admitted: Admitted,
        go: &mut Vec<RequestId>,
    ) {
        let waiting = self
            .requests
            .get(&id)
            .is_some_and(|r| r.state == ReqState::Waiting);
        if !waiting {
            // It left between the ask and the answer (only in a shared core): what it
            // was given goes back.
            self.outbox.push(Event::Release {
                route: Route::new(route.to_string(), key.1.to_string()),
                bucket: Arc::clone(&key.0),
                admitted,
                sent: false,
                failed: false,
            });
            return;
        }
        // Out of the queue it waits in now: the one asked about, or another its route
        // moved to meanwhile.
        self.unqueue(id);
        if let Some(req) = self.requests.get_mut(&id) {
            req.state = ReqState::Admitted(admitted);
            req.bucket = key.clone();
            if let Some((at, _)) = req.deadline {
                self.deadlines.remove(&(at, id));
            }
        }
        go.push(id);
    }

    fn expire_deadlines(&mut self, now: u64, failed: &mut Vec<(RequestId, ClientError)>) {
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(req) = self.requests.get(&id) else {
                continue;
            };
            if req.state != ReqState::Waiting {
                continue;
            }
            let max_wait = req.deadline.map_or(Duration::ZERO, |(_, d)| d);
            self.fail_waiting(id, max_wait, None, failed);
        }
    }

    /// Takes a waiting request out of its queue.
    fn unqueue(&mut self, id: RequestId) {
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        if let Some(queue) = self.queues.get_mut(&req.bucket) {
            if let Some(i) = queue.iter().position(|&q| q == id) {
                queue.remove(i);
            }
            if queue.is_empty() {
                self.queues.remove(&req.bucket);
                self.waiting.remove(&req.bucket);
            }
        }
    }

    fn forget(&mut self, id: RequestId) {
        if let Some(req) = self.requests.remove(&id) {
            if let Some((at, _)) = req.deadline {
                self.deadlines.remove(&(at, id));
            }
        }
    }

    /// Takes an admitted request out of the core: its route, bucket and admission.
    fn take_admitted(&mut self, id: RequestId) -> Option<(Req, Admitted)> {
        let req = self.requests.remove(&id)?;
        match req.state {
            ReqState::Admitted(admitted) => Some((req, admitted)),
            ReqState::Waiting => {
                self.requests.insert(id, req);
                None
            }
        }
    }

    /// Tells the knowledge that a request ended without an answer.
    fn tell_release(&mut self, req: &Req, admitted: Admitted, sent: bool, failed: bool, now: u64) {
        self.held.clear();
        let event = Event::Release {
            route: req.route.clone(),
            bucket: Arc::clone(&req.bucket.0),
            admitted,
            sent,
            failed,
        };
        match self.local.as_mut() {
            Some(k) => {
                event.apply(k, now);
            }
            None => self.outbox.push(event),
        }
    }

    /// The connection broke or timed out before a response, at `now`: that request fails
    /// (the caller reports its error); its slot is released at once and the queue goes on.
    /// A pioneer's route, still unknown, backs off as after an error without headers, so
    /// that a failing route neither hammers nor holds known buckets' calls back.
    pub fn failed(&mut self, id: RequestId, now: u64) {
        if let Some((req, admitted)) = self.take_admitted(id) {
            self.tell_release(&req, admitted, true, true, now);
        }
    }

    /// The caller gave up on the request (its future was dropped), at `now`. A waiting
    /// request leaves its queue; an admitted one frees its slot, and if it was never
    /// `sent`, gives back its count in the bucket and, if no request was admitted by the
    /// global limiter after it, its global token.
    pub fn cancel(&mut self, id: RequestId, sent: bool, now: u64) {
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        if req.state == ReqState::Waiting {
            self.unqueue(id);
            self.forget(id);
            return;
        }
        if let Some((req, admitted)) = self.take_admitted(id) {
            self.tell_release(&req, admitted, sent, false, now);
        }
    }

    /// The response of an admitted request came, with `status` and what its headers said.
    /// Learns from it, and answers whether the request is done or goes round again (a
    /// refusal, requeued at the head of its queue).
    pub fn complete(
        &mut self,
        id: RequestId,
        status: u16,
        seen: &Observation,
        now: u64,
    ) -> Completion {
        let Some((mut req, admitted)) = self.take_admitted(id) else {
            return Completion::Done;
        };
        for problem in &seen.problems {
            tracing::warn!(route = req.route.key(), "{problem}");
        }
        self.held.clear();
        let event = Event::Answer {
            route: req.route.clone(),
            bucket: Arc::clone(&req.bucket.0),
            admitted,
            status,
            seen: seen.clone(),
            at: now,
        };
        let paused_until = match self.local.as_mut() {
            Some(k) => {
                let answered = event.apply(k, now);
                if let Some((used, limit)) = answered.and_then(|a| a.warn) {
                    warn_budget(used, limit);
                }
                answered.and_then(|a| a.paused_until)
            }
            None => {
                self.outbox.push(event);
                self.estimate_pause(status, seen, now)
            }
        };
        // The route's waiting requests move to the bucket its response named.
        if let Some(bucket) = &seen.bucket {
            let learned: BucketKey = (Arc::from(bucket.as_str()), Arc::clone(&req.bucket.1));
            let own: BucketKey = (own_bucket(req.route.key()), Arc::clone(&req.bucket.1));
            for from in [own, req.bucket.clone()] {
                if from != learned {
                    self.move_route(&from, &learned, req.route.key());
                }
            }
            self.learned_route(req.route.key_arc(), &learned.0);
            req.bucket = learned;
        }
        // Out of retries, the pause ends past its deadline, or the request would rather give
        // up: the refusal is the caller's (rather than a deadline error with no retry-after
        // in it).
        let retry = paused_until.is_some_and(|until| {
            !(req.give_up
                || req.retries >= self.config.max_retries
                || req.deadline.is_some_and(|(at, _)| at < until))
        });
        if let Some(refusal) = seen.refusal {
            let wait = paused_until
                .map(|until| Duration::from_micros(until.saturating_sub(now)))
                .or(refusal.retry_after);
            self.tell(RateLimited {
                id,
                route: req.route.clone(),
                bucket: bucket_name(&req.bucket),
                scope: Some(refusal.scope),
                wait,
                then: if retry { Then::Wait } else { Then::Fail },
                origin: Origin::Upstream,
            });
            req.scope = Some(refusal.scope);
        }
        if !retry {
            return Completion::Done;
        }
        req.retries += 1;
        // The refusal told that it waits.
        req.told = true;
        req.state = ReqState::Waiting;
        let key = req.bucket.clone();
        self.queues.entry(key.clone()).or_default().push_front(id);
        self.waiting.insert(key);
        if let Some((at, _)) = req.deadline {
            self.deadlines.insert((at, id));
        }
        self.requests.insert(id, req);
        Completion::Retry
    }

    /// A shared core's guess of when a refusal's pause ends (the knowledge says, but not
    /// before the answer is told): its retry-after, or the growing wait for a missing one.
    fn estimate_pause(&mut self, status: u16, seen: &Observation, now: u64) -> Option<u64> {
        if (200..300).contains(&status) {
            self.missing_in_a_row = 0;
        }
        let refusal = seen.refusal?;
        let wait = refusal_wait(
            &self.config,
            refusal.retry_after,
            &mut self.missing_in_a_row,
        );
        Some(now.saturating_add(wait.max(1)))
    }

    /// Notes in a shared core's own map that `route` is filed under `bucket`.
    fn learned_route(&mut self, route: &Arc<str>, bucket: &Arc<str>) {
        if self.local.is_some() {
            return;
        }
        if self.routes.len() >= MAX_ROUTES {
            self.routes.clear();
        }
        self.routes.insert(Arc::clone(route), Arc::clone(bucket));
    }

    /// How many events wait to be taken ([`take_events`](Self::take_events)).
    pub fn events_pending(&self) -> usize {
        self.outbox.len()
    }

    /// What a shared core has to tell the knowledge, in order; tell it before the next
    /// ask.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.outbox)
    }

    /// Moves the waiting requests of `route` from queue `from` to queue `to`, keeping
    /// submission order.
    fn move_route(&mut self, from: &BucketKey, to: &BucketKey, route: &str) {
        let Some(old) = self.queues.get_mut(from) else {
            return;
        };
        let requests = &mut self.requests;
        let (moving, staying): (Vec<RequestId>, Vec<RequestId>) = old
            .iter()
            .partition(|id| requests.get(id).is_some_and(|r| r.route.key() == route));
        if moving.is_empty() {
            return;
        }
        *old = staying.into();
        if old.is_empty() {
            self.queues.remove(from);
            self.waiting.remove(from);
        }
        for id in &moving {
            if let Some(r) = requests.get_mut(id) {
                r.bucket = to.clone();
            }
        }
        let new = self.queues.entry(to.clone()).or_default();
        let mut merged: Vec<RequestId> = new.drain(..).chain(moving).collect();
        merged.sort_unstable();
        *new = merged.into();
        self.waiting.insert(to.clone());
    }

    /// Whether any request waits to be admitted.
    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// How many requests are waiting (not yet admitted).
    pub fn waiting(&self) -> usize {
        self.requests
            .values()
            .filter(|r| r.state == ReqState::Waiting)
            .count()
    }

    /// How many requests are admitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.requests.len() - self.waiting()
    }

    /// How many buckets the core holds state for (learned, or a route's own), counting
    /// its waiting queues and, when it holds its knowledge, the buckets it knows.
    pub fn buckets_held(&self) -> usize {
        let known = self.local.as_ref().map_or(0, Knowledge::buckets_held);
        let extra = self
            .queues
            .keys()
            .filter(|k| {
                self.local
                    .as_ref()
                    .is_none_or(|l| !l.buckets.contains_key(*k))
            })
            .count();
        known + extra
    }

    /// When the request was submitted, if the core still holds it.
    pub fn submitted_at(&self, id: RequestId) -> Option<u64> {
        self.requests.get(&id).map(|r| r.submitted)
    }
}

/// The bucket id of queue `key` as the server named it; `None` for a route's own queue
/// (its bucket not learned yet).
fn bucket_name(key: &BucketKey) -> Option<String> {
    (!is_own(&key.0)).then(|| key.0.to_string())
}

/// Logs that the invalid-request budget passed its warning share.
pub(crate) fn warn_budget(used: u64, limit: u64) {
    tracing::warn!(
        used,
        limit,
        "the invalid-request budget (401, 403, 429) is {:.0} % used; at the budget requests fail fast",
        100.0 * used as f64 / limit.max(1) as f64
    );
}
