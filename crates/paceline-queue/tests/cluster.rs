//! Queues on a 3-primary Redis Cluster: each on the slot of its name's hash tag and on that
//! slot's primary, side by side, each with its own limits, wake-ups, leases, pauses, dead
//! set and counts.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, ManualClock};
use paceline_queue::{Failure, NewJob, Queue, QueueConfig, QueueError, RedisQueue};
use paceline_testkit::{runtime, shared_cluster, unique_name, GatedClock};

mod common;
use common::redis::open_at;

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
