//! What a decision does when Redis cannot be reached.

use std::fmt;
use std::str::FromStr;

use paceline_core::InputError;

/// What the store answers when Redis fails (cannot be reached, does not answer within the
/// timeout, or is loading). Chosen explicitly for every store: there is no default, because
/// each choice is wrong for some callers.
///
/// * [`FailClosed`](FailurePolicy::FailClosed): return the failure as an
///   [`Error::Store`](paceline_core::Error::Store). Safest for the protected service, visible to
///   the caller; never confused with a rejection.
/// * [`FailOpen`](FailurePolicy::FailOpen): admit at once, with
///   [`Decision::fallback`](paceline_core::Decision::fallback) set to
///   [`Fallback::FailOpen`](paceline_core::Fallback::FailOpen). Keeps traffic flowing and
///   enforces nothing while Redis is down.
/// * [`Local`](FailurePolicy::Local): decide with an in-process store of the same policy,
///   flagged [`Fallback::Local`](paceline_core::Fallback::Local). Each process then enforces the
///   limit on its own traffic only (n processes admit up to n times the limit), and starts
///   from idle keys; back on Redis, the shared state is used again.
///
/// ```
/// use paceline_store::FailurePolicy;
/// let p: FailurePolicy = "fail_open".parse().unwrap();
/// assert_eq!(p, FailurePolicy::FailOpen);
/// assert_eq!(p.to_string(), "fail_open");
/// assert_eq!("closed".parse::<FailurePolicy>().unwrap_err().field(), "failure_policy");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Return the store error.
    FailClosed,
    /// Admit, flagged in the decision.
    FailOpen,
    /// Decide in process until Redis is back, flagged in the decision.
    Local,
}

impl FailurePolicy {
    /// The name used in configs and on the command line.
    pub const fn name(&self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::Local => "local",
        }
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FailurePolicy {
    type Err = InputError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "fail_closed" => Ok(FailurePolicy::FailClosed),
            "fail_open" => Ok(FailurePolicy::FailOpen),
            "local" => Ok(FailurePolicy::Local),
            other => Err(InputError::new(
                "failure_policy",
                format!("`{other}` is not a failure policy; use fail_closed, fail_open or local"),
            )),
        }
    }
}
