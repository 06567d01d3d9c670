//! Whose request is it? [`Key`]s read the key a limit counts a request under.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{Extensions, HeaderMap, HeaderName, Method, Uri};
use ipnet::IpNet;
use paceline_core::InputError;

/// What a [`Key`] reads a request's key from: its method, URI, headers and extensions (the
/// body is never read).
#[derive(Clone, Copy, Debug)]
pub struct Head<'a> {
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request's extensions (the peer address, the authenticated user, ...).
    pub extensions: &'a Extensions,
}

impl<'a> Head<'a> {
    /// The head of `request`.
    pub fn of<B>(request: &'a http::Request<B>) -> Head<'a> {
        Head {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }
}

/// Why a request has no key: the request's fault (`400`, e.g. a missing API key header) or
/// the service's (`500`: no peer address to read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingKey {
    /// True when the request could supply the key (it is then answered `400`), false when
    /// the service is set up wrong (`500`).
    pub request_fault: bool,
    /// What is missing, for the answer's `detail`.
    pub what: String,
}

/// Appends a request's key to the layer's store key under construction.
type Extract = dyn Fn(&Head<'_>, &mut KeyText) -> Result<(), MissingKey> + Send + Sync;

/// A store key under construction: on the stack while it fits in [`KeyText::INLINE`]
/// bytes (`{192.0.2.7}:per-second` does: an IPv4 address and a name of up to 46 bytes), so
/// that most requests' keys cost no allocation; in a `String` beyond. Only whole strings
/// and ASCII go in, so its bytes are always UTF-8.
#[derive(Clone)]
pub(crate) struct KeyText {
    len: usize,
    inline: [u8; KeyText::INLINE],
    spilled: Option<String>,
}

impl KeyText {
    /// The bytes a key holds on the stack.
    pub(crate) const INLINE: usize = 64;

    pub(crate) fn new() -> KeyText {
        KeyText {
            len: 0,
            inline: [0; KeyText::INLINE],
            spilled: None,
        }
    }

    pub(crate) fn push_str(&mut self, text: &str) {
        if !self.push_inline(text.as_bytes()) {
            self.spill().push_str(text);
        }
    }

    /// Appends ASCII bytes (digits, dots); anything else is not appended.
    fn push_ascii(&mut self, ascii: &[u8]) {
        if ascii.is_ascii() && !self.push_inline(ascii) {
            self.spill().extend(ascii.iter().map(|&b| char::from(b)));
        }
    }

    /// Appends `bytes` on the stack if they fit there and nothing has spilled.
    fn push_inline(&mut self, bytes: &[u8]) -> bool {
        if self.spilled.is_some() {
            return false;
        }
        let end = self.len + bytes.len();
        match self.inline.get_mut(self.len..end) {
            Some(room) => {
                room.copy_from_slice(bytes);
                self.len = end;
                true
            }
            None => false,
        }
    }

    /// The key in a `String` from now on (the stack's bytes copied once, at the first
    /// spill).
    fn spill(&mut self) -> &mut String {
        let inline = &self.inline[..self.len];
        self.spilled.get_or_insert_with(|| {
            let mut spilled = String::with_capacity(2 * KeyText::INLINE);
            spilled.push_str(std::str::from_utf8(inline).unwrap_or_default());
            spilled
        })
    }

    pub(crate) fn as_str(&self) -> &str {
        match &self.spilled {
            Some(spilled) => spilled,
            // UTF-8 by construction (never the empty fallback).
            None => std::str::from_utf8(&self.inline[..self.len]).unwrap_or_default(),
        }
    }

    pub(crate) fn into_string(self) -> String {
        match self.spilled {
            Some(spilled) => spilled,
            None => self.as_str().to_string(),
        }
    }
}

impl fmt::Write for KeyText {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.push_str(text);
        Ok(())
    }
}

/// Which header trusted proxies name the client in (see [`Key::trust_proxies`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forwarded {
    /// `X-Forwarded-For: client, proxy1, proxy2`, which most load balancers append to
    /// (nginx's `$proxy_add_x_forwarded_for`, AWS and Google Cloud load balancers).
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

/// Reads the key a limit counts a request under.
///
/// ```
/// use paceline_tower::Key;
/// let by_ip = Key::peer_ip().trust_proxies(["10.0.0.0/8"])?;
/// let by_api_key = Key::header("x-api-key");
/// let everyone = Key::constant("global");
/// # Ok::<(), paceline_tower::InputError>(())
/// ```
#[derive(Clone)]
pub struct Key {
    kind: Kind,
    describe: Arc<str>,
    /// Why this key can never be read (an invalid header name): the layer's `build` says so.
    invalid: Option<Arc<str>>,
}

#[derive(Clone)]
enum Kind {
    /// The peer address, or, from a trusted proxy, the client it names in `via`.
    Peer {
        trusted: Arc<[IpNet]>,
        via: Forwarded,
    },
    Other(Arc<Extract>),
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.describe)
    }
}

