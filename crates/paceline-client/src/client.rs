//! The async client limiter: the [`ClientCore`] behind a lock, driven by one task.
//!
//! [`Client::acquire`] waits until a request for a route may be sent and hands out a
//! [`Permit`]; the caller sends the request, then gives the permit the response
//! ([`Permit::complete`]) or the connection error ([`Permit::failed`]). A refusal the
//! client can wait out comes back as [`After::Retry`]: wait for the request's turn again
//! and send it again.
//!
//! Hooks given to [`Client::on_rate_limited`] hear of every request a limit holds back or
//! refuses ([`RateLimited`]: a wait for its turn, a failure, an upstream's refusal); a
//! request acquired with [`RequestOptions::give_up`] fails at once with
//! [`ClientError::RateLimited`] instead of waiting.
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
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use http::HeaderMap;
use paceline_core::Clock;
use paceline_store::TokioClock;
use tokio::sync::{oneshot, Notify};

use crate::config::ClientConfig;
use crate::core::{ClientCore, Completion, RequestId};
use crate::error::ClientError;
use crate::headers::{Dialect, Observation, Response};
use crate::hooks::{RateLimited, RequestOptions};
use crate::route::Route;

/// A hook told of each [`RateLimited`] event.
type Hook = Arc<dyn Fn(&RateLimited) + Send + Sync>;

type Admission = oneshot::Sender<Result<(), ClientError>>;

struct Shared {
    core: ClientCore,
    waiters: HashMap<RequestId, Admission>,
    closed: bool,
    /// Events the driver took from a shared core, and of those, how many it has told the
    /// knowledge (or given up on).
    events_taken: u64,
    events_told: u64,
    /// Since when events wait to be told while no request waits (they wait a little for
    /// a round that asks, to go in the same call).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    events_since: Option<u64>,
    /// Callers of [`Client::flush`] waiting: events are told at once.
    flushing: usize,
}

struct Inner {
    shared: Mutex<Shared>,
    clock: Arc<dyn Clock>,
    dialect: Box<dyn Dialect>,
    wake: Notify,
    /// Wakes [`Client::flush`] when events were told.
    told: Notify,
    /// Where the knowledge lives when it is not in the core.
    remote: Option<Remote>,
    /// The hooks of [`Client::on_rate_limited`].
    hooks: RwLock<Vec<Hook>>,
}

