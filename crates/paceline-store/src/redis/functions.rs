//! The function host. See [`FunctionHost`].

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use paceline_core::{Policy, StoreError, StoreErrorKind};
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};

use super::args::push_policy;
use super::reply::Reply;
use super::script::{code_hash, register, ALGORITHMS};
use super::store::RedisStore;
use super::transport::load_command;
use crate::secret::TokenKey;
use crate::Error;

/// A Lua function library run inside Redis: paceline's algorithm twins, then a front end's
/// `source`, which defines the local Lua function `entry(KEYS, ARGV)`; registered as one
/// Redis function whose name carries the hash of the code, so two versions of a library
/// never answer for each other.
#[derive(Debug)]
pub struct Library {
    function: String,
    code: String,
}

impl Library {
    /// The library of `source` under the name stem `stem` (e.g. `queue`), whose entry point
    /// is the local function `entry`.
    pub fn new(stem: &str, source: &str, entry: &str) -> Library {
        let body = format!("{}\n{source}\n", ALGORITHMS.as_str());
        let (code, name) = register(stem, &body, &[(stem, entry, "")]);
        Library {
            function: name(stem),
            code,
        }
    }

    /// The function's name, for `FCALL`.
    pub fn function(&self) -> &str {
        &self.function
    }
}

/// A policy as the twins read it: its algorithm, the number of parameters, the parameters.
pub fn policy_args(policy: &Policy) -> Vec<Vec<u8>> {
    let mut cmd = Cmd::new();
    push_policy(policy, &mut cmd);
    cmd.args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes.to_vec(),
            // `push_policy` writes plain arguments only.
            _ => Vec::new(),
        })
        .collect()
}

/// A fingerprint of `parts` (e.g. a configuration's arguments): equal parts, equal prints.
pub fn fingerprint(parts: &[Vec<u8>]) -> String {
    let text: Vec<String> = parts
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    code_hash(&format!("{text:?}"))
}

/// The error code of a failed call's error reply (the first word of a Redis error, such as
/// `ERR`, or one a library raises of its own, such as `PACELINE_UNCONFIGURED`); `None` when
/// the call failed otherwise (no answer, a broken connection).
pub fn error_code(e: &StoreError) -> Option<&str> {
    super::transport::redis_cause(e).and_then(|r| r.code())
}

