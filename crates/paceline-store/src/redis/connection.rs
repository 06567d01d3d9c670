//! Where the store connects: one Redis server or a Redis Cluster, with timeouts.

use std::time::Duration;

use paceline_core::{InputError, StoreError, StoreErrorKind};

use crate::without_credentials;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

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
            // rustls needs one process-wide crypto provider; another part of the program
            // may have installed one already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        // Error messages name the server, never the credentials.
        let what = match target {
            Target::Single(url) => without_credentials(url),
            Target::Cluster(nodes) => nodes
                .iter()
                .map(|n| without_credentials(n))
                .collect::<Vec<_>>()
                .join(","),
        };
        let certificates = |pem: &[u8]| redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        };
        let opened = async {
            match target {
                Target::Single(url) => {
                    let client = match root_certificate {
                        Some(pem) => {
                            redis::Client::build_with_tls(url.as_str(), certificates(pem))?
                        }
                        None => redis::Client::open(url.as_str())?,
                    };
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(connect_timeout))
                        .set_response_timeout(Some(response_timeout))
                        .set_number_of_retries(2)
                        .set_max_delay(Duration::from_secs(1));
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
            )),
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

/// What kind of store failure a Redis error is.
pub(crate) fn error_kind(e: &RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.code(),
            Some(
                "LOADING"
                    | "BUSY"
                    | "MASTERDOWN"
                    | "CLUSTERDOWN"
                    | "TRYAGAIN"
                    | "READONLY"
                    | "OOM"
                    | "NOREPLICAS"
            )
        )
    {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Protocol
    }
}

/// The number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag
/// (the part between the first `{` and the next `}`, if not empty), modulo 16384.
#[cfg(test)]
pub(crate) fn slot(key: &[u8]) -> u16 {
    prefixed_slot(0, key)
}

/// The hash slot of a prefix followed by `key`, without joining them: `prefix_crc` is
/// [`crc16`] of the prefix, which must hold no `{` (so a hash tag, if any, lies in `key`).
pub(crate) fn prefixed_slot(prefix_crc: u16, key: &[u8]) -> u16 {
    match hash_tag(key) {
        Some(tag) => crc16(0, tag) % SLOTS,
        None => crc16(prefix_crc, key) % SLOTS,
    }
}

/// The part between the first `{` and the next `}`, if not empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// CRC16 (XMODEM) of `data`, continuing from `crc` (0 to start).
pub(crate) fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
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

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from `CLUSTER KEYSLOT` on a real server.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        // A prefix's CRC carried over gives the slot of the joined key.
        let prefix = b"paceline:v1:";
        for key in [&b"user:1"[..], b"{tenant}:x", b"a{}b", b"a{b", b"x}{y}"] {
            let joined = [&prefix[..], key].concat();
            assert_eq!(prefixed_slot(crc16(0, prefix), key), slot(&joined));
        }
    }
}
