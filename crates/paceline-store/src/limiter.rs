//! The [`Limiter`]: a policy and a store.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Decision, Error, InputError, Op, Policy};

use crate::{MemoryStore, Store, SyncStore};

/// A rate limiter and pacer: one [`Policy`] applied to any number of keys, with state in a
/// [`Store`].
///
/// * [`pace`](Limiter::pace): never drops work. Reserves the earliest slot the policy allows
///   and returns the `delay` to sleep before acting; workers sharing a store together hold
///   the policy's rate exactly.
/// * [`try_pace`](Limiter::try_pace): `pace`, but only if the delay is at most `max_wait`;
///   otherwise rejects and changes nothing.
/// * [`limit`](Limiter::limit): admits now or rejects with a retry-after, changing nothing on
///   rejection.
/// * [`acquire`](Limiter::acquire): `pace`, then sleeps the delay.
/// * [`peek`](Limiter::peek) and [`reset`](Limiter::reset).
///
/// A rejection is a [`Decision`] with `allowed == false`, never an `Err`: errors mean bad
/// input ([`Error::Input`]) or a failed store ([`Error::Store`]).
///
/// Every store implements the async methods; a store that never waits on I/O (the
/// in-memory [`MemoryStore`]) also offers the same operations synchronously (`limit_sync`,
/// `pace_sync`, ...).
///
/// Keys are shared by every limiter on the same store: a key's state is read by whichever
/// policy is applied to it (a different policy of the same algorithm is a live parameter
/// change). Give limiters with different policies distinct keys, e.g. prefixed
/// `"upload:alice"` / `"search:alice"`.
///
/// ```
/// use paceline_store::Limiter;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline_store::Error> {
/// // 10 role updates per 10 seconds per Discord guild.
/// let limiter = Limiter::from_spec("fixed_window:limit=10,window=10s")?;
/// let decision = limiter.limit("guild:42", 1).await?;
/// assert!(decision.allowed);
/// assert_eq!(decision.remaining, 9);
///
/// // Or never drop work: reserve a slot and sleep until it.
/// let pacer = Limiter::from_spec("pacer:rate=100/s")?;
/// let d = pacer.acquire("api.example.com", 1).await?; // returns after d.delay
/// assert!(d.allowed);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Limiter<S: ?Sized = MemoryStore> {
    policy: Arc<Policy>,
    store: Arc<S>,
}

impl<S: ?Sized> Clone for Limiter<S> {
    fn clone(&self) -> Self {
        Limiter {
            policy: Arc::clone(&self.policy),
            store: Arc::clone(&self.store),
        }
    }
}

impl Limiter<MemoryStore> {
    /// A limiter with its own in-memory store on the system clock.
    pub fn new(policy: Policy) -> Self {
        Limiter::with_store(policy, Arc::new(MemoryStore::new()))
    }

    /// A limiter with its own in-memory store, from a spec such as
    /// `"gcra:rate=10/s,burst=5"`.
    ///
    /// ```
    /// let err = paceline_store::Limiter::from_spec("gcra:rate=10/s,burst=0").unwrap_err();
    /// assert_eq!(err.field(), "burst");
    /// ```
    pub fn from_spec(spec: &str) -> Result<Self, InputError> {
        Ok(Limiter::new(spec.parse()?))
    }
}

