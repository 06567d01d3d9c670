//! Sets of limits decided as one: "10 per second *and* 10,000 per day for this tenant".
//!
//! A set is a list of (policy, key) pairs, each with its cost, decided atomically by the
//! store ([`Store::decide_all`]):
//!
//! * admitted only if **every** limit admits, and then every limit counts the request;
//! * refused if any limit refuses, and then **no limit changes** (not even a `sliding_log`
//!   with `count_blocked`): the decision says which limits refused and the longest
//!   retry-after among them, so a request refused by the daily limit does not use up the
//!   per-second one (the inconsistency Envoy's rate limit service is known for).
//!
//! The memory store decides a set under its keys' shard locks, taken in a fixed order; the
//! Redis store in one Lua call. In a Redis Cluster the keys of a set must share a hash slot:
//! give them a common hash tag, such as `{tenant42}:second` and `{tenant42}:day`; a set whose
//! keys span slots is an input error naming two of them.
//!
//! A set of one limit is decided exactly as that limit alone ([`Store::decide`]):
//! a `sliding_log` with `count_blocked` records a request it refuses, as it would alone.
//!
//! A set takes `limit`, `peek` or `pace`. A `pace` set books **the earliest time at which
//! every limit admits**: each limit's earliest slot from `now`, then each one's earliest from
//! the latest of those, and so on until they meet (at most [`MAX_PACE_ROUNDS`] rounds, in
//! practice one or two, and at most [`MAX_PACE_SET_DELAY_US`], about 104 days, away: else an
//! input error naming `op`). Every limit counts the request at that slot, and every limit's
//! decision has the set's delay. With `max_wait`, a slot further away refuses the set and
//! changes nothing: each limit answers as it would alone (its own `pace` with that
//! `max_wait`, from now), except that the limits that set the slot refuse with the set's
//! retry-after (`delay - max_wait`), the combined `delay`. A limit whose slot lies past its
//! horizon (a window algorithm's `MAX_BOOKED_WINDOWS`) refuses the set likewise, nothing
//! changed, with its own retry-after (the longest, if several). Booking at a slot later than
//! its own earliest is open to `gcra`, `fixed_window`, `sliding_log` and Guava's; a `pace`
//! set holding `pacer`, `exec_evenly`, `sliding_window` or `concurrency` is an input error
//! naming `op` ([`Policy::pace_from`]).
//!
//! ```
//! use paceline_store::{Limits, MemoryStore, Policy};
//! let store = MemoryStore::new();
//! let second: Policy = "gcra:rate=2/s,burst=2".parse()?;
//! let day: Policy = "sliding_log:limit=3,window=1d".parse()?;
//! let tenant = Limits::new().with(second, "t42:second").with(day, "t42:day");
//! assert!(tenant.limit_sync(&store, 1)?.allowed());
//! assert!(tenant.limit_sync(&store, 1)?.allowed());
//! // The per-second limit refuses; the daily one would admit, and is left as it was.
//! let refused = tenant.limit_sync(&store, 1)?;
//! assert!(!refused.allowed());
//! assert_eq!(refused.refused().collect::<Vec<_>>(), [0]);
//! assert_eq!(refused.limits[1].remaining, 1);
//! # Ok::<(), paceline_store::Error>(())
//! ```

use std::time::Duration;

use paceline_core::{Decision, Error, InputError, Op, Policy};

use crate::{Request, Store, SyncStore};

/// The most limits one set may hold.
pub const MAX_LIMITS: usize = 16;

/// A set of limits decided as one (see the [module](self)): owned policies and keys, each
/// with its cost (1 unless given).
///
/// Front ends that build a set per request without owning its parts call
/// [`Store::decide_all`] with borrowed [`Request`]s instead.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    parts: Vec<(Policy, String, u64)>,
}

impl Limits {
    /// An empty set; add limits with [`with`](Limits::with).
    pub fn new() -> Limits {
        Limits::default()
    }

    /// The set with `policy` applied to `key` added, at the cost the decision asks for.
    #[must_use]
    pub fn with(mut self, policy: Policy, key: impl Into<String>) -> Limits {
        self.parts.push((policy, key.into(), 0));
        self
    }

