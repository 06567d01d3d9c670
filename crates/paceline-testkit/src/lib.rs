//! Throwaway Redis servers for paceline's tests.
//!
//! [`RedisServer::start`] runs a private `redis-server` on a free port (never the machine's
//! own Redis), in a temporary directory, without persistence; [`RedisCluster::start`] runs
//! three of them as a Redis Cluster (3 primaries, created with `redis-cli --cluster
//! create`). Servers stop when dropped, also when a test panics, and are killed by the
//! kernel if the thread that started them dies first.
//!
//! Tests can [`kill`](RedisServer::kill), [`restart`](RedisServer::restart),
//! [`pause`](RedisServer::pause) and [`resume`](RedisServer::resume) a server to exercise
//! failure handling.
//!
//! [`mock_api`] is a strict mock of a Discord-like API for the API client limiter and the
//! proxy.

pub mod lost_reply;
pub mod mock_api;
pub mod secrets;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to start or a cluster to form before the test fails.
const STARTUP_DEADLINE: Duration = Duration::from_secs(20);

/// The `redis-server` binary (`PACELINE_REDIS_SERVER` overrides it).
fn server_binary() -> String {
    std::env::var("PACELINE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// The `redis-cli` binary (`PACELINE_REDIS_CLI` overrides it).
fn cli_binary() -> String {
    std::env::var("PACELINE_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// A `redis-cli` command for the private server on `port` (`PACELINE_REDIS_CLI` names
/// another binary).
pub fn redis_cli(port: u16) -> Command {
    let mut command = Command::new(cli_binary());
    command.args(["-p", &port.to_string()]);
    command
}

/// One private `redis-server` process.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    child: Option<Child>,
    /// For a TLS server: its TLS port and the directory holding its certificates.
    tls: Option<(u16, tempfile::TempDir)>,
}

impl RedisServer {
    /// Starts a standalone server on a free port and waits until it answers `PING`.
    pub fn start() -> io::Result<RedisServer> {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--cluster-enabled",
    /// "yes"]`).
    pub fn start_with(extra: &[&str]) -> io::Result<RedisServer> {
        let mut last_error = None;
        // A free port can be taken between the check and the bind: try a few.
        for _ in 0..5 {
            let port = free_port()?;
            let mut server = RedisServer {
                port,
                dir: tempfile::tempdir()?,
                extra: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
                tls: None,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let mut command = Command::new(server_binary());
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: `prctl` is async-signal-safe and touches no memory of the parent; it asks
        // the kernel to kill the server if the thread that started it dies, so a test run
        // that is killed leaves no server behind.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot run `{}` ({e}); install Redis (e.g. `apt-get install -y redis-server`) \
                     or set PACELINE_REDIS_SERVER",
                    server_binary()
                ),
            )
        })?;
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    return Err(io::Error::other(format!(
                        "redis-server on port {} exited at start ({status}): {}",
                        self.port,
                        self.log_tail()
                    )));
                }
            }
            // A server with a password answers NOAUTH: it is up all the same. Another
            // process's server on the port would not be ours: the child must still run.
            if self
                .command(&["PING"])
                .is_ok_and(|reply| reply == "+PONG" || reply.starts_with("-NOAUTH"))
            {
                let ours = match self.child.as_mut() {
                    Some(child) => child.try_wait()?.is_none(),
                    None => false,
                };
                if ours {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis-server on port {} did not answer PING", self.port),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a server that also accepts TLS, on a second port, with a certificate for
    /// `127.0.0.1` signed by a throwaway CA (made with the `openssl` command). The plain port
    /// stays open for [`command`](Self::command); [`tls_url`](Self::tls_url) and
    /// [`tls_ca_pem`](Self::tls_ca_pem) are what a TLS client needs.
    pub fn start_tls() -> io::Result<RedisServer> {
        let certs = tempfile::tempdir()?;
        let dir = certs.path();
        let openssl = |args: &[&str]| -> io::Result<()> {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| io::Error::new(e.kind(), format!("cannot run openssl ({e})")))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "openssl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                )))
            }
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=paceline test CA",
        ])?;
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ])?;
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ])?;
        let tls_port = free_port()?;
        let path = |name: &str| dir.join(name).display().to_string();
        let mut server = RedisServer::start_with(&[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &path("server.crt"),
            "--tls-key-file",
            &path("server.key"),
            "--tls-ca-cert-file",
            &path("ca.crt"),
            "--tls-auth-clients",
            "no",
        ])?;
        server.tls = Some((tls_port, certs));
        Ok(server)
    }

    /// `rediss://127.0.0.1:TLS_PORT` for a server from [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|(port, _)| format!("rediss://127.0.0.1:{port}"))
    }

    /// The PEM of the CA that signed a TLS server's certificate.
    pub fn tls_ca_pem(&self) -> Option<Vec<u8>> {
        self.tls
            .as_ref()
            .and_then(|(_, dir)| std::fs::read(dir.path().join("ca.crt")).ok())
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The process id while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (its data is gone: nothing is persisted).
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                // The old socket may linger for a moment.
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(e),
            }
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Freezes the server (SIGSTOP) until the returned guard is dropped, which thaws it
    /// (SIGCONT), also when the test fails while it is frozen.
    ///
    /// ```no_run
    /// # let server = paceline_testkit::RedisServer::start().unwrap();
    /// let frozen = server.freeze();
    /// // ... calls to the server now wait ...
    /// drop(frozen); // answered again
    /// ```
    pub fn freeze(&self) -> Frozen<'_> {
        self.pause();
        Frozen(self)
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(signal)
                .arg(pid.to_string())
                .status();
        }
    }

    /// Sends one command (space-separated words, no quoting) and returns the first line of
    /// the reply in RESP form (`+PONG`, `:0`, `$5`, ...). For simple checks like `DBSIZE`.
    pub fn command(&self, words: &[&str]) -> io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut request = format!("*{}\r\n", words.len());
        for w in words {
            request.push_str(&format!("${}\r\n{w}\r\n", w.len()));
        }
        stream.write_all(request.as_bytes())?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line)?;
        Ok(line.trim_end().to_string())
    }

    /// The number of keys (`DBSIZE`).
    pub fn dbsize(&self) -> io::Result<u64> {
        let reply = self.command(&["DBSIZE"])?;
        reply
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| io::Error::other(format!("unexpected DBSIZE reply {reply}")))
    }

    fn log_tail(&self) -> String {
        let mut log = String::new();
        let path: PathBuf = self.dir.path().join("redis.log");
        let _ = std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut log));
        let lines: Vec<&str> = log.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A server frozen by [`RedisServer::freeze`]: thawed when dropped.
