//! The library's own checks: a malformed call to a batch entry point (`decide` or the lean
//! batch) is refused with an error naming what is wrong, and changes nothing.

use std::sync::Arc;

use paceline_store::Limiter;
use paceline_store::{redis::RedisStore, FailurePolicy};
use paceline_testkit::RedisServer;
use redis::AsyncCommands as _;

/// The names of paceline's functions on `server`, once a decision has loaded the library:
/// (`decide`, the lean batch).
async fn functions(connection: &mut redis::aio::MultiplexedConnection) -> (String, String) {
    let listed: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(connection)
        .await
        .expect("FUNCTION LIST");
    let text = format!("{listed:?}");
    let find = |stem: &str| {
        let start = text
            .find(stem)
            .unwrap_or_else(|| panic!("no {stem} in {text}"));
        text[start..]
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .expect("a function name")
            .to_string()
    };
    (find("paceline_decide_"), find("paceline_lean_"))
}

#[tokio::test]
async fn malformed_batch_calls_are_refused_and_change_nothing() {
    let server = RedisServer::start().expect("a private redis-server");
    let store = RedisStore::builder(server.url(), FailurePolicy::FailClosed)
        .connect()
        .await
        .expect("connect");
    assert!(
        store.runs_as_functions(),
        "Redis 7 runs the library as functions"
    );
    // A key that outlives the test, so the count of keys below holds still.
    let limiter = Limiter::with_store("gcra:rate=1/h".parse().expect("spec"), Arc::new(store));
    limiter.limit("loaded", 1).await.expect("a decision");
    let client = redis::Client::open(server.url()).expect("a client");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let (decide, lean) = functions(&mut connection).await;
    let before: u64 = redis::cmd("DBSIZE")
        .query_async(&mut connection)
        .await
        .expect("DBSIZE");

    // A well-formed call's arguments for keys `x:1` and `x:2`: one policy, one run of two.
    let good = [
        "2", "x:1", "x:2", "", "0", "1", "gcra", "2", "1000.0", "5", "1", "2", "1", "limit", "1",
        "",
    ];
    let with = |at: usize, value: &str| {
        let mut args: Vec<String> = good.iter().map(|s| s.to_string()).collect();
        args[at] = value.to_string();
        args
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (with(11, "1"), "1 decisions for 2 keys"),
        (with(11, "0"), "a run of 0 decisions"),
        (with(11, "1.5"), "a run of 1.5 decisions"),
        (with(12, "2"), "no policy 2"),
        (with(13, "grab"), "unknown op grab"),
        (with(6, "leaky"), "unknown algorithm leaky"),
        (with(7, "x"), "gcra with x parameters"),
        (with(8, "fast"), "gcra parameter 1 is fast"),
        (with(14, "0"), "a cost of 0"),
        (with(14, "2.5"), "a cost of 2.5"),
        (with(15, "soon"), "a max_wait of soon"),
        // The first run is sound, the second is not: nothing of the first may be written.
        (
            [
                "2", "x:1", "x:2", "", "0", "1", "gcra", "2", "1000.0", "5", "2", "1", "1",
                "limit", "1", "", "1", "1", "limit", "0", "",
            ]
            .map(String::from)
            .to_vec(),
            "a cost of 0",
        ),
    ];
    for function in [&decide, &lean] {
        for (args, expected) in &cases {
            let outcome: redis::RedisResult<redis::Value> = redis::cmd("FCALL")
                .arg(function)
                .arg(args)
                .query_async(&mut connection)
                .await;
            let error = outcome
                .expect_err("a malformed call is refused")
                .to_string();
            assert!(
                error.contains(expected),
                "{function} {args:?}: expected an error naming {expected:?}, got {error}"
            );
        }
    }
    // A call without decisions (here at an injected time) answers with none.
    for function in [&decide, &lean] {
        let empty: redis::Value = redis::cmd("FCALL")
            .arg(function)
            .arg(&["0", "1000000 0", "0", "1", "gcra", "2", "1000.0", "5", "0"])
            .query_async(&mut connection)
            .await
            .expect("an empty batch is no error");
        assert!(
            matches!(&empty, redis::Value::Array(v) if v.is_empty())
                || matches!(&empty, redis::Value::BulkString(b) if b.is_empty()),
            "{function}: {empty:?}"
        );
    }
    // Only the lean batch refuses the other algorithms.
    let mut window = good.map(String::from).to_vec();
    window.splice(
        6..10,
        ["fixed_window", "2", "5", "1000000"].map(String::from),
    );
    let outcome: redis::RedisResult<redis::Value> = redis::cmd("FCALL")
        .arg(&lean)
        .arg(&window)
        .query_async(&mut connection)
        .await;
    let error = outcome
        .expect_err("the lean batch refuses fixed_window")
        .to_string();
    assert!(
        error.contains("no lean entry point for fixed_window"),
        "{error}"
    );
    let ok: redis::Value = redis::cmd("FCALL")
        .arg(&decide)
        .arg(&window)
        .query_async(&mut connection)
        .await
        .expect("decide takes fixed_window");
    assert!(
        matches!(ok, redis::Value::Array(ref v) if v.len() == 10),
        "{ok:?}"
    );

    // Nothing but that last call wrote a key.
    let after: u64 = redis::cmd("DBSIZE")
        .query_async(&mut connection)
        .await
        .expect("DBSIZE");
    assert_eq!(after, before + 2);
    let written: Vec<Option<Vec<u8>>> = connection.mget(&["x:1", "x:2"]).await.expect("MGET");
    assert!(written.iter().all(Option::is_some));
}
