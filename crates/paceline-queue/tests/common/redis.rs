//! What the queue's Redis test files share.

use std::sync::Arc;

use paceline_core::Clock;
use paceline_queue::{LeaseToken, QueueConfig, RedisQueue};
use paceline_testkit::connect;

/// A handle on the Redis queue `name` at `url`, opened with `config` on `clock` (None: the
/// server's).
pub async fn open_at(
    url: &str,
    name: &str,
    config: QueueConfig,
    clock: Option<Arc<dyn Clock>>,
) -> RedisQueue {
    RedisQueue::open(connect(url).await, name, config, clock)
        .await
        .unwrap()
}

/// Jobs as a `QueueCore` answers them: without the tokens a `Queue` signs.
pub fn unsigned(jobs: &[paceline_queue::Leased]) -> Vec<paceline_queue::Leased> {
    let mut jobs = jobs.to_vec();
    for job in &mut jobs {
        job.token = LeaseToken::default();
    }
    jobs
}
