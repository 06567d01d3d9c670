//! The guides' examples that need a Redis or an HTTP server, run for real: each example file
//! (word for word a snippet of a guide, see tests/docs.rs) is compiled into this test and
//! its `main` called, against a private redis-server on a free port (never one on 6379)
//! and a local HTTP server, named through the variables the examples read:
//! `PACELINE_REDIS_URL` and `API_URL`.
//!
//! Two examples are compiled only (as example targets): `axum` serves forever on port
//! 3000, and `discord_bot` needs a bot's token and calls discord.com.

use std::sync::OnceLock;

/// Starts the servers once for every test of this binary and names them in the variables
/// the examples read (before any example runs: every test calls this first).
fn servers() {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        // In this workspace reqwest is built without a TLS provider of its own (the service
        // brings one): an application's reqwest, with its default features, has one.
        paceline_testkit::mock_api::install_tls_provider();
        let redis = paceline_testkit::shared_server();
        std::env::set_var("PACELINE_REDIS_URL", redis.url());
        std::env::set_var("API_URL", format!("http://{}", api()));
    });
}

/// A local HTTP server answering `ok` to `GET /`, on a thread of its own for the life of
/// the process; its address.
fn api() -> std::net::SocketAddr {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a free port");
            let address = listener.local_addr().expect("its address");
            sender
                .send(address)
                .expect("the test waits for the address");
            let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
            axum::serve(listener, app).await.expect("the server runs");
        });
    });
    receiver.recv().expect("the server's address")
}

mod redis_limiter {
    include!("../examples/redis_limiter.rs");

    #[test]
    fn runs_against_a_private_redis() {
        super::servers();
        if let Err(e) = main() {
            panic!("examples/redis_limiter.rs failed: {e}");
        }
    }
}

mod redis_queue {
    include!("../examples/redis_queue.rs");

    #[test]
    fn runs_against_a_private_redis() {
        super::servers();
        if let Err(e) = main() {
            panic!("examples/redis_queue.rs failed: {e}");
        }
    }
}

mod redis_client {
    include!("../examples/redis_client.rs");

    #[test]
    fn runs_against_a_private_redis() {
        super::servers();
        if let Err(e) = main() {
            panic!("examples/redis_client.rs failed: {e}");
        }
    }
}

mod paced_per_host {
    include!("../examples/paced_per_host.rs");

    #[test]
    fn runs_against_a_private_redis_and_a_local_server() {
        super::servers();
        if let Err(e) = main() {
            panic!("examples/paced_per_host.rs failed: {e}");
        }
    }
}
