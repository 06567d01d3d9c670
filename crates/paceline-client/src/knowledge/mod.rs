//! What an identity has learned of an API's limits: the half of the client limiter that
//! processes share.
//!
//! The client limiter has two halves. Each process keeps its own requests: who waits, in
//! which order, until when ([`ClientCore`](crate::ClientCore)). What the server said is
//! *knowledge*, and every process sending with one token must share it, or N processes
//! spend N times the limit: the route → bucket map, each bucket's remaining calls, reset
//! and pause, the requests in flight and the pioneer of an unknown bucket, the global
//! limiter's state and pause, the invalid-request budget.
//!
//! [`Knowledge`] is that half as a pure state machine on injected time, with three steps:
//!
//! - [`admit`](Knowledge::admit): a process's waiting queues ask to go ([`Ask`]); the
//!   answer says, per queue, how many of its first requests go now and when to ask again;
//! - [`answer`](Knowledge::answer): a response came ([`Report`]); learn from it;
//! - [`release`](Knowledge::release): a request ended without an answer (a broken
//!   connection, or a caller that gave up).
//!
//! In one process, the [`ClientCore`](crate::ClientCore) holds a `Knowledge` of its own.
//! On Redis, the same three steps run as one Lua function each (`lua/client.lua`, its twin
//! rule for rule), one atomic call per step, so processes and proxies on one Redis share
//! every limit; a differential test holds the twins equal.
//!
//! Knowledge never waits for anyone: a request in flight whose end is never reported (its
//! process died) stops counting after [`ClientConfig::in_flight_lease`], and every record
//! is dropped once it says nothing more (a bucket a window after its reset).
//!
//! A process that shares the knowledge through Redis makes one call per
//! [`round`](Knowledge::round): the events it has to tell, then its asks. A call carries a
//! [`CallId`], so that a call whose answer was lost on the way (a broken connection, a
//! time-out after Redis applied it) can be made again: the repeat is answered as the first
//! call was, and nothing is admitted, ended or learned twice.
//!
//! A process on Redis saves most of those calls for buckets without limit: it leases a few
//! sends ahead in a call and tells their plain answers with the next ([`leases`]).
//!
//! The state machine is here; what it is told and answers (asks, grants, reports, events,
//! call ids) is in `messages`, and the records it keeps (buckets, major parameters, kept
//! answers, and [`BucketView`]) in `records`. It depends on the [`ClientConfig`] alone of
//! the core's side: the core uses the knowledge, never the other way round.

pub mod leases;
pub(crate) mod messages;
mod records;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Op, State};

use crate::config::ClientConfig;
use crate::headers::{Observation, Refusal, Scope};
pub use leases::{Leases, Plan};
pub(crate) use messages::Event;
pub use messages::{Admission, Admitted, Answered, Ask, CallId, Grant, Report, RoundAnswer, Wait};
pub use records::BucketView;
use records::Kept;
pub(crate) use records::{Bucket, BucketKey, Known, Major};

/// Two resets less than this apart are the same window (responses travel at different
/// speeds): 50 ms.
pub(crate) const SAME_WINDOW_US: u64 = 50_000;

/// How long a bucket is remembered after it was last asked about (and, when limited, at
/// least a window after its reset): 10 s.
pub(crate) const KEEP_US: u64 = 10_000_000;

/// How long a process's wish to send a pioneer holds known buckets' calls back without
/// being renewed: 2 s (a waiting process asks again at least every second).
pub(crate) const WANT_US: u64 = 2_000_000;

/// How often idle records are dropped: once a second at most.
const PRUNE_EVERY_US: u64 = 1_000_000;

