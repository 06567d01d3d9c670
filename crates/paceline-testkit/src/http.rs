//! Reading HTTP answers in tests: the `RateLimit` fields' items, and a whole response off a
//! socket.

/// The items of a `RateLimit` or `RateLimit-Policy` field of `headers`, parsed as an RFC
/// 8941 structured-field list: each item's name (a string) with its integer parameters,
/// in order. Panics, naming the field, on anything else: the test then fails saying why.
pub fn ratelimit_items(
    headers: &paceline_client::http::HeaderMap,
    field: &str,
) -> Vec<(String, Vec<(String, i64)>)> {
    let text = headers
        .get(field)
        .unwrap_or_else(|| panic!("no {field} header"))
        .to_str()
        .expect("ASCII");
    let list: sfv::List = sfv::Parser::new(text)
        .parse()
        .unwrap_or_else(|e| panic!("{field}: `{text}` is no structured-field list: {e}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{field}: an inner list in `{text}`");
            };
            let sfv::BareItem::String(name) = &item.bare_item else {
                panic!("{field}: a name that is no string in `{text}`");
            };
            let params = item
                .params
                .iter()
                .map(|(k, v)| {
                    let sfv::BareItem::Integer(n) = v else {
                        panic!("{field}: {k} is no integer in `{text}`");
                    };
                    (k.as_str().to_string(), i64::from(*n))
                })
                .collect();
            (name.as_str().to_string(), params)
        })
        .collect()
}

/// The parameter `name` of a [`ratelimit_items`] item.
pub fn param(params: &[(String, i64)], name: &str) -> i64 {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no `{name}` in {params:?}"))
}

/// One whole HTTP/1.1 response read from `stream`: its head and `Content-Length` bytes of
/// body, as text.
///
/// # Panics
///
/// When the stream ends or fails before the response is whole (the test's point is that it
/// does not), or the head has no `Content-Length`.
pub fn whole_response(stream: &mut impl std::io::Read) -> String {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().expect("a length"))
                })
                .expect("a content-length");
            if body.len() >= length {
                return text;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) => panic!("closed without a whole answer, after: {text:?}"),
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("{e} without a whole answer, after: {text:?}"),
        }
    }
}
