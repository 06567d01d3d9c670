//! The queue function's replies, decoded.

use paceline_core::{StoreError, StoreErrorKind};
use paceline_store::redis::{Reader, Reply};

use crate::error::QueueError;
use crate::job::{JobInfo, JobState, Stats, Totals};

/// Who answers, in the errors of a reply that does not read.
const FUNCTION: &str = "the queue's Redis function";

/// The reader of a reply of the queue's function.
pub(super) fn reader(reply: Reply) -> Result<Reader, QueueError> {
    Ok(reply.reader(FUNCTION)?)
}

/// A protocol error: the queue's function answered `what` unexpectedly.
pub(super) fn protocol(what: &str) -> QueueError {
    QueueError::Store(StoreError::new(
        StoreErrorKind::Protocol,
        format!("{FUNCTION} answered {what} unexpectedly"),
    ))
}

pub(super) fn read_state(r: &mut Reader) -> Result<JobState, QueueError> {
    let name = r.text()?;
    JobState::from_name(&name).ok_or_else(|| protocol(&format!("an unknown job state `{name}`")))
}

pub(super) fn read_job(r: &mut Reader) -> Result<JobInfo, QueueError> {
    let id = r.text()?;
    let group = r.text()?;
    let state = read_state(r)?;
    let attempts = r.u32()?;
    let max_attempts = r.u32()?;
    let has_error = r.int()? == 1;
    let error = r.text()?;
    let enqueued_at = r.u64()?;
    let not_before = r.time()?;
    let started = r.time()?;
    let lease_expires = r.time()?;
    let worker = r.text()?;
    let payload = r.bytes()?;
    let priority = u8::try_from(r.u64()?).map_err(|_| protocol("a job's priority"))?;
    let cost = r.u32()?;
    // A flag (1: present) then the bytes, for the progress and the result.
    let mut optional = || -> Result<Option<Vec<u8>>, QueueError> {
        let present = r.int()? == 1;
        let bytes = r.bytes()?;
        Ok(present.then_some(bytes))
    };
    let (progress, result) = (optional()?, optional()?);
    let finished = r.time()?;
    Ok(JobInfo {
        id,
        group,
        state,
        attempts,
        max_attempts,
        last_error: has_error.then_some(error),
        enqueued_at,
        not_before,
        started,
        lease_expires,
        worker: (state == JobState::Active).then_some(worker),
        payload,
        priority,
        cost,
        progress,
        result,
        finished,
    })
}

pub(super) fn read_counts(r: &mut Reader) -> Result<Stats, QueueError> {
    let _now = r.u64()?;
    let (scheduled, waiting, active, dead) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let completed = r.u64()?;
    let totals = Totals {
        enqueued: r.u64()?,
        started: r.u64()?,
        acked: r.u64()?,
        failed: r.u64()?,
        retried: r.u64()?,
        dead: r.u64()?,
        lease_expiries: r.u64()?,
        pauses: r.u64()?,
    };
    Ok(Stats {
        scheduled,
        waiting,
        active,
        dead,
        completed,
        groups: Vec::new(),
        totals,
        paused_until: r.time()?,
    })
}