    /// The set with `policy` applied to `key` added, always at `cost` (e.g. one limit on
    /// requests, another on bytes), whatever cost the decision asks for.
    #[must_use]
    pub fn with_cost(mut self, policy: Policy, key: impl Into<String>, cost: u64) -> Limits {
        self.parts.push((policy, key.into(), cost.max(1)));
        self
    }

    /// How many limits the set holds.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// True if the set holds no limit (deciding it is an input error).
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The set as requests of `op`, each limit at its own cost or else `cost`.
    pub fn requests(&self, op: Op, cost: u64) -> Vec<Request<'_>> {
        self.parts
            .iter()
            .map(|(policy, key, own)| {
                Request::new(policy, key, op, if *own == 0 { cost } else { *own })
            })
            .collect()
    }

    /// Admits `cost` on every limit now, or refuses and changes none.
    pub async fn limit<S: Store + ?Sized>(
        &self,
        store: &S,
        cost: u64,
    ) -> Result<SetDecision, Error> {
        store.decide_all(&self.requests(Op::Limit, cost)).await
    }

    /// What [`limit`](Limits::limit) would answer, changing nothing.
    pub async fn peek<S: Store + ?Sized>(
        &self,
        store: &S,
        cost: u64,
    ) -> Result<SetDecision, Error> {
        store.decide_all(&self.requests(Op::Peek, cost)).await
    }

    /// Books `cost` on every limit at the earliest time every one admits (see the
    /// [module](self)); with `max_wait`, refuses (changing nothing) a slot further away.
    /// The decision's `delay` is the wait before acting.
    pub async fn pace<S: Store + ?Sized>(
        &self,
        store: &S,
        cost: u64,
        max_wait: Option<Duration>,
    ) -> Result<SetDecision, Error> {
        store
            .decide_all(&self.requests(Op::Pace { max_wait }, cost))
            .await
    }

    /// Counts `cost` already spent on every limit, past each one's limit if need be, and
    /// never refuses (see [`Limiter::charge`](crate::Limiter::charge)): the set is always
    /// admitted with no delay, each limit's `remaining` after the charge.
    pub async fn charge<S: Store + ?Sized>(
        &self,
        store: &S,
        cost: u64,
    ) -> Result<SetDecision, Error> {
        store.decide_all(&self.requests(Op::Charge, cost)).await
    }

    /// [`charge`](Limits::charge), synchronously.
    pub fn charge_sync<S: SyncStore + ?Sized>(
        &self,
        store: &S,
        cost: u64,
    ) -> Result<SetDecision, Error> {
        store.decide_all_sync(&self.requests(Op::Charge, cost))
    }

    /// [`pace`](Limits::pace), synchronously.
    pub fn pace_sync<S: SyncStore + ?Sized>(
        &self,
        store: &S,
        cost: u64,
        max_wait: Option<Duration>,
    ) -> Result<SetDecision, Error> {
        store.decide_all_sync(&self.requests(Op::Pace { max_wait }, cost))
    }

    /// [`limit`](Limits::limit), synchronously.
    pub fn limit_sync<S: SyncStore + ?Sized>(
        &self,
        store: &S,
        cost: u64,
    ) -> Result<SetDecision, Error> {
        store.decide_all_sync(&self.requests(Op::Limit, cost))
    }

    /// [`peek`](Limits::peek), synchronously.
    pub fn peek_sync<S: SyncStore + ?Sized>(
        &self,
        store: &S,
        cost: u64,
    ) -> Result<SetDecision, Error> {
        store.decide_all_sync(&self.requests(Op::Peek, cost))
    }
}

/// The decision on a set of limits: the combined answer and one per limit.
///
/// * Admitted: every limit counted the request; `limits` holds each limit's decision after
///   it.
/// * Refused: no limit changed; `limits` holds what each limit answers now (as a `peek`;
///   for a `pace` set, as its own `pace` alone, see the [module](self)): `allowed` is false
///   for the limits that refused, and their `delay` is their retry-after.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SetDecision {
    /// The combined decision: `allowed` if every limit admitted; `delay` the longest delay
    /// of an admission or the longest retry-after among the limits that refused;
    /// `remaining`, `limit` those of the tightest limit (the fewest remaining, the first
    /// of equals); `reset_after` the longest.
    pub decision: Decision,
    /// One decision per limit, in the set's order.
    pub limits: Vec<Decision>,
}

