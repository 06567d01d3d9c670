//! Helpers shared by the policies' unit tests.

use std::time::Duration;

use proptest::prelude::*;

use crate::{Op, Policy};

/// One millisecond, in microseconds.
pub(super) const MS: u64 = 1_000;
/// One second, in microseconds.
pub(super) const SEC: u64 = 1_000_000;

/// Parses a spec that is known to be valid.
pub(super) fn policy(spec: &str) -> Policy {
    spec.parse().unwrap()
}

/// Random traffic for a window policy's `random_traffic_keeps_the_contract`: a policy with
/// `limit` per window of `window_us`, driven by one key's requests from `start`, each a time
/// step (in 500ths of the window), a cost (taken modulo the limit) and an op (an index into
/// the four ops [`Traffic::keeps_the_contract`] uses).
#[derive(Clone, Debug)]
pub(super) struct Traffic {
    pub(super) limit: u64,
    pub(super) window_us: u64,
    start: u64,
    steps: Vec<(u64, u64, u8)>,
}

/// The strategy for [`Traffic`].
pub(super) fn traffic() -> impl Strategy<Value = Traffic> {
    (
        1u64..=6,
        1u64..=3_000_000,
        0u64..=1 << 52,
        proptest::collection::vec((0u64..1_000, 1u64..=6, 0u8..4), 1..120),
    )
        .prop_map(|(limit, window_us, start, steps)| Traffic {
            limit,
            window_us,
            start,
            steps,
        })
}

impl Traffic {
    /// The window.
    pub(super) fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// [`Traffic::keeps_the_contract`] for a policy that admits at most `limit` in each
    /// fixed window (`[k * window_us, (k + 1) * window_us)`) and changes nothing unless it
    /// admits.
    pub(super) fn keeps_the_contract_in_fixed_windows(
        &self,
        p: &Policy,
    ) -> Result<(), TestCaseError> {
        let (limit, window_us) = (self.limit, self.window_us);
        let within_limit = |admitted: &[(u64, u64)], at: u64| {
            let in_window: u64 = admitted
                .iter()
                .filter(|&&(t, _)| t / window_us == at / window_us)
                .map(|&(_, c)| c)
                .sum();
            prop_assert!(in_window <= limit, "window of {} over the limit", at);
            Ok(())
        };
        self.keeps_the_contract(p, within_limit, |_| false)
    }

    /// Drives one key of `p` through the traffic and checks the contract every request
    /// keeps:
    ///
    /// * for `limit`, the decision is the one a `peek` just before announced;
    /// * after each admission (not a peek), `within_limit(admitted, at)` checks the policy's
    ///   own bound over the admitted `(time, cost)` pairs, the last of which is the new one,
    ///   at `at`;
    /// * a request that is not admitted, or a peek, changes nothing, unless
    ///   `may_write_when_not_admitted(op)`;
    /// * a rejection's retry is admitted when it comes, and not a microsecond sooner;
    /// * `remaining` cost-1 requests go at once, and no more;
    /// * once `reset_after` has passed, the state is as good as none.
    pub(super) fn keeps_the_contract(
        &self,
        p: &Policy,
        within_limit: impl Fn(&[(u64, u64)], u64) -> Result<(), TestCaseError>,
        may_write_when_not_admitted: impl Fn(Op) -> bool,
    ) -> Result<(), TestCaseError> {
        let (limit, window_us) = (self.limit, self.window_us);
        let ops = [
            Op::Limit,
            Op::pace(),
            Op::Peek,
            Op::pace_within(Duration::from_micros(window_us / 2)),
        ];
        let mut s = None;
        let mut now = self.start;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for &(dt, cost, which) in &self.steps {
            now += dt * window_us / 500;
            let cost = 1 + (cost - 1) % limit;
            let op = ops[usize::from(which)];
            let before = s.clone();
            let peek = p.apply(&mut before.clone(), now, Op::Peek, cost).unwrap();
            let d = p.apply(&mut s, now, op, cost).unwrap();
            if op == Op::Limit {
                prop_assert_eq!(peek.allowed, d.allowed);
            }
            if d.allowed && op != Op::Peek {
                let at = now + d.delay.as_micros() as u64;
                admitted.push((at, cost));
                within_limit(&admitted, at)?;
            } else if !may_write_when_not_admitted(op) {
                prop_assert_eq!(&s, &before, "no side effects");
            }
            if !d.allowed {
                // The retry is admitted when it comes, and not a microsecond sooner.
                let retry = now + d.delay.as_micros() as u64;
                prop_assert!(p.apply(&mut s.clone(), retry, op, cost).unwrap().allowed);
                prop_assert!(
                    !p.apply(&mut s.clone(), retry - 1, op, cost)
                        .unwrap()
                        .allowed
                );
            }
            // `remaining` cost-1 requests go now, and no more.
            let mut probe = s.clone();
            for _ in 0..d.remaining {
                prop_assert!(p
                    .apply(&mut probe, now, Op::Limit, 1)
                    .unwrap()
                    .is_immediate());
            }
            prop_assert!(!p.apply(&mut probe, now, Op::Limit, 1).unwrap().allowed);
            // Once `reset_after` has passed, the state is as good as none.
            let idle = now + d.reset_after.as_micros() as u64;
            for cost in [1, limit] {
                prop_assert_eq!(
                    p.apply(&mut s.clone(), idle, Op::pace(), cost).unwrap(),
                    p.apply(&mut None, idle, Op::pace(), cost).unwrap()
                );
            }
        }
        Ok(())
    }
}