/// Whether a failed call never ran: no connection to its node could be made (refused, or,
/// of a cluster, no connection to the node the call's slot is on), or a cluster's node
/// redirected it (`MOVED`, `ASK`: a node answers so without running the call) to a node
/// that could not be reached. Such a call changed nothing, unlike one whose answer may
/// have been lost on the way back ([`StoreError::answer_may_be_lost`]); a front end may
/// pass over the node it was for and go on with others. A time out, a broken connection
/// or any other answer is `false`. An I/O error of kind `ConnectionRefused` as the
/// error's [`source`](std::error::Error::source) counts as a refused connection too.
///
/// Of a cluster, redis-rs sends a call again, up to twice, after a broken connection or a
/// redirect: this speaks of the attempt that failed last, the one the error reports.
///
/// ```
/// use paceline_core::{StoreError, StoreErrorKind};
/// use paceline_store::redis::never_ran;
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let e = StoreError::new(StoreErrorKind::Unavailable, "no primary").with_source(refused);
/// assert!(never_ran(&e));
/// assert!(!never_ran(&StoreError::new(StoreErrorKind::Timeout, "no answer in time")));
/// ```
pub fn never_ran(e: &StoreError) -> bool {
    if let Some(r) = super::transport::redis_cause(e) {
        return r.is_connection_refusal()
            || matches!(
                r.kind(),
                ErrorKind::ClusterConnectionNotFound
                    | ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
            );
    }
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// A stream of the messages published on one channel (their payloads are not kept).
pub type Messages = Pin<Box<dyn Stream<Item = ()> + Send>>;

/// The payloads of the messages on the channels of a subscription, in order.
pub type Payloads = Pin<Box<dyn Stream<Item = Vec<u8>> + Send>>;

/// The Redis behind a store, as a host of a front end's function libraries: what a front
/// end needs to keep more than a key's state in the store's Redis (the job queue, the API client's shared knowledge).
///
/// A front end writes its rules as a Lua [`Library`] (which carries paceline's algorithm
/// twins, so its functions decide with exactly the algorithms [`Store::decide`] runs) and
/// asks any store for a [`FunctionHost`] with [`Store::functions`]: a store whose state
/// lives in Redis answers one, and every call then goes over that store's connections,
/// timeouts, cluster routing and outage accounting. What stays with the front end is its
/// own argument encoding and reply decoding ([`Reply`], [`Reader`]); the host loads the
/// library where the server lacks it and accounts each call in its node's outage. Beside
/// it, the store's Redis module offers what every front end needs on top: concurrent calls
/// combined ([`Combiner`]), the server's clock followed ([`ServerClock`]), which failures
/// may have been applied ([`StoreError::answer_may_be_lost`]), which never ran
/// ([`never_ran`]) and which carry an error code of the library's own ([`error_code`]).
///
/// [`Store::decide`]: crate::Store::decide
/// [`Store::functions`]: crate::Store::functions
/// [`Combiner`]: super::Combiner
/// [`ServerClock`]: super::ServerClock
/// [`Reply`]: super::Reply
/// [`Reader`]: super::Reader
///
/// ```no_run
/// use paceline_store::redis::Library;
/// use paceline_store::{open, StoreOptions};
/// use std::sync::LazyLock;
///
/// // `entry(KEYS, ARGV)` answers the number of arguments it was given.
/// static COUNTER: LazyLock<Library> = LazyLock::new(|| {
///     Library::new("doc_counter", "local function count(keys, argv) return #argv end", "count")
/// });
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = open("redis://127.0.0.1:6380", &StoreOptions::new()).await?;
/// let host = store.functions().ok_or("this store keeps its state in this process")?;
/// let reply = host.call(&COUNTER, &["{doc}:counter"], [&b"a"[..], b"b"]).await?;
/// assert_eq!(reply.int(), Some(2));
/// # Ok(()) }
/// ```
///
/// Cheap to clone (it shares the store's connections).
#[derive(Clone)]
pub struct FunctionHost {
    store: RedisStore,
}

impl std::fmt::Debug for FunctionHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionHost")
            .field("key_prefix", &self.key_prefix())
            .finish_non_exhaustive()
    }
}

impl From<RedisStore> for FunctionHost {
    fn from(store: RedisStore) -> FunctionHost {
        FunctionHost { store }
    }
}

impl FunctionHost {
    /// What every Redis key of the store starts with, e.g. `paceline:v2:`: a library's keys
    /// start with it too, so one prefix keeps apart everything of one deployment.
    pub fn key_prefix(&self) -> &str {
        self.store.key_prefix()
    }

    /// The key that signs tokens of kind `name`, shared by every process of this Redis: see
    /// [`Store::token_key`](crate::Store::token_key).
    pub async fn token_key(&self, name: &str) -> Result<TokenKey, Error> {
        self.store.token_key(name).await
    }

