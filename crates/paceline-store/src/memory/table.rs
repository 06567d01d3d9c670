//! The memory store's key table: a shard's entries, each a key and its state's slot, and
//! how a request updates a slot (under the shard's shared lock when it can, under its
//! exclusive lock when the slot's kind may change).

use std::num::NonZeroU8;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hashbrown::HashTable;
use paceline_core::policy::{gcra, Gcra};
use paceline_core::{Decision, Op, Policy, State};

pub(super) struct ShardInner {
    pub(super) table: HashTable<Entry>,
    /// Changed whenever entries may move to other slots (an insert that grows or rehashes
    /// the table, a shrink), so that a pass visiting this shard starts it over.
    pub(super) layout: u64,
}

pub(super) struct Entry {
    pub(super) key: StoredKey,
    pub(super) slot: Slot,
}

/// Keys of up to this many bytes are held inside their entry.
const INLINE_KEY: usize = 15;

/// A key as its entry holds it: short keys inline (no allocation of their own, and no
/// pointer to follow when a lookup compares them), longer ones on the heap. Sixteen bytes:
/// a heap key is marked by a zero in the inline length's place, so that an entry (key and
/// slot) is 32 bytes and two entries share a cache line.
pub(super) enum StoredKey {
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
    pub(super) fn new(key: &str) -> StoredKey {
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
    pub(super) fn is(&self, key: &str) -> bool {
        self.as_bytes() == key.as_bytes()
    }

    #[inline]
    pub(super) fn as_bytes(&self) -> &[u8] {
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
pub(super) enum Slot {
    /// A `gcra` state: the bits of its TAT (an `f64` of microseconds since the epoch). It is
    /// idle once `TAT <= now`, so it needs no separate expiry.
    Gcra(AtomicU64),
    /// Any other state, behind a lock of its own so that it can be updated under the
    /// shard's shared lock.
    Other(Box<Mutex<OtherSlot>>),
}

pub(super) struct OtherSlot {
    pub(super) state: Option<State>,
    /// Idle from this time on (microseconds since the epoch).
    pub(super) expires_at: u64,
}

impl Slot {
    pub(super) fn new(state: Option<State>, expires_at: u64) -> Slot {
        match state {
            Some(State::Gcra(g)) => Slot::Gcra(AtomicU64::new(g.tat.to_bits())),
            state => Slot::Other(Box::new(Mutex::new(OtherSlot { state, expires_at }))),
        }
    }

    /// A copy of the state a request at `now` finds (`None`: idle), read under the shard's
    /// exclusive lock.
    pub(super) fn live_state(&mut self, now: u64) -> Option<State> {
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

    pub(super) fn is_idle(&mut self, now: u64) -> bool {
        match self {
            Slot::Gcra(tat) => f64::from_bits(*tat.get_mut()) <= now as f64,
            Slot::Other(other) => other_mut(other).expires_at <= now,
        }
    }
}

/// An entry's lock. A panic inside it cannot leave the state half-updated (the new state is
/// assigned whole), so a poisoned lock is used as it is.
pub(super) fn lock(other: &Mutex<OtherSlot>) -> MutexGuard<'_, OtherSlot> {
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

/// Applies a request to an existing key's slot under the shard's shared lock: a `gcra`
/// policy on a `gcra` slot, any other on any other slot. `None` when the request may change
/// the slot's kind, which takes the exclusive lock ([`apply_to_slot`]).
#[inline(always)]
pub(super) fn apply_shared(
    policy: &Policy,
    slot: &Slot,
    now: u64,
    op: Op,
    cost: u64,
) -> Option<Decision> {
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
pub(super) fn apply_to_slot(
    policy: &Policy,
    slot: &mut Slot,
    now: u64,
    op: Op,
    cost: u64,
) -> Decision {
    if let (Slot::Gcra(tat), Policy::Gcra(gcra)) = (&*slot, policy) {
        return gcra_cas(gcra, tat, now, op, cost);
    }
    update_slot(policy, slot, now, |state| {
        policy.apply_validated(state, now, op, cost)
    })
}

/// Runs `decide` (a transition of `policy`) on an existing key's live state under the
/// exclusive lock, changing the slot's kind where the new state calls for it.
pub(super) fn update_slot(
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
pub(super) fn expiry(now: u64, reset_after: Duration) -> u64 {
    // Whole microseconds, rounded up, without 128-bit division.
    let us = reset_after
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(reset_after.subsec_nanos().div_ceil(1_000)));
    now.saturating_add(us)
}
