//! Sweeping the memory store: passes over every shard that drop idle keys and shrink the
//! tables left mostly empty, paid for a slice at a time by the calls (see [`MemoryStore`]),
//! or run whole by [`MemoryStore::purge_idle`] and [`MemoryStore::sweeper`].

use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, TryLockError};
use std::task::{Context, Poll};
use std::time::Duration;

use super::table::ShardInner;
use super::MemoryStore;

/// A sweep pass over every shard begins at most this often (microseconds of the store's
/// clock), on the first call after the previous one began this long ago and has finished.
const SWEEP_PERIOD_US: u64 = 1_000_000;

/// While a pass is under way, each call visits at most this many table slots.
const SWEEP_STEP_SLOTS: usize = 1_024;

/// While a pass is under way, each call finishes at most this many shards' visits (taking a
/// lock is not free, even on an empty shard).
const SWEEP_STEP_SHARDS: usize = 16;

/// Where sweeping stands.
pub(super) struct Sweeper {
    pub(super) pass: Option<Pass>,
    /// The earliest start of the next pass.
    pub(super) next_pass: u64,
}

/// A sweep pass under way.
pub(super) struct Pass {
    /// When the pass began.
    began: u64,
    /// The shard being visited, and its next slot.
    shard: usize,
    slot: usize,
    /// The shard's layout when its visit began; `None` before it began.
    layout: Option<u64>,
}

impl MemoryStore {
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

    /// Drops the keys of one shard that are idle at `now` (for the key cap).
    pub(super) fn sweep(&self, inner: &mut ShardInner, now: u64) -> usize {
        let before = inner.table.len();
        inner.table.retain(|e| !e.slot.is_idle(now));
        let dropped = before - inner.table.len();
        self.keys.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// A call's share of sweeping: one step of the pass under way, or of a new one if it is
    /// due, unless another thread is sweeping.
    #[inline(always)]
    pub(super) fn sweep_if_due(&self, now: u64) {
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
