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
//! - **The global limit** (a paceline [`Policy`], Discord's 50/s) is applied to every
//!   request that is about to go, except routes exempt from it.
//! - **Refusals** ([`Refusal`]): a global one pauses every bucket for the retry-after; a
//!   bucket or shared one pauses the bucket. The refused request goes back to the head of
//!   its queue (up to [`ClientConfig::max_retries`] times; after that its response is the
//!   caller's). With no retry-after, the core waits
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
use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Op, Policy, State};

use crate::headers::{Observation, Refusal, Scope};
use crate::route::Route;

/// A request's handle in the core, in submission order.
pub type RequestId = u64;

/// How the client behaves; the defaults suit any API, [`ClientConfig::discord`] adds
/// Discord's global and invalid-request limits.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Applied to every request (except global-exempt routes) just before it goes.
    pub global: Option<Policy>,
    /// Counts invalid requests (401, 403, 429 other than `shared`); when it refuses,
    /// requests fail fast instead of risking a ban.
    pub invalid_budget: Option<Policy>,
    /// The share of the invalid-request budget at which a warning is logged (0.8).
    pub invalid_warn_at: f64,
    /// How long a pioneer's slot stays closed after an error response without rate-limit
    /// headers (1 s).
    pub headerless_backoff: Duration,
    /// The wait after a refusal that gave no retry-after (60 s, as GitHub asks), doubled
    /// for each such refusal in a row, up to `max_backoff`.
    pub missing_retry_after: Duration,
    /// The longest wait a missing retry-after leads to (15 min).
    pub max_backoff: Duration,
    /// The default deadline of a request's wait (`None`: wait as long as it takes).
    pub max_wait: Option<Duration>,
    /// How often a refused request is put back in its queue before its refusal is given
    /// to the caller (3).
    pub max_retries: u32,
    /// How many pioneers of unknown routes may be in flight at once per major parameter,
    /// and so how many calls known buckets of that parameter keep back while unknown
    /// routes wait. 1 for Discord, where many routes share
    /// small buckets; 8 by default, for APIs whose routes are many and whose buckets are
    /// large (GitHub: 5,000 per hour for every route).
    pub pioneers_per_major: u32,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            global: None,
            invalid_budget: None,
            invalid_warn_at: 0.8,
            headerless_backoff: Duration::from_secs(1),
            missing_retry_after: Duration::from_secs(60),
            max_backoff: Duration::from_secs(900),
            max_wait: None,
            max_retries: 3,
            pioneers_per_major: 8,
        }
    }
}

impl ClientConfig {
    /// No global limit, no invalid-request budget.
    pub fn new() -> ClientConfig {
        ClientConfig::default()
    }

    /// Discord's rules: 50 requests per second per token (`gcra:rate=50/s,burst=1`: at
    /// most 50 in any second) and 10,000 invalid requests per 10 minutes
    /// (`fixed_window:limit=10000,window=10m`).
    pub fn discord() -> ClientConfig {
        ClientConfig {
            global: Some(
                "gcra:rate=50/s,burst=1"
                    .parse()
                    .expect("a valid built-in policy"),
            ),
            invalid_budget: Some(
                "fixed_window:limit=10000,window=10m"
                    .parse()
                    .expect("a valid built-in policy"),
            ),
            pioneers_per_major: 1,
            ..ClientConfig::default()
        }
    }

    /// The same configuration with this global limit.
    pub fn global(mut self, policy: Policy) -> ClientConfig {
        self.global = Some(policy);
        self
    }

    /// The same configuration with this invalid-request budget.
    pub fn invalid_budget(mut self, policy: Policy) -> ClientConfig {
        self.invalid_budget = Some(policy);
        self
    }

    /// The same configuration with this default deadline for waits.
    pub fn max_wait(mut self, max_wait: Duration) -> ClientConfig {
        self.max_wait = Some(max_wait);
        self
    }
}

