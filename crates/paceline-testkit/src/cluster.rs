//! A private Redis Cluster: [`RedisCluster`], three primaries (or as many as a test asks)
//! on free ports, and [`SlotMap`], which primary serves which slots.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::server::{cli_binary, redis_cli, RedisServer, STARTUP_DEADLINE};

/// A Redis Cluster of three private primaries (no replicas).
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them with `redis-cli --cluster create`
    /// (16384 slots over 3 primaries) and waits until every node reports `cluster_state:ok`.
    pub fn start() -> io::Result<RedisCluster> {
        RedisCluster::start_with(3)
    }

    /// A cluster of `primaries` nodes (1 or more; the slots are split evenly).
    pub fn start_with(primaries: usize) -> io::Result<RedisCluster> {
        RedisCluster::start_configured(primaries, &[])
    }

    /// A cluster of `primaries` nodes, each started with `extra` settings too, e.g.
    /// `["--cluster-require-full-coverage", "no"]` (the healthy primaries keep serving
    /// their slots while another is down).
    pub fn start_configured(primaries: usize, extra: &[&str]) -> io::Result<RedisCluster> {
        let mut nodes = Vec::with_capacity(primaries);
        for _ in 0..primaries {
            let mut settings = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ];
            settings.extend_from_slice(extra);
            nodes.push(RedisServer::start_with(&settings)?);
        }
        if primaries >= 3 {
            let mut create = Command::new(cli_binary());
            create.args(["--cluster", "create"]);
            for node in &nodes {
                create.arg(node.addr());
            }
            let output = create
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "cannot run `{}` ({e}); install it (`apt-get install -y redis-tools`) \
                             or set PACELINE_REDIS_CLI",
                            cli_binary()
                        ),
                    )
                })?;
            if !output.status.success() {
                return Err(io::Error::other(format!(
                    "redis-cli --cluster create failed: {}",
                    String::from_utf8_lossy(&output.stdout)
                )));
            }
        } else {
            // `redis-cli --cluster create` wants 3 primaries: split the slots by hand.
            let share = 16384 / primaries;
            for (i, node) in nodes.iter().enumerate() {
                let first = i * share;
                let last = if i + 1 == primaries {
                    16383
                } else {
                    first + share - 1
                };
                let reply = node.command(&[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ])?;
                if reply != "+OK" {
                    return Err(io::Error::other(format!("CLUSTER ADDSLOTSRANGE: {reply}")));
                }
                if i > 0 {
                    node.command(&["CLUSTER", "MEET", "127.0.0.1", &nodes[0].port().to_string()])?;
                }
            }
        }
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + STARTUP_DEADLINE;
        while !cluster.is_ready() {
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the Redis Cluster did not reach cluster_state:ok",
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    fn is_ready(&self) -> bool {
        self.nodes.iter().all(|node| {
            let Ok(mut stream) = TcpStream::connect(("127.0.0.1", node.port())) else {
                return false;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            if stream
                .write_all(b"*2\r\n$7\r\nCLUSTER\r\n$4\r\nINFO\r\n")
                .is_err()
            {
                return false;
            }
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap_or(0);
            String::from_utf8_lossy(&buf[..n]).contains("cluster_state:ok")
        })
    }

    /// `redis-cluster://127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.nodes.iter().map(RedisServer::addr).collect();
        format!("redis-cluster://{}", addrs.join(","))
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Kills node `index` (SIGKILL): its slots become unreachable (there are no replicas).
    pub fn kill_node(&mut self, index: usize) {
        if let Some(node) = self.nodes.get_mut(index) {
            node.kill();
        }
    }

    /// Total keys over all nodes.
    pub fn dbsize(&self) -> io::Result<u64> {
        self.nodes.iter().map(RedisServer::dbsize).sum()
    }

    /// The slot the cluster puts `key` in (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let reply = self.nodes[0]
            .command(&["CLUSTER", "KEYSLOT", key])
            .expect("the cluster answers");
        reply
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("CLUSTER KEYSLOT {key}: {reply}"))
    }

    /// Which primary serves which slots, as `CLUSTER NODES` lists them now.
    pub fn slot_map(&self) -> SlotMap {
        let out = redis_cli(self.nodes[0].port())
            .args(["CLUSTER", "NODES"])
            .output()
            .expect("redis-cli runs");
        assert!(out.status.success(), "CLUSTER NODES: {out:?}");
        let text = String::from_utf8(out.stdout).expect("CLUSTER NODES is text");
        let primaries: Vec<(u16, Vec<(u16, u16)>)> = text
            .lines()
            .filter_map(|line| {
                // ID ADDRESS@BUS FLAGS PRIMARY PING PONG EPOCH LINK SLOT...
                let fields: Vec<&str> = line.split_whitespace().collect();
                if !fields.get(2)?.split(',').any(|flag| flag == "master") {
                    return None;
                }
                let port = fields[1]
                    .split('@')
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()?;
                let ranges = fields[8..]
                    .iter()
                    // `[SLOT->-ID]`: a slot on the move, no range.
                    .filter(|range| !range.starts_with('['))
                    .filter_map(|range| {
                        let (first, last) = range.split_once('-').unwrap_or((range, range));
                        Some((first.parse().ok()?, last.parse().ok()?))
                    })
                    .collect();
                Some((port, ranges))
            })
            .collect();
        assert_eq!(primaries.len(), self.nodes.len(), "{text}");
        SlotMap { primaries }
    }

    /// Checks that `key`, in `slot`, is held by the node on `port`, and that every other
    /// node redirects to it (`-MOVED`).
    pub fn assert_key_on(&self, key: &str, slot: u16, port: u16) {
        assert_eq!(self.keyslot(key), slot, "{key}");
        for node in &self.nodes {
            let reply = node.command(&["EXISTS", key]).expect("the node answers");
            if node.port() == port {
                assert_eq!(reply, ":1", "{key} is on its slot's primary");
            } else {
                assert_eq!(
                    reply,
                    format!("-MOVED {slot} 127.0.0.1:{port}"),
                    "node {} sends {key} to its slot's primary",
                    node.port()
                );
            }
        }
    }
}

/// Which primary of a cluster serves which slots ([`RedisCluster::slot_map`]).
#[derive(Clone, Debug)]
pub struct SlotMap {
    /// Each primary's port with the slot ranges it serves.
    primaries: Vec<(u16, Vec<(u16, u16)>)>,
}

impl SlotMap {
    /// The port of the primary serving `slot`.
    pub fn owner(&self, slot: u16) -> u16 {
        self.primaries
            .iter()
            .find(|(_, ranges)| ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|&(port, _)| port)
            .unwrap_or_else(|| panic!("no primary serves slot {slot}: {:?}", self.primaries))
    }

    /// The primaries' ports.
    pub fn primaries(&self) -> Vec<u16> {
        self.primaries.iter().map(|&(port, _)| port).collect()
    }
}
