//! Sets of limits decided as one ([`Store::decide_all`]), on every store.
//!
//! * **Differential**: proptest generates a few keys, each with a policy of any algorithm,
//!   and steps that advance an injected clock and decide sets of one to three of the keys
//!   (`limit`, `peek` or `charge`, costs 1 and 2). The memory store, a Redis server (the library as
//!   functions and as a script) and a 3-primary Redis Cluster (the keys under one hash tag)
//!   must give identical decisions, combined and per limit.
//! * **Atomicity**: the same steps run on a model, a memory store of single decisions in
//!   which an admitted set's requests are applied one by one and a refused set applies
//!   nothing (a set of one is the limit's own decision). After every step each key must answer a `peek` as the model's key does (so a
//!   refused set changed no limit, on any store), and a set is admitted exactly when every
//!   limit alone admits.
//!
//! Both run on the test kit's differential harness: memory is the reference, the Redis
//! stores its twins, and the model checks memory step by step.
//!
//! `PROPTEST_CASES` sets the number of cases (default 96).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use paceline_store::{redis::RedisStore, FailurePolicy, Request, SetDecision, MAX_LIMITS};
use paceline_store::{Decision, Error, ManualClock, MemoryStore, Op, Policy, Store, SyncStore};
use paceline_testkit::differential::{self, At, Cases, Differential, Redis, Tick, Twin};
use paceline_testkit::runtime;
use proptest::prelude::*;

/// 2023-11-14 in microseconds since the Unix epoch.
const EPOCH_2023: u64 = 1_700_000_000_000_000;

#[derive(Clone, Debug)]
enum Step {
    Sleep(u64),
    Set {
        /// Key numbers, distinct.
        keys: Vec<usize>,
        op: Op,
        cost: u64,
    },
}

#[derive(Clone, Debug)]
struct Case {
    /// Key `i`'s policy.
    specs: Vec<String>,
    steps: Vec<Step>,
}

