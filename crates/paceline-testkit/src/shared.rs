//! The server and the cluster every test of a test binary shares, and names that keep each
//! test to keys of its own on them.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::thread;

use crate::{RedisCluster, RedisServer};

/// A name no other call in this process has given: `stem`, the process id and a counter
/// (tests share one server, so each keeps to keys of its own).
pub fn unique_name(stem: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{stem}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A server shared by every test of this test binary, started on first use.
///
/// It is started from a thread that lives as long as the process, so it outlives any one
/// test and is killed by the kernel when the test binary exits.
pub fn shared_server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    start_shared(&SERVER, RedisServer::start)
}

/// A 3-primary cluster shared by every test of this test binary (see [`shared_server`]).
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    start_shared(&CLUSTER, RedisCluster::start)
}

fn start_shared<T: Send + Sync + 'static>(
    cell: &'static OnceLock<T>,
    start: fn() -> io::Result<T>,
) -> &'static T {
    cell.get_or_init(|| {
        let (sender, receiver) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let _ = sender.send(start());
            // Own the servers' lifetime: the kernel kills them when this thread dies, which
            // is when the process exits.
            loop {
                thread::park();
            }
        });
        match receiver.recv() {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => panic!("cannot start the shared Redis: {e}"),
            Err(e) => panic!("the Redis starter thread died: {e}"),
        }
    })
}
