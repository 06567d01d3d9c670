//! The table in Redis: the calls of `lua/policies.lua` over the store's function host,
//! their arguments and their replies.

use std::sync::LazyLock;

use paceline_store::redis::{error_code, FunctionHost, Library};
use paceline_store::StoreError;

use super::{full, MAX_POLICIES};
use crate::error::{ApiError, ErrorCode};

static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    Library::new(
        "policies",
        include_str!("../../lua/policies.lua"),
        "policies_call",
    )
});

/// Who answers, in protocol errors.
const FUNCTION: &str = "the run-time policies' Redis function";

/// The table in one Redis (or Cluster: both keys share a hash tag).
pub(super) struct Table {
    host: FunctionHost,
    /// `PREFIX{policies}:`, the start of both keys.
    base: String,
}

impl Table {
    pub(super) fn new(host: FunctionHost) -> Table {
        let base = format!("{}{{policies}}:", host.key_prefix());
        Table { host, base }
    }

    /// Sets `name` to `entry`; the entry before, if any.
    pub(super) async fn put(&self, name: &str, entry: &str) -> Result<Option<Vec<u8>>, ApiError> {
        let max = MAX_POLICIES.to_string();
        let args = [
            &b"put"[..],
            name.as_bytes(),
            entry.as_bytes(),
            max.as_bytes(),
        ];
        let reply = self.host.call(&LIBRARY, &[&self.base], args).await;
        let reply = reply.map_err(|e| match error_code(&e) {
            Some("PACELINE_POLICIES_FULL") => full(),
            _ => unavailable(&e),
        })?;
        let mut r = reply.reader(FUNCTION).map_err(|e| unavailable(&e))?;
        r.int().map_err(|e| unavailable(&e))?;
        let previous = r.bytes().map_err(|e| unavailable(&e))?;
        Ok((!previous.is_empty()).then_some(previous))
    }

    /// Removes `name`; the entry it had, if any.
    pub(super) async fn delete(&self, name: &str) -> Result<Option<Vec<u8>>, ApiError> {
        let args = [&b"delete"[..], name.as_bytes()];
        let reply = self.host.call(&LIBRARY, &[&self.base], args).await;
        let mut r = reply
            .and_then(|reply| reply.reader(FUNCTION))
            .map_err(|e| unavailable(&e))?;
        r.int().map_err(|e| unavailable(&e))?;
        let previous = r.bytes().map_err(|e| unavailable(&e))?;
        Ok((!previous.is_empty()).then_some(previous))
    }

    /// The table's version and entries, unless its version is `known` (then `None`).
    pub(super) async fn read(
        &self,
        known: Option<i64>,
    ) -> Result<Option<(i64, Vec<(String, Vec<u8>)>)>, ApiError> {
        let text = known.map(|v| v.to_string()).unwrap_or_default();
        let args = [&b"read"[..], text.as_bytes()];
        let reply = self.host.call(&LIBRARY, &[&self.base], args).await;
        let mut r = reply
            .and_then(|reply| reply.reader(FUNCTION))
            .map_err(|e| unavailable(&e))?;
        let version = r.int().map_err(|e| unavailable(&e))?;
        if known == Some(version) {
            return Ok(None);
        }
        let mut entries = Vec::new();
        while !r.is_empty() {
            let name = r.text().map_err(|e| unavailable(&e))?;
            let entry = r.bytes().map_err(|e| unavailable(&e))?;
            entries.push((name, entry));
        }
        Ok(Some((version, entries)))
    }
}

/// `503 store_unavailable`: Redis failed the call (or answered out of step).
fn unavailable(e: &StoreError) -> ApiError {
    ApiError::new(
        ErrorCode::StoreUnavailable,
        "store",
        format!(
            "the policies set at run time are kept in Redis, which failed: {}",
            e.message()
        ),
    )
}
