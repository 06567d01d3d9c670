//! A limit whose policy is chosen per request ([`Builder::limit_by`]): its policies, by
//! name, and the caller's function that picks one for each request (an API key's plan, a
//! route), and possibly the key it counts under.
//!
//! [`Builder::limit_by`]: super::Builder::limit_by

use std::borrow::Cow;

use paceline_core::Policy;

use crate::key::Head;

/// Which of a limit's policies applies to a request, named as the limit's
/// [`limit_by`](super::Builder::limit_by) names it, and, if given, the key it counts the
/// request under in place of the limit's [`Key`](crate::Key).
///
/// A function choosing may answer a `&'static str` or a `String` (the policy's name) where a
/// `Choice` is expected.
///
/// ```
/// use paceline_tower::Choice;
/// let plan = Choice::policy("pro");
/// let plan_and_key = Choice::policy("pro").key("customer:42");
/// let from_a_name: Choice = "free".into();
/// # let _ = (plan, plan_and_key, from_a_name);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    policy: Cow<'static, str>,
    key: Option<String>,
}

impl Choice {
    /// The limit's policy named `name`.
    pub fn policy(name: impl Into<Cow<'static, str>>) -> Choice {
        Choice {
            policy: name.into(),
            key: None,
        }
    }

    /// Counts the request under `key` instead of the key the limit reads.
    pub fn key(mut self, key: impl Into<String>) -> Choice {
        self.key = Some(key.into());
        self
    }
}

impl From<&'static str> for Choice {
    fn from(name: &'static str) -> Choice {
        Choice::policy(name)
    }
}

impl From<String> for Choice {
    fn from(name: String) -> Choice {
        Choice::policy(name)
    }
}

/// What picks a policy for a request.
pub(super) type Choose = dyn Fn(&Head<'_>) -> Choice + Send + Sync;

/// A limit's policies by name, and the function that picks one for each request.
pub(super) struct Chooser {
    pub(super) policies: Vec<(String, Policy)>,
    pub(super) choose: Box<Choose>,
}

impl Chooser {
    /// Picks for the request of `head`: the index of the policy chosen and the key given
    /// with it, if any; or the name chosen, when it is none of the limit's policies.
    pub(super) fn pick(&self, head: &Head<'_>) -> Result<(usize, Option<String>), String> {
        let Choice { policy, key } = (self.choose)(head);
        match self.policies.iter().position(|(name, _)| *name == policy) {
            Some(index) => Ok((index, key)),
            None => Err(policy.into_owned()),
        }
    }

    /// The names of the policies, as a message lists them.
    pub(super) fn names(&self) -> String {
        let names: Vec<&str> = self.policies.iter().map(|(n, _)| n.as_str()).collect();
        names.join(", ")
    }
}
