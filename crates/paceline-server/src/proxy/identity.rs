//! Each identity's global limit: configured per identity, learned from the API, or the
//! proxy's default.
//!
//! An identity is one `Authorization` value. Its global limit is the first of:
//!
//! 1. **configured**: the `[global_limits]` entry whose key names it, either
//!    `"discord:ID"` (Discord: the bot's user id, which the first part of a bot token
//!    encodes, so the key is not a secret) or `"sha256:HEX"` (any dialect: the SHA-256 of
//!    the whole `Authorization` value, 64 hex digits). A key never holds the token;
//! 2. **learned** (dialect `discord`, `learn_global_limit`): Discord tells a bot's session
//!    start limits at `GET /gateway/bot`; a bot whose `max_concurrency` is above 1 (a large
//!    bot) gets `max(500, 25 × max_concurrency)` requests per second, the rule nirn-proxy
//!    applies, and any other the default. Asked once, when the identity is first seen;
//! 3. **default**: `--global-limit`.
//!
//! No dialect's headers state a global limit apart from the buckets: Discord's say only
//! whether a 429 was global, and a limit that GitHub or an IETF `RateLimit-Policy` puts on
//! every route is one bucket every route names, which the limiter learns as such.
//!
//! ```text
//! [global_limits]
//! "discord:80351110224678912" = "gcra:rate=500/s,burst=1"
//! "sha256:9b71d224bd62f3785d96d46ad3ea3d73319bfbc2890caadae2dff72519673ca7" = "gcra:rate=100/s,burst=1"
//! ```

use std::time::Duration;

use base64::Engine;
use paceline_core::{InputError, Policy};

/// Where an identity's global limit came from, as metrics and logs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    Configured,
    Learned,
    Default,
}

impl Source {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Source::Configured => "configured",
            Source::Learned => "learned",
            Source::Default => "default",
        }
    }
}

/// Checks a `[global_limits]` key: `discord:` and a user id, or `sha256:` and 64 hex
/// digits. The error names the key's shape, never echoing a value that could be a token.
pub fn check_key(key: &str) -> Result<(), InputError> {
    let ok = match key.split_once(':') {
        Some(("discord", id)) => is_snowflake(id),
        Some(("sha256", hex)) => hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    Err(InputError::new(
        "global_limits",
        "a key is neither \"discord:ID\" (a bot's user id, digits) nor \"sha256:HEX\" (the \
         SHA-256 of the whole Authorization value, 64 hex digits); never put a token itself \
         in the configuration",
    ))
}

/// A Discord id: 1 to 20 digits.
fn is_snowflake(id: &str) -> bool {
    (1..=20).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_digit())
}

/// The `[global_limits]` keys that may name `token` (an `Authorization` value): its
/// SHA-256 key, and for a Discord bot token its `discord:` key.
pub(super) fn keys(token: &[u8]) -> Vec<String> {
    let digest = ring::digest::digest(&ring::digest::SHA256, token);
    let mut hex = String::with_capacity(7 + 64);
    hex.push_str("sha256:");
    for b in digest.as_ref() {
        hex.push_str(&format!("{b:02x}"));
    }
    let mut keys = vec![hex];
    if let Some(id) = discord_bot_id(token) {
        keys.push(format!("discord:{id}"));
    }
    keys
}

/// The user id a Discord bot token (`Bot ` and the token) encodes in its first part
/// (base64 of the id's digits), if it is one.
pub(super) fn discord_bot_id(token: &[u8]) -> Option<String> {
    let token = std::str::from_utf8(token).ok()?;
    let (scheme, rest) = token.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bot") {
        return None;
    }
    let first = rest.trim().split('.').next()?;
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let standard = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = engine
        .decode(first)
        .or_else(|_| standard.decode(first))
        .ok()?;
    let id = String::from_utf8(bytes).ok()?;
    is_snowflake(&id).then_some(id)
}

/// The global limit of a bot whose `max_concurrency` is `concurrency`: `None` (the
/// default) for 1 or less, else `max(500, 25 × concurrency)` per second.
pub(super) fn learned_limit(concurrency: u64) -> Option<Policy> {
    if concurrency <= 1 {
        return None;
    }
    let rate = concurrency.saturating_mul(25).max(500);
    format!("gcra:rate={rate}/s,burst=1").parse().ok()
}

