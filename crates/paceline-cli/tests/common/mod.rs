//! Helpers of the integration tests: `paceline serve` on a free port, spoken to over
//! HTTP/1.1, the golden scripts ([`golden`]) and a headless browser ([`cdp`]).
#![allow(dead_code)]

pub mod cdp;
pub mod golden;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `paceline serve`, stopped (SIGKILL) when dropped.
pub struct Service {
    pub child: Child,
    pub port: u16,
    /// The thread that reads the service's log (see [`Service::log`]), if it is read.
    pub log: Option<std::thread::JoinHandle<String>>,
}

impl Service {
    /// The service's log from its start, once it has exited (it waits for the end).
    pub fn log(&mut self) -> String {
        self.log
            .take()
            .map(|reader| reader.join().expect("the log reader"))
            .unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `paceline serve ARGS` on a port the system picks (`--listen 127.0.0.1:0`), read from its
/// `listening on http://...` log line: no port is chosen before the service binds it, so no
/// other process can take it in between.
pub fn start(args: &[&str]) -> Service {
    let mut command = Command::new(env!("CARGO_BIN_EXE_paceline"));
    command
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("PACELINE_AUTH_TOKEN");
    launch(&mut command, &["listening on http://"]).0
}

/// Spawns `command` (a `paceline` process) and reads its log until it has named an address
/// after each of `markers` (e.g. `listening on http://`): their ports, in order, the first
/// also the service's `port`. The rest of the log is read as it comes (a full pipe would
/// stall the process) and kept for [`Service::log`]. A process that exits first fails the
/// test with its log.
pub fn launch(command: &mut Command, markers: &[&str]) -> (Service, Vec<u16>) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the paceline binary starts");
    let stderr = child.stderr.take().expect("its stderr");
    // Killed when dropped, also if the log never says where it listens.
    let mut service = Service {
        child,
        port: 0,
        log: None,
    };
    let mut ports: Vec<Option<u16>> = vec![None; markers.len()];
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    let mut seen = String::new();
    while ports.iter().any(Option::is_none) {
        let Some(Ok(line)) = lines.next() else {
            panic!("the process exited before listening: {seen}");
        };
        for (port, marker) in ports.iter_mut().zip(markers) {
            *port = port.or_else(|| logged_port(&line, marker));
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    let ports: Vec<u16> = ports.into_iter().flatten().collect();
    service.port = ports[0];
    service.log = Some(std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            seen.push_str(&line);
            seen.push('\n');
        }
        seen
    }));
    (service, ports)
}

/// The port of the address after `marker` in a log line (`listening on http://` in
/// `listening on http://127.0.0.1:PORT ...`).
pub fn logged_port(line: &str, marker: &str) -> Option<u16> {
    let (_, rest) = line.split_once(marker)?;
    let address: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    address.rsplit_once(':')?.1.parse().ok()
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
