//! Time, injected. The engine never reads a clock: stores do, through [`Clock`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A future returned by [`Clock::sleep`].
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of "now", in microseconds since the Unix epoch, and a way to wait in that
/// clock's time.
///
/// Real clocks sleep in [`Clock::sleep`]; a virtual clock such as [`ManualClock`] advances
/// itself instead, so simulations and tests run instantly and deterministically.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;

    /// Waits `duration` in this clock's time.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// A virtual clock that only moves when told to: for tests and `paceline simulate`.
///
/// Clones share the same time. [`Clock::sleep`] advances the clock by the duration and
/// returns at once, like a caller that slept exactly that long.
///
/// ```
/// use paceline_core::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_millis(2));
/// assert_eq!(clock.now_micros(), 3_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now_micros` microseconds since the Unix epoch.
    pub fn new(now_micros: u64) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(now_micros)),
        }
    }

    /// Sets the time; it may go backwards (the store's decisions then see the earlier time).
    pub fn set_micros(&self, now_micros: u64) {
        self.now.store(now_micros, Ordering::SeqCst);
    }

    /// Moves the time forward by `by` (rounded up to whole microseconds, saturating).
    pub fn advance(&self, by: Duration) {
        let us = u64::try_from(by.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(us))
            });
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.advance(duration);
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_sleep_advances_and_clones_share_time() {
        let a = ManualClock::new(10);
        let b = a.clone();
        drop(a.sleep(Duration::from_nanos(1500)));
        assert_eq!(b.now_micros(), 12);
        b.set_micros(5);
        assert_eq!(a.now_micros(), 5);
        a.set_micros(u64::MAX - 1);
        a.advance(Duration::from_secs(1));
        assert_eq!(a.now_micros(), u64::MAX);
    }
}
