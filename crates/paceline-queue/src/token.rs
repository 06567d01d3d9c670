//! Lease tokens: what authorises a worker to ack, fail or extend the job it leased.
//!
//! A job's lease has two numbers. Its **fence** ([`Leased::lease`](crate::Leased::lease))
//! counts up across the queue, so a later lease of a job always has a larger one: use it
//! to fence writes downstream. It authorises nothing. Its **token** ([`LeaseToken`]) does:
//! 48 hex digits, a 128-bit tag of the queue, the job and the fence under the store's
//! secret key ([`Store::token_key`](paceline_store::Store::token_key)), then the fence
//! masked by a second tag, so that a token shows no structure. A client that does not hold
//! the lease cannot make its token, from the job's id, its fence, or any number of other
//! tokens; a guess succeeds once in 2^128 tries.
//!
//! A token is checked before the queue is asked anything, in constant time, and a token
//! that does not check out is answered as a lease that is no longer the job's
//! ([`QueueError::LeaseLost`](crate::QueueError::LeaseLost)): the answer tells a guesser
//! nothing about the job.

use paceline_store::secret::{from_hex, to_hex, Tag, TokenKey, TAG_LEN};

/// What a token signs, first: keeps a lease token from ever passing as another kind.
const PURPOSE: &[u8] = b"paceline queue lease";
/// What the fence's mask is the tag of, after the token's own tag.
const MASK: &[u8] = b"paceline queue lease fence";

/// The name of the store's key that signs lease tokens
/// ([`Store::token_key`](paceline_store::Store::token_key)).
pub const LEASE_KEY: &str = "queue-lease";

/// The length of a token's text: 16 bytes of tag and 8 of masked fence, in hex.
pub const TOKEN_LEN: usize = 2 * (TAG_LEN + 8);

/// The token of a job's lease, as a lease call hands it out: see the [module docs](self).
///
/// ```
/// use paceline_queue::LeaseToken;
/// let token: LeaseToken = "00112233445566778899aabbccddeeff0011223344556677".parse().unwrap();
/// assert_eq!(token.as_str().len(), 48);
/// assert!("46".parse::<LeaseToken>().is_err()); // not a token: too short
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// The token's text (48 hex digits).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for LeaseToken {
    /// Shows a token's first 8 digits only: a token in a log must not let its reader act
    /// on the job.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.0.get(..8).unwrap_or("");
        write!(f, "LeaseToken({shown}…)")
    }
}

impl std::fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A text that is not a lease token of this version: it names what a token looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotAToken;

impl std::fmt::Display for NotAToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "is not a lease token: a token is the {TOKEN_LEN} hex digits a lease call answered \
             as `lease` (the plain numbers that earlier versions answered are no longer accepted)"
        )
    }
}

impl std::error::Error for NotAToken {}

impl std::str::FromStr for LeaseToken {
    type Err = NotAToken;

    fn from_str(text: &str) -> Result<LeaseToken, NotAToken> {
        let mut bytes = [0u8; TAG_LEN + 8];
        if !from_hex(text, &mut bytes) {
            return Err(NotAToken);
        }
        Ok(LeaseToken(text.to_ascii_lowercase()))
    }
}

/// The parts a token's tag signs.
fn signed<'a>(queue: &'a str, id: &'a str, fence: &'a [u8; 8]) -> [&'a [u8]; 4] {
    [PURPOSE, queue.as_bytes(), id.as_bytes(), fence]
}

/// The mask of a fence under a token's tag.
fn mask(key: &TokenKey, tag: &Tag) -> [u8; 8] {
    let full = key.tag(&[MASK, tag]);
    let mut mask = [0u8; 8];
    mask.copy_from_slice(&full[..8]);
    mask
}

/// The token of job `id`'s lease `fence` in `queue`.
pub(crate) fn sign(key: &TokenKey, queue: &str, id: &str, fence: u64) -> LeaseToken {
    let fence_bytes = fence.to_be_bytes();
    let tag = key.tag(&signed(queue, id, &fence_bytes));
    let mask = mask(key, &tag);
    let mut bytes = [0u8; TAG_LEN + 8];
    bytes[..TAG_LEN].copy_from_slice(&tag);
    for (i, b) in fence_bytes.iter().enumerate() {
        bytes[TAG_LEN + i] = b ^ mask[i];
    }
    LeaseToken(to_hex(&bytes))
}

