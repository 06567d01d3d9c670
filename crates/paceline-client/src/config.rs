//! How an API client limiter behaves: [`ClientConfig`], shared by the core of each process
//! and by the knowledge the processes of one identity share.

use std::time::Duration;

use paceline_core::Policy;

/// How the client behaves; the defaults suit any API, [`ClientConfig::discord`] adds
/// Discord's global and invalid-request limits.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Applied to every request (except global-exempt routes) just before it goes.
    pub global: Option<Policy>,
    /// Counts invalid requests (401, 403, 429 other than `shared`); when it refuses,
    /// requests fail fast instead of risking a ban.
    pub invalid_budget: Option<Policy>,
    /// The share of the invalid-request budget at which a warning is logged (0.8).
    pub invalid_warn_at: f64,
    /// How long a pioneer's slot stays closed after an error response without rate-limit
    /// headers (1 s).
    pub headerless_backoff: Duration,
    /// The wait after a refusal that gave no retry-after (60 s, as GitHub asks), doubled
    /// for each such refusal in a row, up to `max_backoff`.
    pub missing_retry_after: Duration,
    /// The longest wait a missing retry-after leads to (15 min).
    pub max_backoff: Duration,
    /// The default deadline of a request's wait (`None`: wait as long as it takes).
    pub max_wait: Option<Duration>,
    /// How often a refused request is put back in its queue before its refusal is given
    /// to the caller (3).
    pub max_retries: u32,
    /// How many pioneers of unknown routes may be in flight at once per major parameter,
    /// and so how many calls known buckets of that parameter keep back while unknown
    /// routes wait. 1 for Discord, where many routes share
    /// small buckets; 8 by default, for APIs whose routes are many and whose buckets are
    /// large (GitHub: 5,000 per hour for every route).
    pub pioneers_per_major: u32,
    /// How long a request in flight counts against its bucket (and holds its pioneer
    /// slot) when its end is never reported, because its process died (60 s). Set it
    /// above the longest a response may take.
    pub in_flight_lease: Duration,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            global: None,
            invalid_budget: None,
            invalid_warn_at: 0.8,
            headerless_backoff: Duration::from_secs(1),
            missing_retry_after: Duration::from_secs(60),
            max_backoff: Duration::from_secs(900),
            max_wait: None,
            max_retries: 3,
            pioneers_per_major: 8,
            in_flight_lease: Duration::from_secs(60),
        }
    }
}

impl ClientConfig {
    /// No global limit, no invalid-request budget.
    pub fn new() -> ClientConfig {
        ClientConfig::default()
    }

    /// Discord's rules: 50 requests per second per token (`gcra:rate=50/s,burst=1`: at
    /// most 50 in any second) and 10,000 invalid requests per 10 minutes
    /// (`fixed_window:limit=10000,window=10m`).
    pub fn discord() -> ClientConfig {
        ClientConfig {
            global: Some(
                "gcra:rate=50/s,burst=1"
                    .parse()
                    .expect("a valid built-in policy"),
            ),
            invalid_budget: Some(
                "fixed_window:limit=10000,window=10m"
                    .parse()
                    .expect("a valid built-in policy"),
            ),
            pioneers_per_major: 1,
            ..ClientConfig::default()
        }
    }

    /// The same configuration with this global limit.
    pub fn global(mut self, policy: Policy) -> ClientConfig {
        self.global = Some(policy);
        self
    }

    /// The same configuration with this invalid-request budget.
    pub fn invalid_budget(mut self, policy: Policy) -> ClientConfig {
        self.invalid_budget = Some(policy);
        self
    }

    /// The same configuration with this default deadline for waits.
    pub fn max_wait(mut self, max_wait: Duration) -> ClientConfig {
        self.max_wait = Some(max_wait);
        self
    }
}
