//! Concurrency leases ([`Store::release`], [`Store::extend`] and `concurrency` decisions)
//! on every store.
//!
//! * **Differential**: proptest generates a `concurrency` policy and steps that advance an
//!   injected clock, take leases (`limit`, `peek`, costs 1 and 2), release or extend one of
//!   the leases taken (live, released, expired, or never issued); the memory store, Redis
//!   (functions and script) and a Redis Cluster must answer alike, lease ids included.
//! * **Reclaiming**: a lease not released by its expiry comes back on its own, on the
//!   virtual clock, on every store.
//!
//! `PROPTEST_CASES` sets the number of cases (default 96).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use paceline_store::{Decision, Error, ManualClock, MemoryStore, Op, Policy, Store};
use paceline_testkit::{shared_cluster, shared_server};
use proptest::prelude::*;

const EPOCH_2023: u64 = 1_700_000_000_000_000;

#[derive(Clone, Debug)]
enum Step {
    Sleep(u64),
    Take {
        peek: bool,
        cost: u64,
    },
    /// Release (or extend) the lease taken `.0`-th from last (or an id never issued).
    Release(usize),
    Extend(usize),
}

fn case() -> impl Strategy<Value = (String, Vec<Step>)> {
    let spec =
        (1..=4u64, 50..=3_000u64).prop_map(|(l, ms)| format!("concurrency:limit={l},lease={ms}ms"));
    let step = prop_oneof![
        2 => Just(Step::Sleep(0)),
        3 => (0..=2_000_000u64).prop_map(Step::Sleep),
        6 => (prop::bool::weighted(0.2), 1..=2u64).prop_map(|(peek, cost)| Step::Take { peek, cost }),
        3 => (0..6usize).prop_map(Step::Release),
        2 => (0..6usize).prop_map(Step::Extend),
    ];
    (spec, prop::collection::vec(step, 1..50))
}

struct Stores {
    clock: ManualClock,
    stores: Vec<(&'static str, Box<dyn Store>)>,
}

impl Stores {
    async fn new() -> Stores {
        let clock = ManualClock::new(EPOCH_2023);
        let connect = |url: String, scripts: bool, prefix: &'static str| {
            let clock = clock.clone();
            async move { paceline_testkit::redis_store_on(url, prefix, &clock, scripts).await }
        };
        let stores: Vec<(&'static str, Box<dyn Store>)> = vec![
            (
                "memory",
                Box::new(MemoryStore::builder().clock(clock.clone()).build()),
            ),
            (
                "redis",
                Box::new(connect(shared_server().url(), false, "leases").await),
            ),
            (
                "redis (as a script)",
                Box::new(connect(shared_server().url(), true, "leases-scripts").await),
            ),
            (
                "cluster",
                Box::new(connect(shared_cluster().url(), false, "leases").await),
            ),
        ];
        Stores { clock, stores }
    }