#[must_use = "the server thaws when the guard is dropped"]
pub struct Frozen<'a>(&'a RedisServer);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

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
                    node.command(&["CLUSTER", "MEET", "127.0.0.1", &nodes[0].port.to_string()])?;
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
            let Ok(mut stream) = TcpStream::connect(("127.0.0.1", node.port)) else {
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

/// A virtual clock whose sleeps never end on their own: each is counted, so a test sees a
/// waiting call (a queue's lease waiting for a job) settle into its wait, and then only an
/// outside event (a message on the queue's channel) ends the wait. Its time moves only when
/// the test moves it (through the [`ManualClock`](paceline_store::ManualClock) it wraps).
#[derive(Clone)]
pub struct GatedClock {
    time: paceline_store::ManualClock,
    sleeps: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
}

impl GatedClock {
    /// A gated clock reading `time`.
    pub fn new(time: paceline_store::ManualClock) -> GatedClock {
        GatedClock {
            time,
            sleeps: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// How many sleeps have begun so far.
    pub fn sleeps(&self) -> usize {
        *self.sleeps.borrow()
    }

    /// Waits until `n` sleeps have begun in all (after 20 s the test fails rather than
    /// hangs).
    pub async fn sleeps_begun(&self, n: usize) {
        let mut sleeps = self.sleeps.subscribe();
        tokio::time::timeout(Duration::from_secs(20), sleeps.wait_for(|&s| s >= n))
            .await
            .expect("the call settled into its wait")
            .expect("the clock lives");
    }
}

impl paceline_store::Clock for GatedClock {
    fn now_micros(&self) -> u64 {
        paceline_store::Clock::now_micros(&self.time)
    }

    fn sleep(&self, _: Duration) -> paceline_store::Sleep {
        self.sleeps.send_modify(|n| *n += 1);
        Box::pin(std::future::pending())
    }
}

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

/// A connection to a test's Redis at `url` (`redis://` or `redis-cluster://`, failing
/// closed, answers within 5 s), built as `paceline_store::open` builds it.
///
/// # Panics
///
/// When it cannot connect: the test's own server is down, and the test cannot go on.
pub async fn connect(url: &str) -> paceline_store::redis::RedisStore {
    paceline_store::redis::RedisStore::builder(url, paceline_store::FailurePolicy::FailClosed)
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("the test's Redis is up")
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

/// A port that is free on 127.0.0.1, as is its cluster bus port (+10000).
///
/// Both lie below Linux's ephemeral range (32768 and up), so a client socket's local port
/// never takes a port a test server will need again after a restart.
fn free_port() -> io::Result<u16> {
    const LOW: u16 = 12_000;
    const SPAN: u16 = 10_000; // ports 12000..22000, bus ports 22000..32000
                              // Start at a per-process offset so parallel test binaries rarely collide; the bind
                              // check settles it.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = (std::process::id() % 500) as u16 * 20;
    for _ in 0..SPAN {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (base.wrapping_add(offset)) % SPAN;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        "no free port pair found for redis-server",
    ))
}

/// A fail-closed Redis store at `url` under `prefix`, reading time from `clock` (with a
/// generous response timeout for a loaded test machine), as a script (`EVALSHA`) rather than
/// a function when `scripts_only`: one of the stores differential tests compare.
pub async fn redis_store_on(
    url: String,
    prefix: &str,
    clock: &paceline_store::ManualClock,
    scripts_only: bool,
) -> paceline_store::redis::RedisStore {
    let mut builder =
        paceline_store::redis::RedisStore::builder(url, paceline_store::FailurePolicy::FailClosed)
            .prefix(prefix)
            .clock(std::sync::Arc::new(clock.clone()))
            .response_timeout(std::time::Duration::from_secs(10));
    if scripts_only {
        builder = builder.scripts_only();
    }
    builder.connect().await.expect("connect to the test Redis")
}

/// Raises this process's soft limit of open files to `wanted` if it is lower (as far as the
/// hard limit allows), for tests that open many connections; answers the limit now.
pub fn open_files_at_least(wanted: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` and `setrlimit` read and write only the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < wanted {
            let raised = libc::rlimit {
                rlim_cur: wanted.min(limit.rlim_max),
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = raised.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}

/// A current-thread tokio runtime with I/O and time, for tests that drive async stores from
/// a synchronous runner (proptest's).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs property `test` over `strategy`'s cases (`PROPTEST_CASES` of them if set, else
/// `default`), without persisting failures; panics with proptest's report (the minimal
/// failing case) at the first failure.
pub fn check_cases<S: proptest::strategy::Strategy>(
    default: u32,
    strategy: &S,
    test: impl Fn(S::Value) -> Result<(), proptest::test_runner::TestCaseError>,
) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    });
    if let Err(e) = runner.run(strategy, test) {
        panic!("{e}");
    }
}

/// The items of a `RateLimit` or `RateLimit-Policy` field of `headers`, parsed as an RFC
/// 8941 structured-field list: each item's name (a string) with its integer parameters,
/// in order. Panics, naming the field, on anything else: the test then fails saying why.
pub fn ratelimit_items(
    headers: &paceline_client::http::HeaderMap,
    field: &str,
) -> Vec<(String, Vec<(String, i64)>)> {
    let text = headers
        .get(field)
        .unwrap_or_else(|| panic!("no {field} header"))
        .to_str()
        .expect("ASCII");
    let list: sfv::List = sfv::Parser::new(text)
        .parse()
        .unwrap_or_else(|e| panic!("{field}: `{text}` is no structured-field list: {e}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{field}: an inner list in `{text}`");
            };
            let sfv::BareItem::String(name) = &item.bare_item else {
                panic!("{field}: a name that is no string in `{text}`");
            };
            let params = item
                .params
                .iter()
                .map(|(k, v)| {
                    let sfv::BareItem::Integer(n) = v else {
                        panic!("{field}: {k} is no integer in `{text}`");
                    };
                    (k.as_str().to_string(), i64::from(*n))
                })
                .collect();
            (name.as_str().to_string(), params)
        })
        .collect()
}

/// The parameter `name` of a [`ratelimit_items`] item.
pub fn param(params: &[(String, i64)], name: &str) -> i64 {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no `{name}` in {params:?}"))
}

/// One whole HTTP/1.1 response read from `stream`: its head and `Content-Length` bytes of
/// body, as text.
///
/// # Panics
///
/// When the stream ends or fails before the response is whole (the test's point is that it
/// does not), or the head has no `Content-Length`.
pub fn whole_response(stream: &mut impl std::io::Read) -> String {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().expect("a length"))
                })
                .expect("a content-length");
            if body.len() >= length {
                return text;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) => panic!("closed without a whole answer, after: {text:?}"),
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("{e} without a whole answer, after: {text:?}"),
        }
    }
}

/// A store across the network that is not Redis, or hides the Redis store beneath it: a
/// memory store that says it is remote ([`Store::is_remote`]) and has no function host
/// ([`functions`](paceline_store::Store::functions)). For tests that a front end which keeps
/// state of its own in Redis refuses it, rather than keeping that state in its own process
/// where no other process sees it.
///
/// [`Store::is_remote`]: paceline_store::Store::is_remote
pub struct NotRedis(paceline_store::MemoryStore);

impl NotRedis {
    /// A fresh one, on the system clock.
    pub fn new() -> NotRedis {
        NotRedis(paceline_store::MemoryStore::new())
    }
}

impl Default for NotRedis {
    fn default() -> Self {
        NotRedis::new()
    }
}

impl paceline_store::Store for NotRedis {
    fn decide<'a>(
        &'a self,
        policy: &'a paceline_store::Policy,
        key: &'a str,
        op: paceline_store::Op,
        cost: u64,
    ) -> paceline_store::StoreFuture<'a, Result<paceline_store::Decision, paceline_store::Error>>
    {
        self.0.decide(policy, key, op, cost)
    }

    fn decide_all<'a>(
        &'a self,
        requests: &'a [paceline_store::Request<'a>],
    ) -> paceline_store::StoreFuture<'a, Result<paceline_store::SetDecision, paceline_store::Error>>
    {
        self.0.decide_all(requests)
    }

    fn release<'a>(
        &'a self,
        policy: &'a paceline_store::Policy,
        key: &'a str,
        lease: u64,
    ) -> paceline_store::StoreFuture<'a, Result<bool, paceline_store::Error>> {
        self.0.release(policy, key, lease)
    }

    fn extend<'a>(
        &'a self,
        policy: &'a paceline_store::Policy,
        key: &'a str,
        lease: u64,
    ) -> paceline_store::StoreFuture<'a, Result<Option<Duration>, paceline_store::Error>> {
        self.0.extend(policy, key, lease)
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
    ) -> paceline_store::StoreFuture<'a, Result<(), paceline_store::Error>> {
        self.0.reset(key)
    }

    fn sleep(&self, duration: Duration) -> paceline_store::Sleep {
        self.0.sleep(duration)
    }

    fn is_remote(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_starts_answers_and_restarts() {
        let mut server = RedisServer::start().unwrap();
        assert_ne!(server.port(), 6379);
        assert_eq!(server.command(&["SET", "k", "v"]).unwrap(), "+OK");
        assert_eq!(server.dbsize().unwrap(), 1);
        server.kill();
        assert!(server.command(&["PING"]).is_err());
        server.restart().unwrap();
        assert_eq!(server.dbsize().unwrap(), 0, "nothing is persisted");
    }
}
