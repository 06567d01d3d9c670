//! A retry never costs an attempt or a double action: calls whose replies a relay in front
//! of Redis loses after Redis applied them (what a timeout or a reset after the write looks
//! like) answer as the first would have when made again, and strand nothing.
//!
//! Also the tokens: forged, neighbouring and other jobs' tokens act on nothing.

use std::time::Duration;

use paceline_queue::{
    FailOutcome, Failure, LeaseToken, Leased, NewJob, Queue, QueueConfig, QueueError, RedisQueue,
};
use paceline_testkit::lost_reply::LostReplies;
use paceline_testkit::{connect, unique_name, RedisServer};

fn config() -> QueueConfig {
    QueueConfig::new("gcra:rate=100/s,burst=100".parse().expect("a policy"))
        .lease(Duration::from_secs(60))
        .max_attempts(1)
}

/// A queue through the relay, and one straight to Redis for looking at it.
async fn queues(redis: &RedisServer, relay: &LostReplies) -> (Queue, Queue) {
    let name = unique_name("lost");
    let through = RedisQueue::open(connect(&relay.url()).await, &name, config(), None)
        .await
        .expect("open through the relay");
    let direct = RedisQueue::open(connect(&redis.url()).await, &name, config(), None)
        .await
        .expect("open directly");
    (Queue::new(through), Queue::new(direct))
}

/// A relay in front of `redis`, the queues through it and beside it, and job `a` leased
/// through the relay.
async fn one_leased(redis: &RedisServer) -> (LostReplies, Queue, Queue, Leased) {
    let relay = LostReplies::start(redis.port()).await.expect("relay");
    let (queue, direct) = queues(redis, &relay).await;
    enqueue(&direct, &["a"]).await;
    let job = queue
        .lease("w", 1, None, Duration::ZERO)
        .await
        .expect("lease")
        .remove(0);
    (relay, queue, direct, job)
}