/// The most routes whose bucket an identity remembers: beyond that the map starts again
/// empty, and each route is learned again by a pioneer.
pub const MAX_ROUTES: usize = 65_536;

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// How long a refusal pauses what it names, in µs: its retry-after, or without one
/// `missing_retry_after` doubled for each such refusal in a row (`in_a_row`, counted up),
/// up to `max_backoff`.
pub(crate) fn refusal_wait(
    config: &ClientConfig,
    retry_after: Option<Duration>,
    in_a_row: &mut u32,
) -> u64 {
    match retry_after {
        Some(d) => micros(d),
        None => {
            let base = micros(config.missing_retry_after);
            let doubled = base.saturating_mul(1u64 << (*in_a_row).min(20));
            *in_a_row = in_a_row.saturating_add(1);
            doubled.min(micros(config.max_backoff))
        }
    }
}

/// The bucket id of a route whose bucket is unknown: its key after a NUL, which never
/// appears in a header value, so no learned id looks like it.
pub(crate) fn own_bucket(route: &str) -> Arc<str> {
    Arc::from(format!("\0{route}"))
}

/// Whether `id` is a route's own bucket (its real one not learned yet).
pub(crate) fn is_own(id: &str) -> bool {
    id.starts_with('\0')
}

/// An identity's knowledge (one token): see the [module docs](self).
#[derive(Debug)]
pub struct Knowledge {
    config: ClientConfig,
    pub(crate) buckets: HashMap<BucketKey, Bucket>,
    /// Route key → the bucket id its responses named.
    pub(crate) routes: HashMap<Arc<str>, Arc<str>>,
    pub(crate) majors: HashMap<Arc<str>, Major>,
    global_state: Option<State>,
    /// The last admission the global limiter counted, and its state before: restored if
    /// that request is given back unsent before any other is counted.
    last_global: Option<(u64, Option<State>)>,
    pub(crate) global_paused_until: u64,
    invalid_state: Option<State>,
    invalid_warned_until: u64,
    /// Refusals without a retry-after in a row.
    missing_in_a_row: u32,
    /// Admissions so far: each admitted request's number.
    pub(crate) admissions: u64,
    pruned_at: u64,
    /// The answers of the rounds that counted something, by call id, each for the
    /// in-flight lease.
    calls: HashMap<CallId, Kept>,
    calls_pruned_at: u64,
}

impl Knowledge {
    /// Nothing known.
    pub fn new(config: ClientConfig) -> Knowledge {
        Knowledge {
            config,
            buckets: HashMap::new(),
            routes: HashMap::new(),
            majors: HashMap::new(),
            global_state: None,
            last_global: None,
            global_paused_until: 0,
            invalid_state: None,
            invalid_warned_until: 0,
            missing_in_a_row: 0,
            admissions: 0,
            pruned_at: 0,
            calls: HashMap::new(),
            calls_pruned_at: 0,
        }
    }

    fn lease(&self) -> u64 {
        micros(self.config.in_flight_lease).max(1)
    }

    /// The bucket `route` is filed under, given the bucket its process files it under.
    pub(crate) fn resolve(&self, route: &str, filed: &Arc<str>) -> Arc<str> {
        match self.routes.get(route) {
            Some(id) => Arc::clone(id),
            // The map was dropped (or never held it): a learned id stays learned.
            None if !is_own(filed) => Arc::clone(filed),
            None => own_bucket(route),
        }
    }

    /// The bucket's record at `now` (its expired requests in flight forgotten), created
    /// unknown when absent or expired.
    fn load(&mut self, key: &BucketKey, now: u64) -> &mut Bucket {
        let lease = self.lease();
        let b = self
            .buckets
            .entry(key.clone())
            .or_insert_with(|| Bucket::new(now));
        if b.expires(lease) <= now {
            *b = Bucket::new(now);
        }
        b.settle(now, lease);
        b
    }

    /// Notes whether the bucket has a call left, for discovery.
    fn mark(&mut self, key: &BucketKey, now: u64) {
        let until = self.buckets.get(key).and_then(|b| b.exhausted(now));
        let m = self.majors.entry(Arc::clone(&key.1)).or_default();
        match until {
            Some(t) => {
                m.exhausted.insert(Arc::clone(&key.0), t);
            }
            None => {
                m.exhausted.remove(&key.0);
            }
        }
    }

