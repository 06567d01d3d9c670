//! The queue in Redis against the queue in memory: random sequences of every operation on
//! one virtual clock give the same answers, step by step (ids, estimates, leases, tokens,
//! outcomes, errors, counts, jobs), on a Redis server and on a 3-primary Redis Cluster,
//! through the test kit's differential harness; and the same events, in the same order
//! (for a queue of several partitions, in the same order within each group).
//!
//! What only Redis has is tested beside this file: handles sharing a queue (`handles.rs`),
//! queues on a cluster (`cluster.rs`), restarts (`restart.rs`), kills (`kill.rs`), and the
//! Redis twin against the core at its edges (`twin.rs`), queues of several partitions
//! (`partitions.rs`; their differential is here).

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, ManualClock, Policy};
use paceline_queue::core::PolicySource;
use paceline_queue::schedule::{Schedule, ScheduleInfo};
use paceline_queue::{
    Enqueued, Event, FailOutcome, Failure, JobInfo, JobState, LeaseToken, Leased, MemoryQueue,
    NewJob, Partitioned, Queue, QueueConfig, QueueError, RedisQueue, Stats, Watched,
};
use paceline_testkit::differential::{self, At, Cases, Differential, Redis, Tick};
use paceline_testkit::{connect, runtime, unique_name};
use proptest::prelude::*;

mod common;
use common::POLICIES;

/// Cron expressions the steps put: every second, every other, every minute.
const CRONS: &[&str] = &["* * * * * *", "*/2 * * * * *", "0 * * * * *"];

