//! The in-process store: sharded, bounded, safe for any number of threads and tasks.

use std::future::Future;
use std::hash::BuildHasher;
use std::num::NonZeroU8;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, TryLockError};
use std::task::{Context, Poll};
use std::time::Duration;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use paceline_core::policy::{gcra, Gcra};
use paceline_core::{Clock, Decision, Error, Op, Policy, Sleep, State, StoreError, StoreErrorKind};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::set::{check_set, meeting, pace_refusal, refused_pace};
use crate::{Request, SetDecision, Store, StoreFuture, SyncStore, SystemClock};

/// A sweep pass over every shard begins at most this often (microseconds of the store's
/// clock), on the first call after the previous one began this long ago and has finished.
const SWEEP_PERIOD_US: u64 = 1_000_000;

/// While a pass is under way, each call visits at most this many table slots.
const SWEEP_STEP_SLOTS: usize = 1_024;

/// While a pass is under way, each call finishes at most this many shards' visits (taking a
/// lock is not free, even on an empty shard).
const SWEEP_STEP_SHARDS: usize = 16;

/// Keys' state in this process.
///
/// * **Concurrency**: keys are spread over shards by hash. A request for a key the store
///   already holds takes its shard's *shared* lock, a [`ShardedLock`] whose readers lock one
///   of several locks picked by thread, so threads deciding on the same or nearby keys never
///   wait for each other nor fight over a lock's cache line: a `gcra` key's whole state is one atomic word (the
///   TAT), updated by compare-and-swap; any other key's state has a small lock of its own,
///   held while its decision is computed, so requests for one key apply one at a time (no
///   lost updates). Only adding or removing keys (a new key, a reset, a sweep slice) takes a shard's
///   exclusive lock.
/// * **Keys** of up to 15 bytes are held inside their entry (no allocation of their own);
///   longer ones on the heap.
/// * **Bounded memory**: a key whose `reset_after` has passed is idle, and sweep passes drop
///   idle keys. A pass visits every slot of every shard's table, then shrinks each table
///   left less than a quarter full to twice its keys (a table with no keys left is freed),
///   so the memory goes back to the allocator. Passes are paid for by the calls, with no
///   background thread: a pass begins on the first call (`decide` or `reset`, of any key)
///   at least one second, by the store's clock, after the previous pass began and once it
///   has finished; while a pass is under way each call visits at most 1,024 slots and 16
///   shards, under one shard's exclusive lock at a time. So **a key idle at time `t` is
///   dropped by the end of the first pass that begins at or after `t`**: while calls keep
///   coming, that is at most one second after `t` (once an earlier pass has finished) plus
///   the calls a pass takes, at most `slots / 1024 + shards / 16 + 1` of them (2,053 for a
///   million keys on 64 shards; [`MemoryStore::slots`]), more only if new keys grow a table
///   while the pass visits it (its visit then starts over). Memory therefore follows the
///   keys active in the last second or so. A store that
///   receives no calls does not sweep: call [`MemoryStore::purge_idle`] (a whole pass at
///   once), or run [`MemoryStore::sweeper`] on a tokio runtime, which does so periodically.
/// * **Key cap** ([`MemoryStoreBuilder::max_keys`]): when the store holds its maximum of
///   active keys, a request for a *new* key first sweeps every shard for idle keys; if none
///   can be dropped it fails with a [`StoreError`] of kind
///   [`StoreErrorKind::Capacity`]. It is never silently admitted, and keys that already have
///   state keep working.
/// * **Time** comes from the store's [`Clock`]: [`SystemClock`] by default, a
///   [`ManualClock`](paceline_core::ManualClock) for tests and simulations.
///
/// ```
/// use paceline_store::{Limiter, MemoryStore, ManualClock, Policy};
/// use std::sync::Arc;
/// let clock = ManualClock::new(0);
/// let store = Arc::new(MemoryStore::builder().clock(clock.clone()).max_keys(10_000).build());
/// let policy: Policy = "gcra:rate=1/s".parse()?;
/// let limiter = Limiter::with_store(policy, store.clone());
/// assert!(limiter.limit_sync("alice", 1)?.allowed);
/// assert!(!limiter.limit_sync("alice", 1)?.allowed);
/// clock.advance(std::time::Duration::from_secs(1));
/// assert!(limiter.limit_sync("alice", 1)?.allowed);
/// assert_eq!(store.len(), 1);
/// # Ok::<(), paceline_store::Error>(())
/// ```
pub struct MemoryStore {
    /// The key table's shards, each behind a lock whose shared side threads take without
    /// contending, on cache lines of their own.
    shards: Box<[CachePadded<ShardedLock<ShardInner>>]>,
    shard_shift: u32,
    hasher: foldhash::fast::RandomState,
    clock: StoreClock,
    max_keys: Option<usize>,
    keys: AtomicUsize,
    /// The clock time from which calls step a sweep pass: the next pass's start while none
    /// is under way, 0 while one is.
    sweep_due: CachePadded<AtomicU64>,
    sweeper: Mutex<Sweeper>,
}

