//! Shutdown with requests arriving on kept-alive connections, in process, with the order of
//! events fixed: on a single-threaded runtime, nothing of the service runs between the
//! test's writes and the shutdown, so each request has reached the service's socket, unread,
//! when the shutdown begins.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use paceline_server::{Server, Settings};

const CONNECTIONS: usize = 8;

fn request(connection: usize) -> Vec<u8> {
    let body = format!(r#"{{"policy": "gcra:rate=1000/s", "key": "c{connection}"}}"#);
    format!(
        "POST /v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One whole response from `stream` (a blocking read, run off the runtime), with the
/// stream back; panics on an end of stream or an error before the response is complete.
async fn response(mut stream: TcpStream) -> (String, TcpStream) {
    tokio::task::spawn_blocking(move || (paceline_testkit::whole_response(&mut stream), stream))
        .await
        .expect("the reader")
}

#[tokio::test(flavor = "current_thread")]
async fn requests_sent_before_the_shutdown_on_kept_alive_connections_are_answered() {
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse().expect("an address"),
        ..Settings::default()
    };
    settings.connections.idle_timeout = Duration::from_secs(3600);
    settings.connections.header_read_timeout = Duration::from_secs(3600);
    let server = Server::bind(settings).await.expect("bind");
    let address = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    // Kept-alive connections, each with a request answered.
    let mut streams = Vec::new();
    for connection in 0..CONNECTIONS {
        let mut stream = TcpStream::connect(address).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a timeout");
        stream.write_all(&request(connection)).expect("send");
        let (answer, stream) = response(stream).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        streams.push(stream);
    }

    // Each sends its next request, then the service stops: no await in between, so the
    // service has run none of its tasks, and every request waits unread in its socket.
    for (connection, stream) in streams.iter_mut().enumerate() {
        stream.write_all(&request(connection)).expect("send");
    }
    stop.send(()).expect("the service runs");

    // Every request sent is answered, the last answer on its connection, which then ends
    // cleanly.
    for stream in streams {
        let (answer, mut stream) = response(stream).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "{answer}"
        );
        let rest = tokio::task::spawn_blocking(move || {
            let mut rest = Vec::new();
            stream.read_to_end(&mut rest).map(|_| rest)
        })
        .await
        .expect("the reader");
        assert_eq!(rest.expect("an end of stream, not a reset"), b"");
    }
    service.await.expect("the service").expect("a clean stop");
}
