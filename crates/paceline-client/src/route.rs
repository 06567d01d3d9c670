//! Which limit a request counts against before the server has said: its route.
//!
//! A [`Route`] is the request's method and path template (ids replaced) plus its *major
//! parameter*: the top-level resource that splits one bucket into independent limits
//! (Discord: the channel, guild or webhook). Two requests with the same route share what
//! the client learns of their bucket; the server may then tell that several routes share
//! one bucket id, and the client merges them (per major parameter).
//!
//! ```
//! use paceline_client::Route;
//! let a = Route::discord("POST", "/api/v10/channels/1234567890123/messages");
//! let b = Route::discord("post", "/channels/1234567890123/messages?wait=true");
//! assert_eq!(a, b);
//! assert_eq!(a.key(), "POST /channels/:major/messages");
//! assert_eq!(a.major(), "1234567890123");
//! let c = Route::discord("PATCH", "/guilds/42/members/99887766");
//! assert_eq!((c.key(), c.major()), ("PATCH /guilds/:major/members/:id", "42"));
//! ```

use std::sync::Arc;

/// A request's route: method, path template and major parameter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    key: Arc<str>,
    major: Arc<str>,
    global_exempt: bool,
}

fn is_id(segment: &str) -> bool {
    let all_digits = !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit());
    let long_hex =
        segment.len() >= 16 && segment.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    all_digits || long_hex
}

/// The path's segments, without the query, the fragment and empty segments.
fn segments(path: &str) -> Vec<&str> {
    let path = path.split(['?', '#']).next().unwrap_or("");
    path.split('/').filter(|s| !s.is_empty()).collect()
}

impl Route {
    /// A route from its parts: `key` names the limit's route (requests with the same key
    /// are assumed to share a bucket until the server says otherwise), `major` splits it
    /// per top-level resource ("" for none).
    pub fn new(key: impl Into<String>, major: impl Into<String>) -> Route {
        Route {
            key: Arc::from(key.into()),
            major: Arc::from(major.into()),
            global_exempt: false,
        }
    }

    /// The same route, not counted against the global limit (Discord's interaction
    /// endpoints).
    pub fn global_exempt(mut self) -> Route {
        self.global_exempt = true;
        self
    }

    /// A route for any HTTP API: the method and the path with numeric and long hex
    /// segments replaced by `:id`; no major parameter.
    ///
    /// ```
    /// use paceline_client::Route;
    /// let r = Route::generic("get", "/repos/o/r/issues/123?per_page=5");
    /// assert_eq!(r.key(), "GET /repos/o/r/issues/:id");
    /// assert_eq!(r.major(), "");
    /// ```
    pub fn generic(method: &str, path: &str) -> Route {
        let mut key = method.to_ascii_uppercase();
        key.push(' ');
        for s in segments(path) {
            key.push('/');
            key.push_str(if is_id(s) { ":id" } else { s });
        }
        if key.ends_with(' ') {
            key.push('/');
        }
        Route::new(key, "")
    }

    /// A route of Discord's API: `/api` and a version prefix dropped; the id after
    /// `channels`, `guilds` or `webhooks` (and a webhook's token) kept as the major
    /// parameter; other ids replaced by `:id`; a reaction's emoji and what follows it
    /// collapsed (all reactions of a channel share one limit); interaction callbacks
    /// exempt from the global limit.
    pub fn discord(method: &str, path: &str) -> Route {
        let mut parts = segments(path);
        if parts.first() == Some(&"api") {
            parts.remove(0);
        }
        if parts
            .first()
            .is_some_and(|s| s.len() > 1 && s.starts_with('v') && is_id(&s[1..]))
        {
            parts.remove(0);
        }
        let mut key = method.to_ascii_uppercase();
        key.push(' ');
        let mut major = String::new();
        let top = parts.first().copied().unwrap_or("");
        let mut i = 0;
        while i < parts.len() {
            let s = parts[i];
            key.push('/');
            if i == 1 && matches!(top, "channels" | "guilds" | "webhooks") {
                key.push_str(":major");
                major.push_str(s);
                if top == "webhooks" {
                    if let Some(token) = parts.get(2) {
                        major.push('/');
                        major.push_str(token);
                        key.push_str("/:token");
                        i += 1;
                    }
                }
            } else if i == 2 && top == "interactions" {
                key.push_str(":token");
            } else if s == "reactions" {
                key.push_str("reactions");
                break;
            } else if is_id(s) {
                key.push_str(":id");
            } else {
                key.push_str(s);
            }
            i += 1;
        }
        if key.ends_with(' ') {
            key.push('/');
        }
        let route = Route::new(key, major);
        if top == "interactions" {
            route.global_exempt()
        } else {
            route
        }
    }

    /// The route's key: method and path template.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The major parameter ("" for none).
    pub fn major(&self) -> &str {
        &self.major
    }

    /// True if the route is not counted against the global limit.
    pub fn is_global_exempt(&self) -> bool {
        self.global_exempt
    }

    pub(crate) fn key_arc(&self) -> &Arc<str> {
        &self.key
    }

    pub(crate) fn major_arc(&self) -> &Arc<str> {
        &self.major
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discord_routes() {
        let w = Route::discord("POST", "/api/v10/webhooks/111/tok-en/messages/222");
        assert_eq!(w.key(), "POST /webhooks/:major/:token/messages/:id");
        assert_eq!(w.major(), "111/tok-en");
        let r = Route::discord("PUT", "/channels/5/messages/6/reactions/%F0%9F%91%8D/@me");
        assert_eq!(r.key(), "PUT /channels/:major/messages/:id/reactions");
        let i = Route::discord("POST", "/interactions/77/abc/callback");
        assert!(i.is_global_exempt());
        assert_eq!(i.key(), "POST /interactions/:id/:token/callback");
        assert!(!Route::discord("GET", "/users/@me").is_global_exempt());
        assert_eq!(Route::discord("GET", "").key(), "GET /");
        assert_eq!(Route::discord("GET", "/gateway/bot").major(), "");
    }

    #[test]
    fn generic_routes() {
        assert_eq!(Route::generic("GET", "/").key(), "GET /");
        assert_eq!(
            Route::generic("DELETE", "/x/0123456789abcdef0123/y").key(),
            "DELETE /x/:id/y"
        );
    }
}
