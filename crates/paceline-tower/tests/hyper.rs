//! The layer in front of a plain hyper server, no axum: any tower service over `http`
//! requests takes it, answering in the layer's own body type (`LimitedBody`).

use std::convert::Infallible;
use std::io::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use paceline_store::{ManualClock, MemoryStore, SharedStore};
use paceline_tower::{Key, RateLimitLayer};
use tower::Layer as _;

/// 2023-11-14 in microseconds since the Unix epoch.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_hyper_server_is_limited_with_the_headers_and_a_problem() {
    let clock = ManualClock::new(EPOCH_2023);
    let store: SharedStore = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let layer = RateLimitLayer::builder(store)
        .limit(
            "per-key",
            "gcra:rate=1/s,burst=1".parse().expect("a policy"),
            Key::header("x-api-key"),
        )
        .build()
        .expect("a layer");
    let hello = tower::service_fn(|_: http::Request<hyper::body::Incoming>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"hello"))))
    });
    let service = TowerToHyperService::new(layer.layer(hello));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = listener.local_addr().expect("its address");
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.expect("a connection");
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await
    });
    // One kept-alive connection, blocking reads off the runtime.
    let answers = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(address).expect("connected");
        let mut ask = |key: &str| {
            let request = format!("GET / HTTP/1.1\r\nHost: x\r\nx-api-key: {key}\r\n\r\n");
            stream.write_all(request.as_bytes()).expect("sent");
            paceline_testkit::whole_response(&mut stream)
        };
        let answers = (ask("alice"), ask("alice"), ask("bob"));
        let no_key = {
            stream
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .expect("sent");
            paceline_testkit::whole_response(&mut stream)
        };
        (answers, no_key)
    })
    .await
    .expect("the client");
    let ((first, second, other), no_key) = answers;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(first.ends_with("hello"), "{first}");
    assert!(
        first.to_ascii_lowercase().contains("ratelimit-policy:"),
        "{first}"
    );
    // The same key again within the second: refused, with a retry-after and a problem.
    assert!(second.starts_with("HTTP/1.1 429"), "{second}");
    let lower = second.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 1\r\n"), "{second}");
    assert!(
        lower.contains("content-type: application/problem+json"),
        "{second}"
    );
    // Another key has a limit of its own.
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");
    // No key: the request's fault, a 400 naming what is missing.
    assert!(no_key.starts_with("HTTP/1.1 400"), "{no_key}");
    assert!(no_key.contains("x-api-key"), "{no_key}");
    server
        .await
        .expect("the server task")
        .expect("the connection ends cleanly");
}