/// Why the client gave up on a request without sending it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request would have waited longer than its `max_wait`.
    #[error("the rate limit would delay this request {}, longer than its max_wait of {max_wait:?}; retry later or raise max_wait", match would_wait { Some(d) => format!("{d:?}"), None => "for an unknown time (its bucket's limits are not known yet)".into() })]
    WaitExceeded {
        /// The deadline the request had.
        max_wait: Duration,
        /// How long it would have waited, when the core could tell.
        would_wait: Option<Duration>,
    },
    /// The invalid-request budget is spent: sending more risks a ban.
    #[error("the invalid-request budget (401, 403 and 429 responses) is spent; requests fail until it recovers in {retry_after:?}")]
    InvalidBudget {
        /// When the budget admits again.
        retry_after: Duration,
    },
    /// The client was shut down.
    #[error("the client limiter was dropped")]
    Closed,
}

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

/// A bucket: a learned bucket id and a major parameter, or a route's own queue while its
/// bucket is unknown.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct BucketKey {
    id: Arc<str>,
    major: Arc<str>,
}

/// What the core knows of a bucket's limit.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Known {
    /// Nothing yet: one pioneer at a time.
    Unknown,
    /// A success came without rate-limit headers: no limit to keep.
    Unlimited,
    /// From headers.
    Limited {
        limit: u64,
        /// Requests that may still go in this window (each admission counts one down).
        remaining: u64,
        reset_at: u64,
        /// The window's length, the longest reset-after seen.
        window: u64,
        /// After a local reset: the earliest time of the next release.
        paced_next: Option<u64>,
    },
}

impl Known {
    /// The same knowledge at `now`: a limited bucket whose window has passed is assumed
    /// back at its limit, its releases paced over the new window until responses say more.
    fn at(self, now: u64) -> Known {
        match self {
            Known::Limited {
                limit,
                reset_at,
                window,
                paced_next,
                ..
            } if now >= reset_at => Known::Limited {
                limit,
                remaining: limit,
                reset_at: now + window,
                window,
                paced_next: Some(paced_next.unwrap_or(now).max(now)),
            },
            known => known,
        }
    }
}

#[derive(Debug)]
struct Bucket {
    known: Known,
    /// The admission numbers of its requests in flight.
    flying: BTreeSet<u64>,
    pioneer: bool,
    paused_until: u64,
    queue: VecDeque<RequestId>,
}

