//! The in-process store: sharded, bounded, safe for any number of threads and tasks.
//!
//! The store itself, its builder and its single decisions are here; the key table (entries,
//! slots and how a request updates one) is in `table`, sweeping idle keys in `sweeper`, sets
//! of limits decided as one in `set_decision`, and the [`Store`] and [`SyncStore`] impls in
//! `traits`.

mod set_decision;
mod sweeper;
mod table;
mod traits;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use paceline_core::{Clock, Decision, Error, Op, Policy, State, StoreError, StoreErrorKind};

use crate::SystemClock;
#[cfg(doc)]
use crate::{Store, SyncStore};
use sweeper::Sweeper;
use table::{apply_shared, apply_to_slot, expiry, lock, Entry, ShardInner, Slot, StoredKey};

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
