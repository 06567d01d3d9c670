//! The real clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paceline_core::{Clock, Sleep};

/// Wall-clock time, read fast.
///
/// `now_micros` is the Unix time taken once at construction plus the time elapsed since on a
/// monotonic high-resolution counter (the CPU's TSC where reliable, via `quanta`), so reading
/// it costs a few nanoseconds and it never goes backwards. `sleep` is a tokio timer, so
/// [`Limiter::acquire`](crate::Limiter::acquire) needs a tokio runtime with the time driver.
///
/// ```
/// use paceline_store::{Clock, SystemClock};
/// let clock = SystemClock::new();
/// let a = clock.now_micros();
/// let b = clock.now_micros();
/// assert!(b >= a && a > 1_600_000_000_000_000);
/// ```
#[derive(Clone, Debug)]
pub struct SystemClock {
    counter: quanta::Clock,
    start_raw: u64,
    start_unix_us: u64,
}

impl SystemClock {
    /// A clock anchored at the current Unix time.
    pub fn new() -> SystemClock {
        let counter = quanta::Clock::new();
        let start_raw = counter.raw();
        let start_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        SystemClock {
            counter,
            start_raw,
            start_unix_us,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_micros(&self) -> u64 {
        let elapsed_ns = self
            .counter
            .delta_as_nanos(self.start_raw, self.counter.raw());
        self.start_unix_us.saturating_add(elapsed_ns / 1_000)
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}
