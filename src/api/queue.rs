//! The line in front of the engine. The engine decodes up to `slots`
//! generations together in one batch, so that many requests hold a turn at
//! once and the rest take turns in the order they arrived; at most
//! `max_waiting` wait (the next is told the queue is full), and none waits
//! longer than `wait_limit` (it is told so). Both answers carry a
//! Retry-After estimated from how long recent requests took. (The engine
//! may still hold a request with a turn back a little, until its KV cache
//! fits: its record says how long.)

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// Takes turns at the engine.
pub(crate) struct EngineQueue {
    /// A permit per place in the engine's batch. Tokio's semaphore hands
    /// permits out in the order they were asked for.
    turn: Arc<Semaphore>,
    slots: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
    wait_limit: Duration,
    /// Recent requests' time at the engine, smoothed, in seconds.
    typical_run_s: Mutex<f64>,
}

/// The engine is this request's until the turn is dropped.
pub(crate) struct Turn {
    _permit: OwnedSemaphorePermit,
    /// How long the request waited for it.
    pub waited: Duration,
}

/// Counts a request as waiting until it gets its turn or gives up.
struct Waiting<'q>(&'q AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl EngineQueue {
    pub fn new(slots: usize, max_waiting: usize, wait_limit: Duration) -> Self {
        let slots = slots.max(1);
        Self {
            turn: Arc::new(Semaphore::new(slots)),
            slots,
            waiting: AtomicUsize::new(0),
            max_waiting,
            wait_limit,
            typical_run_s: Mutex::new(1.0),
        }
    }

    /// Requests that hold a turn at once: the largest batch.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Requests waiting for their turn now (not those running).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Waits for the engine, in arrival order.
    pub async fn wait_turn(&self) -> Result<Turn, ApiError> {
        let asked = Instant::now();
        if let Ok(permit) = self.turn.clone().try_acquire_owned() {
            return Ok(Turn {
                _permit: permit,
                waited: Duration::ZERO,
            });
        }
        let ahead = self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.waiting);
        if ahead >= self.max_waiting {
            return Err(ApiError::QueueFull {
                waiting: ahead,
                retry_after: self.retry_after(ahead),
            });
        }
        match tokio::time::timeout(self.wait_limit, self.turn.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Turn {
                _permit: permit,
                waited: asked.elapsed(),
            }),
            // The semaphore is never closed while the server runs.
            Ok(Err(_)) => Err(ApiError::Stopping),
            Err(_) => Err(ApiError::QueueTimeout {
                waited: asked.elapsed(),
                retry_after: self.retry_after(self.waiting()),
            }),
        }
    }

    /// Notes how long a request held the engine (for Retry-After).
    pub fn note_run(&self, took: Duration) {
        let mut typical = self.typical_run_s.lock().unwrap_or_else(|p| p.into_inner());
        *typical = 0.8 * *typical + 0.2 * took.as_secs_f64();
    }

    /// About when the requests ahead will be done: a typical request's time
    /// for each batch's worth of them, between 1 s and a minute.
    fn retry_after(&self, ahead: usize) -> Duration {
        let typical = *self.typical_run_s.lock().unwrap_or_else(|p| p.into_inner());
        let rounds = (ahead / self.slots + 1) as f64;
        Duration::from_secs_f64((typical * rounds).clamp(1.0, 60.0).ceil())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn turns_come_in_arrival_order_and_a_full_queue_says_so() {
        runtime().block_on(async {
            let queue = Arc::new(EngineQueue::new(1, 2, Duration::from_secs(10)));
            let first = queue.wait_turn().await.unwrap();
            assert_eq!(first.waited, Duration::ZERO);
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut waiters = Vec::new();
            for n in 0..2 {
                let (queue, order) = (queue.clone(), order.clone());
                waiters.push(tokio::spawn(async move {
                    let turn = queue.wait_turn().await.unwrap();
                    order.lock().unwrap().push(n);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    drop(turn);
                }));
                // Let it take its place in the line.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(queue.waiting(), 2);
            let Err(ApiError::QueueFull {
                waiting,
                retry_after,
            }) = queue.wait_turn().await
            else {
                panic!("a third waiter was let in");
            };
            assert_eq!(waiting, 2);
            assert!(retry_after >= Duration::from_secs(1));
            assert_eq!(queue.waiting(), 2, "the refused request still counts");
            drop(first);
            for waiter in waiters {
                waiter.await.unwrap();
            }
            assert_eq!(*order.lock().unwrap(), vec![0, 1]);
            assert_eq!(queue.waiting(), 0);
        });
    }

    #[test]
    fn as_many_requests_as_the_batch_holds_have_a_turn_at_once() {
        runtime().block_on(async {
            let queue = EngineQueue::new(3, 1, Duration::from_millis(50));
            let turns = [
                queue.wait_turn().await.unwrap(),
                queue.wait_turn().await.unwrap(),
                queue.wait_turn().await.unwrap(),
            ];
            assert!(turns.iter().all(|t| t.waited == Duration::ZERO));
            assert!(matches!(
                queue.wait_turn().await,
                Err(ApiError::QueueTimeout { .. })
            ));
            drop(turns);
            assert!(queue.wait_turn().await.is_ok());
        });
    }

    #[test]
    fn a_request_that_waits_too_long_is_told_so() {
        runtime().block_on(async {
            let queue = EngineQueue::new(1, 8, Duration::from_millis(50));
            let _running = queue.wait_turn().await.unwrap();
            let Err(ApiError::QueueTimeout { waited, .. }) = queue.wait_turn().await else {
                panic!("waited forever");
            };
            assert!(waited >= Duration::from_millis(50));
            assert_eq!(queue.waiting(), 0);
        });
    }
}
