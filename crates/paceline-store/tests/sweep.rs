//! `StoreOptions::sweep_every`: a memory store opened by `open` gives back its idle keys
//! while it receives no calls at all.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use paceline_store::{open, Clock, Error, Limiter, ManualClock, SharedStore, StoreOptions};

const KEYS: usize = 10_000;
const START_US: u64 = 1_700_000_000_000_000;

/// How many of the burst's keys `limiter`'s store still holds, seen without letting it drop
/// any: with the clock set back to the burst's time, a held key is refused (its state says
/// it has just acted) while a dropped one starts afresh and is admitted; and at that time no
/// key is idle, so the sweeping these calls do drops none. The clock is then put back.
async fn held(limiter: &Limiter<dyn paceline_store::Store>, clock: &ManualClock) -> usize {
    let now = clock.now_micros();
    clock.set_micros(START_US);
    let mut held = 0;
    for user in 0..KEYS {
        if !limiter
            .limit(&format!("user:{user}"), 1)
            .await
            .unwrap()
            .allowed
        {
            held += 1;
        }
    }
    clock.set_micros(now);
    held
}

#[tokio::test(start_paused = true)]
async fn a_memory_store_with_sweep_every_drops_idle_keys_without_calls() {
    let clock = ManualClock::new(START_US);
    let options = StoreOptions::new()
        .clock(Arc::new(clock.clone()))
        .sweep_every(Some(Duration::from_secs(1)));
    let store: SharedStore = open("memory", &options).await.unwrap();
    // The sweeping task starts its period when it first runs (on a real runtime, at once).
    tokio::task::yield_now().await;
    let limiter = Limiter::with_store("gcra:rate=1/s".parse().unwrap(), store);
    for user in 0..KEYS {
        assert!(
            limiter
                .limit(&format!("user:{user}"), 1)
                .await
                .unwrap()
                .allowed
        );
    }
    assert_eq!(
        held(&limiter, &clock).await,
        KEYS,
        "the burst's keys are held"
    );

    // Every key is idle now, and no call comes: only the sweeping task can drop them.
    clock.advance(Duration::from_secs(2));
    assert_eq!(held(&limiter, &clock).await, KEYS, "nothing swept them yet");
    tokio::time::advance(Duration::from_millis(1_500)).await;
    // Lets the task finish its pass (it yields between slices) before time moves on.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        held(&limiter, &clock).await,
        0,
        "the sweeping task dropped them"
    );
}

#[tokio::test(start_paused = true)]
async fn without_sweep_every_idle_keys_stay_until_a_call() {
    let clock = ManualClock::new(START_US);
    let options = StoreOptions::new().clock(Arc::new(clock.clone()));
    let store: SharedStore = open("memory", &options).await.unwrap();
    tokio::task::yield_now().await;
    let limiter = Limiter::with_store("gcra:rate=1/s".parse().unwrap(), store);
    for user in 0..KEYS {
        limiter.limit(&format!("user:{user}"), 1).await.unwrap();
    }
    clock.advance(Duration::from_secs(2));
    tokio::time::advance(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(held(&limiter, &clock).await, KEYS);
}

#[test]
fn sweep_every_outside_a_tokio_runtime_is_an_input_error_naming_it() {
    let options = StoreOptions::new().sweep_every(Some(Duration::from_secs(1)));
    let opening = pin!(open("memory", &options));
    let mut cx = Context::from_waker(Waker::noop());
    match opening.poll(&mut cx) {
        Poll::Ready(Err(Error::Input(e))) => assert_eq!(e.field(), "sweep_every"),
        other => panic!(
            "expected an input error: {:?}",
            other.map(|r| r.map(|_| ()))
        ),
    }
    // Without it, a memory store opens anywhere.
    let defaults = StoreOptions::new();
    let opening = pin!(open("memory", &defaults));
    assert!(matches!(opening.poll(&mut cx), Poll::Ready(Ok(_))));
}
