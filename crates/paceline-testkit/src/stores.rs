//! Stores on a test's Redis ([`connect`], [`redis_store_on`]) and a remote store that is
//! not Redis ([`NotRedis`]).

use std::time::Duration;

/// A connection to a test's Redis at `url` (`redis://` or `redis-cluster://`, failing
/// closed, answers within 5 s), built as `paceline_store::open` builds it.
///
/// # Panics
///
/// When it cannot connect: the test's own server is down, and the test cannot go on.
pub async fn connect(url: &str) -> paceline_store::redis::RedisStore {
    paceline_store::redis::RedisStore::builder(url, paceline_store::FailurePolicy::FailClosed)
        .response_timeout(Duration::from_secs(5))
        // A loaded test machine's shared server may be running another test's long script
        // as the connection is made.
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("the test's Redis is up")
}

/// A fail-closed Redis store at `url` under `prefix`, reading time from `clock` (with a
/// generous response timeout for a loaded test machine), as a script (`EVALSHA`) rather than
/// a function when `scripts_only`: one of the stores differential tests compare.
pub async fn redis_store_on(
    url: String,
    prefix: &str,
    clock: &paceline_store::ManualClock,
    scripts_only: bool,
) -> paceline_store::redis::RedisStore {
    let mut builder =
        paceline_store::redis::RedisStore::builder(url, paceline_store::FailurePolicy::FailClosed)
            .prefix(prefix)
            .clock(std::sync::Arc::new(clock.clone()))
            .response_timeout(std::time::Duration::from_secs(10))
            .connect_timeout(std::time::Duration::from_secs(10));
    if scripts_only {
        builder = builder.scripts_only();
    }
    builder.connect().await.expect("connect to the test Redis")
}

/// A store across the network that is not Redis, or hides the Redis store beneath it: a
/// memory store that says it is remote ([`Store::is_remote`]) and has no function host
/// ([`functions`](paceline_store::Store::functions)). For tests that a front end which keeps
/// state of its own in Redis refuses it, rather than keeping that state in its own process
/// where no other process sees it.
///
/// [`Store::is_remote`]: paceline_store::Store::is_remote
pub struct NotRedis(paceline_store::MemoryStore);

impl NotRedis {
    /// A fresh one, on the system clock.
    pub fn new() -> NotRedis {
        NotRedis(paceline_store::MemoryStore::new())
    }
}

impl Default for NotRedis {
    fn default() -> Self {
        NotRedis::new()
    }
}

impl paceline_store::Store for NotRedis {
    fn decide<'a>(
        &'a self,
        policy: &'a paceline_store::Policy,
        key: &'a str,
        op: paceline_store::Op,
        cost: u64,
    ) -> paceline_store::StoreFuture<'a, Result<paceline_store::Decision, paceline_store::Error>>
    {
        self.0.decide(policy, key, op, cost)
    }

    fn decide_all<'a>(
        &'a self,
        requests: &'a [paceline_store::Request<'a>],
    ) -> paceline_store::StoreFuture<'a, Result<paceline_store::SetDecision, paceline_store::Error>>
    {
        self.0.decide_all(requests)
    }

    fn release<'a>(
        &'a self,
        policy: &'a paceline_store::Policy,
        key: &'a str,
        lease: u64,
    ) -> paceline_store::StoreFuture<'a, Result<bool, paceline_store::Error>> {
        self.0.release(policy, key, lease)
    }

    fn extend<'a>(
        &'a self,
        policy: &'a paceline_store::Policy,
        key: &'a str,
        lease: u64,
    ) -> paceline_store::StoreFuture<'a, Result<Option<Duration>, paceline_store::Error>> {
        self.0.extend(policy, key, lease)
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
    ) -> paceline_store::StoreFuture<'a, Result<(), paceline_store::Error>> {
        self.0.reset(key)
    }

    fn sleep(&self, duration: Duration) -> paceline_store::Sleep {
        self.0.sleep(duration)
    }

    fn is_remote(&self) -> bool {
        true
    }
}
