//! Queues of several partitions, in memory and in Redis: each partition on its own primary
//! of a 3-primary cluster; a changed number of partitions refused, saying what to do; each
//! group's limit, line order and fencing exact within its partition; a waiting lease woken
//! by a job in any partition, without polling; and one queue seen from outside (counts,
//! the dead set in partition order, ids, a full partition, a lease call's request id).
//!
//! The queue in memory and in Redis answering alike, step by step, is `redis.rs`'s
//! differential; a Redis killed under a queue of several partitions is in `kill.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use paceline_core::ManualClock;
use paceline_queue::partitioned::partition_of;
use paceline_queue::redis::partition_tag;
use paceline_queue::{
    Failure, JobState, Leased, NewJob, Partitioned, Queue, QueueConfig, QueueError, RedisQueue,
};
use paceline_testkit::{connect, runtime, shared_cluster, shared_server, unique_name, GatedClock};

/// 2023-11-14 in µs since the Unix epoch: a whole number of 10 s windows.
const START: u64 = 1_700_000_000_000_000;

/// The first of `g-0`, `g-1`, ... that lives in partition `p` of `n`.
fn group_in(p: usize, n: u32) -> String {
    (0..)
        .map(|k| format!("g-{k}"))
        .find(|g| partition_of(g, n) == p)
        .expect("a group for every partition")
}

/// The queue `config` describes in memory and in Redis (the test binary's server), each
/// on a clock of its own at `START`, with the name it goes by.
async fn twins(stem: &str, config: &QueueConfig) -> Vec<(&'static str, Queue, ManualClock)> {
    let memory_clock = ManualClock::new(START);
    let memory = Partitioned::in_memory(
        &unique_name(stem),
        config.clone(),
        Arc::new(memory_clock.clone()),
    )
    .unwrap();
    let redis_clock = ManualClock::new(START);
    let redis = Partitioned::open(
        connect(&shared_server().url()).await,
        &unique_name(stem),
        config.clone(),
        Some(Arc::new(redis_clock.clone())),
    )
    .await
    .unwrap();
    vec![
        ("memory", Queue::new(memory), memory_clock),
        ("redis", Queue::new(redis), redis_clock),
    ]
}

/// On a 3-primary cluster, a queue of 3 partitions keeps each on its own primary: each
/// partition's keys are under its own hash tag (`{q:NAME/i~k}`), whose slot is in the
/// `i`-th third of the slots, served by a different primary; the queue's own tag keeps
/// only its configuration. A job of each partition lands on that partition's primary.
#[test]
fn three_partitions_live_on_the_three_primaries_of_a_cluster() {
    runtime().block_on(async {
        let cluster = shared_cluster();
        let name = unique_name("spread");
        let config = QueueConfig::new("gcra:rate=100/s".parse().unwrap()).partitions(3);
        let queue = Arc::new(
            Partitioned::open(connect(&cluster.url()).await, &name, config, None)
                .await
                .unwrap(),
        );
        let slots = cluster.slot_map();
        let mut ports = BTreeSet::new();
        for i in 0..3 {
            let tag = partition_tag(&name, i, 3);
            assert!(tag.starts_with(&format!("q:{name}/{i}~")), "{tag}");
            let slot = cluster.keyslot(&format!("{{{tag}}}"));
            assert!(
                (i * 16_384 / 3..(i + 1) * 16_384 / 3).contains(&usize::from(slot)),
                "partition {i} in slot {slot}"
            );
            let port = slots.owner(slot);
            cluster.assert_key_on(&format!("paceline:v2:{{{tag}}}:config"), slot, port);
            ports.insert(port);
        }
        assert_eq!(
            ports,
            slots.primaries().into_iter().collect(),
            "one partition on each primary"
        );
        // The queue's own tag holds its configuration (with its number of partitions).
        let own = format!("paceline:v2:{{q:{name}}}:config");
        let own_slot = cluster.keyslot(&own);
        cluster.assert_key_on(&own, own_slot, slots.owner(own_slot));
        // Work lands where its group's partition is.
        let partitioned = Arc::clone(&queue);
        let queue = Queue::from_backend(queue);
        for p in 0..3 {
            let job = queue
                .enqueue(NewJob::new(group_in(p, 3), vec![p as u8]))
                .await
                .unwrap();
            let expected = if p == 0 {
                "1".to_string()
            } else {
                format!("1.{p}")
            };
            assert_eq!(job.id, expected);
            let tag = partition_tag(&name, p, 3);
            let slot = cluster.keyslot(&format!("{{{tag}}}"));
            cluster.assert_key_on(
                &format!("paceline:v2:{{{tag}}}:j:{}", job.id),
                slot,
                slots.owner(slot),
            );
        }
        let stats = queue.stats().await.unwrap();
        assert_eq!((stats.waiting, stats.groups.len()), (3, 3), "{stats:?}");
        assert_eq!(partitioned.groups_held().await, Ok(3), "one group in each");
    });
}

