//! Auto-batching: concurrent decisions coalesced into one script call per node.
//!
//! Callers hand their request to one background task and wait for the answer. The task
//! takes every request already queued (and, with a linger, those arriving within it) and
//! sorts them into lanes, one per Redis node (one per slot of a cluster whose slot map is
//! unknown; one on a single server). From each lane it sends up to
//! [`MAX_DECISIONS_PER_CALL`](super::routing::MAX_DECISIONS_PER_CALL) requests as one batch.
//! At most [`MAX_IN_FLIGHT`] batches per lane are in flight at once, all driven by the task
//! itself (no task of their own): while a lane's are busy, its new requests wait and leave
//! together in its next batch, so batches grow with the load by themselves. A batch's
//! requests are answered as soon as its node answers: a frozen or dead node holds only its
//! own lane (its places in flight and its queued requests), never another node's.
//!
//! A lane is first in, first out and a batch is applied in queue order; batches in flight
//! together may reach Redis in either order, which is still an order in which the same
//! requests, made one after another, give the same decisions. A key always has one lane
//! (while the slot map stands), so its requests keep their order.
//!
//! Each request is answered within its queue's bound (twice the response timeout plus the
//! linger): a batch's calls must end by the earliest deadline of its requests (each call
//! also by the response timeout), and a request whose deadline has come before its call is
//! sent is answered with a timeout and never sent. The batches ahead of a request in its
//! lane were queued before it, so they end by about its deadline too (a request stamps its
//! time just before it joins the queue). A caller on the task's own runtime sets no timer
//! of its own; one on another runtime does, in case that runtime is no longer driven.

use std::collections::{HashMap, VecDeque};
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

use super::routing::{Group, Router, MAX_DECISIONS_PER_CALL};
use crate::Request;

/// Auto-batching's batches in flight at once per Redis node (per slot of a cluster whose
/// slot map is unknown), each one script call: while a node's are, its new decisions queue
/// up and leave together in its next batch. A node that does not answer holds only its own.
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

/// One lane's requests waiting for a place in flight, and its batches in flight.
#[derive(Default)]
struct Lane {
    waiting: VecDeque<Job>,
    in_flight: usize,
    /// True while the lane is in the task's list of lanes to serve.
    listed: bool,
}

impl Lane {
    /// Answers (with a timeout, unsent) the requests at the front whose deadline has come,
    /// and drops those whose caller gave up: requests queue in about the order of their
    /// stamps, so the late ones are at the front.
    fn drop_late(&mut self, bound: Duration) {
        let now = Instant::now();
        while let Some(job) = self.waiting.front() {
            if job.reply.is_closed() {
                self.waiting.pop_front();
            } else if job.queued + bound <= now {
                if let Some(late) = self.waiting.pop_front() {
                    let _ = late.reply.send(Err(timed_out(bound)));
                }
            } else {
                break;
            }
        }
    }

    /// True if the lane has requests waiting and a free place for them.
    fn can_send(&self) -> bool {
        !self.waiting.is_empty() && self.in_flight < MAX_IN_FLIGHT
    }
}

/// The lanes: each node's (or slot's) requests and batches in flight.
#[derive(Default)]
struct Lanes {
    lanes: HashMap<Group, Lane, foldhash::fast::RandomState>,
    /// The lanes that can send a batch, in the order they became able to.
    ready: VecDeque<Group>,
}

impl Lanes {
    /// Lists `lane` to be served, if it can send and is not listed already.
    fn list(&mut self, lane: Group) {
        if let Some(l) = self.lanes.get_mut(&lane) {
            if l.can_send() && !l.listed {
                l.listed = true;
                self.ready.push_back(lane);
            }
        }
    }

    /// Queues `job` in `lane`.
    fn push(&mut self, lane: Group, job: Job) {
        self.lanes.entry(lane).or_default().waiting.push_back(job);
        self.list(lane);
    }