/// One policy of any algorithm, with limits small enough for sets to be refused often.
fn spec() -> impl Strategy<Value = String> {
    prop_oneof![
        (1..=20u64, 1..=3u64).prop_map(|(r, b)| format!("gcra:rate={r}/s,burst={b}")),
        (1..=20u64, 0..=3u64).prop_map(|(r, b)| format!("pacer:rate={r}/s,max_burst={b}")),
        (2..=5u64, 100..=2000u64).prop_map(|(l, w)| format!("fixed_window:limit={l},window={w}ms")),
        (2..=5u64, 100..=2000u64, any::<bool>()).prop_map(|(l, w, blocked)| format!(
            "sliding_log:limit={l},window={w}ms,count_blocked={blocked}"
        )),
        (2..=5u64, 100..=2000u64)
            .prop_map(|(l, w)| format!("sliding_window:limit={l},window={w}ms")),
        (2..=6u64, 100..=2000u64)
            .prop_map(|(p, d)| format!("exec_evenly:points={p},duration={d}ms")),
        (1..=20u64).prop_map(|r| format!("smooth_bursty:rate={r}/s")),
        (1..=20u64, 100..=2000u64)
            .prop_map(|(r, w)| format!("smooth_warming_up:rate={r}/s,warmup={w}ms")),
        (2..=4u64, 100..=2000u64).prop_map(|(l, w)| format!("concurrency:limit={l},lease={w}ms")),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec(spec(), 2..=4).prop_flat_map(|specs| {
        let n = specs.len();
        let set = (
            prop::sample::subsequence((0..n).collect::<Vec<_>>(), 1..=n.min(3)),
            prop_oneof![14 => Just(Op::Limit), 3 => Just(Op::Peek), 3 => Just(Op::Charge)],
            prop_oneof![4 => Just(1u64), 1 => Just(2u64)],
        )
            .prop_shuffle_keys();
        let step = prop_oneof![
            2 => Just(Step::Sleep(0)),
            3 => (0..=600_000u64).prop_map(Step::Sleep),
            10 => set,
        ];
        prop::collection::vec(step, 1..40).prop_map(move |steps| Case {
            specs: specs.clone(),
            steps,
        })
    })
}

/// Shuffles a generated set's keys, so the same keys come in every order.
trait ShuffleKeys {
    fn prop_shuffle_keys(self) -> BoxedStrategy<Step>;
}

impl<S> ShuffleKeys for S
where
    S: Strategy<Value = (Vec<usize>, Op, u64)> + 'static,
{
    fn prop_shuffle_keys(self) -> BoxedStrategy<Step> {
        self.prop_flat_map(|(keys, op, cost)| {
            Just(keys)
                .prop_shuffle()
                .prop_map(move |keys| Step::Set { keys, op, cost })
        })
        .boxed()
    }
}

struct Stores {
    clock: ManualClock,
    memory: MemoryStore,
    /// Single decisions only: the model of what a set should have done.
    model: MemoryStore,
    redis: RedisStore,
    redis_scripts: RedisStore,
    cluster: RedisStore,
}

impl Stores {
    async fn new() -> Stores {
        let clock = ManualClock::new(EPOCH_2023);
        let connect = |url: String, scripts: bool, prefix: &'static str| {
            let clock = clock.clone();
            async move { paceline_testkit::redis_store_on(url, prefix, &clock, scripts).await }
        };
        let redis = connect(Redis::Server.url(), false, "sets").await;
        let redis_scripts = connect(Redis::Server.url(), true, "sets-scripts").await;
        let cluster = connect(Redis::Cluster.url(), false, "sets").await;
        assert!(redis.runs_as_functions() && !redis_scripts.runs_as_functions());
        assert!(cluster.is_cluster());
        Stores {
            memory: MemoryStore::builder().clock(clock.clone()).build(),
            model: MemoryStore::builder().clock(clock.clone()).build(),
            clock,
            redis,
            redis_scripts,
            cluster,
        }
    }

    /// Every store under test, named, memory first.
    fn all(&self) -> [(&'static str, &dyn Store); 4] {
        [
            ("memory", &self.memory),
            ("redis", &self.redis),
            ("redis (as a script)", &self.redis_scripts),
            ("cluster", &self.cluster),
        ]
    }

    /// A case of sets (`limit`, `peek` or `charge`): every store decides alike and its keys end
    /// alike, and memory decides as its model of single decisions says.
    async fn run(&self, case: &Case) -> Result<(), TestCaseError> {
        let id = next_case_id();
        self.clock.set_micros(EPOCH_2023 + id * 3_600_000_000);
        let policies: Vec<Policy> = case
            .specs
            .iter()
            .map(|s| s.parse().expect("generated specs are valid"))
            .collect();
        // One hash tag per case: the cluster takes the case's sets in one slot.
        let keys: Vec<String> = (0..policies.len())
            .map(|k| format!("{{case{id}}}:k{k}"))
            .collect();
        let twin = |store, witness| SetStore {
            store,
            policies: &policies,
            keys: &keys,
            witness,
        };
        let mut memory = twin(&self.memory, true);
        let mut twins = [
            ("redis", twin(&self.redis, false)),
            ("redis (as a script)", twin(&self.redis_scripts, false)),
            ("cluster", twin(&self.cluster, false)),
        ];
        let model = &self.model;
        let check = |index: usize, step: &Step, said: &Said| {
            let (
                Step::Set {
                    keys: set,
                    op,
                    cost,
                },
                Said::Set {
                    decision, after, ..
                },
            ) = (step, said)
            else {
                return Ok(());
            };
            let op = *op;
            let requests: Vec<Request> = set
                .iter()
                .map(|&k| Request::new(&policies[k], &keys[k], op, *cost))
                .collect();
            let what = describe(index, op, *cost, set, &policies);
            // The model: each limit alone, applied only if every one admits (a charge
            // always does, where its policy takes one).
            let alone: Result<Vec<_>, _> = requests
                .iter()
                .map(|r| {
                    r.policy.check_cost(op, r.cost)?;
                    // A charge's cost may be more than a peek takes: it admits anyway.
                    let cost = if op == Op::Charge { 1 } else { r.cost };
                    model.decide_sync(r.policy, r.key, Op::Peek, cost)
                })
                .collect();
            match (decision, alone) {
                (Ok(set), Ok(alone)) => {
                    let every = op == Op::Charge || alone.iter().all(|d| d.allowed);
                    if set.allowed() != every {
                        return Err(format!(
                            "{what}: the set's admission differs from its limits' alone {alone:?}"
                        ));
                    }
                    let refused: Vec<usize> = set.refused().collect();
                    let expected_refused: Vec<usize> = if every {
                        Vec::new()
                    } else {
                        (0..alone.len()).filter(|&i| !alone[i].allowed).collect()
                    };
                    if refused != expected_refused {
                        return Err(format!(
                            "{what}: refused by {refused:?}, its limits alone refuse \
                             {expected_refused:?}"
                        ));
                    }
                    // A set of one is that limit's own decision, which a `sliding_log` with
                    // `count_blocked` records even when it refuses.
                    if (every || requests.len() == 1) && op != Op::Peek {
                        for r in &requests {
                            model
                                .decide_sync(r.policy, r.key, r.op, r.cost)
                                .map_err(|e| e.to_string())?;
                        }
                    }
                }
                (Err(Error::Input(e)), Err(Error::Input(alone))) => {
                    return if e.field() == alone.field() {
                        Ok(())
                    } else {
                        Err(format!("{what}: the set's error names {}", e.field()))
                    };
                }
                (set, alone) => {
                    return Err(format!(
                        "{what}: the set answered {set:?}, its limits alone {alone:?}"
                    ))
                }
            }
            // Every key answers a peek as the model's does (on every store: the twins'
            // keys are where memory's are).
            for (k, policy) in policies.iter().enumerate() {
                let model = model.decide_sync(policy, &keys[k], Op::Peek, 1).ok();
                if after[k] != model {
                    return Err(format!("{what}: k{k} is not where the model's is"));
                }
            }
            Ok(())
        };
        let mut differential = Differential::agreeing(&self.clock, same_said).check(check);
        let answers = differential
            .run(&case.steps, ("memory", &mut memory), &mut twins)
            .await;
        answers.map(|_| ())
    }
}

/// What a store said to a step: a set's decision and every key's peek after it (with, on
/// memory, each limit's own pace and every key's peek before it, for the checks of a pace
/// set), or that it applied a limit of another algorithm (its answer is not compared; the
/// peeks after the next set are).
#[derive(Debug)]
enum Said {
    Set {
        own: Vec<Decision>,
        before: Vec<Option<Decision>>,
        decision: Result<SetDecision, Error>,
        after: Vec<Option<Decision>>,
    },
    Foreign,
}

/// Alike: the same set decision, and every key alike after it.
fn same_said(a: &Said, b: &Said) -> Result<(), String> {
    match (a, b) {
        (
            Said::Set {
                decision: a,
                after: a_after,
                ..
            },
            Said::Set {
                decision: b,
                after: b_after,
                ..
            },
        ) => {
            same(a, b)?;
            if a_after == b_after {
                Ok(())
            } else {
                Err("the keys are not where the reference's are".into())
            }
        }
        (Said::Foreign, Said::Foreign) => Ok(()),
        _ => Err("answers of different kinds".into()),
    }
}

/// A store deciding a case's sets on the case's keys; the `witness` (memory) also reads
/// what a pace set's checks need before the set.
struct SetStore<'s> {
    store: &'s dyn Store,
    policies: &'s [Policy],
    keys: &'s [String],
    witness: bool,
}

