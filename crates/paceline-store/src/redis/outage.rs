//! Outages: when a Redis node stops answering a store's decisions, and when it answers
//! again, logged once each and readable while they last ([`RedisStore::outages`]).
//!
//! An outage of a node (the one server, or one primary of a cluster) begins with the first
//! decision that fails for want of it: unreachable, no answer within the response timeout,
//! loading, busy, a cluster down (a [`StoreErrorKind::Unavailable`] or
//! [`StoreErrorKind::Timeout`] failure; a refused script or an unreadable reply is the
//! call's own error, not an outage). It ends with the first decision the node answers
//! again. The beginning is logged once as a warning (target `paceline::store`), the end
//! as a note with the outage's length and the number of decisions answered without Redis
//! during it (failed, or answered by the failure policy during the failure backoff without
//! trying Redis). Calls in between log nothing. In a cluster each node has outages of its
//! own: a dead primary's keys fail while the other primaries' keys are answered.
//!
//! ```text
//! WARN paceline::store: store outage began: Redis at redis://127.0.0.1:6379 is failing; decisions for its keys follow the failure policy until it answers again node=redis://127.0.0.1:6379 failure_policy=fail_closed error=Redis failed a decision: broken pipe
//! INFO paceline::store: store outage ended: Redis at redis://127.0.0.1:6379 answers again after 8.0s; 1630 decisions were answered without it during the outage node=redis://127.0.0.1:6379 lasted_ms=8021 failed_decisions=1630
//! ```
//!
//! [`RedisStore::outages`]: super::RedisStore::outages

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use paceline_core::{StoreError, StoreErrorKind};

use super::routing::Router;
use crate::FailurePolicy;

/// An outage going on now: a Redis node that fails the store's decisions (see
/// [`RedisStore::outages`](super::RedisStore::outages)).
///
/// ```
/// # use paceline_store::redis::Outage;
/// fn describe(o: &Outage) -> String {
///     format!("{} down for {:?}, {} decisions failed: {}", o.node, o.lasted, o.failed, o.cause)
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outage {
    /// The failing node: `host:port` of a cluster's primary, else the store's URL without
    /// credentials (a single server, or a cluster whose slot map is not known).
    pub node: String,
    /// How long it has lasted so far.
    pub lasted: Duration,
    /// The decisions answered without Redis during it so far: those that failed, and those
    /// answered by the failure policy during the failure backoff.
    pub failed: u64,
    /// The failure that began it.
    pub cause: String,
}

/// One node's outage going on.
struct Ongoing {
    began: Instant,
    failed: u64,
    cause: String,
}

/// The store's outages, by node name.
pub(crate) struct Outages {
    /// How many nodes are in outage: a decision Redis answers reads only this while none is.
    active: AtomicUsize,
    nodes: Mutex<HashMap<Arc<str>, Ongoing>>,
    policy: FailurePolicy,
}

impl Outages {
    /// No outage yet, for a store with failure policy `policy` (named in the logs).
    pub(crate) fn new(policy: FailurePolicy) -> Outages {
        Outages {
            active: AtomicUsize::new(0),
            nodes: Mutex::new(HashMap::new()),
            policy,
        }
    }

    /// True if `error` is a failure of Redis itself rather than of the call.
    pub(crate) fn is_outage(error: &StoreError) -> bool {
        matches!(
            error.kind(),
            StoreErrorKind::Unavailable | StoreErrorKind::Timeout
        )
    }

    /// A decision for failure group `group` failed with `error` (an outage's kind): begins
    /// its node's outage (logged) or counts in it. True if no node was in outage before.
    pub(crate) fn failed(&self, router: &Router, group: usize, error: &StoreError) -> bool {
        let node = router.node_name(group);
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ongoing) = nodes.get_mut(&node) {
            ongoing.failed += 1;
            return false;
        }
        tracing::warn!(
            target: "paceline::store",
            node = %node,
            failure_policy = %self.policy,
            error = %error.message(),
            "store outage began: Redis at {node} is failing; decisions for its keys follow the \
             failure policy until it answers again"
        );
        nodes.insert(
            node,
            Ongoing {
                began: Instant::now(),
                failed: 1,
                cause: error.message().to_string(),
            },
        );
        self.active.fetch_add(1, Ordering::Relaxed) == 0
    }

    /// A decision for failure group `group` was answered by the failure policy without
    /// trying Redis (the failure backoff): counts in its node's outage.
    pub(crate) fn skipped(&self, router: &Router, group: usize) {
        if self.active.load(Ordering::Relaxed) == 0 {
            return;
        }
        let node = router.node_name(group);
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ongoing) = nodes.get_mut(&node) {
            ongoing.failed += 1;
        }
    }

    /// Redis answered a decision for failure group `group`: its node's outage, if any, is
    /// over (logged). So are those of nodes that no longer serve any slot (their slots
    /// moved to another node, which answers).
    pub(crate) fn answered(&self, router: &Router, group: usize) {
        if self.active.load(Ordering::Relaxed) == 0 {
            return;
        }
        let node = router.node_name(group);
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let over: Vec<Arc<str>> = if nodes.contains_key(&node) {
            vec![node]
        } else {
            nodes
                .keys()
                .filter(|name| !router.serves_slots(name))
                .cloned()
                .collect()
        };
        for name in over {
            if let Some(ended) = nodes.remove(&name) {
                self.active.fetch_sub(1, Ordering::Relaxed);
                let lasted = ended.began.elapsed();
                tracing::info!(
                    target: "paceline::store",
                    node = %name,
                    lasted_ms = u64::try_from(lasted.as_millis()).unwrap_or(u64::MAX),
                    failed_decisions = ended.failed,
                    "store outage ended: Redis at {name} answers again after {lasted:.1?}; {} \
                     decisions were answered without it during the outage",
                    ended.failed
                );
            }
        }
    }

    /// The outages going on, by node name.
    pub(crate) fn list(&self) -> Vec<Outage> {
        if self.active.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list: Vec<Outage> = nodes
            .iter()
            .map(|(node, ongoing)| Outage {
                node: node.to_string(),
                lasted: ongoing.began.elapsed(),
                failed: ongoing.failed,
                cause: ongoing.cause.clone(),
            })
            .collect();
        list.sort_by(|a, b| a.node.cmp(&b.node));
        list
    }
}
