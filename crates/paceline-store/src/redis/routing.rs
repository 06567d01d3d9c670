//! Routing: which Redis node runs which decision. On a single server, all of them; in a
//! cluster, each key's hash slot names its node. Batches are grouped by node (one call per
//! node, across its slots, when the slot map is known) and sent again per slot when the map
//! proved stale. Each node's call answers its own requests as soon as it ends: a slow or
//! dead node delays only the requests it must run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crc16::{State, XMODEM};
use futures_util::stream::{FuturesUnordered, StreamExt};
use paceline_core::{Decision, StoreError, StoreErrorKind};
use redis::{ErrorKind, ServerErrorKind, Value};
use tokio::time::Instant;

use super::transport::{redis_cause, Transport};
use crate::Request;

/// The most decisions sent in one script call; larger batches are split, so one call never
/// holds the server for long.
pub const MAX_DECISIONS_PER_CALL: usize = 512;

/// The number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// A slot without a known node.
const NO_NODE: u16 = u16::MAX;

/// The code of the error paceline's library answers when a key of a spread batch is not
/// served by the node it reached (a slot moved), before writing anything.
const REROUTE: &str = "PLREROUTE";

/// Which calls a request can share: one server, one cluster slot, or one cluster node.
/// Also the lane a request waits in for auto-batching (see [`Router::lane_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Group {
    Single,
    Slot(u16),
    Node(u16),
}

/// A cluster's slot map as `CLUSTER SLOTS` gave it: which node (a small number) serves
/// each slot, and each node's address.
pub(crate) struct NodeMap {
    slots: Box<[u16]>,
    /// Each node's host and port, by its number.
    nodes: Vec<(String, u16)>,
    /// Each node's `host:port`, by its number (what logs and readiness name).
    names: Vec<Arc<str>>,
}

impl NodeMap {
    /// The number of the node serving `slot`, if one does.
    fn node(&self, slot: u16) -> Option<u16> {
        self.slots
            .get(usize::from(slot))
            .copied()
            .filter(|&n| n != NO_NODE)
    }

    /// Every primary's host and port.
    pub(crate) fn primaries(&self) -> &[(String, u16)] {
        &self.nodes
    }

    /// How many slots no primary serves.
    pub(crate) fn uncovered(&self) -> usize {
        self.slots.iter().filter(|&&n| n == NO_NODE).count()
    }
}

/// Sends decisions to the node that must run them, over a [`Transport`].
pub(crate) struct Router {
    transport: Transport,
    /// The CRC16 state after the key prefix, so a key's slot needs no joined string.
    prefix_crc: State<XMODEM>,
    /// In a cluster: the last slot map read (kept when a later read fails), for the
    /// auto-batching lanes, the names of failing nodes and readiness.
    map: RwLock<Option<Arc<NodeMap>>>,
    /// True while `map` is fresh enough to send one call per node (a cluster running the
    /// library as functions); false after a refresh failed: calls go per slot until the
    /// next refresh succeeds.
    spread: AtomicBool,
    /// What the store is connected to, without credentials: names the failing node of a
    /// single server (or of a cluster whose map is unknown).
    name: Arc<str>,
}

impl Router {
    /// Routes over `transport`, to the store described as `name` (its URL without
    /// credentials).
    pub(crate) async fn new(transport: Transport, name: String) -> Router {
        let mut prefix_crc = State::<XMODEM>::new();
        prefix_crc.update(transport.key_prefix().as_bytes());
        let router = Router {
            transport,
            prefix_crc,
            map: RwLock::new(None),
            spread: AtomicBool::new(false),
            name: name.into(),
        };
        router.refresh_node_map().await;
        router
    }

    pub(crate) fn transport(&self) -> &Transport {
        &self.transport
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.transport.is_cluster()
    }

    /// The hash slot of `key`'s Redis key (in a cluster).
    pub(crate) fn slot_of(&self, key: &str) -> u16 {
        prefixed_slot(self.prefix_crc, key.as_bytes())
    }

