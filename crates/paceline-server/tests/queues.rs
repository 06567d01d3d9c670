//! The job queues over HTTP (`/v1/queues/{queue}/...`), in process, on a Redis Cluster:
//! two queues whose keys the cluster keeps on different primaries, served side by side by
//! two instances of the service (one a worker's, one a producer's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use paceline_queue::QueueConfig;
mod common;
use common::{call, Answer};

use paceline_server::Settings;
use paceline_store::{Clock, ManualClock};
use paceline_testkit::{shared_cluster, unique_name, GatedClock, RedisCluster};
use serde_json::{json, Value};

/// 2023-11-14 in microseconds since the Unix epoch (a whole number of 10 s windows).
const EPOCH_2023: u64 = 1_700_000_000_000_000;
/// The same, in the milliseconds the API answers.
const EPOCH_MS: u64 = EPOCH_2023 / 1_000;

/// Two queue names whose keys (hash tag `{q:NAME}`) the cluster keeps on two different
/// primaries, neither of them the first node of the seed list, where the service
/// subscribes to the queues' channels (so every wake-up crosses the cluster): the first
/// such names among `STEM-0`, `STEM-1`, ..., found by asking the cluster, not by luck.
/// Each with its slot and primary's port.
fn two_names_on_two_primaries(cluster: &RedisCluster, stem: &str) -> Vec<(String, u16, u16)> {
    let stem = unique_name(stem);
    let slots = cluster.slot_map();
    let subscribed_on = cluster.nodes()[0].port();
    let mut placed: Vec<(String, u16, u16)> = Vec::new();
    for n in 0..10_000 {
        let name = format!("{stem}-{n}");
        let slot = cluster.keyslot(&format!("{{q:{name}}}"));
        let port = slots.owner(slot);
        if port != subscribed_on && placed.iter().all(|(_, _, p)| *p != port) {
            placed.push((name, slot, port));
            if placed.len() == 2 {
                return placed;
            }
        }
    }
    panic!("no two primaries besides the first: {placed:?}");
}

/// A service on a free port, on `store`, with `queues`, its store (and so its queues)
/// reading time from `clock`.
async fn serve(
    store: &str,
    queues: &BTreeMap<String, QueueConfig>,
    clock: Arc<dyn Clock>,
) -> common::Running {
    let settings = Settings {
        store: store.to_string(),
        queues: queues.clone(),
        ..Settings::default()
    };
    common::start(settings, Some(clock)).await
}

async fn post(url: impl AsRef<str>, body: Value) -> Answer {
    call(reqwest::Method::POST, url.as_ref(), Some(body)).await
}

async fn get(url: impl AsRef<str>) -> Answer {
    call(reqwest::Method::GET, url.as_ref(), None).await
}

/// The lease token of a leased job.
fn token(job: &Value) -> String {
    job["lease"].as_str().expect("a lease token").to_string()
}

