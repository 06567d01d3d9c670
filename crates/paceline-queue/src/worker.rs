//! [`Worker`]: runs a handler over a queue's jobs, `concurrency` at a time, keeping each
//! lease alive while its handler runs and handing back what it holds when it stops.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::error::QueueError;
use crate::job::{Failure, Leased};
use crate::queue::Queue;

/// How long one lease call waits for a job before the worker asks again.
const LEASE_WAIT: Duration = Duration::from_secs(30);

/// What a worker did before it stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Jobs its handler finished and the queue acknowledged.
    pub acked: u64,
    /// Jobs its handler failed (retried, dead or pausing their group).
    pub failed: u64,
    /// Jobs whose lease was lost while the handler ran (the handler was dropped) or when it
    /// reported: another worker may run them.
    pub lost: u64,
    /// Jobs still running at shutdown after the grace period, handed back to the head of
    /// their groups.
    pub handed_back: u64,
}

/// Runs a handler over a queue's jobs.
///
/// - At most `concurrency` jobs run at once; the worker leases as many as it has room for,
///   waiting without polling while no group may start a job.
/// - While a handler runs, its lease is extended every third of the lease; if the lease is
///   lost anyway (the worker stalled past it), the handler's future is dropped at the
///   heartbeat that learns it, since another worker may now run the job.
/// - The handler's `Ok` acknowledges the job; its `Err(Failure)` retries it, kills it, or
///   pauses its group for an upstream's retry-after ([`Failure`]).
/// - When `shutdown` completes, the worker leases nothing more, gives running handlers
///   `shutdown_grace` to finish, and hands back the jobs of those that did not (to the head
///   of their groups, at no attempt's cost).
///
/// ```
/// use paceline_queue::{Failure, NewJob, Queue, QueueConfig, Worker};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline_queue::QueueError> {
/// let queue = Queue::in_memory("emails", QueueConfig::new("gcra:rate=100/s".parse()?))?;
/// queue.enqueue(NewJob::new("customer:7", b"welcome".to_vec())).await?;
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let worker = Worker::new(queue.clone()).concurrency(8);
/// let running = tokio::spawn(worker.run(
///     move |job| async move {
///         // Send the email; a 429 from the provider would be
///         // Err(Failure::PauseGroup { error: None, pause: retry_after }).
///         if job.payload.is_empty() {
///             return Err(Failure::Fatal { error: Some("empty".into()) });
///         }
///         Ok(())
///     },
///     async { stopped.await.ok(); },
/// ));
/// # while queue.stats().await?.waiting + queue.stats().await?.active > 0 {
/// #     tokio::time::sleep(Duration::from_millis(1)).await;
/// # }
/// stop.send(()).ok();
/// let report = running.await.expect("the worker")?;
/// assert_eq!(report.acked, 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Worker {
    queue: Queue,
    name: String,
    concurrency: usize,
    lease: Option<Duration>,
    shutdown_grace: Duration,
}

/// How one job's run ended.
enum Ending {
    Acked,
    Failed,
    Lost,
    HandedBack,
}

impl Worker {
    /// A worker of `queue` running one job at a time, named after this process, with the
    /// queue's lease and 10 s of grace at shutdown.
    pub fn new(queue: Queue) -> Worker {
        Worker {
            queue,
            name: format!("worker-{}", std::process::id()),
            concurrency: 1,
            lease: None,
            shutdown_grace: Duration::from_secs(10),
        }
    }

