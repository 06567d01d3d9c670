//! `concurrency`: at most `limit` requests in flight per key, each holding a lease.
//!
//! Where the other policies count requests over time, this one counts requests *at once*:
//! a request takes a lease, and gives it back when it ends ([`Policy::release`](crate::Policy::release)); a lease not
//! given back by its expiry (the holder crashed, or forgot) is reclaimed, so a limit can
//! never leak away. A holder that needs longer renews its lease ([`Policy::extend`](crate::Policy::extend)).
//!
//! Parameters: `limit` (an integer, 1 to [`MAX_LIMIT`]) and `lease` (a duration > 0): how
//! long a lease lives unless released or extended.
//!
//! State: the live leases, each an id, an expiry and the cost it holds, and the next id.
//! For a request of cost `n` at `now`, leases with `expiry <= now` are gone, and with
//! `used` the cost the live leases hold:
//!
//! ```text
//! admitted iff used + n <= limit
//! admitted: a lease of id max(next, now), expiry now + lease, holding n; next = id + 1
//! refused:  retry_after = the earliest time at which enough leases expire for n to fit
//!           (as if none were released early); nothing changes
//! remaining   = limit - used (after the decision)
//! reset_after = the latest expiry of a live lease - now (0 when none is live)
//! ```
//!
//! `limit` and `pace` are the same operation (a lease cannot be reserved for later: when
//! leases come back is not known); `peek` answers what `limit` would, taking nothing. The
//! decision's [`lease`](crate::Decision::lease) is the new lease's id. Ids start at the
//! time in microseconds and count up, so an id is never reused on a key (unless more than
//! one lease per microsecond were taken on it for longer than the lease's duration, and it
//! then went idle).
//!
//! A cost above `limit` can never be admitted (an input error, for every op).
//!
//! Memory: every lease holds a cost of at least 1, so a key holds **at most `limit` live
//! leases** (leases kept from a higher `limit` excepted, until they come back), and expired
//! ones are dropped by the next admission or release. Each decision reads every lease (and
//! on Redis decodes and encodes them all), so `limit` is at most [`MAX_LIMIT`].
//!
//! Live parameter changes keep the leases: a lower `limit` admits nothing more until enough
//! of them come back (`remaining` is 0 meanwhile); a new `lease` applies to leases taken or
//! extended from then on.
//!
//! ```
//! use paceline_core::{Op, Policy};
//! let p: Policy = "concurrency:limit=2,lease=30s".parse().unwrap();
//! let mut s = None;
//! let a = p.apply(&mut s, 0, Op::Limit, 1).unwrap();
//! let b = p.apply(&mut s, 0, Op::Limit, 1).unwrap();
//! assert!(a.allowed && b.allowed);
//! let third = p.apply(&mut s, 1_000_000, Op::Limit, 1).unwrap();
//! assert!(!third.allowed);
//! assert_eq!(third.delay.as_secs(), 29); // when the first lease would expire
//! // The first request ends: its lease comes back.
//! assert!(p.release(&mut s, 2_000_000, a.lease.unwrap()).unwrap());
//! assert!(p.apply(&mut s, 2_000_000, Op::Limit, 1).unwrap().allowed);
//! ```

use std::time::Duration;

use super::fixed_window::checked_duration;
use super::Algorithm;
use crate::spec::{format_duration, parse_count, parse_duration, Params};
use crate::{Decision, InputError, Op};

/// The largest `limit` a `concurrency` policy takes: 10,000. A key keeps one lease per
/// request in flight, up to `limit` of them, and every decision on the key reads them all
/// (on Redis, decodes and re-encodes them), so a key's state and each decision's cost grow
/// with `limit`; the bound is `sliding_log`'s, for the same reason.
///
/// ```
/// use paceline_core::Policy;
/// assert!("concurrency:limit=10000,lease=30s".parse::<Policy>().is_ok());
/// let e = "concurrency:limit=10001,lease=30s".parse::<Policy>().unwrap_err();
/// assert_eq!(e.field(), "limit");
/// ```
pub const MAX_LIMIT: u64 = super::sliding_log::MAX_LIMIT;

/// The `concurrency` policy: `limit` in flight, each lease living `lease`.
#[derive(Clone, Debug, PartialEq)]
pub struct Concurrency {
    limit: u64,
    lease_us: u64,
}

/// `concurrency` state: the leases held, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    /// The id the next lease gets, unless the time in µs is larger.
    pub next: u64,
    /// The leases, by id.
    pub leases: Vec<Lease>,
}

/// One lease: its id, until when it lives (µs since the Unix epoch), and the cost it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The lease's id, unique on its key.
    pub id: u64,
    /// It is reclaimed from this time on, unless extended.
    pub expires: u64,
    /// The cost it holds.
    pub cost: u64,
}

