//! Policies managed at run time (`PUT` and `DELETE /v1/policies/{name}`): a table of named
//! policies laid over the config file's, kept where the store keeps its state.
//!
//! * **Memory store**: the table lives in this process; a change applies at once.
//! * **Redis store** (or Cluster): the table lives in Redis, under the store's prefix
//!   (`PREFIX{policies}:map`, a hash, and `PREFIX{policies}:version`, raised by every
//!   change), written by the Lua library `lua/policies.lua` over the store's function
//!   host. The instance that makes a change applies it at once; every other instance polls
//!   the version every [`POLL`] and reads the table again when it moved (and reads it whole
//!   every [`FULL_READ_EVERY`] polls anyway, in case Redis lost it), so a change applies
//!   everywhere within a second.
//!
//! The config file gives the defaults: an entry of this table overrides the file's policy
//! of the same name until it is deleted, and a reload of the file keeps the table.
//!
//! ```text
//! PUT /v1/policies/search {"spec": "gcra:rate=10/s,burst=5"}
//!     -> table: {"search": Entry { policy: gcra:rate=10/s,burst=5, shadow: false }}
//!     -> the live configuration: the file's policies, `search` replaced (or added)
//! ```

mod redis;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use paceline_store::{Policy, SharedStore};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorCode};

/// The most policies the table holds (each one is a metrics label and a configuration
/// entry on every instance).
pub(crate) const MAX_POLICIES: usize = 1_000;

/// How often an instance on a shared store asks whether the table changed.
pub(crate) const POLL: Duration = Duration::from_millis(500);

/// Every this many polls, the table is read whole whatever its version says.
pub(crate) const FULL_READ_EVERY: u32 = 20;

/// One policy of the table: the policy, and whether it is in shadow mode.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    pub(crate) policy: Policy,
    pub(crate) shadow: bool,
}

/// An entry as the table stores it: the canonical spec, and `shadow`.
#[derive(Serialize, Deserialize)]
struct Stored {
    spec: String,
    #[serde(default)]
    shadow: bool,
}

impl Entry {
    /// The entry as the table stores it: `{"spec":"gcra:rate=10/s,burst=5","shadow":false}`.
    fn encode(&self) -> String {
        let stored = Stored {
            spec: self.policy.to_string(),
            shadow: self.shadow,
        };
        serde_json::to_string(&stored).unwrap_or_default()
    }

    /// An entry read back from the table; what does not read (written by a later version
    /// of paceline, or by hand) is an error saying why.
    fn decode(bytes: &[u8]) -> Result<Entry, String> {
        let stored: Stored = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let policy = stored.spec.parse().map_err(|e| format!("{e}"))?;
        Ok(Entry {
            policy,
            shadow: stored.shadow,
        })
    }
}

/// The table: policy name → entry.
pub(crate) type Entries = BTreeMap<String, Entry>;

/// A change of the table seen from here: a name, its entry before (`None`: new) and after
/// (`None`: deleted).
pub(crate) type Change = (String, Option<Entry>, Option<Entry>);

/// The table as this instance knows it: its version and its entries, and which read they
/// came from.
struct Known {
    version: Option<i64>,
    entries: Arc<Entries>,
    /// The number of the read applied last (reads are numbered as they start).
    read: u64,
}

/// The policies managed at run time: see the [module docs](self).
pub(crate) struct RuntimePolicies {
    known: RwLock<Known>,
    /// The number the next read from Redis takes.
    reads: AtomicU64,
    /// Where the table is shared, if the store keeps its state in Redis.
    redis: Option<redis::Table>,
}

impl RuntimePolicies {
    /// The table of `store`: in Redis if the store keeps its state there (read once now; if
    /// Redis does not answer, the table starts empty here and the polls read it later),
    /// else in this process.
    pub(crate) async fn open(store: &SharedStore) -> RuntimePolicies {
        let table = RuntimePolicies {
            known: RwLock::new(Known {
                version: None,
                entries: Arc::new(Entries::new()),
                read: 0,
            }),
            reads: AtomicU64::new(1),
            redis: store.functions().map(redis::Table::new),
        };
        if table.redis.is_some() {
            if let Err(e) = table.refresh(true).await {
                tracing::warn!(
                    target: "paceline",
                    "the policies managed at run time could not be read from Redis: {}; \
                     the config file's apply until they can",
                    e.message()
                );
            }
        }
        table
    }

