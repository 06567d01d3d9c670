//! The transport: where the store connects (one Redis server or a Redis Cluster), how its
//! calls are encoded and sent (the Lua library as functions or as a script, loaded when a
//! server lacks it), within what time, and how Redis's errors are classified.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;
use std::time::Duration;

use paceline_core::{Decision, InputError, Policy, StoreError, StoreErrorKind};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};
use tokio::time::Instant;

use super::args::{push_clock, push_params, push_policy, push_request, Prefixed};
use super::script::{
    lean_decisions, parse_all_reply, parse_reply, single_decision, DECIDE, DECIDE_ALL, LEASE,
    LIBRARY,
};
use crate::{without_credentials, Request};

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `redis://` or `rediss://`: one server (the URL as redis-rs reads it).
    Single(String),
    /// `redis-cluster://` or `rediss-cluster://`: the seed nodes, each as a server URL.
    Cluster(Vec<String>),
}

impl Target {
    /// Reads `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS),
    /// `redis-cluster://[user:password@]host:port[,host:port...]` or `rediss-cluster://...`.
    pub(crate) fn parse(url: &str) -> Result<Target, InputError> {
        let url = url.trim();
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad_url(url))?;
        match scheme {
            "redis" | "rediss" => {
                // A password may hold any character; the hosts part may not hold a comma.
                let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
                if hosts.is_empty() || hosts.contains(',') {
                    return Err(bad_url(url));
                }
                Ok(Target::Single(url.to_string()))
            }
            "redis-cluster" | "rediss-cluster" => {
                let server_scheme = scheme.trim_end_matches("-cluster");
                let (auth, hosts) = match rest.rsplit_once('@') {
                    Some((auth, hosts)) => (format!("{auth}@"), hosts),
                    None => (String::new(), rest),
                };
                let hosts = hosts.trim_end_matches('/');
                if hosts.contains('/') {
                    return Err(InputError::new(
                        "store",
                        format!("`{url}`: a Redis Cluster has only database 0; drop the `/db`"),
                    ));
                }
                let nodes: Vec<String> = hosts
                    .split(',')
                    .map(str::trim)
                    .map(|host| {
                        if host.is_empty() {
                            Err(bad_url(url))
                        } else {
                            Ok(format!("{server_scheme}://{auth}{host}"))
                        }
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Target::Cluster(nodes))
            }
            _ => Err(bad_url(url)),
        }
    }

    /// A client for one connection of its own to `url` (a server's URL).
    fn client_of(url: &str, root_certificate: Option<&[u8]>) -> RedisResult<redis::Client> {
        match root_certificate {
            Some(pem) => redis::Client::build_with_tls(url, certificates(pem)),
            None => redis::Client::open(url),
        }
    }

    /// Clients for connections of their own: the server's, or one per seed node.
    pub(crate) fn clients(
        &self,
        root_certificate: Option<&[u8]>,
    ) -> RedisResult<Vec<redis::Client>> {
        match self {
            Target::Single(url) => Ok(vec![Target::client_of(url, root_certificate)?]),
            Target::Cluster(nodes) => nodes
                .iter()
                .map(|n| Target::client_of(n, root_certificate))
                .collect(),
        }
    }