impl Bucket {
    fn new() -> Bucket {
        Bucket {
            known: Known::Unknown,
            flying: BTreeSet::new(),
            pioneer: false,
            paused_until: 0,
            queue: VecDeque::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReqState {
    Waiting,
    /// Admitted as the `seq`-th request of the core.
    Admitted {
        pioneer: bool,
        seq: u64,
    },
}

#[derive(Debug)]
struct Req {
    route: Route,
    bucket: BucketKey,
    state: ReqState,
    submitted: u64,
    deadline: Option<(u64, Duration)>,
    retries: u32,
}

/// How often idle buckets are dropped: once a second at most.
const PRUNE_EVERY_US: u64 = 1_000_000;

/// The most routes whose bucket an identity remembers (see [`ClientCore`]'s pruning).
pub const MAX_ROUTES: usize = 65_536;

/// Two resets less than this apart are the same window (responses travel at different
/// speeds): 50 ms.
const SAME_WINDOW_US: u64 = 50_000;

/// The API client limiter's state for one identity (one token). See the module docs.
#[derive(Debug)]
pub struct ClientCore {
    config: ClientConfig,
    buckets: HashMap<BucketKey, Bucket>,
    /// Route key → the bucket id its responses named.
    routes: HashMap<Arc<str>, Arc<str>>,
    requests: HashMap<RequestId, Req>,
    /// Buckets with a request waiting (ordered, so that polls are deterministic).
    waiting: BTreeSet<BucketKey>,
    deadlines: BTreeSet<(u64, RequestId)>,
    next_id: RequestId,
    global_state: Option<State>,
    /// The last request the global limiter admitted, and the state before: restored if
    /// that request is cancelled unsent before any other is admitted.
    last_global: Option<(RequestId, Option<State>)>,
    global_paused_until: u64,
    invalid_state: Option<State>,
    invalid_warned_until: u64,
    /// Refusals without a retry-after in a row.
    missing_in_a_row: u32,
    /// Pioneers in flight per major parameter.
    pioneers: HashMap<Arc<str>, u32>,
    /// When idle buckets were last dropped.
    pruned_at: u64,
    /// Requests admitted so far: each admitted request's number.
    admissions: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl ClientCore {
    /// An empty core: nothing known, nothing waiting.
    pub fn new(config: ClientConfig) -> ClientCore {
        ClientCore {
            config,
            buckets: HashMap::new(),
            routes: HashMap::new(),
            requests: HashMap::new(),
            waiting: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            next_id: 0,
            global_state: None,
            last_global: None,
            global_paused_until: 0,
            invalid_state: None,
            invalid_warned_until: 0,
            missing_in_a_row: 0,
            pioneers: HashMap::new(),
            pruned_at: 0,
            admissions: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    fn bucket_key(&self, route: &Route) -> BucketKey {
        match self.routes.get(route.key()) {
            Some(id) => BucketKey {
                id: Arc::clone(id),
                major: Arc::clone(route.major_arc()),
            },
            // NUL never appears in a header value, so no learned id looks like this.
            None => BucketKey {
                id: Arc::from(format!("\0{}", route.key_arc())),
                major: Arc::clone(route.major_arc()),
            },
        }
    }

    /// When the invalid-request budget admits again, if it is spent now.
    fn budget_spent(&self, now: u64) -> Option<Duration> {
        let policy = self.config.invalid_budget.as_ref()?;
        let mut state = self.invalid_state.clone();
        match policy.apply(&mut state, now, Op::Limit, 1) {
            Ok(d) if !d.allowed => Some(d.delay),
            _ => None,
        }
    }

    /// Puts a request for `route` in its bucket's queue at `now`, with `max_wait` (or the
    /// configuration's) as its deadline. Fails at once when the invalid-request budget is
    /// spent, or when the core can tell the wait would pass the deadline.
    pub fn submit(
        &mut self,
        route: Route,
        now: u64,
        max_wait: Option<Duration>,
    ) -> Result<RequestId, ClientError> {
        if let Some(retry_after) = self.budget_spent(now) {
            return Err(ClientError::InvalidBudget { retry_after });
        }
        let key = self.bucket_key(&route);
        let id = self.next_id;
        self.next_id += 1;
        let bucket = self.buckets.entry(key.clone()).or_insert_with(Bucket::new);
        bucket.queue.push_back(id);
        let position = bucket.queue.len() - 1;
        let max_wait = max_wait.or(self.config.max_wait);
        if let Some(max_wait) = max_wait {
            if let Some(start) = self.estimate(&key, position, route.is_global_exempt(), now) {
                let would_wait = start.saturating_sub(now);
                if would_wait > micros(max_wait) {
                    if let Some(b) = self.buckets.get_mut(&key) {
                        b.queue.pop_back();
                    }
                    return Err(ClientError::WaitExceeded {
                        max_wait,
                        would_wait: Some(Duration::from_micros(would_wait)),
                    });
                }
            }
            let at = now.saturating_add(micros(max_wait));
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
                deadline: max_wait.map(|d| (now.saturating_add(micros(d)), d)),
                retries: 0,
            },
        );
        Ok(id)
    }

    /// The earliest start of the request at `position` in the bucket's queue, if the core
    /// can tell (not while the bucket is unknown, beyond its pioneer).
    fn estimate(&self, key: &BucketKey, position: usize, exempt: bool, now: u64) -> Option<u64> {
        let b = self.buckets.get(key)?;
        let mut base = now.max(b.paused_until);
        if !exempt {
            base = base.max(self.global_paused_until);
        }
        let k = position as u64;
        match b.known.at(now) {
            Known::Unknown => (k == 0 && !b.pioneer).then_some(base),
            Known::Unlimited => Some(base),
            Known::Limited {
                limit,
                remaining,
                reset_at,
                window,
                paced_next,
            } => {
                let spacing = window / limit.max(1);
                Some(match paced_next {
                    Some(t) if k < remaining => base.max(t) + k * spacing,
                    None if k < remaining => base,
                    _ => base.max(reset_at) + (k - remaining) * spacing,
                })
            }
        }
    }

    /// Whether the request at the head of the bucket may go at `now`: `Ok(pioneer)`, or
    /// `Err(Some(t))` to wait until `t`, `Err(None)` to wait for a response. `pioneer_until`
    /// is `None` when an unknown bucket may send its pioneer now, else how long it must
    /// wait; `reserve` is how many calls a known bucket keeps back for pioneers that may
    /// turn out to share it. Changes nothing but a local reset of a bucket whose window
    /// has passed.
    fn bucket_ready(
        b: &mut Bucket,
        now: u64,
        pioneer_until: Option<Option<u64>>,
        reserve: u64,
    ) -> Result<bool, Option<u64>> {
        if b.paused_until > now {
            return Err(Some(b.paused_until));
        }
        // A window is assumed over only once nothing sent to the bucket is in flight: the
        // server may have started its window late, when one of those arrived, and their
        // answers say when it really ends.
        // Nor for longer than a further window: a request whose answer never comes
        // (a permit kept or leaked) does not hold the bucket for good.
        let overdue = matches!(b.known, Known::Limited { reset_at, window, .. }
            if now >= reset_at.saturating_add(window));
        if b.flying.is_empty() || overdue {
            b.known = b.known.at(now);
        }
        match b.known {
            Known::Unknown => match (b.pioneer, pioneer_until) {
                (false, None) => Ok(true),
                (true, _) => Err(None),
                (false, Some(until)) => Err(until),
            },
            Known::Unlimited => Ok(false),
            Known::Limited {
                remaining,
                reset_at,
                window,
                paced_next,
                ..
            } => {
                if remaining <= reserve {
                    // Past the reset with requests in flight: their answers say more, or
                    // a further window passes.
                    return Err(Some(if now < reset_at {
                        reset_at
                    } else {
                        reset_at.saturating_add(window)
                    }));
                }
                match paced_next {
                    Some(t) if t > now => Err(Some(t)),
                    _ => Ok(false),
                }
            }
        }
    }

    /// Per major parameter: whether a route of unknown bucket waits and may send its
    /// pioneer (one backing off after an error does not hold calls back, so that known
    /// buckets, even of limit 1, are not starved meanwhile), and the earliest reset of its
    /// known buckets that have no call left (a pioneer could land on one).
    fn discovery(&self, now: u64) -> (HashSet<Arc<str>>, HashMap<Arc<str>, u64>) {
        let mut unknown = HashSet::new();
        for key in &self.waiting {
            if self
                .buckets
                .get(key)
                .is_some_and(|b| b.known == Known::Unknown && b.paused_until <= now)
            {
                unknown.insert(Arc::clone(&key.major));
            }
        }
        let mut exhausted: HashMap<Arc<str>, u64> = HashMap::new();
        if !unknown.is_empty() {
            for (key, b) in &self.buckets {
                if !unknown.contains(&key.major) {
                    continue;
                }
                let until = match b.known {
                    Known::Limited {
                        remaining: 0,
                        reset_at,
                        ..
                    } if reset_at > now => reset_at,
                    _ if b.paused_until > now && b.known != Known::Unknown => b.paused_until,
                    _ => continue,
                };
                let e = exhausted.entry(Arc::clone(&key.major)).or_insert(until);
                *e = (*e).min(until);
            }
        }
        (unknown, exhausted)
    }

    fn commit_bucket(b: &mut Bucket, pioneer: bool, seq: u64, now: u64) {
        if let Known::Limited {
            limit,
            remaining,
            window,
            paced_next,
            ..
        } = &mut b.known
        {
            *remaining -= 1;
            if let Some(t) = paced_next {
                // Anchored to the schedule, not to when the release happened: a release a
                // timer tick late does not push every later one back. After a pause longer
                // than a step, the schedule starts again from now.
                let spacing = *window / (*limit).max(1);
                *t = if now > t.saturating_add(spacing) {
                    now
                } else {
                    *t
                } + spacing;
            }
        }
        b.flying.insert(seq);
        b.pioneer |= pioneer;
    }

    /// The requests that may be sent at `now`, those that failed, and when to poll again.
    pub fn poll(&mut self, now: u64) -> Poll {
        let mut out = Poll::default();
        self.expire_deadlines(now, &mut out);
        let spent = self.budget_spent(now);
        let (unknown, exhausted) = self.discovery(now);
        let keys: Vec<BucketKey> = self.waiting.iter().cloned().collect();
        let mut next: Option<u64> = self.deadlines.first().map(|&(at, _)| at);
        let mut earliest = |t: u64| next = Some(next.map_or(t, |n: u64| n.min(t)));
        for key in keys {
            while let Some(b) = self.buckets.get_mut(&key) {
                let Some(&id) = b.queue.front() else {
                    break;
                };
                let Some(req) = self.requests.get(&id) else {
                    b.queue.pop_front();
                    continue;
                };
                if let Some(retry_after) = spent {
                    b.queue.pop_front();
                    self.forget(id);
                    out.failed
                        .push((id, ClientError::InvalidBudget { retry_after }));
                    continue;
                }
                let exempt = req.route.is_global_exempt();
                if !exempt && self.global_paused_until > now {
                    earliest(self.global_paused_until);
                    break;
                }
                // Pioneers of unknown routes go one at a time per major parameter, and
                // only while every known bucket of it has a call left (which known
                // buckets keep back while unknown routes wait): a route that turns out to
                // share a known bucket then never meets it spent.
                let major = &key.major;
                let flying = self.pioneers.get(major).copied().unwrap_or(0);
                let allowed = self.config.pioneers_per_major.max(1);
                let pioneer_until = if flying >= allowed {
                    Some(None)
                } else {
                    exhausted.get(major).map(|&t| Some(t))
                };
                let reserve = if unknown.contains(major) || flying > 0 {
                    u64::from(allowed)
                } else {
                    0
                };
                let pioneer = match Self::bucket_ready(b, now, pioneer_until, reserve) {
                    Ok(pioneer) => pioneer,
                    Err(wait) => {
                        if let Some(t) = wait {
                            earliest(t);
                        }
                        break;
                    }
                };
                if !exempt {
                    if let Some(policy) = &self.config.global {
                        let before = self.global_state.clone();
                        match policy.apply(&mut self.global_state, now, Op::Limit, 1) {
                            Ok(d) if !d.allowed => {
                                earliest(now + micros(d.delay).max(1));
                                break;
                            }
                            Ok(_) => self.last_global = Some((id, before)),
                            // The global policy refuses a cost of 1 only if it can never
                            // admit anything; the request goes unlimited rather than hang.
                            Err(e) => tracing::warn!(error = %e, "the global policy failed"),
                        }
                    }
                }
                let Some(b) = self.buckets.get_mut(&key) else {
                    break;
                };
                b.queue.pop_front();
                self.admissions += 1;
                let seq = self.admissions;
                Self::commit_bucket(b, pioneer, seq, now);
                if pioneer {
                    *self.pioneers.entry(Arc::clone(&key.major)).or_insert(0) += 1;
                }
                if let Some(req) = self.requests.get_mut(&id) {
                    req.state = ReqState::Admitted { pioneer, seq };
                    if let Some((at, _)) = req.deadline {
                        self.deadlines.remove(&(at, id));
                    }
                }
                out.go.push(id);
            }
            if self.buckets.get(&key).is_none_or(|b| b.queue.is_empty()) {
                self.waiting.remove(&key);
            }
        }
        if let Some(t) = self.deadlines.first().map(|&(at, _)| at) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        out.next = next;
        self.prune(now);
        out
    }

    fn expire_deadlines(&mut self, now: u64, out: &mut Poll) {
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
            self.unqueue(id);
            self.forget(id);
            out.failed.push((
                id,
                ClientError::WaitExceeded {
                    max_wait,
                    would_wait: None,
                },
            ));
        }
    }

    /// Takes a waiting request out of its bucket's queue.
    fn unqueue(&mut self, id: RequestId) {
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        if let Some(b) = self.buckets.get_mut(&req.bucket) {
            if let Some(i) = b.queue.iter().position(|&q| q == id) {
                b.queue.remove(i);
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

    /// Drops buckets that hold nothing and whose knowledge has gone stale (a limited
    /// bucket a window after its reset; an unknown or unlimited one once idle), at most
    /// once a second, so memory follows the buckets in use; and once more than
    /// [`MAX_ROUTES`] routes are known, forgets those whose buckets are gone (or, if that
    /// is not enough, all of them: each is learned again by a pioneer).
    fn prune(&mut self, now: u64) {
        if now < self.pruned_at.saturating_add(PRUNE_EVERY_US) {
            return;
        }
        self.pruned_at = now;
        self.buckets.retain(|_, b| {
            let idle = b.queue.is_empty() && b.flying.is_empty() && b.paused_until <= now;
            let stale = match b.known {
                Known::Limited {
                    reset_at, window, ..
                } => now >= reset_at.saturating_add(window),
                _ => true,
            };
            !(idle && stale)
        });
        if self.routes.len() > MAX_ROUTES {
            let live: HashSet<&Arc<str>> = self.buckets.keys().map(|k| &k.id).collect();
            self.routes.retain(|_, id| live.contains(id));
            if self.routes.len() > MAX_ROUTES {
                self.routes.clear();
            }
        }
    }

    /// Ends an admitted request's slot: one fewer in flight, the pioneer slot free.
    /// Answers the request, taken out of the core.
    fn release(&mut self, id: RequestId) -> Option<Req> {
        let req = self.requests.remove(&id)?;
        let ReqState::Admitted { pioneer, seq } = req.state else {
            // Not admitted: a waiting request is taken out of its queue instead.
            self.requests.insert(id, req);
            return None;
        };
        if let Some(b) = self.buckets.get_mut(&req.bucket) {
            b.flying.remove(&seq);
            if pioneer {
                b.pioneer = false;
            }
        }
        if pioneer {
            if let Some(n) = self.pioneers.get_mut(&req.bucket.major) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.pioneers.remove(&req.bucket.major);
                }
            }
        }
        Some(req)
    }

    /// The connection broke or timed out before a response, at `now`: that request fails
    /// (the caller reports its error); its slot is released at once and the queue goes on.
    /// A pioneer's route, still unknown, backs off as after an error without headers, so
    /// that a failing route neither hammers nor holds known buckets' calls back.
    pub fn failed(&mut self, id: RequestId, now: u64) {
        let Some(req) = self.release(id) else {
            return;
        };
        if let ReqState::Admitted { pioneer: true, .. } = req.state {
            if let Some(b) = self.buckets.get_mut(&req.bucket) {
                if b.known == Known::Unknown {
                    b.paused_until = b
                        .paused_until
                        .max(now.saturating_add(micros(self.config.headerless_backoff)));
                }
            }
        }
    }

    /// The caller gave up on the request (its future was dropped). A waiting request
    /// leaves its queue; an admitted one frees its slot, and if it was never `sent`, gives
    /// back its count in the bucket and, if no request was admitted by the global limiter
    /// after it, its global token.
    pub fn cancel(&mut self, id: RequestId, sent: bool) {
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        if req.state == ReqState::Waiting {
            self.unqueue(id);
            self.forget(id);
            return;
        }
        let Some(req) = self.release(id) else {
            return;
        };
        if sent {
            return;
        }
        if let Some(b) = self.buckets.get_mut(&req.bucket) {
            if let Known::Limited {
                limit, remaining, ..
            } = &mut b.known
            {
                *remaining = remaining.saturating_add(1).min(*limit);
            }
        }
        if let Some((last, before)) = self.last_global.take() {
            if last == id {
                self.global_state = before;
            } else {
                self.last_global = Some((last, before));
            }
        }
    }

    /// The response of an admitted request came, with `status` and what its headers said.
    /// Learns from it, and answers whether the request is done or goes round again (a
    /// refusal, requeued at the head of its bucket).
    pub fn complete(
        &mut self,
        id: RequestId,
        status: u16,
        seen: &Observation,
        now: u64,
    ) -> Completion {
        let Some(mut req) = self.release(id) else {
            return Completion::Done;
        };
        for problem in &seen.problems {
            tracing::warn!(route = req.route.key(), "{problem}");
        }
        let (was_pioneer, seq) = match req.state {
            ReqState::Admitted { pioneer, seq } => (pioneer, seq),
            ReqState::Waiting => (false, 0),
        };
        // Learn the route's bucket, and move its waiting requests there.
        if let Some(bucket) = &seen.bucket {
            let learned = BucketKey {
                id: Arc::from(bucket.as_str()),
                major: Arc::clone(req.route.major_arc()),
            };
            self.routes
                .insert(Arc::clone(req.route.key_arc()), Arc::clone(&learned.id));
            if learned != req.bucket {
                self.move_route(&req.bucket, &learned, req.route.key());
                // A route's own queue, emptied, has served its purpose.
                if req.bucket.id.starts_with('\0')
                    && self
                        .buckets
                        .get(&req.bucket)
                        .is_some_and(|b| b.queue.is_empty() && b.flying.is_empty())
                {
                    self.buckets.remove(&req.bucket);
                    self.waiting.remove(&req.bucket);
                }
                req.bucket = learned;
            }
        }
        let b = self
            .buckets
            .entry(req.bucket.clone())
            .or_insert_with(Bucket::new);
        if seen.has_limits() {
            Self::learn(b, seen, seq, was_pioneer, now);
        } else if (200..400).contains(&status) && seen.refusal.is_none() {
            if b.known == Known::Unknown {
                b.known = Known::Unlimited;
            }
        } else if was_pioneer && b.known == Known::Unknown && seen.refusal.is_none() {
            // An error without headers (a proxy's 502): the pioneer learned nothing; the
            // next one goes after a backoff, so the queue neither hangs nor hammers.
            b.paused_until = b
                .paused_until
                .max(now + micros(self.config.headerless_backoff));
        }
        let shared = seen.refusal.is_some_and(|r| r.scope == Scope::Shared);
        if status == 401
            || status == 403 && seen.refusal.is_none()
            || seen.refusal.is_some() && !shared
        {
            self.count_invalid(now);
        }
        if (200..300).contains(&status) {
            self.missing_in_a_row = 0;
        }
        let Some(refusal) = seen.refusal else {
            return Completion::Done;
        };
        let until = self.refused(&req.bucket, refusal, now);
        // Out of retries, or the pause ends past its deadline: the refusal is the caller's
        // (rather than a deadline error with no retry-after in it).
        if req.retries >= self.config.max_retries || req.deadline.is_some_and(|(at, _)| at < until)
        {
            return Completion::Done;
        }
        req.retries += 1;
        req.state = ReqState::Waiting;
        let key = req.bucket.clone();
        let b = self.buckets.entry(key.clone()).or_insert_with(Bucket::new);
        b.queue.push_front(id);
        self.waiting.insert(key);
        if let Some((at, _)) = req.deadline {
            self.deadlines.insert((at, id));
        }
        self.requests.insert(id, req);
        Completion::Retry
    }

    /// Pauses what the refusal names; answers when the pause ends.
    fn refused(&mut self, key: &BucketKey, refusal: Refusal, now: u64) -> u64 {
        let wait = match refusal.retry_after {
            Some(d) => micros(d),
            None => {
                let base = micros(self.config.missing_retry_after);
                let doubled = base.saturating_mul(1u64 << self.missing_in_a_row.min(20));
                self.missing_in_a_row = self.missing_in_a_row.saturating_add(1);
                doubled.min(micros(self.config.max_backoff))
            }
        };
        let until = now.saturating_add(wait.max(1));
        match refusal.scope {
            Scope::Global => self.global_paused_until = self.global_paused_until.max(until),
            Scope::Bucket | Scope::Shared => {
                if let Some(b) = self.buckets.get_mut(key) {
                    b.paused_until = b.paused_until.max(until);
                    if let Known::Limited { remaining, .. } = &mut b.known {
                        *remaining = 0;
                    }
                }
            }
        }
        until
    }

    fn count_invalid(&mut self, now: u64) {
        let Some(policy) = &self.config.invalid_budget else {
            return;
        };
        if let Ok(d) = policy.apply(&mut self.invalid_state, now, Op::Limit, 1) {
            let used = d.limit.saturating_sub(d.remaining);
            if used as f64 >= self.config.invalid_warn_at * d.limit as f64
                && now >= self.invalid_warned_until
            {
                self.invalid_warned_until = now + micros(d.reset_after);
                tracing::warn!(
                    used,
                    limit = d.limit,
                    "the invalid-request budget (401, 403, 429) is {:.0} % used; at the budget requests fail fast",
                    100.0 * used as f64 / d.limit.max(1) as f64
                );
            }
        }
    }

    /// Updates a bucket from a response's limits.
    /// Updates a bucket from the limits in the answer to the `seq`-th admitted request
    /// (a `pioneer`'s, if it was sent before its route's bucket was known).
    ///
    /// What the server says is left does not count requests still in flight. Our own count
    /// already does, except for a pioneer that lands on a known bucket: requests admitted
    /// to the bucket after it are not in its answer's count yet, and are taken off it.
    fn learn(b: &mut Bucket, seen: &Observation, seq: u64, pioneer: bool, now: u64) {
        let (Some(left), Some(reset_after)) = (seen.remaining, seen.reset_after) else {
            return;
        };
        let reset_after = micros(reset_after);
        let reset_at = now.saturating_add(reset_after);
        let in_flight = b.flying.len() as u64;
        let later = b.flying.range(seq.saturating_add(1)..).count() as u64;
        b.known = match b.known {
            Known::Limited {
                limit,
                remaining,
                reset_at: ours,
                window,
                ..
            } => {
                let limit = seen.limit.unwrap_or(limit).max(1);
                let window = window.max(reset_after);
                if reset_at > ours.saturating_add(SAME_WINDOW_US) {
                    // The server's window is newer than ours: trust its count, less what
                    // is in flight and may not be in it yet; its own word ends the pacing
                    // of a local reset.
                    Known::Limited {
                        limit,
                        remaining: left.saturating_sub(in_flight).min(limit),
                        reset_at,
                        window,
                        paced_next: None,
                    }
                } else if reset_at.saturating_add(SAME_WINDOW_US) < ours {
                    // An answer from a window that has passed (sent before our reset): it
                    // says nothing of this one.
                    return;
                } else {
                    // This window, as we count it: the lower count wins, and the server's
                    // word ends the pacing of a local reset. A pioneer that lands here was
                    // never in our tally: it is now, and what the bucket admitted after it
                    // is not in the server's count yet.
                    let (ours, left) = if pioneer {
                        (remaining.saturating_sub(1), left.saturating_sub(later))
                    } else {
                        (remaining, left)
                    };
                    Known::Limited {
                        limit,
                        remaining: ours.min(left),
                        reset_at: ours.max(reset_at),
                        window,
                        paced_next: None,
                    }
                }
            }
            Known::Unknown | Known::Unlimited => {
                let limit = seen.limit.unwrap_or_else(|| left.saturating_add(1)).max(1);
                Known::Limited {
                    limit,
                    remaining: left.saturating_sub(in_flight).min(limit),
                    reset_at,
                    window: reset_after.max(1),
                    paced_next: None,
                }
            }
        };
    }

    /// Moves the waiting requests of `route` from bucket `from` to bucket `to`, keeping
    /// submission order.
    fn move_route(&mut self, from: &BucketKey, to: &BucketKey, route: &str) {
        let Some(old) = self.buckets.get_mut(from) else {
            return;
        };
        let requests = &mut self.requests;
        let (moving, staying): (Vec<RequestId>, Vec<RequestId>) = old
            .queue
            .iter()
            .partition(|id| requests.get(id).is_some_and(|r| r.route.key() == route));
        if moving.is_empty() {
            return;
        }
        old.queue = staying.into();
        for id in &moving {
            if let Some(r) = requests.get_mut(id) {
                r.bucket = to.clone();
            }
        }
        let new = self.buckets.entry(to.clone()).or_insert_with(Bucket::new);
        let mut merged: Vec<RequestId> = new.queue.drain(..).chain(moving).collect();
        merged.sort_unstable();
        new.queue = merged.into();
        self.waiting.insert(to.clone());
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

    /// How many buckets the core holds state for (learned, or a route's own queue).
    pub fn buckets_held(&self) -> usize {
        self.buckets.len()
    }

    /// When the request was submitted, if the core still holds it.
    pub fn submitted_at(&self, id: RequestId) -> Option<u64> {
        self.requests.get(&id).map(|r| r.submitted)
    }
}
