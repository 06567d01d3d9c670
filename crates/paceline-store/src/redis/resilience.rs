//! Resilience: what a decision answers when Redis fails. The [`FailurePolicy`] chosen for
//! the store, a failure backoff per node group (every key on a single server, a slot in
//! a cluster) during which calls answer by that policy at once instead of trying Redis,
//! and the nodes' [outages](super::outage), logged as they begin and end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use paceline_core::{Decision, Error, Fallback, StoreError, StoreErrorKind};

use super::outage::{Outage, Outages};
use super::routing::Router;
use crate::{FailurePolicy, MemoryStore, Request, SetDecision, SyncStore};

pub(crate) struct Resilience {
    failure: FailurePolicy,
    /// The stand-in for [`FailurePolicy::Local`].
    local: Option<MemoryStore>,
    backoff: Duration,
    /// Per node group: microseconds after `started` before which Redis is not tried again
    /// for those keys.
    down_until: Box<[AtomicU64]>,
    /// The nodes failing now; the `local` stand-in starts afresh when a first one fails.
    outages: Outages,
    /// The failure that started the current backoff, quoted by calls that skip Redis.
    last_failure: Mutex<Option<StoreError>>,
    started: Instant,
}

impl Resilience {
    /// `groups` node groups; `local` is the in-process stand-in (for
    /// [`FailurePolicy::Local`] only).
    pub(crate) fn new(
        failure: FailurePolicy,
        local: Option<MemoryStore>,
        backoff: Duration,
        groups: usize,
    ) -> Resilience {
        Resilience {
            failure,
            local,
            backoff,
            down_until: (0..groups).map(|_| AtomicU64::new(0)).collect(),
            outages: Outages::new(failure),
            last_failure: Mutex::new(None),
            started: Instant::now(),
        }
    }

    pub(crate) fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// The in-process stand-in, if the failure policy is [`FailurePolicy::Local`].
    pub(crate) fn local(&self) -> Option<&MemoryStore> {
        self.local.as_ref()
    }

    fn elapsed_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// True while `group`'s node failed less than the backoff ago.
    pub(crate) fn in_backoff(&self, group: usize) -> bool {
        self.down_until
            .get(group)
            .is_some_and(|until| self.elapsed_us() < until.load(Ordering::Relaxed))
    }

    /// The outages going on now.
    pub(crate) fn outages(&self) -> Vec<Outage> {
        self.outages.list()
    }

    /// A request's outcome from Redis (its node in `group`, routed by `router`): the
    /// decision, or the failure policy's answer.
    pub(crate) fn settle(
        &self,
        outcome: Result<Decision, StoreError>,
        request: &Request<'_>,
        group: usize,
        router: &Router,
    ) -> Result<Decision, Error> {
        match outcome {
            Ok(decision) => {
                self.outages.answered(router, group);
                Ok(decision)
            }
            Err(e) => {
                self.mark_down(group, &e, router);
                self.fall_back(e, request)
            }
        }
    }