/// The fence `token` was signed for as job `id`'s lease in `queue`, or `None` when this
/// key did not sign it for that job.
pub(crate) fn open(key: &TokenKey, queue: &str, id: &str, token: &LeaseToken) -> Option<u64> {
    let mut bytes = [0u8; TAG_LEN + 8];
    if !from_hex(&token.0, &mut bytes) {
        return None;
    }
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&bytes[..TAG_LEN]);
    let mask = mask(key, &tag);
    let mut fence_bytes = [0u8; 8];
    for (i, b) in fence_bytes.iter_mut().enumerate() {
        *b = bytes[TAG_LEN + i] ^ mask[i];
    }
    key.verify(&signed(queue, id, &fence_bytes), &tag)
        .then(|| u64::from_be_bytes(fence_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> TokenKey {
        TokenKey::random().expect("a random key")
    }

    #[test]
    fn a_token_opens_to_its_fence_for_its_job_only() {
        let key = key();
        let token = sign(&key, "q", "job-1", 46);
        assert_eq!(token.as_str().len(), TOKEN_LEN);
        assert_eq!(open(&key, "q", "job-1", &token), Some(46));
        assert_eq!(open(&key, "q", "job-2", &token), None);
        assert_eq!(open(&key, "other", "job-1", &token), None);
        assert_eq!(
            open(&TokenKey::random().expect("key"), "q", "job-1", &token),
            None
        );
    }

    #[test]
    fn a_neighbour_of_a_token_does_not_open() {
        let key = key();
        let token = sign(&key, "q", "job-1", 46);
        let mut bytes = [0u8; TAG_LEN + 8];
        assert!(from_hex(token.as_str(), &mut bytes));
        // Every single-bit change of the token, in the tag or in the masked fence.
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut changed = bytes;
                changed[i] ^= 1 << bit;
                let guess = LeaseToken(to_hex(&changed));
                assert_eq!(open(&key, "q", "job-1", &guess), None, "byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn tokens_of_consecutive_fences_share_no_structure() {
        let key = key();
        let tokens: Vec<LeaseToken> = (1..=2_000).map(|f| sign(&key, "q", "j", f)).collect();
        // No two alike, and neighbours agree on about half their bits, as random ones do.
        let distinct: std::collections::HashSet<&str> =
            tokens.iter().map(LeaseToken::as_str).collect();
        assert_eq!(distinct.len(), tokens.len());
        let mut same_bits = 0u64;
        for pair in tokens.windows(2) {
            let (mut a, mut b) = ([0u8; TAG_LEN + 8], [0u8; TAG_LEN + 8]);
            assert!(from_hex(pair[0].as_str(), &mut a) && from_hex(pair[1].as_str(), &mut b));
            same_bits += a
                .iter()
                .zip(&b)
                .map(|(x, y)| u64::from((!(x ^ y)).count_ones()))
                .sum::<u64>();
        }
        let bits = (tokens.len() as u64 - 1) * 8 * (TAG_LEN as u64 + 8);
        let share = same_bits as f64 / bits as f64;
        assert!(
            (0.48..0.52).contains(&share),
            "neighbours share {share} of their bits"
        );
    }

    #[test]
    fn only_hex_of_the_right_length_parses() {
        let token = sign(&key(), "q", "j", 1);
        assert_eq!(token.as_str().parse::<LeaseToken>(), Ok(token.clone()));
        let upper = token.as_str().to_ascii_uppercase();
        assert_eq!(upper.parse::<LeaseToken>(), Ok(token.clone()));
        for bad in ["", "46", &token.as_str()[1..], &format!("{token}0"), "zz"] {
            assert_eq!(bad.parse::<LeaseToken>(), Err(NotAToken), "{bad}");
        }
        assert!(!format!("{token:?}").contains(&token.as_str()[8..]));
    }
}
