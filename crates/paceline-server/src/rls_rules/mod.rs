//! Envoy's rate limit rules in force: envoyproxy/ratelimit's YAML read and checked
//! ([`config`]), what applies to each descriptor of a request ([`matching`]), and the rules
//! the service holds now, replaced by a reload ([`RlsState`]). Pure: no store, no request
//! handling (that is [`rls`](crate::rls), which answers with these; the public names are
//! its).

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

pub(crate) mod config;
pub(crate) mod matching;

use config::{RlsConfig, RlsConfigError};

/// The RLS rules in force and how to answer.
pub(crate) struct RlsState {
    /// The file or folder the rules come from (read again on a reload).
    pub(crate) path: PathBuf,
    /// The rules now.
    config: RwLock<Arc<RlsConfig>>,
    /// Add `RateLimit-Policy` and `RateLimit` to the answers' `response_headers_to_add`.
    pub(crate) response_headers: bool,
}

impl RlsState {
    /// Loads the rules of `path` (see [`load`]).
    pub(crate) fn load(path: &Path, response_headers: bool) -> Result<RlsState, RlsConfigError> {
        Ok(RlsState {
            path: path.to_path_buf(),
            config: RwLock::new(Arc::new(load(path)?)),
            response_headers,
        })
    }

    /// The rules now: a request is decided whole under one version.
    pub(crate) fn config(&self) -> Arc<RlsConfig> {
        Arc::clone(&self.config.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Reads the rules again; a file that does not load leaves the rules as they are.
    /// Counters stay: an unchanged rule counts under the same keys.
    pub(crate) fn reload(&self) -> Result<String, RlsConfigError> {
        let next = load(&self.path)?;
        let domains = next.domains().count();
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
        Ok(format!(
            "{domains} RLS domains loaded from {}",
            self.path.display()
        ))
    }
}

/// Reads `path` (a file or a folder of them).
pub fn load(path: &Path) -> Result<RlsConfig, RlsConfigError> {
    RlsConfig::load(path)
}
