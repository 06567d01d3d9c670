//! [`CachedRefusals`]: refusals remembered in this process, in front of a remote store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use paceline_core::{duration_to_micros, Clock, Decision, Error, Op, Policy, Sleep};

use crate::{Request, SetDecision, SharedStore, Store, StoreFuture, SystemClock};

/// The refusals a [`CachedRefusals`] holds unless told otherwise.
pub const DEFAULT_REFUSALS: usize = 10_000;

/// The longest a [`CachedRefusals`] holds a refusal, whatever its retry-after: a reset the
/// cache does not see is then honoured within this long.
pub const MAX_HOLD: Duration = Duration::from_secs(60);

/// Sets whose keys add up to more than this many bytes are not cached.
const MAX_SIGNATURE: usize = 1024;

/// A store that remembers refusals: a request (or set) the store refused with a
/// retry-after `R` is refused here, without asking the store, until `R` has passed (as
/// Limitador and rate-limiter-flexible's `inMemoryBlockOnConsumed` do). A client that
/// keeps retrying a refused key then costs Redis nothing.
///
/// * **Never admits what the store would refuse**: the cache only refuses, and only until
///   the retry-after the store itself gave, which more traffic can only push later. A
///   remembered refusal answers requests of the same keys, policies, op and costs.
/// * **Not cached**: `concurrency` limits (a lease given back early frees a place before
///   the retry-after), `sliding_log` with `count_blocked` (its refusals count), and sets
///   whose keys add up to more than 1 KiB.
/// * **Resets**: a [`reset`](Store::reset) through this cache forgets the key's refusals
///   (and a decision in flight across it remembers nothing). A reset the cache does not see
///   (made on the store directly, or by another process) is not known here: a refusal is
///   held at most a minute, so such a key is refused here at most that
///   much longer than the store would.
/// * **Bounded**: at most `capacity` refusals; when full, expired ones are dropped, and a
///   new refusal is not remembered until there is room.
/// * A refusal from the cache has [`Decision::cached`] set; its `delay` is the time left,
///   its `remaining` and `reset_after` are the store's at the refusal (the latter counted
///   down).
///
/// Time is the inner store's clock where it has one ([`Store::time_source`]), else the
/// system's.
///
/// ```
/// use paceline_store::{CachedRefusals, Limiter, ManualClock, MemoryStore};
/// use std::sync::Arc;
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline_store::Error> {
/// let clock = ManualClock::new(0);
/// let inner = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
/// let cached = Arc::new(CachedRefusals::new(inner, 1_000));
/// let limiter = Limiter::with_store("gcra:rate=1/s".parse()?, Arc::clone(&cached));
/// assert!(limiter.limit("k", 1).await?.allowed);
/// let refused = limiter.limit("k", 1).await?; // the store refused
/// assert!(!refused.allowed && !refused.cached);
/// let again = limiter.limit("k", 1).await?; // the cache refused, without asking it
/// assert!(!again.allowed && again.cached);
/// assert_eq!(again.delay, refused.delay);
/// clock.advance(Duration::from_secs(1));
/// assert!(limiter.limit("k", 1).await?.allowed); // the refusal expired on time
/// assert_eq!(cached.hits(), 1);
/// # Ok(()) }
/// ```
pub struct CachedRefusals {
    inner: SharedStore,
    clock: Arc<dyn Clock>,
    capacity: usize,
    /// By the keys of the request or set ([`CachedRefusals::signature`]).
    refusals: Mutex<Held>,
    /// How many refusals are held, read without the lock (zero: nothing to look up).
    held: AtomicUsize,
    /// Counts the resets through the cache: a decision that began before one does not
    /// remember its refusal.
    resets: AtomicU64,
    hits: AtomicU64,
}

/// The refusals, and the earliest time one of them expires (a full cache is swept only
/// once something can go).
#[derive(Default)]
struct Held {
    map: HashMap<String, Refusal>,
    earliest: u64,
}

/// A remembered refusal.
struct Refusal {
    /// Each request's policy, cost and op.
    parts: Vec<(Policy, u64, Op)>,
    /// When it was refused, and until when (µs of the cache's clock).
    at: u64,
    until: u64,
    decision: SetDecision,
}

impl std::fmt::Debug for CachedRefusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedRefusals")
            .field("capacity", &self.capacity)
            .field("held", &self.len())
            .field("hits", &self.hits())
            .finish()
    }
}

