//! The engine's only source of time: injected, so that the binary runs on the machine's monotonic clock and
//! the simulator runs the very same scheduling and admission rules on its virtual one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Time since an origin fixed when the clock was made; never goes backwards.
pub trait Clock: Send {
    fn now(&self) -> Duration;
}

/// The machine's monotonic clock.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told to (the simulator's virtual time); clones share the time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// Sets the time (nanoseconds since the origin); a time before the current one is ignored.
    pub fn set(&self, now: Duration) {
        let nanos = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_max(nanos, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_forward_and_clones_share_it() {
        let clock = ManualClock::default();
        let shared = clock.clone();
        clock.set(Duration::from_millis(5));
        assert_eq!(shared.now(), Duration::from_millis(5));
        clock.set(Duration::from_millis(2));
        assert_eq!(shared.now(), Duration::from_millis(5), "time does not go backwards");
    }
}
