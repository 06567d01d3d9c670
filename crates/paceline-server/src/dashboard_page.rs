//! The dashboard's page: one HTML file served from the binary (no CDN, nothing downloaded)
//! by the service (`GET /dashboard`) and by `paceline proxy`'s admin address. It holds no
//! data: it reads everything from `/v1/dashboard`, and its queue page from the queue
//! endpoints, with the token the user gave it.
//!
//! Its Content-Security-Policy lets only its own script run (by the script's hash) and lets
//! it ask only the address that served it.

use std::sync::LazyLock;

use axum::http::{header, HeaderValue};
use axum::response::IntoResponse;
use base64::Engine as _;

/// The page.
const PAGE: &str = include_str!("dashboard.html");

/// What the page may do: run its own script (by its hash: an injected one would not run),
/// use its inline style, and ask this service.
static CSP: LazyLock<HeaderValue> = LazyLock::new(|| {
    let hashes: Vec<String> = inline_scripts(PAGE)
        .map(|script| {
            let digest = ring::digest::digest(&ring::digest::SHA256, script.as_bytes());
            let encoded = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
            format!("'sha256-{encoded}'")
        })
        .collect();
    let policy = format!(
        "default-src 'none'; script-src {}; style-src 'unsafe-inline'; connect-src 'self'; \
         img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashes.join(" ")
    );
    // Base64 and ASCII punctuation: always a valid header value.
    HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("default-src 'none'"))
});

/// The text of each `<script>` element of `page`.
fn inline_scripts(page: &str) -> impl Iterator<Item = &str> {
    page.split("<script>")
        .skip(1)
        .filter_map(|rest| rest.split("</script>").next())
}

/// The page (also on `paceline proxy`'s admin address, whose data has a `proxy` part).
#[utoipa::path(
    get,
    path = "/dashboard",
    tag = "service",
    operation_id = "dashboard_page",
    security(()),
    responses((status = 200, description = "The live dashboard's page", content_type = "text/html; charset=utf-8", body = String))
)]
pub(crate) async fn page() -> impl IntoResponse {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CONTENT_SECURITY_POLICY, CSP.clone()),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        PAGE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_lets_the_pages_own_script_run_and_nothing_else() {
        let csp = CSP.to_str().unwrap_or_default();
        let scripts: Vec<&str> = inline_scripts(PAGE).collect();
        assert_eq!(scripts.len(), 1, "the page has one script");
        let directive = |name: &str| {
            csp.split(';')
                .map(str::trim)
                .find(|d| d.starts_with(name))
                .unwrap_or_default()
                .to_string()
        };
        let script_src = directive("script-src");
        assert!(script_src.starts_with("script-src 'sha256-"), "{csp}");
        assert!(!script_src.contains("unsafe"), "{csp}");
        assert_eq!(directive("default-src"), "default-src 'none'");
        assert_eq!(directive("connect-src"), "connect-src 'self'");
        // The hash is the script's own.
        let own = ring::digest::digest(&ring::digest::SHA256, scripts[0].as_bytes());
        let own = base64::engine::general_purpose::STANDARD.encode(own.as_ref());
        assert_eq!(script_src, format!("script-src 'sha256-{own}'"));
        // The hash of a changed script is another.
        let other = ring::digest::digest(&ring::digest::SHA256, b"alert(1)");
        let other = base64::engine::general_purpose::STANDARD.encode(other.as_ref());
        assert!(!csp.contains(&other));
    }
}
