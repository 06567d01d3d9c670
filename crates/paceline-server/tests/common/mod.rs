//! What the service's in-process tests share: a service on a free port, and calls to it.

// Each test file uses the part it needs.
#![allow(dead_code)]

use std::sync::Arc;

use paceline_server::{Server, Settings};
use paceline_store::Clock;
use serde_json::Value;

/// A running service: its URL (`http://127.0.0.1:PORT`), its task, and the sender that
/// stops it.
pub type Running = (
    String,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
);

/// Serves `settings` on a free port of 127.0.0.1 (their `listen` is replaced), the store
/// reading time from `clock` when one is given.
pub async fn start(settings: Settings, clock: Option<Arc<dyn Clock>>) -> Running {
    // reqwest's TLS needs the process's crypto provider (plain HTTP here, but it builds
    // its TLS configuration anyway).
    paceline_store::install_tls_provider();
    let settings = Settings {
        listen: "127.0.0.1:0".parse().expect("an address"),
        ..settings
    };
    let server = match clock {
        Some(clock) => Server::bind_with_clock(settings, clock).await,
        None => Server::bind(settings).await,
    }
    .expect("bind");
    let url = format!("http://{}", server.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = server
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    (url, task, stop)
}

/// A service's answer: its status, its headers and its JSON body (`Null` when empty).
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

/// `method` on `url`, with `body` as JSON when given.
pub async fn call(method: reqwest::Method, url: &str, body: Option<Value>) -> Answer {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the service answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("a body");
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).expect("a JSON body")
    };
    Answer {
        status,
        headers,
        body,
    }
}
