//! Connecting: TLS (`rediss://`) with a private CA, password and ACL authentication, and
//! clear errors for bad URLs, wrong credentials and unreachable servers.

use std::sync::Arc;
use std::time::Duration;

use paceline_store::{redis::RedisStore, FailurePolicy};
use paceline_store::{Error, Limiter, StoreErrorKind};
use paceline_testkit::RedisServer;

async fn connect(url: &str) -> Result<RedisStore, Error> {
    RedisStore::builder(url, FailurePolicy::FailClosed)
        .connect_timeout(Duration::from_secs(2))
        // Generous: a loaded machine must not turn a slow answer into a failed test.
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// One admission then one rejection on a fresh `key`: the store decides.
async fn decides(store: RedisStore, key: &str) -> bool {
    let limiter = Limiter::with_store(
        // An hour per call: the second is refused however long the first took.
        "gcra:rate=1/h,burst=1".parse().expect("valid spec"),
        Arc::new(store),
    );
    let first = limiter.limit(key, 1).await.expect("a decision");
    let second = limiter.limit(key, 1).await.expect("a decision");
    first.allowed && !second.allowed
}

#[tokio::test]
async fn tls_with_a_private_ca() {
    let server = RedisServer::start_tls().expect("a TLS redis-server");
    let url = server.tls_url().expect("a TLS port");
    let ca = server.tls_ca_pem().expect("the CA");
    let store = RedisStore::builder(url.clone(), FailurePolicy::FailClosed)
        .tls_root_certificate(ca)
        .response_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("a TLS connection trusting the private CA");
    assert!(decides(store, "tls").await);

    // Without the CA, the server's certificate is not trusted: a clear failure, not a hang.
    let untrusted = connect(&url)
        .await
        .err()
        .expect("an untrusted certificate fails");
    assert!(
        untrusted.to_string().contains("cannot connect to Redis"),
        "{untrusted}"
    );

    // A root certificate for a plain URL is a configuration mistake.
    let plain = RedisStore::builder(server.url(), FailurePolicy::FailClosed)
        .tls_root_certificate(b"pem".to_vec())
        .connect()
        .await
        .err()
        .expect("rejected");
    assert!(matches!(plain, Error::Input(e) if e.field() == "tls_root_certificate"));
}

#[tokio::test]
async fn password_and_acl_users() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]).expect("redis-server");
    assert!(server
        .command(&["PING"])
        .expect("a reply")
        .starts_with("-NOAUTH"));
    let port = server.port();
    let store = connect(&format!("redis://:s3cret@127.0.0.1:{port}")).await;
    assert!(decides(store.expect("the right password"), "password").await);

    let wrong = connect(&format!("redis://:nope@127.0.0.1:{port}"))
        .await
        .err()
        .expect("a wrong password fails");
    let message = wrong.to_string();
    assert!(message.contains("cannot connect to Redis"), "{message}");
    assert!(
        !message.contains("nope"),
        "a password leaked into: {message}"
    );

    // An ACL user (AUTH user password), created with the admin password.
    let acl = paceline_testkit::redis_cli(port)
        .args(["--no-auth-warning", "-a", "s3cret"])
        .args(["ACL", "SETUSER", "worker", "on", ">w0rker!", "+@all", "~*"])
        .output()
        .expect("redis-cli runs");
    assert_eq!(String::from_utf8_lossy(&acl.stdout).trim(), "OK");
    let store = connect(&format!("redis://worker:w0rker!@127.0.0.1:{port}"))
        .await
        .expect("the ACL user");
    assert!(store.runs_as_functions(), "Redis 7 with FUNCTION allowed");
    assert!(decides(store, "acl").await);

    // A user who may not load functions still gets the same decisions, from the same Lua
    // run as a script (EVALSHA): the path for Redis before 7, too.
    let acl = paceline_testkit::redis_cli(port)
        .args(["--no-auth-warning", "-a", "s3cret"])
        .args([
            "ACL",
            "SETUSER",
            "scripts",
            "on",
            ">scr1pts",
            "+@all",
            "-function",
            "~*",
        ])
        .output()
        .expect("redis-cli runs");
    assert_eq!(String::from_utf8_lossy(&acl.stdout).trim(), "OK");
    let store = connect(&format!("redis://scripts:scr1pts@127.0.0.1:{port}"))
        .await
        .expect("the scripts-only user");
    assert!(!store.runs_as_functions());
    assert!(decides(store, "scripts").await);
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_are_clear_errors() {
    for bad in [
        "localhost:6379",
        "http://x:1",
        "redis-cluster://",
        "redis://a:1,b:2",
    ] {
        match connect(bad).await {
            Err(Error::Input(e)) => assert_eq!(e.field(), "store", "{bad}"),
            other => panic!("{bad}: expected an input error, got {:?}", other.err()),
        }
    }
    let mut server = RedisServer::start().expect("redis-server");
    let url = server.url();
    server.kill();
    match connect(&url).await {
        Err(Error::Store(e)) => {
            assert!(
                matches!(
                    e.kind(),
                    StoreErrorKind::Unavailable | StoreErrorKind::Timeout
                ),
                "{e}"
            );
            assert!(e.message().contains(&url.replace("redis://", "")), "{e}");
        }
        other => panic!("expected a store error, got {:?}", other.err()),
    }
    let bad_prefix = RedisStore::builder(&url, FailurePolicy::FailOpen)
        .prefix("{app}")
        .connect()
        .await
        .err()
        .expect("rejected");
    assert!(matches!(bad_prefix, Error::Input(e) if e.field() == "prefix"));
    for (field, builder) in [
        (
            "response_timeout",
            RedisStore::builder(&url, FailurePolicy::FailOpen)
                .response_timeout(Duration::from_secs(3601)),
        ),
        (
            "connect_timeout",
            RedisStore::builder(&url, FailurePolicy::FailOpen).connect_timeout(Duration::MAX),
        ),
    ] {
        match builder.connect().await {
            Err(Error::Input(e)) => {
                assert_eq!(e.field(), field, "{e}");
                assert!(e.to_string().contains("at most 3600s"), "{e}");
            }
            other => panic!("{field}: expected an input error, got {:?}", other.err()),
        }
    }
}

#[tokio::test]
async fn a_cluster_node_behind_a_plain_url_is_refused_with_advice() {
    let cluster = paceline_testkit::RedisCluster::start_with(1).expect("a 1-node cluster");
    let node = &cluster.nodes()[0];
    let message = connect(&node.url())
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(message.contains("redis-cluster://"), "{message}");
    let store = connect(&cluster.url())
        .await
        .expect("the cluster URL works");
    assert!(store.is_cluster());
    assert!(decides(store, "cluster").await);
}