impl Key {
    fn other(describe: impl Into<Arc<str>>, extract: Arc<Extract>) -> Key {
        Key {
            kind: Kind::Other(extract),
            describe: describe.into(),
            invalid: None,
        }
    }

    /// The connection's peer IP address: axum's `ConnectInfo<SocketAddr>` (serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`, feature `axum`), or a
    /// [`SocketAddr`] a server put in the request's extensions. A request without either is
    /// answered `500` (the service is set up wrong). Behind proxies, see
    /// [`trust_proxies`](Key::trust_proxies). IPv4 peers of a dual-stack listener
    /// (`::ffff:192.0.2.1`) count as their IPv4 address.
    pub fn peer_ip() -> Key {
        Key {
            kind: Kind::Peer {
                trusted: Arc::from(Vec::new()),
                via: Forwarded::XForwardedFor,
            },
            describe: "peer IP".into(),
            invalid: None,
        }
    }

    /// For [`peer_ip`](Key::peer_ip): when the peer is one of `proxies` (CIDR blocks such as
    /// `"10.0.0.0/8"`, or single addresses), the client is the address the proxies name in
    /// `X-Forwarded-For` (or `Forwarded`, see [`via`](Key::via)): the last one that is not
    /// itself a trusted proxy, so that a client cannot pass for another by sending the
    /// header itself. Only that one header is read, never the other, which a proxy would
    /// pass through from the client unchecked. Errors: a block that does not parse (naming
    /// `trusted_proxies`); a key other than `peer_ip`.
    pub fn trust_proxies<I, S>(self, proxies: I) -> Result<Key, InputError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let Kind::Peer { via, .. } = self.kind else {
            return Err(InputError::new(
                "trusted_proxies",
                "applies to Key::peer_ip() only",
            ));
        };
        let nets: Vec<IpNet> = proxies
            .into_iter()
            .map(|p| {
                let text = p.as_ref().trim();
                text.parse::<IpNet>()
                    .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        InputError::new(
                            "trusted_proxies",
                            format!("`{text}` is neither an IP address nor a CIDR block such as 10.0.0.0/8"),
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Key {
            kind: Kind::Peer {
                trusted: nets.into(),
                via,
            },
            ..self
        })
    }

    /// For [`peer_ip`](Key::peer_ip) behind trusted proxies: the header they name the
    /// client in (default [`Forwarded::XForwardedFor`]).
    pub fn via(self, header: Forwarded) -> Key {
        match self.kind {
            Kind::Peer { trusted, .. } => Key {
                kind: Kind::Peer {
                    trusted,
                    via: header,
                },
                ..self
            },
            Kind::Other(_) => self,
        }
    }

    /// The value of header `name`; a request without it is answered `400` (it must send
    /// it, e.g. an API key). A name that is no header name is refused when the layer is
    /// built.
    pub fn header(name: impl AsRef<str>) -> Key {
        let name = name.as_ref().to_ascii_lowercase();
        let describe: Arc<str> = format!("the `{name}` header").into();
        let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
            let mut key = Key::other(describe, Arc::new(|_, _| unreachable_key()));
            key.invalid = Some(format!("`{name}` is not a header name").into());
            return key;
        };
        let what = Arc::clone(&describe);
        Key::other(
            describe,
            Arc::new(move |head, out| {
                let value = head
                    .headers
                    .get(&header)
                    .and_then(|v| v.to_str().ok())
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| MissingKey {
                        request_fault: true,
                        what: format!("{what}, which this endpoint's limits count requests by"),
                    })?;
                out.push_str(value);
                Ok(())
            }),
        )
    }

    /// A value of type `T` in the request's extensions, e.g. the user an authentication
    /// layer put there, read by `key`; a request without one is answered `400`.
    pub fn extension<T, F>(key: F) -> Key
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> String + Send + Sync + 'static,
    {
        let describe: Arc<str> = format!("a `{}` extension", std::any::type_name::<T>()).into();
        let what = Arc::clone(&describe);
        Key::other(
            describe,
            Arc::new(move |head, out| {
                let value = head.extensions.get::<T>().ok_or_else(|| MissingKey {
                    request_fault: true,
                    what: format!("{what} (the authenticated caller)"),
                })?;
                out.push_str(&key(value));
                Ok(())
            }),
        )
    }

    /// The same key for every request: one limit for the whole service.
    pub fn constant(key: impl Into<String>) -> Key {
        let key: String = key.into();
        Key::other(
            format!("`{key}`"),
            Arc::new(move |_, out| {
                out.push_str(&key);
                Ok(())
            }),
        )
    }

    /// A key of the caller's own: `key` reads it from the request's head, `None` meaning
    /// the request has none (it is answered `400`).
    pub fn from_fn<F>(key: F) -> Key
    where
        F: Fn(&Head<'_>) -> Option<String> + Send + Sync + 'static,
    {
        Key::other(
            "a key function",
            Arc::new(move |head, out| {
                let value = key(head).ok_or_else(|| MissingKey {
                    request_fault: true,
                    what: "the key this endpoint's limits count requests by".into(),
                })?;
                out.push_str(&value);
                Ok(())
            }),
        )
    }

    /// The key of a request.
    pub fn read(&self, head: &Head<'_>) -> Result<String, MissingKey> {
        let mut key = KeyText::new();
        self.read_into(head, &mut key)?;
        Ok(key.into_string())
    }

    /// Appends the key of a request to `out` (the layer builds its store keys this way,
    /// with no string of the key's own).
    pub(crate) fn read_into(&self, head: &Head<'_>, out: &mut KeyText) -> Result<(), MissingKey> {
        match &self.kind {
            Kind::Peer { trusted, via } => {
                let ip = peer(head.extensions).ok_or_else(no_peer)?;
                push_ip(out, forwarded_client(ip, head.headers, trusted, *via));
            }
            Kind::Other(extract) => extract(head, out)?,
        }
        Ok(())
    }

    /// The proxies trusted by a [`peer_ip`](Key::peer_ip) key.
    pub fn trusted_proxies(&self) -> &[IpNet] {
        match &self.kind {
            Kind::Peer { trusted, .. } => trusted,
            Kind::Other(_) => &[],
        }
    }

    /// Why this key can never be read, if so.
    pub(crate) fn invalid(&self) -> Option<&str> {
        self.invalid.as_deref()
    }
}

