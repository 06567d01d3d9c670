//! A queue of several partitions in Redis: where each partition's keys go, and how the
//! partitions are opened (or attached) together.
//!
//! # Keys
//!
//! A queue of one partition keeps every key under `PREFIX{q:NAME}:`, as ever. A queue of
//! `n > 1` keeps there only its configuration, with `n` (so that a handle opening it with
//! another number is refused before it touches anything, and `paceline queue` reads `n`
//! back), and partition `i` under `PREFIX{q:NAME/i~k}:`, a complete queue of its own: `k`
//! is the smallest whole number (0, 1, 2, ...) for which the tag's hash slot falls in the
//! middle half of the `i`-th of `n` equal ranges of the 16,384 slots. Redis Cluster tools
//! split a cluster's slots into equal ranges in order (`redis-cli --cluster create` does),
//! so on a cluster of `n` primaries partition `i` is on the `i`-th primary, whatever the
//! rounding at the ranges' edges; on `m` primaries the partitions spread over them evenly.
//! The choice depends on the name, `i` and `n` alone, never on the live topology, so every
//! process finds the same keys.

use std::sync::Arc;

use paceline_core::Clock;
use paceline_store::redis::{key_slot, FunctionHost};
use tokio::sync::Notify;

use super::caller::{arg, config_args, Caller};
use super::{configured, queue_base, read_stored, RedisQueue, Wakeups};
use crate::config::QueueConfig;
use crate::error::QueueError;
use crate::memory::check_queue_name;
use crate::partitioned::{partition_config, Partitioned};
use crate::queue::QueueBackend;

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// The most suffixes tried for a partition's tag: far more than any needs (one in
/// `n / 2` falls in a partition's range, for `n` up to 64).
const MAX_TRIES: u32 = 1_000_000;

/// The hash tag of partition `index` of the queue `name` of `partitions`: `q:NAME` for a
/// queue of one, `q:NAME/INDEX~K` otherwise, where `K` is the smallest whole number (0,
/// 1, 2, ...) for which the tag's hash slot falls in the middle half of the `index`-th of
/// `partitions` equal ranges of the 16,384 slots: on a cluster whose slots are split into
/// equal ranges in order (as `redis-cli --cluster create` splits them), partition `i` of
/// `n` is on the `i`-th of `n` primaries. It depends on the name, the index and the
/// number alone, never on the live topology, so every process finds the same keys. A
/// queue of several keeps only its configuration under `q:NAME`.
///
/// ```
/// use paceline_queue::redis::partition_tag;
/// use paceline_store::redis::key_slot;
/// assert_eq!(partition_tag("emails", 0, 1), "q:emails");
/// // Of three partitions, the second is on the second third of the slots.
/// let tag = partition_tag("emails", 1, 3);
/// assert!(tag.starts_with("q:emails/1~"));
/// assert!((5461..10922).contains(&key_slot(&format!("{{{tag}}}"))));
/// ```
pub fn partition_tag(name: &str, index: usize, partitions: u32) -> String {
    if partitions <= 1 {
        return format!("q:{name}");
    }
    let n = partitions as usize;
    let (low, high) = (index * SLOTS / n, (index + 1) * SLOTS / n);
    let margin = (high - low) / 4;
    let middle = (low + margin)..(high - margin);
    (0..MAX_TRIES)
        .map(|k| format!("q:{name}/{index}~{k}"))
        .find(|tag| middle.contains(&usize::from(key_slot(&format!("{{{tag}}}")))))
        .unwrap_or_else(|| format!("q:{name}/{index}"))
}

/// The queue `name` as the Redis behind `host` holds it, of one partition or several.
pub(crate) async fn attach_any(
    host: FunctionHost,
    name: &str,
) -> Result<Arc<dyn QueueBackend>, QueueError> {
    let config = read_stored(&host, name).await?;
    if config.partitions > 1 {
        return Ok(Arc::new(
            Partitioned::<RedisQueue>::follow_all(host, name, config, None).await?,
        ));
    }
    let base = queue_base(&host, name);
    Ok(Arc::new(
        RedisQueue::follow(host, name, base, config, None, None, Wakeups::Own).await?,
    ))
}

