//! Readiness: whether a Redis store can serve decisions now, asked of every node
//! ([`RedisStore::health`]).

use futures_util::future::join_all;

use super::outage::Outage;
use super::routing::node_address;
use super::store::RedisStore;

/// How ready a Redis store is ([`Health::readiness`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Every node answers and serves its keys.
    Ready,
    /// Some nodes serve their keys and some do not (a cluster's primary is down or
    /// unreachable, or slots have no primary): the keys of the failing ones are answered by
    /// the failure policy, the others by Redis.
    Degraded,
    /// No node serves any key: every decision is answered by the failure policy.
    Unavailable,
}

/// A node that does not serve its keys, and why ([`Health::failing`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeProblem {
    /// The node: `host:port` of a cluster's primary, else the store's URL without
    /// credentials.
    pub node: String,
    /// What it answered, or why it did not.
    pub problem: String,
}

/// What [`RedisStore::health`] found: each node asked within the response timeout.
///
/// ```no_run
/// # use paceline_store::{redis::{RedisStore, Readiness}, FailurePolicy};
/// # async fn f(store: RedisStore) {
/// let health = store.health().await;
/// match health.readiness {
///     Readiness::Ready => println!("all {} nodes serve", health.nodes),
///     Readiness::Degraded | Readiness::Unavailable => {
///         for failing in &health.failing {
///             println!("{}: {}", failing.node, failing.problem);
///         }
///     }
/// }
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Ready, degraded or unavailable.
    pub readiness: Readiness,
    /// How many nodes were asked: 1 for a single server, the primaries of a cluster.
    pub nodes: usize,
    /// The nodes that do not serve their keys now.
    pub failing: Vec<NodeProblem>,
    /// In a cluster: how many of the 16384 hash slots no primary serves.
    pub uncovered_slots: usize,
    /// The outages the store's own decisions met and that go on (see
    /// [`RedisStore::outages`]).
    pub outages: Vec<Outage>,
}

/// The part of a `CLUSTER INFO` reply that says whether a node serves keys.
const CLUSTER_OK: &str = "cluster_state:ok";

impl RedisStore {
    /// Asks every node whether it serves its keys now, each within the response timeout
    /// and all at once: a single server must answer `PING`; each primary of a cluster
    /// (from a fresh `CLUSTER SLOTS`, else the last one read) must answer `CLUSTER INFO`
    /// with `cluster_state:ok` (a node that reports `cluster_state:fail` refuses every
    /// key). [`Readiness::Ready`] if all do and every slot has a primary,
    /// [`Readiness::Unavailable`] if none does, [`Readiness::Degraded`] in between.
    pub async fn health(&self) -> Health {
        let router = self.router();
        let transport = router.transport();
        let outages = self.outages();
        if !router.is_cluster() {
            let ping = transport.query::<String>(&redis::cmd("PING"), "PING").await;
            let failing: Vec<NodeProblem> = ping
                .err()
                .map(|e| NodeProblem {
                    node: router.name().to_string(),
                    problem: e.message().to_string(),
                })
                .into_iter()
                .collect();
            let readiness = if failing.is_empty() {
                Readiness::Ready
            } else {
                Readiness::Unavailable
            };
            return Health {
                readiness,
                nodes: 1,
                failing,
                uncovered_slots: 0,
                outages,
            };
        }
        // The map read last is asked while a fresh one is read (kept for the next time);
        // without one, the fresh one.
        let known = router.last_map();
        let refreshed = known.is_none();
        if refreshed {
            router.refresh_node_map().await;
        }
        let Some(map) = known.or_else(|| router.last_map()) else {
            return Health {
                readiness: Readiness::Unavailable,
                nodes: 0,
                failing: vec![NodeProblem {
                    node: router.name().to_string(),
                    problem: "no node answered CLUSTER SLOTS within the response timeout"
                        .to_string(),
                }],
                uncovered_slots: usize::from(super::routing::SLOTS),
                outages,
            };
        };
        let mut info = redis::cmd("CLUSTER");
        info.arg("INFO");
        let asked = join_all(map.primaries().iter().map(|(host, port)| {
            let info = &info;
            async move {
                let reply = transport
                    .query_node::<String>(info, host, *port, "CLUSTER INFO")
                    .await;
                let problem = match reply {
                    Ok(text) if text.contains(CLUSTER_OK) => None,
                    Ok(text) => Some(format!(
                        "reports {} (it refuses every key until the cluster is whole again)",
                        text.lines()
                            .find(|l| l.starts_with("cluster_state:"))
                            .map_or("no cluster_state", str::trim)
                    )),
                    Err(e) => Some(e.message().to_string()),
                };
                problem.map(|problem| NodeProblem {
                    node: node_address(host, *port),
                    problem,
                })
            }
        }));
        let answers = if refreshed {
            asked.await
        } else {
            futures_util::future::join(router.refresh_node_map(), asked)
                .await
                .1
        };
        let nodes = answers.len();
        let failing: Vec<NodeProblem> = answers.into_iter().flatten().collect();
        let uncovered_slots = map.uncovered();
        let readiness = if failing.len() >= nodes {
            Readiness::Unavailable
        } else if failing.is_empty() && uncovered_slots == 0 {
            Readiness::Ready
        } else {
            Readiness::Degraded
        };
        Health {
            readiness,
            nodes,
            failing,
            uncovered_slots,
            outages,
        }
    }
}
