//! What every call of the queue's function goes through: the clock argument, the
//! configuration sent again to a queue that lost it, the server's time observed, and the
//! operations that are combined.

use std::sync::Arc;
use std::time::Duration;

use paceline_core::{Clock, Policy};
use paceline_store::redis::{
    error_code, fingerprint, policy_args, CallFuture, FunctionHost, Reply, ServerClock,
};

use super::LIBRARY;
use crate::config::QueueConfig;
use crate::error::QueueError;

/// What every call of the queue's function needs.
pub(super) struct Caller {
    pub(super) host: FunctionHost,
    /// `PREFIX{q:NAME}:`, the start of every key of the queue.
    pub(super) base: String,
    pub(super) clock: Arc<dyn Clock>,
    /// An injected clock's time goes with every call; else the server's `TIME` rules, and
    /// `server_clock` follows it.
    pub(super) injected: bool,
    pub(super) server_clock: Option<Arc<ServerClock>>,
    /// The `config` operation's arguments, sent again to a queue that lost its
    /// configuration (a Redis restarted without persistence, or flushed).
    pub(super) config: Vec<Vec<u8>>,
}

/// The most operations one combined call carries.
pub(super) const MAX_COMBINED: usize = 256;
/// The most combined calls in flight at once: two keep Redis busy (one runs while the next
/// is on its way) and let the operations that arrive meanwhile gather into the next call.
/// Each call costs the queue's function about as much as one more job does, so fewer,
/// fuller calls are cheaper: with 64 producers enqueueing one job at a time on one Redis,
/// two in flight made 15 % more jobs per second than four, and one 10 % fewer than two.
pub(super) const MAX_IN_FLIGHT: usize = 2;

/// The operations that change the queue and tick its clock: concurrent ones go to Redis
/// combined, in one call (`multi`), as if each had been its own call at the same time.
pub(super) const COMBINED: &[&str] = &[
    "enqueue",
    "lease",
    "ack",
    "fail",
    "extend",
    "cancel",
    "retry_dead",
    "pause",
    "resume",
    "set_policy",
    "put_schedule",
    "delete_schedule",
    "fire",
];

/// Whether `op`'s answer starts with the queue's time: the operations that tick its clock
/// (`ticking` in `lua/queue.lua`).
fn ticks(op: &str) -> bool {
    COMBINED.contains(&op) || op == "counts" || op == "stats"
}

impl Caller {
    /// The caller of the queue (or partition) at `base`: on `clock` (`None`: the server's
    /// time, followed as answers show it), sending `config` as its `config` operation's
    /// arguments.
    pub(super) fn new(
        host: FunctionHost,
        base: String,
        clock: Option<Arc<dyn Clock>>,
        config: Vec<Vec<u8>>,
    ) -> Caller {
        let (clock, injected, server_clock): (Arc<dyn Clock>, bool, _) = match clock {
            Some(clock) => (clock, true, None),
            None => {
                let server = Arc::new(ServerClock::new());
                (server.clone(), false, Some(server))
            }
        };
        Caller {
            host,
            base,
            clock,
            injected,
            server_clock,
            config,
        }
    }

    /// Calls the operation `op` with `args`; on a queue that has lost its configuration,
    /// sends this handle's and calls once more.
    pub(super) async fn call(&self, op: &str, args: &[Vec<u8>]) -> Result<Reply, QueueError> {
        match self.call_once(op, args).await {
            Err(QueueError::Store(e))
                if op != "config" && error_code(&e) == Some("PACELINE_UNCONFIGURED") =>
            {
                self.call_once("config", &self.config).await?;
                self.call_once(op, args).await
            }
            other => other,
        }
    }

    /// Calls the operation `op` with `args` after the clock argument.
    async fn call_once(&self, op: &str, args: &[Vec<u8>]) -> Result<Reply, QueueError> {
        let clock = if self.injected {
            arg(format!("{} 0", self.clock.now_micros()))
        } else {
            Vec::new()
        };
        let head = [op.as_bytes(), clock.as_slice()];
        let all = head.into_iter().chain(args.iter().map(Vec::as_slice));
        let reply = self.host.call(&LIBRARY, &[&self.base], all).await?;
        // Every answer of a ticking operation starts with the server's time (a combined
        // call's, its first operation's).
        if let Some(server) = &self.server_clock {
            let first = match op {
                "multi" => reply.head_int(2),
                op if ticks(op) => reply.head_int(1),
                _ => None,
            };
            if let Some(now) = first.and_then(|n| u64::try_from(n).ok()) {
                server.observe(now);
            }
        }
        Ok(reply)
    }

    /// The combining task's call: an operation (or `multi`) made through this caller.
    pub(super) fn combined(
        self: &Arc<Caller>,
    ) -> impl Fn(&'static str, Vec<Vec<u8>>) -> CallFuture<QueueError> {
        let caller = Arc::clone(self);
        move |op, args| {
            let caller = Arc::clone(&caller);
            Box::pin(async move { caller.call(op, &args).await })
        }
    }
}

/// The `config` operation's arguments for `c`: its fingerprint, the default policy's spec
/// and arguments, each group's own, the settings, the queue's own cap and policy, and
/// `extra` (a partition's number of
/// partitions and id suffix; none for a queue of one), which the fingerprint covers too.
pub(super) fn config_args(c: &QueueConfig, extra: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut args = Vec::new();
    let push_policy = |args: &mut Vec<Vec<u8>>, policy| {
        let list = queue_policy_args(policy);
        args.push(arg(list.len()));
        args.extend(list);
    };
    args.push(arg(&c.group_policy));
    push_policy(&mut args, &c.group_policy);
    args.push(arg(c.groups.len()));
    for (group, policy) in &c.groups {
        args.push(group.clone().into_bytes());
        args.push(arg(policy));
        push_policy(&mut args, policy);
    }
    args.push(arg(c.group_concurrency));
    args.push(arg(c.max_attempts));
    args.push(arg(paceline_core::round_to_micros(c.lease)));
    args.push(arg(paceline_core::round_to_micros(c.retry_backoff)));
    args.push(arg(paceline_core::round_to_micros(c.retry_backoff_max)));
    args.push(arg(c.max_jobs));
    args.push(arg(c.max_payload));
    args.push(arg(c.queue_concurrency));
    match &c.queue_policy {
        Some(policy) => {
            args.push(arg(policy));
            push_policy(&mut args, policy);
        }
        None => {
            args.push(Vec::new());
            args.push(arg(0));
        }
    }
    // What the queue keeps of ended jobs ('' for no bound).
    let micros = |d: Option<Duration>| d.map(|d| arg(paceline_core::round_to_micros(d)));
    args.push(arg(c.keep_completed));
    args.push(micros(c.keep_completed_for).unwrap_or_default());
    args.push(c.keep_dead.map(arg).unwrap_or_default());
    args.push(micros(c.keep_dead_for).unwrap_or_default());
    args.extend(extra);
    let mut all = vec![arg(fingerprint(&args))];
    all.extend(args);
    all
}

/// A policy's arguments as the queue's Lua twin reads them: the algorithm's (as the
/// decisions' functions take them), then the most one start may cost ('' for any cost).
pub(super) fn queue_policy_args(policy: &Policy) -> Vec<Vec<u8>> {
    let mut list = policy_args(policy);
    list.push(
        policy
            .max_cost(paceline_core::Op::Limit)
            .map(arg)
            .unwrap_or_default(),
    );
    list
}

pub(super) fn arg(x: impl ToString) -> Vec<u8> {
    x.to_string().into_bytes()
}
