//! Differential tests: twins (the Rust engine in memory and its Lua twin in Redis, say) run
//! one script of steps on one clock, and the first step at which one of them answers
//! otherwise than the reference fails the test.
//!
//! * A [`Twin`] is one implementation under test: it applies a step at a time ([`At`]) and
//!   answers something comparable. Any state a step reads (the leases a queue handed out,
//!   the requests in flight) each twin keeps for itself, from its own answers: while the
//!   twins agree, so does that state.
//! * A script is a slice of steps; a [`Step`] that moves the shared clock ([`Tick`]) is
//!   the runner's, every other one is applied to the reference and then to each twin.
//! * [`Differential::run`] compares every twin's answer with the reference's (with `==`,
//!   or a comparison of the test's own), checks the reference against a model if the test
//!   gives one ([`Differential::check`]), and reports the first divergence: the step, its
//!   time, both answers, and the script up to it. It answers the reference's answers, each
//!   with its step's [`At`], for what the test checks afterwards.
//! * [`Cases`] runs a property over random scripts on a seed it prints when a case fails
//!   (`PROPTEST_RNG_SEED` replays the run), with proptest's shrinking to the smallest
//!   failing script, and, when asked, the regressions saved next to the test file.
//! * [`Redis`] names where Redis twins run: the test binary's shared server and its shared
//!   3-primary cluster.
//!
//! ```
//! use std::time::Duration;
//!
//! use paceline_store::{ManualClock, MemoryStore, Op, Policy, SyncStore};
//! use paceline_testkit::differential::{At, Cases, Differential, Step, Tick, Twin};
//! use proptest::prelude::*;
//!
//! /// A script's steps: time passes, or one request asks to go.
//! #[derive(Clone, Debug)]
//! enum Move {
//!     Wait(u64),
//!     Ask,
//! }
//!
//! impl<A> Step<A> for Move {
//!     fn tick(&self, _: &[A]) -> Option<Tick> {
//!         match self {
//!             Move::Wait(ms) => Some(Tick::By(Duration::from_millis(*ms))),
//!             Move::Ask => None,
//!         }
//!     }
//! }
//!
//! /// paceline's fixed window of two a second, in memory on the test's clock.
//! struct Paceline {
//!     store: MemoryStore,
//!     policy: Policy,
//! }
//!
//! impl Twin<Move> for Paceline {
//!     type Answer = bool;
//!
//!     async fn apply(&mut self, _: &Move, _: At) -> bool {
//!         let decision = self.store.decide_sync(&self.policy, "k", Op::Limit, 1);
//!         decision.is_ok_and(|d| d.allowed)
//!     }
//! }
//!
//! /// The same rule by hand: the second a request falls in, and how many went in it.
//! #[derive(Default)]
//! struct ByHand {
//!     second: u64,
//!     went: u32,
//! }
//!
//! impl Twin<Move> for ByHand {
//!     type Answer = bool;
//!
//!     async fn apply(&mut self, _: &Move, at: At) -> bool {
//!         if at.now / 1_000_000 != self.second {
//!             (self.second, self.went) = (at.now / 1_000_000, 0);
//!         }
//!         let goes = self.went < 2;
//!         self.went += u32::from(goes);
//!         goes
//!     }
//! }
//!
//! let moves = prop_oneof![(0..1_500u64).prop_map(Move::Wait), Just(Move::Ask)];
//! let scripts = prop::collection::vec(moves, 1..40);
//! Cases::new(16).run(&scripts, |script| {
//!     let clock = ManualClock::new(0);
//!     let mut paceline = Paceline {
//!         store: MemoryStore::builder().clock(clock.clone()).build(),
//!         policy: "fixed_window:limit=2,window=1s".parse().expect("a policy"),
//!     };
//!     let mut by_hand = [("by hand", ByHand::default())];
//!     let mut differential = Differential::new(&clock);
//!     let run = differential.run(&script, ("paceline", &mut paceline), &mut by_hand);
//!     let answers = paceline_testkit::runtime().block_on(run)?;
//!     let asks = script.iter().filter(|m| matches!(m, Move::Ask)).count();
//!     prop_assert_eq!(answers.len(), asks);
//!     Ok(())
//! });
//! ```

use std::fmt::{self, Debug, Write as _};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use paceline_store::{Clock, ManualClock};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed, TestCaseError, TestRunner};