    /// The failure group of `key`: its hash slot in a cluster, 0 on a single server.
    pub(crate) fn group_of(&self, key: &str) -> usize {
        if self.is_cluster() {
            usize::from(self.slot_of(key))
        } else {
            0
        }
    }

    /// How many failure groups there are ([`group_of`](Self::group_of)).
    pub(crate) fn failure_groups(&self) -> usize {
        if self.is_cluster() {
            usize::from(SLOTS)
        } else {
            1
        }
    }

    /// The name of the node serving failure group `group` (see
    /// [`group_of`](Self::group_of)): `host:port` of a cluster node whose slot map is
    /// known, else what the store is connected to (its URL without credentials).
    pub(crate) fn node_name(&self, group: usize) -> Arc<str> {
        if self.is_cluster() {
            if let Some(map) = self.last_map() {
                let node = u16::try_from(group).ok().and_then(|slot| map.node(slot));
                if let Some(name) = node.and_then(|n| map.names.get(usize::from(n))) {
                    return Arc::clone(name);
                }
            }
        }
        Arc::clone(&self.name)
    }

    /// True if `name` (see [`node_name`](Self::node_name)) is a primary serving slots in
    /// the last slot map read; always on a single server.
    pub(crate) fn serves_slots(&self, name: &str) -> bool {
        if !self.is_cluster() {
            return true;
        }
        self.last_map()
            .is_some_and(|map| map.names.iter().any(|n| &**n == name))
    }

    /// What the store is connected to, without credentials.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The auto-batching lane of `key` by `map` (the last slot map read, if any): the node
    /// that serves its slot, or the slot itself when no node is known for it; the one
    /// server's. A lane holds its own calls in flight, so a slow node delays only its own.
    pub(crate) fn lane_of(&self, key: &str, map: Option<&NodeMap>) -> Group {
        if !self.is_cluster() {
            return Group::Single;
        }
        let slot = self.slot_of(key);
        match map.and_then(|m| m.node(slot)) {
            Some(node) => Group::Node(node),
            None => Group::Slot(slot),
        }
    }

