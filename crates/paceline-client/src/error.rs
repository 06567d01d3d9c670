//! Why the client limiter gives up on a request: [`ClientError`].

use std::time::Duration;

use crate::headers::Scope;

/// Why the client gave up on a request without sending it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request would have waited longer than its `max_wait`.
    #[error("the rate limit would delay this request {}, longer than its max_wait of {max_wait:?}; retry later or raise max_wait", match would_wait { Some(d) => format!("{d:?}"), None => "for an unknown time (its bucket's limits are not known yet)".into() })]
    WaitExceeded {
        /// The deadline the request had.
        max_wait: Duration,
        /// How long it would have waited, when the core could tell.
        would_wait: Option<Duration>,
    },
    /// The invalid-request budget is spent: sending more risks a ban.
    #[error("the invalid-request budget (401, 403 and 429 responses) is spent; requests fail until it recovers in {retry_after:?}")]
    InvalidBudget {
        /// When the budget admits again.
        retry_after: Duration,
    },
    /// The request asked to give up rather than wait
    /// ([`RequestOptions::give_up`](crate::RequestOptions::give_up)), and a limit would
    /// have held it.
    #[error("the {} rate limit would delay this request {}; it asked to give up rather than wait", crate::hooks::scope_name(*scope), match wait { Some(d) => format!("{d:?}"), None => "for an unknown time (until an answer tells its bucket's limits)".into() })]
    RateLimited {
        /// Whose limit held it, when the core could tell.
        scope: Option<Scope>,
        /// How long it would have waited, when the core could tell.
        wait: Option<Duration>,
    },
    /// The client was shut down.
    #[error("the client limiter was dropped")]
    Closed,
}