use crate::{shared_cluster, shared_server};

/// Where and when a step is applied: its place in the script and the shared clock's time
/// (µs since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    /// The step's index in the script (clock steps count too).
    pub index: usize,
    /// The shared clock's time.
    pub now: u64,
}

/// How a step moves the shared clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tick {
    /// Forward by this much (rounded up to a whole µs).
    By(Duration),
    /// To this time (µs since the Unix epoch), forward or back.
    To(u64),
}

/// A step of a script, as the runner sees it: either one that only moves the shared clock,
/// or one the twins apply.
pub trait Step<A>: Debug {
    /// How this step moves the clock, if that is all it does (no twin sees it); `None` for
    /// a step the twins apply. `answers` are the reference's answers to the steps applied
    /// so far, in order, for a step that waits as long as an answer said.
    fn tick(&self, answers: &[A]) -> Option<Tick>;
}

/// One implementation under test.
///
/// Implement it with an `async fn apply`. A twin reads the time from the clock the runner
/// moves (a store or queue built on it) or from [`At::now`].
pub trait Twin<S> {
    /// What one step answers, compared across the twins.
    type Answer;

    /// Applies `step` at `at`; answers what this twin said.
    fn apply(&mut self, step: &S, at: At) -> impl Future<Output = Self::Answer>;
}

/// Whether two answers agree, and if not, why not (for the report).
pub type Agree<A> = fn(&A, &A) -> Result<(), String>;

/// A check of the reference's answer to a step (`index`, the step), against a model of the
/// test's, say; an `Err` says what rule it broke.
type Check<'c, S, A> = Box<dyn FnMut(usize, &S, &A) -> Result<(), String> + 'c>;

/// Runs scripts on twins and compares them: see the [module docs](self).
pub struct Differential<'c, S, A> {
    clock: ManualClock,
    agree: Agree<A>,
    check: Option<Check<'c, S, A>>,
}

impl<'c, S, A: PartialEq> Differential<'c, S, A> {
    /// A runner on `clock` (the one the twins read) whose answers agree when they are
    /// equal.
    pub fn new(clock: &ManualClock) -> Self {
        Differential::agreeing(clock, equal)
    }
}

impl<'c, S, A> Differential<'c, S, A> {
    /// A runner on `clock` whose answers agree as `agree` says (for answers that carry
    /// what need not match, such as an error's wording).
    pub fn agreeing(clock: &ManualClock, agree: Agree<A>) -> Self {
        Differential {
            clock: clock.clone(),
            agree,
            check: None,
        }
    }

    /// Also checks the reference's answer to every step the twins apply with `check`
    /// (after the twins answered alike), which fails the run as a divergence does.
    pub fn check(mut self, check: impl FnMut(usize, &S, &A) -> Result<(), String> + 'c) -> Self {
        self.check = Some(Box::new(check));
        self
    }

    /// Runs `script`: moves the clock on clock steps, and applies every other step to the
    /// reference (a name for reports, and the twin), then to each of `twins` in order,
    /// comparing each answer with the reference's. Answers the reference's answers to the
    /// steps applied, in order, each with where and when it was given; fails at the first
    /// step where a twin answers otherwise, or the check fails, with a report of the step,
    /// both answers and the script up to it.
    pub async fn run<R, T>(
        &mut self,
        script: &[S],
        reference: (&str, &mut R),
        twins: &mut [(&str, T)],
    ) -> Result<Vec<(At, A)>, TestCaseError>
    where
        S: Step<A>,
        A: Debug,
        R: Twin<S, Answer = A>,
        T: Twin<S, Answer = A>,
    {
        let (reference_name, reference) = reference;
        let (mut answers, mut ats) = (Vec::new(), Vec::new());
        for (index, step) in script.iter().enumerate() {
            if let Some(tick) = step.tick(&answers) {
                match tick {
                    Tick::By(by) => self.clock.advance(by),
                    Tick::To(now) => self.clock.set_micros(now),
                }
                continue;
            }
            let at = At {
                index,
                now: self.clock.now_micros(),
            };
            let expected = reference.apply(step, at).await;
            for (name, twin) in twins.iter_mut() {
                let got = twin.apply(step, at).await;
                if let Err(why) = (self.agree)(&expected, &got) {
                    return Err(report(
                        script,
                        at,
                        &format!("{name} answered otherwise than {reference_name}: {why}"),
                        &[(reference_name, &expected), (name, &got)],
                    ));
                }
            }
            if let Some(check) = self.check.as_mut() {
                if let Err(why) = check(index, step, &expected) {
                    return Err(report(
                        script,
                        at,
                        &format!("{reference_name} broke a rule: {why}"),
                        &[(reference_name, &expected)],
                    ));
                }
            }
            answers.push(expected);
            ats.push(at);
        }
        Ok(ats.into_iter().zip(answers).collect())
    }
}

