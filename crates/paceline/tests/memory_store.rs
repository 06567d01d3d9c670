//! The in-memory store: bounded memory, the key cap, reset, and the async Limiter surface.

use std::sync::Arc;
use std::time::Duration;

use paceline::store::{MemoryStore, StoreErrorKind};
use paceline::time::{Clock, ManualClock};
use paceline::{Error, Limiter, Policy};

fn limiter(spec: &str, store: &Arc<MemoryStore>) -> Limiter {
    let policy: Policy = spec.parse().unwrap();
    Limiter::with_store(policy, Arc::clone(store))
}

fn store_on(clock: &ManualClock) -> Arc<MemoryStore> {
    Arc::new(MemoryStore::builder().clock(clock.clone()).build())
}

/// Every key in one shard, so that one table grows, rehashes and is swept.
fn one_shard_store(clock: &ManualClock) -> Arc<MemoryStore> {
    Arc::new(
        MemoryStore::builder()
            .clock(clock.clone())
            .shards(1)
            .build(),
    )
}

#[test]
fn idle_keys_are_dropped_so_memory_follows_active_keys() {
    let clock = ManualClock::new(0);
    let store = one_shard_store(&clock);
    let l = limiter("gcra:rate=10/s", &store); // each key idle 100 ms after its request
    for round in 0..50u64 {
        for k in 0..1_000 {
            assert!(l.limit_sync(&format!("r{round}:k{k}"), 1).unwrap().allowed);
        }
        // Each key is idle 100 ms after its request; a second later it is swept when the
        // shard grows.
        clock.advance(Duration::from_millis(1_100));
        assert!(
            store.len() <= 2 * 1_000 + 64,
            "round {round}: {} keys",
            store.len()
        );
    }
    let held = store.len();
    assert!(held >= 1_000);
    assert_eq!(store.purge_idle(), held, "every key is idle now");
    assert!(store.is_empty());
}

#[test]
fn an_idle_state_is_forgotten_even_before_a_sweep() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let l = limiter("fixed_window:limit=1,window=1s", &store);
    assert!(l.limit_sync("k", 1).unwrap().allowed);
    assert!(!l.limit_sync("k", 1).unwrap().allowed);
    clock.set_micros(1_000_000);
    assert!(l.limit_sync("k", 1).unwrap().allowed);
    assert_eq!(store.len(), 1);
}

#[test]
fn the_key_cap_refuses_new_keys_loudly_and_recovers_when_keys_go_idle() {
    let clock = ManualClock::new(0);
    let store = Arc::new(
        MemoryStore::builder()
            .clock(clock.clone())
            .max_keys(2)
            .build(),
    );
    let l = limiter("gcra:rate=1/s", &store);
    assert!(l.limit_sync("a", 1).unwrap().allowed);
    assert!(l.limit_sync("b", 1).unwrap().allowed);
    match l.limit_sync("c", 1) {
        Err(Error::Store(e)) => {
            assert_eq!(e.kind(), StoreErrorKind::Capacity);
            assert!(e.message().contains("max_keys"), "{e}");
        }
        other => panic!("expected a capacity error, got {other:?}"),
    }
    // Existing keys keep their limits; a peek of a new key needs no room.
    assert!(!l.limit_sync("a", 1).unwrap().allowed);
    assert!(l.peek_sync("c", 1).unwrap().allowed);
    // Once "a" and "b" are idle, "c" gets in.
    clock.advance(Duration::from_secs(1));
    assert!(l.limit_sync("c", 1).unwrap().allowed);
    assert!(store.len() <= 2);
}

#[test]
fn invalid_input_is_an_input_error_and_changes_nothing() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let l = limiter("fixed_window:limit=5,window=1s", &store);
    match l.limit_sync("k", 6) {
        Err(Error::Input(e)) => assert_eq!(e.field(), "cost"),
        other => panic!("expected an input error, got {other:?}"),
    }
    assert!(matches!(l.pace_sync("k", 0), Err(Error::Input(_))));
    assert!(store.is_empty());
}

#[test]
fn reset_forgets_a_key() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let l = limiter("fixed_window:limit=1,window=1h", &store);
    assert!(l.limit_sync("k", 1).unwrap().allowed);
    assert!(!l.limit_sync("k", 1).unwrap().allowed);
    l.reset_sync("k").unwrap();
    assert!(store.is_empty());
    assert!(l.limit_sync("k", 1).unwrap().allowed);
    l.reset_sync("never-seen").unwrap();
}

