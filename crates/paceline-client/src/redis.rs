//! An identity's [knowledge](crate::knowledge) kept in Redis or Redis Cluster, shared by
//! every process and proxy that sends with the identity's token.
//!
//! Each step is one atomic call of a Lua function (`lua/client.lua`, the twin of
//! [`Knowledge`](crate::knowledge::Knowledge)): what happened since the last call, then
//! the requests waiting. A process's client makes its calls through its
//! [`Leases`] ([`RedisKnowledge::round_leased`]): requests of a
//! bucket without limit mostly go on sends leased ahead, without a call.
//!
//! All of an identity's keys share one hash tag, so they live in one cluster slot. The
//! identity is hashed before it becomes part of a key: a token never reaches Redis.
//!
//! Each call carries a random [`CallId`]. A call whose answer is lost (the connection
//! broke, or the answer did not come within the store's response timeout) is made once
//! more under the same id: if Redis had applied it, the repeat is answered with the first
//! answer and nothing is counted twice, so the requests it admitted go and are reported,
//! rather than counting as in flight until their lease ends (which would hold a route's
//! pioneer, and with it the route, back for [`ClientConfig::in_flight_lease`]). If the
//! repeat fails too, the error is returned.
//!
//! [`Client::open`](crate::Client::open) uses this when given a `redis://`,
//! `rediss://` or `redis-cluster://` URL; use it directly to drive a
//! [shared](crate::ClientCore::shared) [`ClientCore`](crate::ClientCore) yourself.
//!
//! ```no_run
//! use paceline_client::redis::RedisKnowledge;
//! use paceline_client::{ClientConfig, ClientCore, Route};
//! use paceline_store::{redis::RedisStore, FailurePolicy};
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379", FailurePolicy::FailClosed)
//!     .connect()
//!     .await?;
//! let config = ClientConfig::discord();
//! let knowledge = RedisKnowledge::new(store, "Bot my-token", &config);
//! let mut core = ClientCore::shared(config);
//! let now = 1_700_000_000_000_000;
//! core.submit(Route::discord("GET", "/channels/1/messages"), now, None)?;
//! let asks = core.asks(now);
//! let admission = knowledge.admit(&asks.asks, now).await?;
//! let poll = core.granted(asks, admission, now);
//! assert_eq!(poll.go.len(), 1); // the route's pioneer
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use paceline_core::{StoreError, StoreErrorKind};
use paceline_store::redis::{fingerprint, policy_args, FunctionHost, Library, Reader};

use crate::config::ClientConfig;
use crate::headers::Scope;
use crate::knowledge::Event;
use crate::knowledge::{
    micros, Admission, Admitted, Answered, Ask, CallId, Grant, Leases, Plan, RoundAnswer, Wait,
};

static LIBRARY: LazyLock<Library> =
    LazyLock::new(|| Library::new("client", include_str!("../lua/client.lua"), "client_call"));

/// The largest number sent to the Lua twin: Lua's numbers are doubles, exact below 2^53.
const LUA_EXACT: u64 = (1 << 53) - 1;

/// An identity's knowledge in Redis: see the [module docs](self).
///
/// Clones share one process's [`Leases`]: the sends leased ahead and the answers held for
/// the next call of [`round_leased`](Self::round_leased).
#[derive(Clone)]
pub struct RedisKnowledge {
    host: FunctionHost,
    base: String,
    config: Arc<Vec<Vec<u8>>>,
    injected: bool,
    leases: Arc<Mutex<Leases>>,
    calls: Arc<AtomicU64>,
}

impl std::fmt::Debug for RedisKnowledge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisKnowledge")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

fn text(n: u64) -> Vec<u8> {
    n.min(LUA_EXACT).to_string().into_bytes()
}

fn warn_share(x: f64) -> f64 {
    if x.is_nan() {
        2.0
    } else {
        x.clamp(-1e300, 1e300)
    }
}

