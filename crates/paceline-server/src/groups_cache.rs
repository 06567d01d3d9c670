//! The dashboard's listing of each queue's groups, kept a while: listing a queue's groups
//! reads every group (on Redis, one script over all of them), so many open dashboards
//! cost one listing every [`GROUPS_TTL`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::units::unix_ms;

/// How long a queue's listing is kept.
const GROUPS_TTL: Duration = Duration::from_secs(5);

/// The groups of each queue as the dashboard lists them, and when they were listed.
#[derive(Default)]
pub(crate) struct GroupsCache(Mutex<HashMap<String, (Instant, Arc<GroupsListing>)>>);

/// A queue's groups with the most jobs waiting, and how many groups it has.
pub(crate) struct GroupsListing {
    /// How many groups the queue has.
    pub(crate) total: usize,
    /// The groups with the most jobs waiting, most first (ties by name).
    pub(crate) top: Vec<GroupRow>,
}

/// One group as the dashboard lists it (fields in the order JSON objects print).
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = DashboardGroup)]
pub(crate) struct GroupRow {
    active: u64,
    group: String,
    /// When its next job may start, in Unix milliseconds; `null` when none waits.
    next_eligible_ms: Option<u64>,
    waiting: u64,
}

impl GroupsCache {
    /// `queue`'s `top` groups with the most jobs waiting, listed at most every
    /// [`GROUPS_TTL`]; `None` when the store does not answer.
    pub(crate) async fn listing(
        &self,
        name: &str,
        queue: &paceline_queue::Queue,
        top: usize,
    ) -> Option<Arc<GroupsListing>> {
        let now = Instant::now();
        let cached = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .filter(|(at, _)| now.duration_since(*at) < GROUPS_TTL)
            .map(|(_, listing)| Arc::clone(listing));
        if cached.is_some() {
            return cached;
        }
        let mut stats = queue.stats().await.ok()?;
        stats.groups.sort_by(|a, b| {
            b.waiting
                .cmp(&a.waiting)
                .then_with(|| a.group.cmp(&b.group))
        });
        let total = stats.groups.len();
        let rows = stats.groups.into_iter().take(top).map(|g| GroupRow {
            active: g.active,
            group: g.group,
            next_eligible_ms: g.next_eligible.map(unix_ms),
            waiting: g.waiting,
        });
        let listing = Arc::new(GroupsListing {
            total,
            top: rows.collect(),
        });
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), (now, Arc::clone(&listing)));
        Some(listing)
    }
}