#[test]
fn limiters_sharing_a_store_share_keys_and_a_new_policy_is_a_live_change() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let one = limiter("gcra:rate=1/s,burst=1", &store);
    let two = limiter("gcra:rate=1/s,burst=2", &store);
    assert!(one.limit_sync("k", 1).unwrap().allowed);
    assert!(!one.limit_sync("k", 1).unwrap().allowed);
    assert!(
        two.limit_sync("k", 1).unwrap().allowed,
        "burst 2 has room for one more"
    );
    assert!(!two.limit_sync("k", 1).unwrap().allowed);
}

#[test]
fn a_foreign_state_keeps_its_expiry_when_peeked() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let window = limiter("fixed_window:limit=1,window=1h", &store);
    let gcra = limiter("gcra:rate=1/s", &store);
    assert!(window.limit_sync("k", 1).unwrap().allowed);
    assert!(gcra.peek_sync("k", 1).unwrap().allowed);
    clock.advance(Duration::from_secs(60));
    assert!(
        !window.limit_sync("k", 1).unwrap().allowed,
        "the window's count survived the peek"
    );
}

/// A backlog past a window policy's horizon: `pace` refuses, booking nothing, and
/// `acquire` waits until its slot comes within the horizon, then books it and waits for it:
/// it never returns without a slot.
#[tokio::test(flavor = "current_thread")]
async fn acquire_past_the_horizon_waits_then_books() {
    use paceline::policy::MAX_BOOKED_WINDOWS;
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let l = limiter("fixed_window:limit=1,window=1ms", &store);
    // Windows 0 to H - 1 booked, one each.
    for window in 0..MAX_BOOKED_WINDOWS {
        let d = l.pace("k", 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.delay, Duration::from_millis(window));
    }
    let refused = l.pace("k", 1).await.unwrap();
    assert!(!refused.allowed);
    // Window H comes within the horizon when window 1 opens.
    assert_eq!(refused.delay, Duration::from_millis(1));
    let d = l.acquire("k", 1).await.unwrap();
    assert!(d.allowed);
    // Booked window H from 1 ms, and waited until it opened.
    assert_eq!(clock.now_micros(), MAX_BOOKED_WINDOWS * 1_000);
}

#[tokio::test(flavor = "current_thread")]
async fn acquire_waits_in_the_stores_time() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let l = limiter("gcra:rate=10/s", &store);
    let first = l.acquire("k", 1).await.unwrap();
    assert!(first.is_immediate());
    let second = l.acquire("k", 1).await.unwrap();
    assert_eq!(second.delay, Duration::from_millis(100));
    assert_eq!(
        clock.now_micros(),
        100_000,
        "the virtual clock advanced by the delay"
    );
    // Bounded wait: the slot at 200 ms is 100 ms away; 50 ms is not enough.
    let refused = l
        .try_acquire("k", 1, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(50)));
    assert_eq!(clock.now_micros(), 100_000, "a refusal does not wait");
    let ok = l
        .try_acquire("k", 1, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(ok.allowed);
    assert_eq!(clock.now_micros(), 200_000);
}

#[tokio::test(flavor = "current_thread")]
async fn async_and_sync_surfaces_agree() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let l = limiter("gcra:rate=10/s,burst=2", &store);
    assert_eq!(l.limit("k", 1).await.unwrap().remaining, 1);
    assert_eq!(l.peek("k", 1).await.unwrap().remaining, 1);
    assert_eq!(l.pace("k", 1).await.unwrap().remaining, 0);
    let d = l.try_pace("k", 1, Duration::ZERO).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d, l.try_pace_sync("k", 1, Duration::ZERO).unwrap());
    l.reset("k").await.unwrap();
    assert_eq!(l.peek_sync("k", 1).unwrap().remaining, 2);
}

#[tokio::test(start_paused = true)]
async fn acquire_on_the_system_clock_sleeps_with_tokio() {
    // Tokio's paused clock auto-advances while the task sleeps; no real time passes.
    // One an hour: the second waits most of an hour of tokio's time, however much real
    // time (the limiter's clock) passed between the two.
    let l = Limiter::from_spec("gcra:rate=1/h").unwrap();
    let start = tokio::time::Instant::now();
    l.acquire("k", 1).await.unwrap();
    let second = l.acquire("k", 1).await.unwrap();
    assert!(second.delay > Duration::from_secs(3_500));
    assert!(tokio::time::Instant::now() - start >= second.delay);
}