#[derive(Clone, Debug)]
enum Step {
    Enqueue {
        group: u8,
        delay_ms: u16,
        /// A not-before time, in ms from the step's time (negative: already past).
        not_before_ms: Option<i16>,
        id: Option<u8>,
        max_attempts: Option<u8>,
        /// A deduplication key, its time to live (ms) and whether it replaces.
        dedup: Option<(u8, u16, bool)>,
        /// The job's priority and cost.
        urgency: (u8, u8),
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
    /// A progress report on a held job.
    Progress {
        pick: u8,
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
    /// A listing of jobs: scheduled, waiting (of one group, or all), active or dead, from an
    /// offset.
    Jobs {
        state: u8,
        group: Option<u8>,
        offset: u8,
    },
    RetryDead {
        all: bool,
        id: u8,
    },
    PurgeDead,
    /// A pause of a group (`None`: the queue) for `ms` (`None`: until resumed; 0: a
    /// length refused).
    Pause {
        group: Option<u8>,
        ms: Option<u16>,
    },
    Resume {
        group: Option<u8>,
    },
    /// A group's policy set at run time (`None`: unset): one of `POLICIES`, or one a queue
    /// cannot use.
    SetPolicy {
        group: u8,
        policy: Option<u8>,
    },
    Policy {
        group: u8,
    },
    /// A schedule put: its name, one of `CRONS` (past its end: one that never fires), its
    /// group.
    PutSchedule {
        name: u8,
        cron: u8,
        group: u8,
    },
    DeleteSchedule {
        name: u8,
    },
    /// The schedules listed, then the due ones fired.
    FireSchedules,
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
    Pause { group: u8 },
}

fn sub() -> impl Strategy<Value = Sub> {
    prop_oneof![
        (0u8..3).prop_map(|group| Sub::Enqueue { group }),
        any::<u8>().prop_map(|pick| Sub::Ack { pick }),
        (1u8..4).prop_map(|max_jobs| Sub::Lease { max_jobs }),
        any::<u8>().prop_map(|pick| Sub::Fail { pick }),
        (0u8..3).prop_map(|group| Sub::Pause { group }),
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
            (Sub::Pause { group }, _) => (
                format!(
                    "{:?}",
                    queue
                        .pause(Some(&format!("g{group}")), Some(Duration::from_millis(500)))
                        .await
                ),
                Vec::new(),
            ),
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
              proptest::option::of(0u8..6), proptest::option::of(1u8..4),
              prop_oneof![2 => Just(None), 1 => (0u8..3, 1u16..3_000, any::<bool>()).prop_map(Some)],
              (prop_oneof![2 => Just(0u8), 1 => 0u8..10], prop_oneof![3 => Just(1u8), 1 => 1u8..5]))
            .prop_map(|(group, delay_ms, not_before_ms, id, max_attempts, dedup, urgency)| Step::Enqueue {
                group, delay_ms, not_before_ms, id, max_attempts, dedup, urgency,
            }),
        1 => proptest::collection::vec(0u8..3, 1..6).prop_map(|groups| Step::Batch { groups }),
        5 => (1u8..4, proptest::option::of(1u16..3_000)).prop_map(|(max_jobs, lease_ms)| Step::Lease { max_jobs, lease_ms }),
        3 => (any::<u8>(), proptest::bool::weighted(0.1)).prop_map(|(pick, stale)| Step::Ack { pick, stale }),
        2 => (any::<u8>(), 0u8..5, 1u16..3_000).prop_map(|(pick, kind, ms)| Step::Fail { pick, kind, ms }),
        1 => (any::<u8>(), 1u16..3_000).prop_map(|(pick, ms)| Step::Extend { pick, ms }),
        1 => any::<u8>().prop_map(|pick| Step::Progress { pick }),
        5 => (1u16..2_500).prop_map(|ms| Step::Advance { ms }),
        1 => (0u8..8).prop_map(|id| Step::Cancel { id }),
        1 => (0u8..8).prop_map(|id| Step::Job { id }),
        1 => Just(Step::Stats),
        1 => Just(Step::Dead),
        1 => (0u8..5, proptest::option::of(0u8..3), prop_oneof![3 => Just(0u8), 1 => 0u8..4])
            .prop_map(|(state, group, offset)| Step::Jobs { state, group, offset }),
        1 => (any::<bool>(), 0u8..8).prop_map(|(all, id)| Step::RetryDead { all, id }),
        1 => Just(Step::PurgeDead),
        1 => (proptest::option::of(0u8..3), proptest::option::of(prop_oneof![1 => Just(0u16), 6 => 1u16..4_000]))
            .prop_map(|(group, ms)| Step::Pause { group, ms }),
        1 => proptest::option::of(0u8..3).prop_map(|group| Step::Resume { group }),
        1 => (0u8..3, proptest::option::of(0u8..8)).prop_map(|(group, policy)| Step::SetPolicy { group, policy }),
        1 => (0u8..3).prop_map(|group| Step::Policy { group }),
        1 => (0u8..3, 0u8..4, 0u8..3).prop_map(|(name, cron, group)| Step::PutSchedule { name, cron, group }),
        1 => (0u8..3).prop_map(|name| Step::DeleteSchedule { name }),
        2 => Just(Step::FireSchedules),
        2 => proptest::collection::vec(sub(), 2..8).prop_map(|subs| Step::Together { subs }),
    ]
}

/// Ids the steps name: a producer's (`job-N`) or a generated one (`N`; of a queue of
/// several partitions, `N` or `N.P` for the partition `P = N mod partitions`).
fn id_of(n: u8, partitions: u32) -> String {
    let k = u32::from(n / 2 + 1);
    match (n.is_multiple_of(2), k % partitions) {
        (true, _) => format!("job-{}", n / 2),
        (false, 0) => format!("{k}"),
        (false, p) => format!("{k}.{p}"),
    }
}

impl differential::Step<Said> for Step {
    fn tick(&self, _: &[Said]) -> Option<Tick> {
        match self {
            Step::Advance { ms } => Some(Tick::By(Duration::from_millis(u64::from(*ms)))),
            _ => None,
        }
    }
}

/// What a queue said to a step.
#[derive(Debug, PartialEq)]
enum Said {
    Enqueued(Result<Enqueued, QueueError>),
    Batch(Vec<Result<Enqueued, QueueError>>),
    Leased(Result<Vec<Leased>, QueueError>),
    Acked(Result<(), QueueError>),
    Failed(Result<FailOutcome, QueueError>),
    Extended(Result<u64, QueueError>),
    Cancelled(Result<(), QueueError>),
    Job(Result<Option<JobInfo>, QueueError>),
    /// The stats, then the counts.
    Stats(Result<Stats, QueueError>, Result<Stats, QueueError>),
    Dead(Result<Vec<JobInfo>, QueueError>),
    Retried(Result<usize, QueueError>),
    Purged(Result<usize, QueueError>),
    Paused(Result<u64, QueueError>),
    Resumed(Result<(), QueueError>),
    PolicySet(Result<(), QueueError>),
    Schedule(Result<ScheduleInfo, QueueError>),
    ScheduleDeleted(Result<bool, QueueError>),
    /// The schedules, then what firing the due ones answered.
    Fired(
        Result<Vec<ScheduleInfo>, QueueError>,
        Result<(Vec<Enqueued>, Option<u64>), QueueError>,
    ),
    Policy(Result<(Policy, PolicySource), QueueError>),
    /// Each operation's outcome, as text.
    Together(Vec<String>),
    /// No lease to act on.
    Nothing,
}

/// A queue as a twin, with the leases it handed out and those given up, as its own answers
/// say.
struct QueueTwin {
    queue: Queue,
    /// The queue's partitions: of several, a lease call names its request (`call-STEP`),
    /// which picks the partition it starts with, alike in both twins.
    partitions: u32,
    held: Vec<(String, LeaseToken)>,
    spent: Vec<(String, LeaseToken)>,
}

impl QueueTwin {
    fn new(queue: Queue) -> QueueTwin {
        QueueTwin {
            partitions: queue.config().partitions,
            queue,
            held: Vec::new(),
            spent: Vec::new(),
        }
    }

