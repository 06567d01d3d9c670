//! Sets of limits decided as one by the memory store ([`Store::decide_all`]): the shards of
//! every key locked at once, the set decided on copies, written only if every limit admits.

use std::hash::BuildHasher;

use crossbeam_utils::sync::ShardedLockWriteGuard;
use paceline_core::{Decision, Error, Op, State, StoreErrorKind};

use super::table::{apply_to_slot, update_slot, ShardInner};
use super::MemoryStore;
use crate::set::{check_set, meeting, pace_refusal, refused_pace};
#[cfg(doc)]
use crate::Store;
use crate::{Request, SetDecision};

impl MemoryStore {
    /// Decides a set of limits as one (see [`Store::decide_all`]): every shard holding one
    /// of its keys is locked exclusively, in ascending order (so two sets never wait for
    /// each other in a cycle, and single decisions, which take one lock at a time, never
    /// wait on a set for long), the set is decided on copies of the keys' states, and only
    /// if every limit admits are the requests applied to the keys themselves, giving the
    /// same decisions.
    pub(super) fn decide_all_now(&self, requests: &[Request<'_>]) -> Result<SetDecision, Error> {
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
}