#[test]
fn a_peek_under_a_shorter_window_does_not_shorten_the_keys_life() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    let hour = limiter("sliding_log:limit=1,window=1h", &store);
    let second = limiter("sliding_log:limit=1,window=1s", &store);
    assert!(hour.limit_sync("k", 1).unwrap().allowed);
    assert!(!second.peek_sync("k", 1).unwrap().allowed);
    clock.set_micros(2_000_000);
    store.purge_idle();
    let d = hour.limit_sync("k", 1).unwrap();
    assert!(!d.allowed, "the hour-long log survived the peek");
    assert_eq!(d.retry_after(), Some(Duration::from_secs(3_598)));
}

#[test]
fn keys_of_every_length_stay_distinct_through_table_growth() {
    // Keys up to 15 bytes are held inside their entry, longer ones on the heap; the table
    // grows and rehashes many times on the way to 3,000 keys in one shard.
    let clock = ManualClock::new(0);
    let store = one_shard_store(&clock);
    let l = limiter("gcra:rate=1/h", &store);
    let key = |i: usize| -> String {
        let stem = format!("k{i}");
        match i % 6 {
            0 => stem,
            1 => format!("{stem}\0"), // differs from `stem` only by a NUL
            2 => format!("{stem:\0<15}"), // exactly 15 bytes: the longest held inline
            3 => format!("{stem:x<16}"), // just past inline
            4 => format!("{stem}:{}", "é".repeat(40)), // long, multi-byte
            _ => format!("{:\0<width$}", "", width = i % 17), // NULs only, 0..=16 bytes
        }
    };
    let keys: Vec<String> = (0..3_000).map(key).collect();
    let distinct: std::collections::HashSet<&String> = keys.iter().collect();
    let mut first = 0;
    for k in &keys {
        // A key's first request is admitted, any later one refused (1 per hour).
        let seen_before = !l.limit_sync(k, 1).unwrap().allowed;
        first += usize::from(!seen_before);
    }
    assert_eq!(first, distinct.len(), "one admission per distinct key");
    assert_eq!(store.len(), distinct.len());
    for k in &keys {
        assert!(!l.limit_sync(k, 1).unwrap().allowed, "{k:?} kept its state");
    }
    // Reset finds inline and heap keys alike, and only them.
    l.reset_sync(&keys[2]).unwrap();
    l.reset_sync(&keys[3]).unwrap();
    assert!(l.limit_sync(&keys[2], 1).unwrap().allowed);
    assert!(l.limit_sync(&keys[3], 1).unwrap().allowed);
    assert!(!l.limit_sync(&keys[8], 1).unwrap().allowed);
    assert!(!l.limit_sync(&keys[9], 1).unwrap().allowed);
}

#[test]
fn a_clock_past_the_supported_range_is_refused_for_existing_keys_too() {
    let clock = ManualClock::new(0);
    let store = store_on(&clock);
    for spec in ["gcra:rate=1/s", "pacer:rate=1/s"] {
        let l = limiter(spec, &store);
        assert!(l.limit_sync("k", 1).unwrap().allowed);
        clock.set_micros(paceline_core::policy::MAX_NOW_US + 1);
        match l.limit_sync("k", 1) {
            Err(Error::Input(e)) => assert_eq!(e.field(), "now", "{spec}: {e}"),
            other => panic!("{spec}: expected an input error on `now`, got {other:?}"),
        }
        clock.set_micros(0);
        store.clear();
    }
}

/// `burst` keys that go idle 100 ms after their request, then `active` keys.
fn burst_then_active(l: &Limiter, burst: usize, active: usize) -> Vec<String> {
    for k in 0..burst {
        assert!(l.limit_sync(&format!("burst:{k}"), 1).unwrap().allowed);
    }
    let active: Vec<String> = (0..active).map(|k| format!("active:{k}")).collect();
    for k in &active {
        assert!(l.limit_sync(k, 1).unwrap().allowed);
    }
    active
}

fn store_with_shards(clock: &ManualClock, shards: usize) -> Arc<MemoryStore> {
    Arc::new(
        MemoryStore::builder()
            .clock(clock.clone())
            .shards(shards)
            .build(),
    )
}

