//! Where the proxy sends a request: the upstream's base URL, then the request's path, and
//! never anywhere outside that base.
//!
//! The request's target must be a path (`/PATH[?QUERY]`, the origin form). Its path is read
//! segment by segment between `/`s; each segment's percent-escapes are decoded to judge it,
//! never to send it:
//!
//! - `.` (also `%2e`, any case) is dropped; `..` (also `.%2e`, `%2e.`, `%2e%2e`, any case)
//!   drops the segment before it. A `..` with no segment of the request's own path before
//!   it would leave the base: refused.
//! - Any other segment is sent exactly as it came (`%20` stays `%20`), including an
//!   encoded `/` or `\` (`%2f`, `%5c`: APIs such as GitLab's name projects `group%2Fproject`)
//!   as long as no piece between them is a dot segment.
//! - Refused as ambiguous, because servers disagree on what they mean: a raw `\` (URL
//!   parsers read it as `/`); a dot segment hidden by an encoded `/` or `\` (`..%2f`),
//!   by a second encoding (`%252e%252e`), by `;` parameters (`..;x`, which servlet
//!   containers read as `..`) or made of dots and spaces (`...`, `.. `, which Windows
//!   servers read as dot segments); NUL and other control characters, raw or encoded; a
//!   `%` not followed by two hex digits; a path starting with `//`, as it came or once
//!   its dot segments are gone (`/a/..//host`: a URL parser reads `//host` as another
//!   host).
//! - Refused: any target that is not a path: the absolute form (`GET http://host/x`, which
//!   a client sends to a forward proxy, with credentials meant for that host), the
//!   authority form (`CONNECT host:443`) and the asterisk form (`OPTIONS *`).
//!
//! The query goes as it came; it never changes the path. The upstream path is the base's
//! path (without its trailing `/`) followed by the normalised path, and the URL built is
//! checked once more, apart from the rules above: same scheme, host, port and credentials
//! as the base, a path that is the base's or starts with it and a `/`, no dot segment after
//! it.
//!
//! ```text
//! base http://api/base     request                     upstream
//!                          /x/y?q=1                    http://api/base/x/y?q=1
//!                          /x/./y                      http://api/base/x/y
//!                          /x/../y                     http://api/base/y
//!                          /a%20b/group%2Fproject      http://api/base/a%20b/group%2Fproject
//!                          /@other/x                   http://api/base/@other/x
//!                          /x?next=/../../secret       http://api/base/x?next=/../../secret
//!                          /../secret, /%2e%2e/secret  refused
//!                          /a/../../secret             refused
//!                          /..%2fsecret, /..\secret    refused
//!                          //evil/x, http://evil/x     refused
//! ```

use axum::http::Uri;
use reqwest::Url;

/// Why a request's target is refused: the message of the proxy's `400` (field `path`).
pub(crate) type Refusal = &'static str;

const NOT_A_PATH: Refusal = "the proxy takes a path (`GET /PATH`), not an absolute URL, an \
     authority or `*`: it forwards to its upstream only";
const LEAVES_BASE: Refusal = "the path climbs (`..`) above the upstream's base path";
const BACKSLASH: Refusal = "a `\\` in the path is refused: URL parsers read it as `/`";
const HIDDEN_DOTS: Refusal = "a dot segment hidden by an encoded `/` or `\\`, a second \
     encoding, `;` parameters or spaces (`..%2f`, `%252e%252e`, `..;x`, `...`, `.. `) is \
     refused: servers disagree on whether it climbs";
const CONTROL: Refusal = "NUL and other control characters (raw or percent-encoded) are \
     refused in a path";
const BAD_ESCAPE: Refusal = "a `%` in the path must be followed by two hex digits";
const DOUBLE_SLASH: Refusal = "a path starting with `//` is refused: a URL parser reads \
     `//host` as another host";

/// What a segment means for the path it is in.
#[derive(Debug, PartialEq, Eq)]
enum Segment {
    /// `.`: dropped.
    Dot,
    /// `..`: drops the segment before it.
    DotDot,
    /// Anything else: kept as it came.
    Name,
}

/// Where a request goes.
#[derive(Debug)]
pub(crate) struct Target {
    /// The upstream URL: the base's, then the request's path and query.
    pub(crate) url: Url,
    /// The request's path without its dot segments, below the base (what its route is
    /// named by).
    pub(crate) path: String,
}

