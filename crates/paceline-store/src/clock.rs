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

/// Unix time read from tokio's clock: the Unix time at construction plus the time tokio's
/// `Instant` has moved since.
///
/// Under a paused tokio clock (`#[tokio::test(start_paused = true)]`) time moves only when
/// every task is waiting on a timer, and then jumps to the next one, so code that sleeps
/// through this clock (a limiter's `acquire`, a queue's workers) runs on virtual time: a
/// test of a minute's traffic takes milliseconds and sees exact times. Outside tests it is
/// the wall clock, read more slowly than [`SystemClock`].
///
/// ```
/// use paceline_store::{Clock, TokioClock};
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let clock = TokioClock::starting_at(1_000_000);
/// clock.sleep(Duration::from_secs(5)).await; // no real time passes
/// assert_eq!(clock.now_micros(), 6_000_000);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
    start_unix_us: u64,
}

impl TokioClock {
    /// A clock reading the current Unix time.
    pub fn new() -> TokioClock {
        TokioClock::starting_at(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        )
    }

    /// A clock reading `now_micros` (µs since the Unix epoch) now.
    pub fn starting_at(now_micros: u64) -> TokioClock {
        TokioClock {
            start: tokio::time::Instant::now(),
            start_unix_us: now_micros,
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now_micros(&self) -> u64 {
        let elapsed = tokio::time::Instant::now().duration_since(self.start);
        self.start_unix_us
            .saturating_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}
