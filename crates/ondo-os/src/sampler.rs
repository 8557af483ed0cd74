//! A background thread that takes a memory snapshot every interval and keeps
//! the newest ones, so a run can be charted and its worst level reported.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::pressure::{MemorySnapshot, PressureLevel, memory_snapshot};

/// Snapshots kept: 4096 is about 17 minutes at 4 Hz, in about 1 MB.
const SAMPLE_CAPACITY: usize = 4096;

/// Shorter intervals are raised to this so the thread cannot spin.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Samples `memory_snapshot()` on its own thread until dropped, keeping the
/// newest 4096 snapshots.
///
/// Sample at 2-4 Hz while a model runs and every few seconds when idle;
/// `set_interval` takes effect at once, not after the current wait.
pub struct PressureSampler {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the thread early, for a new interval or to stop.
    wake: Condvar,
}

struct State {
    samples: VecDeque<MemorySnapshot>,
    capacity: usize,
    interval: Duration,
    stopping: bool,
    last_error: Option<String>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves State whole, so a panic elsewhere does not
        // make it unusable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl PressureSampler {
    /// Starts sampling now and then every `interval` (at least 10 ms).
    pub fn start(interval: Duration) -> PressureSampler {
        Self::start_with_capacity(interval, SAMPLE_CAPACITY)
    }

    fn start_with_capacity(interval: Duration, capacity: usize) -> PressureSampler {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                samples: VecDeque::with_capacity(capacity),
                capacity: capacity.max(1),
                interval: interval.max(MIN_INTERVAL),
                stopping: false,
                last_error: None,
            }),
            wake: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name("ondo-pressure-sampler".to_owned())
            .spawn(move || sample_until_stopped(&thread_shared));
        let thread = match spawned {
            Ok(thread) => Some(thread),
            Err(error) => {
                shared.lock().last_error = Some(format!(
                    "could not start the memory sampler thread: {error}"
                ));
                None
            }
        };
        PressureSampler { shared, thread }
    }

    /// Changes the time between samples (at least 10 ms); the next sample
    /// comes `interval` after the previous one, or now if that has passed.
    pub fn set_interval(&self, interval: Duration) {
        self.shared.lock().interval = interval.max(MIN_INTERVAL);
        self.shared.wake.notify_all();
    }

    /// The time between samples.
    pub fn interval(&self) -> Duration {
        self.shared.lock().interval
    }

    /// The newest snapshot, `None` before the first one.
    pub fn latest(&self) -> Option<MemorySnapshot> {
        self.shared.lock().samples.back().cloned()
    }

    /// Snapshots taken after `unix_ms` (exclusive, so passing the last one's
    /// `taken_at_unix_ms` returns only newer ones), oldest first.
    pub fn since(&self, unix_ms: u64) -> Vec<MemorySnapshot> {
        let state = self.shared.lock();
        state
            .samples
            .iter()
            .filter(|snapshot| snapshot.taken_at_unix_ms > unix_ms)
            .cloned()
            .collect()
    }

    /// The worst level among snapshots taken after `unix_ms`; Unknown if none.
    pub fn worst_level_since(&self, unix_ms: u64) -> PressureLevel {
        let state = self.shared.lock();
        state
            .samples
            .iter()
            .filter(|snapshot| snapshot.taken_at_unix_ms > unix_ms)
            .fold(PressureLevel::Unknown, |worst, snapshot| {
                PressureLevel::worst(worst, snapshot.level)
            })
    }

    /// Why the most recent sample failed, `None` once one succeeds again.
    pub fn last_error(&self) -> Option<String> {
        self.shared.lock().last_error.clone()
    }
}

impl Drop for PressureSampler {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            // A panicked sampler has nothing left to hand back.
            let _ = thread.join();
        }
    }
}

fn sample_until_stopped(shared: &Shared) {
    loop {
        let taken = Instant::now();
        // Read outside the lock so readers never wait on /proc or sysctl.
        let reading = memory_snapshot();
        let mut state = shared.lock();
        match reading {
            Ok(snapshot) => {
                if state.samples.len() >= state.capacity {
                    state.samples.pop_front();
                }
                state.samples.push_back(snapshot);
                state.last_error = None;
            }
            Err(error) => state.last_error = Some(format!("memory snapshot failed: {error}")),
        }
        // The deadline is recomputed after each wake-up so a new interval
        // applies to the wait already under way.
        loop {
            if state.stopping {
                return;
            }
            let now = Instant::now();
            let next = taken + state.interval;
            if now >= next {
                break;
            }
            state = shared
                .wake
                .wait_timeout(state, next - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `done` every 5 ms for up to 5 s.
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if done() {
                return true;
            }
            thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn collects_samples_and_drops_promptly() {
        let sampler = PressureSampler::start(Duration::from_millis(20));
        assert!(
            eventually(|| sampler.since(0).len() >= 2),
            "{:?}",
            sampler.last_error()
        );
        let samples = sampler.since(0);
        assert!(samples[0].taken_at_unix_ms < samples[1].taken_at_unix_ms);
        assert_eq!(sampler.latest().as_ref(), sampler.since(0).last());
        assert_eq!(sampler.last_error(), None);

        // A long interval must not hold up Drop.
        sampler.set_interval(Duration::from_secs(60));
        let dropping = Instant::now();
        drop(sampler);
        assert!(dropping.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_shorter_interval_applies_to_the_wait_under_way() {
        let sampler = PressureSampler::start(Duration::from_secs(60));
        assert!(eventually(|| sampler.latest().is_some()));
        assert_eq!(sampler.since(0).len(), 1);
        sampler.set_interval(Duration::from_millis(20));
        assert!(eventually(|| sampler.since(0).len() >= 2));
        assert_eq!(sampler.interval(), Duration::from_millis(20));
    }

    #[test]
    fn keeps_only_the_newest_samples() {
        let sampler = PressureSampler::start_with_capacity(Duration::from_millis(10), 3);
        assert!(eventually(|| sampler.latest().is_some()));
        let first = sampler.since(0)[0].taken_at_unix_ms;
        assert!(eventually(|| sampler.since(0)[0].taken_at_unix_ms > first));
        assert!(sampler.since(0).len() <= 3);
    }

    #[test]
    fn since_is_exclusive_and_worst_level_covers_the_same_samples() {
        let sampler = PressureSampler::start(Duration::from_millis(10));
        assert!(eventually(|| sampler.since(0).len() >= 2));
        sampler.set_interval(Duration::from_secs(60));
        let first = sampler.since(0)[0].taken_at_unix_ms;
        let newer = sampler.since(first);
        assert!(
            newer
                .iter()
                .all(|snapshot| snapshot.taken_at_unix_ms > first)
        );
        assert!(!newer.is_empty());
        assert_ne!(sampler.worst_level_since(0), PressureLevel::Unknown);
        assert_eq!(sampler.worst_level_since(u64::MAX), PressureLevel::Unknown);
    }

    #[test]
    fn intervals_below_the_minimum_are_raised() {
        let sampler = PressureSampler::start(Duration::ZERO);
        assert_eq!(sampler.interval(), MIN_INTERVAL);
    }
}
