//! Group policies changed at run time: one group's policy set (or unset) while the queue
//! runs, kept by the queue (and so, in Redis, by the store: every process sharing the queue
//! sees it at its next call, and a restart keeps it). A policy set this way wins over the
//! configuration's for that group, through configuration changes too, until it is unset.

use std::collections::BTreeMap;

use paceline_core::Policy;

use super::QueueCore;
use crate::config::{check_group, check_policy, QueueConfig};
use crate::error::QueueError;

/// Where a group's policy comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicySource {
    /// Set at run time ([`QueueCore::set_policy`]).
    RunTime,
    /// The configuration's own for the group ([`QueueConfig::groups`]).
    Config,
    /// The configuration's default ([`QueueConfig::group_policy`]).
    Default,
}

impl PolicySource {
    /// Its name in the HTTP API: `run_time`, `config` or `default`.
    pub fn name(self) -> &'static str {
        match self {
            PolicySource::RunTime => "run_time",
            PolicySource::Config => "config",
            PolicySource::Default => "default",
        }
    }
}

/// `config` with the policies set at run time in place of its own.
pub(super) fn with_run_time(config: &QueueConfig, set: &BTreeMap<String, Policy>) -> QueueConfig {
    let mut config = config.clone();
    for (group, policy) in set {
        config.groups.insert(group.clone(), policy.clone());
    }
    config
}

impl QueueCore {
    /// Sets `group`'s policy (`None`: back to the configuration's, its own or the default).
    /// The group's state carries over when the algorithm stays, and starts afresh when it
    /// changes; a refusal under the old policy no longer holds the group, which is asked
    /// again at once (behind the groups eligible before it).
    ///
    /// ```
    /// use paceline_queue::{NewJob, QueueConfig, QueueCore};
    /// let mut queue = QueueCore::new(QueueConfig::new("fixed_window:limit=1,window=1h".parse()?))?;
    /// for _ in 0..3 {
    ///     queue.enqueue(0, NewJob::new("guild:1", b"x".to_vec()))?;
    /// }
    /// assert_eq!(queue.lease(0, "w", 10, None)?.len(), 1); // one an hour
    /// queue.set_policy(0, "guild:1", Some("fixed_window:limit=10,window=1h".parse()?))?;
    /// assert_eq!(queue.lease(0, "w", 10, None)?.len(), 2); // the same window, ten an hour
    /// # Ok::<(), paceline_queue::QueueError>(())
    /// ```
    pub fn set_policy(
        &mut self,
        now: u64,
        group: &str,
        policy: Option<Policy>,
    ) -> Result<(), QueueError> {
        check_group(group)?;
        if let Some(policy) = &policy {
            check_policy("policy", policy)?;
        }
        let now = self.tick(now)?;
        self.maintain(now);
        match policy {
            Some(policy) => {
                self.run_time.insert(group.to_string(), policy);
            }
            None => {
                self.run_time.remove(group);
            }
        }
        self.config = with_run_time(&self.file_config, &self.run_time);
        if let Some(g) = self.groups.get_mut(group) {
            g.next_at = 0;
        }
        self.place_again(group);
        Ok(())
    }

    /// `group`'s policy now, and where it comes from.
    pub fn policy(&self, group: &str) -> Result<(Policy, PolicySource), QueueError> {
        check_group(group)?;
        let source = if self.run_time.contains_key(group) {
            PolicySource::RunTime
        } else if self.file_config.groups.contains_key(group) {
            PolicySource::Config
        } else {
            PolicySource::Default
        };
        Ok((self.config.policy_of(group).clone(), source))
    }
}
