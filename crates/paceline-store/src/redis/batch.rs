//! Auto-batching: concurrent decisions coalesced into one script call per node.
//!
//! Callers hand their request to one background task and wait for the answer. The task takes
//! every request already queued (and, with a linger, those arriving within it), up to
//! [`MAX_DECISIONS_PER_CALL`](super::MAX_DECISIONS_PER_CALL), and sends them as one batch.
//! At most [`MAX_IN_FLIGHT`] batches are in flight at once, all driven by the task itself
//! (no task of their own): while all are busy, new requests queue up and leave together in
//! the next batch, so batches grow with the load by themselves. The queue is first in,
//! first out and a batch is applied in queue order; batches in flight together may reach
//! Redis in either order, which is still an order in which the same requests, made one after
//! another, give the same decisions.
//!
//! Each request is answered within its queue's bound (twice the response timeout plus the
//! linger) without a timer of its own: a batch's calls must end by the earliest deadline of
//! its requests, and a request whose deadline has come before its batch leaves is answered
//! with a timeout and never sent. Since deadlines follow the queue's order, the batches
//! ahead of a request end by its deadline too.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use paceline_core::{Decision, Op, Policy, StoreError, StoreErrorKind};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Sleep};

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
    /// When the request was queued: it is answered by this time plus the queue's bound.
    pub(crate) queued: Instant,
    pub(crate) reply: oneshot::Sender<Result<Decision, StoreError>>,
}

/// The queue into the batching task; the task ends when every sender is dropped.
pub(crate) type Queue = mpsc::UnboundedSender<Job>;

/// Starts the batching task, sending batches through `router`, each waiting at most
/// `linger` for more requests, and answering every request within `bound` of its queueing.
pub(crate) fn spawn(router: Arc<Router>, linger: Duration, bound: Duration) -> Queue {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(run(router, linger, bound, receiver));
    sender
}

/// A batch gathering requests during its linger.
struct Gathering {
    jobs: Vec<Job>,
    /// When it leaves (`None`: with no linger, at once).
    leaves: Option<Pin<Box<Sleep>>>,
}

async fn run(
    router: Arc<Router>,
    linger: Duration,
    bound: Duration,
    mut queue: mpsc::UnboundedReceiver<Job>,
) {
    let mut running = FuturesUnordered::new();
    let mut gathering: Option<Gathering> = None;
    let mut open = true;
    std::future::poll_fn(|cx| loop {
        let mut progressed = false;
        // Finished batches free their places.
        while let Poll::Ready(Some(())) = running.poll_next_unpin(cx) {
            progressed = true;
        }
        // While every place is taken, requests wait in the queue and join the next batch.
        if running.len() < MAX_IN_FLIGHT {
            if let Some(jobs) = next_batch(&mut queue, &mut gathering, &mut open, linger, cx) {
                running.push(execute(Arc::clone(&router), jobs, bound));
                progressed = true;
            }
        }
        if !open && gathering.is_none() && running.is_empty() {
            return Poll::Ready(());
        }
        if !progressed {
            return Poll::Pending;
        }
    })
    .await;
}

/// The next batch to send, once it is ready to leave: the requests queued now and, with a
/// linger, those arriving within it, up to [`MAX_DECISIONS_PER_CALL`]. A batch still
/// lingering is kept in `gathering`; `open` turns false when every sender is gone.
fn next_batch(
    queue: &mut mpsc::UnboundedReceiver<Job>,
    gathering: &mut Option<Gathering>,
    open: &mut bool,
    linger: Duration,
    cx: &mut Context<'_>,
) -> Option<Vec<Job>> {
    let mut batch = match gathering.take() {
        Some(batch) => batch,
        None if !*open => return None,
        None => match queue.poll_recv(cx) {
            Poll::Ready(Some(first)) => Gathering {
                jobs: vec![first],
                leaves: (!linger.is_zero()).then(|| Box::pin(tokio::time::sleep(linger))),
            },
            Poll::Ready(None) => {
                *open = false;
                return None;
            }
            Poll::Pending => return None,
        },
    };
    while *open && batch.jobs.len() < MAX_DECISIONS_PER_CALL {
        match queue.poll_recv(cx) {
            Poll::Ready(Some(job)) => batch.jobs.push(job),
            Poll::Ready(None) => *open = false,
            Poll::Pending => break,
        }
    }
    let leaves = match &mut batch.leaves {
        Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
        None => true,
    };
    if leaves || !*open || batch.jobs.len() >= MAX_DECISIONS_PER_CALL {
        return Some(batch.jobs);
    }
    *gathering = Some(batch);
    None
}

/// Runs `jobs` in order and answers each. Consecutive jobs made at the same injected time
/// share a call; a change of time starts a new one. Each call ends by the earliest deadline
/// of its jobs; a job whose deadline has come is answered with a timeout, unsent.
async fn execute(router: Arc<Router>, mut jobs: Vec<Job>, bound: Duration) {
    // A caller that gave up waiting (and got its failure policy's answer) must not have its
    // request applied afterwards: drop it before it is sent.
    jobs.retain(|job| !job.reply.is_closed());
    while !jobs.is_empty() {
        let now = jobs[0].now;
        let same_time = jobs.iter().take_while(|j| j.now == now).count();
        let rest = jobs.split_off(same_time);
        let started = Instant::now();
        for late in jobs.extract_if(.., |j| j.queued + bound <= started) {
            let _ = late.reply.send(Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("no answer from the auto-batching queue within {bound:?}"),
            )));
        }
        if let Some(queued) = jobs.iter().map(|j| j.queued).min() {
            let deadline = (queued + bound).min(router.transport().deadline());
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
            let outcomes = router.run_valid(&refs, now, deadline).await;
            drop(requests);
            for (job, outcome) in jobs.drain(..).zip(outcomes) {
                // A caller that gave up (timed out) no longer listens: nothing to do.
                let _ = job.reply.send(outcome);
            }
        }
        jobs = rest;
    }
}