impl SetStore<'_> {
    /// Every key's peek (cost 1), in order.
    async fn peeks(&self) -> Vec<Option<Decision>> {
        let mut all = Vec::new();
        for (policy, key) in self.policies.iter().zip(self.keys) {
            all.push(self.store.decide(policy, key, Op::Peek, 1).await.ok());
        }
        all
    }

    /// Decides the set of keys `set` with `op`, reading first, on the witness, each limit's
    /// own pace from now when `own` and every key's peek.
    async fn decide(&self, set: &[usize], op: Op, cost: u64, own: bool) -> Said {
        let requests: Vec<Request> = set
            .iter()
            .map(|&k| Request::new(&self.policies[k], &self.keys[k], op, cost))
            .collect();
        let (mut paces, mut before) = (Vec::new(), Vec::new());
        if self.witness {
            if own {
                for r in &requests {
                    // (A cost a policy can never admit at once is no peek: left out.)
                    let peek = self.store.decide(r.policy, r.key, Op::Peek, r.cost).await;
                    paces.extend(peek.ok());
                }
            }
            before = self.peeks().await;
        }
        let decision = self.store.decide_all(&requests).await;
        Said::Set {
            own: paces,
            before,
            decision,
            after: self.peeks().await,
        }
    }
}

impl differential::Step<Said> for Step {
    fn tick(&self, _: &[Said]) -> Option<Tick> {
        match self {
            Step::Sleep(us) => Some(Tick::By(Duration::from_micros(*us))),
            Step::Set { .. } => None,
        }
    }
}