/// Two queues on two primaries of a cluster, through two instances of the service: a
/// worker's lease waiting on one (`wait_ms`) is woken by an enqueue through the other and
/// gets the job; enqueues answer 201 with the id, the state and the estimated start; acks
/// answer 204, a stale one 409 `lease_lost`; and each queue's counts (`GET
/// /v1/queues/{queue}`, the same through either instance) are its own as both go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_queues_on_two_cluster_primaries_over_http() {
    let cluster = shared_cluster();
    let placed = two_names_on_two_primaries(cluster, "http");
    let (a, b) = (placed[0].0.clone(), placed[1].0.clone());
    assert_ne!(placed[0].1, placed[1].1, "two slots");
    assert_ne!(placed[0].2, placed[1].2, "two primaries");
    let lease = Duration::from_secs(20);
    let queues: BTreeMap<String, QueueConfig> = [
        (
            a.clone(),
            QueueConfig::new("fixed_window:limit=2,window=10s".parse().unwrap()).lease(lease),
        ),
        (
            b.clone(),
            QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap()).lease(lease),
        ),
    ]
    .into_iter()
    .collect();
    let time = ManualClock::new(EPOCH_2023);
    let gated = GatedClock::new(time.clone());
    let (worker, worker_task, stop_worker) =
        serve(&cluster.url(), &queues, Arc::new(gated.clone())).await;
    let (producer, producer_task, stop_producer) =
        serve(&cluster.url(), &queues, Arc::new(time.clone())).await;
    for (name, slot, port) in &placed {
        cluster.assert_key_on(&format!("paceline:v2:{{q:{name}}}:config"), *slot, *port);
    }
    let unknown = get(&format!("{worker}/v1/queues/nope")).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert_eq!(unknown.body["error"]["code"], "unknown_queue");

    // A waiting lease on the worker's instance, woken by an enqueue on the producer's.
    for (q, group) in [(&a, "g"), (&b, "x")] {
        let begun = gated.sleeps();
        let waiting = tokio::spawn(post(
            format!("{worker}/v1/queues/{q}/leases"),
            json!({"worker": "w1", "wait_ms": 5_000}),
        ));
        gated.sleeps_begun(begun + 1).await;
        assert!(!waiting.is_finished(), "{q}: nothing to lease yet");
        let payload = json!({"queue": q, "n": 0});
        let enqueued = post(
            &format!("{producer}/v1/queues/{q}/jobs"),
            json!({"group": group, "payload": payload, "id": "first"}),
        )
        .await;
        assert_eq!(enqueued.status, 201, "{q}: {}", enqueued.body);
        assert_eq!(
            enqueued.body,
            json!({"id": "first", "state": "waiting", "estimated_start_ms": EPOCH_MS})
        );
        let leased = tokio::time::timeout(Duration::from_secs(20), waiting)
            .await
            .expect("the enqueue woke the waiting lease")
            .expect("the lease call");
        assert_eq!(leased.status, 200, "{q}: {}", leased.body);
        let jobs = leased.body["jobs"].as_array().expect("jobs");
        assert_eq!(jobs.len(), 1, "{q}: {}", leased.body);
        let job = &jobs[0];
        assert_eq!(
            (&job["id"], &job["group"], &job["payload"], &job["attempt"]),
            (&json!("first"), &json!(group), &payload, &json!(1)),
            "{q}: {job}"
        );
        assert_eq!(job["started_ms"], EPOCH_MS);
        assert_eq!(job["lease_expires_ms"], EPOCH_MS + 20_000);
        let ack = format!("{worker}/v1/queues/{q}/jobs/first/ack");
        let done = post(&ack, json!({"lease": token(job)})).await;
        assert_eq!(done.status, 204, "{q}: {}", done.body);
        // The same ack again (its first answer lost, say) answers as the first did.
        let again = post(&ack, json!({"lease": token(job)})).await;
        assert_eq!(again.status, 204, "{q}: {}", again.body);
        // A failure report with the token of a job acknowledged is a lost lease.
        let fail = format!("{worker}/v1/queues/{q}/jobs/first/fail");
        let stale = post(&fail, json!({"lease": token(job)})).await;
        assert_eq!(stale.status, 409, "{q}: {}", stale.body);
        assert_eq!(stale.body["error"]["code"], "lease_lost", "{}", stale.body);
        assert_eq!(stale.body["error"]["field"], "lease", "{}", stale.body);
    }

    // More jobs in each: A's group takes 2 a window (one of this window's went to
    // `first`), B's groups start at once.
    for (n, expected) in [EPOCH_MS, EPOCH_MS + 10_000, EPOCH_MS + 10_000]
        .into_iter()
        .enumerate()
    {
        let e = post(
            &format!("{producer}/v1/queues/{a}/jobs"),
            json!({"group": "g", "payload": n, "id": format!("a-{n}")}),
        )
        .await;
        assert_eq!(e.status, 201, "{}", e.body);
        assert_eq!(
            e.body,
            json!({"id": format!("a-{n}"), "state": "waiting", "estimated_start_ms": expected})
        );
    }
    for group in ["x", "y"] {
        let e = post(
            &format!("{producer}/v1/queues/{b}/jobs"),
            json!({"group": group, "payload": group, "id": format!("b-{group}")}),
        )
        .await;
        assert_eq!(e.status, 201, "{}", e.body);
        assert_eq!(e.body["estimated_start_ms"], EPOCH_MS);
    }
    // An id the queue holds: 200, nothing added.
    let again = post(
        &format!("{producer}/v1/queues/{a}/jobs"),
        json!({"group": "g", "id": "a-0"}),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["id"], "a-0");

    let lease_all = |q: &str| {
        post(
            format!("{worker}/v1/queues/{q}/leases"),
            json!({"worker": "w2", "max_jobs": 10, "wait_ms": 0}),
        )
    };
    let from_a = lease_all(&a).await;
    assert_eq!(from_a.status, 200, "{}", from_a.body);
    let from_a = from_a.body["jobs"].as_array().expect("jobs").clone();
    let ids: Vec<&Value> = from_a.iter().map(|j| &j["id"]).collect();
    assert_eq!(ids, [&json!("a-0")], "A's window holds one more start");
    let from_b = lease_all(&b).await;
    assert_eq!(from_b.status, 200, "{}", from_b.body);
    let from_b = from_b.body["jobs"].as_array().expect("jobs").clone();
    let ids: BTreeSet<&str> = from_b.iter().filter_map(|j| j["id"].as_str()).collect();
    assert_eq!(ids, BTreeSet::from(["b-x", "b-y"]));

    // Each queue's counts, the same through either instance.
    let stats = |q: String| {
        let (worker, producer) = (worker.clone(), producer.clone());
        async move {
            let seen = get(&format!("{worker}/v1/queues/{q}")).await;
            assert_eq!(seen.status, 200, "{q}: {}", seen.body);
            let other = get(&format!("{producer}/v1/queues/{q}")).await;
            assert_eq!(other.body, seen.body, "{q}: both instances see one queue");
            assert_eq!(seen.body["queue"], q.as_str());
            seen.body
        }
    };
    let counts = |s: &Value| {
        (
            s["scheduled"].clone(),
            s["waiting"].clone(),
            s["active"].clone(),
            s["dead"].clone(),
        )
    };
    let in_a = stats(a.clone()).await;
    assert_eq!(
        counts(&in_a),
        (json!(0), json!(2), json!(1), json!(0)),
        "{in_a}"
    );
    assert_eq!(
        in_a["groups"],
        json!({"g": {"waiting": 2, "active": 1, "next_eligible_ms": EPOCH_MS + 10_000, "paused": false, "paused_until_ms": null}}),
        "{in_a}"
    );
    let in_b = stats(b.clone()).await;
    assert_eq!(
        counts(&in_b),
        (json!(0), json!(0), json!(2), json!(0)),
        "{in_b}"
    );
    let groups_b = in_b["groups"].as_object().expect("groups");
    assert!(!groups_b.contains_key("g"), "{in_b}");
    for group in ["x", "y"] {
        assert_eq!(
            (&groups_b[group]["waiting"], &groups_b[group]["active"]),
            (&json!(0), &json!(1)),
            "{in_b}"
        );
    }

    // B's jobs done, through the producer's instance: B is empty, A as it was.
    for job in &from_b {
        let id = job["id"].as_str().expect("an id");
        let done = post(
            &format!("{producer}/v1/queues/{b}/jobs/{id}/ack"),
            json!({"lease": token(job)}),
        )
        .await;
        assert_eq!(done.status, 204, "{}", done.body);
    }
    let in_b = stats(b.clone()).await;
    assert_eq!(
        counts(&in_b),
        (json!(0), json!(0), json!(0), json!(0)),
        "{in_b}"
    );
    assert_eq!(stats(a.clone()).await, in_a, "B's acks leave A alone");
    // A's lease token acks nothing in B, where no such job is leased.
    let crossed = post(
        &format!("{worker}/v1/queues/{b}/jobs/a-0/ack"),
        json!({"lease": token(&from_a[0])}),
    )
    .await;
    assert_eq!(crossed.status, 409, "{}", crossed.body);
    assert_eq!(crossed.body["error"]["code"], "lease_lost");
    let done = post(
        &format!("{worker}/v1/queues/{a}/jobs/a-0/ack"),
        json!({"lease": token(&from_a[0])}),
    )
    .await;
    assert_eq!(done.status, 204, "{}", done.body);
    let in_a = stats(a.clone()).await;
    assert_eq!(
        counts(&in_a),
        (json!(0), json!(2), json!(0), json!(0)),
        "{in_a}"
    );

    for (stop, task) in [(stop_worker, worker_task), (stop_producer, producer_task)] {
        let _ = stop.send(());
        let _ = task.await;
    }
}

