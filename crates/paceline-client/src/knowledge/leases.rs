//! Sends leased ahead: how a process whose knowledge is shared (in Redis) admits most of
//! its requests without a call.
//!
//! Each call to a shared knowledge is a round trip and a step of Lua; at low load it is
//! most of what a request waits. [`Leases`] stands between a shared core and its knowledge
//! and saves most of those calls, with two rules:
//!
//! - **Leased sends.** When a call admits every request a queue asked about and the
//!   bucket's last answer to this process said it has no limit, the process asks for up
//!   to [`LEASE_MAX`] more sends of the bucket in the same call: requests of the queue's
//!   last route, appended after its own, which the knowledge admits (or not) by its usual
//!   rules, each with its admission number, counted in flight and (unless spared) against
//!   the global limit. The process keeps them and hands them to its next requests of the
//!   bucket (of the routes the knowledge admitted to it) without a call. A send not
//!   handed out within [`HOLD_US`] is given back (a release, unsent: a global token goes
//!   back if none was counted after it); so is every send after a refusal, an error, or an
//!   answer with limits, which is told at once. A process that dies without giving them
//!   back holds them as any admitted request is held: until the in-flight lease ends.
//!
//!   A send takes its global token when it is leased: under a global limit without burst
//!   (Discord's `burst=1`) nothing is left for sends ahead, and none are leased.
//!
//!   Limited buckets lease nothing: a send given back unsent returns its count to the
//!   bucket, which is right against the knowledge's own count but not after a server's
//!   lower count replaced it, so the queues of a limited bucket keep one call per round
//!   (every request waiting asked at once).
//! - **Answers told with the next call.** A plain success (2xx, no refusal, no limits, not
//!   a pioneer's, naming no other bucket) of a request that went on a leased send is told
//!   with the next call, at most [`HOLD_US`] later: it changes nothing another process
//!   decides on, as what it counted is already counted. Any other news is told at once,
//!   and a round that asks nothing (its process has nothing waiting) tells everything held.
//!
//! A round becomes either an answer made here ([`Plan::Local`]) or one call
//! ([`Plan::Call`]) whose answer [`Leases::settle`] turns into the answer the core expects
//! (the leased sends taken out, kept for later).
//!
//! ```
//! use paceline_client::knowledge::{Knowledge, Leases, Plan};
//! use paceline_client::{ClientConfig, ClientCore, Route};
//! let config = ClientConfig::discord();
//! let mut knowledge = Knowledge::new(config.clone());
//! let mut core = ClientCore::shared(config);
//! let mut leases = Leases::new();
//! let now = 1_700_000_000_000_000;
//! core.submit(Route::discord("GET", "/gateway/bot"), now, None).unwrap();
//! let asks = core.asks(now);
//! let answer = match leases.plan(&core.take_events(), &asks.asks, now, false) {
//!     Plan::Local(answer) => answer,
//!     Plan::Call(call) => {
//!         let answer = knowledge.round(None, call.events(), call.asks(), now);
//!         leases.settle(call, Ok::<_, ()>(answer)).unwrap()
//!     }
//! };
//! let poll = core.granted(asks, answer.1, now);
//! assert_eq!(poll.go.len(), 1); // the route's pioneer: nothing is leased before it answers
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::messages::Event;
use super::{Admission, Admitted, Answered, Ask, BucketKey, Grant, RoundAnswer, Wait};
use super::{KEEP_US, PRUNE_EVERY_US};
use crate::route::Route;

/// The most sends a process holds of one bucket: 4.
pub const LEASE_MAX: usize = 4;

/// How long a leased send is kept unused, and an answer waits to be told: 50 ms.
pub const HOLD_US: u64 = 50_000;

/// The most answers waiting to be told: beyond, the next round makes a call.
const DEFER_MAX: usize = 64;

/// One leased send: admitted for a request of `route` (spared by the global limit when
/// `exempt`) at `at`.
#[derive(Clone, Debug)]
struct Send {
    route: Arc<str>,
    exempt: bool,
    admitted: Admitted,
    at: u64,
}

impl Send {
    /// Whether a request (`exempt` or not) may go on it: one the global limit counts
    /// needs a send that took a global token.
    fn serves(&self, exempt: bool) -> bool {
        !self.exempt || exempt
    }
}

/// A bucket's leased sends, and the routes the knowledge admitted to it (the only ones
/// that may spend them: a route the knowledge files elsewhere asks it).
#[derive(Debug, Default)]
struct Lease {
    sends: VecDeque<Send>,
    routes: HashSet<Arc<str>>,
    used: u64,
}