/// A queue keeps the number of partitions it was created with: opened with another (more,
/// fewer, or one), or a queue of one opened with several, it is refused with an error on
/// `partitions` that says what to do, and nothing changes. `Queue::attach` reads the
/// number back; a `RedisQueue` alone refuses a queue of several.
#[test]
fn opening_a_queue_with_another_number_of_partitions_is_refused() {
    runtime().block_on(async {
        let url = shared_server().url();
        let name = unique_name("renumbered");
        let config = QueueConfig::new("gcra:rate=100/s".parse().unwrap());
        let queue = Queue::open(&url, &name, config.clone().partitions(3))
            .await
            .unwrap();
        for p in 0..3 {
            queue
                .enqueue(NewJob::new(group_in(p, 3), b"x".to_vec()))
                .await
                .unwrap();
        }
        for asked in [1, 2, 4] {
            let refused = Queue::open(&url, &name, config.clone().partitions(asked))
                .await
                .unwrap_err();
            let QueueError::Input(e) = refused else {
                panic!("{refused:?}");
            };
            assert_eq!(e.field(), "partitions");
            for part in [
                format!("queue `{name}` has 3 partitions and was opened with {asked}"),
                "give it partitions = 3 again".to_string(),
                "drain it and delete its keys".to_string(),
                format!("`{{q:{name}}}` and `{{q:{name}/...}}`"),
                "open a queue of a new name".to_string(),
            ] {
                assert!(e.message().contains(&part), "{part:?} in {}", e.message());
            }
        }
        // Nothing changed: the queue's 3 partitions still hold their jobs.
        let again = Queue::open(&url, &name, config.clone().partitions(3))
            .await
            .unwrap();
        assert_eq!(again.counts().await.unwrap().waiting, 3);
        let attached = Queue::attach(&url, &name).await.unwrap();
        assert_eq!(attached.config().partitions, 3);
        assert_eq!(attached.config().max_jobs, config.max_jobs);
        assert_eq!(attached.stats().await.unwrap().groups.len(), 3);
        assert!(attached.job("1.2").await.unwrap().is_some());
        match RedisQueue::attach(connect(&url).await, &name).await {
            Err(QueueError::Input(e)) => {
                assert_eq!(e.field(), "partitions");
                assert!(e.message().contains("Queue::attach"), "{e}");
            }
            other => panic!("one partition of three: {other:?}"),
        }
        match RedisQueue::open(
            connect(&url).await,
            &name,
            config.clone().partitions(3),
            None,
        )
        .await
        {
            Err(QueueError::Input(e)) => assert_eq!(e.field(), "partitions"),
            other => panic!("a RedisQueue of three partitions: {other:?}"),
        }

        // A queue of one, opened with several.
        let single = unique_name("single");
        Queue::open(&url, &single, config.clone()).await.unwrap();
        let refused = Queue::open(&url, &single, config.clone().partitions(2))
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains(&format!(
                "queue `{single}` has 1 partition and was opened with 2"
            )),
            "{refused}"
        );
        assert_eq!(
            Queue::attach(&url, &single)
                .await
                .unwrap()
                .config()
                .partitions,
            1
        );
    });
}