async fn enqueue(queue: &Queue, ids: &[&str]) {
    for id in ids {
        queue
            .enqueue(NewJob::new("g", b"{}".to_vec()).id(*id))
            .await
            .expect("enqueue");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_reply_is_lost_answers_the_jobs_it_took_and_strands_none() {
    let redis = RedisServer::start().expect("redis");
    let relay = LostReplies::start(redis.port()).await.expect("relay");
    let (queue, direct) = queues(&redis, &relay).await;
    enqueue(&direct, &["a", "b", "c"]).await;

    relay.lose_next(b"lease", 1);
    let jobs = queue
        .lease("w", 2, None, Duration::ZERO)
        .await
        .expect("the lease, made once more inside the queue");
    assert_eq!(relay.lost(), 1, "the relay lost the first answer");
    let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    let stats = direct.counts().await.expect("counts");
    assert_eq!(
        (stats.active, stats.waiting),
        (2, 1),
        "exactly the jobs answered are active"
    );
    assert_eq!(stats.totals.started, 2, "each job started once");
    for job in &jobs {
        assert_eq!(job.attempt, 1);
        queue.ack(&job.id, &job.token).await.expect("ack");
    }
    assert_eq!(direct.counts().await.expect("counts").totals.acked, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_failed_twice_is_recovered_by_its_request_id() {
    let redis = RedisServer::start().expect("redis");
    let relay = LostReplies::start(redis.port()).await.expect("relay");
    let (queue, direct) = queues(&redis, &relay).await;
    enqueue(&direct, &["a", "b"]).await;

    // Both the call and the queue's own second try lose their answers: the caller sees
    // the store's error (a 503 over HTTP) ...
    relay.lose_next(b"lease", 2);
    let failed = queue
        .lease_request("w", 1, None, Duration::ZERO, Some("call-7"))
        .await;
    assert!(matches!(failed, Err(QueueError::Store(_))), "{failed:?}");
    // ... and asking again with the same id gets the job the first call took, not the next.
    let again = queue
        .lease_request("w", 1, None, Duration::ZERO, Some("call-7"))
        .await
        .expect("the retry");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, "a");
    let stats = direct.counts().await.expect("counts");
    assert_eq!(
        (stats.active, stats.waiting, stats.totals.started),
        (1, 1, 1)
    );
    // Another id takes the next job.
    let next = queue
        .lease_request("w", 1, None, Duration::ZERO, Some("call-8"))
        .await
        .expect("another call");
    assert_eq!(next[0].id, "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_whose_reply_is_lost_answers_ok_and_acks_once() {
    let redis = RedisServer::start().expect("redis");
    let (relay, queue, direct, job) = one_leased(&redis).await;

    relay.lose_next(b"ack", 1);
    queue.ack(&job.id, &job.token).await.expect("the ack");
    assert_eq!(relay.lost(), 1);
    // A caller that saw an error retries too: the same answer, nothing counted twice.
    queue.ack(&job.id, &job.token).await.expect("the ack again");
    let stats = direct.counts().await.expect("counts");
    assert_eq!((stats.active, stats.totals.acked), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_report_whose_reply_is_lost_is_applied_once() {
    let redis = RedisServer::start().expect("redis");
    let (relay, queue, direct, job) = one_leased(&redis).await;

    relay.lose_next(b"fail", 1);
    let retry = Failure::Retry {
        error: Some("upstream 500".into()),
        after: Some(Duration::from_secs(30)),
    };
    let first = queue
        .fail(&job.id, &job.token, retry.clone())
        .await
        .expect("the report");
    // The queue's own second try found its first applied.
    assert_eq!(first, FailOutcome::Repeated);
    assert_eq!(
        queue.fail(&job.id, &job.token, retry).await,
        Ok(FailOutcome::Repeated)
    );
    let stats = direct.counts().await.expect("counts");
    assert_eq!(
        (stats.totals.failed, stats.totals.dead),
        (1, 1),
        "one failure (of one attempt allowed): dead once"
    );
    let info = direct.job("a").await.expect("job").expect("kept dead");
    assert_eq!(info.attempts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_the_queue_did_not_sign_for_the_job_act_on_nothing() {
    let redis = RedisServer::start().expect("redis");
    let relay = LostReplies::start(redis.port()).await.expect("relay");
    let (queue, direct) = queues(&redis, &relay).await;
    enqueue(&direct, &["a", "b"]).await;
    let jobs = queue
        .lease("w", 2, None, Duration::ZERO)
        .await
        .expect("lease");
    let (a, b) = (&jobs[0], &jobs[1]);
    // The other job's token, the fence as text, a token from another queue, every
    // one-digit change: all lost leases, and the job stays held.
    let other_queue = Queue::in_memory("lost", config()).expect("a queue");
    other_queue
        .enqueue(NewJob::new("g", b"{}".to_vec()).id("a"))
        .await
        .expect("enqueue");
    let foreign = other_queue
        .lease("w", 1, None, Duration::ZERO)
        .await
        .expect("lease")
        .remove(0)
        .token;
    let mut guesses: Vec<LeaseToken> = vec![b.token.clone(), foreign];
    let text = a.token.as_str();
    for (i, digit) in text.char_indices() {
        let changed = if digit == '0' { '1' } else { '0' };
        let mut guess = text.to_string();
        guess.replace_range(i..=i, &changed.to_string());
        guesses.push(guess.parse().expect("hex"));
    }
    for guess in &guesses {
        assert!(
            matches!(
                queue.ack(&a.id, guess).await,
                Err(QueueError::LeaseLost { .. })
            ),
            "{guess}"
        );
    }
    assert!(format!("{}", a.lease).parse::<LeaseToken>().is_err());
    let stats = direct.counts().await.expect("counts");
    assert_eq!((stats.active, stats.totals.acked), (2, 0));
    // A token opened by another process on the same Redis works: the key is shared.
    direct
        .ack(&a.id, &a.token)
        .await
        .expect("ack from another handle");
}
