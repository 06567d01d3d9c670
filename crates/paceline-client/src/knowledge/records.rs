//! What the knowledge keeps: a bucket's record (its limit as known, its requests in flight,
//! its pause), a major parameter's discovery, the answers kept for repeated rounds, and a
//! bucket as callers see it.

use std::collections::BTreeMap;
use std::sync::Arc;

#[cfg(doc)]
use super::Knowledge;
use super::{RoundAnswer, KEEP_US};

/// A round's answer, kept for a repeat of its call until `until` (µs).
#[derive(Clone, Debug)]
pub(super) struct Kept {
    pub(super) until: u64,
    pub(super) answer: RoundAnswer,
}

/// What is known of a bucket's limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Known {
    /// Nothing yet: one pioneer at a time.
    Unknown,
    /// A success came without rate-limit headers: no limit to keep.
    Unlimited,
    /// From headers.
    Limited {
        limit: u64,
        /// Requests that may still go in this window (each admission counts one down).
        remaining: u64,
        reset_at: u64,
        /// The window's length, the longest reset-after seen.
        window: u64,
        /// After a local reset: the earliest time of the next release.
        paced_next: Option<u64>,
    },
}

impl Known {
    /// The same knowledge at `now`: a limited bucket whose window has passed is assumed
    /// back at its limit, its releases paced over the new window until responses say more.
    pub(crate) fn at(self, now: u64) -> Known {
        match self {
            Known::Limited {
                limit,
                reset_at,
                window,
                paced_next,
                ..
            } if now >= reset_at => Known::Limited {
                limit,
                remaining: limit,
                reset_at: now + window,
                window,
                paced_next: Some(paced_next.unwrap_or(now).max(now)),
            },
            known => known,
        }
    }
}

/// A bucket: a learned id (or a route's own) and a major parameter.
pub(crate) type BucketKey = (Arc<str>, Arc<str>);

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Bucket {
    pub(crate) known: Known,
    /// Its requests in flight: admission number → when admitted.
    pub(crate) flying: BTreeMap<u64, u64>,
    /// The admission number of its pioneer in flight.
    pub(crate) pioneer: Option<u64>,
    pub(crate) paused_until: u64,
    /// When it was last asked about or admitted to.
    pub(crate) touched: u64,
}

impl Bucket {
    pub(super) fn new(now: u64) -> Bucket {
        Bucket {
            known: Known::Unknown,
            flying: BTreeMap::new(),
            pioneer: None,
            paused_until: 0,
            touched: now,
        }
    }

    /// Forgets requests in flight longer than `lease`: their process is gone.
    pub(super) fn settle(&mut self, now: u64, lease: u64) {
        self.flying.retain(|_, at| at.saturating_add(lease) > now);
        if self.pioneer.is_some_and(|p| !self.flying.contains_key(&p)) {
            self.pioneer = None;
        }
    }

    /// When the record says nothing more and is dropped.
    pub(crate) fn expires(&self, lease: u64) -> u64 {
        // Kept while in use (a queue asks about it, even one held back by the global
        // limit for longer than the window), and a window after its reset.
        let used = self.touched.saturating_add(KEEP_US);
        let known = match self.known {
            Known::Limited {
                reset_at, window, ..
            } => reset_at.saturating_add(window).max(used),
            _ => used,
        };
        let flying = self
            .flying
            .values()
            .max()
            .map_or(0, |at| at.saturating_add(lease));
        known.max(flying).max(self.paused_until)
    }

    /// Until when the bucket has no call for a pioneer that could land on it, if it has
    /// none now.
    pub(super) fn exhausted(&self, now: u64) -> Option<u64> {
        match self.known {
            Known::Limited {
                remaining: 0,
                reset_at,
                ..
            } if reset_at > now => Some(reset_at),
            Known::Unknown => None,
            _ if self.paused_until > now => Some(self.paused_until),
            _ => None,
        }
    }
}

/// Per major parameter: what discovery needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Major {
    /// Pioneers in flight: admission number → when admitted.
    pub(crate) pioneers: BTreeMap<u64, u64>,
    /// Routes of unknown bucket waiting to send their pioneer → until when the wish holds.
    pub(crate) wants: BTreeMap<Arc<str>, u64>,
    /// Known buckets with no call left → until when.
    pub(crate) exhausted: BTreeMap<Arc<str>, u64>,
}

/// One bucket as [`Knowledge::buckets`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BucketView {
    /// The bucket's id as the API named it (or, before it did, the route's own key).
    pub bucket: String,
    /// The major parameter (a Discord channel or server; empty when there is none).
    pub major: String,
    /// False while no response has told anything of it (one request at a time goes).
    pub known: bool,
    /// The requests its window allows (`None`: no limit learned).
    pub limit: Option<u64>,
    /// The requests that may still go in its window.
    pub remaining: Option<u64>,
    /// Time until its window resets, in µs.
    pub reset_in_us: Option<u64>,
    /// Time it stays paused by a refusal, in µs (0: not paused).
    pub paused_for_us: u64,
    /// Its requests in flight.
    pub in_flight: usize,
}
