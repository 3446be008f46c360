//! A barrier that gives up: ranks meet at the start of each step, and when one rank fails the
//! others stop waiting instead of hanging.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct State {
    arrived: usize,
    generation: u64,
    aborted: bool,
}

/// A reusable barrier for `n` threads with a timeout and an abort switch.
#[derive(Debug)]
pub(crate) struct Barrier {
    n: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl Barrier {
    pub(crate) fn new(n: usize) -> Self {
        Barrier {
            n,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        }
    }

    /// Waits until all `n` threads arrive; `Err` if the barrier was aborted or `timeout`
    /// passed first.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<(), &'static str> {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.aborted {
            return Err("another rank failed");
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while s.generation == generation && !s.aborted {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("timed out waiting for the other ranks to start the step");
            }
            s = self
                .cv
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if s.generation == generation {
            Err("another rank failed")
        } else {
            Ok(())
        }
    }

    /// Wakes every waiter with an error, now and for every later wait.
    pub(crate) fn abort(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.aborted = true;
        self.cv.notify_all();
    }
}
