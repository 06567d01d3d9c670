//! Pauses asked by people, not workers: the whole queue's, and one group's, each for a time
//! or until resumed. A paused queue leases nothing; a paused group starts nothing. Jobs
//! keep their places, their attempts and their estimates' order; leases already given run
//! on. A pause never shortens one in place (a worker's pause after an upstream's refusal
//! included); a resume ends every pause of what it names.

use std::time::Duration;

use paceline_core::{round_to_micros, InputError};

use super::QueueCore;
use crate::config::check_group;
use crate::error::QueueError;
use crate::events::{Event, EventKind};
use crate::job::MAX_DELAY;

/// The end of a pause with no end of its own (until resumed): a time no clock reaches
/// (2^53 − 1 µs, the last whole number both twins keep exactly).
pub const UNTIL_RESUMED: u64 = (1 << 53) - 1;

/// Checks a pause or resume of `group` (`None`: the queue) and the pause's length: from
/// 1 ms to [`MAX_DELAY`] (365 days); `None` is until resumed.
pub(crate) fn check_pause(group: Option<&str>, length: Option<Duration>) -> Result<(), QueueError> {
    if let Some(group) = group {
        check_group(group)?;
    }
    match length {
        Some(d) if d < Duration::from_millis(1) || d > MAX_DELAY => Err(InputError::new(
            "ms",
            "must be from 1 ms to 365 days (31536000000 ms); leave it out to pause until resumed",
        )
        .into()),
        _ => Ok(()),
    }
}

/// When a pause of `length` (`None`: until resumed) that starts at `now` ends.
fn pause_end(now: u64, length: Option<Duration>) -> u64 {
    length.map_or(UNTIL_RESUMED, |d| {
        now.saturating_add(round_to_micros(d)).min(UNTIL_RESUMED)
    })
}

impl QueueCore {
    /// Pauses `group` (`None`: the whole queue) for `length` (`None`: until resumed);
    /// answers when the pause ends ([`UNTIL_RESUMED`] for none). A group the queue holds
    /// nothing for is kept, paused, so that jobs enqueued into it wait too.
    ///
    /// ```
    /// use paceline_queue::{NewJob, QueueConfig, QueueCore};
    /// use std::time::Duration;
    /// let mut queue = QueueCore::new(QueueConfig::new("gcra:rate=10/s,burst=10".parse()?))?;
    /// queue.enqueue(0, NewJob::new("guild:1", b"a".to_vec()))?;
    /// queue.pause(0, Some("guild:1"), Some(Duration::from_secs(5)))?;
    /// assert!(queue.lease(0, "w", 10, None)?.is_empty()); // paused: nothing starts
    /// assert_eq!(queue.next_event(), Some(5_000_000)); // when the pause ends
    /// assert_eq!(queue.lease(5_000_000, "w", 10, None)?.len(), 1);
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// ```
    pub fn pause(
        &mut self,
        now: u64,
        group: Option<&str>,
        length: Option<Duration>,
    ) -> Result<u64, QueueError> {
        check_pause(group, length)?;
        let now = self.tick(now)?;
        self.maintain(now);
        let until = pause_end(now, length);
        match group {
            None => {
                self.paused_until = self.paused_until.max(until);
                let until = self.paused_until;
                self.events
                    .push(|| Event::new(EventKind::Paused, now).at(until));
                Ok(until)
            }
            Some(name) => {
                let g = self.groups.entry(name.to_string()).or_default();
                g.paused_until = g.paused_until.max(until);
                let until = g.paused_until;
                self.place_again(name);
                self.events.push(|| {
                    let mut e = Event::new(EventKind::Paused, now).at(until);
                    e.group = Some(name.to_string());
                    e
                });
                Ok(until)
            }
        }
    }

    /// Ends every pause of `group` (`None`: the queue's own, not its groups'): a worker's
    /// after an upstream's refusal too. A group resumed goes behind the groups eligible
    /// before it.
    pub fn resume(&mut self, now: u64, group: Option<&str>) -> Result<(), QueueError> {
        check_pause(group, None)?;
        let now = self.tick(now)?;
        self.maintain(now);
        match group {
            None => self.paused_until = 0,
            Some(name) => {
                if let Some(g) = self.groups.get_mut(name) {
                    g.paused_until = 0;
                    self.place_again(name);
                }
            }
        }
        Ok(())
    }

    /// When the queue's own pause ends, if it is paused at `now`.
    pub fn paused_until(&self, now: u64) -> Option<u64> {
        (self.paused_until > now).then_some(self.paused_until)
    }

    /// Takes group `name` out of the ready and retiring sets and puts it back as its
    /// state now says: its pause changed, so its times did.
    pub(super) fn place_again(&mut self, name: &str) {
        if let Some(g) = self.groups.get_mut(name) {
            if let Some((at, order)) = g.ready.take() {
                self.ready[usize::from(g.level)].remove(&(at, order, name.to_string()));
            }
            if let Some(t) = g.retiring.take() {
                self.retiring.remove(&(t, name.to_string()));
            }
            // The line's estimates start from the pause's end.
            g.projection = None;
        }
        self.refresh(name);
    }
}
