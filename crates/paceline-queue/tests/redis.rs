//! The queue in Redis against the queue in memory: random sequences of every operation on
//! one virtual clock give the same answers, step by step (ids, estimates, leases, tokens,
//! outcomes, errors, counts, jobs, next events). Then what only Redis has: queues shared
//! by several handles (processes), on different slots of a cluster, and the wake-up of a
//! waiting lease by an enqueue through another handle.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, ManualClock, Policy};
use paceline_queue::{
    Failure, LeaseToken, MemoryQueue, NewJob, Queue, QueueConfig, QueueError, RedisQueue,
};
use paceline_testkit::{connect, shared_cluster, shared_server, unique_name, GatedClock};
use proptest::prelude::*;

mod common;
use common::POLICIES;

#[derive(Clone, Debug)]
enum Step {
    Enqueue {
        group: u8,
        delay_ms: u16,
        /// A not-before time, in ms from the step's time (negative: already past).
        not_before_ms: Option<i16>,
        id: Option<u8>,
        max_attempts: Option<u8>,
    },
    Batch {
        groups: Vec<u8>,
    },
    Lease {
        max_jobs: u8,
        lease_ms: Option<u16>,
    },
    Ack {
        pick: u8,
        stale: bool,
    },
    Fail {
        pick: u8,
        kind: u8,
        ms: u16,
    },
    Extend {
        pick: u8,
        ms: u16,
    },
    Advance {
        ms: u16,
    },
    Cancel {
        id: u8,
    },
    Job {
        id: u8,
    },
    Stats,
    Dead,
    RetryDead {
        all: bool,
        id: u8,
    },
    PurgeDead,
    /// Operations issued at once: on Redis they go in one combined call.
    Together {
        subs: Vec<Sub>,
    },
}

#[derive(Clone, Debug)]
enum Sub {
    Enqueue { group: u8 },
    Ack { pick: u8 },
    Lease { max_jobs: u8 },
    Fail { pick: u8 },
}

fn sub() -> impl Strategy<Value = Sub> {
    prop_oneof![
        (0u8..3).prop_map(|group| Sub::Enqueue { group }),
        any::<u8>().prop_map(|pick| Sub::Ack { pick }),
        (1u8..4).prop_map(|max_jobs| Sub::Lease { max_jobs }),
        any::<u8>().prop_map(|pick| Sub::Fail { pick }),
    ]
}

/// Runs `subs` at once on `queue` (each a future polled in order, as a caller issuing them
/// together would); answers each one's outcome as text, and the leases handed out.
async fn together(
    queue: &Queue,
    subs: &[(Sub, Option<(String, LeaseToken)>)],
) -> (Vec<String>, Vec<(String, LeaseToken)>) {
    let futures = subs.iter().map(|(sub, held)| async move {
        match (sub, held) {
            (Sub::Enqueue { group }, _) => (
                format!(
                    "{:?}",
                    queue
                        .enqueue(NewJob::new(format!("g{group}"), vec![*group]))
                        .await
                ),
                Vec::new(),
            ),
            (Sub::Ack { .. }, Some((id, token))) => {
                (format!("{:?}", queue.ack(id, token).await), Vec::new())
            }
            (Sub::Fail { .. }, Some((id, token))) => (
                format!(
                    "{:?}",
                    queue
                        .fail(
                            id,
                            token,
                            Failure::Retry {
                                error: None,
                                after: None
                            }
                        )
                        .await
                ),
                Vec::new(),
            ),
            (Sub::Lease { max_jobs }, _) => {
                let leased = queue
                    .lease("w", usize::from(*max_jobs), None, Duration::ZERO)
                    .await;
                let held = leased
                    .as_ref()
                    .map(|jobs| {
                        jobs.iter()
                            .map(|j| (j.id.clone(), j.token.clone()))
                            .collect()
                    })
                    .unwrap_or_default();
                (format!("{leased:?}"), held)
            }
            _ => (String::new(), Vec::new()),
        }
    });
    let answers = futures_util::future::join_all(futures).await;
    let mut held = Vec::new();
    let mut out = Vec::new();
    for (text, leases) in answers {
        out.push(text);
        held.extend(leases);
    }
    (out, held)
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0u8..3, prop_oneof![3 => Just(0u16), 1 => 1u16..3_000],
              prop_oneof![3 => Just(None), 1 => (-1_000i16..3_000).prop_map(Some)],
              proptest::option::of(0u8..6), proptest::option::of(1u8..4))
            .prop_map(|(group, delay_ms, not_before_ms, id, max_attempts)| Step::Enqueue {
                group, delay_ms, not_before_ms, id, max_attempts,
            }),
        1 => proptest::collection::vec(0u8..3, 1..6).prop_map(|groups| Step::Batch { groups }),
        5 => (1u8..4, proptest::option::of(1u16..3_000)).prop_map(|(max_jobs, lease_ms)| Step::Lease { max_jobs, lease_ms }),
        3 => (any::<u8>(), proptest::bool::weighted(0.1)).prop_map(|(pick, stale)| Step::Ack { pick, stale }),
        2 => (any::<u8>(), 0u8..5, 1u16..3_000).prop_map(|(pick, kind, ms)| Step::Fail { pick, kind, ms }),
        1 => (any::<u8>(), 1u16..3_000).prop_map(|(pick, ms)| Step::Extend { pick, ms }),
        5 => (1u16..2_500).prop_map(|ms| Step::Advance { ms }),
        1 => (0u8..8).prop_map(|id| Step::Cancel { id }),
        1 => (0u8..8).prop_map(|id| Step::Job { id }),
        1 => Just(Step::Stats),
        1 => Just(Step::Dead),
        1 => (any::<bool>(), 0u8..8).prop_map(|(all, id)| Step::RetryDead { all, id }),
        1 => Just(Step::PurgeDead),
        2 => proptest::collection::vec(sub(), 2..8).prop_map(|subs| Step::Together { subs }),
    ]
}

/// Ids the steps name: a producer's (`job-N`) or a generated one (`N`).
fn id_of(n: u8) -> String {
    if n.is_multiple_of(2) {
        format!("job-{}", n / 2)
    } else {
        format!("{}", n / 2 + 1)
    }
}