    /// What the target names, without credentials: the server's URL, or the seed nodes'
    /// URLs joined by commas.
    pub(crate) fn describe(&self) -> String {
        match self {
            Target::Single(url) => without_credentials(url),
            Target::Cluster(nodes) => nodes
                .iter()
                .map(|n| without_credentials(n))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    pub(crate) fn uses_tls(&self) -> bool {
        match self {
            Target::Single(url) => url.starts_with("rediss://"),
            Target::Cluster(nodes) => nodes.iter().any(|n| n.starts_with("rediss://")),
        }
    }
}

fn bad_url(url: &str) -> InputError {
    InputError::new(
        "store",
        format!(
            "`{url}` is not a Redis URL; use redis://HOST:PORT[/DB], rediss://HOST:PORT (TLS), \
             or redis-cluster://HOST:PORT[,HOST:PORT...] (user:password@ allowed before the host)"
        ),
    )
}

/// A root certificate as the clients take it.
fn certificates(pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    }
}

/// A connection to one server or to a cluster. Cheap to clone: clones share the socket(s),
/// and concurrent commands pipeline on them.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Connects, giving up after `connect_timeout` per attempt.
    pub(crate) async fn open(
        target: &Target,
        root_certificate: Option<&[u8]>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Connection, StoreError> {
        if target.uses_tls() {
            crate::install_tls_provider();
        }
        // Error messages name the server, never the credentials.
        let what = target.describe();
        let opened = async {
            match target {
                Target::Single(url) => {
                    let client = Target::client_of(url, root_certificate)?;
                    // One attempt per connect: a call whose connection cannot be made
                    // fails at once (by its failure policy) rather than waiting through
                    // attempts with pauses between them, and the store sends it again once
                    // on a fresh connection (see `Resend`), so the first call after a
                    // restart finds Redis.
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(connect_timeout))
                        .set_response_timeout(Some(response_timeout))
                        .set_number_of_retries(0);
                    let mut manager = ConnectionManager::new_with_config(client, config).await?;
                    // A cluster node behind a plain URL would answer MOVED for most keys.
                    let info: String = redis::cmd("INFO")
                        .arg("cluster")
                        .query_async(&mut manager)
                        .await?;
                    if info.contains("cluster_enabled:1") {
                        return Err(RedisError::from((
                            redis::ErrorKind::Client,
                            "this server is a Redis Cluster node",
                            "use a redis-cluster:// URL".to_string(),
                        )));
                    }
                    Ok(Connection::Single(manager))
                }
                Target::Cluster(nodes) => {
                    let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
                        .connection_timeout(connect_timeout)
                        .response_timeout(response_timeout)
                        .retries(2);
                    if let Some(pem) = root_certificate {
                        builder = builder.certs(certificates(pem));
                    }
                    let client = builder.build()?;
                    client.get_async_connection().await.map(Connection::Cluster)
                }
            }
        };
        // The clients time out each attempt; this bounds the whole connect.
        match tokio::time::timeout(connect_timeout.saturating_mul(3), opened).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(StoreError::new(
                error_kind(&e),
                format!("cannot connect to Redis at {what}: {e}"),
            )
            .with_source(e)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("cannot connect to Redis at {what}: no answer within {connect_timeout:?}"),
            )),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// What kind of store failure a Redis error is, by redis-rs's classification of it: time
/// outs, lost connections and a server that cannot serve now (loading, busy, a cluster or
/// primary down, read-only, out of memory) are outages; anything else is a protocol error.
pub(crate) fn error_kind(e: &RedisError) -> StoreErrorKind {
    use redis::ServerErrorKind as Server;
    if e.is_timeout() {
        return StoreErrorKind::Timeout;
    }
    let outage = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    Server::BusyLoading
                        | Server::ClusterDown
                        | Server::MasterDown
                        | Server::TryAgain
                        | Server::ReadOnly
                )
        )
        // Server error codes redis-rs has no kind for: a script running too long, memory
        // full, too few replicas.
        || (e.kind() == ErrorKind::Extension
            && matches!(e.code(), Some("BUSY" | "OOM" | "NOREPLICAS")));
    if outage {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Protocol
    }
}

/// A Redis error as a store error about `what`, keeping it as the [`source`]
/// (`std::error::Error::source`).
pub(crate) fn store_error(e: RedisError, what: &str) -> StoreError {
    StoreError::new(error_kind(&e), format!("Redis failed {what}: {e}")).with_source(e)
}

/// The Redis error behind a store error, if one is.
pub(crate) fn redis_cause(e: &StoreError) -> Option<&RedisError> {
    std::error::Error::source(e).and_then(|source| source.downcast_ref::<RedisError>())
}

/// Whether a call that failed may be sent again, once, on a fresh connection, inside the
/// store (callers see only the second attempt's outcome).
///
/// Sending a call again is safe only if the first attempt cannot have changed anything in
/// Redis: a decision applied twice counts twice. By case, on a single server (a cluster's
/// connection follows redis-rs's own rules):
///
/// * [`Unsent`](Resend::Unsent): the connection could not be made (refused; also the
///   manager's attempt that failed while Redis was down, which it answers until it tries
///   again). Nothing was written: sent again once the server answers on a fresh
///   connection.
/// * [`IfRestarted`](Resend::IfRestarted): the connection closed before an answer (broken
///   pipe, reset, end of stream, or "connection closed" from a multiplexed connection whose
///   reader had already stopped). Either the request was never written (the connection had
///   died with its server while the store was idle: the usual first call after a restart)
///   or it was, and the server may have applied it. The store asks the server on a fresh
///   connection for its run id (`INFO server`): a new one means the server the connection
///   led to is gone, with what it held in memory, so the call goes to the new one; the
///   run id known before means that server lives on (the connection was cut: `CLIENT KILL`,
///   an idle `timeout`, a network fault) and may have applied the call, so it fails as it
///   did. A restarted server that had persisted the call's write in its last moment (AOF
///   with `appendfsync always`) counts it twice: an over-count, as for a call that timed
///   out and was applied late, never a lost admission. Without `INFO` (not allowed by the
///   server's ACL) the run id is unknown and such a call is never sent again.
/// * [`Never`](Resend::Never): a time out (the call may still be applied), any reply from
///   Redis (the call reached it), anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resend {
    Unsent,
    IfRestarted,
    Never,
}

