//! The async client limiter: the [`ClientCore`] behind a lock, driven by one task.
//!
//! [`Client::acquire`] waits until a request for a route may be sent and hands out a
//! [`Permit`]; the caller sends the request, then gives the permit the response
//! ([`Permit::complete`]) or the connection error ([`Permit::failed`]). A refusal the
//! client can wait out comes back as [`After::Retry`]: wait for the request's turn again
//! and send it again.
//!
//! Dropping a future or a permit is always safe: what it held goes back (its place in the
//! queue, its pioneer slot, and, if [`Permit::sent`] was never called, its count in the
//! bucket and its global token).
//!
//! ```
//! use paceline_client::headers::Discord;
//! use paceline_client::{After, Client, ClientConfig, Route};
//! use http::HeaderMap;
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), paceline_client::ClientError> {
//! let client = Client::new(ClientConfig::discord(), Discord);
//! let route = Route::discord("POST", "/channels/1/messages");
//! let mut permit = client.acquire(route).await?;
//! permit.sent(); // about to write the request
//! // ... send it, read the response ...
//! let mut headers = HeaderMap::new();
//! headers.insert("x-ratelimit-bucket", "b1".parse().unwrap());
//! headers.insert("x-ratelimit-remaining", "4".parse().unwrap());
//! headers.insert("x-ratelimit-reset-after", "1".parse().unwrap());
//! match permit.complete(200, &headers, None) {
//!     After::Done => println!("done"),
//!     After::Retry(waiting) => {
//!         let _again = waiting.admitted().await?; // send it again
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::HeaderMap;
use paceline_core::Clock;
use paceline_store::TokioClock;
use tokio::sync::{oneshot, Notify};

use crate::core::{ClientConfig, ClientCore, ClientError, Completion, RequestId};
use crate::headers::{Dialect, Observation, Response};
use crate::route::Route;

type Admission = oneshot::Sender<Result<(), ClientError>>;

struct Shared {
    core: ClientCore,
    waiters: HashMap<RequestId, Admission>,
    closed: bool,
}

struct Inner {
    shared: Mutex<Shared>,
    clock: Arc<dyn Clock>,
    dialect: Box<dyn Dialect>,
    wake: Notify,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while holding the lock leaves the core consistent at every await-free
        // step; go on with it rather than poison every caller.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One poll of the core: admissions and failures handed to their waiters. Answers when
    /// to poll again, or `Err` once the client is closed.
    fn run_once(&self) -> Result<Option<u64>, ()> {
        let mut s = self.lock();
        if s.closed {
            for (_, tx) in s.waiters.drain() {
                let _ = tx.send(Err(ClientError::Closed));
            }
            return Err(());
        }
        let now = self.clock.now_micros();
        let poll = s.core.poll(now);
        for id in poll.go {
            if let Some(tx) = s.waiters.remove(&id) {
                if tx.send(Ok(())).is_err() {
                    // Its caller is gone and its guard has not run yet: give it back now.
                    s.core.cancel(id, false, now);
                }
            }
        }
        for (id, error) in poll.failed {
            if let Some(tx) = s.waiters.remove(&id) {
                let _ = tx.send(Err(error));
            }
        }
        Ok(poll.next.map(|t| t.max(now)))
    }

    fn cancel(&self, id: RequestId, sent: bool) {
        let mut s = self.lock();
        s.waiters.remove(&id);
        let now = self.clock.now_micros();
        s.core.cancel(id, sent, now);
        drop(s);
        self.wake.notify_one();
    }
}

/// Closes the client when the last [`Client`] handle goes.
struct Handle {
    inner: Arc<Inner>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.inner.lock().closed = true;
        self.inner.wake.notify_one();
    }
}

/// An API client limiter for one identity (one token): see the [crate docs](crate) and [`ClientCore`](crate::ClientCore) for its rules.
///
/// Clones share the same state. Needs a tokio runtime: [`Client::new`] spawns the task
/// that admits waiting requests at their time; it ends when the last clone is dropped.
#[derive(Clone)]
pub struct Client {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("dialect", &self.handle.inner.dialect.name())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client reading responses in `dialect`, on tokio's clock (so tests on a paused
    /// clock run in virtual time).
    pub fn new(config: ClientConfig, dialect: impl Dialect) -> Client {
        Client::with_clock(config, Box::new(dialect), Arc::new(TokioClock::new()))
    }

    /// A client on `clock`.
    pub fn with_clock(
        config: ClientConfig,
        dialect: Box<dyn Dialect>,
        clock: Arc<dyn Clock>,
    ) -> Client {
        let inner = Arc::new(Inner {
            shared: Mutex::new(Shared {
                core: ClientCore::new(config),
                waiters: HashMap::new(),
                closed: false,
            }),
            clock,
            dialect,
            wake: Notify::new(),
        });
        tokio::spawn(drive(Arc::clone(&inner)));
        Client {
            handle: Arc::new(Handle { inner }),
        }
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.handle.inner
    }

    /// The dialect the client reads responses in.
    pub fn dialect(&self) -> &dyn Dialect {
        self.inner().dialect.as_ref()
    }

    /// The time on the client's clock, µs since the Unix epoch.
    pub fn now_micros(&self) -> u64 {
        self.inner().clock.now_micros()
    }