impl Twin<Step> for SetStore<'_> {
    type Answer = Said;

    async fn apply(&mut self, step: &Step, _: At) -> Said {
        let Step::Set { keys, op, cost } = step else {
            unreachable!("clock steps are the runner's")
        };
        self.decide(keys, *op, *cost, false).await
    }
}

fn next_case_id() -> u64 {
    static CASE: AtomicU64 = AtomicU64::new(0);
    CASE.fetch_add(1, Ordering::Relaxed)
}

/// A step's set, for failure messages.
fn describe(index: usize, op: Op, cost: u64, set: &[usize], policies: &[Policy]) -> String {
    let parts: Vec<String> = set
        .iter()
        .map(|&k| format!("{} on k{k}", policies[k]))
        .collect();
    format!("step {index}: {op:?} cost {cost} of [{}]", parts.join(", "))
}

/// Decides `requests` on every store but the first (memory, whose decision is `expected`)
/// and fails unless each decides as memory did.
async fn alike(
    stores: &[(&str, &dyn Store)],
    requests: &[Request<'_>],
    expected: &Result<SetDecision, Error>,
    what: impl Fn() -> String,
) -> Result<(), TestCaseError> {
    for (name, store) in &stores[1..] {
        let got = store.decide_all(requests).await;
        if let Err(why) = same(expected, &got) {
            return Err(TestCaseError::fail(format!(
                "{}: {name} differs from memory: {why}\n memory: {expected:?}\n {name}: {got:?}",
                what()
            )));
        }
    }
    Ok(())
}

/// Identical set decisions, or errors naming the same field.
fn same(a: &Result<SetDecision, Error>, b: &Result<SetDecision, Error>) -> Result<(), String> {
    match (a, b) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Ok(_), Ok(_)) => Err("decisions differ".into()),
        (Err(Error::Input(a)), Err(Error::Input(b))) if a.field() == b.field() => Ok(()),
        _ => Err("one failed, the other did not".into()),
    }
}

#[test]
fn every_store_decides_sets_alike_and_a_refused_set_changes_nothing() {
    let runtime = runtime();
    let stores = runtime.block_on(Stores::new());
    Cases::new(96).run(&case(), |case| runtime.block_on(stores.run(&case)));
}

