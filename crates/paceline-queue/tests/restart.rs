//! A queue in Redis across a restart of Redis: with persistence nothing acknowledged is
//! lost, and a configuration gone from Redis comes back from the next handle that calls.

use std::time::Duration;

use paceline_queue::{Failure, NewJob, Queue, QueueConfig, QueueError};
use paceline_testkit::{runtime, shared_server, unique_name};

mod common;
use common::redis::open_at;

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
