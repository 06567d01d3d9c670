//! Failure handling against private `redis-server` processes that the tests kill, restart
//! and pause: each failure policy behaves as documented, no call hangs, a failure is never
//! reported as a rejection, and service resumes when Redis is back. Also: idle keys leave
//! nothing behind in Redis.
//!
//! Waiting here is only ever for a condition (a restarted server answering, Redis expiring
//! keys), polled with a generous deadline; no test asserts how long anything took.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use paceline_store::{redis::RedisStore, FailurePolicy};
use paceline_store::{Error, Fallback, Limiter, StoreErrorKind};
use paceline_testkit::RedisServer;

const RESPONSE_TIMEOUT: Duration = Duration::from_millis(300);

/// Far beyond any legitimate wait: reaching it means a call hung.
const HANG: Duration = Duration::from_secs(10);

/// The tests' store settings: short timeouts, no failure backoff.
fn builder(
    server: &RedisServer,
    failure: FailurePolicy,
) -> paceline_store::redis::RedisStoreBuilder {
    RedisStore::builder(server.url(), failure)
        .response_timeout(RESPONSE_TIMEOUT)
        .connect_timeout(RESPONSE_TIMEOUT)
        .failure_backoff(Duration::ZERO)
}

async fn store(server: &RedisServer, failure: FailurePolicy) -> RedisStore {
    builder(server, failure)
        .connect()
        .await
        .expect("connect to the private Redis")
}

/// Awaits `f`, failing the test if it hangs.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG, f)
        .await
        .expect("a store call hung instead of failing within its timeout")
}

