//! Auto-batching: concurrent decisions coalesced into one script call per node.
//!
//! Callers hand their request to one background task and wait for the answer. The task takes
//! every request already queued (and, with a linger, those arriving within it), up to
//! [`MAX_DECISIONS_PER_CALL`](super::MAX_DECISIONS_PER_CALL), and sends them as one batch.
//! At most [`MAX_IN_FLIGHT`] batches are in flight at once: while all are busy, new requests
//! queue up and leave together in the next batch, so batches grow with the load by
//! themselves. The queue is first in, first out and a batch is applied in queue order;
//! batches in flight together may reach Redis in either order, which is still an order in
//! which the same requests, made one after another, give the same decisions.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Decision, Op, Policy, StoreError};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::routing::Router;
use super::MAX_DECISIONS_PER_CALL;
use crate::Request;

/// Batches in flight at once per store (each is one script call per node it touches).
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// One queued request and where its answer goes.
pub(crate) struct Job {
    pub(crate) policy: Policy,
    pub(crate) key: String,
    pub(crate) op: Op,
    pub(crate) cost: u64,
    /// The injected clock's time when the request was made (`None`: the server's `TIME`).
    pub(crate) now: Option<u64>,
    pub(crate) reply: oneshot::Sender<Result<Decision, StoreError>>,
}

/// The queue into the batching task; the task ends when every sender is dropped.
pub(crate) type Queue = mpsc::UnboundedSender<Job>;

/// Starts the batching task, sending batches through `router`, each waiting at most
/// `linger` for more requests.
pub(crate) fn spawn(router: Arc<Router>, linger: Duration) -> Queue {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(run(router, linger, receiver));
    sender
}

async fn run(router: Arc<Router>, linger: Duration, mut queue: mpsc::UnboundedReceiver<Job>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        // Wait for a free slot before gathering: what queues meanwhile joins this batch.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut jobs = vec![first];
        while jobs.len() < MAX_DECISIONS_PER_CALL {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        if !linger.is_zero() {
            let deadline = tokio::time::Instant::now() + linger;
            while jobs.len() < MAX_DECISIONS_PER_CALL {
                match tokio::time::timeout_at(deadline, queue.recv()).await {
                    Ok(Some(job)) => jobs.push(job),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        let router = Arc::clone(&router);
        tokio::spawn(async move {
            execute(&router, jobs).await;
            drop(slot);
        });
    }
}

/// Runs `jobs` in order and answers each. Consecutive jobs made at the same injected time
/// share a call; a change of time starts a new one.
async fn execute(router: &Router, mut jobs: Vec<Job>) {
    // A caller that gave up waiting (and got its failure policy's answer) must not have its
    // request applied afterwards: drop it before it is sent.
    jobs.retain(|job| !job.reply.is_closed());
    while !jobs.is_empty() {
        let now = jobs[0].now;
        let same_time = jobs.iter().take_while(|j| j.now == now).count();
        let rest = jobs.split_off(same_time);
        let requests: Vec<Request> = jobs
            .iter()
            .map(|j| Request {
                policy: &j.policy,
                key: &j.key,
                op: j.op,
                cost: j.cost,
            })
            .collect();
        let refs: Vec<&Request> = requests.iter().collect();
        let outcomes = router.run_valid(&refs, now).await;
        drop(requests);
        for (job, outcome) in jobs.drain(..).zip(outcomes) {
            // A caller that gave up (timed out) no longer listens: nothing to do.
            let _ = job.reply.send(outcome);
        }
        jobs = rest;
    }
}