struct ShardInner {
    table: HashTable<Entry>,
    /// Changed whenever entries may move to other slots (an insert that grows or rehashes
    /// the table, a shrink), so that a pass visiting this shard starts it over.
    layout: u64,
}

/// Where sweeping stands.
struct Sweeper {
    pass: Option<Pass>,
    /// The earliest start of the next pass.
    next_pass: u64,
}

/// A sweep pass under way.
struct Pass {
    /// When the pass began.
    began: u64,
    /// The shard being visited, and its next slot.
    shard: usize,
    slot: usize,
    /// The shard's layout when its visit began; `None` before it began.
    layout: Option<u64>,
}

struct Entry {
    key: StoredKey,
    slot: Slot,
}

/// Keys of up to this many bytes are held inside their entry.
const INLINE_KEY: usize = 15;

/// A key as its entry holds it: short keys inline (no allocation of their own, and no
/// pointer to follow when a lookup compares them), longer ones on the heap. Sixteen bytes:
/// a heap key is marked by a zero in the inline length's place, so that an entry (key and
/// slot) is 32 bytes and two entries share a cache line.
enum StoredKey {
    Inline {
        /// The key's length plus one (never zero).
        len_plus_one: NonZeroU8,
        bytes: [u8; INLINE_KEY],
    },
    /// A thin pointer (eight bytes), where a `Box<str>` would take sixteen.
    Heap(Box<Box<str>>),
}

const _: () = assert!(std::mem::size_of::<Entry>() == 32);

impl StoredKey {
    fn new(key: &str) -> StoredKey {
        if key.len() > INLINE_KEY {
            return StoredKey::Heap(Box::new(key.into()));
        }
        let mut bytes = [0; INLINE_KEY];
        bytes[..key.len()].copy_from_slice(key.as_bytes());
        StoredKey::Inline {
            // At most INLINE_KEY + 1, so the `as u8` is exact.
            len_plus_one: NonZeroU8::MIN.saturating_add(key.len() as u8),
            bytes,
        }
    }

    /// True if this is `key`.
    #[inline]
    fn is(&self, key: &str) -> bool {
        self.as_bytes() == key.as_bytes()
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline {
                len_plus_one,
                bytes,
            } => &bytes[..usize::from(len_plus_one.get() - 1)],
            StoredKey::Heap(heap) => heap.as_bytes(),
        }
    }
}

/// One key's state, two words wide so that many keys stay cache-friendly.
enum Slot {
    /// A `gcra` state: the bits of its TAT (an `f64` of microseconds since the epoch). It is
    /// idle once `TAT <= now`, so it needs no separate expiry.
    Gcra(AtomicU64),
    /// Any other state, behind a lock of its own so that it can be updated under the
    /// shard's shared lock.
    Other(Box<Mutex<OtherSlot>>),
}

struct OtherSlot {
    state: Option<State>,
    /// Idle from this time on (microseconds since the epoch).
    expires_at: u64,
}

impl Slot {
    fn new(state: Option<State>, expires_at: u64) -> Slot {
        match state {
            Some(State::Gcra(g)) => Slot::Gcra(AtomicU64::new(g.tat.to_bits())),
            state => Slot::Other(Box::new(Mutex::new(OtherSlot { state, expires_at }))),
        }
    }

    /// A copy of the state a request at `now` finds (`None`: idle), read under the shard's
    /// exclusive lock.
    fn live_state(&mut self, now: u64) -> Option<State> {
        match self {
            Slot::Gcra(tat) => {
                let tat = f64::from_bits(*tat.get_mut());
                (tat > now as f64).then_some(State::Gcra(gcra::State { tat }))
            }
            Slot::Other(other) => {
                let other = other_mut(other);
                (other.expires_at > now)
                    .then(|| other.state.clone())
                    .flatten()
            }
        }
    }

    fn is_idle(&mut self, now: u64) -> bool {
        match self {
            Slot::Gcra(tat) => f64::from_bits(*tat.get_mut()) <= now as f64,
            Slot::Other(other) => other_mut(other).expires_at <= now,
        }
    }
}

/// An entry's lock. A panic inside it cannot leave the state half-updated (the new state is
/// assigned whole), so a poisoned lock is used as it is.
fn lock(other: &Mutex<OtherSlot>) -> MutexGuard<'_, OtherSlot> {
    other.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An entry's state under the shard's exclusive lock; see [`lock`].
fn other_mut(other: &mut Mutex<OtherSlot>) -> &mut OtherSlot {
    other.get_mut().unwrap_or_else(PoisonError::into_inner)
}

