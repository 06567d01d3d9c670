//! Call combining for a front end's function library. See [`Combiner`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::panic::AssertUnwindSafe;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use paceline_core::{StoreError, StoreErrorKind};
use tokio::sync::{mpsc, oneshot};

use super::reply::Reply;

/// The future of one call of a [`Combiner`]'s function.
pub type CallFuture<E> = Pin<Box<dyn Future<Output = Result<Reply, E>> + Send>>;

/// One operation waiting, and where its answer goes.
struct Pending<E> {
    op: &'static str,
    args: Vec<Vec<u8>>,
    answer: oneshot::Sender<Result<Reply, E>>,
}

/// Call combining for a front end's function library: concurrent operations leave as one
/// function call, as the store's own decisions do (see the store's auto-batching).
///
/// Operations queue up for one task. While fewer than `max_in_flight` calls are on their
/// way, the task takes every operation waiting (up to `max_combined`) and sends them as one
/// call, driving the calls itself (no task per call): while the calls in flight are busy,
/// new operations gather and leave together in the next, so calls grow with the load by
/// themselves. A lone operation goes as itself; several go as the library's `multi`
/// operation, whose arguments are their count, then each one's name, number of arguments
/// and arguments, and whose answer is the list of their answers in order. A library that
/// offers combining applies them one after another in one atomic step, as if each had been
/// its own call.
///
/// Dropping it stops its task: the calls then in flight are abandoned (their answers, if
/// any, are not read) and the operations then waiting are answered with an error.
///
/// ```
/// use paceline_store::redis::{CallFuture, Combiner, Reply};
/// use paceline_store::StoreError;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), StoreError> {
/// // A stand-in for a library: `double N` answers 2N; `multi` answers each operation's.
/// fn double(arg: &[u8]) -> Reply {
///     Reply::from(2 * String::from_utf8_lossy(arg).parse::<i64>().unwrap_or(0))
/// }
/// fn call(op: &'static str, args: Vec<Vec<u8>>) -> CallFuture<StoreError> {
///     let reply = match op {
///         // One argument each: [count, "double", "1", N, "double", "1", N, ...].
///         "multi" => Reply::list(args[1..].chunks(3).map(|op| double(&op[2]))),
///         _ => double(&args[0]),
///     };
///     Box::pin(async move { Ok(reply) })
/// }
/// let combiner = Combiner::spawn(call, 2, 256);
/// let (a, b) = tokio::join!(
///     combiner.call("double", vec![b"2".to_vec()]),
///     combiner.call("double", vec![b"5".to_vec()]),
/// );
/// assert_eq!((a?.int(), b?.int()), (Some(4), Some(10)));
/// # Ok(()) }
/// ```
pub struct Combiner<E> {
    sender: mpsc::UnboundedSender<Pending<E>>,
    task: tokio::task::JoinHandle<()>,
}

impl<E> std::fmt::Debug for Combiner<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner").finish_non_exhaustive()
    }
}

