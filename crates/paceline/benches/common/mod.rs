//! The set-up both governor comparisons share: the same quota on both limiters.

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::Quota;
use paceline::store::MemoryStore;
use paceline::{Limiter, Policy};

/// Both limiters admit a million per second with bursts of 1,000: the benchmark measures the
/// decision, mostly admissions, not a wall of rejections.
pub const RATE: u32 = 1_000_000;
pub const BURST: u32 = 1_000;
pub const KEYS: usize = 10_000;

pub fn paceline_gcra() -> Limiter {
    let policy: Policy = format!("gcra:rate={RATE}/s,burst={BURST}")
        .parse()
        .expect("valid spec");
    Limiter::with_store(policy, Arc::new(MemoryStore::new()))
}

pub fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(RATE).expect("non-zero"))
        .allow_burst(NonZeroU32::new(BURST).expect("non-zero"))
}

pub fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("user:{i}")).collect()
}
