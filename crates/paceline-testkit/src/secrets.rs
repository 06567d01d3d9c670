//! URLs that carry credentials, for tests that check none of them is ever shown (in logs,
//! metrics, dashboards, errors or `Debug`).
//!
//! ```no_run
//! let urls = paceline_testkit::secrets::SecretUrls::start().unwrap();
//! // ... start what is tested with `urls.store` and `urls.upstream`, then:
//! urls.assert_hidden("the log", "INFO listening on http://127.0.0.1:8081");
//! ```

use std::io;

use crate::RedisServer;

/// The password of the private Redis.
const REDIS_PASSWORD: &str = "redis-pw-5ecret";
/// The user and password of the upstream URL.
const UPSTREAM_USER: &str = "upstream-user";
const UPSTREAM_PASSWORD: &str = "upstream-pw-5ecret";

/// A private redis-server that requires a password, a store URL holding it, and an upstream
/// URL with a user and a password, on port 1, where nothing listens (every request to it
/// fails, so its errors can be checked too).
pub struct SecretUrls {
    /// The Redis that the store URL names; stopped when this is dropped.
    pub redis: RedisServer,
    /// `redis://:PASSWORD@HOST:PORT`.
    pub store: String,
    /// `http://USER:PASSWORD@127.0.0.1:1/base`.
    pub upstream: String,
}

impl SecretUrls {
    /// Starts the Redis.
    pub fn start() -> io::Result<SecretUrls> {
        let redis = RedisServer::start_with(&["--requirepass", REDIS_PASSWORD])?;
        let store = format!("redis://:{REDIS_PASSWORD}@{}", redis.addr());
        let upstream = format!("http://{UPSTREAM_USER}:{UPSTREAM_PASSWORD}@127.0.0.1:1/base");
        Ok(SecretUrls {
            redis,
            store,
            upstream,
        })
    }

    /// Panics, naming `what`, if `text` shows any of the secrets.
    pub fn assert_hidden(&self, what: &str, text: &str) {
        for secret in [UPSTREAM_USER, UPSTREAM_PASSWORD, REDIS_PASSWORD] {
            assert!(!text.contains(secret), "{what} shows `{secret}`: {text}");
        }
    }
}
