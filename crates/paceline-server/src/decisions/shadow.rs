//! Shadow mode: a limit decided and counted as usual whose refusal is answered as an
//! admit. A configured policy with `shadow = true` is one, and so is an RLS rule with
//! `shadow_mode: true`.
//!
//! In a set of limits, the shadow-mode limits never refuse the set: the other limits are
//! decided first, as one set, and then each shadow-mode limit on its own
//! ([`decide_each`]): with its own op once the set is admitted (a refusal counts nothing,
//! as always), as a `peek` that counts nothing when the set is refused.

use paceline_store::{Decision, Error, Op, Request, SharedStore};

/// Decides each of `limits` on its own, one after the other, after the limits that count:
/// as asked when the request they belong to is `admitted`, as a `peek` (of the same cost)
/// otherwise. One outcome per limit, in order.
pub(crate) async fn decide_each(
    store: &SharedStore,
    limits: &[Request<'_>],
    admitted: bool,
) -> Vec<Result<Decision, Error>> {
    let mut outcomes = Vec::with_capacity(limits.len());
    for limit in limits {
        let op = if admitted { limit.op } else { Op::Peek };
        outcomes.push(store.decide(limit.policy, limit.key, op, limit.cost).await);
    }
    outcomes
}

/// The answer to decision `d` of a shadow-mode limit: `d` itself when it admits; admitted
/// with no wait when it refuses (its `remaining` and `reset_after` kept, so the headers
/// stay truthful). The flag says whether shadow mode turned a refusal into an admit.
pub(crate) fn answered(d: &Decision) -> (Decision, bool) {
    if d.allowed {
        return (*d, false);
    }
    let mut admitted = *d;
    admitted.allowed = true;
    admitted.delay = std::time::Duration::ZERO;
    (admitted, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_answered_as_an_admit_with_no_wait() {
        let refused = Decision::from_micros(false, 1_500_000.0, 0, 2_000_000.0, 10);
        let (a, shadowed) = answered(&refused);
        assert!(shadowed && a.allowed);
        assert_eq!(a.delay, std::time::Duration::ZERO);
        assert_eq!((a.remaining, a.limit), (0, 10));
        assert_eq!(a.reset_after, refused.reset_after);
        let paced = Decision::from_micros(true, 250_000.0, 3, 1_000_000.0, 10);
        let (a, shadowed) = answered(&paced);
        assert!(!shadowed);
        assert_eq!(a.delay, paced.delay);
    }
}
