//! How much memory a million keys hold in the memory store, and how much of it comes back
//! once they are idle.
//!
//! Inserts a million `gcra` keys (idle 100 ms after their request) on a manual clock, moves
//! the clock past their idle time and the sweep period, then does what a deployment does:
//! either the periodic sweep (`MemoryStore::purge_idle`, which `MemoryStore::sweeper` calls),
//! or, with `calls` as argument, keeps deciding on a few active keys until the calls' own
//! sweep pass has ended. Prints the resident set size (from /proc/self/statm, Linux) at each
//! stage.
//!
//! Run: `cargo run --release -p paceline --example idle_memory [purge|calls]`

use std::sync::Arc;
use std::time::Duration;

use paceline::store::MemoryStore;
use paceline::time::ManualClock;
use paceline::Limiter;

const KEYS: usize = 1_000_000;

/// Resident set size in MiB, if /proc/self/statm can be read (pages of 4 KiB).
fn rss_mib() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages as f64 * 4096.0 / (1024.0 * 1024.0))
}

fn report(stage: &str, store: &MemoryStore) {
    match rss_mib() {
        Some(rss) => println!(
            "{stage:<44} RSS {rss:>7.1} MiB  keys {:>9}  slots {:>9}",
            store.len(),
            store.slots()
        ),
        None => println!("{stage:<44} (no /proc/self/statm: RSS unknown)"),
    }
}

fn main() -> Result<(), paceline::Error> {
    let by_calls = std::env::args().nth(1).is_some_and(|a| a == "calls");
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
    let limiter = Limiter::with_store("gcra:rate=10/s".parse()?, Arc::clone(&store));
    let active: Vec<String> = (0..16).map(|i| format!("active:{i}")).collect();
    for key in &active {
        limiter.limit_sync(key, 1)?;
    }
    report("before the burst (16 active keys)", &store);
    for i in 0..KEYS {
        limiter.limit_sync(&format!("user:{i}"), 1)?;
    }
    report("after a burst of 1,000,000 keys", &store);
    clock.advance(Duration::from_millis(1_100));
    for key in &active {
        limiter.limit_sync(key, 1)?;
    }
    report("1.1 s later, after a call on each active key", &store);
    if by_calls {
        let mut calls = 0u64;
        while store.len() > active.len() && calls < 100_000_000 {
            limiter.limit_sync(&active[calls as usize % active.len()], 1)?;
            calls += 1;
        }
        report(&format!("after {calls} calls on the active keys"), &store);
    } else {
        let dropped = store.purge_idle();
        report(&format!("after purge_idle ({dropped} dropped)"), &store);
    }
    Ok(())
}