#[test]
fn idle_keys_memory_comes_back_within_the_documented_number_of_calls() {
    const BURST: usize = 50_000;
    const ACTIVE: usize = 8;
    const SHARDS: usize = 64;
    let clock = ManualClock::new(0);
    let store = store_with_shards(&clock, SHARDS);
    let l = limiter("gcra:rate=10/s", &store);
    let active = burst_then_active(&l, BURST, ACTIVE);
    assert_eq!(store.len(), BURST + ACTIVE);
    let slots = store.slots();
    assert!(slots > BURST, "{slots} slots");
    // Past the burst keys' idle time (100 ms) and the sweep period (1 s).
    clock.advance(Duration::from_millis(1_100));
    // One call pays for one slice of the pass, not for the whole store.
    assert!(l.limit_sync(&active[0], 1).unwrap().allowed);
    assert!(
        store.len() >= BURST + ACTIVE - 1_024,
        "one call visited at most 1,024 slots: {} keys left",
        store.len()
    );
    // The bound in `MemoryStore`'s docs: `slots / 1024 + shards / 16 + 1` calls a pass.
    let bound = slots / 1_024 + SHARDS / 16 + 1;
    for i in 1..bound {
        l.limit_sync(&active[i % ACTIVE], 1).unwrap();
    }
    assert_eq!(store.len(), ACTIVE, "only the active keys are left");
    // Tables shrink: at most a few slots per active key, none for an empty shard.
    assert!(
        store.slots() <= ACTIVE * 4,
        "{} slots left of {slots}",
        store.slots()
    );
    // The active keys kept their state through the sweep: two requests 100 ms apart.
    assert!(!l.limit_sync(&active[0], 1).unwrap().allowed);
}

#[test]
fn a_store_with_no_calls_gives_its_memory_back_on_purge_idle() {
    let clock = ManualClock::new(0);
    let store = store_with_shards(&clock, 16);
    let l = limiter("fixed_window:limit=5,window=1s", &store);
    burst_then_active(&l, 20_000, 0);
    assert!(store.slots() > 20_000);
    clock.advance(Duration::from_secs(2));
    // Without calls nothing is swept.
    assert_eq!(store.len(), 20_000);
    assert_eq!(store.purge_idle(), 20_000);
    assert!(store.is_empty());
    assert_eq!(store.slots(), 0, "every empty table is freed");
    // The store still works, and a purge with nothing idle drops nothing.
    assert!(l.limit_sync("k", 1).unwrap().allowed);
    assert_eq!(store.purge_idle(), 0);
    assert_eq!(store.len(), 1);
}

#[test]
fn a_pass_starts_over_on_a_table_that_grows_while_it_visits() {
    // One shard, so that the keys arriving during the pass grow the table it is visiting.
    let clock = ManualClock::new(0);
    let store = store_with_shards(&clock, 1);
    let l = limiter("gcra:rate=10/s", &store);
    burst_then_active(&l, 10_000, 0);
    clock.advance(Duration::from_millis(1_100));
    // New keys, one per call: each call also steps the pass over the idle burst keys.
    for k in 0..30_000 {
        assert!(l.limit_sync(&format!("new:{k}"), 1).unwrap().allowed);
    }
    assert_eq!(
        store.len(),
        30_000,
        "every idle burst key is gone, no new key is"
    );
    for k in (0..30_000).step_by(997) {
        assert!(!l.limit_sync(&format!("new:{k}"), 1).unwrap().allowed);
    }
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_task_sweeps_a_store_that_receives_no_calls() {
    // The sweeper ticks on tokio's paused clock (no real time passes); keys go idle on the
    // store's manual clock.
    let clock = ManualClock::new(0);
    let store = store_with_shards(&clock, 8);
    let l = limiter("gcra:rate=10/s", &store);
    burst_then_active(&l, 5_000, 0);
    let task = tokio::spawn(store.sweeper(Duration::from_secs(1)));
    clock.advance(Duration::from_millis(200));
    assert_eq!(store.len(), 5_000);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // A pass yields between slices: let it finish (a bounded number of turns).
    for _ in 0..100 {
        if store.is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(store.is_empty(), "{} keys left", store.len());
    assert_eq!(store.slots(), 0);
    // The task ends once the store is dropped.
    drop(l);
    drop(store);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(task.is_finished());
}
