//! Lua function libraries built on paceline's algorithm twins, for paceline's own front
//! ends that keep more than a key's state in Redis (the job queue): the library carries the
//! twins (`PL`), so its functions decide with exactly the algorithms `decide` runs, and the
//! store calls it over its own connection, timeouts and cluster routing.
//!
//! Not a stable API: the front ends are paceline's own crates.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use paceline_core::{Policy, StoreError, StoreErrorKind};
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};

use super::args::push_policy;
use super::script::{code_hash, register, ALGORITHMS};
use super::store::RedisStore;
use super::transport::load_command;

/// A function library: paceline's algorithm twins, then `source`, which defines the local
/// Lua function `entry(KEYS, ARGV)`; registered as one Redis function whose name carries
/// the hash of the code.
#[derive(Debug)]
pub struct Extension {
    function: String,
    code: String,
}

impl Extension {
    /// The library of `source` under the name stem `stem` (e.g. `queue`).
    pub fn new(stem: &str, source: &str, entry: &str) -> Extension {
        let body = format!("{}\n{source}\n", ALGORITHMS.as_str());
        let (code, name) = register(stem, &body, &[(stem, entry, "")]);
        Extension {
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

/// A stream of the messages published on one channel (their payloads are not kept).
pub type Messages = Pin<Box<dyn Stream<Item = ()> + Send>>;

impl RedisStore {
    /// Calls `extension`'s function with `keys` and `args`, within the store's response
    /// timeout, loading the library first where the server lacks it (on every primary of a
    /// cluster). Needs Redis 7 functions.
    pub async fn call_extension<'a>(
        &self,
        extension: &Extension,
        keys: &[&str],
        args: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Value, StoreError> {
        let transport = self.transport();
        if !transport.runs_as_functions() {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "this Redis server does not run functions (Redis 7 or later, with permission to FUNCTION LOAD); paceline's job queues and shared client limiters need them",
            ));
        }
        let mut call = redis::cmd("FCALL");
        call.arg(extension.function()).arg(keys.len());
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
                    .query::<Value>(
                        &load_command(&extension.code),
                        "loading paceline's functions",
                    )
                    .await
                {
                    Ok(_) => transport.query::<Value>(&call, "a function call").await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        if let Some(key) = keys.first() {
            self.observe_call(key, answer.as_ref().map(|_| ()));
        }
        answer
    }

    /// Subscribes to `channel` on a connection of its own: to the server, or to the first
    /// node of a cluster's seed list that answers (Redis Cluster passes every message to
    /// every node).
    pub async fn subscribe(&self, channel: &str) -> Result<Messages, StoreError> {
        let what = "a subscription";
        let mut last = None;
        for client in self.subscribers() {
            let subscribed = tokio::time::timeout(self.transport().response_timeout() * 4, async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            })
            .await;
            match subscribed {
                Ok(Ok(pubsub)) => return Ok(Box::pin(pubsub.into_on_message().map(|_| ()))),
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
