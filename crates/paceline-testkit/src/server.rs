//! One private `redis-server` process: [`RedisServer`], started on a free port, stopped,
//! killed, restarted, paused and frozen as a test needs.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to start or a cluster to form before the test fails.
pub(crate) const STARTUP_DEADLINE: Duration = Duration::from_secs(20);

/// The `redis-server` binary (`PACELINE_REDIS_SERVER` overrides it).
fn server_binary() -> String {
    std::env::var("PACELINE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// The `redis-cli` binary (`PACELINE_REDIS_CLI` overrides it).
pub(crate) fn cli_binary() -> String {
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
            // A script the server runs for more than 5 s (the default) turns every other
            // client's call into a `BUSY` error: on a loaded test machine a long batch of one
            // test would fail the calls of the tests beside it on the same server.
            .args(["--lua-time-limit", "60000"])
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