/// Polls `limiter` until Redis answers again (not a fallback), failing after a deadline.
async fn until_redis_answers(limiter: &Limiter<RedisStore>, key: &str) -> paceline_store::Decision {
    for _ in 0..400 {
        if let Ok(d) = bounded(limiter.peek(key, 1)).await {
            if d.fallback.is_none() {
                return d;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the store did not resume after Redis restarted");
}

fn limiter(store: RedisStore) -> Limiter<RedisStore> {
    Limiter::with_store(
        "gcra:rate=1/h,burst=2".parse().expect("valid spec"),
        Arc::new(store),
    )
}

#[tokio::test]
async fn fail_closed_returns_a_store_error_and_resumes_after_a_restart() {
    let mut server = RedisServer::start().expect("redis-server");
    let limiter = limiter(store(&server, FailurePolicy::FailClosed).await);
    assert!(limiter.limit("k", 1).await.expect("Redis is up").allowed);
    // The same Lua as a script: a restarted server has forgotten it too (NOSCRIPT).
    let scripts = RedisStore::builder(server.url(), FailurePolicy::FailClosed)
        .response_timeout(RESPONSE_TIMEOUT)
        .failure_backoff(Duration::ZERO)
        .scripts_only()
        .connect()
        .await
        .expect("connect");
    let scripts = self::limiter(scripts);
    assert!(scripts.limit("s", 1).await.expect("Redis is up").allowed);

    server.kill();
    for _ in 0..3 {
        match bounded(limiter.limit("k", 1)).await {
            Err(Error::Store(e)) => assert!(
                matches!(
                    e.kind(),
                    StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                ),
                "{e}"
            ),
            other => panic!("a dead Redis must be a store error, got {other:?}"),
        }
    }

    server.restart().expect("restart");
    // Nothing is persisted: the key is new again, with its whole burst.
    let d = until_redis_answers(&limiter, "k").await;
    assert_eq!(d.remaining, 2);
    assert!(limiter.limit("k", 1).await.expect("Redis is back").allowed);
    let d = until_redis_answers(&scripts, "s").await;
    assert_eq!(d.remaining, 2, "the script was loaded again");
}

#[tokio::test]
async fn fail_open_admits_flagged_while_redis_is_down() {
    let mut server = RedisServer::start().expect("redis-server");
    let limiter = limiter(store(&server, FailurePolicy::FailOpen).await);
    for _ in 0..2 {
        assert!(limiter.limit("k", 1).await.expect("Redis is up").allowed);
    }
    let limited = limiter.limit("k", 1).await.expect("Redis is up");
    assert!(!limited.allowed && limited.fallback.is_none());

    server.kill();
    for _ in 0..5 {
        let d = bounded(limiter.limit("k", 1))
            .await
            .expect("fail_open never errs");
        assert!(d.allowed && d.delay.is_zero());
        assert_eq!(d.fallback, Some(Fallback::FailOpen));
    }

    server.restart().expect("restart");
    until_redis_answers(&limiter, "k").await;
    let d = limiter.limit("k", 1).await.expect("Redis is back");
    assert_eq!(d.fallback, None);
}

#[tokio::test]
async fn local_enforces_the_policy_in_process_until_redis_is_back() {
    let mut server = RedisServer::start().expect("redis-server");
    let limiter = limiter(store(&server, FailurePolicy::Local).await);
    assert!(limiter.limit("k", 1).await.expect("Redis is up").allowed);

    server.kill();
    // The local stand-in starts from an idle key and enforces the same burst of 2.
    let outcomes: Vec<(bool, Option<Fallback>)> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let d = bounded(limiter.limit("k", 1))
                .await
                .expect("local never errs");
            v.push((d.allowed, d.fallback));
        }
        v
    };
    assert_eq!(
        outcomes,
        [
            (true, Some(Fallback::Local)),
            (true, Some(Fallback::Local)),
            (false, Some(Fallback::Local)),
        ]
    );

    server.restart().expect("restart");
    let d = until_redis_answers(&limiter, "k").await;
    assert_eq!(
        (d.remaining, d.fallback),
        (2, None),
        "back on Redis's (fresh) state"
    );

    // A second outage starts the stand-in from idle keys again, not from the first
    // outage's counts (the 1-hour window would otherwise still be full).
    server.kill();
    let d = bounded(limiter.limit("k", 1))
        .await
        .expect("local never errs");
    assert_eq!((d.allowed, d.fallback), (true, Some(Fallback::Local)));
    assert_eq!(d.remaining, 1);
}

#[tokio::test]
async fn in_a_cluster_only_the_failed_node_s_keys_fall_back() {
    let mut cluster = paceline_testkit::RedisCluster::start().expect("a 3-primary cluster");
    let store = RedisStore::builder(cluster.url(), FailurePolicy::FailOpen)
        .response_timeout(RESPONSE_TIMEOUT)
        .connect_timeout(RESPONSE_TIMEOUT)
        .failure_backoff(Duration::from_secs(3600))
        .connect()
        .await
        .expect("connect to the cluster");
    let limiter = limiter(store);
    // Keys spread over the three nodes.
    let keys: Vec<String> = (0..60).map(|i| format!("key{i}")).collect();
    for key in &keys {
        let d = limiter.limit(key, 1).await.expect("the cluster is up");
        assert_eq!(d.fallback, None);
    }
    cluster.kill_node(0);
    let mut fell_back = 0;
    let mut answered = 0;
    for key in &keys {
        let d = bounded(limiter.limit(key, 1))
            .await
            .expect("fail_open never errs");
        match d.fallback {
            Some(Fallback::FailOpen) => fell_back += 1,
            None => {
                answered += 1;
                assert_eq!(
                    d.remaining, 0,
                    "{key}: the healthy nodes still hold the state"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(fell_back > 0, "the dead node's keys fall back");
    assert!(
        answered > 0,
        "the other nodes' keys are still decided by Redis"
    );
}

#[tokio::test]
async fn a_paused_redis_times_out_instead_of_hanging() {
    let server = RedisServer::start().expect("redis-server");
    let closed = limiter(store(&server, FailurePolicy::FailClosed).await);
    let open = limiter(store(&server, FailurePolicy::FailOpen).await);
    assert!(closed.limit("k", 1).await.expect("Redis is up").allowed);

    server.pause();
    let result = bounded(closed.limit("k", 1)).await;
    let open_result = bounded(open.limit("k", 1)).await;
    server.resume();

    match result {
        Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
        other => panic!("a frozen Redis must time out, got {other:?}"),
    }
    let d = open_result.expect("fail_open never errs");
    assert_eq!(d.fallback, Some(Fallback::FailOpen));

    // The state from before the pause is intact. The requests that timed out had been sent:
    // Redis may apply them when it resumes (as documented), so they may have used the last
    // cell, but nothing was lost or refilled.
    let d = until_redis_answers(&closed, "k").await;
    assert!(d.remaining <= 1, "{d:?}");
    assert!(d.reset_after > Duration::from_secs(3000), "{d:?}");
}

#[tokio::test]
async fn the_failure_backoff_answers_at_once_and_quotes_the_failure() {
    let mut server = RedisServer::start().expect("redis-server");
    let store = RedisStore::builder(server.url(), FailurePolicy::FailClosed)
        .response_timeout(RESPONSE_TIMEOUT)
        .failure_backoff(Duration::from_secs(3600))
        .connect()
        .await
        .expect("connect");
    let limiter = limiter(store);
    server.kill();
    let first = bounded(limiter.limit("k", 1)).await.unwrap_err();
    server.restart().expect("restart");
    // Redis is back, but within the backoff the store does not try it.
    let second = bounded(limiter.limit("k", 1)).await.unwrap_err();
    let (Error::Store(first), Error::Store(second)) = (first, second) else {
        panic!("both failures are store errors");
    };
    assert_eq!(second.kind(), first.kind());
    assert!(second.message().contains("failure backoff"), "{second}");
    assert!(
        second.message().contains(first.message()),
        "{second} quotes {first}"
    );
}

#[tokio::test]
async fn idle_keys_expire_and_leave_nothing_behind() {
    let server = RedisServer::start().expect("redis-server");
    let store = Arc::new(store(&server, FailurePolicy::FailClosed).await);
    let specs = [
        "pacer:rate=20/s,max_burst=2",
        "gcra:rate=20/s,burst=3",
        "fixed_window:limit=3,window=150ms",
        "exec_evenly:points=3,duration=150ms",
        "sliding_log:limit=3,window=150ms",
        "sliding_window:limit=3,window=150ms",
        "smooth_bursty:rate=20/s",
        "smooth_warming_up:rate=20/s,warmup=150ms",
        // Intervals below the resolution of the server's time in a double: a state is idle
        // as soon as it is written.
        "gcra:rate=1000000000/s",
        "pacer:rate=1000000000/s",
    ];
    let mut longest = Duration::ZERO;
    for spec in specs {
        let limiter = Limiter::with_store(spec.parse().expect("valid spec"), Arc::clone(&store));
        for key in ["a", "b"] {
            let key = format!("{spec}:{key}");
            for _ in 0..2 {
                let d = limiter.pace(&key, 1).await.expect("Redis is up");
                longest = longest.max(d.reset_after);
            }
            // Every key carries an expiry no later than its reset_after (or is gone).
            let pttl = server
                .command(&["PTTL", &store.redis_key(&key)])
                .expect("PTTL");
            let ms: i64 = pttl
                .trim_start_matches(':')
                .parse()
                .expect("an integer reply");
            assert!(
                ms == -2 || (ms > 0 && ms as u128 <= longest.as_millis() + 1),
                "{key}: PTTL {ms}"
            );
        }
    }
    assert!(
        longest < Duration::from_secs(2),
        "the specs idle quickly: {longest:?}"
    );
    for _ in 0..400 {
        if server.dbsize().expect("DBSIZE") == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "keys were left behind after their reset_after: DBSIZE = {:?}",
        server.dbsize()
    );
}

/// A batch larger than one call (`MAX_DECISIONS_PER_CALL`) on a frozen Redis: the response
/// timeout bounds the whole batch, not each of its calls. Measured on tokio's clock, paused
/// once the store is connected: while every task waits on the frozen socket, that clock
/// jumps straight to the next timer, so the time the batch took is exactly the sum of the
/// timeouts it waited through, whatever the machine's speed.
#[tokio::test(flavor = "current_thread")]
async fn the_response_timeout_bounds_a_whole_batch_on_a_frozen_redis() {
    use paceline_store::redis::MAX_DECISIONS_PER_CALL;
    use paceline_store::{Op, Policy, Request};

    let server = RedisServer::start().expect("redis-server");
    let store = store(&server, FailurePolicy::FailClosed).await;
    let policy: Policy = "gcra:rate=1/h,burst=2".parse().expect("valid spec");
    let keys: Vec<String> = (0..MAX_DECISIONS_PER_CALL * 3)
        .map(|i| format!("k{i}"))
        .collect();
    let requests: Vec<Request> = keys
        .iter()
        .map(|key| Request::new(&policy, key, Op::Limit, 1))
        .collect();

    server.pause();
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    let results = store.decide_batch(&requests).await;
    let took = started.elapsed();
    tokio::time::resume();
    server.resume();

    assert_eq!(results.len(), requests.len());
    for result in &results {
        match result {
            Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
            other => panic!("a frozen Redis must time out, got {other:?}"),
        }
    }
    // Three calls' worth of decisions, one timeout for them all (tokio's timers round up
    // to the millisecond); a timeout per call would have taken three.
    assert!(
        took >= RESPONSE_TIMEOUT && took <= RESPONSE_TIMEOUT + Duration::from_millis(5),
        "virtual time the batch waited: {took:?}"
    );
}

/// A store that auto-batches (no linger), on an injected clock, for the tests below.
async fn batching_store(
    server: &RedisServer,
    clock: Arc<paceline_store::ManualClock>,
) -> RedisStore {
    builder(server, FailurePolicy::FailClosed)
        .clock(clock)
        .auto_batch(Duration::ZERO)
        .connect()
        .await
        .expect("connect to the private Redis")
}

type Answer = (Result<paceline_store::Decision, Error>, Duration);

/// A store that auto-batches on a Redis frozen since `started` (tokio's clock paused then),
/// its injected clock, and the policy the calls use.
struct Frozen {
    clock: Arc<paceline_store::ManualClock>,
    store: RedisStore,
    policy: paceline_store::Policy,
    started: tokio::time::Instant,
    /// Last, so that it outlives the store when dropped.
    server: RedisServer,
}

impl Frozen {
    async fn start() -> Frozen {
        let server = RedisServer::start().expect("redis-server");
        let clock = Arc::new(paceline_store::ManualClock::new(1_000_000));
        let store = batching_store(&server, clock.clone()).await;
        server.pause();
        tokio::time::pause();
        Frozen {
            clock,
            store,
            policy: "gcra:rate=1/h,burst=2".parse().expect("valid spec"),
            started: tokio::time::Instant::now(),
            server,
        }
    }

    /// `queued_call` on this store.
    fn call(&self, key: &str) -> std::pin::Pin<Box<dyn Future<Output = Answer> + '_>> {
        queued_call(&self.store, &self.policy, key, self.started)
    }

    /// Redis and tokio's clock run again.
    fn thaw(&self) {
        tokio::time::resume();
        self.server.resume();
    }
}

/// A `limit` of 1 on `key`, polled once (which reads the clock and queues the request),
/// answering its outcome and when it came, on tokio's clock, since `started`.
fn queued_call<'a>(
    store: &'a RedisStore,
    policy: &'a paceline_store::Policy,
    key: &str,
    started: tokio::time::Instant,
) -> std::pin::Pin<Box<dyn Future<Output = Answer> + 'a>> {
    use futures_util::FutureExt;
    let key = key.to_string();
    let mut call: std::pin::Pin<Box<dyn Future<Output = Answer> + 'a>> = Box::pin(async move {
        let result = store
            .decide(policy, &key, paceline_store::Op::Limit, 1)
            .await;
        (result, started.elapsed())
    });
    assert!((&mut call).now_or_never().is_none(), "Redis is frozen");
    call
}

