//! A TCP relay in front of a Redis server that loses replies on demand: the request reaches
//! Redis and is applied, and the client sees its connection break before the answer.
//!
//! This is what a timeout or a connection reset after a write looks like from the client's
//! side, made exact: the test knows the change happened, and can check that a retry of the
//! same call answers as the first would have, changing nothing twice.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use paceline_testkit::{lost_reply::LostReplies, RedisServer};
//! let redis = RedisServer::start()?;
//! let relay = LostReplies::start(redis.port()).await?;
//! // Connect the store to `relay.url()`; then lose the reply of the next call whose
//! // request holds the bytes `ack`:
//! relay.lose_next(b"ack", 1);
//! # Ok(()) }
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What requests lose their replies: those holding `pattern`, the next `count` of them.
#[derive(Default)]
struct Plan {
    pattern: Vec<u8>,
    count: usize,
    lost: usize,
}

/// The relay: see the [module docs](self). It stops when dropped.
pub struct LostReplies {
    addr: SocketAddr,
    plan: Arc<Mutex<Plan>>,
    accept: tokio::task::JoinHandle<()>,
}

impl LostReplies {
    /// A relay on a free loopback port to the Redis on `port` of this machine.
    pub async fn start(port: u16) -> io::Result<LostReplies> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let plan = Arc::new(Mutex::new(Plan::default()));
        let shared = Arc::clone(&plan);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let plan = Arc::clone(&shared);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await {
                        relay(client, server, plan).await;
                    }
                });
            }
        });
        Ok(LostReplies { addr, plan, accept })
    }

    /// `redis://` and the relay's address.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Loses the replies of the next `count` requests whose bytes hold `pattern`: each is
    /// sent on to Redis, its reply is awaited and thrown away, and the client's
    /// connection is closed.
    pub fn lose_next(&self, pattern: &[u8], count: usize) {
        let mut plan = self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        plan.pattern = pattern.to_vec();
        plan.count = count;
    }

    /// How many replies the relay has lost so far.
    pub fn lost(&self) -> usize {
        self.plan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .lost
    }
}

impl Drop for LostReplies {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Relays one connection until either side closes, or a planned loss closes it.
async fn relay(mut client: TcpStream, mut server: TcpStream, plan: Arc<Mutex<Plan>>) {
    let (mut from_client, mut to_server) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut from_client) => {
                let Ok(n) = read else { return };
                if n == 0 {
                    return;
                }
                let request = &from_client[..n];
                let lose = {
                    let mut plan = plan.lock().unwrap_or_else(PoisonError::into_inner);
                    let hit = plan.count > 0
                        && !plan.pattern.is_empty()
                        && request.windows(plan.pattern.len()).any(|w| w == plan.pattern);
                    if hit {
                        plan.count -= 1;
                        plan.lost += 1;
                    }
                    hit
                };
                if server.write_all(request).await.is_err() {
                    return;
                }
                if lose {
                    // Redis applies the request; its answer never reaches the client.
                    let _ = server.read(&mut to_server).await;
                    return;
                }
            }
            read = server.read(&mut to_server) => {
                let Ok(n) = read else { return };
                if n == 0 || client.write_all(&to_server[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