/// Runs `steps` on both queues, comparing every answer.
async fn differential(spec: &str, cap: u32, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let policy: Policy = spec
        .parse()
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let mut config = QueueConfig::new(policy)
        .group_concurrency(cap)
        .max_attempts(3)
        .lease(Duration::from_millis(1_500))
        .retry_backoff(Duration::from_millis(200), Duration::from_secs(2));
    config.groups.insert(
        "g2".into(),
        "fixed_window:limit=1,window=700ms"
            .parse()
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?,
    );
    let clock = ManualClock::new(1_700_000_000_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    // One name and one signing key: both sides hand out the same tokens.
    let name = unique_name("diff");
    let store = connect(&shared_server().url()).await;
    let key = store
        .token_key(paceline_queue::token::LEASE_KEY)
        .await
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let memory = Queue::new(
        MemoryQueue::with_clock(&name, config.clone(), Arc::clone(&shared))
            .map_err(|e| TestCaseError::fail(format!("{e}")))?
            .with_token_key(key),
    );
    let redis = Queue::new(
        RedisQueue::open(store, &name, config, Some(shared))
            .await
            .map_err(|e| TestCaseError::fail(format!("{e}")))?,
    );
    // The leases handed out (the same on both sides, as checked), and those given up.
    let mut held: Vec<(String, LeaseToken)> = Vec::new();
    let mut spent: Vec<(String, LeaseToken)> = Vec::new();
    let pick = |items: &[(String, LeaseToken)], p: u8| {
        (!items.is_empty()).then(|| items[p as usize % items.len()].clone())
    };
    for (n, step) in steps.into_iter().enumerate() {
        let at = format!("step {n}: {step:?}");
        match step {
            Step::Enqueue {
                group,
                delay_ms,
                not_before_ms,
                id,
                max_attempts,
            } => {
                let mut job = NewJob::new(format!("g{group}"), vec![group, 0xff, 0])
                    .delay(Duration::from_millis(u64::from(delay_ms)));
                if let Some(d) = not_before_ms {
                    let at = clock
                        .now_micros()
                        .saturating_add_signed(i64::from(d) * 1_000);
                    job = job.not_before(std::time::UNIX_EPOCH + Duration::from_micros(at));
                }
                if let Some(id) = id {
                    job = job.id(format!("job-{id}"));
                }
                if let Some(m) = max_attempts {
                    job = job.max_attempts(u32::from(m));
                }
                let (a, b) = (memory.enqueue(job.clone()).await, redis.enqueue(job).await);
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::Batch { groups } => {
                let jobs: Vec<NewJob> = groups
                    .iter()
                    .map(|g| NewJob::new(format!("g{g}"), b"batch".to_vec()))
                    .collect();
                let (a, b) = (
                    memory.enqueue_batch(jobs.clone()).await,
                    redis.enqueue_batch(jobs).await,
                );
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::Lease { max_jobs, lease_ms } => {
                let lease = lease_ms.map(|ms| Duration::from_millis(u64::from(ms)));
                let max_jobs = usize::from(max_jobs);
                let (a, b) = (
                    memory.lease("w", max_jobs, lease, Duration::ZERO).await,
                    redis.lease("w", max_jobs, lease, Duration::ZERO).await,
                );
                if let Ok(jobs) = &a {
                    held.extend(jobs.iter().map(|j| (j.id.clone(), j.token.clone())));
                }
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::Ack { pick: p, stale } => {
                let from = if stale { &spent } else { &held };
                if let Some((id, token)) = pick(from, p) {
                    held.retain(|h| h.1 != token);
                    spent.push((id.clone(), token.clone()));
                    let (a, b) = (memory.ack(&id, &token).await, redis.ack(&id, &token).await);
                    prop_assert_eq!(a, b, "{}", at);
                }
            }
            Step::Fail { pick: p, kind, ms } => {
                if let Some((id, token)) = pick(&held, p) {
                    held.retain(|h| h.1 != token);
                    spent.push((id.clone(), token.clone()));
                    let d = Duration::from_millis(u64::from(ms));
                    let failure = match kind {
                        0 => Failure::Fatal {
                            error: Some("boom".into()),
                        },
                        1 => Failure::PauseGroup {
                            error: None,
                            pause: d,
                        },
                        2 => Failure::Retry {
                            error: Some("x".into()),
                            after: Some(d),
                        },
                        3 => Failure::Release,
                        _ => Failure::Retry {
                            error: None,
                            after: None,
                        },
                    };
                    let (a, b) = (
                        memory.fail(&id, &token, failure.clone()).await,
                        redis.fail(&id, &token, failure).await,
                    );
                    prop_assert_eq!(a, b, "{}", at);
                }
            }
            Step::Extend { pick: p, ms } => {
                if let Some((id, token)) = pick(&held, p) {
                    let d = Duration::from_millis(u64::from(ms));
                    let (a, b) = (
                        memory.extend(&id, &token, d).await,
                        redis.extend(&id, &token, d).await,
                    );
                    prop_assert_eq!(a, b, "{}", at);
                }
            }
            Step::Advance { ms } => clock.advance(Duration::from_millis(u64::from(ms))),
            Step::Cancel { id } => {
                let id = id_of(id);
                let (a, b) = (memory.cancel(&id).await, redis.cancel(&id).await);
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::Job { id } => {
                let id = id_of(id);
                let (a, b) = (memory.job(&id).await, redis.job(&id).await);
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::Stats => {
                let (a, b) = (memory.stats().await, redis.stats().await);
                prop_assert_eq!(a, b, "{}", at);
                let (a, b) = (memory.counts().await, redis.counts().await);
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::Dead => {
                let (a, b) = (memory.dead(0, 100).await, redis.dead(0, 100).await);
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::RetryDead { all, id } => {
                let ids = vec![id_of(id), id_of(id)];
                let ids = (!all).then_some(ids.as_slice());
                let (a, b) = (memory.retry_dead(ids).await, redis.retry_dead(ids).await);
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::PurgeDead => {
                let (a, b) = (memory.purge_dead().await, redis.purge_dead().await);
                prop_assert_eq!(a, b, "{}", at);
            }
            Step::Together { subs } => {
                // Each ack or fail takes a distinct lease the test holds.
                let subs: Vec<(Sub, Option<(String, LeaseToken)>)> = subs
                    .into_iter()
                    .map(|sub| {
                        let lease = match &sub {
                            Sub::Ack { pick: p } | Sub::Fail { pick: p } => {
                                let lease = pick(&held, *p);
                                if let Some(l) = &lease {
                                    held.retain(|h| h.1 != l.1);
                                    spent.push(l.clone());
                                }
                                lease
                            }
                            _ => None,
                        };
                        (sub, lease)
                    })
                    .collect();
                let (a, leased) = together(&memory, &subs).await;
                let (b, _) = together(&redis, &subs).await;
                held.extend(leased);
                prop_assert_eq!(a, b, "{}", at);
            }
        }
    }
    let (a, b) = (memory.stats().await, redis.stats().await);
    prop_assert_eq!(a, b, "the end");
    Ok(())
}

/// A handle on the Redis queue `name` at `url`, opened with `config` on `clock` (None: the
/// server's).
async fn open_at(
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
fn unsigned(jobs: &[paceline_queue::Leased]) -> Vec<paceline_queue::Leased> {
    let mut jobs = jobs.to_vec();
    for job in &mut jobs {
        job.token = LeaseToken::default();
    }
    jobs
}

/// `token` with its last digit changed: the token of no lease.
fn forged(token: &LeaseToken) -> LeaseToken {
    let mut text = token.to_string();
    let last = if text.ends_with('0') { "1" } else { "0" };
    text.replace_range(text.len() - 1.., last);
    text.parse().expect("48 hex digits")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn redis_answers_as_memory_does(
        policy in 0..POLICIES.len(),
        cap in prop_oneof![Just(0u32), 1u32..3],
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        runtime().block_on(differential(POLICIES[policy], cap, steps))?;
    }
}

/// Discord's role grants (10 per 10 s per server) through Redis on the server's clock: ids and estimates as in memory.
#[test]
fn a_group_backlog_gets_the_seed_estimates_in_redis() {
    runtime().block_on(async {
        let config = QueueConfig::new("fixed_window:limit=10,window=10s".parse().unwrap());
        let q = Queue::new(
            open_at(
                &shared_server().url(),
                &unique_name("discord"),
                config,
                None,
            )
            .await,
        );
        // One call: one time for all 25.
        let jobs = (0..25u8).map(|n| NewJob::new("guild:1", vec![n])).collect();
        let estimates: Vec<u64> = q
            .enqueue_batch(jobs)
            .await
            .into_iter()
            .map(|e| e.unwrap().estimated_start)
            .collect();
        // Windows aligned to the epoch, 10 jobs in each.
        let window = 10_000_000;
        let now = estimates[0];
        let next_window = (now / window + 1) * window;
        for (n, estimate) in estimates.iter().enumerate() {
            let expected = if n < 10 {
                now
            } else {
                next_window + (n as u64 / 10 - 1) * window
            };
            assert_eq!(*estimate, expected, "job {n}");
        }
        let leased = q.lease("w", 100, None, Duration::ZERO).await.unwrap();
        assert_eq!(leased.len(), 10, "one window's worth starts now");
    });
}

/// Two handles on one queue (two processes): one enqueues, the other's waiting lease wakes
/// at once through the queue's channel, and a job is leased by exactly one of them. The
/// producer opens the queue from the store's URL, the worker on a store it opened already
/// (behind a cache of refusals, which hands the queue the Redis store beneath it).
#[test]
fn handles_share_a_queue_and_wake_each_other() {
    runtime().block_on(async {
        let name = unique_name("shared");
        let config = QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap());
        let url = shared_server().url();
        let producer = Queue::open(&url, &name, config.clone()).await.unwrap();
        let options = paceline_store::StoreOptions::new().refusal_cache(16);
        let store = paceline_store::open(&url, &options).await.unwrap();
        let worker = Queue::with_store(&store, &name, config).await.unwrap();
        let memory = paceline_store::open("memory", &options).await.unwrap();
        match Queue::attach("memory", &name).await {
            Err(QueueError::Input(e)) => assert_eq!(e.field(), "store"),
            other => panic!("a memory queue cannot be attached to: {other:?}"),
        }
        // On a store without Redis, the queue is this process's own: it holds no job of
        // the shared one.
        let own = Queue::with_store(&memory, &name, producer.config().clone())
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let worker = worker.clone();
            async move { worker.lease("w", 1, None, Duration::from_secs(30)).await }
        });
        // Let the lease call reach its wait.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let job = producer
            .enqueue(NewJob::new("g", b"hello".to_vec()))
            .await
            .unwrap();
        let leased = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the enqueue woke the waiting lease")
            .unwrap()
            .unwrap();
        assert_eq!(leased.len(), 1);
        assert_eq!(leased[0].id, job.id);
        assert_eq!(leased[0].payload, b"hello");
        assert!(producer
            .lease("w2", 1, None, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            producer.ack(&leased[0].id, &forged(&leased[0].token)).await,
            Err(QueueError::LeaseLost { id: job.id.clone() })
        );
        worker.ack(&leased[0].id, &leased[0].token).await.unwrap();
        let stats = producer.stats().await.unwrap();
        assert_eq!((stats.totals.enqueued, stats.totals.acked), (1, 1));
        let attached = Queue::attach(&url, &name).await.unwrap();
        assert_eq!(attached.stats().await.unwrap().totals.acked, 1);
        assert_eq!(own.stats().await.unwrap().totals.enqueued, 0);
    });
}

/// A queue on a store that was given a clock keeps that clock's time, as the store's own
/// decisions do (here, for the estimate of a job's start).
#[test]
fn a_queue_on_a_store_keeps_the_stores_clock() {
    runtime().block_on(async {
        let at = 1_700_000_000_000_000;
        let clock = ManualClock::new(at);
        let options = paceline_store::StoreOptions::new().clock(Arc::new(clock.clone()));
        let store = paceline_store::open(&shared_server().url(), &options)
            .await
            .unwrap();
        let config = QueueConfig::new("gcra:rate=1/s".parse().unwrap());
        let queue = Queue::with_store(&store, &unique_name("clock"), config)
            .await
            .unwrap();
        assert_eq!(queue.now_micros(), at);
        let first = queue
            .enqueue(NewJob::new("g", b"1".to_vec()))
            .await
            .unwrap();
        let second = queue
            .enqueue(NewJob::new("g", b"2".to_vec()))
            .await
            .unwrap();
        assert_eq!(
            (first.estimated_start, second.estimated_start),
            (at, at + 1_000_000)
        );
    });
}

/// A queue name and where the cluster keeps its keys.
#[derive(Clone, Debug)]
struct Placed {
    name: String,
    slot: u16,
    /// The port of the primary that holds the slot.
    port: u16,
}

/// `per_primary` queue names for every primary of the cluster, the names first on each
/// primary among `STEM-0`, `STEM-1`, ...: where a queue's keys go is asked of the cluster
/// (the slot of its hash tag `{q:NAME}`, and the primary serving that slot), so the chosen
/// queues are on different primaries whatever the hashes, not by luck.
fn names_on_every_primary(
    cluster: &paceline_testkit::RedisCluster,
    stem: &str,
    per_primary: usize,
) -> Vec<Placed> {
    let slots = cluster.slot_map();
    let primaries = slots.primaries();
    let stem = unique_name(stem);
    let mut placed: Vec<Placed> = Vec::new();
    for n in 0..10_000 {
        let name = format!("{stem}-{n}");
        let slot = cluster.keyslot(&format!("{{q:{name}}}"));
        let port = slots.owner(slot);
        if placed.iter().filter(|p| p.port == port).count() < per_primary
            && placed.iter().all(|p| p.slot != slot)
        {
            placed.push(Placed { name, slot, port });
        }
        if placed.len() == per_primary * primaries.len() {
            break;
        }
    }
    assert_eq!(
        placed.len(),
        per_primary * primaries.len(),
        "names for every primary: {placed:?}"
    );
    placed
}

/// Checks that the queue `q` keeps its keys where `at` says: its key base hashes to the
/// slot, and its configuration key is on that slot's primary, which holds it (every other
/// node redirects there).
fn assert_keys_placed(cluster: &paceline_testkit::RedisCluster, q: &RedisQueue, at: &Placed) {
    let base = q.key_base();
    assert_eq!(base, format!("paceline:v2:{{q:{}}}:", at.name));
    assert_eq!(cluster.keyslot(&format!("{base}meta")), at.slot);
    cluster.assert_key_on(&format!("{base}config"), at.slot, at.port);
}

/// Queues on different slots and different primaries of a cluster work side by side, each
/// held to its own group limit and counting its own jobs.
#[test]
fn queues_on_different_cluster_slots_work_side_by_side() {
    runtime().block_on(async {
        let cluster = shared_cluster();
        let config = QueueConfig::new("fixed_window:limit=2,window=10s".parse().unwrap());
        // Two queues on each of the three primaries, each on a slot of its own.
        let placed = names_on_every_primary(cluster, "c", 2);
        let slots: std::collections::BTreeSet<u16> = placed.iter().map(|p| p.slot).collect();
        let ports: std::collections::BTreeSet<u16> = placed.iter().map(|p| p.port).collect();
        assert_eq!(slots.len(), 6, "{placed:?}");
        assert_eq!(ports.len(), 3, "{placed:?}");
        assert_eq!(
            ports,
            cluster.nodes().iter().map(|n| n.port()).collect(),
            "every primary holds queues"
        );
        let mut queues = Vec::new();
        for at in &placed {
            let q = open_at(&cluster.url(), &at.name, config.clone(), None).await;
            assert_keys_placed(cluster, &q, at);
            queues.push(Queue::new(q));
        }
        // Queue n gets 3 + n jobs, all with the same ids as the other queues' (ids are a
        // queue's own).
        for (n, q) in queues.iter().enumerate() {
            for j in 0..3 + n {
                let e = q
                    .enqueue(NewJob::new("g", vec![n as u8, j as u8]).id(format!("job-{j}")))
                    .await
                    .unwrap();
                assert!(e.created, "queue {n} job {j}: {e:?}");
            }
        }
        for (n, q) in queues.iter().enumerate() {
            let leased = q.lease("w", 10, None, Duration::ZERO).await.unwrap();
            assert_eq!(leased.len(), 2, "each queue's own group limit");
            for job in leased {
                assert_eq!(job.payload[0], n as u8, "queue {n} starts its own jobs");
                q.ack(&job.id, &job.token).await.unwrap();
            }
        }
        for (n, q) in queues.iter().enumerate() {
            let stats = q.stats().await.unwrap();
            assert_eq!(stats.waiting, 1 + n as u64, "queue {n}: {stats:?}");
            assert_eq!(
                (
                    stats.totals.enqueued,
                    stats.totals.started,
                    stats.totals.acked
                ),
                (3 + n as u64, 2, 2),
                "queue {n}: {stats:?}"
            );
        }
    });
}

/// One queue of the cluster test below: a worker's handle (on the gated clock) and a
/// producer's (another process's, on the same time).
struct ClusterQueue {
    at: Placed,
    worker: Queue,
    producer: Queue,
}

/// On a Redis Cluster, one queue on each primary, side by side on one virtual clock: a
/// worker waiting in a lease (30 s) is woken by an enqueue through another handle (the
/// message crosses the cluster from the queue's primary to the node the worker subscribed
/// on) and gets the job; a lease runs out and the job goes to another worker, the old token
/// refused; a failure is retried after its delay; a group pause holds that group only; a
/// fatal failure lands in the dead set, which lists it and gives it back by id and
/// wholesale. Each queue's counts and totals are its own.
#[test]
fn queues_on_every_cluster_primary_wake_fail_pause_expire_and_keep_their_dead() {
    use paceline_queue::{FailOutcome, JobState};
    runtime().block_on(async {
        let cluster = shared_cluster();
        let url = cluster.url();
        let placed = names_on_every_primary(cluster, "life", 1);
        let ports: std::collections::BTreeSet<u16> = placed.iter().map(|p| p.port).collect();
        assert_eq!(ports.len(), 3, "{placed:?}");
        let start = 1_700_000_000_000_000;
        let time = ManualClock::new(start);
        let gated = GatedClock::new(time.clone());
        let config = QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap())
            .max_attempts(3)
            .lease(Duration::from_secs(10));
        let mut queues = Vec::new();
        for at in placed {
            let worker = open_at(
                &url,
                &at.name,
                config.clone(),
                Some(Arc::new(gated.clone())),
            )
            .await;
            assert_keys_placed(cluster, &worker, &at);
            let producer =
                open_at(&url, &at.name, config.clone(), Some(Arc::new(time.clone()))).await;
            queues.push(ClusterQueue {
                at,
                worker: Queue::new(worker),
                producer: Queue::new(producer),
            });
        }
        let subscribed_on = cluster.nodes()[0].port();
        assert!(
            queues.iter().any(|q| q.at.port != subscribed_on),
            "some queue publishes on another node than the one subscribed on"
        );

        // A waiting worker woken by another handle's enqueue.
        for (n, q) in queues.iter().enumerate() {
            let begun = gated.sleeps();
            let waiting = tokio::spawn({
                let worker = q.worker.clone();
                async move { worker.lease("w", 1, None, Duration::from_secs(30)).await }
            });
            // The lease found nothing and waits (its clock never ends the wait).
            gated.sleeps_begun(begun + 1).await;
            assert!(
                !waiting.is_finished(),
                "{}: nothing to lease yet",
                q.at.name
            );
            let job = q
                .producer
                .enqueue(NewJob::new("g", format!("wake {n}").into_bytes()).id("wake"))
                .await
                .unwrap();
            assert_eq!((job.state, job.created), (JobState::Waiting, true));
            let leased = tokio::time::timeout(Duration::from_secs(20), waiting)
                .await
                .expect("the enqueue woke the waiting lease")
                .unwrap()
                .unwrap();
            assert_eq!(leased.len(), 1, "{}", q.at.name);
            assert_eq!(leased[0].id, "wake");
            assert_eq!(leased[0].payload, format!("wake {n}").into_bytes());
            assert_eq!(leased[0].attempt, 1);
            q.worker.ack("wake", &leased[0].token).await.unwrap();
        }

        // A lease runs out: the job goes to the next worker, the first one's token is spent.
        let mut first = Vec::new();
        for q in &queues {
            q.producer
                .enqueue(NewJob::new("g", b"slow".to_vec()).id("slow"))
                .await
                .unwrap();
            let leased = q.worker.lease("w1", 1, None, Duration::ZERO).await.unwrap();
            assert_eq!((leased[0].id.as_str(), leased[0].attempt), ("slow", 1));
            assert_eq!(leased[0].lease_expires, time.now_micros() + 10_000_000);
            first.push(leased[0].token.clone());
        }
        time.advance(Duration::from_secs(10));
        for (q, spent) in queues.iter().zip(first) {
            let again = q
                .producer
                .lease("w2", 1, None, Duration::ZERO)
                .await
                .unwrap();
            assert_eq!(again.len(), 1, "{}", q.at.name);
            assert_eq!((again[0].id.as_str(), again[0].attempt), ("slow", 2));
            assert_ne!(again[0].token, spent);
            assert_eq!(
                q.worker.ack("slow", &spent).await,
                Err(QueueError::LeaseLost { id: "slow".into() })
            );
            let info = q.worker.job("slow").await.unwrap().expect("the job");
            assert_eq!(
                (info.state, info.worker.as_deref()),
                (JobState::Active, Some("w2"))
            );
            q.producer.ack("slow", &again[0].token).await.unwrap();
        }

        // A failure retried after its delay.
        for q in &queues {
            q.producer
                .enqueue(NewJob::new("g", b"flaky".to_vec()).id("flaky"))
                .await
                .unwrap();
            let leased = q.worker.lease("w", 1, None, Duration::ZERO).await.unwrap();
            let retry = Failure::Retry {
                error: Some("flaky once".into()),
                after: Some(Duration::from_secs(2)),
            };
            assert_eq!(
                q.worker.fail("flaky", &leased[0].token, retry).await,
                Ok(FailOutcome::Retrying {
                    at: time.now_micros() + 2_000_000
                })
            );
            let info = q.worker.job("flaky").await.unwrap().expect("the job");
            assert_eq!(
                (info.state, info.last_error.as_deref()),
                (JobState::Scheduled, Some("flaky once"))
            );
            assert_eq!(q.worker.counts().await.unwrap().scheduled, 1);
            assert!(q
                .worker
                .lease("w", 1, None, Duration::ZERO)
                .await
                .unwrap()
                .is_empty());
        }
        time.advance(Duration::from_secs(2));
        for q in &queues {
            let leased = q.worker.lease("w", 1, None, Duration::ZERO).await.unwrap();
            assert_eq!(leased.len(), 1, "{}", q.at.name);
            assert_eq!((leased[0].id.as_str(), leased[0].attempt), ("flaky", 2));
            q.worker.ack("flaky", &leased[0].token).await.unwrap();
        }

        // A group paused: only the other group runs until the pause ends.
        for q in &queues {
            for id in ["a", "b"] {
                q.producer
                    .enqueue(NewJob::new("api", id.as_bytes().to_vec()).id(id))
                    .await
                    .unwrap();
            }
            let leased = q.worker.lease("w", 1, None, Duration::ZERO).await.unwrap();
            assert_eq!(leased[0].id, "a");
            q.producer
                .enqueue(NewJob::new("other", b"c".to_vec()).id("c"))
                .await
                .unwrap();
            let pause = Failure::PauseGroup {
                error: Some("429".into()),
                pause: Duration::from_secs(5),
            };
            assert_eq!(
                q.worker.fail("a", &leased[0].token, pause).await,
                Ok(FailOutcome::Paused {
                    until: time.now_micros() + 5_000_000
                })
            );
            let during = q.worker.lease("w", 10, None, Duration::ZERO).await.unwrap();
            let ids: Vec<&str> = during.iter().map(|j| j.id.as_str()).collect();
            assert_eq!(ids, ["c"], "{}", q.at.name);
            q.worker.ack("c", &during[0].token).await.unwrap();
            let stats = q.worker.stats().await.unwrap();
            let api = stats.groups.iter().find(|g| g.group == "api").unwrap();
            assert_eq!((api.waiting, api.active), (2, 0), "{stats:?}");
        }
        time.advance(Duration::from_secs(5));
        for q in &queues {
            let after = q.worker.lease("w", 10, None, Duration::ZERO).await.unwrap();
            let ids: Vec<(&str, u32)> = after.iter().map(|j| (j.id.as_str(), j.attempt)).collect();
            assert_eq!(ids, [("a", 1), ("b", 1)], "a pause is no attempt");
            for job in &after {
                q.worker.ack(&job.id, &job.token).await.unwrap();
            }
        }

        // A fatal failure: dead, listed, retried by id, dead again, retried wholesale.
        for q in &queues {
            q.producer
                .enqueue(NewJob::new("g", b"doomed".to_vec()).id("doomed"))
                .await
                .unwrap();
            for round in 0..2 {
                let leased = q.worker.lease("w", 1, None, Duration::ZERO).await.unwrap();
                assert_eq!((leased[0].id.as_str(), leased[0].attempt), ("doomed", 1));
                let fatal = Failure::Fatal {
                    error: Some(format!("bad payload {round}")),
                };
                assert_eq!(
                    q.worker.fail("doomed", &leased[0].token, fatal).await,
                    Ok(FailOutcome::Dead)
                );
                let dead = q.producer.dead(0, 10).await.unwrap();
                assert_eq!(dead.len(), 1, "{}: {dead:?}", q.at.name);
                assert_eq!(
                    (
                        dead[0].id.as_str(),
                        dead[0].group.as_str(),
                        dead[0].state,
                        dead[0].last_error.clone()
                    ),
                    (
                        "doomed",
                        "g",
                        JobState::Dead,
                        Some(format!("bad payload {round}"))
                    )
                );
                assert_eq!(dead[0].payload, b"doomed");
                assert_eq!(q.producer.counts().await.unwrap().dead, 1);
                let ids = ["doomed".to_string()];
                let retried = if round == 0 {
                    q.producer.retry_dead(Some(&ids)).await
                } else {
                    q.producer.retry_dead(None).await
                };
                assert_eq!(retried, Ok(1));
                assert_eq!(q.producer.dead(0, 10).await, Ok(Vec::new()));
                let counts = q.producer.counts().await.unwrap();
                assert_eq!((counts.dead, counts.waiting), (0, 1));
            }
            let leased = q.worker.lease("w", 1, None, Duration::ZERO).await.unwrap();
            assert_eq!(leased[0].id, "doomed");
            q.worker.ack("doomed", &leased[0].token).await.unwrap();
        }

        // Each queue's own counts: queue n is left with n + 1 jobs waiting, the rest done.
        for (n, q) in queues.iter().enumerate() {
            let jobs = (0..=n)
                .map(|j| NewJob::new("left", vec![j as u8]))
                .collect();
            for e in q.producer.enqueue_batch(jobs).await {
                e.unwrap();
            }
        }
        for (n, q) in queues.iter().enumerate() {
            let stats = q.worker.stats().await.unwrap();
            assert_eq!(
                (stats.scheduled, stats.waiting, stats.active, stats.dead),
                (0, n as u64 + 1, 0, 0),
                "{}: {stats:?}",
                q.at.name
            );
            let t = stats.totals;
            assert_eq!(
                (t.enqueued, t.started, t.acked),
                // wake, slow, flaky, a, b, c, doomed and the jobs left; slow, flaky and a
                // started once more, doomed twice more.
                (7 + n as u64 + 1, 7 + 3 + 2, 7),
                "{}: {t:?}",
                q.at.name
            );
            assert_eq!(
                (t.failed, t.retried, t.dead, t.lease_expiries, t.pauses),
                (3, 1, 2, 1, 1),
                "{}: {t:?}",
                q.at.name
            );
        }
    });
}

/// Redis killed (SIGKILL) and restarted mid-run with its append-only file synced at every
/// write: what was acknowledged stays acknowledged, leases and their tokens survive, the
/// handles reconnect on their own (their calls fail while Redis is down), and every job is
/// done once.
#[test]
fn a_redis_restart_with_persistence_loses_nothing_acknowledged() {
    let mut server = paceline_testkit::RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])
    .expect("redis-server starts");
    runtime().block_on(async {
        let name = unique_name("restart");
        let config = QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap())
            .lease(Duration::from_secs(60));
        let q = Queue::new(open_at(&server.url(), &name, config.clone(), None).await);
        let jobs = (0..20u8)
            .map(|n| NewJob::new(format!("g{}", n % 2), vec![n]).id(format!("job-{n}")))
            .collect();
        for e in q.enqueue_batch(jobs).await {
            e.unwrap();
        }
        let leased = q.lease("w", 10, None, Duration::ZERO).await.unwrap();
        assert_eq!(leased.len(), 10);
        for job in &leased[..5] {
            q.ack(&job.id, &job.token).await.unwrap();
        }
        server.restart().expect("redis-server restarts");
        // Calls fail until the connection is back; then the queue is as it was.
        let mut stats = None;
        for _ in 0..200 {
            match q.stats().await {
                Ok(s) => {
                    stats = Some(s);
                    break;
                }
                Err(QueueError::Store(_)) => tokio::time::sleep(Duration::from_millis(25)).await,
                Err(e) => panic!("{e}"),
            }
        }
        let stats = stats.expect("the queue answers after the restart");
        assert_eq!(
            (stats.totals.acked, stats.active, stats.waiting),
            (5, 5, 10),
            "{stats:?}"
        );
        for job in &leased[..5] {
            assert_eq!(q.job(&job.id).await.unwrap(), None, "acked before: gone");
            assert_eq!(
                q.ack(&job.id, &job.token).await,
                Ok(()),
                "acknowledged already: a repeat answers as the first did"
            );
        }
        // The live leases survived with their tokens.
        for job in &leased[5..] {
            q.ack(&job.id, &job.token).await.unwrap();
        }
        // A new handle after the restart, and the rest of the jobs.
        let other = Queue::new(open_at(&server.url(), &name, config, None).await);
        let rest = other.lease("w2", 100, None, Duration::ZERO).await.unwrap();
        assert_eq!(rest.len(), 10);
        for job in rest {
            other.ack(&job.id, &job.token).await.unwrap();
        }
        let stats = q.stats().await.unwrap();
        assert_eq!(
            (stats.totals.acked, stats.totals.started),
            (20, 20),
            "{stats:?}"
        );
        assert_eq!(
            stats.waiting + stats.active + stats.scheduled + stats.dead,
            0
        );
    });
}

/// Redis killed (SIGKILL) and restarted while a worker is busy, so that calls are in flight
/// when it dies, with its append-only file synced at every write: no acknowledgement that
/// was answered `Ok` is lost (such a job is never leased again, nor acknowledged twice), and
/// once the leases the crash left run out (on the store's virtual clock) every job ends
/// acknowledged, each extra start a redelivery after an expired lease.
#[test]
fn a_redis_killed_mid_run_loses_no_answered_acknowledgement() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    const JOBS: usize = 3_000;
    let mut server = paceline_testkit::RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])
    .expect("redis-server starts");
    // The worker runs on its own threads while this one kills and restarts Redis.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let clock = ManualClock::new(1_700_000_000_000_000);
    let options = paceline_store::StoreOptions::new().clock(Arc::new(clock.clone()));
    let lease = Duration::from_secs(60);
    let q = runtime.block_on(async {
        let store = paceline_store::open(&server.url(), &options).await.unwrap();
        let config =
            QueueConfig::new("gcra:rate=1000000/s,burst=1000000".parse().unwrap()).lease(lease);
        let q = Queue::with_store(&store, &unique_name("killed"), config)
            .await
            .unwrap();
        for chunk in 0..JOBS / 500 {
            let jobs = (chunk * 500..(chunk + 1) * 500)
                .map(|n| NewJob::new(format!("g{}", n % 4), vec![]).id(format!("job-{n}")))
                .collect();
            for e in q.enqueue_batch(jobs).await {
                e.unwrap();
            }
        }
        q
    });
    // What the worker saw: the jobs whose ack was answered `Ok`, any such job leased
    // again, and the calls that failed.
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let leased_again: Arc<Mutex<Vec<String>>> = Arc::default();
    let failures = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (q, acked, leased_again, failures, stop) = (
            q.clone(),
            Arc::clone(&acked),
            Arc::clone(&leased_again),
            Arc::clone(&failures),
            Arc::clone(&stop),
        );
        runtime.spawn(async move {
            let mut done: HashSet<String> = HashSet::new();
            while !stop.load(Ordering::Relaxed) {
                let jobs = match q.lease("w", 8, None, Duration::ZERO).await {
                    Ok(jobs) => jobs,
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                        Vec::new()
                    }
                };
                if jobs.is_empty() {
                    // Nothing to start (or Redis is down): ask again shortly.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                for job in jobs {
                    if done.contains(&job.id) {
                        leased_again.lock().unwrap().push(job.id.clone());
                    }
                    match q.ack(&job.id, &job.token).await {
                        Ok(()) => {
                            done.insert(job.id.clone());
                            acked.lock().unwrap().push(job.id);
                        }
                        Err(_) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        })
    };
    let acked_count = || acked.lock().unwrap().len();
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    until("a hundred jobs acknowledged", &|| acked_count() >= 100);
    server.restart().expect("redis-server restarts");
    let before = acked_count();
    assert!(before < JOBS, "the kill came while jobs were left");
    until("more jobs acknowledged after the restart", &|| {
        acked_count() > before
    });
    // Everything the worker can start is done; what is left are the leases the crash
    // left behind (their answers lost): they run out, and the jobs come back.
    let stats = || runtime.block_on(q.stats());
    until("no job waiting", &|| {
        stats().is_ok_and(|s| s.waiting == 0 && s.scheduled == 0)
    });
    clock.advance(lease + Duration::from_secs(1));
    until("every job acknowledged", &|| {
        stats().is_ok_and(|s| s.totals.acked == JOBS as u64 && s.active == 0)
    });
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(worker).expect("the worker ends");

    let acked = acked.lock().unwrap();
    let distinct: HashSet<&String> = acked.iter().collect();
    assert_eq!(distinct.len(), acked.len(), "a job acknowledged twice");
    assert_eq!(*leased_again.lock().unwrap(), Vec::<String>::new());
    assert!(
        failures.load(Ordering::Relaxed) > 0,
        "the kill failed calls in flight"
    );
    let s = stats().unwrap();
    assert_eq!(
        (s.waiting, s.scheduled, s.active, s.dead, s.totals.acked),
        (0, 0, 0, 0, JOBS as u64),
        "{s:?}"
    );
    // Every start beyond one per job is a redelivery after a lease ran out.
    assert_eq!(
        s.totals.started - JOBS as u64,
        s.totals.lease_expiries,
        "{s:?}"
    );
}

/// One worker process of `workers_share_a_queue_and_survive_a_sigkill`: runs a `Worker`
/// over the queue named by the environment, writing a line per start to its file. Run only
/// by that test (it is ignored otherwise).
#[test]
#[ignore = "a child process of workers_share_a_queue_and_survive_a_sigkill"]
fn worker_process() {
    use std::io::Write;
    let (Ok(url), Ok(name), Ok(path)) = (
        std::env::var("PACELINE_TEST_REDIS"),
        std::env::var("PACELINE_TEST_QUEUE"),
        std::env::var("PACELINE_TEST_STARTS"),
    ) else {
        return;
    };
    let work = Duration::from_millis(
        std::env::var("PACELINE_TEST_WORK_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(40),
    );
    runtime().block_on(async {
        let q = Queue::new(
            RedisQueue::attach(connect(&url).await, &name)
                .await
                .expect("the queue exists"),
        );
        let file = std::sync::Arc::new(std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .expect("the starts file"),
        ));
        let concurrency = std::env::var("PACELINE_TEST_CONCURRENCY")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(4);
        let worker = paceline_queue::Worker::new(q).concurrency(concurrency);
        let report = worker
            .run(
                move |job| {
                    let file = std::sync::Arc::clone(&file);
                    async move {
                        let line =
                            format!("{} {} {} {}\n", job.id, job.group, job.started, job.attempt);
                        if let Ok(mut f) = file.lock() {
                            let _ = f.write_all(line.as_bytes());
                        }
                        // The job's work.
                        tokio::time::sleep(work).await;
                        Ok(())
                    }
                },
                std::future::pending::<()>(),
            )
            .await;
        panic!("the worker stopped: {report:?}");
    });
}

/// 4 worker processes on one Redis queue, one killed with SIGKILL mid-job and started
/// again: every job is acknowledged, none is lost, a job starts twice only after its lease
/// expired (and each such start is counted), and each group's starts, on the server's
/// clock, pass its policy.
#[test]
fn workers_share_a_queue_and_survive_a_sigkill() {
    use std::collections::BTreeMap;
    use std::process::{Child, Command, Stdio};
    let server = paceline_testkit::RedisServer::start().expect("redis-server starts");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let name = unique_name("sigkill");
    let spec = "fixed_window:limit=5,window=500ms";
    let policy: Policy = spec.parse().unwrap();
    let rt = runtime();
    let q = rt.block_on(async {
        let config = QueueConfig::new(policy.clone()).lease(Duration::from_millis(1_000));
        let q = Queue::new(open_at(&server.url(), &name, config, None).await);
        let jobs = (0..60u8)
            .map(|n| NewJob::new(format!("g{}", n % 3), vec![n]))
            .collect();
        for e in q.enqueue_batch(jobs).await {
            e.unwrap();
        }
        q
    });
    let spawn = |n: usize| -> Child {
        Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", "worker_process", "--ignored", "--nocapture"])
            .env("PACELINE_TEST_REDIS", server.url())
            .env("PACELINE_TEST_QUEUE", &name)
            .env(
                "PACELINE_TEST_STARTS",
                dir.path().join(format!("starts-{n}")),
            )
            // Worker 0's job hangs, so it is surely killed mid-job; it runs one job at a
            // time, so no lease call of it is in flight then, and every start it took is
            // in its file (a start whose answer died with the process would be missing
            // from the replay below).
            .env("PACELINE_TEST_WORK_MS", if n == 0 { "60000" } else { "40" })
            .env("PACELINE_TEST_CONCURRENCY", if n == 0 { "1" } else { "4" })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("a worker process")
    };
    let mut workers: Vec<Child> = (0..4).map(spawn).collect();
    let starts_of = |n: usize| {
        std::fs::read_to_string(dir.path().join(format!("starts-{n}"))).unwrap_or_default()
    };
    // Kill worker 0 once it has started a job (mid-job: its jobs hang).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while starts_of(0).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "worker 0 never started a job"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    workers[0].kill().expect("SIGKILL");
    let _ = workers[0].wait();
    workers[0] = spawn(4);
    // Wait for every job to be acknowledged.
    let stats = loop {
        let stats = rt.block_on(q.stats()).unwrap();
        if stats.totals.acked == 60 {
            break stats;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every job was acked: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    assert_eq!(
        (stats.waiting, stats.active, stats.scheduled, stats.dead),
        (0, 0, 0, 0)
    );
    // Every start, by group, from every worker's file (a line cut by the kill is dropped).
    let mut by_group: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut by_job: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for n in 0..5 {
        for line in starts_of(n).lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let [id, group, started, attempt] = parts[..] else {
                continue;
            };
            let (Ok(started), Ok(attempt)) = (started.parse::<u64>(), attempt.parse::<u32>())
            else {
                continue;
            };
            by_group.entry(group.to_string()).or_default().push(started);
            by_job.entry(id.to_string()).or_default().push(attempt);
        }
    }
    assert_eq!(by_job.len(), 60, "every job started");
    // The replay holds every start the server counted, the killed worker's included.
    let logged: usize = by_job.values().map(Vec::len).sum();
    assert_eq!(
        logged as u64, stats.totals.started,
        "every start is in the workers' files: {stats:?}"
    );
    let again: usize = by_job.values().map(|a| a.len() - 1).sum();
    assert!(again >= 1, "the killed worker's job ran again");
    assert_eq!(
        stats.totals.started - 60,
        stats.totals.lease_expiries,
        "a job starts again only after its lease expired: {stats:?}"
    );
    assert!(again as u64 <= stats.totals.lease_expiries);
    assert!(
        by_job.values().flatten().all(|&a| a >= 1),
        "attempts count from 1"
    );
    for (group, mut times) in by_group {
        times.sort_unstable();
        let mut state = None;
        for t in times {
            let d = policy
                .apply(&mut state, t, paceline_core::Op::Limit, 1)
                .unwrap();
            assert!(d.allowed, "{group} started at {t}, over {spec}");
        }
    }
}

/// A group's policy changed to another algorithm while it has a backlog: the group starts
/// afresh under the new one, exactly as the Rust core does (`QueueCore::set_config`).
#[test]
fn a_changed_algorithm_starts_the_group_afresh_as_in_memory() {
    use paceline_queue::QueueCore;
    runtime().block_on(async {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let name = unique_name("realgorithm");
        let url = shared_server().url();
        let before = QueueConfig::new("gcra:rate=2/s,burst=2".parse().unwrap());
        let after = QueueConfig::new("fixed_window:limit=3,window=10s".parse().unwrap());
        let mut core = QueueCore::new(before.clone()).unwrap();
        let first = Queue::new(open_at(&url, &name, before, Some(Arc::clone(&shared))).await);
        for n in 0..8u8 {
            let job = NewJob::new("g", vec![n]);
            let now = clock.now_micros();
            assert_eq!(first.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        let now = clock.now_micros();
        assert_eq!(
            first
                .lease("w", 5, None, Duration::ZERO)
                .await
                .map(|jobs| unsigned(&jobs)),
            core.lease(now, "w", 5, None)
        );
        // Another process opens the queue with the new policy.
        core.set_config(after.clone()).unwrap();
        let second = Queue::new(open_at(&url, &name, after, Some(Arc::clone(&shared))).await);
        for _ in 0..3 {
            clock.advance(Duration::from_millis(700));
            let now = clock.now_micros();
            let (a, b) = (
                second
                    .lease("w", 5, None, Duration::ZERO)
                    .await
                    .map(|jobs| unsigned(&jobs)),
                core.lease(now, "w", 5, None),
            );
            assert!(a.is_ok(), "{a:?}");
            assert_eq!(a, b);
        }
        let now = clock.now_micros();
        let (a, b) = (second.stats().await.unwrap(), core.stats(now).unwrap());
        assert_eq!(a, b);
    });
}

/// A queue whose configuration is gone from Redis (a restart without persistence, a flush)
/// gets it back from the next handle that calls; and the dead set's repairs, larger than
/// one call's share, go in chunks and miss nothing.
#[test]
fn a_lost_configuration_comes_back_and_large_repairs_go_in_chunks() {
    runtime().block_on(async {
        let name = unique_name("chunks");
        let config = QueueConfig::new("gcra:rate=1000000/s,burst=1000000".parse().unwrap());
        let server = shared_server();
        let q = Queue::new(open_at(&server.url(), &name, config, None).await);
        let key = format!("paceline:v2:{{q:{name}}}:config");
        assert_eq!(server.command(&["DEL", &key]).unwrap(), ":1");
        let total = 1_100u64;
        let jobs = (0..total)
            .map(|n| NewJob::new(format!("g{}", n % 7), vec![1]))
            .collect();
        for e in q.enqueue_batch(jobs).await {
            e.unwrap();
        }
        // Every job leased and failed fatally: all dead.
        let kill_all = || async {
            let mut leased = Vec::new();
            while (leased.len() as u64) < total {
                leased.extend(q.lease("w", 1_000, None, Duration::ZERO).await.unwrap());
            }
            let fails = leased
                .iter()
                .map(|j| q.fail(&j.id, &j.token, Failure::Fatal { error: None }));
            for outcome in futures_util::future::join_all(fails).await {
                assert_eq!(outcome, Ok(paceline_queue::FailOutcome::Dead));
            }
        };
        kill_all().await;
        assert_eq!(q.counts().await.unwrap().dead, total);
        assert_eq!(q.retry_dead(None).await, Ok(total as usize));
        let counts = q.counts().await.unwrap();
        assert_eq!((counts.dead, counts.waiting), (0, total));
        kill_all().await;
        assert_eq!(q.purge_dead().await, Ok(total as usize));
        let counts = q.counts().await.unwrap();
        assert_eq!((counts.dead, counts.waiting, counts.active), (0, 0, 0));
        // Positions beyond any queue: nothing, not an error.
        assert_eq!(q.dead(usize::MAX, usize::MAX).await, Ok(Vec::new()));
    });
}

/// Opens handles on one Redis queue whose policy no group reaches, on a virtual clock.
struct Opener {
    name: String,
    config: QueueConfig,
    clock: Arc<dyn Clock>,
}

impl Opener {
    async fn open(&self) -> RedisQueue {
        open_at(
            &shared_server().url(),
            &self.name,
            self.config.clone(),
            Some(Arc::clone(&self.clock)),
        )
        .await
    }
}

/// A queue whose policy no group reaches, in memory and (through the opener) in Redis, on
/// one virtual clock.
fn unlimited_twins(prefix: &str) -> (ManualClock, paceline_queue::QueueCore, Opener) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let config = QueueConfig::new("gcra:rate=1000000/s,burst=1000000".parse().unwrap());
    let core = paceline_queue::QueueCore::new(config.clone()).unwrap();
    let opener = Opener {
        name: unique_name(prefix),
        config,
        clock: Arc::new(clock.clone()),
    };
    (clock, core, opener)
}

/// Jobs that go back to their group (released, here in a scrambled order, some among new
/// jobs and one of them cancelled) take their places by rank in the group's line in Redis,
/// as in memory: the next leases start them in the order they were first enqueued, then
/// the new ones. The next event is the same on both, with nothing to wait for and with
/// leases out.
#[test]
fn returned_jobs_take_their_places_by_rank_as_in_memory() {
    use paceline_queue::QueueBackend;
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("ranks");
        // A second handle on the queue, for what `Queue` does not show.
        let (redis, backend) = (Queue::new(opener.open().await), opener.open().await);
        assert_eq!(backend.next_event().await, Ok(None));
        assert_eq!(core.next_event(), None);
        let total = 40usize;
        for n in 0..total {
            let job = NewJob::new("g", vec![n as u8]);
            let now = clock.now_micros();
            assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        let now = clock.now_micros();
        let (leased, expected) = (
            redis.lease("w", total, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", total, None).unwrap(),
        );
        assert_eq!(unsigned(&leased), expected);
        // Released in the order 0, 17, 34, 11, ... (17 is prime to 40: each once), with
        // a new job after every eighth.
        for i in 0..total {
            let job = &leased[i * 17 % total];
            let now = clock.now_micros();
            assert_eq!(
                redis.fail(&job.id, &job.token, Failure::Release).await,
                core.fail(now, &job.id, job.lease, Failure::Release, 0.5),
                "release {i}"
            );
            if i % 8 == 7 {
                let job = NewJob::new("g", b"new".to_vec());
                let now = clock.now_micros();
                assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
            }
        }
        let cancelled = &leased[total / 2].id;
        let now = clock.now_micros();
        assert_eq!(redis.cancel(cancelled).await, core.cancel(now, cancelled));
        let now = clock.now_micros();
        let (again, expected) = (
            redis.lease("w", 1_000, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 1_000, None).unwrap(),
        );
        assert_eq!(unsigned(&again), expected);
        let order: Vec<&str> = again.iter().map(|j| j.id.as_str()).collect();
        let first: Vec<&str> = leased
            .iter()
            .map(|j| j.id.as_str())
            .filter(|id| id != cancelled)
            .collect();
        assert_eq!(
            order[..total - 1],
            first[..],
            "the returned jobs first, by rank"
        );
        assert!(again[total - 1..].iter().all(|j| j.payload == b"new"));
        assert_eq!(again.len(), total - 1 + total / 8);
        let expiry = core.next_event();
        assert!(
            expiry.is_some_and(|at| at > clock.now_micros()),
            "{expiry:?}"
        );
        assert_eq!(backend.next_event().await, Ok(expiry));
    });
}

/// A queue written in the earlier layout (its meta record a MessagePack map without `due`,
/// each group's whole line a sorted set scored by rank, and group records that do not
/// know the length of their line's front) is read as it is and goes on as in memory: the
/// same ids, order, estimates and totals. The sorted set serves as the line's front, new
/// jobs join the list behind it.
#[test]
fn a_queue_in_the_earlier_layout_goes_on_as_in_memory() {
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("layout");
        let (server, name) = (shared_server(), &opener.name);
        let redis = Queue::new(opener.open().await);
        for n in 0..12u8 {
            let job = NewJob::new(format!("g{}", n % 2), vec![n]);
            let now = clock.now_micros();
            assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        // Back to the earlier layout: the meta record as MessagePack, both lines wholly in
        // sorted sets, and group records without the length of the front.
        let base = format!("paceline:v2:{{q:{name}}}:");
        let downgrade = "local _, seq, last_id, now, jobs, _, a, b, c, d, e, f, g, h = \
             struct.unpack('<Bddddddddddddd', redis.call('GET', KEYS[1] .. 'meta')) \
           redis.call('SET', KEYS[1] .. 'meta', cmsgpack.pack({ seq = seq, \
             last_id = last_id, now = now, jobs = jobs, totals = { enqueued = a, \
             started = b, acked = c, failed = d, retried = e, dead = f, \
             lease_expiries = g, pauses = h } })) \
           for _, group in ipairs({'g0', 'g1'}) do \
             local list = KEYS[1] .. 'q:' .. group \
             for _, e in ipairs(redis.call('LRANGE', list, 0, -1)) do \
               redis.call('ZADD', KEYS[1] .. 'l:' .. group, tonumber(e:sub(1, 20)), e:sub(21)) \
             end \
             redis.call('DEL', list) \
             local g = cmsgpack.unpack(redis.call('GET', KEYS[1] .. 'g:' .. group)) \
             g.f = nil \
             redis.call('SET', KEYS[1] .. 'g:' .. group, cmsgpack.pack(g)) \
           end \
           return redis.call('ZCARD', KEYS[1] .. 'l:g0')";
        assert_eq!(
            server.command(&["EVAL", downgrade, "1", &base]).unwrap(),
            ":6"
        );
        let (front, list) = (format!("{base}l:g0"), format!("{base}q:g0"));
        let meta_tag = "return string.byte(redis.call('GET', KEYS[1] .. 'meta'), 1)";
        assert_eq!(server.command(&["TYPE", &front]).unwrap(), "+zset");
        assert_eq!(server.command(&["TYPE", &list]).unwrap(), "+none");
        // A MessagePack map of five entries.
        assert_eq!(
            server.command(&["EVAL", meta_tag, "1", &base]).unwrap(),
            ":133"
        );
        let job = NewJob::new("g0", b"after".to_vec());
        let now = clock.now_micros();
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        assert_eq!(server.command(&["ZCARD", &front]).unwrap(), ":6");
        assert_eq!(server.command(&["LLEN", &list]).unwrap(), ":1");
        // Written back in the binary layout ('m').
        assert_eq!(
            server.command(&["EVAL", meta_tag, "1", &base]).unwrap(),
            ":109"
        );
        let now = clock.now_micros();
        let (a, b) = (
            redis.lease("w", 100, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 100, None).unwrap(),
        );
        assert_eq!(a.len(), 13);
        assert_eq!(unsigned(&a), b);
        let now = clock.now_micros();
        assert_eq!(redis.stats().await.unwrap(), core.stats(now).unwrap());
    });
}

/// Enqueues `n` jobs to group `g` in one batch on both queues at `now`, checking that they
/// answer alike; the jobs' ids.
async fn enqueue_both(
    redis: &Queue,
    core: &mut paceline_queue::QueueCore,
    now: u64,
    n: u32,
) -> Vec<String> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|n| NewJob::new("g", n.to_be_bytes().to_vec()))
        .collect();
    let answers = redis.enqueue_batch(jobs.clone()).await;
    answers
        .into_iter()
        .zip(jobs)
        .map(|(enqueued, job)| {
            assert_eq!(enqueued, core.enqueue(now, job));
            enqueued.unwrap().id
        })
        .collect()
}

/// A cancelled job leaves its entry in the group's list until the entry reaches the head
/// (finding it at once would scan the list): a lease drops such entries on its way, at
/// most a thousand a call, so a call after many cancels may answer fewer jobs than memory
/// does and the next calls go on; the jobs started, their order and the counts are the
/// same.
#[test]
fn cancelled_jobs_entries_are_dropped_a_bounded_number_a_call() {
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("cancels");
        let redis = Queue::new(opener.open().await);
        let ids = enqueue_both(&redis, &mut core, clock.now_micros(), 1_250).await;
        // The first 1,100 cancelled, and one further back.
        for id in ids[..1_100].iter().chain([&ids[1_200]]) {
            let now = clock.now_micros();
            assert_eq!(redis.cancel(id).await, core.cancel(now, id));
        }
        let now = clock.now_micros();
        let expected = core.lease(now, "w", 1_000, None).unwrap();
        assert_eq!(expected.len(), 149);
        // The first call drops a thousand entries and starts nothing; the next drops the
        // rest ahead of the first live job and starts them all.
        let first = redis.lease("w", 1_000, None, Duration::ZERO).await.unwrap();
        assert!(first.is_empty(), "{} jobs", first.len());
        let second = redis.lease("w", 1_000, None, Duration::ZERO).await.unwrap();
        let ids_of =
            |jobs: &[paceline_queue::Leased]| jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids_of(&second), ids_of(&expected));
        let now = clock.now_micros();
        let (a, b) = (redis.counts().await.unwrap(), core.counts(now).unwrap());
        assert_eq!((a.waiting, a.active), (b.waiting, b.active));
        assert_eq!((a.waiting, a.active), (0, 149));
        // The thousand is a lease call's, not each group's: live jobs 999 cancelled
        // entries apart, the first call gets past the first gap only.
        let now = clock.now_micros();
        let spaced = enqueue_both(&redis, &mut core, now, 2_001).await;
        for (n, id) in spaced.iter().enumerate() {
            if n % 1_000 != 0 {
                assert_eq!(redis.cancel(id).await, core.cancel(now, id));
            }
        }
        let expected = ids_of(&core.lease(now, "w", 10, None).unwrap());
        assert_eq!(expected, [&*spaced[0], &*spaced[1_000], &*spaced[2_000]]);
        let first = redis.lease("w", 10, None, Duration::ZERO).await.unwrap();
        assert_eq!(ids_of(&first), expected[..2]);
        let second = redis.lease("w", 10, None, Duration::ZERO).await.unwrap();
        assert_eq!(ids_of(&second), expected[2..]);
        // An id cancelled and enqueued again takes its new place: its old entry, met
        // first, is its job's no longer.
        for job in [
            NewJob::new("g", b"1".to_vec()).id("again"),
            NewJob::new("g", b"2".to_vec()).id("between"),
        ] {
            let now = clock.now_micros();
            assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        }
        let now = clock.now_micros();
        assert_eq!(redis.cancel("again").await, core.cancel(now, "again"));
        let job = NewJob::new("g", b"3".to_vec()).id("again");
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        let now = clock.now_micros();
        let (a, b) = (
            redis.lease("w", 10, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 10, None).unwrap(),
        );
        assert_eq!(unsigned(&a), b);
        assert_eq!(ids_of(&a), ["between", "again"]);
        // A group whose only job is cancelled is dropped by the next call, which may also
        // make it anew: the cancelled job's entry is not the new group's.
        let job = NewJob::new("h", b"solo".to_vec()).id("solo");
        let now = clock.now_micros();
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        assert_eq!(redis.cancel("solo").await, core.cancel(now, "solo"));
        clock.advance(Duration::from_millis(1));
        let job = NewJob::new("h", b"next".to_vec()).id("next");
        let now = clock.now_micros();
        assert_eq!(redis.enqueue(job.clone()).await, core.enqueue(now, job));
        let (a, b) = (
            redis.lease("w", 10, None, Duration::ZERO).await.unwrap(),
            core.lease(now, "w", 10, None).unwrap(),
        );
        assert_eq!(unsigned(&a), b);
        assert_eq!(ids_of(&a), ["next"]);
    });
}