/// Where a request to `uri` on a proxy in front of `base` goes (see the module's contract),
/// or why it is refused.
pub(crate) fn upstream_target(base: &Url, uri: &Uri) -> Result<Target, Refusal> {
    if uri.scheme().is_some() || uri.authority().is_some() {
        return Err(NOT_A_PATH);
    }
    let path = normalise(uri.path())?;
    let prefix = base.path().trim_end_matches('/');
    let mut url = base.clone();
    url.set_path(&format!("{prefix}{path}"));
    url.set_query(uri.query());
    url.set_fragment(None);
    if within(base, prefix, &url) {
        Ok(Target { url, path })
    } else {
        Err(LEAVES_BASE)
    }
}

/// `path` (which must start with `/`) without its dot segments; refused if it would climb
/// above its root or is ambiguous.
fn normalise(path: &str) -> Result<String, Refusal> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(NOT_A_PATH);
    };
    if rest.starts_with('/') {
        return Err(DOUBLE_SLASH);
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let mut kept: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        let kind = classify(segment)?;
        match kind {
            Segment::Name => kept.push(segment),
            Segment::Dot => {}
            Segment::DotDot => {
                if kept.pop().is_none() {
                    return Err(LEAVES_BASE);
                }
            }
        }
        // A dot segment at the end leaves the path ending in `/` (`/x/.` is `/x/`).
        if kind != Segment::Name && i + 1 == segments.len() {
            kept.push("");
        }
    }
    let normalised = format!("/{}", kept.join("/"));
    // `/a/..//host` too.
    if normalised.starts_with("//") {
        return Err(DOUBLE_SLASH);
    }
    Ok(normalised)
}

/// What `segment` (raw, between two `/`s) means, or why it is refused.
fn classify(segment: &str) -> Result<Segment, Refusal> {
    if segment.contains('\\') {
        return Err(BACKSLASH);
    }
    let once = decode(segment.as_bytes()).ok_or(BAD_ESCAPE)?;
    match once.as_slice() {
        b"." => return Ok(Segment::Dot),
        b".." => return Ok(Segment::DotDot),
        _ => {}
    }
    // Decoded as often as it decodes: what a server that decodes twice would see.
    let mut full = once;
    while full.contains(&b'%') {
        match decode(&full) {
            Some(again) if again != full => full = again,
            _ => break,
        }
    }
    if full.iter().any(u8::is_ascii_control) {
        return Err(CONTROL);
    }
    let dotted = |piece: &[u8]| {
        let name = piece.split(|&b| b == b';').next().unwrap_or_default();
        name.contains(&b'.') && name.iter().all(|&b| b == b'.' || b == b' ')
    };
    if full.split(|&b| b == b'/' || b == b'\\').any(dotted) {
        return Err(HIDDEN_DOTS);
    }
    Ok(Segment::Name)
}