/// A process's leased sends and the answers it has yet to tell: see the
/// [module docs](self).
#[derive(Debug, Default)]
pub struct Leases {
    leases: HashMap<BucketKey, Lease>,
    /// The buckets answered: whether without limit (every answer so far), and when last.
    unlimited: HashMap<BucketKey, (bool, u64)>,
    /// Answers to tell with the next call, and when the first of them was held.
    deferred: Vec<Event>,
    deferred_since: Option<u64>,
    /// Sends to give back with the next call (taken for a round whose call failed to
    /// admit anything).
    returning: Vec<(BucketKey, Send)>,
    pruned_at: u64,
}

/// What to do with a round: answer it here, or make one call.
#[derive(Debug)]
pub enum Plan {
    /// Answered from leased sends, without a call: what each event taught (as the
    /// knowledge would: nothing, for the plain successes held) and the admission.
    Local(RoundAnswer),
    /// Make this call, then hand its answer to [`Leases::settle`].
    Call(Call),
}

/// One call to make for a round: the events to tell (held answers, sends given back, the
/// round's own) and the asks (each less the requests that went on leased sends, with the
/// sends asked for ahead appended).
#[derive(Debug)]
pub struct Call {
    events: Vec<Event>,
    asks: Vec<Ask>,
    /// How many of `events` come before the round's own.
    before: usize,
    /// Per ask of the round: the requests that went on leased sends, and the index of its
    /// ask in the call with its own requests there (`None`: not asked).
    plans: Vec<AskPlan>,
    /// The sends taken for those requests: put back if the call fails.
    taken: Vec<(BucketKey, Send)>,
    now: u64,
}

#[derive(Debug)]
struct AskPlan {
    key: BucketKey,
    local: Vec<Admitted>,
    sent: Option<usize>,
    /// The routes of the requests in the call's ask that are the round's own (the rest
    /// are leased sends asked for), and the last of them.
    own: Vec<Arc<str>>,
    last: Option<(Arc<str>, bool)>,
}

impl Call {
    /// The events to tell, in order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The asks to make.
    pub fn asks(&self) -> &[Ask] {
        &self.asks
    }
}

/// Whether an event may wait for the next call: a plain success of a request that went on
/// a known bucket.
fn holdable(event: &Event) -> bool {
    match event {
        Event::Answer {
            bucket,
            admitted,
            status,
            seen,
            ..
        } => {
            (200..300).contains(status)
                && seen.refusal.is_none()
                && !admitted.pioneer
                && seen.bucket.as_deref().is_none_or(|b| b == &**bucket)
                && !seen.has_limits()
                && seen.remaining.is_none()
        }
        Event::Release { .. } => false,
    }
}

/// Whether an event says something went wrong: a refusal or an error status.
fn alarming(event: &Event) -> bool {
    match event {
        Event::Answer { status, seen, .. } => seen.refusal.is_some() || *status >= 400,
        Event::Release { failed, .. } => *failed,
    }
}

impl Leases {
    /// No sends held, nothing to tell.
    pub fn new() -> Leases {
        Leases::default()
    }

    /// How many leased sends are held, over every bucket.
    pub fn held(&self) -> usize {
        self.leases.values().map(|l| l.sends.len()).sum()
    }

    /// How many answers wait to be told.
    pub fn deferred(&self) -> usize {
        self.deferred.len()
    }

    /// Learns which buckets the events' answers said have no limit; the sends of a
    /// bucket that answered otherwise are given back.
    fn learn(&mut self, events: &[Event], now: u64) {
        for event in events {
            let Event::Answer {
                route,
                bucket,
                status,
                seen,
                ..
            } = event
            else {
                continue;
            };
            let key: BucketKey = (Arc::clone(bucket), Arc::from(route.major()));
            let named_other = seen.bucket.as_deref().is_some_and(|b| b != &**bucket);
            if seen.has_limits() || named_other {
                // A bucket that once said it is limited stays so, as in the knowledge.
                self.unlimited.insert(key.clone(), (false, now));
                if let Some(lease) = self.leases.get_mut(&key) {
                    let gone = std::mem::take(&mut lease.sends);
                    self.returning
                        .extend(gone.into_iter().map(|s| (key.clone(), s)));
                }
            } else if (200..300).contains(status) && seen.refusal.is_none() {
                let free = self.unlimited.get(&key).is_none_or(|(free, _)| *free);
                self.unlimited.insert(key, (free, now));
            }
            // Errors and refusals change nothing here: they are told at once, and give
            // every send back.
        }
    }