    /// The lease `p` names among `held` (`stale`: among those given up), given up now.
    fn give_up(&mut self, p: u8, stale: bool) -> Option<(String, LeaseToken)> {
        let from = if stale { &self.spent } else { &self.held };
        let lease = (!from.is_empty()).then(|| from[p as usize % from.len()].clone())?;
        self.held.retain(|h| h.1 != lease.1);
        self.spent.push(lease.clone());
        Some(lease)
    }
}

impl differential::Twin<Step> for QueueTwin {
    type Answer = Said;

    async fn apply(&mut self, step: &Step, at: At) -> Said {
        let queue = &self.queue;
        match step.clone() {
            Step::Enqueue {
                group,
                delay_ms,
                not_before_ms,
                id,
                max_attempts,
                dedup,
                urgency: (priority, cost),
            } => {
                let mut job = NewJob::new(format!("g{group}"), vec![group, 0xff, at.index as u8])
                    .delay(Duration::from_millis(u64::from(delay_ms)))
                    .priority(priority)
                    .cost(u32::from(cost));
                if let Some(d) = not_before_ms {
                    let at = at.now.saturating_add_signed(i64::from(d) * 1_000);
                    job = job.not_before(std::time::UNIX_EPOCH + Duration::from_micros(at));
                }
                if let Some(id) = id {
                    job = job.id(format!("job-{id}"));
                }
                if let Some(m) = max_attempts {
                    job = job.max_attempts(u32::from(m));
                }
                if let Some((key, ms, replace)) = dedup {
                    let ttl = Duration::from_millis(u64::from(ms));
                    let key = format!("k{key}");
                    job = if replace {
                        job.debounce(key, ttl)
                    } else {
                        job.dedup(key, ttl)
                    };
                }
                Said::Enqueued(queue.enqueue(job).await)
            }
            Step::Batch { groups } => {
                let jobs: Vec<NewJob> = groups
                    .iter()
                    .map(|g| NewJob::new(format!("g{g}"), b"batch".to_vec()))
                    .collect();
                Said::Batch(queue.enqueue_batch(jobs).await)
            }
            Step::Lease { max_jobs, lease_ms } => {
                let lease = lease_ms.map(|ms| Duration::from_millis(u64::from(ms)));
                let request = (self.partitions > 1).then(|| format!("call-{}", at.index));
                let leased = queue
                    .lease_request(
                        "w",
                        usize::from(max_jobs),
                        lease,
                        Duration::ZERO,
                        request.as_deref(),
                    )
                    .await;
                if let Ok(jobs) = &leased {
                    self.held
                        .extend(jobs.iter().map(|j| (j.id.clone(), j.token.clone())));
                }
                Said::Leased(leased)
            }
            Step::Ack { pick: p, stale } => match self.give_up(p, stale) {
                // Every other ack with a result.
                Some((id, token)) if p % 2 == 0 => {
                    let result = format!("r{p}");
                    let acked = self
                        .queue
                        .ack_with_result(&id, &token, Some(result.as_bytes()));
                    Said::Acked(acked.await)
                }
                Some((id, token)) => Said::Acked(self.queue.ack(&id, &token).await),
                None => Said::Nothing,
            },
            Step::Fail { pick: p, kind, ms } => {
                let Some((id, token)) = self.give_up(p, false) else {
                    return Said::Nothing;
                };
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
                Said::Failed(self.queue.fail(&id, &token, failure).await)
            }
            Step::Extend { pick: p, ms } => {
                if self.held.is_empty() {
                    return Said::Nothing;
                }
                let (id, token) = self.held[p as usize % self.held.len()].clone();
                let d = Duration::from_millis(u64::from(ms));
                Said::Extended(queue.extend(&id, &token, d).await)
            }
            Step::Progress { pick: p } => {
                if self.held.is_empty() {
                    return Said::Nothing;
                }
                let (id, token) = self.held[p as usize % self.held.len()].clone();
                let report = format!("{{\"done\": {p}}}");
                Said::Acked(queue.progress(&id, &token, report.as_bytes()).await)
            }
            Step::Advance { .. } => unreachable!("clock steps are the runner's"),
            Step::Cancel { id } => Said::Cancelled(queue.cancel(&id_of(id, self.partitions)).await),
            Step::Job { id } => Said::Job(queue.job(&id_of(id, self.partitions)).await),
            Step::Stats => Said::Stats(queue.stats().await, queue.counts().await),
            Step::Dead => Said::Dead(queue.dead(0, 100).await),
            Step::Jobs {
                state,
                group,
                offset,
            } => {
                let state = [
                    JobState::Scheduled,
                    JobState::Waiting,
                    JobState::Active,
                    JobState::Dead,
                    JobState::Completed,
                ][usize::from(state)];
                // A group only for waiting jobs: any other state with one is an error.
                let group = group.map(|g| format!("g{g}"));
                let listed = queue
                    .jobs(state, group.as_deref(), usize::from(offset), 5)
                    .await;
                Said::Dead(listed)
            }
            Step::RetryDead { all, id } => {
                let ids = vec![id_of(id, self.partitions), id_of(id, self.partitions)];
                let ids = (!all).then_some(ids.as_slice());
                Said::Retried(queue.retry_dead(ids).await)
            }
            Step::PurgeDead => Said::Purged(queue.purge_dead().await),
            Step::Pause { group, ms } => {
                let group = group.map(|g| format!("g{g}"));
                let length = ms.map(|ms| Duration::from_millis(u64::from(ms)));
                Said::Paused(queue.pause(group.as_deref(), length).await)
            }
            Step::Resume { group } => {
                let group = group.map(|g| format!("g{g}"));
                Said::Resumed(queue.resume(group.as_deref()).await)
            }
            Step::SetPolicy { group, policy } => {
                // Past the list: a policy no queue can use.
                let spec = policy.map(|p| {
                    POLICIES
                        .get(usize::from(p))
                        .copied()
                        .unwrap_or("concurrency:limit=5,lease=30s")
                });
                let policy: Option<Policy> =
                    spec.map(|s| s.parse().unwrap_or_else(|e| panic!("{s}: {e}")));
                Said::PolicySet(
                    queue
                        .set_policy(&format!("g{group}"), policy.as_ref())
                        .await,
                )
            }
            Step::Policy { group } => Said::Policy(queue.policy(&format!("g{group}")).await),
            Step::PutSchedule { name, cron, group } => {
                let cron = CRONS
                    .get(usize::from(cron))
                    .copied()
                    .unwrap_or("0 0 30 2 *");
                let schedule = Schedule::new(cron, format!("g{group}"), vec![b's', name]);
                Said::Schedule(queue.put_schedule(&format!("s{name}"), &schedule).await)
            }
            Step::DeleteSchedule { name } => {
                Said::ScheduleDeleted(queue.delete_schedule(&format!("s{name}")).await)
            }
            Step::FireSchedules => {
                Said::Fired(queue.schedules().await, queue.fire_due_schedules().await)
            }
            Step::Together { subs } => {
                // Each ack or fail takes a distinct lease the twin holds.
                let subs: Vec<(Sub, Option<(String, LeaseToken)>)> = subs
                    .into_iter()
                    .map(|sub| {
                        let lease = match &sub {
                            Sub::Ack { pick: p } | Sub::Fail { pick: p } => self.give_up(*p, false),
                            _ => None,
                        };
                        (sub, lease)
                    })
                    .collect();
                let (said, leased) = together(&self.queue, &subs).await;
                self.held.extend(leased);
                Said::Together(said)
            }
        }
    }
}

/// A queue's limits over all its groups: a policy of `POLICIES` (none past its end) and a
/// concurrency cap.
type QueueWide = (usize, u32);

/// Runs `steps` on the queue in memory and in Redis, on a server and on a cluster,
/// comparing every answer, and their stats at the end.
async fn differential(
    spec: &str,
    cap: u32,
    wide: QueueWide,
    keep: bool,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    differential_of(spec, cap, 1, wide, keep, steps).await
}

/// [`differential`] of a queue of `partitions`.
async fn differential_of(
    spec: &str,
    cap: u32,
    partitions: u32,
    (queue_policy, queue_cap): QueueWide,
    keep: bool,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let policy: Policy = spec
        .parse()
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let mut config = QueueConfig::new(policy)
        .partitions(partitions)
        .queue_concurrency(queue_cap)
        .group_concurrency(cap)
        .max_attempts(3)
        .lease(Duration::from_millis(1_500))
        .retry_backoff(Duration::from_millis(200), Duration::from_secs(2));
    if keep {
        // Few and short, so that the steps reach every bound.
        config = config
            .keep_completed(3, Some(Duration::from_secs(2)))
            .keep_dead(Some(2), Some(Duration::from_secs(3)));
    }
    if let Some(spec) = POLICIES.get(queue_policy) {
        let policy: Policy = spec
            .parse()
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        config = config.queue_policy(policy);
    }
    config.groups.insert(
        "g2".into(),
        "fixed_window:limit=1,window=700ms"
            .parse()
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?,
    );
    let mut script = steps;
    script.push(Step::Stats);
    for redis in Redis::BOTH {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        // One name and one signing key: both sides hand out the same tokens.
        let name = unique_name("diff");
        let store = connect(&redis.url()).await;
        let key = store
            .token_key(paceline_queue::token::LEASE_KEY)
            .await
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(format!("{e}"));
        let (memory, twin) = if partitions == 1 {
            let memory = MemoryQueue::with_clock(&name, config.clone(), Arc::clone(&shared))
                .map_err(|e| fail(&e))?
                .with_token_key(key);
            let redis = RedisQueue::open(store, &name, config.clone(), Some(shared))
                .await
                .map_err(|e| fail(&e))?;
            (Queue::new(memory), Queue::new(redis))
        } else {
            let memory = Partitioned::in_memory(&name, config.clone(), Arc::clone(&shared))
                .map_err(|e| fail(&e))?
                .with_token_key(key);
            let redis = Partitioned::open(store, &name, config.clone(), Some(shared))
                .await
                .map_err(|e| fail(&e))?;
            (Queue::new(memory), Queue::new(redis))
        };
        let mut memory_events = memory.events().await.map_err(|e| fail(&e))?;
        let mut redis_events = twin.events().await.map_err(|e| fail(&e))?;
        let mut memory = QueueTwin::new(memory);
        // Kept to the end: a queue's handle dropped stops following its events.
        let mut twins = [(redis.name(), QueueTwin::new(twin))];
        Differential::new(&clock)
            .run(&script, ("memory", &mut memory), &mut twins)
            .await?;
        // Every event the memory queue told, already sent; then as many from Redis.
        let mut told = Vec::new();
        while let Some(w) = memory_events.try_next() {
            told.push(w);
        }
        let mut heard = Vec::new();
        while heard.len() < told.len() {
            match tokio::time::timeout(Duration::from_secs(20), redis_events.next()).await {
                Ok(Some(w)) => heard.push(w),
                _ => break,
            }
        }
        let (told, heard) = (in_order(told, partitions), in_order(heard, partitions));
        prop_assert_eq!(told, heard, "the events on {} differ", redis.name());
    }
    Ok(())
}

/// The events `watched` told, in the order a queue of `partitions` keeps: each group's in
/// the order they came (the partitions' feeds interleave as they come). The queue-wide
/// events (no group: a pause of the queue, told by each partition) are ordered by time, and
/// those of one time by what they say: partitions tell theirs in no order between them.
fn in_order(watched: Vec<Watched>, partitions: u32) -> Vec<Event> {
    let mut events: Vec<Event> = watched
        .into_iter()
        .map(|w| match w {
            Watched::Event(e) => e,
            Watched::Missed(n) => panic!("a listener missed {n} events of a short script"),
        })
        .collect();
    if partitions > 1 {
        events.sort_by(|a, b| {
            a.group.cmp(&b.group).then_with(|| {
                if a.group.is_some() {
                    std::cmp::Ordering::Equal
                } else {
                    (a.time, format!("{a:?}")).cmp(&(b.time, format!("{b:?}")))
                }
            })
        });
    }
    events
}

/// Queues of several partitions (2, or 4 with one left empty: the groups `g0`, `g1`,
/// `g2` hash to partitions 0, 1, 0 of 2 and 2, 1, 0 of 4), in memory and in Redis, on a
/// server (every partition on it) and on a 3-primary cluster (the partitions on their
/// primaries): the same answers, ids, fences and tokens. Operations issued together leave
/// out leases: a lease asks its partitions one after another, so an operation issued with
/// it may reach a partition before or after it, both right.
#[test]
fn partitioned_redis_answers_as_partitioned_memory_does() {
    let cases = (
        0..POLICIES.len(),
        prop_oneof![Just(0u32), 1u32..3],
        prop_oneof![Just(2u32), Just(4u32)],
        any::<bool>(),
        proptest::collection::vec(step(), 1..80),
    );
    Cases::new(24).run(&cases, |(policy, cap, partitions, keep, steps)| {
        let steps = steps
            .into_iter()
            .map(|step| match step {
                Step::Together { subs } => Step::Together {
                    subs: subs
                        .into_iter()
                        .filter(|s| !matches!(s, Sub::Lease { .. }))
                        .collect(),
                },
                step => step,
            })
            .collect();
        runtime().block_on(differential_of(
            POLICIES[policy],
            cap,
            partitions,
            (usize::MAX, 0),
            keep,
            steps,
        ))
    });
}

#[test]
fn redis_answers_as_memory_does() {
    let cases = (
        0..POLICIES.len(),
        prop_oneof![Just(0u32), 1u32..3],
        proptest::collection::vec(step(), 1..80),
        any::<bool>(),
    );
    Cases::new(48)
        .regressions(file!())
        .run(&cases, |(policy, cap, steps, keep)| {
            let wide = (usize::MAX, 0);
            runtime().block_on(differential(POLICIES[policy], cap, wide, keep, steps))
        });
}

/// Queues with limits over all their groups too (a policy, a concurrency cap or both), and
/// keeping few completed and dead jobs for a short time: the same answers in memory and in
/// Redis.
#[test]
fn redis_answers_as_memory_does_under_a_queue_wide_limit() {
    let cases = (
        0..POLICIES.len(),
        prop_oneof![Just(0u32), 1u32..3],
        (
            prop_oneof![1 => Just(usize::MAX), 3 => 0..POLICIES.len()],
            prop_oneof![Just(0u32), 1u32..4],
        ),
        proptest::collection::vec(step(), 1..80),
    );
    Cases::new(32).run(&cases, |(policy, cap, wide, steps)| {
        runtime().block_on(differential(POLICIES[policy], cap, wide, true, steps))
    });
}