impl Resend {
    fn of(e: &RedisError) -> Resend {
        if e.is_connection_refusal() {
            Resend::Unsent
        } else if e.is_connection_dropped() && !e.is_timeout() {
            Resend::IfRestarted
        } else {
            Resend::Never
        }
    }
}

/// How paceline's calls travel: the connection, the key prefix, the response timeout, and
/// whether the server runs the Lua library as functions or as a script.
pub(crate) struct Transport {
    connection: Connection,
    /// `PREFIX:v2:`.
    key_prefix: String,
    /// With an injected clock: how long (ms of real time) keys outlive their reset.
    ttl_slack_ms: u64,
    response_timeout: Duration,
    /// True when the server runs paceline's Lua as a Redis function (`FCALL`, Redis 7+);
    /// false: as a script (`EVALSHA`).
    functions: bool,
    /// A single server's identity, for sending a call again after its connection closed
    /// (see [`Resend`]).
    server: ServerIdentity,
}

/// The run id (`INFO server`) of the single server a store last saw, and how many times
/// it changed: a restarted server has a new one.
#[derive(Default)]
struct ServerIdentity {
    run_id: std::sync::Mutex<Option<String>>,
    /// Bumped each time the store learns that the run id changed.
    epoch: AtomicU64,
}

impl Transport {
    /// Over `connection`, loading the library as functions unless `scripts_only` (or the
    /// server cannot).
    pub(crate) async fn new(
        connection: Connection,
        key_prefix: String,
        ttl_slack_ms: u64,
        response_timeout: Duration,
        scripts_only: bool,
    ) -> Transport {
        let functions = !scripts_only && load_library(&mut connection.clone()).await.is_ok();
        let transport = Transport {
            connection,
            key_prefix,
            ttl_slack_ms,
            response_timeout,
            functions,
            server: ServerIdentity::default(),
        };
        if !transport.is_cluster() {
            let run_id = tokio::time::timeout(response_timeout, transport.run_id()).await;
            if let Ok(Some(run_id)) = run_id {
                transport.learn(run_id);
            }
        }
        transport
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.connection.is_cluster()
    }

    pub(crate) fn runs_as_functions(&self) -> bool {
        self.functions
    }