    /// Whether the table is shared with other instances (kept in Redis).
    pub(crate) fn is_shared(&self) -> bool {
        self.redis.is_some()
    }

    /// The entries as this instance knows them.
    pub(crate) fn entries(&self) -> Arc<Entries> {
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&known.entries)
    }

    /// Sets `name` to `entry`; the entry it had before, if any. Refused when `name` is new
    /// and the table holds [`MAX_POLICIES`] (`409 conflict`), or when the store fails.
    pub(crate) async fn put(&self, name: &str, entry: Entry) -> Result<Option<Entry>, ApiError> {
        let Some(redis) = &self.redis else {
            let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
            if !known.entries.contains_key(name) && known.entries.len() >= MAX_POLICIES {
                return Err(full());
            }
            let previous = Arc::make_mut(&mut known.entries).insert(name.to_string(), entry);
            return Ok(previous);
        };
        let previous = redis.put(name, &entry.encode()).await?;
        self.after_write().await;
        Ok(previous.and_then(|p| Entry::decode(&p).ok()))
    }

    /// Removes `name`; the entry it had, or `None` if it had none (nothing changed).
    pub(crate) async fn delete(&self, name: &str) -> Result<Option<Entry>, ApiError> {
        let Some(redis) = &self.redis else {
            let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
            if !known.entries.contains_key(name) {
                return Ok(None);
            }
            return Ok(Arc::make_mut(&mut known.entries).remove(name));
        };
        let previous = redis.delete(name).await?;
        self.after_write().await;
        Ok(previous.and_then(|p| Entry::decode(&p).ok()))
    }

    /// After a change written to Redis: the table read again, so that this instance
    /// decides with it from the next request (a failed read leaves it to the next poll).
    async fn after_write(&self) {
        if let Err(e) = self.refresh(false).await {
            tracing::warn!(
                target: "paceline",
                "the policies managed at run time changed, but could not be read back: {}; \
                 the next poll reads them",
                e.message()
            );
        }
    }

    /// Reads the table from Redis if its version moved since the last read (or in any case
    /// when `whole`), and keeps it: the changes it brought (none on the memory store, or
    /// when nothing changed).
    pub(crate) async fn refresh(&self, whole: bool) -> Result<Vec<Change>, ApiError> {
        let Some(redis) = &self.redis else {
            return Ok(Vec::new());
        };
        let read = self.reads.fetch_add(1, Ordering::Relaxed);
        let version = if whole {
            None
        } else {
            self.known
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .version
        };
        let Some((version, raw)) = redis.read(version).await? else {
            return Ok(Vec::new());
        };
        let mut entries = Entries::new();
        for (name, bytes) in raw {
            match Entry::decode(&bytes) {
                Ok(entry) => {
                    entries.insert(name, entry);
                }
                Err(e) => tracing::warn!(
                    target: "paceline",
                    policy = name.as_str(),
                    "a policy managed at run time is left out: its entry in Redis does not read: {e}"
                ),
            }
        }
        let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
        // A read that started before one applied already is older than what is known:
        // dropped. (Versions are not compared: a Redis that lost the table starts its
        // version over, and its empty table is the one to take.)
        if read < known.read {
            return Ok(Vec::new());
        }
        known.read = read;
        let changes = changes(&known.entries, &entries);
        known.version = Some(version);
        if !changes.is_empty() {
            known.entries = Arc::new(entries);
        }
        Ok(changes)
    }
}

/// What differs from `before` to `after`, name by name.
fn changes(before: &Entries, after: &Entries) -> Vec<Change> {
    let mut out = Vec::new();
    for (name, old) in before {
        match after.get(name) {
            Some(new) if new == old => {}
            new => out.push((name.clone(), Some(old.clone()), new.cloned())),
        }
    }
    for (name, new) in after {
        if !before.contains_key(name) {
            out.push((name.clone(), None, Some(new.clone())));
        }
    }
    out
}