impl Concurrency {
    /// At most `limit` (1 to [`MAX_LIMIT`]) in flight, each lease living `lease` (1 µs to 10 years,
    /// whole microseconds) unless released or extended.
    ///
    /// ```
    /// use paceline_core::policy::Concurrency;
    /// use paceline_core::Policy;
    /// use std::time::Duration;
    /// let p: Policy = Concurrency::new(10, Duration::from_secs(30))?.into();
    /// assert_eq!(p, "concurrency:limit=10,lease=30s".parse()?);
    /// # Ok::<(), paceline_core::InputError>(())
    /// ```
    pub fn new(limit: u64, lease: Duration) -> Result<Concurrency, InputError> {
        let lease_us = checked_duration("lease", lease, false)?;
        Concurrency::from_micros(limit, lease_us)
    }

    fn from_micros(limit: u64, lease_us: u64) -> Result<Concurrency, InputError> {
        if limit == 0 {
            return Err(InputError::new(
                "limit",
                format!("must be 1 to {MAX_LIMIT}, not 0"),
            ));
        }
        if limit > MAX_LIMIT {
            return Err(InputError::new(
                "limit",
                format!(
                    "{limit} is too large for concurrency, which keeps one lease per request \
                     in flight and reads them all on every decision: use at most {MAX_LIMIT}"
                ),
            ));
        }
        Ok(Concurrency { limit, lease_us })
    }

    /// The most cost in flight at once.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How long a lease lives unless released or extended.
    pub fn lease(&self) -> Duration {
        Duration::from_micros(self.lease_us)
    }

    /// Gives back lease `id` at `now`: true if it was live (false: unknown, released or
    /// reclaimed already). Leases expired by `now` are dropped on the way.
    pub(crate) fn release(&self, s: &mut State, now: u64, id: u64) -> bool {
        let live = s.leases.iter().any(|l| l.id == id && l.expires > now);
        s.leases.retain(|l| l.expires > now && l.id != id);
        live
    }

    /// Renews lease `id` at `now` to live `lease` from now: its new expiry, or `None` if it
    /// is not live (unknown, released or reclaimed already).
    pub(crate) fn extend(&self, s: &mut State, now: u64, id: u64) -> Option<u64> {
        let lease = s
            .leases
            .iter_mut()
            .find(|l| l.id == id && l.expires > now)?;
        lease.expires = now.saturating_add(self.lease_us);
        Some(lease.expires)
    }
}

/// The live leases at `now`, and the cost they hold.
fn live(state: Option<&State>, now: u64) -> (Vec<Lease>, u64) {
    let leases: Vec<Lease> = state
        .map(|s| {
            s.leases
                .iter()
                .filter(|l| l.expires > now)
                .copied()
                .collect()
        })
        .unwrap_or_default();
    let used = leases.iter().map(|l| l.cost).sum();
    (leases, used)
}