    /// Calls `library`'s function with `keys` and `args`, within the store's response
    /// timeout, loading the library first where the server lacks it (on every primary of a
    /// cluster). The call's outcome counts in the outage of the first key's node, as
    /// decisions do. Needs Redis 7 functions.
    pub async fn call<'a>(
        &self,
        library: &Library,
        keys: &[&str],
        args: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Reply, StoreError> {
        let transport = self.store.transport();
        if !transport.runs_as_functions() {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "this Redis server does not run functions (Redis 7 or later, with permission to FUNCTION LOAD); paceline's job queues and shared client limiters need them",
            ));
        }
        let mut call = redis::cmd("FCALL");
        call.arg(library.function()).arg(keys.len());
        for key in keys {
            call.arg(*key);
        }
        for arg in args {
            call.arg(arg);
        }
        let first = transport.query::<Value>(&call, "a function call").await;
        let answer = match first {
            Err(e) if is_missing_function(&e) => {
                match transport
                    .query::<Value>(&load_command(&library.code), "loading paceline's functions")
                    .await
                {
                    Ok(_) => transport.query::<Value>(&call, "a function call").await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        if let Some(key) = keys.first() {
            self.store.observe_call(key, answer.as_ref().map(|_| ()));
        }
        answer.map(Reply::new)
    }

    /// Subscribes to `channel` on a connection of its own: to the server, or to the first
    /// node of a cluster's seed list that answers (Redis Cluster passes every message to
    /// every node).
    pub async fn subscribe(&self, channel: &str) -> Result<Messages, StoreError> {
        self.subscribe_all(&[channel]).await
    }

    /// Subscribes to every one of `channels` on one connection of its own (see
    /// [`subscribe`](Self::subscribe)): a message on any of them comes out of the one
    /// stream. For a front end that follows many channels (a queue of several partitions,
    /// each with its own) at the cost of one connection.
    pub async fn subscribe_all(&self, channels: &[&str]) -> Result<Messages, StoreError> {
        let pubsub = self.pubsub(channels).await?;
        Ok(Box::pin(pubsub.into_on_message().map(|_| ())))
    }

    /// [`subscribe_all`](Self::subscribe_all), keeping what each message says: its
    /// payload's bytes.
    pub async fn subscribe_payloads(&self, channels: &[&str]) -> Result<Payloads, StoreError> {
        let pubsub = self.pubsub(channels).await?;
        Ok(Box::pin(
            pubsub
                .into_on_message()
                .map(|m| m.get_payload_bytes().to_vec()),
        ))
    }

    /// A connection of its own subscribed to `channels`: see [`subscribe`](Self::subscribe).
    async fn pubsub(&self, channels: &[&str]) -> Result<redis::aio::PubSub, StoreError> {
        let what = "a subscription";
        let wait = self.store.transport().response_timeout() * 4;
        let mut last = None;
        for client in self.store.subscribers() {
            let subscribed = tokio::time::timeout(wait, async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(channels).await?;
                Ok::<_, redis::RedisError>(pubsub)
            })
            .await;
            match subscribed {
                Ok(Ok(pubsub)) => return Ok(pubsub),
                Ok(Err(e)) => last = Some(super::transport::store_error(e, what)),
                Err(_) => {
                    last = Some(StoreError::new(
                        StoreErrorKind::Timeout,
                        format!("Redis did not answer {what} in time"),
                    ))
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            StoreError::new(StoreErrorKind::Unavailable, "no Redis node to subscribe on")
        }))
    }
}

/// Whether a call failed because the server lacks the function (a fresh or restarted
/// server, or one whose functions were flushed): only then is the library loaded and the
/// call made again. Redis gives this case no error code of its own (it answers `ERR
/// Function not found`), so it is told by that reply's text; any other error reply (a
/// failing call may have written part of its work) is the caller's, never repeated.
fn is_missing_function(e: &StoreError) -> bool {
    super::transport::redis_cause(e).is_some_and(|r| {
        r.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
            && r.code() == Some("ERR")
            && r.detail()
                .is_some_and(|d| d.starts_with("Function not found"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::RedisError;

    fn from_redis(e: RedisError) -> StoreError {
        super::super::transport::store_error(e, "a function call")
    }

    #[test]
    fn a_call_never_ran_when_refused_or_redirected_and_may_have_when_cut_or_late() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let moved = (
            ErrorKind::Server(ServerErrorKind::Moved),
            "moved",
            "13810 127.0.0.1:7002".to_string(),
        );
        let ask = (
            ErrorKind::Server(ServerErrorKind::Ask),
            "ask",
            "13810 127.0.0.1:7002".to_string(),
        );
        for never in [
            from_redis(RedisError::from(refused)),
            from_redis(RedisError::from(moved)),
            from_redis(RedisError::from(ask)),
            StoreError::new(StoreErrorKind::Unavailable, "refused")
                .with_source(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
        ] {
            assert!(never_ran(&never), "{never}");
        }
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let timed_out = std::io::Error::from(std::io::ErrorKind::TimedOut);
        let script = (
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "ERR",
            "user_script:1: boom".to_string(),
        );
        for maybe in [
            from_redis(RedisError::from(reset)),
            from_redis(RedisError::from(timed_out)),
            from_redis(RedisError::from(script)),
            StoreError::new(StoreErrorKind::Timeout, "no answer in time"),
            StoreError::new(StoreErrorKind::Unavailable, "reset")
                .with_source(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        ] {
            assert!(!never_ran(&maybe), "{maybe}");
        }
    }
}