#[test]
fn a_cluster_refuses_a_set_across_slots_by_naming_its_keys() {
    let runtime = runtime();
    runtime.block_on(async {
        let cluster = RedisStore::builder(Redis::Cluster.url(), FailurePolicy::FailClosed)
            .prefix("sets-slots")
            .connect()
            .await
            .expect("connect to the test cluster");
        let second: Policy = "gcra:rate=10/s".parse().expect("a policy");
        let day: Policy = "fixed_window:limit=1000,window=1d"
            .parse()
            .expect("a policy");
        // "tenant42:second" and "tenant42:day" hash to different slots.
        let apart = [
            Request::new(&second, "tenant42:second", Op::Limit, 1),
            Request::new(&day, "tenant42:day", Op::Limit, 1),
        ];
        let err = cluster
            .decide_all(&apart)
            .await
            .expect_err("keys across slots");
        let Error::Input(err) = err else {
            panic!("not an input error: {err:?}")
        };
        assert_eq!(err.field(), "limits");
        assert!(err.message().contains("`tenant42:second`"), "{err}");
        assert!(err.message().contains("`tenant42:day`"), "{err}");
        assert!(err.message().contains("hash tag"), "{err}");
        let tagged = [
            Request::new(&second, "{tenant42}:second", Op::Limit, 1),
            Request::new(&day, "{tenant42}:day", Op::Limit, 1),
        ];
        let set = cluster.decide_all(&tagged).await.expect("one slot");
        assert!(set.allowed());
        assert_eq!(set.limits[1].remaining, 999);
        for r in &tagged {
            cluster.reset(r.key).await.expect("clean up");
        }
    });
}

#[test]
fn redis_checks_sets_as_memory_does() {
    let runtime = runtime();
    runtime.block_on(async {
        let redis = RedisStore::builder(Redis::Server.url(), FailurePolicy::FailClosed)
            .prefix("sets-checks")
            .connect()
            .await
            .expect("connect to the test Redis");
        let memory = MemoryStore::new();
        let p: Policy = "gcra:rate=10/s,burst=2".parse().expect("a policy");
        let keys: Vec<String> = (0..=MAX_LIMITS).map(|i| format!("k{i}")).collect();
        let many: Vec<Request> = keys
            .iter()
            .map(|k| Request::new(&p, k, Op::Limit, 1))
            .collect();
        let twice = [
            Request::new(&p, "k", Op::Limit, 1),
            Request::new(&p, "k", Op::Limit, 1),
        ];
        // A pace set holding a policy that cannot book ahead.
        let pacer: Policy = "pacer:rate=10/s".parse().expect("a policy");
        let paced = [
            Request::new(&p, "a", Op::pace(), 1),
            Request::new(&pacer, "b", Op::pace(), 1),
        ];
        let costly = [Request::new(&p, "a", Op::Limit, 3)];
        let cases: [(&[Request], &str); 5] = [
            (&[], "limits"),
            (&many, "limits"),
            (&twice, "limits"),
            (&paced, "op"),
            (&costly, "cost"),
        ];
        for (requests, field) in cases {
            for (name, store) in [("memory", &memory as &dyn Store), ("redis", &redis)] {
                match store.decide_all(requests).await {
                    Err(Error::Input(e)) => assert_eq!(e.field(), field, "{name}: {e}"),
                    other => panic!("{name}: expected an input error on `{field}`, got {other:?}"),
                }
            }
        }
    });
}

/// One policy of each algorithm that books slots ahead (a `pace` set's), with small limits
/// so that the sets' slots fall in later windows and apart.
fn bookable_spec() -> impl Strategy<Value = String> {
    prop_oneof![
        (1..=20u64, 1..=3u64).prop_map(|(r, b)| format!("gcra:rate={r}/s,burst={b}")),
        (2..=5u64, 100..=2000u64).prop_map(|(l, w)| format!("fixed_window:limit={l},window={w}ms")),
        (2..=5u64, 100..=2000u64, 0..=300u64)
            .prop_map(|(l, w, m)| format!("sliding_log:limit={l},window={w}ms,min_interval={m}ms")),
        (1..=20u64).prop_map(|r| format!("smooth_bursty:rate={r}/s")),
        (1..=20u64, 100..=2000u64)
            .prop_map(|(r, w)| format!("smooth_warming_up:rate={r}/s,warmup={w}ms")),
        // A year's window: slots months away (times past 2^53 ns).
        (1..=2u64).prop_map(|l| format!("fixed_window:limit={l},window=365d")),
        (1..=3u64).prop_map(|b| format!("gcra:rate=3/s,burst={b}")),
    ]
}