    /// Runs validated requests in as few calls as possible: grouped by the node that must
    /// run them (by slot in a cluster whose node map is unknown), in order, at most
    /// [`MAX_DECISIONS_PER_CALL`] per call. Groups run concurrently; a group's calls run
    /// one after another, since they may share keys. One result per request, in order.
    /// `deadline` bounds the whole run, however many calls it takes.
    pub(crate) async fn run_valid(
        &self,
        requests: &[&Request<'_>],
        now: Option<u64>,
        deadline: Instant,
    ) -> Vec<Result<Decision, StoreError>> {
        let mut results: Vec<Option<Result<Decision, StoreError>>> = vec![None; requests.len()];
        self.run_each(requests, now, deadline, |i, outcome| {
            if let Some(result) = results.get_mut(i) {
                *result = Some(outcome);
            }
        })
        .await;
        collect(results)
    }

    /// [`run_valid`](Self::run_valid), handing each request's outcome to `answer` (with
    /// its index in `requests`) as soon as the calls of its node have ended, whatever the
    /// other nodes' calls still wait for.
    pub(crate) async fn run_each(
        &self,
        requests: &[&Request<'_>],
        now: Option<u64>,
        deadline: Instant,
        mut answer: impl FnMut(usize, Result<Decision, StoreError>),
    ) {
        // In a cluster whose slot map is known, one call per node: the library may touch
        // several slots of the node it runs on. Otherwise one call per slot.
        let nodes = self.spread_map();
        let groups = self.groups(requests, nodes.as_deref());
        let stale = AtomicBool::new(false);
        let mut running: FuturesUnordered<_> = groups
            .into_iter()
            .map(|(group, indices)| self.run_group(requests, group, indices, now, deadline, &stale))
            .collect();
        while let Some(outcomes) = running.next().await {
            for (i, outcome) in outcomes {
                answer(i, outcome);
            }
        }
        drop(running);
        // Every request is answered by now: a refresh delays none of them.
        if stale.load(Ordering::Relaxed)
            && tokio::time::timeout_at(deadline, self.refresh_node_map())
                .await
                .is_err()
        {
            // Within the callers' deadline too. Cut short, the map is no longer trusted,
            // as after a failed refresh: calls go per slot until the next refresh.
            self.spread.store(false, Ordering::Relaxed);
        }
    }

    /// Runs one group's requests (`indices` into `requests`), in order, at most
    /// [`MAX_DECISIONS_PER_CALL`] per call, all answered by `deadline`; sets `stale` if the
    /// slot map proved stale.
    async fn run_group(
        &self,
        requests: &[&Request<'_>],
        group: Group,
        indices: Vec<usize>,
        now: Option<u64>,
        deadline: Instant,
        stale: &AtomicBool,
    ) -> Vec<(usize, Result<Decision, StoreError>)> {
        let spread = matches!(group, Group::Node(_));
        let mut outcomes = Vec::with_capacity(indices.len());
        for chunk in indices.chunks(MAX_DECISIONS_PER_CALL) {
            let batch: Vec<&Request> = chunk.iter().map(|&i| requests[i]).collect();
            match self.call_before(&batch, now, spread, deadline).await {
                // The slot map was stale (a slot moved): the call failed reading its keys,
                // before any write, so it is safe to send again, per slot.
                Err(e) if spread && is_redirect(&e) => {
                    stale.store(true, Ordering::Relaxed);
                    for indices in self.groups(&batch, None).into_values() {
                        let part: Vec<&Request> = indices.iter().map(|&i| batch[i]).collect();
                        let outcome = self.call_before(&part, now, false, deadline).await;
                        fan_out(&mut outcomes, indices.iter().map(|&i| chunk[i]), outcome);
                    }
                }
                outcome => fan_out(&mut outcomes, chunk.iter().copied(), outcome),
            }
        }
        outcomes
    }

    /// One call (see `Transport::call`), unless `deadline` has come: then a timeout, the
    /// call never sent.
    async fn call_before(
        &self,
        requests: &[&Request<'_>],
        now: Option<u64>,
        spread: bool,
        deadline: Instant,
    ) -> Result<Vec<Decision>, StoreError> {
        if Instant::now() >= deadline {
            return Err(past_deadline());
        }
        self.transport.call(requests, now, spread, deadline).await
    }

    /// `requests`' indices by the group that must run them, each in order: by node when
    /// `nodes` (the slot map) is given, else by slot; one group on a single server.
    fn groups(
        &self,
        requests: &[&Request<'_>],
        nodes: Option<&NodeMap>,
    ) -> BTreeMap<Group, Vec<usize>> {
        let mut groups: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
        for (i, r) in requests.iter().enumerate() {
            let group = if self.is_cluster() {
                let slot = self.slot_of(r.key);
                match nodes.and_then(|n| n.node(slot)) {
                    Some(node) => Group::Node(node),
                    None => Group::Slot(slot),
                }
            } else {
                Group::Single
            };
            groups.entry(group).or_default().push(i);
        }
        groups
    }

    /// The last slot map read from the cluster, if any.
    pub(crate) fn last_map(&self) -> Option<Arc<NodeMap>> {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The slot map, if calls may span the slots of a node (a cluster with functions whose
    /// last map read is trusted).
    fn spread_map(&self) -> Option<Arc<NodeMap>> {
        if !self.spread.load(Ordering::Relaxed) {
            return None;
        }
        self.last_map()
    }

    /// Reads the slot map from the cluster (`CLUSTER SLOTS`). On failure the last map is
    /// kept for lanes and names, but no longer trusted for calls spanning a node's slots:
    /// they go per slot until the next refresh.
    pub(crate) async fn refresh_node_map(&self) {
        if !self.is_cluster() {
            return;
        }
        let reply: Result<Value, StoreError> = self
            .transport
            .query(redis::cmd("CLUSTER").arg("SLOTS"), "CLUSTER SLOTS")
            .await;
        match reply.ok().and_then(|v| slot_map(&v)) {
            Some(map) => {
                *self.map.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(map));
                self.spread
                    .store(self.transport.runs_as_functions(), Ordering::Relaxed);
            }
            None => self.spread.store(false, Ordering::Relaxed),
        }
    }
}

/// The slot map from a `CLUSTER SLOTS` reply: `[start, end, [host, port, ...],
/// replicas...]` per range; nodes are numbered in order of first appearance.
fn slot_map(reply: &Value) -> Option<NodeMap> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut slots = vec![NO_NODE; usize::from(SLOTS)];
    let mut nodes: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
            (primary.first(), primary.get(1))
        else {
            return None;
        };
        let host = String::from_utf8_lossy(host).into_owned();
        let port = u16::try_from(*port).ok()?;
        let node = match nodes.iter().position(|(h, p)| *h == host && *p == port) {
            Some(i) => i,
            None => {
                nodes.push((host, port));
                nodes.len() - 1
            }
        };
        let node = u16::try_from(node).ok().filter(|&n| n != NO_NODE)?;
        let start = usize::try_from(*start).ok()?;
        let end = usize::try_from(*end).ok()?;
        for slot in slots.get_mut(start..=end)? {
            *slot = node;
        }
    }
    let names = nodes
        .iter()
        .map(|(host, port)| Arc::from(node_address(host, *port)))
        .collect();
    Some(NodeMap {
        slots: slots.into(),
        nodes,
        names,
    })
}

/// `host:port`, an IPv6 host in brackets.
pub(crate) fn node_address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// True if Redis refused a call because its keys are not (all) served by the node it
/// reached, which changed nothing: a redirect or a cross-slot refusal, by redis-rs's error
/// kinds, or the library's own [`REROUTE`] answer (it reads every key before writing).
fn is_redirect(e: &StoreError) -> bool {
    redis_cause(e).is_some_and(|e| {
        matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::CrossSlot
            )
        ) || (e.kind() == ErrorKind::Extension && e.code() == Some(REROUTE))
    })
}

/// The Redis Cluster hash slot of `key`, as `CLUSTER KEYSLOT` answers it: CRC16-XMODEM of
/// the key's hash tag (the part between its first `{` and the next `}`, if not empty) or
/// else of the whole key, mod 16384. It depends on the key alone, never on a cluster's
/// topology.
///
/// ```
/// use paceline_store::redis::key_slot;
/// assert_eq!(key_slot("foo"), 12182);
/// // Keys that share a hash tag share a slot.
/// assert_eq!(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
/// ```
pub fn key_slot(key: &str) -> u16 {
    prefixed_slot(State::<XMODEM>::new(), key.as_bytes())
}

/// The hash slot of a prefix followed by `key`, without joining them: `prefix_crc` is the
/// CRC16 state after the prefix, which must hold no `{` (so a hash tag, if any, lies in
/// `key`). A key's slot is CRC16 (XMODEM) of the key, or of its hash tag (the part between
/// the first `{` and the next `}`, if not empty), modulo 16384.
fn prefixed_slot(prefix_crc: State<XMODEM>, key: &[u8]) -> u16 {
    match hash_tag(key) {
        Some(tag) => State::<XMODEM>::calculate(tag) % SLOTS,
        None => {
            let mut crc = prefix_crc;
            crc.update(key);
            crc.get() % SLOTS
        }
    }
}

/// The part between the first `{` and the next `}`, if not empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// The error for a request left without an answer (which would be a bug).
fn no_answer() -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, "no answer for a request")
}