impl<S: Store + ?Sized> Limiter<S> {
    /// A limiter applying `policy` to keys held in `store` (which other limiters may share).
    pub fn with_store(policy: Policy, store: Arc<S>) -> Self {
        Limiter {
            policy: Arc::new(policy),
            store,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Reserves the earliest slot for `cost` on `key` and returns the delay to wait before
    /// acting. Admitted unless the input is invalid, the slot lies past the policy's
    /// horizon (`fixed_window` and `sliding_window` book at most
    /// [`MAX_BOOKED_WINDOWS`](paceline_core::policy::fixed_window::MAX_BOOKED_WINDOWS) windows
    /// ahead), or a `concurrency` policy has `limit` leases live (it books no slot ahead):
    /// then rejected with no change, the decision's `delay` being the time until the slot
    /// comes within the horizon, or until enough leases expire.
    /// [`acquire`](Limiter::acquire) asks again then by itself.
    pub async fn pace(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.decide(&self.policy, key, Op::pace(), cost).await
    }

    /// Like [`pace`](Limiter::pace), but only if the delay is at most `max_wait`; otherwise
    /// rejected with no change, the decision's `delay` being the retry-after.
    pub async fn try_pace(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        self.store
            .decide(&self.policy, key, Op::pace_within(max_wait), cost)
            .await
    }

    /// Admits `cost` on `key` now, or rejects with a retry-after and no change.
    pub async fn limit(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.decide(&self.policy, key, Op::Limit, cost).await
    }

    /// What [`limit`](Limiter::limit) of `cost` would answer, with the key's current
    /// `remaining` and `reset_after`; changes nothing.
    pub async fn peek(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.decide(&self.policy, key, Op::Peek, cost).await
    }

    /// Counts `cost` already spent on `key`, past the policy's limit if need be, and never
    /// refuses: for costs known only after the work (an LLM answer's tokens). The key stays
    /// exhausted until the debt drains, so later [`limit`](Limiter::limit) calls refuse
    /// and [`pace`](Limiter::pace) calls wait. The decision is admitted with no delay, its
    /// `remaining` what is left after the charge. A `concurrency` policy refuses a charge
    /// (an input error naming `op`).
    ///
    /// ```
    /// use paceline_store::{Limiter, ManualClock, MemoryStore, Policy};
    /// use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_store::Error> {
    /// let clock = ManualClock::new(0);
    /// let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    /// let policy: Policy = "fixed_window:limit=1000,window=1m".parse()?;
    /// let tokens = Limiter::with_store(policy, store);
    /// // Let the call go if the budget has room, then charge what its answer cost.
    /// assert!(tokens.peek("user-7", 1).await?.allowed);
    /// let charged = tokens.charge("user-7", 1_800).await?;
    /// assert!(charged.allowed && charged.remaining == 0);
    /// assert!(!tokens.limit("user-7", 1).await?.allowed); // in debt until the window ends
    /// clock.set_micros(60_000_000);
    /// assert!(tokens.limit("user-7", 1).await?.allowed);
    /// # Ok(()) }
    /// ```
    pub async fn charge(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.decide(&self.policy, key, Op::Charge, cost).await
    }

    /// Forgets `key`.
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        self.store.reset(key).await
    }

    /// Reserves a slot like [`pace`](Limiter::pace), then waits until it (in the store's
    /// time: a tokio sleep, or an advance of a virtual clock). Returns the decision.
    ///
    /// A backlog past the policy's horizon, or a full `concurrency` policy (see
    /// [`pace`](Limiter::pace)), books nothing: the call waits until its slot comes within
    /// the horizon, or until enough leases expire, and asks again, so it returns only
    /// with a slot reserved and reached (its decision admitted) or with an error. A lease
    /// given back earlier is seen only then: for leases, ask with
    /// [`limit`](Limiter::limit) and retry on your own signal.
    ///
    /// **Cancellation**: the slot is reserved before the wait starts. If this future is
    /// dropped during the wait, the reservation stands and its slot goes unused: other
    /// callers are still paced around it. Nothing is reserved if the future is dropped
    /// before its first poll.
    ///
    /// ```
    /// use paceline_store::{Clock, Limiter, ManualClock, MemoryStore, Policy};
    /// use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_store::Error> {
    /// let clock = ManualClock::new(0);
    /// let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    /// let policy: Policy = "fixed_window:limit=1,window=1s".parse()?;
    /// let limiter = Limiter::with_store(policy, store);
    /// let first = limiter.acquire("k", 1).await?; // window 0: at once
    /// let second = limiter.acquire("k", 1).await?; // window 1: the virtual clock moves 1 s
    /// assert!(first.allowed && second.allowed);
    /// assert_eq!(clock.now_micros(), 1_000_000);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        loop {
            let decision = self.pace(key, cost).await?;
            if decision.allowed {
                self.wait(&decision).await;
                return Ok(decision);
            }
            // Past the horizon, nothing booked: ask again once the slot comes within it
            // (never sooner than a microsecond, so the loop always moves time on).
            self.store
                .sleep(decision.delay.max(Duration::from_micros(1)))
                .await;
        }
    }

    /// [`acquire`](Limiter::acquire) with a bound on the wait: if the delay would exceed
    /// `max_wait`, returns the rejection at once, reserving nothing.
    pub async fn try_acquire(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let decision = self.try_pace(key, cost, max_wait).await?;
        if decision.allowed {
            self.wait(&decision).await;
        }
        Ok(decision)
    }

    async fn wait(&self, decision: &Decision) {
        if !decision.delay.is_zero() {
            self.store.sleep(decision.delay).await;
        }
    }
}

impl<S: SyncStore + ?Sized> Limiter<S> {
    /// [`pace`](Limiter::pace), synchronously.
    pub fn pace_sync(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.decide_sync(&self.policy, key, Op::pace(), cost)
    }

    /// [`try_pace`](Limiter::try_pace), synchronously.
    pub fn try_pace_sync(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        self.store
            .decide_sync(&self.policy, key, Op::pace_within(max_wait), cost)
    }

    /// [`limit`](Limiter::limit), synchronously.
    ///
    /// ```
    /// let limiter = paceline_store::Limiter::from_spec("gcra:rate=1/s,burst=2")?;
    /// assert!(limiter.limit_sync("k", 2)?.allowed);
    /// let rejected = limiter.limit_sync("k", 1)?;
    /// assert!(!rejected.allowed);
    /// assert!(rejected.retry_after().is_some());
    /// # Ok::<(), paceline_store::Error>(())
    /// ```
    #[inline]
    pub fn limit_sync(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.decide_sync(&self.policy, key, Op::Limit, cost)
    }

    /// [`peek`](Limiter::peek), synchronously.
    pub fn peek_sync(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.decide_sync(&self.policy, key, Op::Peek, cost)
    }

    /// [`charge`](Limiter::charge), synchronously.
    pub fn charge_sync(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.store.decide_sync(&self.policy, key, Op::Charge, cost)
    }

    /// [`reset`](Limiter::reset), synchronously.
    pub fn reset_sync(&self, key: &str) -> Result<(), Error> {
        self.store.reset_sync(key)
    }
}
