//! Redis Cluster topology: batches span the slots of one node, and when slots move to
//! another node (resharding) while a store holds the old map, its calls are refused
//! before any write and sent again per slot: no decision is lost or applied twice.

use std::sync::Arc;

use paceline_store::{redis::RedisStore, FailurePolicy, Request};
use paceline_store::{Limiter, Op, Policy};
use paceline_testkit::{redis_cli, RedisCluster};

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
