//! The Redis server's clock as seen from this process.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use paceline_core::{Clock, Sleep};

use crate::SystemClock;

/// The local clock plus the offset to the Redis server's clock, as the answers seen so far
/// showed it: a front end whose library answers the server's time (`TIME`) with each call
/// [`observe`](ServerClock::observe)s it, and reads "now" in the server's terms between
/// calls (to tell when a job will start, or how long to sleep).
///
/// ```
/// use paceline_store::redis::ServerClock;
/// use paceline_store::Clock;
/// let clock = ServerClock::new();
/// let local = clock.now_micros();
/// clock.observe(local + 5_000_000); // the server is 5 s ahead
/// assert!(clock.now_micros() >= local + 5_000_000);
/// ```
#[derive(Debug, Default)]
pub struct ServerClock {
    local: SystemClock,
    offset: AtomicI64,
}

impl ServerClock {
    /// A clock that reads the local time until an answer is observed.
    pub fn new() -> ServerClock {
        ServerClock::default()
    }

    /// Takes in the server's time `server_now` (µs since the Unix epoch) from an answer.
    /// An answer's time is older than its arrival, so the largest offset seen is the
    /// closest, and the one kept.
    pub fn observe(&self, server_now: u64) {
        let local = self.local.now_micros();
        let offset = i64::try_from(server_now).unwrap_or(i64::MAX)
            - i64::try_from(local).unwrap_or(i64::MAX);
        self.offset.fetch_max(offset, Ordering::Relaxed);
    }
}

impl Clock for ServerClock {
    fn now_micros(&self) -> u64 {
        self.local
            .now_micros()
            .saturating_add_signed(self.offset.load(Ordering::Relaxed))
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.local.sleep(duration)
    }
}