/// Applies a `gcra` request to a TAT cell with compare-and-swap; safe under a shared lock.
#[inline(always)]
fn gcra_cas(policy: &Gcra, cell: &AtomicU64, now: u64, op: Op, cost: u64) -> Decision {
    let mut current = cell.load(Ordering::Acquire);
    loop {
        // Only the arithmetic runs between load and swap; the decision is built after.
        let plan = policy.plan(Some(f64::from_bits(current)), now, op, cost);
        let Some(new_tat) = plan.write else {
            return policy.decision(&plan);
        };
        match cell.compare_exchange_weak(
            current,
            new_tat.to_bits(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return policy.decision(&plan),
            Err(actual) => current = actual,
        }
    }
}

/// The store's clock: the system clock, read without a virtual call on the decision path,
/// or an injected one.
enum StoreClock {
    System(SystemClock),
    Injected(Arc<dyn Clock>),
}

impl StoreClock {
    #[inline]
    fn now(&self) -> u64 {
        match self {
            StoreClock::System(clock) => clock.now_micros(),
            StoreClock::Injected(clock) => clock.now_micros(),
        }
    }
}

/// Configures a [`MemoryStore`].
#[derive(Default)]
#[must_use]
pub struct MemoryStoreBuilder {
    clock: Option<Arc<dyn Clock>>,
    max_keys: Option<usize>,
    shards: Option<usize>,
}

impl MemoryStoreBuilder {
    /// Reads time from `clock` instead of the [`SystemClock`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Reads time from a shared clock.
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Holds at most `max_keys` active keys; a request for a new key beyond that fails with
    /// a [`StoreErrorKind::Capacity`] error (after idle keys have been dropped). The count is
    /// shared by all shards without a common lock, so threads inserting new keys into
    /// different shards at the same instant may overshoot it by at most one key each.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The number of shards (rounded up to a power of two; default: 16 per available core,
    /// at least 64).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let cores = std::thread::available_parallelism().map_or(4, usize::from);
        let default_shards = cores.saturating_mul(16).max(64);
        let count = self
            .shards
            .unwrap_or(default_shards)
            .clamp(1, 1 << 16)
            .next_power_of_two();
        let shards = (0..count)
            .map(|_| {
                CachePadded::new(ShardedLock::new(ShardInner {
                    table: HashTable::new(),
                    layout: 0,
                }))
            })
            .collect();
        MemoryStore {
            shards,
            // One shard: a shift of 64, which `shard_for` maps to shard 0.
            shard_shift: 64 - count.trailing_zeros(),
            hasher: foldhash::fast::RandomState::default(),
            clock: match self.clock {
                Some(clock) => StoreClock::Injected(clock),
                None => StoreClock::System(SystemClock::new()),
            },
            max_keys: self.max_keys,
            keys: AtomicUsize::new(0),
            sweep_due: CachePadded::new(AtomicU64::new(0)),
            sweeper: Mutex::new(Sweeper {
                pass: None,
                next_pass: 0,
            }),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("keys", &self.len())
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

impl MemoryStore {
    /// A store on the [`SystemClock`] with no key cap.
    pub fn new() -> MemoryStore {
        MemoryStore::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// The store's clock.
    pub fn clock(&self) -> &dyn Clock {
        match &self.clock {
            StoreClock::System(clock) => clock,
            StoreClock::Injected(clock) => &**clock,
        }
    }

    /// Keys currently held, including idle ones not yet swept.
    pub fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// True if no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key now, idle or not: every key starts afresh.
    ///
    /// ```
    /// use paceline_store::{MemoryStore, Limiter};
    /// use std::sync::Arc;
    /// let store = Arc::new(MemoryStore::new());
    /// let limiter = Limiter::with_store("gcra:rate=1/h".parse()?, Arc::clone(&store));
    /// assert!(limiter.limit_sync("k", 1)?.allowed);
    /// assert!(!limiter.limit_sync("k", 1)?.allowed);
    /// store.clear();
    /// assert!(store.is_empty());
    /// assert!(limiter.limit_sync("k", 1)?.allowed);
    /// # Ok::<(), paceline_store::Error>(())
    /// ```
    pub fn clear(&self) {
        for index in 0..self.shards.len() {
            let mut inner = self.write(index);
            let dropped = inner.table.len();
            inner.table.clear();
            self.keys.fetch_sub(dropped, Ordering::Relaxed);
        }
    }

    /// Drops every idle key now and shrinks the tables left mostly empty, returning their
    /// memory to the allocator; returns how many keys were dropped.
    ///
    /// This is one whole sweep pass (see [`MemoryStore`]): a store that keeps receiving calls
    /// sweeps itself, but one that receives none after a burst of keys keeps their memory
    /// until this is called (or [`MemoryStore::sweeper`] runs). The pass holds one shard's
    /// exclusive lock at a time, for at most 1,024 slots, so decisions go on meanwhile.
    ///
    /// ```
    /// use paceline_store::{Limiter, ManualClock, MemoryStore};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// let clock = ManualClock::new(0);
    /// let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    /// let limiter = Limiter::with_store("gcra:rate=10/s".parse()?, Arc::clone(&store));
    /// for user in 0..1_000 {
    ///     limiter.limit_sync(&format!("user:{user}"), 1)?;
    /// }
    /// clock.advance(Duration::from_millis(100)); // every key is idle now
    /// assert_eq!(store.purge_idle(), 1_000);
    /// assert!(store.is_empty());
    /// # Ok::<(), paceline_store::Error>(())
    /// ```
    pub fn purge_idle(&self) -> usize {
        let now = self.clock.now();
        let mut sweeper = self.sweeper.lock().unwrap_or_else(PoisonError::into_inner);
        sweeper.pass = Some(Pass::new(now));
        let mut dropped = 0;
        while sweeper.pass.is_some() {
            dropped += self.sweep_slots(&mut sweeper, now);
        }
        dropped
    }

    /// A task that sweeps the store every `period` (see [`MemoryStore::purge_idle`]) for as
    /// long as the store lives, for stores that may receive no calls for a while. Spawn it on
    /// a tokio runtime with the time driver enabled; it holds the store only while sweeping,
    /// and ends once the store is dropped. Each pass yields to the runtime between slices of
    /// 1,024 slots. A `period` under a millisecond counts as a millisecond.
    ///
    /// ```
    /// use paceline_store::MemoryStore;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = Arc::new(MemoryStore::new());
    /// tokio::spawn(store.sweeper(Duration::from_secs(1)));
    /// # }
    /// ```
    pub fn sweeper(
        self: &Arc<Self>,
        period: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let store = Arc::downgrade(self);
        let period = period.max(Duration::from_millis(1));
        async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is at once: sweep a period from now.
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(store) = store.upgrade() else {
                    return;
                };
                let now = store.clock.now();
                let mut begin = true;
                loop {
                    let done = {
                        let mut sweeper =
                            store.sweeper.lock().unwrap_or_else(PoisonError::into_inner);
                        if std::mem::take(&mut begin) {
                            sweeper.pass = Some(Pass::new(now));
                        }
                        store.sweep_slots(&mut sweeper, now);
                        sweeper.pass.is_none()
                    };
                    if done {
                        break;
                    }
                    YieldNow(false).await;
                }
            }
        }
    }

    /// The table slots allocated over all shards, occupied or not: the tables' memory is
    /// 33 bytes a slot (keys over 15 bytes and states other than `gcra`'s take a small
    /// allocation more each). Sweep passes shrink tables left mostly empty.
    pub fn slots(&self) -> usize {
        (0..self.shards.len())
            .map(|index| {
                let inner = self.read(index);
                // A table that never allocated (or was freed) has one slot of static memory.
                if inner.table.allocation_size() == 0 {
                    0
                } else {
                    inner.table.num_buckets()
                }
            })
            .sum()
    }

    /// The shared lock on shard `index`. A decision that panicked left its state whole (see
    /// [`lock`]), so a poisoned lock is used as it is.
    #[inline]
    fn read(&self, index: usize) -> ShardedLockReadGuard<'_, ShardInner> {
        self.shards[index]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The exclusive lock on shard `index` (taken to add or remove keys); see [`Self::read`].
    fn write(&self, index: usize) -> ShardedLockWriteGuard<'_, ShardInner> {
        self.shards[index]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The index of the shard holding keys of this hash: the bits just below the top seven,
    /// which the shard's table uses as its keys' tags (were the shard chosen by the same
    /// bits, every key of a shard would share a tag and each lookup would compare keys with
    /// every entry it probes). Tables pick buckets by the low bits.
    fn shard_for(&self, hash: u64) -> usize {
        (hash << 7).checked_shr(self.shard_shift).unwrap_or(0) as usize
    }

    /// Drops the keys of one shard that are idle at `now` (for the key cap).
    fn sweep(&self, inner: &mut ShardInner, now: u64) -> usize {
        let before = inner.table.len();
        inner.table.retain(|e| !e.slot.is_idle(now));
        let dropped = before - inner.table.len();
        self.keys.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// A call's share of sweeping: one step of the pass under way, or of a new one if it is
    /// due, unless another thread is sweeping.
    #[inline(always)]
    fn sweep_if_due(&self, now: u64) {
        if now >= self.sweep_due.load(Ordering::Relaxed) {
            self.sweep_step(now);
        }
    }

    /// [`Self::sweep_if_due`]'s work, out of the decision's way.
    #[cold]
    #[inline(never)]
    fn sweep_step(&self, now: u64) {
        let mut sweeper = match self.sweeper.try_lock() {
            Ok(sweeper) => sweeper,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if sweeper.pass.is_none() {
            if now < sweeper.next_pass {
                // Another thread finished a pass since the check above.
                return;
            }
            sweeper.pass = Some(Pass::new(now));
            self.sweep_due.store(0, Ordering::Relaxed);
        }
        self.sweep_slots(&mut sweeper, now);
    }

    /// Visits up to [`SWEEP_STEP_SLOTS`] slots and finishes up to [`SWEEP_STEP_SHARDS`]
    /// shards of the pass under way (if any), dropping the
    /// keys idle at `now`; shrinks each shard's table after its visit, and ends the pass
    /// after the last shard's. Returns the number of keys dropped.
    fn sweep_slots(&self, sweeper: &mut Sweeper, now: u64) -> usize {
        let Some(pass) = sweeper.pass.as_mut() else {
            return 0;
        };
        let (mut budget, mut shards) = (SWEEP_STEP_SLOTS, SWEEP_STEP_SHARDS);
        let mut dropped = 0;
        while budget > 0 && shards > 0 && pass.shard < self.shards.len() {
            let mut inner = self.write(pass.shard);
            if pass.layout != Some(inner.layout) {
                // A new visit, or entries moved since the last slice: start the shard over.
                pass.layout = Some(inner.layout);
                pass.slot = 0;
            }
            let slots = inner.table.num_buckets();
            let start = pass.slot.min(slots);
            let end = slots.min(start.saturating_add(budget));
            for slot in start..end {
                if let Ok(mut entry) = inner.table.get_bucket_entry(slot) {
                    if entry.get_mut().slot.is_idle(now) {
                        entry.remove();
                        dropped += 1;
                    }
                }
            }
            budget -= end - start;
            pass.slot = end;
            if end == slots {
                self.shrink(&mut inner);
                shards -= 1;
                pass.shard += 1;
                pass.layout = None;
            }
        }
        self.keys.fetch_sub(dropped, Ordering::Relaxed);
        if pass.shard == self.shards.len() {
            sweeper.next_pass = pass.began.saturating_add(SWEEP_PERIOD_US);
            sweeper.pass = None;
            self.sweep_due.store(sweeper.next_pass, Ordering::Relaxed);
        }
        dropped
    }

    /// Shrinks a table left less than a quarter full to twice its keys (frees one left
    /// empty), so that its memory goes back to the allocator. Its cost, proportional to the
    /// keys left, is paid once at least three times as many keys have gone.
    fn shrink(&self, inner: &mut ShardInner) {
        let (len, slots) = (inner.table.len(), inner.table.num_buckets());
        if len < slots / 4 {
            inner
                .table
                .shrink_to(len * 2, |e| self.hasher.hash_one(e.key.as_bytes()));
            if inner.table.num_buckets() != slots {
                inner.layout = inner.layout.wrapping_add(1);
            }
        }
    }

    fn full(&self) -> bool {
        self.max_keys.is_some_and(|max| self.len() >= max)
    }

    fn decide_now(&self, policy: &Policy, key: &str, op: Op, cost: u64) -> Result<Decision, Error> {
        policy.check_cost(op, cost)?;
        let now = self.clock.now();
        // Checked once here for every path (the gcra fast path included); below, policies
        // apply validated requests.
        paceline_core::policy::check_now(now)?;
        // Before the decision, while this thread holds no shard lock.
        self.sweep_if_due(now);
        let hash = self.hasher.hash_one(key.as_bytes());
        let shard = self.shard_for(hash);
        {
            // The fast path: an existing key, under the shared lock.
            let inner = self.read(shard);
            if let Some(entry) = inner.table.find(hash, |e| e.key.is(key)) {
                if let Some(decision) = apply_shared(policy, &entry.slot, now, op, cost) {
                    return Ok(decision);
                }
            }
        }
        {
            let mut inner = self.write(shard);
            if let Some(entry) = inner.table.find_mut(hash, |e| e.key.is(key)) {
                return Ok(apply_to_slot(policy, &mut entry.slot, now, op, cost));
            }
            if self.full() {
                // Full: try this shard's idle keys first.
                self.sweep(&mut inner, now);
            }
            if !self.full() {
                return self.insert(&mut inner, policy, hash, key, now, op, cost);
            }
        }
        // Still full: sweep every shard (each under its own lock, one at a time).
        self.purge_idle();
        let mut inner = self.write(shard);
        if let Some(entry) = inner.table.find_mut(hash, |e| e.key.is(key)) {
            return Ok(apply_to_slot(policy, &mut entry.slot, now, op, cost));
        }
        if self.full() && op != Op::Peek {
            return Err(self.capacity_error());
        }
        self.insert(&mut inner, policy, hash, key, now, op, cost)
    }

    /// Decides for a key with no entry, inserting one if the decision leaves state.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        inner: &mut ShardInner,
        policy: &Policy,
        hash: u64,
        key: &str,
        now: u64,
        op: Op,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.insert_with(inner, hash, key, now, |state| {
            policy.apply_validated(state, now, op, cost)
        })
    }

    /// Runs `decide` on a new key's state (`None`), and inserts the key if it wrote one.
    fn insert_with(
        &self,
        inner: &mut ShardInner,
        hash: u64,
        key: &str,
        now: u64,
        decide: impl FnOnce(&mut Option<State>) -> Decision,
    ) -> Result<Decision, Error> {
        let mut state = None;
        let decision = decide(&mut state);
        if let Some(state) = state {
            if inner.table.len() == inner.table.capacity() {
                // No room left: this insert grows or rehashes the table, moving entries.
                inner.layout = inner.layout.wrapping_add(1);
            }
            inner.table.insert_unique(
                hash,
                Entry {
                    key: StoredKey::new(key),
                    slot: Slot::new(Some(state), expiry(now, decision.reset_after)),
                },
                |e| self.hasher.hash_one(e.key.as_bytes()),
            );
            self.keys.fetch_add(1, Ordering::Relaxed);
        }
        Ok(decision)
    }

    /// Decides a set of limits as one (see [`Store::decide_all`]): every shard holding one
    /// of its keys is locked exclusively, in ascending order (so two sets never wait for
    /// each other in a cycle, and single decisions, which take one lock at a time, never
    /// wait on a set for long), the set is decided on copies of the keys' states, and only
    /// if every limit admits are the requests applied to the keys themselves, giving the
    /// same decisions.
    fn decide_all_now(&self, requests: &[Request<'_>]) -> Result<SetDecision, Error> {
        check_set(requests)?;
        if let [r] = requests {
            let decision = self.decide_now(r.policy, r.key, r.op, r.cost)?;
            return Ok(SetDecision::new(decision.allowed, vec![decision]));
        }
        match self.decide_set(requests) {
            // Full: sweep every shard (holding none of their locks), then try once more.
            Err(Error::Store(e)) if e.kind() == StoreErrorKind::Capacity => {
                self.purge_idle();
                self.decide_set(requests)
            }
            outcome => outcome,
        }
    }

    /// [`Self::decide_all_now`] for a checked set of several; a capacity error when its new
    /// keys do not fit under the key cap after sweeping the shards it locked.
    fn decide_set(&self, requests: &[Request<'_>]) -> Result<SetDecision, Error> {
        let now = self.clock.now();
        paceline_core::policy::check_now(now)?;
        self.sweep_if_due(now);
        let places: Vec<(u64, usize)> = requests
            .iter()
            .map(|r| {
                let hash = self.hasher.hash_one(r.key.as_bytes());
                (hash, self.shard_for(hash))
            })
            .collect();
        let mut shards: Vec<usize> = places.iter().map(|&(_, shard)| shard).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut guards: Vec<ShardedLockWriteGuard<'_, ShardInner>> =
            shards.iter().map(|&shard| self.write(shard)).collect();
        let held = |shard: usize| shards.binary_search(&shard).unwrap_or(0);
        // On copies: what each limit answers, and how many keys are new.
        let mut missing = 0;
        let trial =
            |op: Op, guards: &mut [ShardedLockWriteGuard<'_, ShardInner>], missing: &mut usize| {
                requests
                    .iter()
                    .zip(&places)
                    .map(|(r, &(hash, shard))| {
                        let inner = &mut guards[held(shard)];
                        let mut state = match inner.table.find_mut(hash, |e| e.key.is(r.key)) {
                            Some(entry) => entry.slot.live_state(now),
                            None => {
                                *missing += 1;
                                None
                            }
                        };
                        r.policy.apply_validated(&mut state, now, op, r.cost)
                    })
                    .collect::<Vec<Decision>>()
            };
        let op = requests[0].op;
        if let Op::Pace { max_wait } = op {
            // The states as read, then the time every limit admits, on copies.
            let states: Vec<Option<State>> = requests
                .iter()
                .zip(&places)
                .map(|(r, &(hash, shard))| {
                    let inner = &mut guards[held(shard)];
                    match inner.table.find_mut(hash, |e| e.key.is(r.key)) {
                        Some(entry) => entry.slot.live_state(now),
                        None => {
                            missing += 1;
                            None
                        }
                    }
                })
                .collect();
            let meeting = meeting(requests, &states, now)?;
            let max_us = max_wait.map(paceline_core::duration_to_micros);
            if let Some(retry) = pace_refusal(&meeting, now, max_us) {
                // Refused, nothing written: each limit's own answer alone.
                let own = requests
                    .iter()
                    .zip(states)
                    .map(|(r, mut state)| r.policy.apply_validated(&mut state, now, op, r.cost))
                    .collect();
                return Ok(refused_pace(meeting, own, retry));
            }
            self.make_room(&mut guards, missing, now)?;
            // Admitted: every limit books the slot on its key itself.
            let slot = meeting.slot;
            let mut booked = Vec::with_capacity(requests.len());
            let mut failed = None;
            for (r, &(hash, shard)) in requests.iter().zip(&places) {
                let inner = &mut guards[held(shard)];
                let mut book = |state: &mut Option<State>| {
                    r.policy
                        .pace_from(state, now, r.cost, slot)
                        .unwrap_or_else(|e| {
                            // Not reached: `meeting` booked the same on a copy.
                            failed = Some(e);
                            Decision::from_micros(false, 0.0, 0, 0.0, 0)
                        })
                };
                let decision = match inner.table.find_mut(hash, |e| e.key.is(r.key)) {
                    Some(entry) => update_slot(r.policy, &mut entry.slot, now, &mut book),
                    None => self.insert_with(inner, hash, r.key, now, &mut book)?,
                };
                booked.push(decision);
            }
            if let Some(e) = failed {
                return Err(e.into());
            }
            return Ok(SetDecision::new(true, booked));
        }
        let decisions = trial(op, &mut guards, &mut missing);
        let admitted = decisions.iter().all(|d| d.allowed);
        if op == Op::Peek {
            return Ok(SetDecision::new(admitted, decisions));
        }
        if !admitted {
            // Refused: nothing changes; each limit's answer as of now.
            let peeks = trial(Op::Peek, &mut guards, &mut 0);
            return Ok(SetDecision::new(false, peeks));
        }
        self.make_room(&mut guards, missing, now)?;
        // Admitted: the same requests on the keys themselves.
        let mut applied = Vec::with_capacity(requests.len());
        for (r, &(hash, shard)) in requests.iter().zip(&places) {
            let inner = &mut guards[held(shard)];
            let decision = match inner.table.find_mut(hash, |e| e.key.is(r.key)) {
                Some(entry) => apply_to_slot(r.policy, &mut entry.slot, now, r.op, r.cost),
                None => self.insert(inner, r.policy, hash, r.key, now, r.op, r.cost)?,
            };
            applied.push(decision);
        }
        Ok(SetDecision::new(true, applied))
    }

    /// Checks that `missing` new keys fit under the key cap, sweeping the locked shards
    /// first if they would not: a capacity error if they still do not.
    fn make_room(
        &self,
        guards: &mut [ShardedLockWriteGuard<'_, ShardInner>],
        missing: usize,
        now: u64,
    ) -> Result<(), Error> {
        if let Some(max) = self.max_keys {
            if missing > 0 && self.len() + missing > max {
                for inner in guards.iter_mut() {
                    self.sweep(inner, now);
                }
                if self.len() + missing > max {
                    return Err(self.capacity_error());
                }
            }
        }
        Ok(())
    }

    /// Releases (`extend`: false) or extends lease `id` of `key` under `policy` (see
    /// [`Store::release`], [`Store::extend`]): whether the lease was live. An extension
    /// keeps the key at least until the renewed lease expires.
    fn lease_now(&self, policy: &Policy, key: &str, id: u64, extend: bool) -> Result<bool, Error> {
        policy.concurrency()?;
        let now = self.clock.now();
        paceline_core::policy::check_now(now)?;
        self.sweep_if_due(now);
        let hash = self.hasher.hash_one(key.as_bytes());
        let inner = self.read(self.shard_for(hash));
        let Some(Entry {
            slot: Slot::Other(other),
            ..
        }) = inner.table.find(hash, |e| e.key.is(key))
        else {
            return Ok(false);
        };
        let mut other = lock(other);
        if other.expires_at <= now {
            return Ok(false);
        }
        if !extend {
            return Ok(policy.release(&mut other.state, now, id)?);
        }
        match policy.extend(&mut other.state, now, id)? {
            Some(expires) => {
                other.expires_at = other.expires_at.max(expires);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    #[cold]
    fn capacity_error(&self) -> Error {
        StoreError::new(
            StoreErrorKind::Capacity,
            format!(
                "the memory store holds its maximum of {} active keys and none is idle; \
                 raise `max_keys` or use fewer keys",
                self.max_keys.unwrap_or_default()
            ),
        )
        .into()
    }

    fn reset_now(&self, key: &str) {
        let hash = self.hasher.hash_one(key.as_bytes());
        {
            let mut inner = self.write(self.shard_for(hash));
            if let Ok(entry) = inner.table.find_entry(hash, |e| e.key.is(key)) {
                entry.remove();
                self.keys.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.sweep_if_due(self.clock.now());
    }
}

impl Pass {
    fn new(began: u64) -> Pass {
        Pass {
            began,
            shard: 0,
            slot: 0,
            layout: None,
        }
    }
}

/// Returns `Pending` once (waking its task at once), so that a long sweep lets the
/// runtime's other tasks run between slices.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Applies a request to an existing key's slot under the shard's shared lock: a `gcra`
/// policy on a `gcra` slot, any other on any other slot. `None` when the request may change
/// the slot's kind, which takes the exclusive lock ([`apply_to_slot`]).
#[inline(always)]
fn apply_shared(policy: &Policy, slot: &Slot, now: u64, op: Op, cost: u64) -> Option<Decision> {
    match (slot, policy) {
        (Slot::Gcra(tat), Policy::Gcra(gcra)) => Some(gcra_cas(gcra, tat, now, op, cost)),
        (Slot::Other(other), policy) if !matches!(policy, Policy::Gcra(_)) => {
            Some(apply_to_other(policy, &mut lock(other), now, op, cost))
        }
        _ => None,
    }
}

/// Applies a request to an existing key's slot under the exclusive lock, changing the slot's
/// kind where the new state calls for it.
fn apply_to_slot(policy: &Policy, slot: &mut Slot, now: u64, op: Op, cost: u64) -> Decision {
    if let (Slot::Gcra(tat), Policy::Gcra(gcra)) = (&*slot, policy) {
        return gcra_cas(gcra, tat, now, op, cost);
    }
    update_slot(policy, slot, now, |state| {
        policy.apply_validated(state, now, op, cost)
    })
}

/// Runs `decide` (a transition of `policy`) on an existing key's live state under the
/// exclusive lock, changing the slot's kind where the new state calls for it.
fn update_slot(
    policy: &Policy,
    slot: &mut Slot,
    now: u64,
    decide: impl FnOnce(&mut Option<State>) -> Decision,
) -> Decision {
    match slot {
        Slot::Gcra(tat) => {
            // Decide on a copy, replace only on a write of the policy's own state (which
            // leaves it where the gcra state was).
            let tat = f64::from_bits(*tat.get_mut());
            let mut state = (tat > now as f64).then_some(State::Gcra(gcra::State { tat }));
            let decision = decide(&mut state);
            if state.as_ref().is_some_and(|s| policy.owns(s)) {
                *slot = Slot::new(state, expiry(now, decision.reset_after));
            }
            decision
        }
        Slot::Other(other) => {
            let other = other_mut(other);
            let decision = update_other(policy, other, now, decide);
            if matches!(other.state, Some(State::Gcra(_))) {
                let (state, expires_at) = (other.state.take(), other.expires_at);
                *slot = Slot::new(state, expires_at);
            }
            decision
        }
    }
}

/// Applies a request to a non-`gcra` slot's state, treating an idle state as none.
#[inline]
fn apply_to_other(policy: &Policy, other: &mut OtherSlot, now: u64, op: Op, cost: u64) -> Decision {
    update_other(policy, other, now, |state| {
        policy.apply_validated(state, now, op, cost)
    })
}

/// Runs `decide` (a transition of `policy`) on a non-`gcra` slot's state, treating an idle
/// state as none.
#[inline]
fn update_other(
    policy: &Policy,
    other: &mut OtherSlot,
    now: u64,
    decide: impl FnOnce(&mut Option<State>) -> Decision,
) -> Decision {
    if other.expires_at <= now {
        other.state = None;
    }
    let foreign = other.state.as_ref().is_some_and(|s| !policy.owns(s));
    let decision = decide(&mut other.state);
    match &other.state {
        // A state of another algorithm that this request did not replace keeps its expiry.
        Some(s) if foreign && !policy.owns(s) => {}
        // A state replacing another algorithm's: an expiry of its own.
        Some(_) if foreign => other.expires_at = expiry(now, decision.reset_after),
        // Never earlier than before: a peek, a rejection or a policy with a shorter window
        // must not shorten the life of the state another write made.
        Some(_) => other.expires_at = other.expires_at.max(expiry(now, decision.reset_after)),
        // Idle: expired at once; the next sweep drops the entry.
        None => other.expires_at = now,
    }
    decision
}

/// The first microsecond at which a state with `reset_after` left is idle.
#[inline]
fn expiry(now: u64, reset_after: Duration) -> u64 {
    // Whole microseconds, rounded up, without 128-bit division.
    let us = reset_after
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(reset_after.subsec_nanos().div_ceil(1_000)));
    now.saturating_add(us)
}

impl Store for MemoryStore {
    fn decide<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        op: Op,
        cost: u64,
    ) -> StoreFuture<'a, Result<Decision, Error>> {
        StoreFuture::ready(self.decide_now(policy, key, op, cost))
    }

    fn decide_batch<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Vec<Result<Decision, Error>>> {
        StoreFuture::ready(
            requests
                .iter()
                .map(|r| self.decide_now(r.policy, r.key, r.op, r.cost))
                .collect(),
        )
    }

    fn decide_all<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> StoreFuture<'a, Result<SetDecision, Error>> {
        StoreFuture::ready(self.decide_all_now(requests))
    }

    fn release<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<bool, Error>> {
        StoreFuture::ready(self.release_sync(policy, key, lease))
    }

    fn extend<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        lease: u64,
    ) -> StoreFuture<'a, Result<Option<Duration>, Error>> {
        StoreFuture::ready(self.extend_sync(policy, key, lease))
    }

    fn reset<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<(), Error>> {
        self.reset_now(key);
        StoreFuture::ready(Ok(()))
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.clock().sleep(duration)
    }

    fn as_sync(&self) -> Option<&dyn SyncStore> {
        Some(self)
    }

    fn time_source(&self) -> Option<Arc<dyn Clock>> {
        Some(match &self.clock {
            StoreClock::System(clock) => Arc::new(clock.clone()),
            StoreClock::Injected(clock) => Arc::clone(clock),
        })
    }
}

impl SyncStore for MemoryStore {
    #[inline]
    fn decide_sync(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.decide_now(policy, key, op, cost)
    }

    fn decide_all_sync(&self, requests: &[Request<'_>]) -> Result<SetDecision, Error> {
        self.decide_all_now(requests)
    }

    fn release_sync(&self, policy: &Policy, key: &str, lease: u64) -> Result<bool, Error> {
        self.lease_now(policy, key, lease, false)
    }

    fn extend_sync(
        &self,
        policy: &Policy,
        key: &str,
        lease: u64,
    ) -> Result<Option<Duration>, Error> {
        let live = self.lease_now(policy, key, lease, true)?;
        Ok(live.then(|| policy.concurrency().map(|c| c.lease()).unwrap_or_default()))
    }

    fn reset_sync(&self, key: &str) -> Result<(), Error> {
        self.reset_now(key);
        Ok(())
    }
}