    pub(crate) fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The time by which a call starting now must be answered.
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.response_timeout
    }

    /// Sends `command`, expecting a `T`, answered within the response timeout (sent again
    /// once where [`Resend`] allows).
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        command: &Cmd,
        what: &str,
    ) -> Result<T, StoreError> {
        let sent =
            self.send(|mut connection| async move { command.query_async(&mut connection).await });
        self.bounded_until(self.deadline(), sent, what).await
    }

    /// Sends `command` to the cluster's primary at `host:port` only, expecting a `T`,
    /// answered within the response timeout; on a single server, to the server.
    pub(crate) async fn query_node<T: FromRedisValue>(
        &self,
        command: &Cmd,
        host: &str,
        port: u16,
        what: &str,
    ) -> Result<T, StoreError> {
        let Connection::Cluster(cluster) = &self.connection else {
            return self.query(command, what).await;
        };
        let mut cluster = cluster.clone();
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.to_string(),
            port,
        });
        let reply = async move {
            let value = cluster.route_command(command.clone(), routing).await?;
            T::from_redis_value(value).map_err(RedisError::from)
        };
        self.bounded_until(self.deadline(), reply, what).await
    }

    /// Runs `attempt` on the connection and, if it failed in a way [`Resend`] allows, once
    /// more on a fresh one.
    async fn send<T, F, Fut>(&self, mut attempt: F) -> RedisResult<T>
    where
        F: FnMut(Connection) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let epoch = self.server.epoch.load(Ordering::Relaxed);
        let first = attempt(self.connection.clone()).await;
        match &first {
            Err(e) if self.may_send_again(e, epoch).await => attempt(self.connection.clone()).await,
            _ => first,
        }
    }

    /// Whether a call started at identity epoch `epoch` and failed with `e` may be sent
    /// again (see [`Resend`]). On a single server only: a cluster's connection sends again
    /// by its own rules (redis-rs retries a request whose connection dropped, or whose
    /// node moved, up to twice).
    async fn may_send_again(&self, e: &RedisError, epoch: u64) -> bool {
        if self.is_cluster() {
            return false;
        }
        let resend = Resend::of(e);
        if resend == Resend::Never {
            return false;
        }
        // The connection failed: the manager is connecting again. Whose server answers?
        let Some(run_id) = self.run_id().await else {
            // Not reachable yet (or `INFO` is not allowed): the call fails as it did.
            return false;
        };
        let restarted = self.learn(run_id) || self.server.epoch.load(Ordering::Relaxed) != epoch;
        resend == Resend::Unsent || restarted
    }

    /// The server's run id (`INFO server`), if it answers.
    async fn run_id(&self) -> Option<String> {
        let mut connection = self.connection.clone();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut connection)
            .await
            .ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .map(|id| id.trim().to_string())
    }

    /// Records the server's `run_id`; true if it differs from a run id known before (the
    /// server restarted: the epoch moves on). The first one learned is no restart.
    fn learn(&self, run_id: String) -> bool {
        let mut known = self
            .server
            .run_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match known.replace(run_id) {
            None => false,
            Some(before) if Some(&before) == known.as_ref() => false,
            Some(_) => {
                self.server.epoch.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    }

    /// Awaits `f` until `deadline` at the latest.
    async fn bounded_until<T>(
        &self,
        deadline: Instant,
        f: impl std::future::Future<Output = RedisResult<T>>,
        what: &str,
    ) -> Result<T, StoreError> {
        let allowed = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout_at(deadline, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(store_error(e, what)),
            Err(_) if allowed < self.response_timeout => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!(
                    "Redis did not answer {what} within the {allowed:?} left to the call (the \
                     store's response timeout, {:?}, bounds a whole call, its time queued for \
                     auto-batching included)",
                    self.response_timeout
                ),
            )),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!(
                    "Redis did not answer {what} within {:?} (the store's response timeout)",
                    self.response_timeout
                ),
            )),
        }
    }

    /// The single-decision entry point for `policy`'s algorithm, if the server has one
    /// (`gcra` and `pacer`, run as functions).
    pub(crate) fn single_entry(&self, policy: &Policy) -> Option<&'static str> {
        if !self.functions {
            return None;
        }
        LIBRARY.single(policy)
    }

    /// One decision by a single-decision entry point (`function`, see `lua/lean.lua`):
    /// the server applies it and answers with the state it saw, from which the Rust
    /// algorithm derives the decision.
    pub(crate) async fn call_single(
        &self,
        function: &str,
        r: &Request<'_>,
        now: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let mut call = redis::cmd("FCALL");
        call.arg(function)
            .arg(1)
            .arg(Prefixed(&self.key_prefix, r.key));
        push_clock(now, self.ttl_slack_ms, &mut call);
        push_request(r.op, r.cost, &mut call);
        push_params(r.policy, &mut call);
        let reply = self
            .bounded_until(
                self.deadline(),
                self.send(|mut c| {
                    let call = &call;
                    async move { run_decide(&mut c, call, self.functions, &DECIDE).await }
                }),
                "a decision",
            )
            .await?;
        single_decision(reply, r, now)
    }

    /// One call carrying `batch`, in order, answered by `deadline`.
    ///
    /// `spread`: the keys may span several slots of one cluster node; they go in the
    /// arguments, with only the first declared as a key (which routes the call to its
    /// node), and the library, flagged `allow-cross-slot-keys`, reads them all before it
    /// writes any.
    pub(crate) async fn call(
        &self,
        batch: &[&Request<'_>],
        now: Option<u64>,
        spread: bool,
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        let (policies, numbers) = numbered(batch);
        // The lean batch answers `gcra` and `pacer` decisions with less work for the server;
        // it takes the same arguments (see `PL.read_batch` in `lua/prelude.lua`).
        let lean = self.functions && policies.iter().all(|p| LIBRARY.single(p).is_some());
        let mut call = if self.functions {
            let mut call = redis::cmd("FCALL");
            call.arg(if lean {
                &LIBRARY.lean_batch
            } else {
                &LIBRARY.function
            });
            call
        } else {
            let mut call = redis::cmd("EVALSHA");
            call.arg(DECIDE.get_hash());
            call
        };
        self.push_batch(&mut call, batch, now, spread, &policies, &numbers);
        let reply = self
            .bounded_until(
                deadline,
                self.send(|mut c| {
                    let call = &call;
                    async move { run_decide(&mut c, call, self.functions, &DECIDE).await }
                }),
                "a decision",
            )
            .await?;
        if lean {
            lean_decisions(reply, batch, now)
        } else {
            parse_reply(reply, batch.iter().map(|r| r.policy.limit()))
        }
    }

    /// Writes a batch's arguments (see `PL.read_batch` in `lua/prelude.lua`) after the
    /// function's name: the keys (only the first declared when `spread`), the clock,
    /// `policies` (each distinct policy once) and the runs of requests referring to them by
    /// their `numbers`.
    fn push_batch(
        &self,
        call: &mut Cmd,
        batch: &[&Request<'_>],
        now: Option<u64>,
        spread: bool,
        policies: &[&Policy],
        numbers: &[usize],
    ) {
        // The keys, each written under the prefix straight into the command.
        let prefix = self.key_prefix.as_str();
        let push_keys = |call: &mut Cmd| {
            call.arg(batch.len());
            for r in batch {
                call.arg(Prefixed(prefix, r.key));
            }
        };
        // (Node groups exist only on clusters running the library as functions.)
        let spread = spread && batch.len() > 1;
        if spread {
            call.arg(1).arg(Prefixed(prefix, batch[0].key));
        } else {
            push_keys(call);
        }
        push_clock(now, self.ttl_slack_ms, call);
        if spread {
            push_keys(call);
        } else {
            call.arg(0);
        }
        call.arg(policies.len());
        for policy in policies {
            push_policy(policy, call);
        }
        let runs = runs(batch, numbers);
        call.arg(runs.len());
        for (start, count) in runs {
            call.arg(count).arg(numbers[start]);
            push_request(batch[start].op, batch[start].cost, call);
        }
    }

    /// Releases (`extend`: false) or extends lease `id` of `key` under `policy` (a
    /// `concurrency` policy): the reply of `lua/lease.lua`, 1 or 0 for a release, the new
    /// expiry in µs or -1 for an extension.
    pub(crate) async fn call_lease(
        &self,
        policy: &Policy,
        key: &str,
        id: u64,
        extend: bool,
        now: Option<u64>,
    ) -> Result<i64, StoreError> {
        let mut call = if self.functions {
            let mut call = redis::cmd("FCALL");
            call.arg(&LIBRARY.lease);
            call
        } else {
            let mut call = redis::cmd("EVALSHA");
            call.arg(LEASE.get_hash());
            call
        };
        call.arg(1).arg(Prefixed(&self.key_prefix, key));
        push_clock(now, self.ttl_slack_ms, &mut call);
        call.arg(if extend { "extend" } else { "release" }).arg(id);
        push_policy(policy, &mut call);
        let reply = self
            .bounded_until(
                self.deadline(),
                self.send(|mut c| {
                    let call = &call;
                    async move { run_decide(&mut c, call, self.functions, &LEASE).await }
                }),
                "a lease call",
            )
            .await?;
        match reply {
            Value::Int(n) => Ok(n),
            other => Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!("unexpected reply from the paceline lease script: {other:?}"),
            )),
        }
    }

    /// One call deciding `batch` as a set (`lua/decide_all.lua`): whether it was admitted,
    /// and each limit's decision (`None`: a `pace` set whose slots did not meet). The keys
    /// share a slot (checked by the caller).
    pub(crate) async fn call_all(
        &self,
        batch: &[&Request<'_>],
        now: Option<u64>,
    ) -> Result<Option<(bool, Vec<Decision>)>, StoreError> {
        let (policies, numbers) = numbered(batch);
        let mut call = if self.functions {
            let mut call = redis::cmd("FCALL");
            call.arg(&LIBRARY.all);
            call
        } else {
            let mut call = redis::cmd("EVALSHA");
            call.arg(DECIDE_ALL.get_hash());
            call
        };
        self.push_batch(&mut call, batch, now, false, &policies, &numbers);
        let reply = self
            .bounded_until(
                self.deadline(),
                self.send(|mut c| {
                    let call = &call;
                    async move { run_decide(&mut c, call, self.functions, &DECIDE_ALL).await }
                }),
                "a set decision",
            )
            .await?;
        parse_all_reply(reply, batch.iter().map(|r| r.policy.limit()))
    }
}