/// Each answer a timeout; when each came.
fn timeouts(answers: Vec<Answer>) -> Vec<Duration> {
    answers
        .into_iter()
        .map(|(result, took)| {
            match result {
                Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
                other => panic!("a frozen Redis must time out, got {other:?}"),
            }
            took
        })
        .collect()
}

/// `took` is `expected` as tokio's timers make it (they round up to the millisecond).
fn about(took: Duration, expected: Duration) -> bool {
    took >= expected && took <= expected + Duration::from_millis(5)
}

/// With auto-batching, every call is answered within the queue's bound (twice the response
/// timeout, plus the linger), whatever waits ahead of it. One batch here holds requests made
/// at three injected times, which go to Redis as three calls, one after another. On a frozen
/// Redis the first call times out after one response timeout and the second after two; by
/// then the third's callers have waited their bound, so they are answered with a timeout at
/// once, their request never sent (a third timeout would have made them wait three, and
/// sent it). Measured on tokio's paused clock, as the test above.
#[tokio::test(flavor = "current_thread")]
async fn the_auto_batching_queue_answers_every_call_within_its_bound_on_a_frozen_redis() {
    use paceline_store::Op;

    let frozen = Frozen::start().await;
    // This task does not yield between the calls: the batching task finds all three queued.
    let mut calls = Vec::new();
    for key in ["k0", "k1", "k2"] {
        frozen.clock.advance(Duration::from_secs(1));
        calls.push(frozen.call(key));
    }
    let took = timeouts(futures_util::future::join_all(calls).await);
    frozen.thaw();
    let (store, policy) = (&frozen.store, &frozen.policy);

    let bound = RESPONSE_TIMEOUT * 2;
    assert!(about(took[0], RESPONSE_TIMEOUT), "{took:?}");
    assert!(about(took[1], bound), "{took:?}");
    assert!(about(took[2], bound), "{took:?}");
    // The first two were sent while Redis was frozen (into its socket) and it applies them
    // once it resumes; the third never reached it: its key is untouched.
    let peek = |key: &'static str| async move {
        for _ in 0..400 {
            if let Ok(d) = bounded(store.decide(policy, key, Op::Peek, 1)).await {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the store did not resume after Redis did");
    };
    let mut applied = false;
    for _ in 0..400 {
        if peek("k0").await.remaining == 1 {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        applied,
        "the first call, sent while Redis was frozen, is applied when it resumes"
    );
    assert_eq!(
        peek("k2").await.remaining,
        2,
        "the third call was never sent"
    );
}

/// The queue's bound holds for a request queued behind batches in flight: each call of a
/// batch must end by its requests' own deadline, not only by the response timeout. Every
/// place for a batch in flight is taken at 0; request X is queued at 0 and Y at 200 ms,
/// at another injected time, so they leave together when the places free (at one response
/// timeout, 300 ms) and go to Redis as two calls. X's call times out at 600 ms (its bound),
/// and Y's must end at 800 ms, its own bound, not at 900 ms, a response timeout after it
/// was sent.
#[tokio::test(flavor = "current_thread")]
async fn a_call_of_a_batch_ends_by_its_requests_deadline_on_a_frozen_redis() {
    use paceline_store::redis::MAX_BATCHES_IN_FLIGHT;

    let frozen = Frozen::start().await;
    // One request per batch in flight: each is taken by the batching task before the next
    // is queued.
    let mut ahead = Vec::new();
    for i in 0..MAX_BATCHES_IN_FLIGHT {
        ahead.push(frozen.call(&format!("ahead{i}")));
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }
    let x = frozen.call("x");
    tokio::time::sleep(Duration::from_millis(200)).await;
    frozen.clock.advance(Duration::from_secs(1));
    let y = frozen.call("y");
    let (ahead, x, y) = tokio::join!(futures_util::future::join_all(ahead), x, y);
    frozen.thaw();

    for took in timeouts(ahead) {
        assert!(about(took, RESPONSE_TIMEOUT), "a batch in flight: {took:?}");
    }
    let took = timeouts(vec![x, y]);
    assert!(about(took[0], RESPONSE_TIMEOUT * 2), "x: {took:?}");
    assert!(
        about(took[1], Duration::from_millis(200) + RESPONSE_TIMEOUT * 2),
        "y: {took:?}"
    );
}

#[tokio::test]
async fn leases_taken_from_the_local_stand_in_are_given_back_to_it() {
    use paceline_store::{Op, Policy};
    let mut server = RedisServer::start().expect("redis-server");
    let store = store(&server, FailurePolicy::Local).await;
    let policy: Policy = "concurrency:limit=1,lease=1h".parse().expect("valid spec");
    server.kill();
    // Redis is down: the stand-in hands out the only place.
    let first = bounded(store.decide(&policy, "db", Op::Limit, 1))
        .await
        .expect("local never errs");
    assert_eq!(
        (first.allowed, first.fallback),
        (true, Some(Fallback::Local))
    );
    let full = bounded(store.decide(&policy, "db", Op::Limit, 1))
        .await
        .expect("local never errs");
    assert!(!full.allowed);
    // Given back although Redis cannot be asked: the stand-in held it.
    let lease = first.lease.expect("a lease");
    let extended = bounded(store.extend(&policy, "db", lease)).await;
    assert_eq!(
        extended.expect("renewed locally"),
        Some(Duration::from_secs(3600))
    );
    assert!(bounded(store.release(&policy, "db", lease))
        .await
        .expect("released locally"));
    let again = bounded(store.decide(&policy, "db", Op::Limit, 1))
        .await
        .expect("local never errs");
    assert!(again.allowed, "the place came back");
    // The stand-in's lease ids are its own: one of Redis's goes to Redis, which is down.
    assert_ne!(lease & (1 << 62), 0, "marked as the stand-in's");
    assert!(bounded(store.release(&policy, "db", lease & !(1 << 62)))
        .await
        .is_err());
}

/// The first decision after Redis restarted (the store idle meanwhile, its connection dead
/// since the old server died) is answered by the new server: the store learns the server
/// was restarted (a new run id) and sends the call again on a fresh connection, rather than
/// failing it. With and without auto-batching, as functions and as a script.
#[tokio::test]
async fn the_first_decision_after_an_idle_restart_succeeds() {
    let mut server = RedisServer::start().expect("redis-server");
    let stores = [
        store(&server, FailurePolicy::FailClosed).await,
        builder(&server, FailurePolicy::FailClosed)
            .auto_batch(Duration::ZERO)
            .connect()
            .await
            .expect("connect"),
        builder(&server, FailurePolicy::FailClosed)
            .scripts_only()
            .connect()
            .await
            .expect("connect"),
    ];
    let limiters: Vec<_> = stores.into_iter().map(limiter).collect();
    for (i, limiter) in limiters.iter().enumerate() {
        let key = format!("k{i}");
        assert_eq!(limiter.limit(&key, 1).await.expect("up").remaining, 1);
    }
    server.kill();
    server.restart().expect("restart");
    for (i, limiter) in limiters.iter().enumerate() {
        let d = bounded(limiter.limit(&format!("k{i}"), 1))
            .await
            .unwrap_or_else(|e| panic!("store {i}: the first call after a restart: {e}"));
        // The restarted server holds nothing: the key is new again.
        assert_eq!((d.remaining, d.fallback), (1, None), "store {i}");
        assert!(limiter.store().outages().is_empty(), "store {i}");
    }
}

/// Calls during an outage fail (by the failure policy), and the store counts them in one
/// outage, readable while it lasts; the first decision once Redis is back is answered by
/// Redis (the connection attempt that failed while it was down is not the answer), and
/// ends the outage. On worker threads, so that the store's attempts to connect again run
/// (and fail) while Redis is down, as they would in a service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_counted_and_ends_with_the_first_decision_redis_answers() {
    let mut server = RedisServer::start().expect("redis-server");
    let limiter = limiter(store(&server, FailurePolicy::FailClosed).await);
    assert!(limiter.limit("k", 1).await.expect("up").allowed);
    assert!(limiter.store().outages().is_empty());

    server.kill();
    for _ in 0..3 {
        assert!(bounded(limiter.limit("k", 1)).await.is_err());
    }
    let outages = limiter.store().outages();
    assert_eq!(outages.len(), 1, "{outages:?}");
    assert_eq!(outages[0].node, server.url());
    assert_eq!(outages[0].failed, 3);
    assert!(!outages[0].cause.is_empty());

    server.restart().expect("restart");
    let d = bounded(limiter.limit("k", 1))
        .await
        .expect("the first call after the restart is answered by Redis");
    assert_eq!((d.remaining, d.fallback), (1, None));
    assert!(limiter.store().outages().is_empty());
}

/// A connection cut while the server lives on (here `CLIENT KILL`) may have carried a
/// decision the server applied: such a call is never sent again (the server's run id is
/// the one known before), and fails by the failure policy. The next call goes on a fresh
/// connection.
#[tokio::test]
async fn a_call_on_a_connection_cut_from_a_live_server_is_not_sent_again() {
    let server = RedisServer::start().expect("redis-server");
    let limiter = limiter(store(&server, FailurePolicy::FailClosed).await);
    assert_eq!(limiter.limit("k", 1).await.expect("up").remaining, 1);
    let killed = server
        .command(&["CLIENT", "KILL", "TYPE", "normal"])
        .expect("CLIENT KILL");
    assert_eq!(killed, ":1", "the store's one connection");
    match bounded(limiter.limit("k", 1)).await {
        Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}"),
        other => panic!("expected a store error, got {other:?}"),
    }
    let d = bounded(limiter.limit("k", 1)).await.expect("reconnected");
    // Not sent again: only this call counted.
    assert_eq!((d.remaining, d.fallback), (0, None));
}

/// Readiness of a single server: ready while it answers `PING`, unavailable (naming it)
/// while it does not.
#[tokio::test]
async fn readiness_of_a_single_server() {
    use paceline_store::redis::Readiness;
    let mut server = RedisServer::start().expect("redis-server");
    let store = store(&server, FailurePolicy::FailOpen).await;
    let health = store.health().await;
    assert_eq!((health.readiness, health.nodes), (Readiness::Ready, 1));
    server.kill();
    let health = bounded(store.health()).await;
    assert_eq!(health.readiness, Readiness::Unavailable, "{health:?}");
    assert_eq!(health.failing.len(), 1);
    assert_eq!(health.failing[0].node, server.url());
    server.restart().expect("restart");
    let health = bounded(store.health()).await;
    assert_eq!(health.readiness, Readiness::Ready, "{health:?}");
}
