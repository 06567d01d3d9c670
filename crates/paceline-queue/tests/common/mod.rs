//! What the queue's test files share.
//!
//! Each test file uses some of it, none all of it.
#![allow(dead_code)]

#[cfg(feature = "redis")]
pub mod redis;

/// One policy of each algorithm the queue supports, with limits small enough that random
/// steps meet them.
pub const POLICIES: &[&str] = &[
    "fixed_window:limit=3,window=1s",
    "gcra:rate=2/s,burst=2",
    "sliding_window:limit=3,window=1s",
    "sliding_log:limit=2,window=1s,min_interval=100ms",
    "pacer:rate=3/s,max_burst=1",
    "smooth_bursty:rate=2/s,max_burst_seconds=1",
    "smooth_warming_up:rate=4/s,warmup=1s",
];