    /// A set's outcome from Redis (its keys' node in `group`): whether it was admitted and
    /// each limit's decision, or the failure policy's answer for the whole set.
    pub(crate) fn settle_all(
        &self,
        outcome: Result<Option<(bool, Vec<Decision>)>, StoreError>,
        requests: &[Request<'_>],
        group: usize,
        router: &Router,
    ) -> Result<SetDecision, Error> {
        match outcome {
            Ok(Some((admitted, limits))) => {
                self.outages.answered(router, group);
                Ok(SetDecision::new(admitted, limits))
            }
            Ok(None) => {
                self.outages.answered(router, group);
                Err(crate::set::unmet().into())
            }
            Err(e) => {
                self.mark_down(group, &e, router);
                self.fall_back_all(e, requests)
            }
        }
    }

    /// The error of a call for `group` that skips Redis during the backoff (quoting the
    /// failure), counted in its node's outage.
    pub(crate) fn skip(&self, group: usize, router: &Router) -> StoreError {
        self.outages.skipped(router, group);
        self.backoff_error()
    }

    /// The outcome of a call of a function-host extension (the job queue's, the API
    /// client's, the service's run-time policies) for `group`: counted in its node's outage
    /// like a decision's, so that an outage only queue calls meet is logged as it begins and
    /// ends too. A call Redis answered ends the failure backoff with the outage: decisions
    /// go to Redis again at once, rather than being answered without it (and counted in no
    /// outage) while the backoff lasts.
    pub(crate) fn observe(&self, outcome: Result<(), &StoreError>, group: usize, router: &Router) {
        match outcome {
            Ok(()) => {
                self.outages.answered(router, group);
                if let Some(until) = self.down_until.get(group) {
                    until.store(0, Ordering::Relaxed);
                }
            }
            Err(e) => self.mark_down(group, e, router),
        }
    }

    fn mark_down(&self, group: usize, error: &StoreError, router: &Router) {
        // A script or reply error is not an outage: retrying at once is right.
        if !Outages::is_outage(error) {
            return;
        }
        if self.outages.failed(router, group, error) {
            // A new outage: the stand-in starts from idle keys, as documented, rather than
            // from what it saw during an earlier one.
            if let Some(local) = &self.local {
                local.clear();
            }
        }
        *self
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.clone());
        let backoff = u64::try_from(self.backoff.as_micros()).unwrap_or(u64::MAX);
        if let Some(until) = self.down_until.get(group) {
            until.store(self.elapsed_us().saturating_add(backoff), Ordering::Relaxed);
        }
    }

    /// The error of a call that skipped Redis during the backoff, quoting the failure.
    fn backoff_error(&self) -> StoreError {
        let last = self
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (kind, cause) = match last {
            Some(e) => (e.kind(), e.message().to_string()),
            None => (StoreErrorKind::Unavailable, "unknown".to_string()),
        };
        StoreError::new(
            kind,
            format!(
                "Redis failed less than {:?} ago and is not retried before the store's failure \
                 backoff has passed; the failure: {cause}",
                self.backoff
            ),
        )
    }

    /// The failure policy's answer to a failed request.
    pub(crate) fn fall_back(&self, error: StoreError, r: &Request<'_>) -> Result<Decision, Error> {
        match self.failure {
            FailurePolicy::FailClosed => Err(error.into()),
            FailurePolicy::FailOpen => Ok(fail_open(r)),
            FailurePolicy::Local => match &self.local {
                Some(local) => local
                    .decide_sync(r.policy, r.key, r.op, r.cost)
                    .map(|d| local_lease(d.with_fallback(Fallback::Local))),
                None => Err(error.into()),
            },
        }
    }

    /// The failure policy's answer to a failed set: refused by an error, admitted whole, or
    /// decided as a set by the in-process stand-in.
    pub(crate) fn fall_back_all(
        &self,
        error: StoreError,
        requests: &[Request<'_>],
    ) -> Result<SetDecision, Error> {
        match self.failure {
            FailurePolicy::FailClosed => Err(error.into()),
            FailurePolicy::FailOpen => Ok(SetDecision::new(
                true,
                requests.iter().map(fail_open).collect(),
            )),
            FailurePolicy::Local => match &self.local {
                Some(local) => {
                    let set = local.decide_all_sync(requests)?;
                    let limits = set
                        .limits
                        .into_iter()
                        .map(|d| local_lease(d.with_fallback(Fallback::Local)))
                        .collect();
                    Ok(SetDecision::new(set.decision.allowed, limits))
                }
                None => Err(error.into()),
            },
        }
    }
}

/// Marks the lease ids of the in-process stand-in: Redis's ids stay below 2^54 (times in
/// µs), so the bit tells a stand-in's lease from a Redis one's, and each release or
/// extension goes to the store that holds the lease.
pub(crate) const LOCAL_LEASE: u64 = 1 << 62;

/// A stand-in's decision, its lease id marked [`LOCAL_LEASE`].
fn local_lease(mut d: Decision) -> Decision {
    d.lease = d.lease.map(|id| id | LOCAL_LEASE);
    d
}

/// `fail_open`'s answer to `r`: admitted at once, as if its key were idle.
fn fail_open(r: &Request<'_>) -> Decision {
    Decision::from_micros(
        true,
        0.0,
        r.policy.limit().saturating_sub(r.cost),
        0.0,
        r.policy.limit(),
    )
    .with_fallback(Fallback::FailOpen)
}