    /// Drops what says nothing more, at most once a second: buckets not answered for
    /// [`KEEP_US`], leases without sends unused as long.
    fn prune(&mut self, now: u64) {
        if now < self.pruned_at.saturating_add(PRUNE_EVERY_US) {
            return;
        }
        self.pruned_at = now;
        self.unlimited
            .retain(|_, (_, at)| at.saturating_add(KEEP_US) > now);
        self.leases
            .retain(|_, l| !l.sends.is_empty() || l.used.saturating_add(KEEP_US) > now);
    }

    /// Takes the leased sends for the first requests of `ask` that one may serve, in order.
    fn take(&mut self, ask: &Ask, now: u64, taken: &mut Vec<(BucketKey, Send)>) -> Vec<Admitted> {
        let key: BucketKey = (Arc::clone(&ask.bucket), Arc::clone(&ask.major));
        let mut out = Vec::new();
        let Some(lease) = self.leases.get_mut(&key) else {
            return out;
        };
        for (route, exempt) in &ask.requests {
            if !lease.routes.contains(route) {
                break;
            }
            let Some(i) = lease.sends.iter().position(|s| s.serves(*exempt)) else {
                break;
            };
            let Some(send) = lease.sends.remove(i) else {
                break;
            };
            lease.used = now;
            out.push(send.admitted);
            taken.push((key.clone(), send));
        }
        out
    }

    /// What to do with a round of `events` and `asks` at `now`: answer it from leased
    /// sends, or make one call. `finish` tells every held answer and gives back every
    /// leased send (a process about to end, or waiting until what it learned is told).
    pub fn plan(&mut self, events: &[Event], asks: &[Ask], now: u64, finish: bool) -> Plan {
        self.learn(events, now);
        self.prune(now);
        let alarm = events.iter().any(alarming);
        let given_back = !self.returning.is_empty();
        let stale = |s: &Send| s.at.saturating_add(HOLD_US) <= now;
        // A round that asks nothing is the last news of a process with nothing waiting:
        // it is told now.
        let may_hold = !finish
            && !asks.is_empty()
            && !alarm
            && !given_back
            && events.iter().all(holdable)
            && self.deferred.len() + events.len() <= DEFER_MAX
            && self
                .deferred_since
                .is_none_or(|since| now < since.saturating_add(HOLD_US))
            && !self.leases.values().any(|l| l.sends.iter().any(stale));
        if may_hold {
            let mut taken = Vec::new();
            let mut grants = Vec::with_capacity(asks.len());
            let mut covered = true;
            for ask in asks {
                let admitted = self.take(ask, now, &mut taken);
                covered &= admitted.len() == ask.requests.len();
                grants.push(Grant {
                    admitted,
                    moved: None,
                    wait: Wait::Nothing,
                });
                if !covered {
                    break;
                }
            }
            if covered {
                if !events.is_empty() {
                    self.deferred.extend(events.iter().cloned());
                    self.deferred_since.get_or_insert(now);
                }
                let answered = events
                    .iter()
                    .map(|e| match e {
                        Event::Answer { .. } => Some(Answered {
                            paused_until: None,
                            warn: None,
                        }),
                        Event::Release { .. } => None,
                    })
                    .collect();
                let admission = Admission {
                    spent: None,
                    grants,
                };
                return Plan::Local((answered, admission));
            }
            self.put_back(taken);
        }
        self.call(events, asks, now, finish || alarm)
    }

    /// Puts sends taken for a round back in their leases, first, in their order.
    fn put_back(&mut self, taken: Vec<(BucketKey, Send)>) {
        for (key, send) in taken.into_iter().rev() {
            self.leases.entry(key).or_default().sends.push_front(send);
        }
    }

