//! Concurrency leases' tokens: how a lease travels to the client and back.
//!
//! A lease token is `ID.NAMESPACE.KEY.TAG`: the lease's id on its key, then the policy's
//! namespace (its configured name, or `~SPEC` for an inline spec) and the key, both
//! hex-encoded, so that any instance sharing the store finds the key and its policy again
//! from the token alone, and last a 128-bit tag of all three under the store's secret key
//! ([`paceline_store::secret`]; in Redis, one key shared by every instance). The id is no
//! secret (ids count up from the time, and a `429`'s `Retry-After` tells when the oldest
//! lease ends), but without the tag it is useless: only the client the service answered
//! can give back or extend a lease. `POST /v1/decisions` with a `concurrency` policy takes
//! a lease too, and answers its token as `lease`.

use paceline_store::secret::{from_hex, to_hex, Tag, TokenKey, TAG_LEN};

use crate::error::{ApiError, ErrorCode};

/// What a concurrency lease's tag signs first: keeps it from passing as another kind.
const PURPOSE: &[u8] = b"paceline concurrency lease";

/// The tag of lease `id` of `key` under the policy of `namespace`.
fn tag(signer: &TokenKey, namespace: &str, key: &str, id: u64) -> Tag {
    signer.tag(&[
        PURPOSE,
        namespace.as_bytes(),
        key.as_bytes(),
        &id.to_be_bytes(),
    ])
}

/// The token of lease `id` of `key` under the policy of `namespace`, signed by `signer`.
pub(crate) fn token(signer: &TokenKey, namespace: &str, key: &str, id: u64) -> String {
    let mut text = String::with_capacity(24 + 2 * (namespace.len() + key.len() + TAG_LEN));
    text.push_str(itoa::Buffer::new().format(id));
    for part in [namespace.as_bytes(), key.as_bytes()] {
        text.push('.');
        text.push_str(&to_hex(part));
    }
    text.push('.');
    text.push_str(&to_hex(&tag(signer, namespace, key, id)));
    text
}

/// A token read back: the lease id, the policy's namespace and the key.
pub(crate) struct Token {
    pub(crate) id: u64,
    pub(crate) namespace: String,
    pub(crate) key: String,
}

/// The lease a token names, once its tag checks out: a well-formed token this service did
/// not sign is answered as an unknown lease, telling a guesser nothing.
pub(crate) fn parse(signer: &TokenKey, token: &str) -> Result<Token, ApiError> {
    let bad = || {
        ApiError::invalid(
            "lease",
            "is not a lease token of this service; use the `lease` a POST /v1/leases answered",
        )
    };
    let mut parts = token.split('.');
    let (Some(id), Some(namespace), Some(key), Some(signed), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(bad());
    };
    let mut given = [0u8; TAG_LEN];
    if !from_hex(signed, &mut given) {
        return Err(bad());
    }
    // The shape: a decimal id, then two hex parts. What does not have it is the request's
    // error; what has it but does not read back (an id past 2^64, bytes that are no UTF-8)
    // this service never signed, and is an unknown lease like any other such token.
    let unhex = |text: &str| -> Option<Vec<u8>> {
        let mut bytes = vec![0u8; text.len() / 2];
        (!text.is_empty() && from_hex(text, &mut bytes)).then_some(bytes)
    };
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let (Some(namespace), Some(key)) = (unhex(namespace), unhex(key)) else {
        return Err(bad());
    };
    let (Ok(id), Ok(namespace), Ok(key)) = (
        id.parse(),
        String::from_utf8(namespace),
        String::from_utf8(key),
    ) else {
        return Err(unknown_lease());
    };
    let token = Token { id, namespace, key };
    let parts: [&[u8]; 4] = [
        PURPOSE,
        token.namespace.as_bytes(),
        token.key.as_bytes(),
        &token.id.to_be_bytes(),
    ];
    if !signer.verify(&parts, &given) {
        return Err(unknown_lease());
    }
    Ok(token)
}

/// `404 unknown_lease`: no live lease of that token.
pub(crate) fn unknown_lease() -> ApiError {
    ApiError::new(
        ErrorCode::UnknownLease,
        "lease",
        "no such live lease: it was given back already, or reclaimed when it expired; take a new one",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn tokens_read_back_and_anything_else_is_refused() {
        let signer = TokenKey::random().expect("a key");
        for (namespace, key, id) in [
            ("db-slots", "tenant:42", 1_700_000_000_000_000),
            ("~concurrency:limit=2,lease=30s", "{t}.é\u{1}", 0),
        ] {
            let t = token(&signer, namespace, key, id);
            assert!(
                t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'),
                "{t}"
            );
            let back = parse(&signer, &t).unwrap_or_else(|e| panic!("{t}: {e:?}"));
            assert_eq!(
                (back.id, back.namespace.as_str(), back.key.as_str()),
                (id, namespace, key)
            );
        }
        let tag = "00112233445566778899aabbccddeeff";
        for bad in [
            "",
            "1",
            "1.61",
            "x.61.61",
            "1.6.61",
            "1.61.zz",
            "1.61.61.61",
            "1..61",
            "1.ff.61",
            &format!("+1.61.61.{tag}"),
            &format!("1.6.61.{tag}"),
            &format!("1.61..{tag}"),
            &format!("1.61.61.{tag}.61"),
            &format!("x.61.61.{tag}"),
            "1.61.61.0011",
        ] {
            let e = parse(&signer, bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} was read"));
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn a_token_another_key_signed_or_a_neighbour_id_is_an_unknown_lease() {
        let signer = TokenKey::random().expect("a key");
        let t = token(&signer, "db-slots", "tenant:42", 1_700_000_000_000_000);
        let elsewhere = token(
            &TokenKey::random().expect("a key"),
            "db-slots",
            "tenant:42",
            1_700_000_000_000_000,
        );
        let (id, rest) = t.split_once('.').expect("an id");
        let neighbours = [
            format!("{}.{rest}", 1_700_000_000_000_001u64),
            format!("{}.{rest}", 1_699_999_999_999_999u64),
        ];
        assert_eq!(id, "1700000000000000");
        // Of the right shape, but nothing this service could have signed: an id past 2^64,
        // a namespace or a key that is no UTF-8.
        let tag = "00112233445566778899aabbccddeeff";
        let unreadable = [
            format!("99999999999999999999.61.61.{tag}"),
            format!("1.ff.61.{tag}"),
            format!("1.61.c3.{tag}"),
        ];
        for forged in neighbours.iter().chain([&elsewhere]).chain(&unreadable) {
            let e = parse(&signer, forged)
                .err()
                .unwrap_or_else(|| panic!("{forged} was read"));
            assert_eq!(e.status(), StatusCode::NOT_FOUND, "{forged}");
        }
    }
}