/// Where a client's knowledge may live besides its core.
#[cfg(feature = "redis")]
type Remote = crate::redis::RedisKnowledge;
/// Nowhere but its core, without the `redis` feature.
#[cfg(not(feature = "redis"))]
type Remote = std::convert::Infallible;

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
        let next = poll.next;
        s.deliver(poll, now);
        Ok(next.map(|t| t.max(now)))
    }

    /// One round of a shared core: tell the knowledge what happened and ask it what may
    /// go, in one call; hand out its answer. Answers when to run again (`None`: when
    /// woken), or `Err` once the client is closed and nothing it admitted is left to tell
    /// of.
    #[cfg(feature = "redis")]
    async fn run_shared(&self, remote: &crate::redis::RedisKnowledge) -> Result<Option<u64>, ()> {
        let now = self.clock.now_micros();
        let (events, asks, finish) = {
            let mut s = self.lock();
            if !s.closed && s.flushing == 0 && !s.core.has_waiting() && s.core.events_pending() > 0
            {
                // Nothing asks now: what happened waits a moment for the next ask (a
                // caller's next request), to go with it in one call.
                let since = *s.events_since.get_or_insert(now);
                if now < since + SHARED_LINGER_US {
                    return Ok(Some(since + SHARED_LINGER_US));
                }
            }
            s.events_since = None;
            let events = s.core.take_events();
            s.events_taken += events.len() as u64;
            if s.closed {
                for (_, tx) in s.waiters.drain() {
                    let _ = tx.send(Err(ClientError::Closed));
                }
                if events.is_empty() {
                    // Requests still in flight will report their end: wait for it.
                    return if s.core.in_flight() == 0 {
                        Err(())
                    } else {
                        Ok(None)
                    };
                }
            }
            let asks = if s.closed {
                crate::core::Asks::default()
            } else {
                s.core.asks(now)
            };
            (events, asks, s.closed || s.flushing > 0)
        };
        // What the leases hold is told and given back before a flush returns.
        if events.is_empty() && asks.asks.is_empty() && !(finish && remote.holds()) {
            // Nothing to tell or ask: only deadlines to keep.
            let mut s = self.lock();
            let empty = crate::knowledge::Admission {
                spent: None,
                grants: Vec::new(),
            };
            let poll = s.core.granted(asks, empty, now);
            let next = poll.next;
            s.deliver(poll, now);
            return Ok(next.map(|t| t.max(now)));
        }
        let result = remote.round_leased(&events, &asks.asks, now, finish).await;
        let mut failing = false;
        let admission = match result {
            Ok((answered, admission)) => {
                for (used, limit) in answered.iter().flatten().filter_map(|a| a.warn) {
                    crate::core::warn_budget(used, limit);
                }
                admission
            }
            Err(error) => {
                failing = true;
                tracing::warn!(%error, "the client limiter could not reach Redis: its requests wait, and what it admitted counts until its lease ends");
                crate::knowledge::Admission {
                    spent: None,
                    grants: Vec::new(),
                }
            }
        };
        let mut s = self.lock();
        s.events_told += events.len() as u64;
        self.told.notify_waiters();
        let poll = s.core.granted(asks, admission, now);
        let mut next = poll.next;
        s.deliver(poll, now);
        if failing {
            let retry = now + SHARED_RETRY_US;
            next = Some(next.map_or(retry, |t| t.min(retry)));
        }
        if s.core.events_pending() > 0 || s.closed {
            next = Some(now);
        }
        Ok(next.map(|t| t.max(now)))
    }

    /// Calls the hooks with the events the core holds (outside the core's lock, so a hook
    /// may use the client).
    fn tell_hooks(&self) {
        let told = {
            let mut s = self.lock();
            if !s.core.has_rate_limited() {
                return;
            }
            s.core.take_rate_limited()
        };
        let hooks: Vec<Hook> = self.hooks.read().unwrap_or_else(|e| e.into_inner()).clone();
        for event in &told {
            for hook in &hooks {
                hook(event);
            }
        }
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
        Client::build(ClientCore::new(config), dialect, clock, None)
    }

    /// A client for `identity` (one token: the value of its `Authorization` header, say)
    /// whose knowledge is in the store at `url`:
    ///
    /// - `memory`: in this process, as [`Client::new`] makes;
    /// - `redis://HOST:PORT[/DB]`, `rediss://...` (TLS) or
    ///   `redis-cluster://HOST:PORT[,HOST:PORT...]` (feature `redis`): in Redis, shared
    ///   by every process and proxy that opens the same identity there, so that together
    ///   they keep the token's limits. Only a hash of the identity reaches Redis. Every
    ///   process of an identity must use the same configuration.
    ///
    /// A malformed URL is an input error naming the field `store`; a Redis that cannot be
    /// reached is a store error. Once open, a Redis that fails leaves requests waiting
    /// (each fails at its `max_wait`) and is asked again four times a second; what was
    /// admitted meanwhile counts for [`ClientConfig::in_flight_lease`] at most.
    ///
    /// ```no_run
    /// use paceline_client::headers::Discord;
    /// use paceline_client::{Client, ClientConfig};
    /// # async fn f() -> Result<(), paceline_store::Error> {
    /// let client = Client::open(
    ///     "redis://127.0.0.1:6379",
    ///     "Bot my-token",
    ///     ClientConfig::discord(),
    ///     Discord,
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(
        url: &str,
        identity: &str,
        config: ClientConfig,
        dialect: impl Dialect,
    ) -> Result<Client, paceline_store::Error> {
        let store = paceline_store::open(url, &paceline_store::StoreOptions::new()).await?;
        Client::with_store(&store, identity, config, dialect)
    }

    /// A client for `identity` whose knowledge is kept by a store the application opened
    /// already: in that store's Redis when it has one
    /// ([`Store::functions`](paceline_store::Store::functions)), over the same connection,
    /// shared as [`Client::open`] says; otherwise in this process, as [`Client::new`] makes.
    /// The client keeps tokio's time (as [`Client::new`] does, a paused tokio clock in
    /// tests), not a clock injected into the store; [`Client::with_clock`] takes one.
    ///
    /// ```
    /// use paceline_client::headers::Discord;
    /// use paceline_client::{Client, ClientConfig};
    /// use paceline_store::{open, StoreOptions};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), paceline_store::Error> {
    /// let store = open("memory", &StoreOptions::new()).await?;
    /// let client = Client::with_store(&store, "Bot my-token", ClientConfig::discord(), Discord)?;
    /// # drop(client);
    /// # Ok(()) }
    /// ```
    pub fn with_store(
        store: &paceline_store::SharedStore,
        identity: &str,
        config: ClientConfig,
        dialect: impl Dialect,
    ) -> Result<Client, paceline_store::Error> {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        #[cfg(feature = "redis")]
        if let Some(host) = store.functions() {
            let remote = crate::redis::RedisKnowledge::new(host, identity, &config);
            return Ok(Client::build(
                ClientCore::shared(config),
                Box::new(dialect),
                clock,
                Some(remote),
            ));
        }
        if store.is_remote() {
            // Never knowledge in this process instead, which the others would not share.
            return Err(paceline_store::unshared_store_error(
                "a client's knowledge",
                "client,redis",
            )
            .into());
        }
        let _ = identity;
        Ok(Client::build(
            ClientCore::new(config),
            Box::new(dialect),
            clock,
            None,
        ))
    }

    /// A client on `clock` whose knowledge is `knowledge`, in Redis: for a process that
    /// serves many identities over one Redis connection (as `paceline proxy` does).
    #[cfg(feature = "redis")]
    pub fn with_knowledge(
        config: ClientConfig,
        dialect: Box<dyn Dialect>,
        clock: Arc<dyn Clock>,
        knowledge: crate::redis::RedisKnowledge,
    ) -> Client {
        Client::build(ClientCore::shared(config), dialect, clock, Some(knowledge))
    }

    fn build(
        core: ClientCore,
        dialect: Box<dyn Dialect>,
        clock: Arc<dyn Clock>,
        remote: Option<Remote>,
    ) -> Client {
        Client::spawn(Inner {
            shared: Mutex::new(Shared::new(core)),
            clock,
            dialect,
            wake: Notify::new(),
            told: Notify::new(),
            remote,
            hooks: RwLock::new(Vec::new()),
        })
    }

    fn spawn(inner: Inner) -> Client {
        let inner = Arc::new(inner);
        tokio::spawn(drive(Arc::clone(&inner)));
        Client {
            handle: Arc::new(Handle { inner }),
        }
    }

    /// Waits until the knowledge has been told every response and release reported so
    /// far (at once when the knowledge is in this process): call it before a process
    /// exits, so that what it learned is not lost to the others.
    pub async fn flush(&self) {
        let inner = self.inner();
        /// Counts a waiting `flush` until it returns or is dropped.
        struct Flushing<'a>(&'a Inner);
        impl Drop for Flushing<'_> {
            fn drop(&mut self) {
                self.0.lock().flushing -= 1;
            }
        }
        let target = {
            let mut s = inner.lock();
            s.flushing += 1;
            s.events_taken + s.core.events_pending() as u64
        };
        let _flushing = Flushing(inner);
        loop {
            let told = inner.told.notified();
            {
                let s = inner.lock();
                #[cfg(feature = "redis")]
                let held = inner.remote.as_ref().is_some_and(Remote::holds);
                #[cfg(not(feature = "redis"))]
                let held = false;
                if s.events_told >= target && !held || s.closed {
                    return;
                }
            }
            inner.wake.notify_one();
            told.await;
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
        self.acquire_with(route, RequestOptions::new()).await
    }

    /// Calls `hook` with every [`RateLimited`] event of this client (and its clones) from
    /// now on: a request waits for its turn, fails because of a limit, or was refused by
    /// the upstream. Hooks run on the client's task or the caller's, outside its lock:
    /// keep them short (count, log, send to a channel).
    ///
    /// ```
    /// use paceline_client::headers::Discord;
    /// use paceline_client::{Client, ClientConfig, RateLimited};
    /// use std::sync::{Arc, Mutex};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let client = Client::new(ClientConfig::discord(), Discord);
    /// let heard: Arc<Mutex<Vec<RateLimited>>> = Arc::default();
    /// let sink = Arc::clone(&heard);
    /// client.on_rate_limited(move |event| sink.lock().unwrap().push(event.clone()));
    /// # }
    /// ```
    pub fn on_rate_limited(&self, hook: impl Fn(&RateLimited) + Send + Sync + 'static) {
        self.inner()
            .hooks
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(hook));
    }

    /// Waits until a request for `route` may be sent, failing with
    /// [`ClientError::WaitExceeded`] (at once when the wait is known to be longer) if that
    /// is more than `max_wait` away (`None`: the configuration's).
    pub async fn acquire_within(
        &self,
        route: Route,
        max_wait: Option<Duration>,
    ) -> Result<Permit, ClientError> {
        let options = RequestOptions {
            max_wait,
            ..RequestOptions::new()
        };
        self.acquire_with(route, options).await
    }

    /// Waits until a request for `route` may be sent, as its `options` say: its deadline,
    /// and whether it fails with [`ClientError::RateLimited`] rather than wait.
    ///
    /// ```
    /// use paceline_client::headers::Discord;
    /// use paceline_client::{Client, ClientConfig, ClientError, RequestOptions, Route};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let client = Client::new(ClientConfig::new(), Discord);
    /// let route = Route::discord("GET", "/channels/1/pins");
    /// let pioneer = client.acquire(route.clone()).await.unwrap();
    /// // Its bucket is unknown until the pioneer's answer: this one would wait for it.
    /// let now = client.acquire_with(route, RequestOptions::new().give_up()).await;
    /// assert!(matches!(now, Err(ClientError::RateLimited { .. })));
    /// # drop(pioneer);
    /// # }
    /// ```
    pub async fn acquire_with(
        &self,
        route: Route,
        options: RequestOptions,
    ) -> Result<Permit, ClientError> {
        let inner = Arc::clone(self.inner());
        let (tx, rx) = oneshot::channel();
        let submitted = {
            let mut s = inner.lock();
            let now = inner.clock.now_micros();
            let submitted = s.core.submit_with(route, now, options);
            if let Ok(id) = submitted {
                s.waiters.insert(id, tx);
            }
            submitted
        };
        inner.tell_hooks();
        let id = submitted?;
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

    /// What the client knows of each bucket now; `None` when the knowledge lives in Redis
    /// (shared by every process of the identity: see [`Client::open`]).
    pub fn buckets(&self) -> Option<Vec<crate::knowledge::BucketView>> {
        let now = self.now_micros();
        self.inner().lock().core.buckets(now)
    }
}

