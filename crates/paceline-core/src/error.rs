//! Errors: bad input (which names the field and what is allowed) and store failures.
//!
//! A rejection by a limit is never an error: it is a [`Decision`](crate::Decision) with
//! `allowed == false`. Errors mean "the question was wrong" ([`InputError`]) or "the
//! answer could not be had" ([`StoreError`]), so "limited" and "Redis is down" can never be
//! confused.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// A request or a policy that paceline cannot act on, naming the field at fault.
///
/// ```
/// use paceline_core::Policy;
/// let err = "gcra:rate=0/s".parse::<Policy>().unwrap_err();
/// assert_eq!(err.field(), "rate");
/// assert!(err.to_string().contains("greater than zero"));
/// assert!(!err.is_beyond_policy());
/// ```
///
/// Most input errors are malformed input, wrong whatever the configuration. One kind is not:
/// a value well formed in itself that is more than the policy it is counted against can
/// ever admit (a `cost` above a `gcra`'s burst with `limit`, a job's cost above its group's
/// limit). Such an error is [`is_beyond_policy`](InputError::is_beyond_policy): the request
/// conflicts with the policy as configured (the HTTP service answers it `409 conflict`,
/// other input errors `400`), and the mark is kept when the field is
/// [`renamed`](InputError::renamed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputError {
    field: Cow<'static, str>,
    message: String,
    beyond_policy: bool,
}

impl InputError {
    /// An error about `field`; `message` says what is wrong and what is allowed.
    pub fn new(field: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        InputError {
            field: field.into(),
            message: message.into(),
            beyond_policy: false,
        }
    }

    /// An error about `field`, a value more than the policy it is counted against can ever
    /// admit; `message` says what the policy admits at most and what to do.
    ///
    /// ```
    /// use paceline_core::{Op, Policy};
    /// let policy: Policy = "gcra:rate=10/s,burst=10".parse().unwrap();
    /// let err = policy.check_cost(Op::Limit, 11).unwrap_err();
    /// assert_eq!(err.field(), "cost");
    /// assert!(err.is_beyond_policy());
    /// assert!(!policy.check_cost(Op::Limit, 0).unwrap_err().is_beyond_policy());
    /// ```
    pub fn beyond_policy(field: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        InputError {
            beyond_policy: true,
            ..InputError::new(field, message)
        }
    }

    /// Whether the value is well formed but more than its policy can ever admit
    /// ([`InputError::beyond_policy`]): a conflict with the configuration rather than
    /// malformed input.
    pub fn is_beyond_policy(&self) -> bool {
        self.beyond_policy
    }

    /// The same error about `field` instead (the field's name where the caller sent it:
    /// `limits[1].cost`, `policy.rate`), with its message and its kind.
    ///
    /// ```
    /// use paceline_core::InputError;
    /// let e = InputError::beyond_policy("cost", "at most 10").renamed("limits[1].cost");
    /// assert_eq!((e.field(), e.message()), ("limits[1].cost", "at most 10"));
    /// assert!(e.is_beyond_policy());
    /// ```
    pub fn renamed(self, field: impl Into<Cow<'static, str>>) -> Self {
        InputError {
            field: field.into(),
            ..self
        }
    }

    /// The field at fault (`"cost"`, `"rate"`, `"window"`, `"spec"`, ...).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong, and what would be accepted instead.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for InputError {}

/// What kind of store failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store refused a new key because it holds its configured maximum number of keys.
    Capacity,
    /// The store could not be reached (connection refused, reset, DNS failure).
    Unavailable,
    /// The store did not answer within the configured timeout.
    Timeout,
    /// The store answered something paceline could not understand.
    Protocol,
}

/// The store could not give an answer. Never a rate-limit rejection.
///
/// Where the failure came from a lower layer (a Redis client error), that error is kept as
/// its [`source`](std::error::Error::source). Two store errors are equal when their kind and
/// message are.
#[derive(Clone, Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl PartialEq for StoreError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for StoreError {}

impl StoreError {
    /// A store failure of `kind`; `message` says what happened and what to do next.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, caused by `source` (kept as its [`std::error::Error::source`]).
    ///
    /// ```
    /// use paceline_core::{StoreError, StoreErrorKind};
    /// use std::error::Error as _;
    /// let io = std::io::Error::other("connection reset");
    /// let e = StoreError::new(StoreErrorKind::Unavailable, "Redis failed a decision")
    ///     .with_source(io);
    /// assert_eq!(e.source().map(|s| s.to_string()).as_deref(), Some("connection reset"));
    /// ```
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// A description of the failure.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the call may have been applied with its answer lost on the way back: the
    /// connection broke, or the answer did not come in time. Such a call is the one a caller
    /// may make once more under the same request id (the job queue's leases, the API
    /// client's rounds); any other failure is the caller's answer.
    ///
    /// ```
    /// use paceline_core::{StoreError, StoreErrorKind};
    /// assert!(StoreError::new(StoreErrorKind::Timeout, "no answer").answer_may_be_lost());
    /// assert!(!StoreError::new(StoreErrorKind::Protocol, "garbled").answer_may_be_lost());
    /// ```
    pub fn answer_may_be_lost(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Unavailable | StoreErrorKind::Timeout
        )
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            StoreErrorKind::Capacity => "store full",
            StoreErrorKind::Unavailable => "store unavailable",
            StoreErrorKind::Timeout => "store timeout",
            StoreErrorKind::Protocol => "store protocol error",
        };
        write!(f, "{kind}: {}", self.message)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Everything a limiter call can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request or policy is invalid; fix the input.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The store failed; the request was neither admitted nor rejected.
    #[error(transparent)]
    Store(#[from] StoreError),
}
