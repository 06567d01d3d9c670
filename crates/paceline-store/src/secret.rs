//! Signed tokens: a token that authorises an action (a job's lease, a concurrency lease)
//! carries a tag that only holders of the store's secret can make.
//!
//! A [`TokenKey`] is a 256-bit secret drawn from the operating system's cryptographic
//! random source ([`Store::token_key`](crate::Store::token_key) hands out the store's: in
//! Redis one secret shared by every process that opens the same Redis, in memory one per
//! process). [`TokenKey::tag`] is the first 128 bits of HMAC-SHA-256 over the token's
//! parts, each length-prefixed so that no two lists of parts sign alike. A client that
//! knows any number of tags learns nothing that lets it make another: guessing one takes
//! 2^128 tries on average, and a neighbour's token (one more, one less) is no easier.
//!
//! ```
//! use paceline_store::secret::TokenKey;
//! let key = TokenKey::random().unwrap();
//! let tag = key.tag(&[b"queue-lease", b"emails", b"job-1", &7u64.to_be_bytes()]);
//! assert!(key.verify(&[b"queue-lease", b"emails", b"job-1", &7u64.to_be_bytes()], &tag));
//! assert!(!key.verify(&[b"queue-lease", b"emails", b"job-1", &8u64.to_be_bytes()], &tag));
//! // Another key's tag over the same parts does not verify.
//! let other = TokenKey::random().unwrap();
//! assert!(!other.verify(&[b"queue-lease", b"emails", b"job-1", &7u64.to_be_bytes()], &tag));
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use paceline_core::{StoreError, StoreErrorKind};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The length of a secret, in bytes.
pub const SECRET_LEN: usize = 32;

/// The length of a tag, in bytes (128 bits).
pub const TAG_LEN: usize = 16;

/// A tag: what a token carries to prove the service made it.
pub type Tag = [u8; TAG_LEN];

/// A secret key that signs tokens (see the [module docs](self)). Its `Debug` never shows
/// the secret.
#[derive(Clone)]
pub struct TokenKey {
    key: hmac::Key,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key of these secret bytes.
    pub fn new(secret: &[u8; SECRET_LEN]) -> TokenKey {
        TokenKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// A key drawn from the operating system's cryptographic random source.
    pub fn random() -> Result<TokenKey, StoreError> {
        Ok(TokenKey::new(&random_secret()?))
    }

    /// The tag of `parts` (each length-prefixed, so `["ab", "c"]` and `["a", "bc"]` differ).
    pub fn tag(&self, parts: &[&[u8]]) -> Tag {
        let mut context = hmac::Context::with_key(&self.key);
        for part in parts {
            context.update(&(part.len() as u64).to_be_bytes());
            context.update(part);
        }
        let full = context.sign();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full.as_ref()[..TAG_LEN]);
        tag
    }

    /// Whether `tag` is the tag of `parts`, compared in constant time.
    pub fn verify(&self, parts: &[&[u8]], tag: &Tag) -> bool {
        let expected = self.tag(parts);
        // Every byte is compared whatever the first difference: the time taken tells
        // nothing about how much of a guess was right.
        expected
            .iter()
            .zip(tag.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// 32 bytes from the operating system's cryptographic random source.
pub(crate) fn random_secret() -> Result<[u8; SECRET_LEN], StoreError> {
    let mut secret = [0u8; SECRET_LEN];
    SystemRandom::new().fill(&mut secret).map_err(|_| {
        StoreError::new(
            StoreErrorKind::Unavailable,
            "the operating system's random source failed; tokens cannot be signed",
        )
    })?;
    Ok(secret)
}

/// This process's key named `name`: drawn when first asked, then the same for the
/// process's life (the key of a store that no other process shares).
pub(crate) fn process_key(name: &str) -> Result<TokenKey, StoreError> {
    static KEYS: OnceLock<Mutex<HashMap<String, TokenKey>>> = OnceLock::new();
    let mut keys = KEYS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(key) = keys.get(name) {
        return Ok(key.clone());
    }
    let key = TokenKey::random()?;
    keys.insert(name.to_string(), key.clone());
    Ok(key)
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(2 * bytes.len());
    for byte in bytes {
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 15)]));
    }
    text
}

/// The bytes of hex `text` (either case) into `out`; false if `text` is not exactly
/// `2 * out.len()` hex digits.
pub fn from_hex(text: &str, out: &mut [u8]) -> bool {
    let digits = text.as_bytes();
    if digits.len() != 2 * out.len() {
        return false;
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    };
    for (i, byte) in out.iter_mut().enumerate() {
        match (value(digits[2 * i]), value(digits[2 * i + 1])) {
            (Some(high), Some(low)) => *byte = high << 4 | low,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes = [0u8, 1, 0xab, 0xff];
        let text = to_hex(&bytes);
        assert_eq!(text, "0001abff");
        let mut back = [0u8; 4];
        assert!(from_hex(&text, &mut back));
        assert_eq!(back, bytes);
        assert!(from_hex("0001ABFF", &mut back));
        for bad in ["0001abf", "0001abfff", "0001abfg", "", "é001abff"] {
            assert!(!from_hex(bad, &mut back), "{bad}");
        }
    }

    #[test]
    fn parts_are_length_prefixed() {
        let key = TokenKey::random().expect("random");
        assert_ne!(key.tag(&[b"ab", b"c"]), key.tag(&[b"a", b"bc"]));
        assert_ne!(key.tag(&[b"abc"]), key.tag(&[b"abc", b""]));
    }

    #[test]
    fn a_process_key_is_the_same_each_time_and_differs_by_name() {
        let a = process_key("test-a").expect("key");
        let again = process_key("test-a").expect("key");
        let b = process_key("test-b").expect("key");
        assert_eq!(a.tag(&[b"x"]), again.tag(&[b"x"]));
        assert_ne!(a.tag(&[b"x"]), b.tag(&[b"x"]));
    }
}
