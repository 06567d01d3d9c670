//! Deduplication keys on a virtual clock: what a second job under a live key answers, what
//! replacing does, and that keys whose time ran out are dropped. (Redis answers as memory
//! does: `redis.rs` enqueues under keys in its random scripts.)

use std::time::Duration;

use paceline_queue::{JobState, NewJob, QueueConfig, QueueCore, QueueError};

mod common;

const S: u64 = 1_000_000;

fn queue() -> QueueCore {
    let config = QueueConfig::new(
        "gcra:rate=100/s,burst=100"
            .parse()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    QueueCore::new(config).unwrap_or_else(|e| panic!("{e}"))
}

fn payload_of(q: &QueueCore, id: &str) -> Vec<u8> {
    q.job(id).map(|j| j.payload).unwrap_or_default()
}

#[test]
fn a_live_key_answers_the_first_job_and_a_debounce_replaces_its_payload_while_it_waits() {
    let mut q = queue();
    let minute = Duration::from_secs(60);
    let delayed = NewJob::new("g", b"1".to_vec()).delay(Duration::from_secs(5));
    let first = q
        .enqueue(0, delayed.debounce("k", minute))
        .unwrap_or_else(|e| panic!("{e}"));
    // Scheduled: replaced.
    let again = q
        .enqueue(S, NewJob::new("g", b"2".to_vec()).debounce("k", minute))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            again.id.as_str(),
            again.state,
            again.created,
            again.deduplicated
        ),
        (first.id.as_str(), JobState::Scheduled, false, true)
    );
    assert_eq!(payload_of(&q, &first.id), b"2");
    // A plain dedup does not replace.
    q.enqueue(S, NewJob::new("g", b"3".to_vec()).dedup("k", minute))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(payload_of(&q, &first.id), b"2");
    // Started: not replaced; finished: still the first job's id, `Finished`.
    let leased = q
        .lease(5 * S, "w", 10, None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(leased.len(), 1);
    q.enqueue(5 * S, NewJob::new("g", b"4".to_vec()).debounce("k", minute))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(payload_of(&q, &first.id), b"2");
    q.ack(5 * S, &first.id, leased[0].lease)
        .unwrap_or_else(|e| panic!("{e}"));
    let after = q
        .enqueue(6 * S, NewJob::new("g", b"5".to_vec()).dedup("k", minute))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (after.id.as_str(), after.state, after.estimated_start),
        (first.id.as_str(), JobState::Finished, first.estimated_start)
    );
    // The key runs out a minute after the first enqueue: a new job.
    let fresh = q
        .enqueue(60 * S, NewJob::new("g", b"6".to_vec()).dedup("k", minute))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(fresh.created && !fresh.deduplicated);
    assert_ne!(fresh.id, first.id);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn keys_whose_time_ran_out_are_dropped_by_the_calls_after() {
    let mut q = queue();
    for n in 0..1_500u32 {
        let job = NewJob::new("g", b"x".to_vec()).dedup(format!("key-{n}"), Duration::from_secs(1));
        q.enqueue(0, job).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(q.dedup_keys_held(), 1_500);
    // At most a thousand a call.
    q.counts(2 * S).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(q.dedup_keys_held(), 500);
    q.counts(2 * S).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(q.dedup_keys_held(), 0);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn bad_keys_and_times_to_live_name_their_field_and_add_nothing() {
    let mut q = queue();
    let field = |e: QueueError| match e {
        QueueError::Input(e) => e.field().to_string(),
        other => panic!("not an input error: {other:?}"),
    };
    let job = || NewJob::new("g", b"x".to_vec());
    for (bad, named) in [
        (job().dedup("", Duration::from_secs(1)), "dedup.key"),
        (
            job().dedup("k".repeat(257), Duration::from_secs(1)),
            "dedup.key",
        ),
        (job().dedup("a\tb", Duration::from_secs(1)), "dedup.key"),
        (job().dedup("k", Duration::ZERO), "dedup.ttl_ms"),
        (
            job().dedup("k", Duration::from_secs(366 * 86_400)),
            "dedup.ttl_ms",
        ),
    ] {
        assert_eq!(q.enqueue(0, bad).map_err(field), Err(named.to_string()));
    }
    assert_eq!(q.counts(0).map(|s| s.waiting), Ok(0));
    assert_eq!(q.dedup_keys_held(), 0);
}

/// In Redis: the keys whose time ran out leave the store too.
#[cfg(feature = "redis")]
#[test]
fn keys_whose_time_ran_out_leave_redis() {
    use common::redis::open_at;
    use paceline_core::{Clock, ManualClock};
    use paceline_queue::Queue;
    use paceline_testkit::{runtime, shared_server, unique_name};
    use std::sync::Arc;
    runtime().block_on(async {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let name = unique_name("dedup");
        let config = QueueConfig::new("gcra:rate=100/s".parse().unwrap_or_else(|e| panic!("{e}")));
        let server = shared_server();
        let redis = open_at(
            &server.url(),
            &name,
            config,
            Some(Arc::new(clock.clone()) as Arc<dyn Clock>),
        )
        .await;
        let queue = Queue::new(redis);
        for n in 0..20 {
            let job =
                NewJob::new("g", b"x".to_vec()).dedup(format!("k{n}"), Duration::from_secs(1));
            queue.enqueue(job).await.unwrap_or_else(|e| panic!("{e}"));
        }
        // How many keys match: the reply's first line, `*N`.
        let held = |suffix: &str| {
            let reply = server
                .command(&["KEYS", &format!("*{{q:{name}}}:{suffix}")])
                .unwrap_or_else(|e| panic!("{e}"));
            reply
                .trim_start_matches('*')
                .parse::<u32>()
                .unwrap_or_else(|e| panic!("{reply}: {e}"))
        };
        assert_eq!((held("dedup"), held("dedupx")), (1, 1));
        clock.advance(Duration::from_secs(2));
        queue.counts().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((held("dedup"), held("dedupx")), (0, 0));
    });
}
