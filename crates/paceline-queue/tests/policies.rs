//! Group policies set at run time: in memory on a virtual clock, and in Redis, where every
//! handle on the queue sees them and a configuration change leaves them in place. (Redis
//! answers as memory does in random scripts too: `redis.rs`.)

use paceline_core::Policy;
use paceline_queue::core::PolicySource;
use paceline_queue::{NewJob, QueueConfig, QueueCore, QueueError};

mod common;

const S: u64 = 1_000_000;

fn policy(spec: &str) -> Policy {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn hourly() -> QueueConfig {
    QueueConfig::new(policy("fixed_window:limit=1,window=1h"))
        .group("guild:vip", policy("fixed_window:limit=2,window=1h"))
}

fn started(q: &mut QueueCore, now: u64) -> usize {
    q.lease(now, "w", 100, None)
        .unwrap_or_else(|e| panic!("{e}"))
        .len()
}

fn fill(q: &mut QueueCore, group: &str, n: usize) {
    for _ in 0..n {
        q.enqueue(0, NewJob::new(group, b"x".to_vec()))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn a_raised_limit_starts_a_refused_group_at_once_and_a_new_algorithm_starts_afresh() {
    let mut q = QueueCore::new(hourly()).unwrap_or_else(|e| panic!("{e}"));
    fill(&mut q, "guild:1", 20);
    assert_eq!(started(&mut q, 0), 1);
    // Refused until the next hour; raised now, the group is asked again at once, and the
    // window's count carries over (the same algorithm): 4 more of 5.
    assert_eq!(started(&mut q, S), 0);
    let five = policy("fixed_window:limit=5,window=1h");
    q.set_policy(S, "guild:1", Some(five.clone()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(started(&mut q, S), 4);
    assert_eq!(q.policy("guild:1"), Ok((five, PolicySource::RunTime)));
    // Another algorithm: no state of its own yet, so its burst is whole.
    q.set_policy(S, "guild:1", Some(policy("gcra:rate=1/s,burst=3")))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(started(&mut q, S), 3);
    // Unset: back to the default, an algorithm again other than the state's: afresh, one
    // this hour.
    q.set_policy(S, "guild:1", None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        q.policy("guild:1"),
        Ok((
            policy("fixed_window:limit=1,window=1h"),
            PolicySource::Default
        ))
    );
    assert_eq!(started(&mut q, 2 * S), 1);
    assert_eq!(started(&mut q, 3 * S), 0);
    assert_eq!(q.check_invariants(), Ok(()));
}

#[test]
fn a_run_time_policy_outlives_a_configuration_change_until_unset() {
    let mut q = QueueCore::new(hourly()).unwrap_or_else(|e| panic!("{e}"));
    let minute = policy("fixed_window:limit=60,window=1m");
    q.set_policy(0, "guild:vip", Some(minute.clone()))
        .unwrap_or_else(|e| panic!("{e}"));
    let changed = hourly().group("guild:vip", policy("fixed_window:limit=7,window=1h"));
    q.set_config(changed).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(q.policy("guild:vip"), Ok((minute, PolicySource::RunTime)));
    q.set_policy(0, "guild:vip", None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        q.policy("guild:vip"),
        Ok((
            policy("fixed_window:limit=7,window=1h"),
            PolicySource::Config
        ))
    );
}

#[test]
fn a_policy_a_queue_cannot_use_or_a_bad_group_is_refused_naming_it() {
    let mut q = QueueCore::new(hourly()).unwrap_or_else(|e| panic!("{e}"));
    fill(&mut q, "guild:1", 2);
    let field = |e: QueueError| match e {
        QueueError::Input(e) => e.field().to_string(),
        other => panic!("not an input error: {other:?}"),
    };
    for (group, spec, named) in [
        ("guild:1", "concurrency:limit=5,lease=30s", "policy"),
        ("guild:1", "exec_evenly:points=10,duration=1s", "policy"),
        ("", "gcra:rate=1/s", "group"),
        ("a\nb", "gcra:rate=1/s", "group"),
    ] {
        let refused = q.set_policy(0, group, Some(policy(spec))).map_err(field);
        assert_eq!(refused, Err(named.to_string()), "{group:?} {spec}");
    }
    assert_eq!(q.policy("").map_err(field), Err("group".to_string()));
    // Nothing changed: still one an hour.
    assert_eq!(started(&mut q, 0), 1);
    assert_eq!(started(&mut q, 0), 0);
}

/// In Redis: a policy set through one handle is what another handle sees, and one that
/// opens the queue with a changed configuration leaves it in place.
#[cfg(feature = "redis")]
#[test]
fn every_handle_sees_a_run_time_policy_and_a_new_configuration_keeps_it() {
    use common::redis::open_at;
    use paceline_core::{Clock, ManualClock};
    use paceline_queue::Queue;
    use paceline_testkit::{runtime, shared_server, unique_name};
    use std::sync::Arc;
    use std::time::Duration;
    runtime().block_on(async {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let url = shared_server().url();
        let name = unique_name("policies");
        let first = Queue::new(open_at(&url, &name, hourly(), Some(Arc::clone(&shared))).await);
        for _ in 0..6 {
            first
                .enqueue(NewJob::new("guild:1", b"x".to_vec()))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let lease = |q: Queue| async move {
            q.lease("w", 100, None, Duration::ZERO)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .len()
        };
        assert_eq!(lease(first.clone()).await, 1);
        let five = policy("fixed_window:limit=5,window=1h");
        first
            .set_policy("guild:1", Some(&five))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Another process, with another configuration.
        let changed = hourly().group("guild:vip", policy("gcra:rate=1/s"));
        let second = Queue::new(open_at(&url, &name, changed, Some(Arc::clone(&shared))).await);
        assert_eq!(
            second.policy("guild:1").await,
            Ok((five, PolicySource::RunTime))
        );
        assert_eq!(
            second.policy("guild:vip").await,
            Ok((policy("gcra:rate=1/s"), PolicySource::Config))
        );
        assert_eq!(lease(second.clone()).await, 4);
        second
            .set_policy("guild:1", None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            first.policy("guild:1").await.map(|p| p.1),
            Ok(PolicySource::Default)
        );
        clock.advance(Duration::from_secs(3_600));
        assert_eq!(lease(first).await, 1);
    });
}