    /// Waits until a request for `route` may be sent, within the configuration's
    /// `max_wait`.
    pub async fn acquire(&self, route: Route) -> Result<Permit, ClientError> {
        self.acquire_within(route, None).await
    }

    /// Waits until a request for `route` may be sent, failing with
    /// [`ClientError::WaitExceeded`] (at once when the wait is known to be longer) if that
    /// is more than `max_wait` away (`None`: the configuration's).
    pub async fn acquire_within(
        &self,
        route: Route,
        max_wait: Option<Duration>,
    ) -> Result<Permit, ClientError> {
        let inner = Arc::clone(self.inner());
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut s = inner.lock();
            let now = inner.clock.now_micros();
            let id = s.core.submit(route, now, max_wait)?;
            s.waiters.insert(id, tx);
            id
        };
        inner.wake.notify_one();
        Waiting {
            guard: Some(Guard { inner, id }),
            rx,
        }
        .admitted()
        .await
    }

    /// How many requests wait, and how many are in flight.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.inner().lock();
        (s.core.waiting(), s.core.in_flight())
    }
}

/// Gives back a request's place or slot if its owner goes without finishing it.
struct Guard {
    inner: Arc<Inner>,
    id: RequestId,
}

/// A request waiting for its turn (again, after a refusal).
pub struct Waiting {
    guard: Option<Guard>,
    rx: oneshot::Receiver<Result<(), ClientError>>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting").finish_non_exhaustive()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(g) = self.guard.take() {
            g.inner.cancel(g.id, false);
        }
    }
}

impl Waiting {
    /// Waits for the request's turn: a permit to send it, or why it will not be sent.
    pub async fn admitted(mut self) -> Result<Permit, ClientError> {
        let result = (&mut self.rx).await;
        let Some(guard) = self.guard.take() else {
            return Err(ClientError::Closed);
        };
        match result {
            Ok(Ok(())) => Ok(Permit {
                inner: Arc::clone(&guard.inner),
                id: guard.id,
                sent: false,
                finished: false,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ClientError::Closed),
        }
    }
}

/// What to do after a response.
#[derive(Debug)]
pub enum After {
    /// Finished: the response is the caller's.
    Done,
    /// Refused by a limit the client waits out: send the request again once
    /// [`Waiting::admitted`] gives a new permit.
    Retry(Waiting),
}

/// The right to send one request now. Report how it ended with [`complete`](Permit::complete)
/// or [`failed`](Permit::failed); dropping it instead gives back what it held.
#[derive(Debug)]
pub struct Permit {
    inner: Arc<Inner>,
    id: RequestId,
    sent: bool,
    finished: bool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Permit {
    /// Marks the request as sent (or about to be): dropping the permit from now on does
    /// not give back its count in the bucket or its global token, since the server may
    /// have counted it.
    pub fn sent(&mut self) {
        self.sent = true;
    }

    /// The response came: learn from its `status`, `headers` and (for a refusal, if at
    /// hand) its `body`.
    pub fn complete(self, status: u16, headers: &HeaderMap, body: Option<&[u8]>) -> After {
        let now = self.inner.clock.now_micros();
        let mut response = Response::new(status, headers);
        if let Some(body) = body {
            response = response.with_body(body);
        }
        let seen = self.inner.dialect.read(&response, now);
        self.complete_with(status, &seen)
    }

    /// The response came, already read into an [`Observation`].
    pub fn complete_with(mut self, status: u16, seen: &Observation) -> After {
        self.finished = true;
        let inner = Arc::clone(&self.inner);
        let mut s = inner.lock();
        let now = inner.clock.now_micros();
        let after = match s.core.complete(self.id, status, seen, now) {
            Completion::Done => After::Done,
            // The client is gone, and with it the task that would admit the retry.
            Completion::Retry if s.closed => {
                s.core.cancel(self.id, false, now);
                After::Done
            }
            Completion::Retry => {
                let (tx, rx) = oneshot::channel();
                s.waiters.insert(self.id, tx);
                After::Retry(Waiting {
                    guard: Some(Guard {
                        inner: Arc::clone(&inner),
                        id: self.id,
                    }),
                    rx,
                })
            }
        };
        drop(s);
        inner.wake.notify_one();
        after
    }

    /// The request failed without a response (connection error, timeout): its slot is
    /// released at once; the other requests go on.
    pub fn failed(mut self) {
        self.finished = true;
        let now = self.inner.clock.now_micros();
        self.inner.lock().core.failed(self.id, now);
        self.inner.wake.notify_one();
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.finished {
            self.inner.cancel(self.id, self.sent);
        }
    }
}

/// The task that admits waiting requests at their time.
async fn drive(inner: Arc<Inner>) {
    loop {
        let Ok(next) = inner.run_once() else {
            return;
        };
        let now = inner.clock.now_micros();
        let sleep: Pin<Box<dyn Future<Output = ()> + Send>> = match next {
            Some(t) if t > now => inner.clock.sleep(Duration::from_micros(t - now)),
            Some(_) => Box::pin(tokio::task::yield_now()),
            None => Box::pin(std::future::pending()),
        };
        tokio::select! {
            _ = inner.wake.notified() => {}
            _ = sleep => {}
        }
    }
}