    /// The major parameter's pioneers in flight at `now`.
    fn pioneers(&mut self, major: &Arc<str>, now: u64) -> u32 {
        let lease = self.lease();
        self.majors.get_mut(major).map_or(0, |m| {
            m.pioneers.retain(|_, at| at.saturating_add(lease) > now);
            u32::try_from(m.pioneers.len()).unwrap_or(u32::MAX)
        })
    }

    /// Whether a route of unknown bucket of the major waits to send its pioneer, and the
    /// earliest time a known bucket of it has a call again (if one has none).
    fn discovery(&mut self, major: &Arc<str>, now: u64) -> (bool, Option<u64>) {
        let Some(m) = self.majors.get_mut(major) else {
            return (false, None);
        };
        m.wants.retain(|_, until| *until > now);
        m.exhausted.retain(|_, until| *until > now);
        let wanted = !m.wants.is_empty();
        (wanted, m.exhausted.values().min().copied())
    }

    /// When the invalid-request budget admits again, if it is spent now.
    pub(crate) fn budget_spent(&self, now: u64) -> Option<Duration> {
        let policy = self.config.invalid_budget.as_ref()?;
        let mut state = self.invalid_state.clone();
        match policy.apply(&mut state, now, Op::Limit, 1) {
            Ok(d) if !d.allowed => Some(d.delay),
            _ => None,
        }
    }