impl SetDecision {
    /// Builds the combined decision from each limit's (`committed`: whether the set was
    /// admitted and counted).
    pub fn new(committed: bool, limits: Vec<Decision>) -> SetDecision {
        let delay = limits
            .iter()
            .filter(|d| committed || !d.allowed)
            .map(|d| d.delay)
            .max()
            .unwrap_or(Duration::ZERO);
        let reset_after = limits
            .iter()
            .map(|d| d.reset_after)
            .max()
            .unwrap_or(Duration::ZERO);
        let tightest = limits
            .iter()
            .enumerate()
            .min_by_key(|(i, d)| (d.remaining, *i))
            .map(|(_, d)| *d);
        let mut decision = match tightest {
            Some(d) => Decision::from_micros(committed, 0.0, d.remaining, 0.0, d.limit),
            None => Decision::from_micros(committed, 0.0, 0, 0.0, 0),
        };
        decision.delay = delay;
        decision.reset_after = reset_after;
        decision.fallback = limits.iter().find_map(|d| d.fallback);
        SetDecision { decision, limits }
    }

    /// True if every limit admitted (and counted) the request.
    pub fn allowed(&self) -> bool {
        self.decision.allowed
    }

    /// The positions of the limits that refused (none when admitted).
    pub fn refused(&self) -> impl Iterator<Item = usize> + '_ {
        let refused = !self.decision.allowed;
        self.limits
            .iter()
            .enumerate()
            .filter(move |(_, d)| refused && !d.allowed)
            .map(|(i, _)| i)
    }

    /// The longest retry-after of the limits that refused; `None` when admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision.retry_after()
    }
}