#[derive(Clone, Debug)]
enum PaceStep {
    Sleep(u64),
    /// A `limit` on key `k` by a policy of another algorithm than its own: the key's
    /// state is foreign to its own policy until it writes its own.
    Foreign(usize),
    /// A set of distinct key numbers: paced (with a max wait in ms, if any), or limited.
    Set {
        keys: Vec<usize>,
        pace: Option<Option<u64>>,
        cost: u64,
    },
}

fn pace_case() -> impl Strategy<Value = (Vec<String>, Vec<PaceStep>)> {
    prop::collection::vec(bookable_spec(), 2..=4).prop_flat_map(|specs| {
        let n = specs.len();
        let set = (
            prop::sample::subsequence((0..n).collect::<Vec<_>>(), 2..=n.min(3)),
            prop_oneof![
                4 => Just(Some(None)),
                3 => (0..=1500u64).prop_map(|w| Some(Some(w))),
                2 => Just(None),
            ],
            prop_oneof![4 => Just(1u64), 1 => Just(2u64)],
        )
            .prop_flat_map(|(keys, pace, cost)| {
                Just(keys)
                    .prop_shuffle()
                    .prop_map(move |keys| PaceStep::Set { keys, pace, cost })
            });
        let step = prop_oneof![
            1 => Just(PaceStep::Sleep(0)),
            3 => (0..=400_000u64).prop_map(PaceStep::Sleep),
            1 => (0..n).prop_map(PaceStep::Foreign),
            10 => set,
        ];
        (Just(specs), prop::collection::vec(step, 1..40))
    })
}

impl differential::Step<Said> for PaceStep {
    fn tick(&self, _: &[Said]) -> Option<Tick> {
        match self {
            PaceStep::Sleep(us) => Some(Tick::By(Duration::from_micros(*us))),
            _ => None,
        }
    }
}

impl Twin<PaceStep> for SetStore<'_> {
    type Answer = Said;

    async fn apply(&mut self, step: &PaceStep, _: At) -> Said {
        match step {
            PaceStep::Foreign(k) => {
                let other: Policy = if self.policies[*k].algorithm() == "sliding_log" {
                    "gcra:rate=2/s,burst=2".parse().expect("a policy")
                } else {
                    "sliding_log:limit=2,window=1s".parse().expect("a policy")
                };
                // Refused or admitted alike on every store (checked by the peeks).
                let _ = self
                    .store
                    .decide(&other, &self.keys[*k], Op::Limit, 1)
                    .await;
                Said::Foreign
            }
            PaceStep::Set { keys, pace, cost } => {
                let op = match pace {
                    Some(max_wait) => Op::Pace {
                        max_wait: max_wait.map(Duration::from_millis),
                    },
                    None => Op::Limit,
                };
                self.decide(keys, op, *cost, pace.is_some()).await
            }
            PaceStep::Sleep(_) => unreachable!("clock steps are the runner's"),
        }
    }
}

