//! Redis Cluster topology: batches span the slots of one node, and when slots move to
//! another node (resharding) while a store holds the old map, its calls are refused
//! before any write and sent again per slot: no decision is lost or applied twice. A
//! frozen or dead primary holds only its own keys, and readiness names it.

use std::sync::Arc;
use std::time::Duration;

use paceline_store::redis::{Readiness, RedisStore, MAX_BATCHES_IN_FLIGHT};
use paceline_store::{Error, FailurePolicy, Request, StoreErrorKind};
use paceline_store::{Limiter, Op, Policy};
use paceline_testkit::{redis_cli, RedisCluster, SlotMap};

#[tokio::test]
async fn batches_survive_slots_moving_to_another_node() {
    let cluster = RedisCluster::start().expect("a 3-primary cluster");
    let store = RedisStore::builder(cluster.url(), FailurePolicy::FailClosed)
        .connect()
        .await
        .expect("connect");
    assert!(store.is_cluster() && store.runs_as_functions());
    let policy: Policy = "gcra:rate=1/h,burst=3".parse().expect("valid spec");
    let keys: Vec<String> = (0..200).map(|i| format!("user:{i}")).collect();
    let requests: Vec<Request> = keys
        .iter()
        .map(|key| Request {
            policy: &policy,
            key,
            op: Op::Limit,
            cost: 1,
        })
        .collect();
    // One admission per key, in batches that span many slots per node.
    for d in store.decide_batch(&requests).await {
        assert_eq!(d.expect("a decision").remaining, 2);
    }

    // Move a thousand slots from the first node to the second, keys and all.
    let nodes = cluster.nodes();
    let id = |port: u16| {
        let out = redis_cli(port)
            .args(["CLUSTER", "MYID"])
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let moved = redis_cli(nodes[0].port())
        .args(["--cluster", "reshard", &nodes[0].addr()])
        .args(["--cluster-from", &id(nodes[0].port())])
        .args(["--cluster-to", &id(nodes[1].port())])
        .args(["--cluster-slots", "1000", "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster reshard runs");
    assert!(
        moved.status.success(),
        "{}",
        String::from_utf8_lossy(&moved.stdout)
    );

    // The store still holds the old map: its per-node batches now reach a node that lacks
    // some keys, are refused, and go again per slot. Every key's second admission counts
    // exactly once.
    for (key, d) in keys.iter().zip(store.decide_batch(&requests).await) {
        assert_eq!(d.expect("a decision").remaining, 1, "{key}");
    }
    // And the refreshed map keeps working.
    for (key, d) in keys.iter().zip(store.decide_batch(&requests).await) {
        assert_eq!(d.expect("a decision").remaining, 0, "{key}");
    }
    // Single decisions route by key as always.
    let limiter = Limiter::with_store(policy.clone(), Arc::new(store));
    assert!(
        !limiter
            .limit("user:7", 1)
            .await
            .expect("a decision")
            .allowed
    );
}

/// Far beyond any legitimate wait here: reaching it means a call hung.
const HANG: Duration = Duration::from_secs(60);

/// The keys among `user:0`, `user:1`, ... whose Redis key (under `store`'s prefix) lives on
/// the primary at `port` (`on` true) or on another primary (`on` false), `count` of them.
fn keys_on(
    cluster: &RedisCluster,
    map: &SlotMap,
    store: &RedisStore,
    port: u16,
    on: bool,
    count: usize,
) -> Vec<String> {
    (0..)
        .map(|i| format!("user:{i}"))
        .filter(|key| (map.owner(cluster.keyslot(&store.redis_key(key))) == port) == on)
        .take(count)
        .collect()
}

/// With auto-batching, a frozen primary (SIGSTOP: its connections stay open and nothing is
/// answered) holds only its own keys' calls: the other primaries' keys are answered while
/// every call to the frozen one still waits for its answer. The response timeout is long
/// (10 s), so "still waits" needs no clock: had the healthy keys' calls waited for the
/// frozen node (sharing its batches or its places in flight), they could only have ended
/// when its calls timed out.
#[tokio::test]
async fn a_frozen_primary_holds_only_its_own_keys_with_auto_batching() {
    // The healthy primaries serve their slots while one is down (else the cluster refuses
    // every key once it notices).
    let cluster = RedisCluster::start_configured(3, &["--cluster-require-full-coverage", "no"])
        .expect("a 3-primary cluster");
    let store = RedisStore::builder(cluster.url(), FailurePolicy::FailClosed)
        .response_timeout(Duration::from_secs(10))
        .failure_backoff(Duration::ZERO)
        .auto_batch(Duration::ZERO)
        .connect()
        .await
        .expect("connect");
    let policy: Policy = "gcra:rate=1/h,burst=3".parse().expect("valid spec");
    let map = cluster.slot_map();
    let frozen_port = cluster.nodes()[0].port();
    // More of the frozen node's keys than it has places in flight, so some also queue.
    let frozen_keys = keys_on(
        &cluster,
        &map,
        &store,
        frozen_port,
        true,
        MAX_BATCHES_IN_FLIGHT * 3,
    );
    let healthy_keys = keys_on(&cluster, &map, &store, frozen_port, false, 40);
    // Every node answers before the freeze (and its connection is open).
    for key in frozen_keys.iter().chain(&healthy_keys) {
        let d = store.decide(&policy, key, Op::Limit, 1).await.expect("up");
        assert_eq!(d.remaining, 2, "{key}");
    }

    let frozen = cluster.nodes()[0].freeze();
    // The frozen node's calls, each queued and sent before the next is made (their tasks
    // and the batching task run while this one yields): they take every place in flight
    // there is for them, and the last ones queue.
    let mut waiting = Vec::new();
    for key in &frozen_keys {
        let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
        waiting.push(tokio::spawn(async move {
            store.decide(&policy, &key, Op::Limit, 1).await
        }));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    let healthy = futures_util::future::join_all(
        healthy_keys
            .iter()
            .map(|key| store.decide(&policy, key, Op::Limit, 1)),
    );
    let healthy = tokio::time::timeout(HANG, healthy)
        .await
        .expect("the healthy primaries' keys were answered");
    for (key, d) in healthy_keys.iter().zip(healthy) {
        let d = d.expect("a healthy primary answers");
        assert_eq!((d.remaining, d.fallback), (1, None), "{key}");
    }
    assert!(
        waiting.iter().all(|call| !call.is_finished()),
        "the frozen primary's calls still wait for it"
    );

    // Thawed, it answers what it was sent (or, on a very slow machine, those calls timed
    // out): none hangs.
    drop(frozen);
    for call in waiting {
        let outcome = tokio::time::timeout(HANG, call)
            .await
            .expect("no call hangs")
            .expect("the task ran");
        match outcome {
            Ok(d) => assert_eq!(d.remaining, 1),
            Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}"),
            Err(e) => panic!("unexpected failure {e}"),
        }
    }
}

/// Readiness asks every primary: ready while all serve, degraded while some do (a dead
/// primary named with why), unavailable once none does.
#[tokio::test]
async fn readiness_names_the_failing_primaries() {
    let mut cluster = RedisCluster::start_configured(3, &["--cluster-require-full-coverage", "no"])
        .expect("a 3-primary cluster");
    let store = RedisStore::builder(cluster.url(), FailurePolicy::FailOpen)
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect");
    let health = store.health().await;
    assert_eq!(
        (health.readiness, health.nodes, health.uncovered_slots),
        (Readiness::Ready, 3, 0),
        "{health:?}"
    );
    assert!(health.failing.is_empty() && health.outages.is_empty());

    let dead = cluster.nodes()[0].addr();
    // A key of the node about to die (the test kit asks node 0 where keys live).
    let map = cluster.slot_map();
    let key = keys_on(&cluster, &map, &store, cluster.nodes()[0].port(), true, 1).remove(0);
    cluster.kill_node(0);
    let health = tokio::time::timeout(HANG, store.health())
        .await
        .expect("readiness answers");
    assert_eq!(health.readiness, Readiness::Degraded, "{health:?}");
    assert_eq!(health.nodes, 3);
    assert_eq!(health.failing.len(), 1, "{health:?}");
    assert_eq!(health.failing[0].node, dead);
    assert!(!health.failing[0].problem.is_empty());
    // A degraded store is still ready for the seam (most keys are decided by Redis).
    assert!(paceline_store::Store::ready(&store).await.is_ok());

    // A decision for the dead node's keys begins its outage, named by the node.
    let policy: Policy = "gcra:rate=1/h,burst=3".parse().expect("valid spec");
    let d = tokio::time::timeout(HANG, store.decide(&policy, &key, Op::Limit, 1))
        .await
        .expect("no hang")
        .expect("fail_open answers");
    assert_eq!(d.fallback, Some(paceline_store::Fallback::FailOpen));
    let outages = store.outages();
    assert_eq!(outages.len(), 1, "{outages:?}");
    assert_eq!(
        (outages[0].node.as_str(), outages[0].failed),
        (dead.as_str(), 1)
    );

    cluster.kill_node(1);
    cluster.kill_node(2);
    let health = tokio::time::timeout(HANG, store.health())
        .await
        .expect("readiness answers");
    assert_eq!(health.readiness, Readiness::Unavailable, "{health:?}");
    assert_eq!(health.failing.len(), 3, "{health:?}");
    assert!(paceline_store::Store::ready(&store).await.is_err());
}

/// With the default `cluster-require-full-coverage yes`, a dead primary makes the others
/// refuse every key once the cluster notices (`cluster_state:fail`): readiness then says
/// unavailable, each healthy primary's problem quoting its state.
#[tokio::test]
async fn readiness_is_unavailable_while_the_cluster_refuses_every_key() {
    let mut cluster = RedisCluster::start().expect("a 3-primary cluster");
    let store = RedisStore::builder(cluster.url(), FailurePolicy::FailClosed)
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect");
    assert_eq!(store.health().await.readiness, Readiness::Ready);
    cluster.kill_node(0);
    // The cluster notices after its node timeout: polled until it has.
    let mut last = None;
    for _ in 0..400 {
        let health = tokio::time::timeout(HANG, store.health())
            .await
            .expect("readiness answers");
        if health.readiness == Readiness::Unavailable {
            last = Some(health);
            break;
        }
        assert_eq!(health.readiness, Readiness::Degraded, "{health:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health = last.expect("the cluster noticed the dead primary");
    assert_eq!(health.failing.len(), 3, "{health:?}");
    let refusing = health
        .failing
        .iter()
        .filter(|f| f.problem.contains("cluster_state:fail"))
        .count();
    assert_eq!(refusing, 2, "{health:?}");
}
