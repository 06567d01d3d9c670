//! What a queue operation can fail with.
//!
//! A job that must wait for its group's limit is not an error: it waits. Errors mean the
//! request was wrong ([`QueueError::Input`]), the caller no longer holds the job
//! ([`QueueError::LeaseLost`]), the job is not there ([`QueueError::UnknownJob`]) or is in
//! a state the operation does not apply to ([`QueueError::Conflict`]), or the store failed
//! ([`QueueError::Store`]).

use paceline_core::{InputError, StoreError};

/// A queue operation that could not be carried out.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The request was invalid: the error names the field and what is allowed.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The lease is not (or no longer) the job's: it expired and the job went back to its
    /// group (or to the dead set), or the job was acknowledged or failed already. The
    /// caller must stop working on the job: another worker may run it.
    #[error("job `{id}`: the lease is not the job's current lease (it expired, or the job was already acknowledged or failed); stop working on it")]
    LeaseLost {
        /// The job.
        id: String,
    },
    /// No job has this id (it was never enqueued, or it was acknowledged, cancelled or
    /// purged).
    #[error("no job `{id}` in this queue (acknowledged, cancelled, purged or never enqueued)")]
    UnknownJob {
        /// The job.
        id: String,
    },
    /// The job is in a state the operation does not apply to (cancelling an active job,
    /// retrying one that is not dead).
    #[error("job `{id}` is {state}: {message}")]
    Conflict {
        /// The job.
        id: String,
        /// Its state.
        state: &'static str,
        /// What to do instead.
        message: &'static str,
    },
    /// The store holding the queue failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A store's error as the queue's: the same input error or store failure.
impl From<paceline_core::Error> for QueueError {
    fn from(e: paceline_core::Error) -> QueueError {
        match e {
            paceline_core::Error::Input(e) => QueueError::Input(e),
            paceline_core::Error::Store(e) => QueueError::Store(e),
            // A kind of error added later: its text, as a store's.
            other => QueueError::Store(StoreError::new(
                paceline_core::StoreErrorKind::Unavailable,
                other.to_string(),
            )),
        }
    }
}