impl Stores {
    /// A case of `pace` (and `limit`) sets: every store decides alike; an admitted pace set
    /// gives every limit the set's delay, at least each limit's own; a refused one changes
    /// no key.
    async fn run_paced(&self, specs: &[String], steps: &[PaceStep]) -> Result<(), TestCaseError> {
        let id = next_case_id();
        self.clock.set_micros(EPOCH_2023 + id * 3_600_000_000);
        let policies: Vec<Policy> = specs
            .iter()
            .map(|s| s.parse().expect("generated specs are valid"))
            .collect();
        let keys: Vec<String> = (0..policies.len())
            .map(|k| format!("{{paced{id}}}:k{k}"))
            .collect();
        let twin = |store, witness| SetStore {
            store,
            policies: &policies,
            keys: &keys,
            witness,
        };
        let mut memory = twin(&self.memory, true);
        let mut twins = [
            ("redis", twin(&self.redis, false)),
            ("redis (as a script)", twin(&self.redis_scripts, false)),
            ("cluster", twin(&self.cluster, false)),
        ];
        let check = |index: usize, step: &PaceStep, said: &Said| {
            let (
                PaceStep::Set {
                    keys: set,
                    pace: Some(max_wait),
                    cost,
                },
                Said::Set {
                    own,
                    before,
                    decision: Ok(set_decision),
                    after,
                },
            ) = (step, said)
            else {
                return Ok(());
            };
            let op = Op::Pace {
                max_wait: max_wait.map(Duration::from_millis),
            };
            let what = describe(index, op, *cost, set, &policies);
            let set = set_decision;
            if set.allowed() {
                // Every limit acts at the set's slot (the same microsecond: past 2^53
                // ns, some delays are a double's nanoseconds, others exact).
                let us = paceline_core::round_to_micros;
                for d in &set.limits {
                    if !d.allowed || us(d.delay) != us(set.decision.delay) {
                        return Err(format!("{what}: a limit does not act at the set's slot"));
                    }
                }
                // A limit that refuses now makes the set wait (a peek's retry-after is
                // its earliest admission; the set's slot is no earlier).
                for d in own {
                    if !d.allowed && set.decision.delay < d.delay {
                        return Err(format!(
                            "{what}: the set acts before a limit admits ({:?} < {:?})",
                            set.decision.delay, d.delay
                        ));
                    }
                }
            } else {
                if set.refused().count() == 0 {
                    return Err(format!("{what}: refused by none"));
                }
                if after != before {
                    return Err(format!("{what}: a refused pace set changed a key"));
                }
            }
            Ok(())
        };
        let mut differential = Differential::agreeing(&self.clock, same_said).check(check);
        let answers = differential
            .run(steps, ("memory", &mut memory), &mut twins)
            .await;
        answers.map(|_| ())
    }
}

#[test]
fn every_store_paces_sets_alike_at_the_time_every_limit_admits() {
    let runtime = runtime();
    let stores = runtime.block_on(Stores::new());
    Cases::new(64).run(&pace_case(), |(specs, steps)| {
        runtime.block_on(stores.run_paced(&specs, &steps))
    });
}

#[test]
fn a_paced_set_books_the_latest_limits_slot_on_every_limit() {
    let clock = ManualClock::new(10_000_000); // 10 s: a window of 10 s starts
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let second: Policy = "gcra:rate=2/s,burst=1".parse().expect("a policy");
    let window: Policy = "fixed_window:limit=2,window=10s".parse().expect("a policy");
    let set = paceline_store::Limits::new()
        .with(second.clone(), "t:second")
        .with(window.clone(), "t:window");
    let delays: Vec<u64> = (0..5)
        .map(|_| {
            let d = set.pace_sync(&memory, 1, None).expect("a pace set");
            assert!(d.allowed());
            assert!(d.limits.iter().all(|l| l.delay == d.decision.delay));
            d.decision.delay.as_millis() as u64
        })
        .collect();
    // Two per 10 s window, and 500 ms apart: 0, 0.5 s, then the next window's start (20 s
    // from the epoch, 10 s away), 10.5 s, then 20 s.
    assert_eq!(delays, [0, 500, 10_000, 10_500, 20_000]);
    // A wait beyond max_wait refuses the set, and changes no key.
    let before = (
        memory.decide_sync(&second, "t:second", Op::Peek, 1),
        memory.decide_sync(&window, "t:window", Op::Peek, 1),
    );
    let refused = set
        .pace_sync(&memory, 1, Some(Duration::from_secs(15)))
        .expect("a pace set");
    assert!(!refused.allowed());
    // The window has room from 30 s on, but the per-second limit's next slot is 30.5 s
    // (20.5 s away): it sets the slot, 5.5 s beyond the max wait. The window, alone, would
    // refuse too (its 30 s are 5 s beyond).
    assert_eq!(refused.refused().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(refused.limits[0].delay, Duration::from_millis(5_500));
    assert_eq!(refused.limits[1].delay, Duration::from_secs(5));
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(5_500)));
    let after = (
        memory.decide_sync(&second, "t:second", Op::Peek, 1),
        memory.decide_sync(&window, "t:window", Op::Peek, 1),
    );
    assert_eq!(format!("{before:?}"), format!("{after:?}"));
}