impl Partitioned<RedisQueue> {
    /// Opens the queue `name` of `config.partitions` (two or more) partitions in the Redis
    /// (or Redis Cluster) behind `store`, setting its configuration, and follows every
    /// partition's channel (on one connection) for wake-ups; `clock` as
    /// [`RedisQueue::open`] takes it. [`Queue::open`](crate::Queue::open) and
    /// [`Queue::with_store`](crate::Queue::with_store) call this for such a
    /// configuration.
    ///
    /// A queue Redis holds with another number of partitions is refused with an `Input`
    /// error on `partitions` that says what to do, and nothing is changed.
    pub async fn open(
        store: impl Into<FunctionHost>,
        name: &str,
        config: QueueConfig,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<Partitioned<RedisQueue>, QueueError> {
        let host = store.into();
        check_queue_name(name)?;
        config.validate()?;
        if config.partitions < 2 {
            return Err(crate::partitioned::one_partition_only("Partitioned").into());
        }
        // The queue's own key base holds its configuration and number of partitions: a
        // queue of another number is refused there, before any partition is touched.
        let args = config_args(&config, vec![arg(config.partitions), Vec::new()]);
        let directory = Caller::new(host.clone(), queue_base(&host, name), clock.clone(), args);
        let reply = directory.call("config", &directory.config).await?;
        configured(reply, name, config.partitions)?;
        let queue = Partitioned::follow_all(host, name, config, clock).await?;
        for part in queue.partitions() {
            part.set_config().await?;
        }
        Ok(queue)
    }

    /// The handles on every partition of the queue `name` of `config`, partition 0 following
    /// every partition's channel, without setting their configuration.
    async fn follow_all(
        host: FunctionHost,
        name: &str,
        config: QueueConfig,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<Partitioned<RedisQueue>, QueueError> {
        let n = config.partitions as usize;
        let bases: Vec<String> = (0..n)
            .map(|i| {
                let tag = partition_tag(name, i, config.partitions);
                format!("{}{{{tag}}}:", host.key_prefix())
            })
            .collect();
        let changed = Arc::new(Notify::new());
        let channels: Vec<String> = bases.iter().map(|b| format!("{b}changed")).collect();
        let mut parts = Vec::with_capacity(n);
        for (i, base) in bases.into_iter().enumerate() {
            let wakeups = if i == 0 {
                Wakeups::Lead {
                    channels: channels.clone(),
                    changed: Arc::clone(&changed),
                }
            } else {
                Wakeups::Shared(Arc::clone(&changed))
            };
            let own = partition_config(&config, i);
            let part = Some((config.partitions, i));
            let part =
                RedisQueue::follow(host.clone(), name, base, own, part, clock.clone(), wakeups)
                    .await?;
            parts.push(part);
        }
        Ok(Partitioned::new(config, parts)?)
    }

    /// How many groups the partitions hold state for, summed; see
    /// [`QueueCore::groups_held`](crate::QueueCore::groups_held).
    pub async fn groups_held(&self) -> Result<usize, QueueError> {
        let mut sum = 0;
        for part in self.partitions() {
            sum += part.groups_held().await?;
        }
        Ok(sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_partition_s_tag_is_in_the_middle_of_its_slot_range() {
        for name in ["emails", "discord-roles", "q", "a.b_c-9"] {
            for n in 2..=64u32 {
                for i in 0..n as usize {
                    let tag = partition_tag(name, i, n);
                    let k: u32 = tag
                        .rsplit_once('~')
                        .and_then(|(_, k)| k.parse().ok())
                        .unwrap_or_else(|| panic!("{tag}: no suffix"));
                    assert!(k < 2_000, "{tag}: far more tries than expected");
                    let slot = usize::from(key_slot(&format!("{{{tag}}}")));
                    let (low, high) = (i * SLOTS / n as usize, (i + 1) * SLOTS / n as usize);
                    assert!(
                        low + (high - low) / 4 <= slot && slot < high - (high - low) / 4,
                        "{tag}: slot {slot} outside the middle of {low}..{high}"
                    );
                }
            }
        }
        assert_eq!(partition_tag("emails", 0, 1), "q:emails");
    }
}
