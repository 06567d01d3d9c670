//! [`GatedClock`]: a virtual clock whose sleeps only an outside event ends.

use std::time::Duration;

/// A virtual clock whose sleeps never end on their own: each is counted, so a test sees a
/// waiting call (a queue's lease waiting for a job) settle into its wait, and then only an
/// outside event (a message on the queue's channel) ends the wait. Its time moves only when
/// the test moves it (through the [`ManualClock`](paceline_store::ManualClock) it wraps).
#[derive(Clone)]
pub struct GatedClock {
    time: paceline_store::ManualClock,
    sleeps: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
}

impl GatedClock {
    /// A gated clock reading `time`.
    pub fn new(time: paceline_store::ManualClock) -> GatedClock {
        GatedClock {
            time,
            sleeps: std::sync::Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// How many sleeps have begun so far.
    pub fn sleeps(&self) -> usize {
        *self.sleeps.borrow()
    }

    /// Waits until `n` sleeps have begun in all (after 20 s the test fails rather than
    /// hangs).
    pub async fn sleeps_begun(&self, n: usize) {
        let mut sleeps = self.sleeps.subscribe();
        tokio::time::timeout(Duration::from_secs(20), sleeps.wait_for(|&s| s >= n))
            .await
            .expect("the call settled into its wait")
            .expect("the clock lives");
    }
}

impl paceline_store::Clock for GatedClock {
    fn now_micros(&self) -> u64 {
        paceline_store::Clock::now_micros(&self.time)
    }

    fn sleep(&self, _: Duration) -> paceline_store::Sleep {
        self.sleeps.send_modify(|n| *n += 1);
        Box::pin(std::future::pending())
    }
}