/// A queue of 3 partitions from the service's config file (`partitions = 3`), on a
/// 3-primary cluster, through two instances: one queue from outside. Its groups (one in
/// each partition) take 2 starts a window each; `GET /v1/queues/{queue}` answers the
/// counts of every partition summed, with every group; the ids the queue gives name their
/// partition (`1`, `1.1`, `1.2`) and are found by id; each fence names its partition
/// (`fence mod 3`); and acks through the other instance empty it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_three_partitions_over_http_is_one_queue() {
    use paceline_queue::partitioned::partition_of;
    let cluster = shared_cluster();
    let name = unique_name("parts");
    let text = format!(
        r#"
[queues.{name}]
group_policy = "fixed_window:limit=2,window=10s"
lease = "20s"
partitions = 3
"#
    );
    let file = paceline_server::config::parse("partitions.toml", &text).expect("the config");
    let mut settings = Settings::default();
    settings.apply_file(file);
    assert_eq!(settings.queues[&name].partitions, 3);
    let queues = settings.queues.clone();
    let time = ManualClock::new(EPOCH_2023);
    let (worker, worker_task, stop_worker) =
        serve(&cluster.url(), &queues, Arc::new(time.clone())).await;
    let (producer, producer_task, stop_producer) =
        serve(&cluster.url(), &queues, Arc::new(time.clone())).await;
    let groups: Vec<String> = (0..3)
        .map(|p| {
            (0..)
                .map(|k| format!("guild:{k}"))
                .find(|g| partition_of(g, 3) == p)
                .expect("a group in every partition")
        })
        .collect();
    let mut ids = Vec::new();
    for round in 0..3 {
        for group in &groups {
            let e = post(
                &format!("{producer}/v1/queues/{name}/jobs"),
                json!({"group": group, "payload": round}),
            )
            .await;
            assert_eq!(e.status, 201, "{}", e.body);
            ids.push(e.body["id"].as_str().expect("an id").to_string());
        }
    }
    assert_eq!(ids[..3], ["1", "1.1", "1.2"], "each partition's own ids");
    let found = get(&format!("{worker}/v1/queues/{name}/jobs/1.2")).await;
    assert_eq!(found.status, 200, "{}", found.body);
    assert_eq!(found.body["group"], groups[2].as_str());

    let seen = get(&format!("{worker}/v1/queues/{name}")).await;
    assert_eq!(seen.status, 200, "{}", seen.body);
    assert_eq!(seen.body["queue"], name.as_str());
    assert_eq!(
        (&seen.body["waiting"], &seen.body["active"]),
        (&json!(9), &json!(0)),
        "{}",
        seen.body
    );
    let listed: BTreeSet<&str> = seen.body["groups"]
        .as_object()
        .expect("groups")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(listed, groups.iter().map(String::as_str).collect());
    let other = get(&format!("{producer}/v1/queues/{name}")).await;
    assert_eq!(other.body, seen.body, "both instances see one queue");

    let leased = post(
        &format!("{worker}/v1/queues/{name}/leases"),
        json!({"worker": "w", "max_jobs": 100, "wait_ms": 0}),
    )
    .await;
    assert_eq!(leased.status, 200, "{}", leased.body);
    let jobs = leased.body["jobs"].as_array().expect("jobs").clone();
    let mut per_group: BTreeMap<String, usize> = BTreeMap::new();
    for job in &jobs {
        let group = job["group"].as_str().expect("a group");
        *per_group.entry(group.to_string()).or_default() += 1;
        let fence = job["fence"].as_u64().expect("a fence");
        assert_eq!(fence % 3, partition_of(group, 3) as u64, "{job}");
    }
    assert_eq!(
        per_group,
        groups.iter().map(|g| (g.clone(), 2)).collect(),
        "each group's own limit"
    );
    for job in &jobs {
        let id = job["id"].as_str().expect("an id");
        let done = post(
            &format!("{producer}/v1/queues/{name}/jobs/{id}/ack"),
            json!({"lease": token(job)}),
        )
        .await;
        assert_eq!(done.status, 204, "{}", done.body);
    }
    let after = get(&format!("{worker}/v1/queues/{name}")).await;
    assert_eq!(
        (&after.body["waiting"], &after.body["active"]),
        (&json!(3), &json!(0)),
        "{}",
        after.body
    );

    for (stop, task) in [(stop_worker, worker_task), (stop_producer, producer_task)] {
        let _ = stop.send(());
        let _ = task.await;
    }
}