/// Each group's limit, line order and fencing are exact in its partition, whatever the
/// other partitions hold: 2 starts per 10 s per group, in the order enqueued; a lease that
/// runs out sends the job back to the head of its group, its token refused from then on;
/// every fence names its partition (`fence mod 3`) and a job's later lease has a larger
/// one. Alike in memory and in Redis.
/// A handle that opened a queue as one partition, still running after the queue was made
/// anew with three, is refused at its next call instead of keeping jobs where no partition
/// looks; its error says how to open the queue now.
#[test]
fn a_handle_of_one_partition_left_running_is_refused_by_a_queue_made_anew_with_three() {
    runtime().block_on(async {
        let url = shared_server().url();
        let name = unique_name("remade");
        let config = QueueConfig::new("gcra:rate=100/s".parse().unwrap());
        let old = Queue::open(&url, &name, config.clone()).await.unwrap();
        old.enqueue(NewJob::new("g", b"x".to_vec())).await.unwrap();
        // Drained and deleted, as the guide says, then opened with three partitions.
        let base = format!("paceline:v2:{{q:{name}}}:");
        let deleted = shared_server()
            .command(&[
                "EVAL",
                "for _, k in ipairs(redis.call('KEYS', ARGV[1] .. '*')) do \
                 redis.call('DEL', k) end return 1",
                "0",
                &base,
            ])
            .unwrap();
        assert_eq!(deleted, ":1");
        let new = Queue::open(&url, &name, config.clone().partitions(3))
            .await
            .unwrap();
        let refused = old
            .enqueue(NewJob::new("g", b"y".to_vec()))
            .await
            .unwrap_err();
        let text = refused.to_string();
        assert!(
            text.contains("this queue keeps its jobs in 3 partitions")
                && text.contains("partitions = 3"),
            "{text}"
        );
        assert!(old.lease("w", 1, None, Duration::ZERO).await.is_err());
        // Nothing was written by the refused calls: the new queue holds nothing.
        assert_eq!(new.counts().await.unwrap().waiting, 0);
        new.enqueue(NewJob::new("g", b"z".to_vec())).await.unwrap();
        assert_eq!(new.counts().await.unwrap().waiting, 1);
    });
}

#[test]
fn each_group_keeps_its_limit_order_and_fencing_in_its_partition() {
    runtime().block_on(async {
        let config = QueueConfig::new("fixed_window:limit=2,window=10s".parse().unwrap())
            .lease(Duration::from_secs(5))
            .partitions(3);
        let groups: Vec<String> = (0..3).map(|p| group_in(p, 3)).collect();
        for (backend, queue, clock) in twins("exact", &config).await {
            for group in &groups {
                let jobs = (0..4)
                    .map(|j| NewJob::new(group.clone(), vec![j]).id(format!("{group}-{j}")))
                    .collect();
                for e in queue.enqueue_batch(jobs).await {
                    e.unwrap();
                }
            }
            let by_group = |jobs: &[Leased]| {
                let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for job in jobs {
                    out.entry(job.group.clone())
                        .or_default()
                        .push(job.id.clone());
                }
                out
            };
            let first = queue.lease("w", 100, None, Duration::ZERO).await.unwrap();
            let expected: BTreeMap<String, Vec<String>> = groups
                .iter()
                .map(|g| (g.clone(), vec![format!("{g}-0"), format!("{g}-1")]))
                .collect();
            assert_eq!(by_group(&first), expected, "{backend}: two each, in order");
            for job in &first {
                assert_eq!(
                    job.lease % 3,
                    partition_of(&job.group, 3) as u64,
                    "{backend}: {job:?}"
                );
            }
            assert!(
                queue
                    .lease("w", 100, None, Duration::ZERO)
                    .await
                    .unwrap()
                    .is_empty(),
                "{backend}: every group at its limit"
            );
            // Acknowledge all but the first group's first job, whose lease runs out.
            for job in &first[..] {
                if job.id != format!("{}-0", groups[0]) {
                    queue.ack(&job.id, &job.token).await.unwrap();
                }
            }
            clock.advance(Duration::from_secs(10));
            let second = queue.lease("w", 100, None, Duration::ZERO).await.unwrap();
            let mut expected: BTreeMap<String, Vec<String>> = groups
                .iter()
                .map(|g| (g.clone(), vec![format!("{g}-2"), format!("{g}-3")]))
                .collect();
            // The expired job is back at the head of its group.
            expected.insert(
                groups[0].clone(),
                vec![format!("{}-0", groups[0]), format!("{}-2", groups[0])],
            );
            assert_eq!(by_group(&second), expected, "{backend}");
            let spent = first
                .iter()
                .find(|j| j.id == format!("{}-0", groups[0]))
                .unwrap();
            let again = second.iter().find(|j| j.id == spent.id).unwrap();
            assert_eq!(again.attempt, 2, "{backend}");
            assert!(
                again.lease > spent.lease,
                "{backend}: a later lease, a larger fence"
            );
            assert_eq!(again.lease % 3, spent.lease % 3, "{backend}");
            assert_eq!(
                queue.ack(&spent.id, &spent.token).await,
                Err(QueueError::LeaseLost {
                    id: spent.id.clone()
                }),
                "{backend}: the expired lease's token is refused"
            );
            for job in &second {
                queue.ack(&job.id, &job.token).await.unwrap();
            }
            let stats = queue.stats().await.unwrap();
            assert_eq!(
                (stats.waiting, stats.active, stats.totals.acked),
                (1, 0, 11),
                "{backend}: {stats:?}"
            );
            assert_eq!(stats.totals.lease_expiries, 1, "{backend}");
        }
    });
}

