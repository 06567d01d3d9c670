//! Auto-batching: concurrent decisions coalesced into one script call per node.
//!
//! Callers hand their request to one background task and wait for the answer. The task takes
//! every request already queued (and, with a linger, those arriving within it), up to
//! [`MAX_DECISIONS_PER_CALL`](super::routing::MAX_DECISIONS_PER_CALL), and sends them as one batch.
//! At most [`MAX_IN_FLIGHT`] batches are in flight at once, all driven by the task itself
//! (no task of their own): while all are busy, new requests queue up and leave together in
//! the next batch, so batches grow with the load by themselves. The queue is first in,
//! first out and a batch is applied in queue order; batches in flight together may reach
//! Redis in either order, which is still an order in which the same requests, made one after
//! another, give the same decisions.
//!
//! Each request is answered within its queue's bound (twice the response timeout plus the
//! linger): a batch's calls must end by the earliest deadline of its requests (each call
//! also by the response timeout), and a request whose deadline has come before its call is
//! sent is answered with a timeout and never sent. The batches ahead of a request were
//! queued before it, so they end by about its deadline too (a request stamps its time just
//! before it joins the queue). A caller on the task's own runtime sets no timer of its own;
//! one on another runtime does, in case that runtime is no longer driven.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use paceline_core::{Decision, Op, Policy, StoreError, StoreErrorKind};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Sleep};

use super::routing::{Router, MAX_DECISIONS_PER_CALL};
use crate::Request;

/// Auto-batching's batches in flight at once per store (each is one script call per node it
/// touches): while all are, new decisions queue up and leave together in the next batch.
pub const MAX_IN_FLIGHT: usize = 2;

/// One queued request and where its answer goes.
struct Job {
    policy: Policy,
    key: String,
    op: Op,
    cost: u64,
    /// The injected clock's time when the request was made (`None`: the server's `TIME`).
    now: Option<u64>,
    /// When the request was queued: it is answered by this time plus the queue's bound.
    queued: Instant,
    reply: oneshot::Sender<Result<Decision, StoreError>>,
}

/// The way into the batching task, cloned with the store; the task ends when every clone is
/// dropped.
#[derive(Clone)]
pub(crate) struct Queue {
    sender: mpsc::UnboundedSender<Job>,
    /// How long a queued request may wait for its answer.
    bound: Duration,
    /// The runtime the batching task runs on.
    runtime: tokio::runtime::Id,
}

impl Queue {
    /// Starts the batching task on the current runtime, sending batches through `router`,
    /// each waiting at most `linger` for more requests, and answering every request within
    /// `bound` of its queueing.
    pub(crate) fn spawn(router: Arc<Router>, linger: Duration, bound: Duration) -> Queue {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(router, linger, bound, receiver));
        Queue {
            sender,
            bound,
            runtime: tokio::runtime::Handle::current().id(),
        }
    }

    /// Queues `request` (made at the injected time `now`, if any) and waits for its answer.
    pub(crate) async fn decide(
        &self,
        request: &Request<'_>,
        now: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            policy: request.policy.clone(),
            key: request.key.to_string(),
            op: request.op,
            cost: request.cost,
            now,
            queued: Instant::now(),
            reply,
        };
        if self.sender.send(job).is_err() {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the auto-batching task has stopped (its tokio runtime shut down)",
            ));
        }
        // On the batching task's own runtime the task answers within the bound, and a timer
        // here could fire no sooner (it needs that runtime running too): none is set. From
        // another runtime, one guards against a runtime that is no longer driven.
        let here = tokio::runtime::Handle::try_current().is_ok_and(|h| h.id() == self.runtime);
        let answered = if here {
            Ok(answer.await)
        } else {
            tokio::time::timeout(self.bound, answer).await
        };
        match answered {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the auto-batching task dropped the request (its batch failed unexpectedly, or \
                 its tokio runtime shut down)",
            )),
            Err(_) => Err(timed_out(self.bound)),
        }
    }
}

fn timed_out(bound: Duration) -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        format!("no answer from the auto-batching queue within {bound:?}"),
    )
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
            if let Some(jobs) = next_batch(&mut queue, &mut gathering, &mut open, linger, bound, cx)
            {
                // A batch that panics drops its requests (their callers are told) and no
                // other: the task goes on.
                let batch = AssertUnwindSafe(execute(Arc::clone(&router), jobs, bound));
                running.push(batch.catch_unwind().map(|_| ()));
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
/// linger, those arriving within it (never past its first request's bound), up to
/// [`MAX_DECISIONS_PER_CALL`]. A batch still lingering is kept in `gathering`; `open` turns
/// false when every sender is gone.
fn next_batch(
    queue: &mut mpsc::UnboundedReceiver<Job>,
    gathering: &mut Option<Gathering>,
    open: &mut bool,
    linger: Duration,
    bound: Duration,
    cx: &mut Context<'_>,
) -> Option<Vec<Job>> {
    let mut batch = match gathering.take() {
        Some(batch) => batch,
        None if !*open => return None,
        None => match queue.poll_recv(cx) {
            Poll::Ready(Some(first)) => {
                let leaves = (!linger.is_zero()).then(|| {
                    let at = (Instant::now() + linger).min(first.queued + bound);
                    Box::pin(tokio::time::sleep_until(at))
                });
                Gathering {
                    jobs: vec![first],
                    leaves,
                }
            }
            Poll::Ready(None) => {
                *open = false;
                return None;
            }
            Poll::Pending => return None,
        },
    };
    loop {
        // What is queued now joins (`try_recv` spends none of the task's scheduling budget,
        // which would cut a burst into small batches).
        while batch.jobs.len() < MAX_DECISIONS_PER_CALL {
            match queue.try_recv() {
                Ok(job) => batch.jobs.push(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    *open = false;
                    break;
                }
            }
        }
        if !*open || batch.jobs.len() >= MAX_DECISIONS_PER_CALL {
            return Some(batch.jobs);
        }
        let lingering = match &mut batch.leaves {
            Some(sleep) => sleep.as_mut().poll(cx).is_pending(),
            None => false,
        };
        if !lingering {
            return Some(batch.jobs);
        }
        // Lingering: woken by the next request, or when the linger ends.
        match queue.poll_recv(cx) {
            Poll::Ready(Some(job)) => batch.jobs.push(job),
            Poll::Ready(None) => {
                *open = false;
                return Some(batch.jobs);
            }
            Poll::Pending => {
                *gathering = Some(batch);
                return None;
            }
        }
    }
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
            let _ = late.reply.send(Err(timed_out(bound)));
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