impl Shared {
    fn new(core: ClientCore) -> Shared {
        Shared {
            core,
            waiters: HashMap::new(),
            closed: false,
            events_taken: 0,
            events_told: 0,
            events_since: None,
            flushing: 0,
        }
    }

    /// Hands a poll's admissions and failures to their waiters.
    fn deliver(&mut self, poll: crate::core::Poll, now: u64) {
        for id in poll.go {
            if let Some(tx) = self.waiters.remove(&id) {
                if tx.send(Ok(())).is_err() {
                    // Its caller is gone and its guard has not run yet: give it back now.
                    self.core.cancel(id, false, now);
                }
            }
        }
        for (id, error) in poll.failed {
            if let Some(tx) = self.waiters.remove(&id) {
                let _ = tx.send(Err(error));
            }
        }
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
        inner.tell_hooks();
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

/// How long a shared client's news waits for a request to ask with: 1 ms.
#[cfg(feature = "redis")]
const SHARED_LINGER_US: u64 = 1_000;

/// How soon a shared client asks Redis again after a failed call: 250 ms.
#[cfg(feature = "redis")]
const SHARED_RETRY_US: u64 = 250_000;

/// The task that admits waiting requests at their time.
async fn drive(inner: Arc<Inner>) {
    loop {
        let ran = match &inner.remote {
            #[cfg(feature = "redis")]
            Some(remote) => inner.run_shared(remote).await,
            #[cfg(not(feature = "redis"))]
            Some(never) => match *never {},
            None => inner.run_once(),
        };
        inner.tell_hooks();
        let Ok(next) = ran else {
            #[cfg(feature = "redis")]
            if let Some(remote) = &inner.remote {
                // The sends leased ahead go back; held answers are told.
                if let Err(error) = remote.give_back(inner.clock.now_micros()).await {
                    tracing::debug!(%error, "the client limiter gave back no leased sends: they end with their lease");
                }
            }
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