/// On a cluster, a lease waiting on a queue of 3 partitions (its clock's sleeps never end
/// on their own) is woken by a job enqueued through another handle into any partition,
/// each on its own primary, and takes it, having slept once: it never polls.
#[test]
fn a_waiting_lease_wakes_for_a_job_in_any_partition_without_polling() {
    runtime().block_on(async {
        let cluster = shared_cluster();
        let name = unique_name("wake");
        let config = QueueConfig::new("gcra:rate=100/s".parse().unwrap()).partitions(3);
        let time = ManualClock::new(START);
        let gated = GatedClock::new(time.clone());
        let worker = Queue::new(
            Partitioned::open(
                connect(&cluster.url()).await,
                &name,
                config.clone(),
                Some(Arc::new(gated.clone())),
            )
            .await
            .unwrap(),
        );
        // Another process's handle, on the same time.
        let producer = Queue::new(
            Partitioned::open(
                connect(&cluster.url()).await,
                &name,
                config,
                Some(Arc::new(time.clone())),
            )
            .await
            .unwrap(),
        );
        for p in [2, 1, 0] {
            let begun = gated.sleeps();
            let waiting = tokio::spawn({
                let worker = worker.clone();
                async move { worker.lease("w", 1, None, Duration::from_secs(30)).await }
            });
            gated.sleeps_begun(begun + 1).await;
            assert!(
                !waiting.is_finished(),
                "partition {p}: nothing to lease yet"
            );
            let job = producer
                .enqueue(NewJob::new(group_in(p, 3), vec![p as u8]))
                .await
                .unwrap();
            let leased = tokio::time::timeout(Duration::from_secs(20), waiting)
                .await
                .expect("the enqueue woke the waiting lease")
                .unwrap()
                .unwrap();
            assert_eq!(leased.len(), 1, "partition {p}");
            assert_eq!(
                (leased[0].id.as_str(), leased[0].payload[0]),
                (job.id.as_str(), p as u8)
            );
            assert_eq!(
                gated.sleeps(),
                begun + 1,
                "partition {p}: one wait, no polling"
            );
            worker.ack(&leased[0].id, &leased[0].token).await.unwrap();
        }
    });
}