/// The answer of a key that can never be read (the layer refuses to build with it).
fn unreachable_key() -> Result<(), MissingKey> {
    Err(MissingKey {
        request_fault: false,
        what: "a key whose header name is invalid".into(),
    })
}

/// Appends `ip` as `Display` writes it; IPv4 (the common case) without the formatting
/// machinery, each octet's digits taken from a table.
fn push_ip(out: &mut KeyText, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            // At most `255.255.255.255`; each octet's entry is its digits then a dot, and
            // the next octet starts right after the digits' dot (the last dot is dropped).
            let mut text = [0u8; 16];
            let mut len = 0;
            for octet in v4.octets() {
                let (digits, entry) = OCTETS[usize::from(octet)];
                text[len..len + 4].copy_from_slice(&entry);
                len += usize::from(digits) + 1;
            }
            out.push_ascii(&text[..len - 1]);
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// Each octet's count of decimal digits, and the digits followed by a dot (padded to four
/// bytes): five bytes an octet, 1,280 in all.
const OCTETS: [(u8, [u8; 4]); 256] = {
    let mut table = [(0, [0u8; 4]); 256];
    let mut n = 0;
    while n < 256 {
        let (hundreds, tens, ones) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        table[n] = if n >= 100 {
            (3, [b'0' + hundreds, b'0' + tens, b'0' + ones, b'.'])
        } else if n >= 10 {
            (2, [b'0' + tens, b'0' + ones, b'.', 0])
        } else {
            (1, [b'0' + ones, b'.', 0, 0])
        };
        n += 1;
    }
    table
};

fn no_peer() -> MissingKey {
    MissingKey {
        request_fault: false,
        what: "the peer address: serve the app with into_make_service_with_connect_info::<SocketAddr>() \
               (axum), or put the connection's SocketAddr in each request's extensions"
            .into(),
    }
}

/// The peer address in `extensions`: axum's `ConnectInfo`, or a plain `SocketAddr`.
fn peer(extensions: &Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip().to_canonical());
    }
    extensions
        .get::<SocketAddr>()
        .map(|addr| addr.ip().to_canonical())
}