fn flag(b: bool) -> Vec<u8> {
    if b { b"1" } else { b"0" }.to_vec()
}

fn protocol(what: &str, reply: &impl std::fmt::Debug) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("the client limiter's Redis function answered {what} unexpectedly: {reply:?}"),
    )
}

/// A fresh call id from the system's random source.
fn fresh_call() -> Result<CallId, StoreError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                "the client limiter drew no call id: the system's random source failed",
            )
        })?;
    Ok(CallId::from_bytes(bytes))
}

impl RedisKnowledge {
    /// The knowledge of `identity` (e.g. the value of the `Authorization` header; only its
    /// hash is kept) in `store`, under `config`'s rules. Every process sharing the identity
    /// must use the same configuration. Times come from the Redis server's clock, so
    /// machines whose clocks differ still agree on every reset.
    pub fn new(
        store: impl Into<FunctionHost>,
        identity: impl AsRef<[u8]>,
        config: &ClientConfig,
    ) -> RedisKnowledge {
        let host = store.into();
        let id = fingerprint(&[identity.as_ref().to_vec()]);
        let base = format!("{}{{c:{id}}}:", host.key_prefix());
        let mut args = vec![
            text(micros(config.in_flight_lease)),
            text(u64::from(config.pioneers_per_major)),
            text(micros(config.headerless_backoff)),
            text(micros(config.missing_retry_after)),
            text(micros(config.max_backoff)),
            // Lua reads no NaN or infinity: a share that can never be reached (as NaN
            // compares in Rust), or the largest.
            format!("{:?}", warn_share(config.invalid_warn_at)).into_bytes(),
            text(config.invalid_budget.as_ref().map_or(0, |p| p.limit())),
        ];
        for policy in [&config.global, &config.invalid_budget] {
            match policy {
                Some(p) => args.extend(policy_args(p)),
                None => args.push(Vec::new()),
            }
        }
        RedisKnowledge {
            host,
            base,
            config: Arc::new(args),
            injected: false,
            leases: Arc::new(Mutex::new(Leases::new())),
            calls: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The same knowledge on the caller's clock: every call is made at the `now` it is
    /// given, for simulations and tests on virtual time.
    pub fn on_caller_clock(mut self) -> RedisKnowledge {
        self.injected = true;
        self
    }

    /// The Redis keys' common start (hash tag included).
    pub fn key_base(&self) -> &str {
        &self.base
    }

    /// How many calls to Redis the knowledge has made (a repeat under one id counts
    /// again).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// How many sends this process holds leased, and how many answers wait to be told.
    pub fn held(&self) -> (usize, usize) {
        let leases = self.leases();
        (leases.held(), leases.deferred())
    }

    /// Whether this process holds leased sends or answers not told yet.
    pub fn holds(&self) -> bool {
        self.held() != (0, 0)
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, Leases> {
        // Every step under the lock is await-free and leaves the leases whole.
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A [`round`](Self::round) through this process's [`Leases`]: requests that may go on
    /// sends leased ahead go without a call (their plain successes told with the next
    /// one), and a call asks for a few sends ahead of the requests it admits (see
    /// [`leases`](crate::knowledge::leases)). `finish` tells everything held and gives
    /// every leased send back, in a call if anything is held: before a process ends, or
    /// for a caller waiting until what it learned is told.
    ///
    /// A call that fails leaves the sends taken for the round held, and its error is
    /// returned.
    pub async fn round_leased(
        &self,
        events: &[Event],
        asks: &[Ask],
        now: u64,
        finish: bool,
    ) -> Result<RoundAnswer, StoreError> {
        let plan = self.leases().plan(events, asks, now, finish);
        match plan {
            Plan::Local(answer) => Ok(answer),
            Plan::Call(call) => {
                let answer = if call.events().is_empty() && call.asks().is_empty() {
                    // Nothing to tell or ask: only what was asked is answered.
                    Ok((
                        Vec::new(),
                        Admission {
                            spent: None,
                            grants: Vec::new(),
                        },
                    ))
                } else {
                    self.round(call.events(), call.asks(), now).await
                };
                self.leases().settle(call, answer)
            }
        }
    }

    /// Gives back every leased send and tells every held answer, at `now` (in one call,
    /// none when nothing is held): what a process does before it ends.
    pub async fn give_back(&self, now: u64) -> Result<(), StoreError> {
        self.round_leased(&[], &[], now, true).await.map(|_| ())
    }

    async fn call(&self, op: &str, now: u64, rest: Vec<Vec<u8>>) -> Result<Reader, StoreError> {
        let clock = if self.injected {
            // Records live an hour longer than the caller's clock says: it may run faster
            // than the server's, which expires them.
            format!("{now} 3600000").into_bytes()
        } else {
            Vec::new()
        };
        self.calls.fetch_add(1, Ordering::Relaxed);
        let head = [op.as_bytes().to_vec(), clock];
        let args = head.iter().chain(self.config.iter()).chain(rest.iter());
        let reply = self
            .host
            .call(&LIBRARY, &[&self.base], args.map(Vec::as_slice))
            .await?;
        reply.reader("the client limiter's Redis function")
    }

    /// [`Knowledge::admit`](crate::knowledge::Knowledge::admit) in Redis, at `now` on the
    /// caller's clock; the times of the answer are on the caller's clock too. A
    /// [`round`](Self::round) that only asks: made once more under its id if its answer is
    /// lost.
    pub async fn admit(&self, asks: &[Ask], now: u64) -> Result<Admission, StoreError> {
        Ok(self.round(&[], asks, now).await?.1)
    }

    /// Tells the knowledge what a [shared](crate::ClientCore::shared) core's
    /// [`Event`] says, at `now` on the caller's clock: the answer's times are on it too.
    pub async fn tell(&self, event: &Event, now: u64) -> Result<Option<Answered>, StoreError> {
        let (mut answered, _) = self.round(std::slice::from_ref(event), &[], now).await?;
        Ok(answered.pop().flatten())
    }

    /// One atomic call: tells the knowledge the `events` in order, then asks it what of
    /// `asks` may go, at `now` on the caller's clock
    /// ([`Knowledge::round`](crate::knowledge::Knowledge::round)). Answers what each
    /// event taught (for an answer) and the admission (no grants when nothing was asked).
    ///
    /// The call carries a fresh [`CallId`]; when the connection breaks or the answer does
    /// not come in time, it is made once more under the same id (see the
    /// [module docs](self)), and the second failure is returned.
    pub async fn round(
        &self,
        events: &[Event],
        asks: &[Ask],
        now: u64,
    ) -> Result<RoundAnswer, StoreError> {
        let call = fresh_call()?;
        match self.round_as(call, events, asks, now).await {
            Err(error) if error.answer_may_be_lost() => {
                tracing::debug!(%error, "the client limiter's call to Redis failed; made once more under its id");
                self.round_as(call, events, asks, now).await
            }
            answered => answered,
        }
    }

    /// One attempt of [`round`](Self::round) under the id `call`, made once: a repeat of a
    /// call id whose round counted something answers as the first did and changes nothing
    /// (see [`Knowledge::round`](crate::knowledge::Knowledge::round)). For callers that
    /// make their own repeats; a repeat is made at the same `now` as its first call.
    pub async fn round_as(
        &self,
        call: CallId,
        events: &[Event],
        asks: &[Ask],
        now: u64,
    ) -> Result<RoundAnswer, StoreError> {
        let mut rest = vec![call.to_string().into_bytes(), text(events.len() as u64)];
        for event in events {
            push_event(&mut rest, event, now);
        }
        rest.push(text(asks.len() as u64));
        for ask in asks {
            rest.push(ask.major.as_bytes().to_vec());
            rest.push(ask.bucket.as_bytes().to_vec());
            rest.push(text(ask.requests.len() as u64));
            for (route, exempt) in &ask.requests {
                rest.push(route.as_bytes().to_vec());
                rest.push(flag(*exempt));
            }
        }
        let mut r = self.call("round", now, rest).await?;
        let server_now = r.int()?;
        // A time of the server, on the caller's clock.
        let local = |t: i64| -> u64 {
            let t = i128::from(t) - i128::from(server_now) + i128::from(now);
            u64::try_from(t.max(0)).unwrap_or(u64::MAX)
        };
        let mut answered = Vec::with_capacity(events.len());
        for event in events {
            let (until, used, limit) = (r.int()?, r.int()?, r.int()?);
            answered.push(match event {
                Event::Release { .. } => None,
                Event::Answer { .. } => Some(Answered {
                    paused_until: (until >= 0).then(|| local(until)),
                    warn: (used >= 0).then(|| (used.unsigned_abs(), limit.max(0).unsigned_abs())),
                }),
            });
        }
        let spent = r.int()?;
        if spent >= 0 {
            let admission = Admission {
                spent: Some(Duration::from_nanos(spent.unsigned_abs())),
                grants: Vec::new(),
            };
            return Ok((answered, admission));
        }
        let mut grants = Vec::with_capacity(asks.len());
        for _ in asks {
            let n = r.int()?;
            let mut admitted = Vec::new();
            for _ in 0..n {
                let pioneer = r.int()? == 1;
                let seq = r.int()?.unsigned_abs();
                admitted.push(Admitted { pioneer, seq });
            }
            let moved = r.int()? == 1;
            let route = Arc::from(r.text()?);
            let bucket = Arc::from(r.text()?);
            let moved = moved.then_some((route, bucket));
            let wait = match (r.int()?, r.int()?) {
                (0, _) => Wait::Nothing,
                (1, t) => Wait::Until(local(t)),
                (2, _) => Wait::Event,
                other => return Err(protocol("an unknown wait", &other)),
            };
            grants.push(Grant {
                admitted,
                moved,
                wait,
            });
        }
        Ok((
            answered,
            Admission {
                spent: None,
                grants,
            },
        ))
    }
}

/// Appends an event's arguments: `r` and a release's 7, or `a` and an answer's 14 (the
/// last: how long ago the response came, in µs).
fn push_event(rest: &mut Vec<Vec<u8>>, event: &Event, now: u64) {
    match event {
        Event::Release {
            route,
            bucket,
            admitted,
            sent,
            failed,
        } => {
            rest.extend([
                b"r".to_vec(),
                route.key().as_bytes().to_vec(),
                route.major().as_bytes().to_vec(),
                bucket.as_bytes().to_vec(),
                flag(admitted.pioneer),
                text(admitted.seq),
                flag(*sent),
                flag(*failed),
            ]);
        }
        Event::Answer {
            route,
            bucket,
            admitted,
            status,
            seen,
            at,
        } => {
            let opt = |v: Option<u64>| v.map_or_else(Vec::new, text);
            let scope = match seen.refusal.map(|r| r.scope) {
                None => "",
                Some(Scope::Bucket) => "b",
                Some(Scope::Shared) => "s",
                Some(Scope::Global) => "g",
            };
            rest.extend([
                b"a".to_vec(),
                route.key().as_bytes().to_vec(),
                route.major().as_bytes().to_vec(),
                bucket.as_bytes().to_vec(),
                flag(admitted.pioneer),
                text(admitted.seq),
                text(u64::from(*status)),
                flag(seen.bucket.is_some()),
                seen.bucket.clone().unwrap_or_default().into_bytes(),
                opt(seen.limit),
                opt(seen.remaining),
                opt(seen.reset_after.map(micros)),
                scope.as_bytes().to_vec(),
                opt(seen.refusal.and_then(|r| r.retry_after).map(micros)),
                text(now.saturating_sub(*at)),
            ]);
        }
    }
}