/// What spans partitions, alike in memory and in Redis: the dead set listed partition by
/// partition (each oldest death first), any offset and limit a slice of the whole list;
/// dead jobs retried by id and wholesale across partitions, and purged; jobs found and
/// cancelled by the ids each partition gives; ids shaped as those refused from producers;
/// a full partition refused by name; an enqueue batch answered in order across
/// partitions.
#[test]
fn the_partitions_answer_as_one_queue() {
    runtime().block_on(async {
        let config = QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap())
            .max_attempts(1)
            .max_jobs(60)
            .partitions(3);
        let groups: Vec<String> = (0..3).map(|p| group_in(p, 3)).collect();
        for (backend, queue, _) in twins("outside", &config).await {
            // Dead jobs: 2 of partition 0, 1 of partition 1, 3 of partition 2, dying in an
            // order that is not the partitions'.
            let deaths = [2, 0, 1, 2, 0, 2];
            let mut died: Vec<Vec<String>> = vec![Vec::new(); 3];
            for (n, &p) in deaths.iter().enumerate() {
                let id = format!("doomed-{n}");
                queue
                    .enqueue(NewJob::new(groups[p].clone(), vec![]).id(&id))
                    .await
                    .unwrap();
                let leased = queue.lease("w", 1, None, Duration::ZERO).await.unwrap();
                assert_eq!(leased[0].id, id);
                let fatal = Failure::Fatal { error: None };
                queue.fail(&id, &leased[0].token, fatal).await.unwrap();
                died[p].push(id);
            }
            let all: Vec<String> = died.concat();
            let listed: Vec<String> = queue
                .dead(0, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|j| j.id)
                .collect();
            assert_eq!(listed, all, "{backend}: partition by partition");
            for offset in 0..8 {
                for limit in 0..8 {
                    let page: Vec<String> = queue
                        .dead(offset, limit)
                        .await
                        .unwrap()
                        .into_iter()
                        .map(|j| j.id)
                        .collect();
                    let end = (offset + limit).min(all.len());
                    let expected = all.get(offset.min(end)..end).unwrap_or_default();
                    assert_eq!(page, expected, "{backend}: dead({offset}, {limit})");
                }
            }
            assert_eq!(queue.counts().await.unwrap().dead, 6, "{backend}");
            let some = [died[1][0].clone(), died[2][0].clone(), "nope".to_string()];
            assert_eq!(queue.retry_dead(Some(&some)).await, Ok(2), "{backend}");
            assert_eq!(queue.retry_dead(None).await, Ok(4), "{backend}");
            let back = queue.lease("w", 100, None, Duration::ZERO).await.unwrap();
            assert_eq!(back.len(), 6, "{backend}");
            for job in &back {
                let fatal = Failure::Fatal { error: None };
                queue.fail(&job.id, &job.token, fatal).await.unwrap();
            }
            assert_eq!(queue.purge_dead().await, Ok(6), "{backend}");
            assert_eq!(queue.dead(0, 10).await, Ok(Vec::new()), "{backend}");

            // Ids each partition gives, found and cancelled; a batch answered in order.
            let batch = (0..6)
                .map(|n| NewJob::new(groups[n % 3].clone(), vec![n as u8]))
                .collect();
            let ids: Vec<String> = queue
                .enqueue_batch(batch)
                .await
                .into_iter()
                .map(|e| e.unwrap().id)
                .collect();
            assert_eq!(ids, ["1", "1.1", "1.2", "2", "2.1", "2.2"], "{backend}");
            for (n, id) in ids.iter().enumerate() {
                let job = queue.job(id).await.unwrap().expect("the job");
                assert_eq!(
                    (job.group.as_str(), job.payload[0]),
                    (groups[n % 3].as_str(), n as u8)
                );
            }
            assert_eq!(queue.cancel("2.1").await, Ok(()), "{backend}");
            assert_eq!(queue.job("2.1").await, Ok(None), "{backend}");
            assert_eq!(
                queue.cancel("9.1").await,
                Err(QueueError::UnknownJob { id: "9.1".into() }),
                "{backend}"
            );
            match queue
                .enqueue(NewJob::new(groups[0].clone(), vec![]).id("7.1"))
                .await
            {
                Err(QueueError::Input(e)) => {
                    assert_eq!(e.field(), "id", "{backend}");
                    assert!(e.message().contains("the ids it gives"), "{e}");
                }
                other => panic!("{backend}: an id shaped as the queue's: {other:?}"),
            }
            let stats = queue.stats().await.unwrap();
            let waiting: Vec<(String, u64)> = stats
                .groups
                .iter()
                .map(|g| (g.group.clone(), g.waiting))
                .collect();
            let mut expected: Vec<(String, u64)> = vec![
                (groups[0].clone(), 2),
                (groups[1].clone(), 1),
                (groups[2].clone(), 2),
            ];
            expected.sort();
            assert_eq!(waiting, expected, "{backend}: the groups of all, by name");
            assert_eq!((stats.waiting, stats.totals.enqueued), (5, 12), "{backend}");

            // max_jobs 60 over 3 partitions: 20 each. Partition 1 fills; the others go on.
            let fill = (0..20)
                .map(|n| NewJob::new(groups[1].clone(), vec![n]))
                .collect();
            let answers = queue.enqueue_batch(fill).await;
            assert!(answers[..19].iter().all(Result::is_ok), "{backend}");
            match &answers[19] {
                Err(QueueError::Store(e)) => {
                    assert!(
                        e.message().contains(
                            "partition 1 of the queue holds its share of max_jobs (20 of 60"
                        ),
                        "{backend}: {e}"
                    );
                }
                other => panic!("{backend}: a full partition: {other:?}"),
            }
            queue
                .enqueue(NewJob::new(groups[2].clone(), vec![]))
                .await
                .unwrap();
        }
    });
}