/// Checks a set before any store touches it: one to [`MAX_LIMITS`] requests, one op for all,
/// each key once, each cost valid for its policy.
pub(crate) fn check_set(requests: &[Request<'_>]) -> Result<(), InputError> {
    let Some(first) = requests.first() else {
        return Err(InputError::new(
            "limits",
            "is empty: give at least one limit (a policy and a key)",
        ));
    };
    if requests.len() > MAX_LIMITS {
        return Err(InputError::new(
            "limits",
            format!(
                "holds {} limits; one decision takes at most {MAX_LIMITS}",
                requests.len()
            ),
        ));
    }
    for (i, r) in requests.iter().enumerate() {
        if r.op != first.op {
            return Err(InputError::new(
                "op",
                format!(
                    "every limit of a set takes the same op; limit {} takes `{}`, limit 1 `{}`",
                    i + 1,
                    r.op.name(),
                    first.op.name()
                ),
            ));
        }
        if requests[..i].iter().any(|other| other.key == r.key) {
            return Err(InputError::new(
                "limits",
                format!(
                    "the key `{}` appears twice; a set holds each key once (give each limit \
                     a key of its own, e.g. `{}:second` and `{}:day`)",
                    r.key, r.key, r.key
                ),
            ));
        }
        r.policy.check_cost(r.op, r.cost)?;
        if requests.len() > 1 && matches!(r.op, Op::Pace { .. }) {
            // A policy that cannot book ahead says so on an idle key as on any.
            r.policy.pace_from(&mut None, 0, r.cost, 0)?;
        }
    }
    Ok(())
}

/// The most rounds of the search for a paced set's slot (the earliest time at which every
/// limit admits): each moves the set's slot to a later limit's own; sets
/// whose limits' free slots alternate past this many are an input error.
pub const MAX_PACE_ROUNDS: usize = 64;

/// Where the limits of a `pace` set meet ([`meeting`]).
#[derive(Debug)]
pub(crate) struct Meeting {
    /// The set's slot: the earliest time (µs) from `now` at which every limit admits.
    pub(crate) slot: u64,
    /// The limits whose own slot, in the last round that moved it, was the set's: those
    /// that refuse a set whose slot is beyond its `max_wait`. With `past_horizon`, the
    /// limits that refused to book.
    pub(crate) binding: Vec<bool>,
    /// Set if a limit refused to book its slot, past its horizon (the window algorithms'
    /// `MAX_BOOKED_WINDOWS`): the longest retry-after of those that did. The set is refused.
    pub(crate) past_horizon: Option<Duration>,
}

/// The furthest a `pace` set's slot may be, in µs from now: 2^53 ns (about 104 days), so
/// that every time of the set is a whole number of nanoseconds a double holds exactly, in
/// Rust as in the Redis twin.
pub const MAX_PACE_SET_DELAY_US: u64 = (1 << 53) / 1_000;

/// A delay as the slot it ends on, in whole µs from `now`, rounded up (below
/// [`MAX_PACE_SET_DELAY_US`], as the Redis twin's floating point gives it).
fn slot_after(now: u64, delay: Duration) -> u64 {
    let us = delay.as_nanos().div_ceil(1_000);
    now.saturating_add(u64::try_from(us).unwrap_or(u64::MAX))
}

/// The earliest time, from `now`, at which every limit of a `pace` set admits, on copies of
/// the keys' states as read (`states[i]` is `requests[i]`'s): each limit's earliest slot at
/// or after a time ([`Policy::pace_from`], from `now` first), then the latest of them, until
/// every limit's is the same, or a limit refuses to book (past its horizon: the meeting's
/// `past_horizon`). Errors: a policy that cannot book ahead (naming `op`), or slots that do
/// not meet within [`MAX_PACE_ROUNDS`].
pub(crate) fn meeting(
    requests: &[Request<'_>],
    states: &[Option<paceline_core::State>],
    now: u64,
) -> Result<Meeting, InputError> {
    let mut slot = now;
    let mut binding = vec![false; requests.len()];
    for _ in 0..MAX_PACE_ROUNDS {
        let mut slots = Vec::with_capacity(requests.len());
        // The limits refusing to book (past their horizon), once one does.
        let mut refusing: Option<Vec<bool>> = None;
        let mut past_horizon = None;
        for (i, (r, state)) in requests.iter().zip(states).enumerate() {
            let mut copy = state.clone();
            let d = r.policy.pace_from(&mut copy, now, r.cost, slot)?;
            if d.allowed {
                slots.push(slot_after(now, d.delay));
            } else {
                slots.push(slot);
                refusing.get_or_insert_with(|| vec![false; requests.len()])[i] = true;
                past_horizon = past_horizon.max(Some(d.delay));
            }
        }
        if let Some(refusing) = refusing {
            return Ok(Meeting {
                slot,
                binding: refusing,
                past_horizon,
            });
        }
        let next = slots.iter().copied().max().unwrap_or(slot);
        if next == slot {
            return Ok(Meeting {
                slot,
                binding,
                past_horizon: None,
            });
        }
        if next - now > MAX_PACE_SET_DELAY_US || next > paceline_core::policy::MAX_NOW_US {
            // Too far, or past the last time the engine takes: no slot (as in the twin).
            break;
        }
        binding = slots.iter().map(|&s| s == next).collect();
        slot = next;
    }
    Err(unmet())
}

/// The error of a `pace` set whose limits' slots did not meet within [`MAX_PACE_ROUNDS`]
/// and [`MAX_PACE_SET_DELAY_US`] (on every store): a well-formed set that its policies, as
/// configured, cannot admit together ([`InputError::is_beyond_policy`]).
pub(crate) fn unmet() -> InputError {
    InputError::beyond_policy(
        "op",
        format!(
            "the limits' free slots do not meet within {MAX_PACE_ROUNDS} rounds and 104 \
             days; pace them one at a time, or decide the set with `limit`"
        ),
    )
}

/// The retry-after of a `pace` set refused at `meeting`, if it is: the later of a limit's
/// refusal past its horizon and the set's slot beyond `max_wait` (`max_us`; the slot
/// `meeting.slot - now` away, less `max_us`), as a single `pace` answers. Past a horizon,
/// `meeting.slot` is where the rounds had got to, no later than the set's own slot.
pub(crate) fn pace_refusal(meeting: &Meeting, now: u64, max_us: Option<f64>) -> Option<Duration> {
    let away = (meeting.slot - now) as f64;
    let waited = max_us
        .filter(|&max| away > max)
        .map(|max| paceline_core::Decision::from_micros(false, away - max, 0, 0.0, 0).delay);
    match (meeting.past_horizon, waited) {
        (Some(past), waited) => Some(past.max(waited.unwrap_or_default())),
        (None, waited) => waited,
    }
}

/// The decision of a `pace` set refused ([`pace_refusal`] gives `retry`): `own` holds each
/// limit's own `pace` (with the set's `max_wait`) from `now` (what it alone would answer,
/// nothing booked); the limits that set the slot, or refused it, refuse with `retry`.
pub(crate) fn refused_pace(meeting: Meeting, own: Vec<Decision>, retry: Duration) -> SetDecision {
    let limits = own
        .into_iter()
        .zip(meeting.binding)
        .map(|(mut d, binding)| {
            if binding {
                d.allowed = false;
                d.delay = retry;
            }
            d
        })
        .collect();
    SetDecision::new(false, limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(allowed: bool, delay_ms: u64, remaining: u64, reset_ms: u64, limit: u64) -> Decision {
        Decision::from_micros(
            allowed,
            (delay_ms * 1000) as f64,
            remaining,
            (reset_ms * 1000) as f64,
            limit,
        )
    }

    #[test]
    fn a_refused_set_names_its_refusals_and_their_longest_retry() {
        let set = SetDecision::new(
            false,
            vec![
                d(true, 0, 5, 100, 10),
                d(false, 300, 0, 900, 3),
                d(false, 700, 0, 50, 2),
            ],
        );
        assert!(!set.allowed());
        assert_eq!(set.refused().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(set.retry_after(), Some(Duration::from_millis(700)));
        assert_eq!(set.decision.remaining, 0);
        assert_eq!(set.decision.limit, 3, "the first of the tightest limits");
        assert_eq!(set.decision.reset_after, Duration::from_millis(900));
    }

    #[test]
    fn an_admitted_set_reports_the_tightest_limit() {
        let set = SetDecision::new(true, vec![d(true, 0, 9, 100, 10), d(true, 0, 2, 400, 3)]);
        assert!(set.allowed());
        assert_eq!(set.refused().count(), 0);
        assert_eq!(set.retry_after(), None);
        assert_eq!((set.decision.remaining, set.decision.limit), (2, 3));
        assert_eq!(set.decision.delay, Duration::ZERO);
    }

    #[test]
    fn sets_are_checked_before_any_store_sees_them() {
        let p: Policy = "gcra:rate=1/s,burst=2".parse().unwrap();
        let fw: Policy = "fixed_window:limit=2,window=1s".parse().unwrap();
        let err = |requests: &[Request]| check_set(requests).unwrap_err();
        assert_eq!(err(&[]).field(), "limits");
        let twice = [
            Request::new(&p, "k", Op::Limit, 1),
            Request::new(&fw, "k", Op::Limit, 1),
        ];
        assert!(err(&twice).message().contains("`k` appears twice"));
        let mixed = [
            Request::new(&p, "a", Op::Limit, 1),
            Request::new(&p, "b", Op::Peek, 1),
        ];
        assert_eq!(err(&mixed).field(), "op");
        let paced = [
            Request::new(&p, "a", Op::pace(), 1),
            Request::new(&fw, "b", Op::pace(), 1),
        ];
        assert!(
            check_set(&paced).is_ok(),
            "a set of limits that book ahead paces"
        );
        let pacer: Policy = "pacer:rate=1/s".parse().unwrap();
        let unbookable = [
            Request::new(&p, "a", Op::pace(), 1),
            Request::new(&pacer, "b", Op::pace(), 1),
        ];
        assert_eq!(err(&unbookable).field(), "op");
        assert!(
            check_set(&unbookable[1..]).is_ok(),
            "alone, any limit may pace"
        );
        let costly = [
            Request::new(&p, "a", Op::Limit, 1),
            Request::new(&fw, "b", Op::Limit, 3),
        ];
        assert_eq!(err(&costly).field(), "cost");
        let keys: Vec<String> = (0..=MAX_LIMITS).map(|i| format!("k{i}")).collect();
        let many: Vec<Request> = keys
            .iter()
            .map(|k| Request::new(&p, k, Op::Limit, 1))
            .collect();
        assert!(err(&many).message().contains("at most 16"));
        assert!(check_set(&many[..MAX_LIMITS]).is_ok());
    }

    #[test]
    fn concurrent_overlapping_sets_count_exactly_and_never_deadlock() {
        use crate::MemoryStore;
        use std::sync::Arc;
        // Three keys, sets of two in every rotation, from four threads: each admitted set
        // counts on both of its keys, a refused one on neither.
        // A clock that stands still: on the system clock a day's window could end mid-test.
        let store = Arc::new(
            MemoryStore::builder()
                .shards(4)
                .clock(crate::ManualClock::new(1_000_000))
                .build(),
        );
        let policy: Policy = "fixed_window:limit=500,window=1d".parse().unwrap();
        let keys = ["a", "b", "c"];
        let admitted: Vec<[u64; 3]> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|t| {
                    let (store, policy) = (Arc::clone(&store), policy.clone());
                    scope.spawn(move || {
                        let mut counted = [0u64; 3];
                        for i in 0..400 {
                            let (x, y) = ((i + t) % 3, (i + t + 1) % 3);
                            let set = Limits::new()
                                .with(policy.clone(), keys[x])
                                .with(policy.clone(), keys[y]);
                            if set.limit_sync(&*store, 1).unwrap().allowed() {
                                counted[x] += 1;
                                counted[y] += 1;
                            }
                        }
                        counted
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        for (k, key) in keys.iter().enumerate() {
            let counted: u64 = admitted.iter().map(|c| c[k]).sum();
            let used = 500
                - store
                    .decide_sync(&policy, key, Op::Peek, 1)
                    .unwrap()
                    .remaining;
            assert_eq!(used, counted, "key {key}");
            assert!(counted <= 500);
        }
        // 1,600 sets of two asked for 3,200 units of 1,500: the keys ran out.
        let total: u64 = admitted.iter().flatten().sum();
        assert!(total > 1_400, "only {total} units admitted");
    }

    #[test]
    fn a_full_store_sweeps_every_shard_before_refusing_a_set() {
        use crate::{ManualClock, MemoryStore};
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(2)
            .shards(64)
            .build();
        let p: Policy = "gcra:rate=1/s".parse().unwrap();
        // Two keys, idle a second later, in whichever shards they fall.
        for key in ["old1", "old2"] {
            assert!(Limits::new()
                .with(p.clone(), key)
                .limit_sync(&store, 1)
                .unwrap()
                .allowed());
        }
        clock.advance(std::time::Duration::from_secs(2));
        let set = Limits::new().with(p.clone(), "new1").with(p, "new2");
        assert!(
            set.limit_sync(&store, 1).unwrap().allowed(),
            "idle keys made room"
        );
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn a_full_store_refuses_a_set_needing_new_keys_whole() {
        use crate::{ManualClock, MemoryStore};
        let store = MemoryStore::builder()
            .clock(ManualClock::new(1_000_000))
            .max_keys(2)
            .build();
        let p: Policy = "gcra:rate=1/h".parse().unwrap();
        let one = Limits::new().with(p.clone(), "a");
        assert!(one.limit_sync(&store, 1).unwrap().allowed());
        let three = Limits::new()
            .with(p.clone(), "a2")
            .with(p.clone(), "b")
            .with(p.clone(), "c");
        let err = three.limit_sync(&store, 1).unwrap_err();
        assert!(
            matches!(err, Error::Store(ref e) if e.kind() == paceline_core::StoreErrorKind::Capacity),
            "{err:?}"
        );
        assert_eq!(store.len(), 1, "nothing of the refused set was stored");
        let two = Limits::new().with(p.clone(), "a").with(p, "b");
        let set = two.limit_sync(&store, 1).unwrap();
        assert!(!set.allowed(), "`a` is used up");
        assert_eq!(store.len(), 1, "a refused set adds no key");
    }
}
