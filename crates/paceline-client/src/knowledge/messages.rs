//! What the knowledge is told and what it answers: the asks of a process's waiting queues
//! and their grants, the reports of responses and what they taught, the events a shared
//! core has to tell, and the ids of rounds.

use std::sync::Arc;
use std::time::Duration;

use super::Knowledge;
use crate::headers::Observation;
use crate::route::Route;

/// One waiting queue of a process asking to send its first requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The queue's major parameter.
    pub major: Arc<str>,
    /// The bucket the process files the queue under: a learned id, or a route's own.
    pub bucket: Arc<str>,
    /// The queue's first requests, in order: each one's route key, and whether the
    /// global limit spares it.
    pub requests: Vec<(Arc<str>, bool)>,
}

/// One request let go: whether it is its bucket's pioneer, and its admission number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// Sent to learn an unknown bucket.
    pub pioneer: bool,
    /// Its admission number, which its answer or release names.
    pub seq: u64,
}

/// When a queue should ask again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Every request asked about went.
    Nothing,
    /// At this time (µs since the Unix epoch).
    Until(u64),
    /// When a response comes (to this process, or on Redis to any).
    Event,
}

/// The answer to one [`Ask`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The queue's first requests that go now, in order.
    pub admitted: Vec<Admitted>,
    /// The request after them belongs to another bucket (its route's was learned): its
    /// route and that bucket. Ask again at once with the queue refiled.
    pub moved: Option<(Arc<str>, Arc<str>)>,
    /// When to ask again for the requests after those admitted.
    pub wait: Wait,
}

/// The answer to [`Knowledge::admit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The invalid-request budget is spent, and admits again after this: every request
    /// asked about fails, nothing goes.
    pub spent: Option<Duration>,
    /// One grant per ask, in order (none when the budget is spent).
    pub grants: Vec<Grant>,
}

/// A response to an admitted request, as [`Knowledge::answer`] learns from it.
#[derive(Clone, Copy, Debug)]
pub struct Report<'a> {
    /// The request's route key.
    pub route: &'a str,
    /// Its major parameter.
    pub major: &'a str,
    /// The bucket it was admitted under.
    pub bucket: &'a str,
    /// Its admission.
    pub admitted: Admitted,
    /// The response's status.
    pub status: u16,
    /// What the response's headers said.
    pub seen: &'a Observation,
    /// How long ago (µs) the response came: the durations it gave count from then.
    pub age: u64,
}

/// What [`Knowledge::answer`] concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answered {
    /// A refusal paused what it named until this time.
    pub paused_until: Option<u64>,
    /// The invalid-request budget passed its warning share: used, of the limit.
    pub warn: Option<(u64, u64)>,
}

/// The id of one [`round`](Knowledge::round): a round made again under the id of one
/// that counted something (admitted a request or told an event), within the in-flight
/// lease of it, is answered as that one was and changes nothing. Ids are drawn at random
/// (128 bits), one per round; only a repeat of the same round reuses one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(u128);

impl CallId {
    /// The id of these 128 bits.
    pub const fn new(bits: u128) -> CallId {
        CallId(bits)
    }

    /// The id of these 16 bytes (big-endian).
    pub const fn from_bytes(bytes: [u8; 16]) -> CallId {
        CallId(u128::from_be_bytes(bytes))
    }
}

/// 32 lowercase hexadecimal digits: the id as the Lua twin keys it.
impl std::fmt::Display for CallId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// What one [`round`](Knowledge::round) answers: what each event taught (for an answer),
/// and the admission of the asks.
pub type RoundAnswer = (Vec<Option<Answered>>, Admission);

/// What a shared core tells the knowledge, in order ([`ClientCore::take_events`](crate::ClientCore::take_events)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Event {
    /// A response came: [`Knowledge::answer`].
    Answer {
        /// The request's route.
        route: Route,
        /// The bucket it was admitted under.
        bucket: Arc<str>,
        /// Its admission.
        admitted: Admitted,
        /// The response's status.
        status: u16,
        /// What its headers said.
        seen: Observation,
        /// When it came, on the core's clock: durations it gave count from then.
        at: u64,
    },
    /// A request ended without an answer: [`Knowledge::release`].
    Release {
        /// The request's route.
        route: Route,
        /// The bucket it was admitted under.
        bucket: Arc<str>,
        /// Its admission.
        admitted: Admitted,
        /// Whether it may have reached the server.
        sent: bool,
        /// Whether its connection broke (else its caller gave up).
        failed: bool,
    },
}

impl Event {
    /// Applies the event to `knowledge` at `now`: the durations of an answer that came
    /// earlier (reset-after, retry-after) count from when it came.
    pub fn apply(&self, knowledge: &mut Knowledge, now: u64) -> Option<Answered> {
        match self {
            Event::Answer {
                route,
                bucket,
                admitted,
                status,
                seen,
                at,
            } => Some(knowledge.answer(
                &Report {
                    route: route.key(),
                    major: route.major(),
                    bucket,
                    admitted: *admitted,
                    status: *status,
                    seen,
                    age: now.saturating_sub(*at),
                },
                now,
            )),
            Event::Release {
                route,
                bucket,
                admitted,
                sent,
                failed,
            } => {
                knowledge.release(
                    route.key(),
                    route.major(),
                    bucket,
                    *admitted,
                    *sent,
                    *failed,
                    now,
                );
                None
            }
        }
    }
}