/// A lease call repeated with its request id answers the jobs it took, with the same
/// tokens, and takes no more, even when work has come since to a partition asked before
/// the one that took them; a repeat asking for fewer jobs than the first took answers as
/// many and gives the rest back at once; never more than `max_jobs`, never a job twice.
/// Alike in memory and in Redis.
#[test]
fn a_repeated_lease_call_answers_its_jobs_and_never_more_than_max_jobs() {
    runtime().block_on(async {
        let config = QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap())
            .lease(Duration::from_secs(30))
            .partitions(2);
        for (backend, queue, clock) in twins("repeat", &config).await {
            // The call starts at the partition its request id hashes to, which is empty.
            let request = "w-call-1";
            let first_asked = partition_of(request, 2);
            let other = 1 - first_asked;
            let (empty, busy) = (group_in(first_asked, 2), group_in(other, 2));
            for n in 0..2 {
                queue
                    .enqueue(NewJob::new(busy.clone(), vec![n]).id(format!("busy-{n}")))
                    .await
                    .unwrap();
            }
            let first = queue
                .lease_request("w", 3, None, Duration::ZERO, Some(request))
                .await
                .unwrap();
            let ids: Vec<&str> = first.iter().map(|j| j.id.as_str()).collect();
            assert_eq!(ids, ["busy-0", "busy-1"], "{backend}");
            // Work arrives in the partition asked first, which took none: the repeat still
            // answers the first call's jobs, and takes none of it.
            for n in 0..3 {
                queue
                    .enqueue(NewJob::new(empty.clone(), vec![n]).id(format!("late-{n}")))
                    .await
                    .unwrap();
            }
            clock.advance(Duration::from_secs(1));
            let again = queue
                .lease_request("w", 3, None, Duration::ZERO, Some(request))
                .await
                .unwrap();
            assert_eq!(again, first, "{backend}: the same jobs and tokens");
            let counts = queue.counts().await.unwrap();
            assert_eq!((counts.active, counts.waiting), (2, 3), "{backend}");
            // A repeat asking for one job answers one of them; the other goes back to its
            // group at once, its attempt not counted.
            let fewer = queue
                .lease_request("w", 1, None, Duration::ZERO, Some(request))
                .await
                .unwrap();
            assert_eq!(fewer, first[..1], "{backend}");
            let back = queue.job("busy-1").await.unwrap().unwrap();
            assert_eq!(
                (back.state, back.attempts),
                (JobState::Waiting, 0),
                "{backend}"
            );
            // Another call takes what waits, never a job held by a lease.
            let next = queue
                .lease_request("w", 10, None, Duration::ZERO, Some("w-call-2"))
                .await
                .unwrap();
            let ids: BTreeSet<&str> = next.iter().map(|j| j.id.as_str()).collect();
            assert_eq!(
                ids,
                BTreeSet::from(["busy-1", "late-0", "late-1", "late-2"]),
                "{backend}"
            );
            let counts = queue.counts().await.unwrap();
            assert_eq!((counts.active, counts.waiting), (5, 0), "{backend}");
        }
    });
}