    /// Names the worker (shown on its active jobs).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Worker {
        self.name = name.into();
        self
    }

    /// Runs up to `n` jobs at once (at least 1, at most 1,000).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Worker {
        self.concurrency = n.clamp(1, crate::core::MAX_LEASE_JOBS);
        self
    }

    /// Leases jobs for `lease` instead of the queue's default.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Worker {
        self.lease = Some(lease);
        self
    }

    /// How long running handlers may finish after shutdown before their jobs are handed
    /// back.
    #[must_use]
    pub fn shutdown_grace(mut self, grace: Duration) -> Worker {
        self.shutdown_grace = grace;
        self
    }

    /// Runs `handler` over the queue's jobs until `shutdown` completes; answers what it did.
    /// Fails only on a request the queue refuses (a bad worker name or lease), at once.
    pub async fn run<H, F>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<Report, QueueError>
    where
        H: Fn(Leased) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), Failure>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let (stop, stopping) = watch::channel(false);
        let mut running: JoinSet<Ending> = JoinSet::new();
        let mut report = Report::default();
        let mut outcome = Ok(());
        tokio::pin!(shutdown);
        loop {
            while let Some(done) = running.try_join_next() {
                tally(&mut report, done);
            }
            let first = tokio::select! {
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                () = &mut shutdown => break,
            };
            let room = 1 + slots.available_permits();
            // The lease first: a call that has its jobs completes rather than being dropped
            // with them by the shutdown.
            let leased = tokio::select! {
                biased;
                r = self.queue.lease(&self.name, room, self.lease, LEASE_WAIT) => r,
                () = &mut shutdown => break,
            };
            let jobs = match leased {
                Ok(jobs) => jobs,
                Err(QueueError::Input(e)) => {
                    outcome = Err(QueueError::Input(e));
                    break;
                }
                // The store failed: try again after a pause, as a worker should outlive an
                // outage.
                Err(_) => {
                    drop(first);
                    tokio::select! {
                        () = self.queue.sleep(Duration::from_secs(1)) => continue,
                        () = &mut shutdown => break,
                    }
                }
            };
            let mut first = Some(first);
            for job in jobs {
                let permit = match first.take() {
                    Some(p) => p,
                    None => match slots.clone().try_acquire_owned() {
                        Ok(p) => p,
                        // Cannot happen: the lease asked for no more than the free slots.
                        Err(_) => break,
                    },
                };
                let queue = self.queue.clone();
                let handler = handler.clone();
                let stopping = stopping.clone();
                let grace = self.shutdown_grace;
                running.spawn(async move {
                    let ending = run_one(&queue, &*handler, job, stopping, grace).await;
                    drop(permit);
                    ending
                });
            }
        }
        let _ = stop.send(true);
        while let Some(done) = running.join_next().await {
            tally(&mut report, done);
        }
        outcome.map(|()| report)
    }
}

fn tally(report: &mut Report, done: Result<Ending, tokio::task::JoinError>) {
    match done {
        Ok(Ending::Acked) => report.acked += 1,
        Ok(Ending::Failed) => report.failed += 1,
        Ok(Ending::HandedBack) => report.handed_back += 1,
        // A handler that panicked never reported: its lease runs out and the job returns.
        Ok(Ending::Lost) | Err(_) => report.lost += 1,
    }
}

/// Runs one job to its end: the handler's answer, a lost lease, or the shutdown's.
async fn run_one<H, F>(
    queue: &Queue,
    handler: &H,
    job: Leased,
    mut stopping: watch::Receiver<bool>,
    grace: Duration,
) -> Ending
where
    H: Fn(Leased) -> F,
    F: Future<Output = Result<(), Failure>>,
{
    let id = job.id.clone();
    let token = job.token.clone();
    let length = Duration::from_micros(job.lease_expires.saturating_sub(job.started).max(3));
    let work = handler(job);
    tokio::pin!(work);
    let stop = async {
        let _ = stopping.wait_for(|&s| s).await;
        queue.sleep(grace).await;
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            answer = &mut work => {
                let reported = match answer {
                    Ok(()) => queue.ack(&id, &token).await.map(|()| Ending::Acked),
                    Err(failure) => queue.fail(&id, &token, failure).await.map(|_| Ending::Failed),
                };
                return reported.unwrap_or(Ending::Lost);
            }
            () = queue.sleep(length / 3) => {
                // Extended, or the store failed this once (the next beat tries again), or
                // lost: the handler is dropped.
                if let Err(QueueError::LeaseLost { .. }) = queue.extend(&id, &token, length).await {
                    return Ending::Lost;
                }
            }
            () = &mut stop => {
                return match queue.fail(&id, &token, Failure::Release).await {
                    Ok(_) => Ending::HandedBack,
                    Err(_) => Ending::Lost,
                };
            }
        }
    }
}