    async fn run(&self, spec: &str, steps: &[Step]) -> Result<(), TestCaseError> {
        let id = next_case_id();
        self.clock.set_micros(EPOCH_2023 + id * 3_600_000_000);
        let policy: Policy = spec.parse().expect("a valid spec");
        let key = format!("case{id}");
        let mut issued: Vec<u64> = Vec::new();
        for (index, step) in steps.iter().enumerate() {
            let pick = |back: &usize| issued.len().checked_sub(back + 1).map_or(7, |i| issued[i]);
            let answers: Vec<(&str, Answer)> = match step {
                Step::Sleep(us) => {
                    self.clock.advance(Duration::from_micros(*us));
                    continue;
                }
                Step::Take { peek, cost } => {
                    let op = if *peek { Op::Peek } else { Op::Limit };
                    let mut answers = Vec::new();
                    for (name, store) in &self.stores {
                        let d = store.decide(&policy, &key, op, *cost).await;
                        answers.push((*name, Answer::Decided(d)));
                    }
                    answers
                }
                Step::Release(back) => {
                    let lease = pick(back);
                    let mut answers = Vec::new();
                    for (name, store) in &self.stores {
                        let r = store.release(&policy, &key, lease).await;
                        answers.push((*name, Answer::Released(r)));
                    }
                    answers
                }
                Step::Extend(back) => {
                    let lease = pick(back);
                    let mut answers = Vec::new();
                    for (name, store) in &self.stores {
                        let r = store.extend(&policy, &key, lease).await;
                        answers.push((*name, Answer::Extended(r)));
                    }
                    answers
                }
            };
            let (_, expected) = &answers[0];
            for (name, got) in &answers[1..] {
                prop_assert!(
                    got.same(expected),
                    "step {} ({:?}) of {}: {} answered {:?}, memory {:?}",
                    index,
                    step,
                    spec,
                    name,
                    got,
                    expected
                );
            }
            if let Answer::Decided(Ok(Decision {
                lease: Some(lease), ..
            })) = expected
            {
                issued.push(*lease);
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
enum Answer {
    Decided(Result<Decision, Error>),
    Released(Result<bool, Error>),
    Extended(Result<Option<Duration>, Error>),
}

impl Answer {
    fn same(&self, other: &Answer) -> bool {
        fn ok<T: PartialEq>(a: &Result<T, Error>, b: &Result<T, Error>) -> bool {
            match (a, b) {
                (Ok(a), Ok(b)) => a == b,
                (Err(Error::Input(a)), Err(Error::Input(b))) => a.field() == b.field(),
                _ => false,
            }
        }
        match (self, other) {
            (Answer::Decided(a), Answer::Decided(b)) => ok(a, b),
            (Answer::Released(a), Answer::Released(b)) => ok(a, b),
            (Answer::Extended(a), Answer::Extended(b)) => ok(a, b),
            _ => false,
        }
    }
}

fn next_case_id() -> u64 {
    static CASE: AtomicU64 = AtomicU64::new(0);
    CASE.fetch_add(1, Ordering::Relaxed)
}

use paceline_testkit::{check_cases, runtime};

#[test]
fn every_store_takes_releases_and_extends_leases_alike() {
    let runtime = runtime();
    let stores = runtime.block_on(Stores::new());
    check_cases(96, &case(), |(spec, steps)| {
        runtime.block_on(stores.run(&spec, &steps))
    });
}

#[test]
fn a_lease_not_released_is_reclaimed_at_its_expiry_on_every_store() {
    let runtime = runtime();
    runtime.block_on(async {
        let stores = Stores::new().await;
        let policy: Policy = "concurrency:limit=2,lease=30s".parse().expect("a policy");
        for (name, store) in &stores.stores {
            let key = paceline_testkit::unique_name("reclaimed");
            stores.clock.set_micros(EPOCH_2023);
            let a = store.decide(&policy, &key, Op::Limit, 1).await.expect("a");
            let b = store.decide(&policy, &key, Op::Limit, 1).await.expect("b");
            assert!(a.allowed && b.allowed, "{name}");
            stores.clock.advance(Duration::from_secs(10));
            // `b` is extended: it now lives until 40 s; `a` still ends at 30 s.
            let renewed = store.extend(&policy, &key, b.lease.expect("a lease")).await;
            assert_eq!(
                renewed.expect("extend"),
                Some(Duration::from_secs(30)),
                "{name}"
            );
            let full = store
                .decide(&policy, &key, Op::Limit, 1)
                .await
                .expect("full");
            assert!(!full.allowed, "{name}");
            assert_eq!(
                full.delay,
                Duration::from_secs(20),
                "{name}: until `a` expires"
            );
            stores
                .clock
                .advance(Duration::from_secs(20) - Duration::from_micros(1));
            let still = store
                .decide(&policy, &key, Op::Peek, 1)
                .await
                .expect("peek");
            assert!(!still.allowed, "{name}: a microsecond before the expiry");
            stores.clock.advance(Duration::from_micros(1));
            let c = store.decide(&policy, &key, Op::Limit, 1).await.expect("c");
            assert!(c.allowed, "{name}: `a` was reclaimed");
            let released = store
                .release(&policy, &key, a.lease.expect("a lease"))
                .await;
            assert!(!released.expect("release"), "{name}: `a` is gone already");
            let released = store
                .release(&policy, &key, b.lease.expect("a lease"))
                .await;
            assert!(released.expect("release"), "{name}: `b` was live");
            let gcra: Policy = "gcra:rate=1/s".parse().expect("a policy");
            match store.release(&gcra, &key, 1).await {
                Err(Error::Input(e)) => assert_eq!(e.field(), "policy", "{name}"),
                other => panic!("{name}: a gcra release answered {other:?}"),
            }
            store.reset(&key).await.expect("clean up");
        }
    });
}