    /// The call for a round that is not answered here; `drop_all` gives back every
    /// leased send.
    fn call(&mut self, events: &[Event], asks: &[Ask], now: u64, drop_all: bool) -> Plan {
        // The sends to give back: all of them, or those kept too long.
        let mut back: Vec<(BucketKey, Send)> = std::mem::take(&mut self.returning);
        for (key, lease) in &mut self.leases {
            let (gone, kept): (VecDeque<Send>, VecDeque<Send>) = std::mem::take(&mut lease.sends)
                .into_iter()
                .partition(|s| drop_all || s.at.saturating_add(HOLD_US) <= now);
            lease.sends = kept;
            back.extend(gone.into_iter().map(|s| (key.clone(), s)));
        }
        let mut told: Vec<Event> = std::mem::take(&mut self.deferred);
        self.deferred_since = None;
        told.extend(back.into_iter().map(|((bucket, major), s)| Event::Release {
            route: Route::new(&*s.route, &*major),
            bucket,
            admitted: s.admitted,
            sent: false,
            failed: false,
        }));
        let before = told.len();
        told.extend(events.iter().cloned());
        let mut taken = Vec::new();
        let mut plans = Vec::with_capacity(asks.len());
        let mut sent = Vec::new();
        for ask in asks {
            let key: BucketKey = (Arc::clone(&ask.bucket), Arc::clone(&ask.major));
            let local = if drop_all {
                Vec::new()
            } else {
                self.take(ask, now, &mut taken)
            };
            let rest = &ask.requests[local.len()..];
            if rest.is_empty() {
                plans.push(AskPlan {
                    key,
                    local,
                    sent: None,
                    own: Vec::new(),
                    last: None,
                });
                continue;
            }
            let mut requests = rest.to_vec();
            let last = rest.last().cloned();
            let held = self.leases.get(&key).map_or(0, |l| l.sends.len());
            let want = if drop_all {
                0
            } else {
                let room = if self.unlimited.get(&key).is_some_and(|(free, _)| *free) {
                    LEASE_MAX
                } else {
                    0
                };
                room.saturating_sub(held)
            };
            if let Some(last) = &last {
                requests.extend(std::iter::repeat_n(last.clone(), want));
            }
            plans.push(AskPlan {
                key,
                local,
                sent: Some(sent.len()),
                own: rest.iter().map(|(route, _)| Arc::clone(route)).collect(),
                last,
            });
            sent.push(Ask {
                major: Arc::clone(&ask.major),
                bucket: Arc::clone(&ask.bucket),
                requests,
            });
        }
        Plan::Call(Call {
            events: told,
            asks: sent,
            before,
            plans,
            taken,
            now,
        })
    }

    /// The round's answer from the answer to its `call` (or the call's error): leased
    /// sends admitted are kept, the rest handed on as the core expects them.
    pub fn settle<E>(
        &mut self,
        call: Call,
        answer: Result<RoundAnswer, E>,
    ) -> Result<RoundAnswer, E> {
        let Call {
            before,
            plans,
            taken,
            now,
            ..
        } = call;
        let (mut answered, admission) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                // The sends taken are still this process's; what the call gave back may
                // or may not have been, and ends with its lease if not.
                self.put_back(taken);
                return Err(e);
            }
        };
        let answered = answered.split_off(before.min(answered.len()));
        if admission.spent.is_some() {
            // Every request fails: what they were to go on goes back.
            self.returning.extend(taken);
            return Ok((answered, admission));
        }
        let mut called = admission.grants.into_iter();
        let mut grants = Vec::with_capacity(plans.len());
        for plan in plans {
            let mut admitted = plan.local;
            if plan.sent.is_none() {
                grants.push(Grant {
                    admitted,
                    moved: None,
                    wait: Wait::Nothing,
                });
                continue;
            };
            let grant = called.next().unwrap_or(Grant {
                admitted: Vec::new(),
                moved: None,
                wait: Wait::Event,
            });
            let own = plan.own.len().min(grant.admitted.len());
            let lease = self.leases.entry(plan.key.clone()).or_default();
            if own > 0 {
                lease.used = now;
            }
            // The routes the knowledge admitted to the bucket may spend its sends.
            lease.routes.extend(plan.own[..own].iter().cloned());
            admitted.extend_from_slice(&grant.admitted[..own]);
            if let Some((route, exempt)) = &plan.last {
                for a in &grant.admitted[own..] {
                    let send = Send {
                        route: Arc::clone(route),
                        exempt: *exempt,
                        admitted: *a,
                        at: now,
                    };
                    if a.pioneer {
                        // Never sent ahead: a pioneer learns a bucket.
                        self.returning.push((plan.key.clone(), send));
                    } else {
                        lease.sends.push_back(send);
                    }
                }
            }
            grants.push(if own == plan.own.len() {
                Grant {
                    admitted,
                    moved: None,
                    wait: Wait::Nothing,
                }
            } else {
                Grant {
                    admitted,
                    moved: grant.moved,
                    wait: grant.wait,
                }
            });
        }
        Ok((
            answered,
            Admission {
                spent: None,
                grants,
            },
        ))
    }
}
