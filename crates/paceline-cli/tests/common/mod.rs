//! Helpers of the integration tests: `paceline serve` on a free port, spoken to over
//! HTTP/1.1, the golden scripts ([`golden`]) and a headless browser ([`cdp`]).
#![allow(dead_code)]

pub mod cdp;
pub mod golden;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `paceline serve`, stopped (SIGKILL) when dropped.
pub struct Service {
    pub child: Child,
    pub port: u16,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn start(args: &[&str]) -> Service {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .env_remove("PACELINE_AUTH_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the paceline binary starts");
    let service = Service { child, port };
    wait_for_port(port);
    service
}

/// Waits until something listens on `port` of 127.0.0.1 (a process starting up): at most
/// 20 s.
pub fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing started listening on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The error's `code` and `field`.
    pub fn error(&self) -> (String, String) {
        let v = self.json();
        (
            v["error"]["code"].as_str().unwrap_or_default().to_string(),
            v["error"]["field"].as_str().unwrap_or_default().to_string(),
        )
    }
}

/// One HTTP/1.1 request with `Connection: close`.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    // A server may answer (413) before reading a large body; ignore a broken pipe.
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    parse(&raw)
}

pub fn parse(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

pub fn post(port: u16, path: &str, body: &str) -> Reply {
    http(
        port,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path.display().to_string()
}

/// Sends `SIGNAL` (`TERM`, `HUP`) to the service.
pub fn signal(service: &Service, name: &str) {
    let pid = service.child.id().to_string();
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "kill -{name} {pid}");
}

/// Waits (at most 20 s) for the service to exit by itself, and checks it exited with 0.
pub fn exits_cleanly(service: &mut Service) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = service.child.try_wait().expect("wait") {
            assert!(status.success(), "{status}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the service did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