impl CachedRefusals {
    /// `inner` with a cache of at most `capacity` refusals.
    pub fn new(inner: SharedStore, capacity: usize) -> CachedRefusals {
        let clock = inner
            .time_source()
            .unwrap_or_else(|| Arc::new(SystemClock::new()));
        CachedRefusals {
            inner,
            clock,
            capacity,
            refusals: Mutex::new(Held::default()),
            held: AtomicUsize::new(0),
            resets: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &SharedStore {
        &self.inner
    }

    /// How many decisions the cache answered without asking the store.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// The refusals held (some may have expired).
    pub fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// True if no refusal is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.refusals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The keys of `requests`, each after its length (so that no two lists of keys read
    /// alike); `None` past [`MAX_SIGNATURE`] bytes.
    fn signature(requests: &[Request<'_>]) -> Option<String> {
        use std::fmt::Write as _;
        let bytes: usize = requests.iter().map(|r| r.key.len() + 8).sum();
        if bytes > MAX_SIGNATURE {
            return None;
        }
        let mut text = String::with_capacity(bytes);
        for r in requests {
            let _ = write!(text, "{}:", r.key.len());
            text.push_str(r.key);
        }
        Some(text)
    }

    /// Whether `signature` (see [`CachedRefusals::signature`]) holds `key`.
    fn holds_key(mut signature: &str, key: &str) -> bool {
        while let Some((length, rest)) = signature.split_once(':') {
            let Ok(length) = length.parse::<usize>() else {
                return false;
            };
            let Some(k) = rest.get(..length) else {
                return false;
            };
            if k == key {
                return true;
            }
            signature = &rest[length..];
        }
        false
    }

    /// Whether the store's refusal of `requests` may be remembered.
    fn cacheable(requests: &[Request<'_>]) -> bool {
        requests.iter().all(|r| match r.policy {
            Policy::Concurrency(_) => false,
            Policy::SlidingLog(log) => !log.count_blocked(),
            _ => true,
        })
    }

    /// The remembered refusal of `requests`, if one holds at the cache's time.
    fn lookup(&self, requests: &[Request<'_>]) -> Option<SetDecision> {
        if self.capacity == 0 || requests.is_empty() || self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let signature = Self::signature(requests)?;
        let mut held = self.lock();
        // Read under the lock: no refusal remembered before it is later than it.
        let now = self.clock.now_micros();
        let refusal = held.map.get(&signature)?;
        if refusal.until <= now {
            held.map.remove(&signature);
            self.held.store(held.map.len(), Ordering::Relaxed);
            return None;
        }
        let same = refusal.parts.len() == requests.len()
            && refusal
                .parts
                .iter()
                .zip(requests)
                .all(|((policy, cost, op), r)| {
                    *cost == r.cost && *op == r.op && policy == r.policy
                });
        if !same {
            return None;
        }
        let elapsed = Duration::from_micros(now.saturating_sub(refusal.at));
        let left = Duration::from_micros(refusal.until - now);
        let limits: Vec<Decision> = refusal
            .decision
            .limits
            .iter()
            .map(|d| {
                let mut d = *d;
                if !d.allowed {
                    d.delay = d.delay.saturating_sub(elapsed).min(left);
                }
                d.reset_after = d.reset_after.saturating_sub(elapsed);
                d.cached = true;
                d
            })
            .collect();
        drop(held);
        self.hits.fetch_add(1, Ordering::Relaxed);
        let mut set = SetDecision::new(false, limits);
        set.decision.delay = left;
        set.decision.cached = true;
        Some(set)
    }

    /// Remembers the store's answer to `requests`, asked at `asked` (the cache's time
    /// before the call) with no reset through the cache since `generation`, if it is a
    /// refusal that may be cached; forgets any refusal of theirs if it is an admission.
    fn remember(&self, requests: &[Request<'_>], set: &SetDecision, asked: u64, generation: u64) {
        if self.capacity == 0 || requests.is_empty() || !Self::cacheable(requests) {
            return;
        }
        let Some(signature) = Self::signature(requests) else {
            return;
        };
        if set.allowed() {
            if self.held.load(Ordering::Relaxed) > 0 {
                let mut held = self.lock();
                held.map.remove(&signature);
                self.held.store(held.map.len(), Ordering::Relaxed);
            }
            return;
        }
        let retry = set.decision.delay.min(MAX_HOLD);
        if retry.is_zero() || set.decision.fallback.is_some() {
            return;
        }
        // From the time the store was asked: never later than its own retry-after.
        let until = asked.saturating_add(duration_to_micros(retry).floor() as u64);
        let mut held = self.lock();
        if self.resets.load(Ordering::Relaxed) != generation {
            // A reset came through while the store decided: this refusal may predate it.
            return;
        }
        let now = self.clock.now_micros();
        if until <= now {
            return;
        }
        if held.map.len() >= self.capacity && !held.map.contains_key(&signature) {
            if now < held.earliest {
                // Full of refusals none of which has expired yet.
                return;
            }
            held.map.retain(|_, r| r.until > now);
            held.earliest = held.map.values().map(|r| r.until).min().unwrap_or(u64::MAX);
            if held.map.len() >= self.capacity {
                self.held.store(held.map.len(), Ordering::Relaxed);
                return;
            }
        }
        held.earliest = if held.map.is_empty() {
            until
        } else {
            held.earliest.min(until)
        };
        held.map.insert(
            signature,
            Refusal {
                parts: requests
                    .iter()
                    .map(|r| (r.policy.clone(), r.cost, r.op))
                    .collect(),
                at: asked,
                until,
                decision: set.clone(),
            },
        );
        self.held.store(held.map.len(), Ordering::Relaxed);
    }

    /// Forgets `key`'s refusals, and makes the decisions in flight remember none.
    fn forget(&self, key: &str) {
        let mut held = self.lock();
        self.resets.fetch_add(1, Ordering::Relaxed);
        held.map
            .retain(|signature, _| !Self::holds_key(signature, key));
        self.held.store(held.map.len(), Ordering::Relaxed);
    }

    /// The time and the reset generation before asking the store.
    fn asking(&self) -> (u64, u64) {
        (self.clock.now_micros(), self.resets.load(Ordering::Relaxed))
    }

    async fn decide_now(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        cost: u64,
    ) -> Result<Decision, Error> {
        let request = [Request::new(policy, key, op, cost)];
        if let Some(set) = self.lookup(&request) {
            return Ok(set.limits[0]);
        }
        let (asked, generation) = self.asking();
        let decision = self.inner.decide(policy, key, op, cost).await?;
        let set = SetDecision::new(decision.allowed, vec![decision]);
        self.remember(&request, &set, asked, generation);
        Ok(decision)
    }

    async fn decide_all_now(&self, requests: &[Request<'_>]) -> Result<SetDecision, Error> {
        if let Some(set) = self.lookup(requests) {
            return Ok(set);
        }
        let (asked, generation) = self.asking();
        let set = self.inner.decide_all(requests).await?;
        self.remember(requests, &set, asked, generation);
        Ok(set)
    }
}

impl Store for CachedRefusals {
    fn decide<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        op: Op,
        cost: u64,
    ) -> StoreFuture<'a, Result<Decision, Error>> {
        StoreFuture::boxed(self.decide_now(policy, key, op, cost))
    }

    fn decide_all<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Result<SetDecision, Error>> {
        StoreFuture::boxed(self.decide_all_now(requests))
    }

    fn release<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<bool, Error>> {
        self.inner.release(policy, key, lease)
    }

    fn extend<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<Option<Duration>, Error>> {
        self.inner.extend(policy, key, lease)
    }

    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<(), Error>> {
        self.forget(key);
        let inner = self.inner.reset(key);
        StoreFuture::boxed(async move {
            let reset = inner.await;
            // Decisions that began while the reset was under way remember nothing either.
            self.forget(key);
            reset
        })
    }

    fn ready(&self) -> StoreFuture<'_, Result<(), Error>> {
        self.inner.ready()
    }

    fn token_key<'a>(
        &'a self,
        name: &'a str,
    ) -> StoreFuture<'a, Result<crate::secret::TokenKey, Error>> {
        self.inner.token_key(name)
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.inner.sleep(duration)
    }

    fn time_source(&self) -> Option<Arc<dyn Clock>> {
        self.inner.time_source()
    }

    fn is_remote(&self) -> bool {
        self.inner.is_remote()
    }

    #[cfg(feature = "redis")]
    fn functions(&self) -> Option<crate::redis::FunctionHost> {
        self.inner.functions()
    }

    #[cfg(feature = "redis")]
    fn health(&self) -> StoreFuture<'_, Option<crate::redis::Health>> {
        self.inner.health()
    }

    fn key_apart(&self, keys: &[&str]) -> Option<usize> {
        self.inner.key_apart(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, MemoryStore};
    use proptest::prelude::*;

    fn block<T>(future: StoreFuture<'_, T>) -> T {
        let mut future = future;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if let std::task::Poll::Ready(v) = std::pin::Pin::new(&mut future).poll(&mut cx) {
                return v;
            }
        }
    }

    use std::future::Future as _;

    proptest! {
        /// Random traffic on a few keys through the cache: every refusal the cache gives
        /// is one the store gives at that moment too, with the same retry-after (to the
        /// microsecond), and once a refusal's time has passed the cache answers no more.
        #[test]
        fn the_cache_refuses_only_what_the_store_refuses_and_only_for_as_long(
            spec in prop_oneof![
                Just("gcra:rate=5/s,burst=2"),
                Just("fixed_window:limit=3,window=1s"),
                Just("sliding_window:limit=3,window=700ms"),
                Just("sliding_log:limit=2,window=500ms"),
                Just("pacer:rate=4/s,max_burst=1"),
                Just("smooth_bursty:rate=3/s"),
            ],
            steps in proptest::collection::vec((0u64..400_000, 0usize..3, 1u64..=2, any::<bool>()), 1..80),
        ) {
            let clock = ManualClock::new(1_700_000_000_000_000);
            let inner = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
            let cached = CachedRefusals::new(Arc::clone(&inner) as SharedStore, 100);
            let policy: Policy = spec.parse().unwrap();
            for (sleep, key, cost, peek) in steps {
                clock.advance(Duration::from_micros(sleep));
                let key = format!("k{key}");
                let op = if peek { Op::Peek } else { Op::Limit };
                let hits = cached.hits();
                let d = block(cached.decide(&policy, &key, op, cost)).unwrap();
                let truth = block(inner.decide(&policy, &key, Op::Peek, cost)).unwrap();
                if d.cached {
                    prop_assert_eq!(cached.hits(), hits + 1);
                    prop_assert!(!d.allowed);
                    prop_assert!(!truth.allowed, "the cache refused what the store admits: {:?}", truth);
                    let (a, b) = (d.delay.as_nanos() as i128, truth.delay.as_nanos() as i128);
                    prop_assert!((a - b).abs() <= 1_000, "cache {:?}, store {:?}", d.delay, truth.delay);
                } else {
                    prop_assert_eq!(cached.hits(), hits);
                }
            }
        }
    }

    #[test]
    fn bounded_reset_and_leases_are_never_cached() {
        let clock = ManualClock::new(0);
        let inner: SharedStore = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
        let cached = CachedRefusals::new(inner, 2);
        let p: Policy = "gcra:rate=1/h".parse().unwrap();
        for key in ["a", "b", "c"] {
            for _ in 0..2 {
                block(cached.decide(&p, key, Op::Limit, 1)).unwrap();
            }
        }
        assert_eq!(cached.len(), 2, "at most the capacity");
        assert!(block(cached.decide(&p, "a", Op::Limit, 1)).unwrap().cached);
        // Another cost or op is asked of the store.
        assert!(!block(cached.decide(&p, "a", Op::Peek, 1)).unwrap().cached);
        block(cached.reset("a")).unwrap();
        let after = block(cached.decide(&p, "a", Op::Limit, 1)).unwrap();
        assert!(
            after.allowed && !after.cached,
            "a reset forgets the refusal"
        );
        let c: Policy = "concurrency:limit=1,lease=1h".parse().unwrap();
        let lease = block(cached.decide(&c, "l", Op::Limit, 1))
            .unwrap()
            .lease
            .unwrap();
        assert!(!block(cached.decide(&c, "l", Op::Limit, 1)).unwrap().allowed);
        assert!(block(cached.release(&c, "l", lease)).unwrap());
        let again = block(cached.decide(&c, "l", Op::Limit, 1)).unwrap();
        assert!(again.allowed, "a lease given back frees its place at once");
        // Off: nothing is held.
        let off = CachedRefusals::new(Arc::new(MemoryStore::new()), 0);
        block(off.decide(&p, "x", Op::Limit, 1)).unwrap();
        block(off.decide(&p, "x", Op::Limit, 1)).unwrap();
        assert!(off.is_empty());
    }

    #[test]
    fn refusals_are_held_at_most_a_minute_and_keys_never_read_alike() {
        let clock = ManualClock::new(0);
        let inner: SharedStore = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
        let cached = CachedRefusals::new(inner, 10);
        let hour: Policy = "gcra:rate=1/h".parse().unwrap();
        block(cached.decide(&hour, "k", Op::Limit, 1)).unwrap();
        let refused = block(cached.decide(&hour, "k", Op::Limit, 1)).unwrap();
        assert_eq!(refused.delay, Duration::from_secs(3600));
        assert!(
            block(cached.decide(&hour, "k", Op::Limit, 1))
                .unwrap()
                .cached
        );
        // Past a minute the store is asked again (and refuses again).
        clock.advance(MAX_HOLD);
        let asked = block(cached.decide(&hour, "k", Op::Limit, 1)).unwrap();
        assert!(!asked.cached && !asked.allowed);
        // Two lists of keys that a separator would confuse stay apart.
        let p: Policy = "gcra:rate=1/h".parse().unwrap();
        let one = [
            Request::new(&p, "a\0b", Op::Limit, 1),
            Request::new(&p, "c", Op::Limit, 1),
        ];
        let two = [
            Request::new(&p, "a", Op::Limit, 1),
            Request::new(&p, "b\0c", Op::Limit, 1),
        ];
        assert_ne!(
            CachedRefusals::signature(&one),
            CachedRefusals::signature(&two)
        );
        let signature = CachedRefusals::signature(&one).unwrap();
        assert!(CachedRefusals::holds_key(&signature, "c"));
        assert!(CachedRefusals::holds_key(&signature, "a\0b"));
        assert!(!CachedRefusals::holds_key(&signature, "a"));
        // Keys too long to hold are not cached.
        let long = "x".repeat(2000);
        assert!(CachedRefusals::signature(&[Request::new(&p, &long, Op::Limit, 1)]).is_none());
    }

    #[test]
    fn a_refused_set_is_remembered_whole() {
        let clock = ManualClock::new(0);
        let inner: SharedStore = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
        let cached = CachedRefusals::new(inner, 10);
        let second: Policy = "gcra:rate=1/s".parse().unwrap();
        let day: Policy = "fixed_window:limit=10,window=1d".parse().unwrap();
        let set = [
            Request::new(&second, "t:s", Op::Limit, 1),
            Request::new(&day, "t:d", Op::Limit, 1),
        ];
        assert!(block(cached.decide_all(&set)).unwrap().allowed());
        let refused = block(cached.decide_all(&set)).unwrap();
        assert!(!refused.allowed() && !refused.decision.cached);
        clock.advance(Duration::from_millis(400));
        let from_cache = block(cached.decide_all(&set)).unwrap();
        assert!(from_cache.decision.cached && !from_cache.allowed());
        assert_eq!(from_cache.refused().collect::<Vec<_>>(), [0]);
        assert_eq!(from_cache.retry_after(), Some(Duration::from_millis(600)));
        assert_eq!(from_cache.limits[1].remaining, 9);
        clock.advance(Duration::from_millis(600));
        assert!(block(cached.decide_all(&set)).unwrap().allowed());
    }
}