/// More groups than the Redis twin keeps unpacked between calls (256): calls that go round
/// all of them, so that its cache of group records fills, empties and fills again, answer
/// as memory does: the same estimates, starts, acknowledgements and counts.
#[test]
fn more_groups_than_the_twin_keeps_answer_as_in_memory() {
    runtime().block_on(async {
        let (clock, mut core, opener) = unlimited_twins("groups");
        let redis = Queue::new(opener.open().await);
        let groups = 300u32;
        for round in 0..3u32 {
            let jobs: Vec<NewJob> = (0..groups * 2)
                .map(|n| NewJob::new(format!("g{}", (n * 7 + round) % groups), vec![round as u8]))
                .collect();
            let now = clock.now_micros();
            for chunk in jobs.chunks(100) {
                let answers = redis.enqueue_batch(chunk.to_vec()).await;
                for (answer, job) in answers.into_iter().zip(chunk) {
                    assert_eq!(answer, core.enqueue(now, job.clone()));
                }
            }
            clock.advance(Duration::from_millis(1));
            let now = clock.now_micros();
            let (leased, expected) = (
                redis.lease("w", 1_000, None, Duration::ZERO).await.unwrap(),
                core.lease(now, "w", 1_000, None).unwrap(),
            );
            assert_eq!(unsigned(&leased), expected);
            // The new jobs and those released in the round before (at most 1,000 a call).
            assert!(leased.len() >= (groups * 2) as usize, "{}", leased.len());
            // Every other job acknowledged, one at a time; the rest go back to their groups.
            for (i, job) in leased.iter().enumerate() {
                let now = clock.now_micros();
                if i % 2 == 0 {
                    assert_eq!(
                        redis.ack(&job.id, &job.token).await,
                        core.ack(now, &job.id, job.lease)
                    );
                } else {
                    assert_eq!(
                        redis.fail(&job.id, &job.token, Failure::Release).await,
                        core.fail(now, &job.id, job.lease, Failure::Release, 0.5)
                    );
                }
            }
            clock.advance(Duration::from_millis(1));
            let now = clock.now_micros();
            assert_eq!(redis.stats().await.unwrap(), core.stats(now).unwrap());
        }
    });
}