/// The client behind `peer`: while the address at hand is a trusted proxy, step back one
/// hop through the header `via` names, from the last.
fn forwarded_client(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
    via: Forwarded,
) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops = match via {
        Forwarded::XForwardedFor => x_forwarded_for(headers),
        Forwarded::Forwarded => forwarded(headers),
    };
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Some(ip) = hop else {
            // An entry that is no address (`unknown`, an obfuscated name): stop at the
            // last address known.
            return client;
        };
        client = *ip;
        if !is_trusted(ip) {
            return client;
        }
    }
    client
}

/// The addresses `Forwarded`'s `for=` parameters list, first (the client's side) to last;
/// `None` for an entry that is no address.
fn forwarded(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all(http::header::FORWARDED)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        // An element without `for=` (a proxy saying only `proto=`) names nobody.
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_node(value.trim().trim_matches('"')))
            })
        })
        .collect()
}

/// The addresses `X-Forwarded-For` lists, first to last.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        // An empty entry (a trailing comma) names nobody.
        .filter(|entry| !entry.is_empty())
        .map(parse_node)
        .collect()
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:4711`, `[2001:db8::1]:4711` or
/// `2001:db8::1`.
fn parse_node(text: &str) -> Option<IpAddr> {
    let ip = if let Ok(ip) = text.parse::<IpAddr>() {
        ip
    } else if let Ok(addr) = text.parse::<SocketAddr>() {
        addr.ip()
    } else {
        text.strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
            .and_then(|(ip, _)| ip.parse().ok())?
    };
    Some(ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_with<'a>(headers: &'a HeaderMap, extensions: &'a Extensions, uri: &'a Uri) -> Head<'a> {
        Head {
            method: &Method::GET,
            uri,
            headers,
            extensions,
        }
    }

    fn peer_at(addr: &str) -> Extensions {
        let mut e = Extensions::new();
        e.insert(addr.parse::<SocketAddr>().unwrap());
        e
    }

    #[test]
    fn a_key_on_the_stack_reads_as_the_same_text_as_a_string_and_spills_past_its_room() {
        // Every IPv4 digit count, and IPv6, written as `Display` writes them.
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.100.9",
            "192.0.2.7",
            "1.22.133.4",
            "2001:db8::1",
            "::ffff:1.2.3.4",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut key = KeyText::new();
            push_ip(&mut key, ip);
            assert_eq!(key.as_str(), ip.to_string());
        }
        // Every octet in every position (the table behind IPv4).
        for n in 0..=255u8 {
            let ip = IpAddr::from([n, 255 - n, n ^ 0xa5, n.wrapping_mul(7)]);
            let mut key = KeyText::new();
            push_ip(&mut key, ip);
            assert_eq!(key.as_str(), ip.to_string());
        }
        // Pieces that cross the inline room, a multi-byte character among them: the same
        // text as one `String` built the same way.
        let mut key = KeyText::new();
        let mut expected = String::new();
        for piece in ["{", "é", &"k".repeat(KeyText::INLINE - 3), "ü", "}:name"] {
            key.push_str(piece);
            expected.push_str(piece);
            assert_eq!(key.as_str(), expected);
        }
        assert!(expected.len() > KeyText::INLINE);
        assert_eq!(key.clone().into_string(), expected);
        // Digits that no longer fit spill too, in order.
        let mut key = KeyText::new();
        key.push_str(&"k".repeat(KeyText::INLINE - 4));
        push_ip(&mut key, "192.0.2.7".parse().unwrap());
        key.push_str("}:n");
        assert_eq!(
            key.as_str(),
            format!("{}192.0.2.7}}:n", "k".repeat(KeyText::INLINE - 4))
        );
    }

    #[test]
    fn a_trusted_proxy_names_the_client_and_an_untrusted_peer_is_the_client() {
        let xff = Key::peer_ip()
            .trust_proxies(["10.0.0.0/8", "192.168.1.1"])
            .unwrap();
        let rfc = xff.clone().via(Forwarded::Forwarded);
        let uri = Uri::from_static("/");
        let read_with = |key: &Key, peer: &str, headers: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    value.parse().unwrap(),
                );
            }
            let extensions = peer_at(peer);
            key.read(&head_with(&map, &extensions, &uri)).unwrap()
        };
        let read = |peer: &str, headers: &[(&str, &str)]| read_with(&xff, peer, headers);
        // Not behind a trusted proxy: the peer, whatever it claims.
        assert_eq!(
            read("203.0.113.9:5000", &[("x-forwarded-for", "1.2.3.4")]),
            "203.0.113.9"
        );
        // The last untrusted hop: a client cannot pass for 6.6.6.6 by sending it.
        assert_eq!(
            read(
                "10.1.2.3:80",
                &[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.9.9.9")]
            ),
            "198.51.100.7"
        );
        // `Forwarded`, when chosen, with ports, quotes and IPv6; X-Forwarded-For is then
        // not read, and the other way round: a client's own header of the other kind,
        // passed through by the proxy, changes nothing.
        let both = [
            (
                "forwarded",
                "for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https",
            ),
            ("x-forwarded-for", "7.7.7.7"),
        ];
        assert_eq!(read_with(&rfc, "192.168.1.1:80", &both), "2001:db8::1");
        assert_eq!(read("192.168.1.1:80", &both), "7.7.7.7");
        assert_eq!(
            read("10.0.0.1:80", &[("forwarded", "for=5.5.5.5")]),
            "10.0.0.1",
            "a spoofed Forwarded is not read"
        );
        // An obfuscated hop ends the walk at the last address known.
        assert_eq!(
            read_with(&rfc, "10.0.0.1:80", &[("forwarded", "for=_hidden")]),
            "10.0.0.1"
        );
        // Only proxies all the way: the first listed.
        assert_eq!(
            read("10.0.0.1:80", &[("x-forwarded-for", "10.0.0.2")]),
            "10.0.0.2"
        );
        // A dual-stack listener's IPv4 peers are their IPv4 addresses, trusted or not.
        assert_eq!(
            read(
                "[::ffff:10.0.0.1]:80",
                &[("x-forwarded-for", "::ffff:198.51.100.7")]
            ),
            "198.51.100.7"
        );
    }

    #[test]
    fn keys_say_what_is_missing_and_whose_fault_it_is() {
        let (headers, none, uri) = (HeaderMap::new(), Extensions::new(), Uri::from_static("/"));
        let head = head_with(&headers, &none, &uri);
        let peer = Key::peer_ip().read(&head).unwrap_err();
        assert!(!peer.request_fault && peer.what.contains("connect_info"));
        let header = Key::header("X-Api-Key").read(&head).unwrap_err();
        assert!(header.request_fault && header.what.contains("`x-api-key`"));
        #[derive(Clone)]
        struct User(u32);
        let user = Key::extension(|u: &User| format!("user:{}", u.0));
        assert!(user.read(&head).unwrap_err().request_fault);
        let mut with_user = Extensions::new();
        with_user.insert(User(7));
        assert_eq!(
            user.read(&head_with(&headers, &with_user, &uri)).unwrap(),
            "user:7"
        );
        assert_eq!(Key::constant("all").read(&head).unwrap(), "all");
        let path = Key::from_fn(|h| h.uri.path().strip_prefix("/t/").map(str::to_string));
        let tenant_uri = Uri::from_static("/t/acme");
        assert_eq!(
            path.read(&head_with(&headers, &none, &tenant_uri)).unwrap(),
            "acme"
        );
        assert!(path.read(&head).is_err());
        assert_eq!(
            Key::peer_ip()
                .trust_proxies(["10.0.0.0/33"])
                .unwrap_err()
                .field(),
            "trusted_proxies"
        );
        assert!(Key::header("a").trust_proxies(["10.0.0.0/8"]).is_err());
        assert!(Key::header("bad name").invalid().is_some());
        assert!(Key::header("x-api-key").invalid().is_none());
    }
}