/// Every request's result; a request left without one is an error.
pub(crate) fn collect<E: From<StoreError>>(
    results: Vec<Option<Result<Decision, E>>>,
) -> Vec<Result<Decision, E>> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(no_answer().into())))
        .collect()
}

/// The answer of a call not sent because its deadline had come.
fn past_deadline() -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        "the call's deadline came before it could be sent to Redis (the store's response \
         timeout bounds a whole call, its earlier calls and its time queued for auto-batching \
         included)",
    )
}

/// Records one call's outcome for the requests it carried (`indices`, in order).
fn fan_out(
    outcomes: &mut Vec<(usize, Result<Decision, StoreError>)>,
    indices: impl Iterator<Item = usize>,
    outcome: Result<Vec<Decision>, StoreError>,
) {
    match outcome {
        Ok(decisions) => outcomes.extend(indices.zip(decisions.into_iter().map(Ok))),
        Err(e) => outcomes.extend(indices.map(|i| (i, Err(e.clone())))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(key: &[u8]) -> u16 {
        prefixed_slot(State::<XMODEM>::new(), key)
    }

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
            ]),
        ])
    }

    #[test]
    fn the_slot_map_numbers_nodes_by_first_appearance() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "127.0.0.1", 7001),
            range(10923, 16383, "127.0.0.1", 7000),
        ]);
        let map = slot_map(&reply).expect("a valid reply");
        assert_eq!(
            [0, 5460, 5461, 10923, 16383].map(|slot| map.node(slot)),
            [Some(0), Some(0), Some(1), Some(0), Some(0)]
        );
        assert_eq!(&*map.names[1], "127.0.0.1:7001");
        assert_eq!(map.primaries()[0], ("127.0.0.1".to_string(), 7000));
        assert_eq!(map.uncovered(), 0);
        // Slots nobody serves stay unknown; malformed replies give no map.
        let partial = slot_map(&Value::Array(vec![range(0, 99, "::1", 1)])).expect("valid");
        assert_eq!((partial.node(99), partial.node(100)), (Some(0), None));
        assert_eq!(partial.uncovered(), 16384 - 100);
        assert_eq!(&*partial.names[0], "[::1]:1");
        assert!(slot_map(&Value::Array(vec![range(0, 16384, "h", 1)])).is_none());
        assert!(slot_map(&Value::Nil).is_none());
    }

    #[test]
    fn only_refusals_before_any_write_count_as_redirects() {
        let from = |e: redis::RedisError| {
            StoreError::new(StoreErrorKind::Protocol, "Redis failed a decision").with_source(e)
        };
        let server = |code: &str, detail: &str| {
            redis::make_extension_error(code.to_string(), Some(detail.to_string()))
        };
        assert!(is_redirect(&from(server(REROUTE, "a key moved"))));
        assert!(!is_redirect(&from(server(
            "ERR",
            "paceline: unknown algorithm x"
        ))));
        assert!(!is_redirect(&from(server("OOM", "memory full"))));
        // Without a Redis cause (a reply paceline could not read): never.
        assert!(!is_redirect(&StoreError::new(
            StoreErrorKind::Protocol,
            "MOVED 1 h:1"
        )));
    }

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from `CLUSTER KEYSLOT` on a real server.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(key_slot("123456789"), 12739);
        assert_eq!(key_slot("paceline:v2:{q:emails}:meta"), slot(b"q:emails"));
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        // A prefix's CRC carried over gives the slot of the joined key.
        let prefix = b"paceline:v1:";
        for key in [&b"user:1"[..], b"{tenant}:x", b"a{}b", b"a{b", b"x}{y}"] {
            let joined = [&prefix[..], key].concat();
            assert_eq!(
                {
                    let mut crc = State::<XMODEM>::new();
                    crc.update(prefix);
                    prefixed_slot(crc, key)
                },
                slot(&joined)
            );
        }
    }
}