/// Each distinct policy of `batch` once, and each request's policy by its number (from 1)
/// among them: a call sends each policy once.
fn numbered<'a>(batch: &[&'a Request<'_>]) -> (Vec<&'a Policy>, Vec<usize>) {
    let mut policies: Vec<&Policy> = Vec::new();
    let mut numbers = Vec::with_capacity(batch.len());
    for r in batch {
        let known = policies
            .iter()
            .rposition(|p| std::ptr::eq(*p, r.policy) || *p == r.policy);
        numbers.push(match known {
            Some(i) => i + 1,
            None => {
                policies.push(r.policy);
                policies.len()
            }
        });
    }
    (policies, numbers)
}

/// A batch's consecutive requests with the same policy (by its number in the call), op
/// (`max_wait` included) and cost, as (the first one's index, how many): each run is sent
/// once (see `PL.read_batch` in `lua/prelude.lua`).
fn runs(batch: &[&Request<'_>], numbers: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, (r, &number)) in batch.iter().zip(numbers).enumerate() {
        match runs.last_mut() {
            Some((start, count))
                if numbers[*start] == number
                    && batch[*start].op == r.op
                    && batch[*start].cost == r.cost =>
            {
                *count += 1
            }
            _ => runs.push((i, 1)),
        }
    }
    runs
}

