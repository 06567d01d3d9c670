//! Times as the API writes them: milliseconds.
//!
//! A duration (`delay_ms`, `reset_after_ms`, `expires_ms`, ...) is a fraction of
//! milliseconds to the microsecond; a point in time (`started_ms`, `lease_expires_ms`, ...)
//! is whole Unix milliseconds.

use std::time::Duration;

/// A duration in milliseconds, to the microsecond: `1.5` is 1,500 µs.
///
/// ```text
/// ms(Duration::from_micros(1_500)) == 1.5
/// ```
pub(crate) fn ms(d: Duration) -> f64 {
    paceline_core::round_to_micros(d) as f64 / 1000.0
}

/// A time in Unix microseconds (as the queues keep it), in whole Unix milliseconds.
pub(crate) fn unix_ms(us: u64) -> u64 {
    us / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_their_microseconds_and_times_drop_them() {
        assert_eq!(ms(Duration::from_micros(1_500)), 1.5);
        assert_eq!(ms(Duration::from_nanos(1_499)), 0.001);
        assert_eq!(ms(Duration::ZERO), 0.0);
        assert_eq!(unix_ms(1_764_170_000_123_999), 1_764_170_000_123);
    }
}
