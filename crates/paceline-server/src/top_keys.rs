//! The keys refused most, for the dashboard: a bounded Space-Saving sketch (Metwally,
//! Agrawal and El Abbadi, 2005), never a map of every key.
//!
//! Each of [`SHARDS`] shards (a key goes to one, by hash) keeps at most [`PER_SHARD`]
//! counters. A refusal of a key that has a counter adds one to it; of a key that has none,
//! takes a free counter, or else the smallest one, whose key it replaces, starting from that
//! counter's count plus one (the replaced count is remembered as the new key's `overcount`).
//! So memory is bounded whatever the traffic (at most `SHARDS × PER_SHARD` keys of at most
//! [`crate::MAX_KEY`] bytes), a counter never under-counts its key, over-counts it by at most
//! its `overcount`, and every key refused more than `n / PER_SHARD` times out of its
//! shard's `n` refusals has a counter. A refusal whose shard is busy is not counted (the
//! sketch samples under contention rather than make a refusal wait).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, TryLockError};

/// Shards, each behind its own lock, so that threads refusing different keys rarely wait.
pub(crate) const SHARDS: usize = 8;
/// Counters per shard.
pub(crate) const PER_SHARD: usize = 32;

/// One counted key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Counted {
    /// The policy's name (as in responses: configured, or `inline`).
    pub(crate) policy: String,
    pub(crate) key: String,
    /// Refusals counted, at least the key's true number since it got its counter.
    pub(crate) refusals: u64,
    /// How much of `refusals` may belong to keys it replaced.
    pub(crate) overcount: u64,
}

/// The sketch; see the module's documentation.
pub(crate) struct RefusedKeys {
    shards: Box<[Mutex<Vec<Counted>>]>,
    hasher: std::hash::RandomState,
    /// Refusals not counted because their shard was busy: a refusal never waits for the
    /// sketch (a flood of one key, refused on every thread, would queue on its shard), so
    /// under contention the sketch samples.
    skipped: AtomicU64,
}

impl RefusedKeys {
    pub(crate) fn new() -> RefusedKeys {
        RefusedKeys {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Vec::with_capacity(PER_SHARD)))
                .collect(),
            hasher: std::hash::RandomState::new(),
            skipped: AtomicU64::new(0),
        }
    }

    /// Refusals left out because their shard was busy.
    pub(crate) fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Counts one refusal of `key` under `policy`.
    pub(crate) fn refused(&self, policy: &str, key: &str) {
        let shard = (self.hasher.hash_one((policy, key)) % SHARDS as u64) as usize;
        let mut counters = match self.shards[shard].try_lock() {
            Ok(counters) => counters,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        if let Some(c) = counters
            .iter_mut()
            .find(|c| c.key == key && c.policy == policy)
        {
            c.refusals += 1;
            return;
        }
        if counters.len() < PER_SHARD {
            counters.push(Counted {
                policy: policy.to_string(),
                key: key.to_string(),
                refusals: 1,
                overcount: 0,
            });
            return;
        }
        if let Some(smallest) = counters.iter_mut().min_by_key(|c| c.refusals) {
            // The evicted counter's strings are reused: no allocation once they are long
            // enough.
            let floor = smallest.refusals;
            smallest.policy.clear();
            smallest.policy.push_str(policy);
            smallest.key.clear();
            smallest.key.push_str(key);
            smallest.refusals = floor + 1;
            smallest.overcount = floor;
        }
    }

    /// The `n` keys with the most refusals certainly theirs (`refusals - overcount`: a scan
    /// of distinct keys, each inheriting an evicted count, does not crowd out the keys
    /// really refused), most first; ties by the count, then policy, then key.
    pub(crate) fn top(&self, n: usize) -> Vec<Counted> {
        let mut all: Vec<Counted> = self
            .shards
            .iter()
            .flat_map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .collect();
        all.sort_by(|a, b| {
            b.refusals
                .saturating_sub(b.overcount)
                .cmp(&a.refusals.saturating_sub(a.overcount))
                .then_with(|| b.refusals.cmp(&a.refusals))
                .then_with(|| a.policy.cmp(&b.policy))
                .then_with(|| a.key.cmp(&b.key))
        });
        all.truncate(n);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_keys_are_counted_exactly() {
        let sketch = RefusedKeys::new();
        for _ in 0..5 {
            sketch.refused("api", "alice");
        }
        sketch.refused("api", "bob");
        sketch.refused("other", "alice");
        let top = sketch.top(10);
        let seen: Vec<(&str, &str, u64, u64)> = top
            .iter()
            .map(|c| (c.policy.as_str(), c.key.as_str(), c.refusals, c.overcount))
            .collect();
        assert_eq!(
            seen,
            [
                ("api", "alice", 5, 0),
                ("api", "bob", 1, 0),
                ("other", "alice", 1, 0)
            ]
        );
        assert_eq!(sketch.top(1).len(), 1);
    }

    #[test]
    fn a_flood_of_distinct_keys_stays_bounded_and_keeps_the_heavy_ones() {
        let sketch = RefusedKeys::new();
        // 100,000 refusals of distinct keys, and two heavy hitters among them.
        for i in 0..100_000u32 {
            sketch.refused("api", &format!("scan-{i}"));
            if i % 10 == 0 {
                sketch.refused("api", "heavy-1");
            }
            if i % 25 == 0 {
                sketch.refused("api", "heavy-2");
            }
        }
        let all = sketch.top(usize::MAX);
        assert!(all.len() <= SHARDS * PER_SHARD, "{} counters", all.len());
        let heavy: Vec<&Counted> = all.iter().filter(|c| c.key.starts_with("heavy")).collect();
        assert_eq!(heavy.len(), 2, "both heavy hitters have a counter");
        for c in heavy {
            let truth = if c.key == "heavy-1" { 10_000 } else { 4_000 };
            // Never under-counted; over-counted by at most the overcount.
            assert!(
                c.refusals >= truth && c.refusals - c.overcount <= truth,
                "{c:?}"
            );
        }
        let top = sketch.top(2);
        assert_eq!(top[0].key, "heavy-1");
        assert_eq!(top[1].key, "heavy-2", "the scan's one-off keys rank below");
        assert_eq!(sketch.skipped(), 0, "one thread never finds its shard busy");
    }
}