/// Equal answers agree.
pub fn equal<A: PartialEq>(a: &A, b: &A) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err("the answers differ".into())
    }
}

/// The failure of step `at`: what went wrong, the answers, and the script up to the step.
fn report<S: Debug, A: Debug>(
    script: &[S],
    at: At,
    what: &str,
    answers: &[(&str, &A)],
) -> TestCaseError {
    let mut text = format!(
        "step {} of {} ({:?}) at {} µs: {what}",
        at.index,
        script.len(),
        script[at.index],
        at.now
    );
    for (name, answer) in answers {
        let _ = write!(text, "\n {name}: {answer:?}");
    }
    text.push_str("\nthe script up to that step:");
    for (index, step) in script[..=at.index].iter().enumerate() {
        let _ = write!(text, "\n {index:>4}: {step:?}");
    }
    TestCaseError::fail(text)
}

/// Runs a property over random cases (scripts, say), on a seed it prints when a case
/// fails.
///
/// The cases are `PROPTEST_CASES` if set, else the default given; the seed is
/// `PROPTEST_RNG_SEED` if set (to replay a run), else a random one. A failing case is
/// shrunk to the smallest that still fails, and the test panics with it, proptest's
/// report and the seed. With [`regressions`](Cases::regressions), the failures saved next
/// to the test file run first, and a new one is saved there.
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct Cases {
    default: u32,
    source_file: Option<&'static str>,
}

impl Cases {
    /// `default` cases unless `PROPTEST_CASES` says otherwise; no failure saved.
    pub fn new(default: u32) -> Cases {
        Cases {
            default,
            source_file: None,
        }
    }

    /// Replays the failures saved beside `source_file` (the test's `file!()`: its
    /// `.proptest-regressions` file) before the random cases, and saves a new one there.
    pub fn regressions(mut self, source_file: &'static str) -> Cases {
        self.source_file = Some(source_file);
        self
    }

    /// Runs `test` over cases of `strategy`; panics at the first failure with the smallest
    /// failing case and the seed that replays the run.
    pub fn run<S: Strategy>(
        self,
        strategy: &S,
        test: impl Fn(S::Value) -> Result<(), TestCaseError>,
    ) {
        let mut config = Config {
            failure_persistence: None,
            ..Config::default()
        };
        config.cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(self.default);
        let seed = match config.rng_seed {
            RngSeed::Fixed(seed) => seed,
            RngSeed::Random => random_seed(),
        };
        config.rng_seed = RngSeed::Fixed(seed);
        if let Some(source_file) = self.source_file {
            config.source_file = Some(source_file);
            config.failure_persistence = Some(Box::new(FileFailurePersistence::SourceParallel(
                "proptest-regressions",
            )));
        }
        let mut runner = TestRunner::new(config);
        if let Err(e) = runner.run(strategy, test) {
            panic!("{e}\n{runner}\nthis run's cases come again with PROPTEST_RNG_SEED={seed}");
        }
    }
}

/// A seed no earlier run is likely to have had: the standard library's random hash keys.
fn random_seed() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Where a Redis twin runs: the test binary's shared server ([`shared_server`]) or its
/// shared 3-primary cluster ([`shared_cluster`]), each started on first use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redis {
    /// A standalone server.
    Server,
    /// A Redis Cluster of three primaries.
    Cluster,
}

impl Redis {
    /// Both, server first.
    pub const BOTH: [Redis; 2] = [Redis::Server, Redis::Cluster];

    /// Its name in reports: `redis` or `cluster`.
    pub fn name(self) -> &'static str {
        match self {
            Redis::Server => "redis",
            Redis::Cluster => "cluster",
        }
    }

    /// Its URL (`redis://...` or `redis-cluster://...`).
    pub fn url(self) -> String {
        match self {
            Redis::Server => shared_server().url(),
            Redis::Cluster => shared_cluster().url(),
        }
    }
}

impl fmt::Display for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
