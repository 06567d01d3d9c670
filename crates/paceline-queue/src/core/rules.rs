//! The rules the queue in memory and its twin in Redis both keep: argument checks, the
//! answers of a full queue and of a held job, a job's error cut to size, durations in
//! microseconds, and the backoff's jitter.

use std::time::Duration;

use paceline_core::{round_to_micros, InputError, StoreError, StoreErrorKind};

use super::{MAX_ERROR, MAX_LEASE_JOBS, MAX_PAUSE, MAX_WORKER};
use crate::config::QueueConfig;
use crate::error::QueueError;
use crate::job::{check_lease_length, check_request_id, Failure};

/// A Duration in whole microseconds, rounded up, at least 1.
pub(crate) fn micros_up(d: Duration) -> u64 {
    let us = round_to_micros(d);
    if Duration::from_micros(us) < d {
        us + 1
    } else {
        us.max(1)
    }
}

/// The error kept on a job: at most [`MAX_ERROR`] bytes, cut at a character boundary.
pub(crate) fn cut(error: Option<String>) -> Option<String> {
    error.map(|mut e| {
        if e.len() > MAX_ERROR {
            let mut end = MAX_ERROR;
            while !e.is_char_boundary(end) {
                end -= 1;
            }
            e.truncate(end);
        }
        e
    })
}

/// Checks a progress report or an acknowledgement's result: at most the queue's largest
/// payload (`max`), naming `field`.
pub(crate) fn check_progress(data: &[u8], max: usize) -> Result<(), InputError> {
    check_size("progress", data, max)
}

/// Checks `data`, sent as `field`, against the queue's largest payload `max`.
pub(crate) fn check_size(field: &'static str, data: &[u8], max: usize) -> Result<(), InputError> {
    if data.len() > max {
        return Err(InputError::new(
            field,
            format!("is {} bytes; this queue takes at most {max}", data.len()),
        ));
    }
    Ok(())
}

/// The error for a job costing `cost` in a group whose policy, or the queue's own, can
/// admit at most `max` a start: beyond what the policies can ever admit (a conflict with
/// them, not malformed input), in memory as from the Redis twin's `costly`.
pub(crate) fn cost_beyond(cost: u32, max: u64) -> InputError {
    InputError::beyond_policy(
        "cost",
        format!(
            "is {cost}, but the group's policy or the queue's own admits at most {max} a start: \
             lower the cost, or give the group a policy with a larger limit or burst"
        ),
    )
}

/// The most a job of `group` may cost: what its group's policy and the queue's own can
/// ever admit a start (`None`: any cost, eventually).
pub(crate) fn max_cost(config: &QueueConfig, group: &str) -> Option<u64> {
    let own = config.policy_of(group).max_cost(paceline_core::Op::Limit);
    let queue = config
        .queue_policy
        .as_ref()
        .and_then(|p| p.max_cost(paceline_core::Op::Limit));
    match (own, queue) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The backoff's jitter for a backend: numbers from 0 to 1 (xorshift), seeded from the
/// clock, so that a backend's sequence on a virtual clock repeats.
#[derive(Debug)]
pub(crate) struct Jitter(std::sync::atomic::AtomicU64);

impl Jitter {
    pub(crate) fn seeded(now: u64) -> Jitter {
        let seed = now | 1;
        Jitter(std::sync::atomic::AtomicU64::new(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        ))
    }

    /// The next number from 0 to 1.
    pub(crate) fn next(&self) -> f64 {
        use std::sync::atomic::Ordering;
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The answer to an enqueue into a full queue.
pub(crate) fn queue_full(max_jobs: usize) -> QueueError {
    QueueError::Store(StoreError::new(
        StoreErrorKind::Capacity,
        format!(
            "the queue holds its maximum of {max_jobs} jobs (max_jobs); let workers catch up, purge dead jobs or raise max_jobs"
        ),
    ))
}

/// The answer to cancelling a job a worker holds.
pub(crate) fn active_conflict(id: &str) -> QueueError {
    QueueError::Conflict {
        id: id.to_string(),
        state: "active",
        message: "a worker holds it; it can be cancelled once it is back in the queue",
    }
}

/// Checks a lease call's arguments (the request id too, when it has one); answers the
/// lease's length in µs (the queue's when `lease` is `None`).
pub(crate) fn check_lease_request(
    config: &QueueConfig,
    worker: &str,
    max_jobs: usize,
    lease: Option<Duration>,
    request: Option<&str>,
) -> Result<u64, QueueError> {
    check_worker(worker)?;
    if let Some(request) = request {
        check_request_id(request)?;
    }
    if max_jobs == 0 || max_jobs > MAX_LEASE_JOBS {
        return Err(
            InputError::new("max_jobs", format!("must be from 1 to {MAX_LEASE_JOBS}")).into(),
        );
    }
    let lease = lease.unwrap_or(config.lease);
    check_lease_length(lease)?;
    Ok(round_to_micros(lease))
}

/// Checks a failure's pause and retry delay.
pub(crate) fn check_failure(failure: &Failure) -> Result<(), QueueError> {
    if let Failure::PauseGroup { pause, .. } = failure {
        if pause.is_zero() || *pause > MAX_PAUSE {
            return Err(InputError::new("pause_group_ms", "must be from 1µs to 1d").into());
        }
    }
    if let Failure::Retry { after: Some(d), .. } = failure {
        if *d > crate::job::MAX_DELAY {
            return Err(InputError::new("retry_after_ms", "must be at most 365 days").into());
        }
    }
    Ok(())
}

/// Worker names: 1 to [`MAX_WORKER`] bytes, no control characters.
fn check_worker(worker: &str) -> Result<(), InputError> {
    if worker.is_empty() || worker.len() > MAX_WORKER || worker.chars().any(char::is_control) {
        return Err(InputError::new(
            "worker",
            format!("must be 1 to {MAX_WORKER} bytes with no control characters"),
        ));
    }
    Ok(())
}