/// A primary of the cluster down (the others serving their slots): a lease goes on taking
/// the jobs of the partitions whose primaries are up, passing over the one that fails;
/// enqueues into those partitions go on, while one into the partition that is down fails.
#[test]
fn leases_go_on_from_the_partitions_whose_primary_is_up() {
    let mut cluster = paceline_testkit::RedisCluster::start_configured(
        3,
        &["--cluster-require-full-coverage", "no"],
    )
    .expect("a cluster starts");
    runtime().block_on(async {
        let name = unique_name("down");
        let config = QueueConfig::new("gcra:rate=1000/s,burst=1000".parse().unwrap()).partitions(3);
        let queue = Queue::new(
            Partitioned::open(connect(&cluster.url()).await, &name, config, None)
                .await
                .unwrap(),
        );
        let groups: Vec<String> = (0..3).map(|p| group_in(p, 3)).collect();
        for group in &groups {
            for n in 0..2 {
                queue
                    .enqueue(NewJob::new(group.clone(), vec![n]))
                    .await
                    .unwrap();
            }
        }
        let slots = cluster.slot_map();
        let down = slots.owner(cluster.keyslot(&format!("{{{}}}", partition_tag(&name, 2, 3))));
        let index = cluster
            .nodes()
            .iter()
            .position(|n| n.port() == down)
            .expect("partition 2's primary");
        cluster.kill_node(index);
        let leased = queue.lease("w", 10, None, Duration::ZERO).await.unwrap();
        let mut seen: Vec<&str> = leased.iter().map(|j| j.group.as_str()).collect();
        seen.sort_unstable();
        let mut up = vec![
            groups[0].as_str(),
            groups[0].as_str(),
            groups[1].as_str(),
            groups[1].as_str(),
        ];
        up.sort_unstable();
        assert_eq!(seen, up, "the jobs of partitions 0 and 1");
        for job in &leased {
            queue.ack(&job.id, &job.token).await.unwrap();
        }
        assert!(matches!(
            queue.enqueue(NewJob::new(groups[2].clone(), vec![])).await,
            Err(QueueError::Store(_))
        ));
        queue
            .enqueue(NewJob::new(groups[1].clone(), vec![]))
            .await
            .unwrap();
        // Partition 2's primary answered a refused connection first; later calls meet a
        // cluster that still sends them there. Either way the others go on, and when they
        // are empty a lease answers no job, not an error, so a waiting one goes on waiting.
        let leased = queue.lease("w", 10, None, Duration::ZERO).await.unwrap();
        assert_eq!(leased.len(), 1);
        assert_eq!(leased[0].group, groups[1]);
        for request in ["after-1", "after-2"] {
            assert_eq!(
                queue
                    .lease_request("w", 10, None, Duration::ZERO, Some(request))
                    .await,
                Ok(Vec::new()),
                "{request}"
            );
        }
        assert_eq!(
            queue.lease("w", 10, None, Duration::ZERO).await,
            Ok(Vec::new())
        );
    });
}

/// A number of partitions Redis holds for a queue that is out of range (a key written by
/// hand, or damaged) is refused by `Queue::attach` with an error that names it and says
/// what to do, before any partition is looked for.
#[test]
fn attaching_a_queue_whose_stored_partitions_are_out_of_range_is_refused() {
    runtime().block_on(async {
        let server = shared_server();
        let name = unique_name("damaged");
        let config = QueueConfig::new("gcra:rate=100/s".parse().unwrap()).partitions(3);
        Queue::open(&server.url(), &name, config).await.unwrap();
        let specs = format!("paceline:v2:{{q:{name}}}:specs");
        for stored in ["65", "4000000000", "many"] {
            server
                .command(&["HSET", &specs, "\u{1}partitions", stored])
                .unwrap();
            match Queue::attach(&server.url(), &name).await {
                Err(QueueError::Store(e)) => {
                    for part in [
                        format!("the configuration Redis holds for queue `{name}`"),
                        "`partitions`".to_string(),
                        format!("delete its keys `paceline:v2:{{q:{name}}}:config`"),
                        "open the queue with its configuration".to_string(),
                    ] {
                        assert!(e.message().contains(&part), "{stored}: {part:?} in {e}");
                    }
                }
                other => panic!("{stored} partitions followed: {other:?}"),
            }
        }
    });
}

/// A queue may hold as few jobs as it has partitions (`max_jobs = partitions`): one for
/// each, and a second job of a partition is refused, naming its share. Alike in memory and
/// in Redis.
#[test]
fn a_queue_may_hold_one_job_per_partition() {
    runtime().block_on(async {
        let config = QueueConfig::new("gcra:rate=100/s".parse().unwrap())
            .max_jobs(3)
            .partitions(3);
        for (backend, queue, _) in twins("tiny", &config).await {
            for p in 0..3 {
                queue
                    .enqueue(NewJob::new(group_in(p, 3), vec![]))
                    .await
                    .unwrap();
            }
            let refused = queue.enqueue(NewJob::new(group_in(1, 3), vec![])).await;
            assert!(
                refused.as_ref().is_err_and(|e| e
                    .to_string()
                    .contains("partition 1 of the queue holds its share of max_jobs (1 of 3")),
                "{backend}: {refused:?}"
            );
            assert_eq!(queue.counts().await.unwrap().waiting, 3, "{backend}");
        }
    });
}