impl<E> Drop for Combiner<E> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<E> Combiner<E>
where
    E: From<StoreError> + Clone + Send + 'static,
{
    /// Starts the combining task on the current runtime: it sends operations through
    /// `call` (an operation's name and arguments; `multi` for several), at most
    /// `max_in_flight` calls at once, each with at most `max_combined` operations.
    pub fn spawn<F>(call: F, max_in_flight: usize, max_combined: usize) -> Combiner<E>
    where
        F: Fn(&'static str, Vec<Vec<u8>>) -> CallFuture<E> + Send + Sync + 'static,
    {
        let (sender, receiver) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(
            Arc::new(call),
            receiver,
            max_in_flight.max(1),
            max_combined.max(1),
        ));
        Combiner { sender, task }
    }

    /// Makes the operation `op` with `args`, combined with the others waiting, and answers
    /// its own answer.
    pub async fn call(&self, op: &'static str, args: Vec<Vec<u8>>) -> Result<Reply, E> {
        let gone = || {
            E::from(StoreError::new(
                StoreErrorKind::Unavailable,
                "the handle that combines calls is shutting down",
            ))
        };
        let (answer, answered) = oneshot::channel();
        self.sender
            .send(Pending { op, args, answer })
            .map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

/// The combining task: see the [module docs](self).
async fn run<E, F>(
    call: Arc<F>,
    mut pending: mpsc::UnboundedReceiver<Pending<E>>,
    max_in_flight: usize,
    max_combined: usize,
) where
    E: From<StoreError> + Clone + Send + 'static,
    F: Fn(&'static str, Vec<Vec<u8>>) -> CallFuture<E> + Send + Sync + 'static,
{
    let mut in_flight = FuturesUnordered::new();
    loop {
        if in_flight.len() >= max_in_flight {
            in_flight.next().await;
            continue;
        }
        let first = tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => continue,
            first = pending.recv() => match first {
                Some(first) => first,
                None => break,
            },
        };
        let mut batch = vec![first];
        while batch.len() < max_combined {
            match pending.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        in_flight.push(send(&*call, batch));
    }
    while in_flight.next().await.is_some() {}
}

/// Sends `batch` as one call and hands each operation its answer.
fn send<E, F>(call: &F, mut batch: Vec<Pending<E>>) -> impl Future<Output = ()> + Send
where
    E: From<StoreError> + Clone + Send + 'static,
    F: Fn(&'static str, Vec<Vec<u8>>) -> CallFuture<E>,
{
    let (future, answers) = if batch.len() == 1 {
        let p = batch.remove(0);
        (call(p.op, p.args), vec![p.answer])
    } else {
        let mut args = vec![batch.len().to_string().into_bytes()];
        let mut answers = Vec::with_capacity(batch.len());
        for p in batch {
            args.push(p.op.as_bytes().to_vec());
            args.push(p.args.len().to_string().into_bytes());
            args.extend(p.args);
            answers.push(p.answer);
        }
        (call("multi", args), answers)
    };
    async move {
        // A call that panics (a bug in a client library, a clock) fails its own operations
        // only: the task that drives every call of the library goes on.
        let answer = match AssertUnwindSafe(future).catch_unwind().await {
            Ok(answer) => answer,
            Err(_) => Err(E::from(StoreError::new(
                StoreErrorKind::Unavailable,
                "a call of the Redis function failed unexpectedly (it panicked); try again",
            ))),
        };
        let mut answers = answers;
        match answer {
            Ok(reply) if answers.len() == 1 => {
                if let Some(answer) = answers.pop() {
                    let _ = answer.send(Ok(reply));
                }
            }
            Ok(reply) => match reply.into_list() {
                Some(replies) if replies.len() == answers.len() => {
                    for (answer, reply) in answers.into_iter().zip(replies) {
                        let _ = answer.send(Ok(reply));
                    }
                }
                other => {
                    let e = E::from(StoreError::new(
                        StoreErrorKind::Protocol,
                        format!(
                            "a combined call of {} operations was answered with {:?}",
                            answers.len(),
                            other.map(|r| r.len())
                        ),
                    ));
                    for answer in answers {
                        let _ = answer.send(Err(e.clone()));
                    }
                }
            },
            Err(e) => {
                for answer in answers {
                    let _ = answer.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// A library stand-in: `echo X` answers X; `multi` answers each operation's; counts the
    /// calls and the most in flight at once; each call waits for `gate` to open.
    struct Fake {
        calls: Mutex<Vec<(&'static str, usize)>>,
        in_flight: AtomicUsize,
        most: AtomicUsize,
        gate: tokio::sync::Semaphore,
    }

    fn echo_all(args: &[Vec<u8>]) -> Reply {
        // [n, op, nargs, arg, op, nargs, arg, ...]
        Reply::list(
            args[1..]
                .chunks(3)
                .map(|op| Reply::from(String::from_utf8_lossy(&op[2]).as_ref())),
        )
    }

    fn combiner(fake: &Arc<Fake>, max_in_flight: usize) -> Combiner<StoreError> {
        let fake = Arc::clone(fake);
        Combiner::spawn(
            move |op, args| {
                let fake = Arc::clone(&fake);
                Box::pin(async move {
                    let n = if op == "multi" { args.len() / 3 } else { 1 };
                    fake.calls.lock().unwrap().push((op, n));
                    let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    fake.most.fetch_max(now, Ordering::SeqCst);
                    let _permit = fake.gate.acquire().await;
                    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
                    match op {
                        "multi" if args[1] == b"short" => Ok(Reply::list([Reply::from(1)])),
                        "multi" => Ok(echo_all(&args)),
                        _ => Ok(Reply::from(String::from_utf8_lossy(&args[0]).as_ref())),
                    }
                })
            },
            max_in_flight,
            256,
        )
    }

    fn fake(open: bool) -> Arc<Fake> {
        Arc::new(Fake {
            calls: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            gate: tokio::sync::Semaphore::new(if open { 1_000 } else { 0 }),
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn operations_that_wait_leave_together_and_each_gets_its_own_answer() {
        let fake = fake(false);
        let combiner = Arc::new(combiner(&fake, 1));
        let mut handles = Vec::new();
        for i in 0..10 {
            let combiner = Arc::clone(&combiner);
            handles.push(tokio::spawn(async move {
                combiner
                    .call("echo", vec![i.to_string().into_bytes()])
                    .await
            }));
            // The first leaves alone and is held at the gate; the others queue behind it.
            while fake.calls.lock().unwrap().is_empty() {
                tokio::task::yield_now().await;
            }
        }
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        fake.gate.add_permits(1_000);
        for (i, handle) in handles.into_iter().enumerate() {
            let reply = handle.await.unwrap().unwrap();
            assert_eq!(reply, Reply::from(i.to_string().as_str()));
        }
        let calls = fake.calls.lock().unwrap().clone();
        assert_eq!(calls, [("echo", 1), ("multi", 9)]);
        assert_eq!(fake.most.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn no_more_calls_are_in_flight_than_allowed() {
        let fake = fake(false);
        let combiner = Arc::new(combiner(&fake, 2));
        let mut handles = Vec::new();
        for i in 0..3 {
            let combiner = Arc::clone(&combiner);
            handles.push(tokio::spawn(async move {
                combiner
                    .call("echo", vec![i.to_string().into_bytes()])
                    .await
            }));
            // Each operation in its own turn: the first two leave alone.
            while fake.calls.lock().unwrap().len() < (i + 1).min(2) {
                tokio::task::yield_now().await;
            }
        }
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(fake.calls.lock().unwrap().len(), 2);
        fake.gate.add_permits(1_000);
        for handle in handles {
            handle.await.unwrap().unwrap();
        }
        assert_eq!(fake.most.load(Ordering::SeqCst), 2);
        assert_eq!(fake.calls.lock().unwrap().len(), 3);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_combined_answer_of_the_wrong_length_fails_each_operation() {
        let fake = fake(false);
        let combiner = Arc::new(combiner(&fake, 1));
        let spawn = |op: &'static str| {
            let combiner = Arc::clone(&combiner);
            tokio::spawn(async move { combiner.call(op, vec![b"x".to_vec()]).await })
        };
        let first = spawn("echo");
        while fake.calls.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // Two operations wait behind the first and leave as one `multi`, which the
        // stand-in answers with one reply too few when its first operation is `short`.
        let (a, b) = (spawn("short"), spawn("echo"));
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        fake.gate.add_permits(1_000);
        assert_eq!(first.await.unwrap().unwrap(), Reply::from("x"));
        for late in [a, b] {
            let e = late.await.unwrap().unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Protocol);
            assert!(e.message().contains("combined call of 2"), "{e}");
        }
        assert_eq!(fake.calls.lock().unwrap()[1], ("multi", 2));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_call_that_panics_fails_its_own_operations_only() {
        let combiner: Combiner<StoreError> = Combiner::spawn(
            |op, _args| {
                Box::pin(async move {
                    if op == "boom" {
                        panic!("a call that panics");
                    }
                    Ok(Reply::from(1))
                })
            },
            2,
            256,
        );
        let e = combiner.call("boom", Vec::new()).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Unavailable);
        assert!(e.message().contains("panicked"), "{e}");
        let fine = combiner.call("fine", Vec::new()).await.unwrap();
        assert_eq!(fine.int(), Some(1));
    }
}