    /// One of `lane`'s batches ended.
    fn ended(&mut self, lane: Group) {
        if let Some(l) = self.lanes.get_mut(&lane) {
            l.in_flight = l.in_flight.saturating_sub(1);
            if l.in_flight == 0 && l.waiting.is_empty() {
                self.lanes.remove(&lane);
            } else {
                self.list(lane);
            }
        }
    }

    /// The next lane's next batch: up to [`MAX_DECISIONS_PER_CALL`] of its requests, in
    /// order, counted in flight.
    fn next(&mut self, bound: Duration) -> Option<(Group, Vec<Job>)> {
        while let Some(lane) = self.ready.pop_front() {
            let Some(l) = self.lanes.get_mut(&lane) else {
                continue;
            };
            l.listed = false;
            l.drop_late(bound);
            if !l.can_send() {
                if l.in_flight == 0 && l.waiting.is_empty() {
                    self.lanes.remove(&lane);
                }
                continue;
            }
            let take = l.waiting.len().min(MAX_DECISIONS_PER_CALL);
            let jobs: Vec<Job> = l.waiting.drain(..take).collect();
            l.in_flight += 1;
            self.list(lane);
            return Some((lane, jobs));
        }
        None
    }
}

async fn run(
    router: Arc<Router>,
    linger: Duration,
    bound: Duration,
    mut queue: mpsc::UnboundedReceiver<Job>,
) {
    let mut running = FuturesUnordered::new();
    let mut lanes = Lanes::default();
    let mut gathering: Option<Gathering> = None;
    let mut open = true;
    std::future::poll_fn(|cx| loop {
        let mut progressed = false;
        // Finished batches free their lanes' places.
        while let Poll::Ready(Some(lane)) = running.poll_next_unpin(cx) {
            lanes.ended(lane);
            progressed = true;
        }
        // New requests join their lanes (a chunk at a time, between sends).
        if let Some(jobs) = next_batch(&mut queue, &mut gathering, &mut open, linger, bound, cx) {
            let map = router.last_map();
            for job in jobs {
                lanes.push(router.lane_of(&job.key, map.as_deref()), job);
            }
            progressed = true;
        }
        // Each lane with a free place sends its next batch; a full lane keeps its requests
        // until one of its own batches ends.
        while let Some((lane, jobs)) = lanes.next(bound) {
            // A batch that panics drops its requests (their callers are told) and no other:
            // the task goes on.
            let batch = AssertUnwindSafe(execute(Arc::clone(&router), jobs, bound));
            running.push(batch.catch_unwind().map(move |_| lane));
            progressed = true;
        }
        if !open && gathering.is_none() && running.is_empty() && lanes.ready.is_empty() {
            return Poll::Ready(());
        }
        if !progressed {
            return Poll::Pending;
        }
    })
    .await;
}

/// The next requests to sort into lanes, once they are ready to leave: those queued now
/// and, with a linger, those arriving within it (never past its first request's bound), up
/// to [`MAX_DECISIONS_PER_CALL`]. A batch still lingering is kept in `gathering`; `open` turns
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

/// Runs `jobs` in order and answers each as soon as its node has answered. Consecutive jobs
/// made at the same injected time share a call; a change of time starts a new one. Each
/// call ends by the earliest deadline of its jobs; a job whose deadline has come is
/// answered with a timeout, unsent.
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
            let mut replies = Vec::with_capacity(jobs.len());
            let mut asks = Vec::with_capacity(jobs.len());
            for job in jobs.drain(..) {
                replies.push(Some(job.reply));
                asks.push((job.policy, job.key, job.op, job.cost));
            }
            let requests: Vec<Request> = asks
                .iter()
                .map(|(policy, key, op, cost)| Request {
                    policy,
                    key,
                    op: *op,
                    cost: *cost,
                })
                .collect();
            let refs: Vec<&Request> = requests.iter().collect();
            router
                .run_each(&refs, now, deadline, |i, outcome| {
                    // A caller that gave up (timed out) no longer listens: nothing to do.
                    if let Some(reply) = replies.get_mut(i).and_then(Option::take) {
                        let _ = reply.send(outcome);
                    }
                })
                .await;
        }
        jobs = rest;
    }
}