/// Logs a change of the policies set at run time at INFO: the policy, its spec before and
/// after (`none` for none), and `by`, what made it (`PUT /v1/policies`, `DELETE
/// /v1/policies`, or another instance, seen in the store). Never the token.
pub(crate) fn log_change((name, old, new): &Change, by: &str) {
    let spec = |e: &Option<Entry>| match e {
        Some(e) if e.shadow => format!("{} (shadow)", e.policy),
        Some(e) => e.policy.to_string(),
        None => "none".to_string(),
    };
    tracing::info!(
        target: "paceline",
        policy = name.as_str(),
        old = spec(old).as_str(),
        new = spec(new).as_str(),
        by,
        "policy changed at run time"
    );
}

/// `409 conflict`: the table holds as many policies as it may.
fn full() -> ApiError {
    ApiError::new(
        ErrorCode::Conflict,
        "name",
        format!(
            "the service holds {MAX_POLICIES} policies set at run time, its most; delete one \
             (DELETE /v1/policies/NAME) before adding another"
        ),
    )
}

/// A name a run-time policy may take: a config file's policy name (1 to 128 of
/// `A-Z a-z 0-9 - _ .`), but not `.` or `..` alone, which URLs take for path steps.
/// Errors name `name`.
pub(crate) fn check_name(name: &str) -> Result<(), ApiError> {
    crate::config::check_policy_name(name).map_err(|m| ApiError::invalid("name", m))?;
    if name.bytes().all(|b| b == b'.') {
        return Err(ApiError::invalid(
            "name",
            format!(
                "`{name}` is not a valid policy name: a name of dots alone is a path step in a URL"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(spec: &str, shadow: bool) -> Entry {
        Entry {
            policy: spec.parse().expect("a spec"),
            shadow,
        }
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let e = entry("gcra:rate=10/s,burst=5", true);
        let text = e.encode();
        assert_eq!(text, r#"{"spec":"gcra:rate=10/s,burst=5","shadow":true}"#);
        assert_eq!(Entry::decode(text.as_bytes()), Ok(e));
        assert!(Entry::decode(b"{\"spec\":\"leaky:rate=1\"}").is_err());
        assert!(Entry::decode(b"not json").is_err());
    }

    #[test]
    fn changes_name_each_policy_added_replaced_or_removed() {
        let before = Entries::from([
            ("a".to_string(), entry("gcra:rate=1/s", false)),
            ("b".to_string(), entry("gcra:rate=2/s", false)),
            ("c".to_string(), entry("gcra:rate=3/s", false)),
        ]);
        let after = Entries::from([
            ("a".to_string(), entry("gcra:rate=1/s", false)),
            ("b".to_string(), entry("gcra:rate=2/s", true)),
            ("d".to_string(), entry("gcra:rate=4/s", false)),
        ]);
        let names: Vec<(String, bool, bool)> = changes(&before, &after)
            .into_iter()
            .map(|(n, old, new)| (n, old.is_some(), new.is_some()))
            .collect();
        assert_eq!(
            names,
            [
                ("b".to_string(), true, true),
                ("c".to_string(), true, false),
                ("d".to_string(), false, true)
            ]
        );
    }

    #[test]
    fn names_of_dots_alone_and_names_outside_the_alphabet_are_refused() {
        for bad in [".", "..", "...", "", "a/b", "a b", "é", &"x".repeat(129)] {
            let e = check_name(bad).expect_err(bad);
            assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST, "{bad}");
        }
        for good in ["search", "a.b", "..a", "tier-1_pro", &"x".repeat(128)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_memory_table_holds_at_most_its_most() {
        let store: SharedStore = Arc::new(paceline_store::MemoryStore::new());
        let table = RuntimePolicies::open(&store).await;
        assert!(!table.is_shared());
        for i in 0..MAX_POLICIES {
            let put = table
                .put(&format!("p{i}"), entry("gcra:rate=1/s", false))
                .await;
            assert!(matches!(put, Ok(None)));
        }
        let refused = table.put("one-more", entry("gcra:rate=1/s", false)).await;
        assert_eq!(
            refused.map(|_| ()).map_err(|e| e.status()),
            Err(axum::http::StatusCode::CONFLICT)
        );
        // Replacing one is no new entry.
        let replaced = table.put("p0", entry("gcra:rate=2/s", false)).await;
        assert!(matches!(replaced, Ok(Some(old)) if old == entry("gcra:rate=1/s", false)));
        assert!(matches!(table.delete("p0").await, Ok(Some(_))));
        assert!(matches!(table.delete("p0").await, Ok(None)));
        assert_eq!(table.entries().len(), MAX_POLICIES - 1);
    }
}