/// A `pace` set whose slot lies past a window algorithm's horizon (`MAX_BOOKED_WINDOWS`
/// windows ahead) is refused on every store alike, by that limit, and changes no key.
#[test]
fn a_paced_set_past_a_windows_horizon_is_refused_alike_and_changes_nothing() {
    let runtime = runtime();
    let stores = runtime.block_on(Stores::new());
    runtime.block_on(async {
        let id = next_case_id();
        let now = EPOCH_2023 + id * 3_600_000_000 + 300; // 300 µs into a 1 ms window
        stores.clock.set_micros(now);
        let hour: Policy = "gcra:rate=1/h,burst=1".parse().expect("a policy");
        let window: Policy = "fixed_window:limit=1,window=1ms".parse().expect("a policy");
        let keys = [
            format!("{{horizon{id}}}:hour"),
            format!("{{horizon{id}}}:window"),
        ];
        let requests = [
            Request::new(&hour, &keys[0], Op::pace(), 1),
            Request::new(&window, &keys[1], Op::pace(), 1),
        ];
        let all = stores.all();
        let peeks = || async {
            let mut got = Vec::new();
            for (_, store) in &all {
                got.push(format!(
                    "{:?} {:?}",
                    store.decide(&hour, &keys[0], Op::Peek, 1).await,
                    store.decide(&window, &keys[1], Op::Peek, 1).await
                ));
            }
            got
        };
        let first = stores.memory.decide_all(&requests).await;
        alike(&all, &requests, &first, || "the first set".into())
            .await
            .unwrap();
        assert!(first.unwrap().allowed());
        // The hour's next slot is an hour away: window 3,600,000 from now's, past the horizon.
        let before = peeks().await;
        let refused = stores.memory.decide_all(&requests).await;
        alike(&all, &requests, &refused, || "the second set".into())
            .await
            .unwrap();
        let refused = refused.unwrap();
        assert!(!refused.allowed());
        assert_eq!(refused.refused().collect::<Vec<_>>(), [1]);
        // (slot window - 10,000 + 1) * 1 ms - now: window 3,590,001 from now's, 300 µs in.
        let retry = Duration::from_micros(3_590_001_000 - 300);
        assert_eq!(refused.limits[1].delay, retry);
        assert_eq!(refused.retry_after(), Some(retry));
        assert_eq!(peeks().await, before, "a refused pace set changed a key");
        // With a max_wait the slot already lies beyond, the later of the two retries, as a
        // single pace answers: the hour's slot, an hour away, less the second waited.
        let within = Op::pace_within(Duration::from_secs(1));
        let waiting = [
            Request::new(&hour, &keys[0], within, 1),
            Request::new(&window, &keys[1], within, 1),
        ];
        let refused = stores.memory.decide_all(&waiting).await;
        alike(&all, &waiting, &refused, || {
            "the set with a max_wait".into()
        })
        .await
        .unwrap();
        let refused = refused.unwrap();
        assert!(!refused.allowed());
        assert_eq!(refused.retry_after(), Some(Duration::from_secs(3_599)));
        assert_eq!(peeks().await, before, "a refused pace set changed a key");
    });
}