/// Sends a decision call (`FCALL` or `EVALSHA`), loading the code first if the server
/// lacks it (a fresh or restarted server, or a cluster node that just took over), then
/// sending the call again (`functions`: the call is an `FCALL`). A script the server does
/// not hold is `NOSCRIPT`; a function it does not hold has no error kind of its own (a
/// generic error), so any generic error to an `FCALL` loads the library and tries once more: that call changed nothing, since the
/// library checks every argument and reads every key before it writes.
async fn run_decide(
    connection: &mut Connection,
    call: &Cmd,
    functions: bool,
    script: &redis::Script,
) -> RedisResult<Value> {
    match call.query_async(connection).await {
        Err(e) if functions && e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) => {
            load_library(connection).await?;
            call.query_async(connection).await
        }
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(connection).await?;
            call.query_async(connection).await
        }
        other => other,
    }
}

/// Loads paceline's Lua library as Redis functions (on every primary of a cluster),
/// replacing a library of the same name: the name carries the code's hash, so that is the
/// same code. Fails on servers without functions (before Redis 7) or without permission to
/// load them; the store then calls the same code as a script.
async fn load_library(connection: &mut Connection) -> RedisResult<()> {
    load_command(&LIBRARY.code)
        .query_async::<Value>(connection)
        .await
        .map(|_| ())
}

/// `FUNCTION LOAD REPLACE code`: loads a function library, replacing one of the same name.
pub(crate) fn load_command(code: &str) -> Cmd {
    let mut load = redis::cmd("FUNCTION");
    load.arg("LOAD").arg("REPLACE").arg(code);
    load
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_and_cluster_urls() {
        assert_eq!(
            Target::parse("redis://127.0.0.1:6380/2").unwrap(),
            Target::Single("redis://127.0.0.1:6380/2".into())
        );
        assert_eq!(
            Target::parse("redis-cluster://u:p@a:1, b:2").unwrap(),
            Target::Cluster(vec!["redis://u:p@a:1".into(), "redis://u:p@b:2".into()])
        );
        assert!(Target::parse("rediss-cluster://a:1").unwrap().uses_tls());
        assert_eq!(
            Target::parse("redis://:pa,ss@h:1").unwrap(),
            Target::Single("redis://:pa,ss@h:1".into())
        );
        assert_eq!(without_credentials("redis://u:p@h:1/2"), "redis://h:1/2");
        assert_eq!(without_credentials("redis://h:1"), "redis://h:1");
        for bad in [
            "localhost:6379",
            "http://x",
            "redis://",
            "redis-cluster://a:1,,b:2",
        ] {
            assert_eq!(Target::parse(bad).unwrap_err().field(), "store", "{bad}");
        }
        let db = Target::parse("redis-cluster://a:1/3").unwrap_err();
        assert!(db.message().contains("database 0"));
    }
}
