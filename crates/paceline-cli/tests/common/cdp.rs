//! A headless Chromium driven over its DevTools protocol (a websocket), for tests that
//! watch a page live: evaluate expressions in it, wait for a condition, collect what it
//! writes to its console (and its uncaught errors, and the browser's own errors about it,
//! such as a blocked script), take a screenshot.
//!
//! Chromium is Debian's `chromium` (or `chromium-browser`), or `PACELINE_CHROMIUM`;
//! `scripts/test` installs it when it is missing.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// How long one answer of the browser may take.
const ANSWER: Duration = Duration::from_secs(30);

/// The browser binary.
pub fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("PACELINE_CHROMIUM") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser"] {
        let found = Command::new(name).arg("--version").output();
        if found.is_ok_and(|o| o.status.success()) {
            return PathBuf::from(name);
        }
    }
    panic!(
        "this test needs a headless browser: install Debian's chromium \
         (`apt-get install -y chromium`; scripts/test does) or set PACELINE_CHROMIUM"
    );
}

/// One page in a headless Chromium of its own, closed when dropped.
pub struct Browser {
    child: Child,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    /// What the page wrote to its console, its uncaught errors, and the browser's errors
    /// about it, in order.
    pub console: Vec<String>,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts a browser and opens `url` in a 1280 × 1000 page.
    pub fn open(url: &str) -> Browser {
        let profile = tempfile::tempdir().expect("a temporary profile");
        let mut child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        // Chromium says where its DevTools listen on its standard error, first thing.
        let stderr = child.stderr.take().expect("a piped stderr");
        let mut lines = BufReader::new(stderr).lines();
        let ws = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(at) = line.find("ws://") {
                        break line[at..].trim().to_string();
                    }
                }
                _ => {
                    let _ = child.kill();
                    panic!("chromium ended without opening its DevTools");
                }
            }
        };
        // The rest of its standard error is read and dropped, so it never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        let (mut socket, _) = tungstenite::connect(ws.as_str()).expect("the DevTools answer");
        if let MaybeTlsStream::Plain(stream) = socket.get_mut() {
            stream
                .set_read_timeout(Some(ANSWER))
                .expect("a read timeout");
        }
        let mut browser = Browser {
            child,
            socket,
            session: String::new(),
            next_id: 0,
            console: Vec::new(),
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().expect("a target").to_string();
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_string();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            browser.call(domain, json!({}));
        }
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": false}),
        );
        browser.call("Page.navigate", json!({"url": url}));
        browser
    }

    /// Calls `method` (in the page's session, once there is one) and answers its result;
    /// the events that come meanwhile are read for the console.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .expect("the browser takes a call");
        loop {
            let text = match self.socket.read().expect("the browser answers in time") {
                Message::Text(text) => text,
                _ => continue,
            };
            let reply: Value = serde_json::from_str(text.as_str()).expect("JSON from the browser");
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
            self.note(&reply);
        }
    }

    /// Keeps what an event says of the page's console.
    fn note(&mut self, event: &Value) {
        let params = &event["params"];
        match event["method"].as_str() {
            Some("Runtime.consoleAPICalled") => {
                let args: Vec<String> = params["args"]
                    .as_array()
                    .map(|a| a.iter().map(|v| v["value"].to_string()).collect())
                    .unwrap_or_default();
                self.console
                    .push(format!("console.{}: {}", params["type"], args.join(" ")));
            }
            Some("Runtime.exceptionThrown") => self.console.push(format!(
                "uncaught: {}",
                params["exceptionDetails"]["exception"]["description"]
            )),
            Some("Log.entryAdded") => self.console.push(format!(
                "{}: {}",
                params["entry"]["level"], params["entry"]["text"]
            )),
            _ => {}
        }
    }

    /// The value of a JavaScript `expression` in the page.
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is true in the page (asking every 50 ms), at most `within`.
    pub fn wait_for(&mut self, expression: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while self.eval(expression) != json!(true) {
            assert!(
                Instant::now() < deadline,
                "`{expression}` did not become true; console: {:?}",
                self.console
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Saves a PNG screenshot of the page to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let data = shot["data"].as_str().expect("a screenshot");
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64 from the browser");
        std::fs::write(path, png).expect("a writable screenshot");
    }
}