/// Where `GET /gateway/bot` is below the upstream's base, for a request to `path`: under
/// the same `/api` or `/api/vN` prefix as the request's.
pub(super) fn gateway_bot_path(path: &str) -> String {
    let mut parts = path.split('/').filter(|s| !s.is_empty());
    let mut prefix = String::new();
    if let Some("api") = parts.next() {
        prefix.push_str("/api");
        if let Some(v) = parts.next() {
            if v.len() > 1 && v.starts_with('v') && v[1..].bytes().all(|b| b.is_ascii_digit()) {
                prefix.push('/');
                prefix.push_str(v);
            }
        }
    }
    prefix.push_str("/gateway/bot");
    prefix
}

/// Asks `url` (the upstream's `/gateway/bot`) with `token` for the bot's
/// `session_start_limit.max_concurrency`, within `timeout`. The error says what went
/// wrong, without the URL or the token.
pub(super) async fn max_concurrency(
    http: &reqwest::Client,
    url: reqwest::Url,
    token: &[u8],
    timeout: Duration,
) -> Result<u64, String> {
    let asking = http
        .get(url)
        .header(reqwest::header::AUTHORIZATION, token)
        .send();
    let response = match tokio::time::timeout(timeout, asking).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(e.without_url().to_string()),
        Err(_) => return Err(format!("no answer within {timeout:?}")),
    };
    let status = response.status();
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    let body = match tokio::time::timeout(timeout, response.bytes()).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(e.without_url().to_string()),
        Err(_) => return Err(format!("no body within {timeout:?}")),
    };
    if body.len() > 64 << 10 {
        return Err("an answer over 64 KiB".into());
    }
    let seen: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("not JSON ({e})"))?;
    seen.pointer("/session_start_limit/max_concurrency")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| "no session_start_limit.max_concurrency in the answer".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bot_token_names_its_bot() {
        // "80351110224678912" in base64, as bot tokens begin.
        let token = b"Bot ODAzNTExMTAyMjQ2Nzg5MTI.GhIjKl.secret-part";
        assert_eq!(discord_bot_id(token).as_deref(), Some("80351110224678912"));
        let keys = keys(token);
        assert_eq!(keys[1], "discord:80351110224678912");
        assert!(keys[0].starts_with("sha256:") && keys[0].len() == 71);
        assert!(check_key(&keys[0]).is_ok() && check_key(&keys[1]).is_ok());
        for not_a_bot in [
            &b"Bearer ODAzNTExMTAyMjQ2Nzg5MTI.x.y"[..],
            b"Bot bm90LWRpZ2l0cw.x.y",
            b"Bot",
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(discord_bot_id(not_a_bot), None);
        }
    }

    #[test]
    fn keys_of_other_shapes_are_refused_without_echoing_them() {
        for key in [
            "Bot my-token",
            "discord:-1",
            "discord:12ab",
            "sha256:abc",
            "secret:123",
        ] {
            let e = check_key(key).unwrap_err();
            assert_eq!(e.field(), "global_limits");
            assert!(!e.message().contains(key), "{}", e.message());
        }
    }

    #[test]
    fn large_bots_learn_a_larger_limit() {
        assert_eq!(learned_limit(0), None);
        assert_eq!(learned_limit(1), None);
        let rate = |c| learned_limit(c).map(|p| p.to_string());
        let policy = |spec: &str| spec.parse::<Policy>().map(|p| p.to_string()).ok();
        assert_eq!(rate(16), policy("gcra:rate=500/s,burst=1"));
        assert_eq!(rate(32), policy("gcra:rate=800/s,burst=1"));
    }

    #[test]
    fn gateway_bot_is_asked_under_the_request_s_api_prefix() {
        assert_eq!(
            gateway_bot_path("/api/v10/channels/1"),
            "/api/v10/gateway/bot"
        );
        assert_eq!(gateway_bot_path("/api/users/@me"), "/api/gateway/bot");
        assert_eq!(gateway_bot_path("/channels/1"), "/gateway/bot");
        assert_eq!(gateway_bot_path("/"), "/gateway/bot");
    }
}