/// `bytes` with each `%XX` decoded; `None` if a `%` is not followed by two hex digits.
fn decode(bytes: &[u8]) -> Option<Vec<u8>> {
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let high = hex(*bytes.get(i + 1)?)?;
            let low = hex(*bytes.get(i + 2)?)?;
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// True if `url` is on `base`'s origin, with its credentials, and its path is `prefix` or
/// below it with no dot segment: the check of the URL actually sent, apart from
/// [`normalise`].
fn within(base: &Url, prefix: &str, url: &Url) -> bool {
    let same_origin = url.scheme() == base.scheme()
        && url.host_str() == base.host_str()
        && url.port_or_known_default() == base.port_or_known_default()
        && url.username() == base.username()
        && url.password() == base.password();
    let below = match url.path().strip_prefix(prefix) {
        Some("") => true,
        Some(rest) => {
            rest.starts_with('/')
                && rest.split('/').skip(1).all(|segment| {
                    !matches!(
                        decode(segment.as_bytes()).as_deref(),
                        Some(b"." | b"..") | None
                    )
                })
        }
        None => false,
    };
    same_origin && below
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(base: &str, target: &str) -> Result<String, Refusal> {
        let base: Url = base.parse().expect("a base URL");
        let uri: Uri = target.parse().expect("a request target");
        upstream_target(&base, &uri).map(|t| t.url.to_string())
    }

    #[test]
    fn paths_inside_the_base_go_below_it() {
        for (target, upstream) in [
            ("/", "http://api/base/"),
            ("/x/y", "http://api/base/x/y"),
            ("/x/y/", "http://api/base/x/y/"),
            ("/x/y?q=1&r=2", "http://api/base/x/y?q=1&r=2"),
            ("/x/./y", "http://api/base/x/y"),
            ("/x/%2E/y", "http://api/base/x/y"),
            ("/x/../y", "http://api/base/y"),
            ("/x/%2e%2E/y", "http://api/base/y"),
            ("/x/.", "http://api/base/x/"),
            ("/x/..", "http://api/base/"),
            ("/x//y", "http://api/base/x//y"),
            ("/a%20b/c", "http://api/base/a%20b/c"),
            ("/group%2Fproject/x", "http://api/base/group%2Fproject/x"),
            ("/a%5Cb", "http://api/base/a%5Cb"),
            ("/@evil.example/x", "http://api/base/@evil.example/x"),
            (
                "/v1.2/.well-known/a..b",
                "http://api/base/v1.2/.well-known/a..b",
            ),
            ("/x;v=1", "http://api/base/x;v=1"),
            (
                "/x?next=/../../secret",
                "http://api/base/x?next=/../../secret",
            ),
            ("/x?a=%2e%2e%2f", "http://api/base/x?a=%2e%2e%2f"),
            ("/100%25", "http://api/base/100%25"),
        ] {
            assert_eq!(
                to("http://api/base", target),
                Ok(upstream.into()),
                "{target}"
            );
            assert_eq!(
                to("http://api/base/", target),
                Ok(upstream.into()),
                "{target}"
            );
        }
        assert_eq!(to("http://api", "/x/../y"), Ok("http://api/y".into()));
        assert_eq!(
            to("https://u:p@api:8443/a/b", "/c"),
            Ok("https://u:p@api:8443/a/b/c".into())
        );
    }

    #[test]
    fn paths_that_leave_the_base_or_are_ambiguous_are_refused() {
        for (target, why) in [
            ("/..", LEAVES_BASE),
            ("/../secret", LEAVES_BASE),
            ("/%2e%2e/secret", LEAVES_BASE),
            ("/%2E%2E/secret", LEAVES_BASE),
            ("/%2e%2E/secret", LEAVES_BASE),
            ("/.%2e/secret", LEAVES_BASE),
            ("/%2e./secret", LEAVES_BASE),
            ("/a/../../secret", LEAVES_BASE),
            ("/./../secret", LEAVES_BASE),
            ("/a/%2e%2e/%2e%2e/secret", LEAVES_BASE),
            ("/..?x=1", LEAVES_BASE),
            ("/..%2fsecret", HIDDEN_DOTS),
            ("/..%2Fsecret", HIDDEN_DOTS),
            ("/a%2f..%2f..%2fsecret", HIDDEN_DOTS),
            ("/..%5csecret", HIDDEN_DOTS),
            ("/%252e%252e/secret", HIDDEN_DOTS),
            ("/%25%32%65%25%32%65/secret", HIDDEN_DOTS),
            ("/..;/secret", HIDDEN_DOTS),
            ("/.;x/secret", HIDDEN_DOTS),
            ("/.../secret", HIDDEN_DOTS),
            ("/..%20/secret", HIDDEN_DOTS),
            ("/..\\secret", BACKSLASH),
            ("/a\\..\\..\\secret", BACKSLASH),
            ("/%00/secret", CONTROL),
            ("/a%0d%0aX:1", CONTROL),
            ("/%25%30%30", CONTROL),
            ("/%zz", BAD_ESCAPE),
            ("/%2", BAD_ESCAPE),
            ("//evil/x", DOUBLE_SLASH),
            ("//..", DOUBLE_SLASH),
            ("/a/..//evil/x", DOUBLE_SLASH),
            ("/a/%2e%2e//evil/x", DOUBLE_SLASH),
            ("http://evil/x", NOT_A_PATH),
            ("http://api/base/x", NOT_A_PATH),
            ("evil:443", NOT_A_PATH),
            ("*", NOT_A_PATH),
        ] {
            assert_eq!(to("http://api/base", target), Err(why), "{target}");
        }
        assert_eq!(to("http://api", "/../x"), Err(LEAVES_BASE));
    }

    #[test]
    fn the_url_sent_is_checked_apart_from_the_rules() {
        let base: Url = "http://api/base".parse().expect("a URL");
        let ok = |url: &str| within(&base, "/base", &url.parse().expect("a URL"));
        assert!(ok("http://api/base"));
        assert!(ok("http://api/base/x/y?q"));
        assert!(!ok("http://api/basement"));
        assert!(!ok("http://api/secret"));
        assert!(!ok("http://api:81/base/x"));
        assert!(!ok("https://api/base/x"));
        assert!(!ok("http://evil/base/x"));
        assert!(!ok("http://u@api/base/x"));
    }
}