    /// The earliest start of a request at `position` in a queue of `route` filed under
    /// `filed`, if it can be told (not while its bucket is unknown, beyond its pioneer).
    pub(crate) fn estimate(
        &self,
        route: &str,
        major: &Arc<str>,
        filed: &Arc<str>,
        position: usize,
        exempt: bool,
        now: u64,
    ) -> Option<u64> {
        let key = (self.resolve(route, filed), Arc::clone(major));
        let lease = self.lease();
        let fresh;
        let b = match self.buckets.get(&key) {
            Some(b) if b.expires(lease) > now => b,
            _ => {
                fresh = Bucket::new(now);
                &fresh
            }
        };
        let mut base = now.max(b.paused_until);
        if !exempt {
            base = base.max(self.global_paused_until);
        }
        let k = position as u64;
        match b.known.at(now) {
            Known::Unknown => (k == 0 && b.pioneer.is_none()).then_some(base),
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

    /// Whether the next request of the bucket may go at `now`: `Ok(pioneer)`, or
    /// `Err(Some(t))` to wait until `t`, `Err(None)` to wait for a response.
    /// `pioneer_until` is `None` when an unknown bucket may send its pioneer now, else how
    /// long it must wait; `reserve` is how many calls a known bucket keeps back for
    /// pioneers that may turn out to share it. Changes nothing but a local reset of a
    /// bucket whose window has passed.
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
        // answers say when it really ends. Nor for longer than a further window: a
        // request whose answer never comes does not hold the bucket for good.
        let overdue = matches!(b.known, Known::Limited { reset_at, window, .. }
            if now >= reset_at.saturating_add(window));
        if b.flying.is_empty() || overdue {
            b.known = b.known.at(now);
        }
        match b.known {
            Known::Unknown => match (b.pioneer.is_some(), pioneer_until) {
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
        b.flying.insert(seq, now);
        if pioneer {
            b.pioneer = Some(seq);
        }
        b.touched = now;
    }

    /// One round of a [shared](crate::ClientCore::shared) core, as one call to the
    /// knowledge (on Redis, one atomic call): tells the `events` in order (each as
    /// [`Event::apply`] does), then [`admit`](Self::admit)s the `asks` if there are any, at
    /// `now`. Answers what each event taught (`None` for a release) and the admission (no
    /// grants and nothing spent when nothing was asked).
    ///
    /// Under a `call` id whose round counted something (admitted a request or told an
    /// event) less than the in-flight lease ago, answers what that round answered, and
    /// changes nothing: a call repeated because its answer was lost counts once. A repeat
    /// is made at the same `now` as its first call; the answer's times are the first
    /// call's. A round that counted nothing is not kept, and a repeat of it is a new
    /// round.
    pub fn round(
        &mut self,
        call: Option<CallId>,
        events: &[Event],
        asks: &[Ask],
        now: u64,
    ) -> RoundAnswer {
        if let Some(kept) = call.and_then(|c| self.calls.get(&c)) {
            if kept.until > now {
                return kept.answer.clone();
            }
        }
        let answered: Vec<Option<Answered>> = events.iter().map(|e| e.apply(self, now)).collect();
        let admission = if asks.is_empty() {
            Admission {
                spent: None,
                grants: Vec::new(),
            }
        } else {
            self.admit(asks, now)
        };
        let counted = !events.is_empty() || admission.grants.iter().any(|g| !g.admitted.is_empty());
        let answer = (answered, admission);
        if let (Some(call), true) = (call, counted) {
            self.forget_calls(now);
            let until = now.saturating_add(self.lease());
            self.calls.insert(
                call,
                Kept {
                    until,
                    answer: answer.clone(),
                },
            );
        }
        answer
    }

    /// Drops the kept answers whose lease ended, at most once a second.
    fn forget_calls(&mut self, now: u64) {
        if now < self.calls_pruned_at.saturating_add(PRUNE_EVERY_US) {
            return;
        }
        self.calls_pruned_at = now;
        self.calls.retain(|_, kept| kept.until > now);
    }

    /// Lets go what may go at `now` of the queues that ask, in order: per queue, its first
    /// requests up to the first that must wait.
    pub fn admit(&mut self, asks: &[Ask], now: u64) -> Admission {
        self.prune(now);
        if let Some(spent) = self.budget_spent(now) {
            return Admission {
                spent: Some(spent),
                grants: Vec::new(),
            };
        }
        // Routes of unknown bucket that wait to send their pioneer hold known buckets'
        // calls back (not while they back off after an error: known buckets, even of
        // limit 1, are not starved meanwhile).
        for ask in asks {
            let Some((route, _)) = ask.requests.first() else {
                continue;
            };
            let key = (self.resolve(route, &ask.bucket), Arc::clone(&ask.major));
            let b = self.load(&key, now);
            b.touched = now;
            if b.known == Known::Unknown && b.paused_until <= now {
                self.majors
                    .entry(Arc::clone(&ask.major))
                    .or_default()
                    .wants
                    .insert(Arc::clone(route), now + WANT_US);
            }
        }
        let grants = asks.iter().map(|ask| self.admit_queue(ask, now)).collect();
        Admission {
            spent: None,
            grants,
        }
    }

    fn admit_queue(&mut self, ask: &Ask, now: u64) -> Grant {
        let mut grant = Grant {
            admitted: Vec::new(),
            moved: None,
            wait: Wait::Nothing,
        };
        let allowed = self.config.pioneers_per_major.max(1);
        for (route, exempt) in &ask.requests {
            let id = self.resolve(route, &ask.bucket);
            if id != ask.bucket {
                grant.moved = Some((Arc::clone(route), id));
                break;
            }
            if !exempt && self.global_paused_until > now {
                grant.wait = Wait::Until(self.global_paused_until);
                break;
            }
            // Pioneers of unknown routes go a few at a time per major parameter, and only
            // while every known bucket of it has a call left (which known buckets keep
            // back while unknown routes wait): a route that turns out to share a known
            // bucket then never meets it spent.
            let flying = self.pioneers(&ask.major, now);
            let (wanted, exhausted) = self.discovery(&ask.major, now);
            let pioneer_until = if flying >= allowed {
                Some(None)
            } else {
                exhausted.map(Some)
            };
            let reserve = if wanted || flying > 0 {
                u64::from(allowed)
            } else {
                0
            };
            let key = (id, Arc::clone(&ask.major));
            let b = self.load(&key, now);
            let pioneer = match Self::bucket_ready(b, now, pioneer_until, reserve) {
                Ok(pioneer) => pioneer,
                Err(wait) => {
                    grant.wait = wait.map_or(Wait::Event, Wait::Until);
                    self.mark(&key, now);
                    break;
                }
            };
            let seq = self.admissions + 1;
            if !exempt {
                if let Some(policy) = &self.config.global {
                    let before = self.global_state.clone();
                    match policy.apply(&mut self.global_state, now, Op::Limit, 1) {
                        Ok(d) if !d.allowed => {
                            grant.wait = Wait::Until(now + micros(d.delay).max(1));
                            self.mark(&key, now);
                            break;
                        }
                        Ok(_) => self.last_global = Some((seq, before)),
                        // The global policy refuses a cost of 1 only if it can never
                        // admit anything; the request goes unlimited rather than hang.
                        Err(e) => tracing::warn!(error = %e, "the global policy failed"),
                    }
                }
            }
            self.admissions = seq;
            let b = self.load(&key, now);
            Self::commit_bucket(b, pioneer, seq, now);
            if pioneer {
                self.majors
                    .entry(Arc::clone(&ask.major))
                    .or_default()
                    .pioneers
                    .insert(seq, now);
            }
            self.mark(&key, now);
            grant.admitted.push(Admitted { pioneer, seq });
        }
        grant
    }

    /// Drops the records that say nothing more, at most once a second, so memory follows
    /// the buckets in use; and once more than [`MAX_ROUTES`] routes are known, the route
    /// map (each route is learned again by a pioneer).
    fn prune(&mut self, now: u64) {
        if now < self.pruned_at.saturating_add(PRUNE_EVERY_US) {
            return;
        }
        self.pruned_at = now;
        let lease = self.lease();
        self.buckets.retain(|_, b| b.expires(lease) > now);
        self.majors.retain(|_, m| {
            m.pioneers.retain(|_, at| at.saturating_add(lease) > now);
            m.wants.retain(|_, until| *until > now);
            m.exhausted.retain(|_, until| *until > now);
            !(m.pioneers.is_empty() && m.wants.is_empty() && m.exhausted.is_empty())
        });
        if self.routes.len() > MAX_ROUTES {
            self.routes.clear();
        }
    }

    /// Ends an admitted request's slot: one fewer in flight, its pioneer slot free.
    fn end(&mut self, key: &BucketKey, admitted: Admitted, now: u64) {
        let b = self.load(key, now);
        b.flying.remove(&admitted.seq);
        if b.pioneer == Some(admitted.seq) {
            b.pioneer = None;
        }
        if admitted.pioneer {
            if let Some(m) = self.majors.get_mut(&key.1) {
                m.pioneers.remove(&admitted.seq);
            }
        }
    }

    /// An admitted request ended without an answer, at `now`: its connection broke
    /// (`sent`, `failed`), or its caller gave up on it (`!failed`). Its slot is free at
    /// once. A request never `sent` gives back its count in the bucket and, if the global
    /// limiter counted none after it, its global token. A failed pioneer's route, still
    /// unknown, backs off as after an error without headers, so that a failing route
    /// neither hammers nor holds known buckets' calls back.
    #[allow(clippy::too_many_arguments)]
    pub fn release(
        &mut self,
        route: &str,
        major: &str,
        bucket: &str,
        admitted: Admitted,
        sent: bool,
        failed: bool,
        now: u64,
    ) {
        let key: BucketKey = (Arc::from(bucket), Arc::from(major));
        self.end(&key, admitted, now);
        if admitted.pioneer {
            // A pioneer given back no longer waits to go: its route's next ask says if
            // another does.
            self.majors
                .entry(Arc::clone(&key.1))
                .or_default()
                .wants
                .remove(route);
        }
        if failed && admitted.pioneer {
            let backoff = micros(self.config.headerless_backoff);
            let b = self.load(&key, now);
            if b.known == Known::Unknown {
                b.paused_until = b.paused_until.max(now.saturating_add(backoff));
            }
        }
        if !sent {
            let b = self.load(&key, now);
            if let Known::Limited {
                limit, remaining, ..
            } = &mut b.known
            {
                *remaining = remaining.saturating_add(1).min(*limit);
            }
            if let Some((last, before)) = self.last_global.take() {
                if last == admitted.seq {
                    self.global_state = before;
                } else {
                    self.last_global = Some((last, before));
                }
            }
        }
        self.mark(&key, now);
    }

    /// Learns from the response to an admitted request, at `now`.
    pub fn answer(&mut self, report: &Report<'_>, now: u64) -> Answered {
        let seen = report.seen;
        let major: Arc<str> = Arc::from(report.major);
        let mut key: BucketKey = (Arc::from(report.bucket), Arc::clone(&major));
        self.end(&key, report.admitted, now);
        // Learn the route's bucket.
        if let Some(bucket) = &seen.bucket {
            let learned: Arc<str> = Arc::from(bucket.as_str());
            self.routes
                .insert(Arc::from(report.route), Arc::clone(&learned));
            if learned != key.0 {
                // A route's own bucket, with nothing in flight, has served its purpose.
                if is_own(&key.0) && self.buckets.get(&key).is_some_and(|b| b.flying.is_empty()) {
                    self.buckets.remove(&key);
                    if let Some(m) = self.majors.get_mut(&major) {
                        m.exhausted.remove(&key.0);
                    }
                }
                key = (learned, Arc::clone(&major));
            }
        }
        let headerless = micros(self.config.headerless_backoff);
        let b = self.load(&key, now);
        if seen.has_limits() {
            Self::learn(b, seen, report.admitted, now, report.age);
        } else if (200..400).contains(&report.status) && seen.refusal.is_none() {
            if b.known == Known::Unknown {
                b.known = Known::Unlimited;
            }
        } else if report.admitted.pioneer && b.known == Known::Unknown && seen.refusal.is_none() {
            // An error without headers (a proxy's 502): the pioneer learned nothing; the
            // next one goes after a backoff, so the queue neither hangs nor hammers.
            b.paused_until = b.paused_until.max(now.saturating_add(headerless));
        }
        let settled = b.known != Known::Unknown || b.paused_until > now;
        if settled {
            if let Some(m) = self.majors.get_mut(&major) {
                m.wants.remove(report.route);
            }
        }
        let shared = seen.refusal.is_some_and(|r| r.scope == Scope::Shared);
        let mut warn = None;
        if report.status == 401
            || report.status == 403 && seen.refusal.is_none()
            || seen.refusal.is_some() && !shared
        {
            warn = self.count_invalid(now);
        }
        if (200..300).contains(&report.status) {
            self.missing_in_a_row = 0;
        }
        let paused_until = seen.refusal.map(|r| self.refused(&key, r, now, report.age));
        self.mark(&key, now);
        Answered { paused_until, warn }
    }

    /// Pauses what the refusal names (its wait counting from when it came, `age` ago);
    /// answers when the pause ends.
    fn refused(&mut self, key: &BucketKey, refusal: Refusal, now: u64, age: u64) -> u64 {
        let wait = refusal_wait(
            &self.config,
            refusal.retry_after,
            &mut self.missing_in_a_row,
        )
        .saturating_sub(age);
        let until = now.saturating_add(wait.max(1));
        match refusal.scope {
            Scope::Global => self.global_paused_until = self.global_paused_until.max(until),
            Scope::Bucket | Scope::Shared => {
                let b = self.load(key, now);
                b.paused_until = b.paused_until.max(until);
                if let Known::Limited { remaining, .. } = &mut b.known {
                    *remaining = 0;
                }
            }
        }
        until
    }

    /// Counts an invalid request; answers the budget's use when it passed the warning
    /// share (at most once per budget window).
    fn count_invalid(&mut self, now: u64) -> Option<(u64, u64)> {
        let policy = self.config.invalid_budget.as_ref()?;
        let d = policy
            .apply(&mut self.invalid_state, now, Op::Limit, 1)
            .ok()?;
        let limit = policy.limit();
        let used = limit.saturating_sub(d.remaining);
        if used as f64 >= self.config.invalid_warn_at * limit as f64
            && now >= self.invalid_warned_until
        {
            self.invalid_warned_until = now + micros(d.reset_after);
            return Some((used, limit));
        }
        None
    }

    /// Updates a bucket from the limits in the answer to an admitted request (a
    /// pioneer's, if it was sent before its route's bucket was known).
    ///
    /// What the server says is left does not count requests still in flight. Our own count
    /// already does, except for a pioneer that lands on a known bucket: requests admitted
    /// to the bucket after it are not in its answer's count yet, and are taken off it.
    fn learn(b: &mut Bucket, seen: &Observation, admitted: Admitted, now: u64, age: u64) {
        let (Some(left), Some(reset_after)) = (seen.remaining, seen.reset_after) else {
            return;
        };
        // The window is as long as the server said; it resets that long after the answer
        // came, `age` ago.
        let reset_after = micros(reset_after);
        let reset_at = now.saturating_add(reset_after.saturating_sub(age));
        let in_flight = b.flying.len() as u64;
        let later = b.flying.range(admitted.seq.saturating_add(1)..).count() as u64;
        b.known = match b.known {
            Known::Limited {
                limit,
                remaining,
                reset_at: our_reset,
                window,
                ..
            } => {
                let limit = seen.limit.unwrap_or(limit).max(1);
                let window = window.max(reset_after);
                if reset_at > our_reset.saturating_add(SAME_WINDOW_US) {
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
                } else if reset_at.saturating_add(SAME_WINDOW_US) < our_reset {
                    // An answer from a window that has passed (sent before our reset): it
                    // says nothing of this one.
                    return;
                } else {
                    // This window, as we count it: the lower count wins, and the server's
                    // word ends the pacing of a local reset. A pioneer that lands here was
                    // never in our tally: it is now, and what the bucket admitted after it
                    // is not in the server's count yet.
                    let (ours, left) = if admitted.pioneer {
                        (remaining.saturating_sub(1), left.saturating_sub(later))
                    } else {
                        (remaining, left)
                    };
                    Known::Limited {
                        limit,
                        remaining: ours.min(left),
                        reset_at,
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

    /// How many buckets hold a record (learned, or a route's own).
    pub fn buckets_held(&self) -> usize {
        self.buckets.len()
    }

    /// What is known of each bucket at `now` (µs), for a look (a dashboard, a log): the
    /// buckets whose limit came in headers, and those still unknown or unlimited, sorted by
    /// bucket then major parameter.
    pub fn buckets(&self, now: u64) -> Vec<BucketView> {
        let mut views: Vec<BucketView> = self
            .buckets
            .iter()
            .map(|((bucket, major), b)| {
                let (limit, remaining, reset_in_us) = match b.known.at(now) {
                    Known::Limited {
                        limit,
                        remaining,
                        reset_at,
                        ..
                    } => (
                        Some(limit),
                        Some(remaining),
                        Some(reset_at.saturating_sub(now)),
                    ),
                    Known::Unknown | Known::Unlimited => (None, None, None),
                };
                BucketView {
                    bucket: bucket.to_string(),
                    major: major.to_string(),
                    known: matches!(b.known, Known::Limited { .. } | Known::Unlimited),
                    limit,
                    remaining,
                    reset_in_us,
                    paused_for_us: b.paused_until.saturating_sub(now),
                    in_flight: b.flying.len(),
                }
            })
            .collect();
        views.sort_by(|a, b| (&a.bucket, &a.major).cmp(&(&b.bucket, &b.major)));
        views
    }
}