impl Algorithm for Concurrency {
    type State = State;
    const NAME: &'static str = "concurrency";
    const PARAMS: &'static [&'static str] = &["limit", "lease"];

    fn from_params(params: &mut Params) -> Result<Self, InputError> {
        let limit = parse_count("limit", &params.required("limit")?, 1)?;
        let lease_us = parse_duration("lease", &params.required("lease")?)?;
        Concurrency::from_micros(limit, lease_us)
    }

    fn to_params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("limit", self.limit.to_string()),
            ("lease", format_duration(self.lease_us)),
        ]
    }

    fn max_cost(&self, _op: Op) -> Option<u64> {
        Some(self.limit)
    }

    fn limit(&self) -> u64 {
        self.limit
    }

    fn apply(&self, state: &mut Option<State>, now: u64, op: Op, cost: u64) -> Decision {
        let (mut leases, used) = live(state.as_ref(), now);
        let reset_after =
            |leases: &[Lease]| leases.iter().map(|l| l.expires - now).max().unwrap_or(0) as f64;
        if used + cost > self.limit {
            // When enough leases expire, soonest first, for `cost` to fit.
            let mut by_expiry: Vec<&Lease> = leases.iter().collect();
            by_expiry.sort_by_key(|l| l.expires);
            let mut held = used;
            let mut retry = 0;
            for l in by_expiry {
                held -= l.cost;
                if held + cost <= self.limit {
                    retry = l.expires - now;
                    break;
                }
            }
            return Decision::from_micros(
                false,
                retry as f64,
                self.limit.saturating_sub(used),
                reset_after(&leases),
                self.limit,
            );
        }
        if op == Op::Peek {
            return Decision::from_micros(
                true,
                0.0,
                self.limit.saturating_sub(used),
                reset_after(&leases),
                self.limit,
            );
        }
        let id = state.as_ref().map_or(0, |s| s.next).max(now);
        leases.push(Lease {
            id,
            expires: now.saturating_add(self.lease_us),
            cost,
        });
        let mut decision = Decision::from_micros(
            true,
            0.0,
            self.limit - used - cost,
            reset_after(&leases),
            self.limit,
        );
        decision.lease = Some(id);
        *state = Some(State {
            next: id + 1,
            leases,
        });
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{policy, SEC};
    use crate::Policy;
    use proptest::prelude::*;

    #[test]
    fn leases_are_taken_refused_released_and_reclaimed() {
        let p = policy("concurrency:limit=3,lease=10s");
        let mut s = None;
        let a = p.apply(&mut s, 5 * SEC, Op::Limit, 2).unwrap();
        assert!(a.allowed);
        assert_eq!((a.remaining, a.limit, a.lease), (1, 3, Some(5 * SEC)));
        assert_eq!(a.reset_after, Duration::from_secs(10));
        // A lower limit over the same leases: full, nothing underflows.
        let lower = policy("concurrency:limit=1,lease=10s");
        let over = lower.apply(&mut s.clone(), 5 * SEC, Op::Peek, 1).unwrap();
        assert_eq!((over.allowed, over.remaining), (false, 0));
        let b = p.apply(&mut s, 6 * SEC, Op::pace(), 1).unwrap();
        assert_eq!((b.allowed, b.remaining, b.lease), (true, 0, Some(6 * SEC)));
        // Full: refused until the lease of cost 2 expires, for a cost of 2; of 1, too.
        let before = s.clone();
        let c = p.apply(&mut s, 7 * SEC, Op::Limit, 2).unwrap();
        assert!(!c.allowed);
        assert_eq!(c.delay, Duration::from_secs(8));
        assert_eq!(c.reset_after, Duration::from_secs(9));
        assert_eq!(s, before, "a refusal changes nothing");
        assert_eq!(p.apply(&mut s, 7 * SEC, Op::Peek, 1).unwrap(), c);
        // Released: room again. A second release of the same lease is a no-op.
        assert!(p.release(&mut s, 7 * SEC, 6 * SEC).unwrap());
        assert!(!p.release(&mut s, 7 * SEC, 6 * SEC).unwrap());
        let d = p.apply(&mut s, 7 * SEC, Op::Limit, 1).unwrap();
        assert_eq!((d.allowed, d.lease), (true, Some(7 * SEC)));
        // Extended: lives 10 s from the renewal; the unknown lease is not.
        assert_eq!(p.extend(&mut s, 14 * SEC, 5 * SEC).unwrap(), Some(24 * SEC));
        assert_eq!(p.extend(&mut s, 14 * SEC, 42).unwrap(), None);
        // Reclaimed: the lease of `d` expires at 17 s and comes back without a release.
        let e = p.apply(&mut s, 17 * SEC, Op::Limit, 1).unwrap();
        assert_eq!((e.allowed, e.remaining), (true, 0));
        assert!(!p.release(&mut s, 17 * SEC, 7 * SEC).unwrap(), "reclaimed");
        assert_eq!(
            p.extend(&mut s, 25 * SEC, 5 * SEC).unwrap(),
            None,
            "expired at 24 s"
        );
    }

    #[test]
    fn ids_count_up_from_the_time_and_never_repeat() {
        let p = policy("concurrency:limit=5,lease=1s");
        let mut s = None;
        let ids: Vec<u64> = (0..3)
            .map(|_| p.apply(&mut s, 100, Op::Limit, 1).unwrap().lease.unwrap())
            .collect();
        assert_eq!(ids, [100, 101, 102]);
        assert_eq!(p.apply(&mut s, 500, Op::Limit, 1).unwrap().lease, Some(500));
    }

    #[test]
    fn leases_belong_to_concurrency_policies_only() {
        let g = policy("gcra:rate=1/s");
        let mut s = None;
        assert_eq!(g.release(&mut s, 0, 1).unwrap_err().field(), "policy");
        assert_eq!(g.extend(&mut s, 0, 1).unwrap_err().field(), "policy");
        let c = policy("concurrency:limit=1,lease=1s");
        // A key another algorithm wrote holds no lease; it is left as it was.
        g.apply(&mut s, 0, Op::Limit, 1).unwrap();
        let before = s.clone();
        assert!(!c.release(&mut s, 0, 0).unwrap());
        assert_eq!(c.extend(&mut s, 0, 0).unwrap(), None);
        assert_eq!(s, before);
        assert_eq!(c.max_cost(Op::Limit), Some(1));
        assert_eq!(
            "concurrency:limit=0,lease=1s"
                .parse::<Policy>()
                .unwrap_err()
                .field(),
            "limit"
        );
        assert_eq!(
            "concurrency:limit=1,lease=0s"
                .parse::<Policy>()
                .unwrap_err()
                .field(),
            "lease"
        );
        assert_eq!(
            "concurrency:limit=1".parse::<Policy>().unwrap_err().field(),
            "lease"
        );
    }

    #[test]
    fn the_limit_is_bounded() {
        let max = format!("concurrency:limit={MAX_LIMIT},lease=30s");
        assert_eq!(policy(&max).max_cost(Op::Limit), Some(MAX_LIMIT));
        assert_eq!(
            Concurrency::new(MAX_LIMIT, Duration::from_secs(30))
                .unwrap()
                .limit(),
            MAX_LIMIT
        );
        let e = "concurrency:limit=10001,lease=30s"
            .parse::<Policy>()
            .unwrap_err();
        assert_eq!(e.field(), "limit");
        assert!(
            e.message().contains("10001") && e.message().contains("at most 10000"),
            "{}",
            e.message()
        );
        let e = Concurrency::new(1 << 40, Duration::from_secs(30)).unwrap_err();
        assert_eq!(e.field(), "limit");
        assert!(e.message().contains("at most 10000"), "{}", e.message());
        let e = Concurrency::new(0, Duration::from_secs(30)).unwrap_err();
        assert_eq!(
            (e.field(), e.message()),
            ("limit", "must be 1 to 10000, not 0")
        );
    }

    proptest! {
        /// Whatever the traffic: the live leases never hold more than the limit; a refusal
        /// changes nothing and its retry-after is exact (the request fits then, not a
        /// microsecond before, if nothing is released); a release or an extension is true
        /// exactly for a live lease.
        #[test]
        fn random_traffic_keeps_the_contract(
            limit in 1u64..=4,
            lease in 1u64..=2_000,
            steps in proptest::collection::vec((0u64..1_500, 1u64..=4, 0u8..4, 0usize..8), 1..100),
        ) {
            let p = policy(&format!("concurrency:limit={limit},lease={lease}ms"));
            let lease_us = lease * 1_000;
            let mut s = None;
            let mut now = 1_000_000u64;
            let mut issued: Vec<u64> = Vec::new();
            for (step, cost, op, pick) in steps {
                now += step * 1_000;
                let cost = 1 + (cost - 1) % limit;
                let held = |s: &Option<crate::State>| match s {
                    Some(crate::State::Concurrency(s)) => s.leases.iter().filter(|l| l.expires > now).map(|l| l.cost).sum(),
                    _ => 0,
                };
                match op {
                    0 | 1 => {
                        let before = s.clone();
                        let used: u64 = held(&s);
                        let d = p.apply(&mut s, now, Op::Limit, cost).unwrap();
                        prop_assert_eq!(d.allowed, used + cost <= limit);
                        if d.allowed {
                            let id = d.lease.unwrap();
                            prop_assert!(!issued.contains(&id), "id {} reused", id);
                            issued.push(id);
                            prop_assert_eq!(d.remaining, limit - used - cost);
                        } else {
                            prop_assert_eq!(&s, &before);
                            let retry = d.delay.as_micros() as u64;
                            prop_assert!(retry > 0 && retry <= lease_us);
                            let mut later = s.clone();
                            prop_assert!(p.apply(&mut later, now + retry, Op::Peek, cost).unwrap().allowed);
                            let mut sooner = s.clone();
                            prop_assert!(!p.apply(&mut sooner, now + retry - 1, Op::Peek, cost).unwrap().allowed);
                        }
                        prop_assert!(held(&s) <= limit);
                    }
                    2 => {
                        let id = issued.get(pick % issued.len().max(1)).copied().unwrap_or(0);
                        let live = match &s {
                            Some(crate::State::Concurrency(st)) => st.leases.iter().any(|l| l.id == id && l.expires > now),
                            _ => false,
                        };
                        prop_assert_eq!(p.release(&mut s, now, id).unwrap(), live);
                    }
                    _ => {
                        let id = issued.get(pick % issued.len().max(1)).copied().unwrap_or(0);
                        let live = match &s {
                            Some(crate::State::Concurrency(st)) => st.leases.iter().any(|l| l.id == id && l.expires > now),
                            _ => false,
                        };
                        let renewed = p.extend(&mut s, now, id).unwrap();
                        prop_assert_eq!(renewed, live.then_some(now + lease_us));
                    }
                }
            }
        }
    }
}
