//! The watcher thread: the second way cuda-mem wakes a task awaiting GPU work. The first, a host
//! function per wait ([`Completion`](crate::Completion)), needs no thread of ours but puts work
//! on the GPU's queues for every wait; on the H200 host that slowed concurrent copies (see
//! docs/async-work.md). The watcher instead queries the awaited work's events from one thread
//! of its own and wakes each task once its events have completed: no host function runs, and no
//! executor thread blocks.
//!
//! While anything is watched, and for [`SWEEP_FREELY_FOR`] after the last completion, the thread
//! sweeps its list without pause (yielding its core between sweeps, as
//! `cudaDeviceScheduleYield` does); after that it naps [`NAP`] between sweeps, so long waits
//! cost little CPU. With nothing watched it sleeps until a watch arrives.

use crate::error::{CudaError, ErrorKind, Result};
use crate::stream::Event;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How long after the last completion (or the first watch after an idle spell) the watcher
/// sweeps without napping: completions of a busy stream follow each other closely.
const SWEEP_FREELY_FOR: Duration = Duration::from_millis(1);
/// The pause between sweeps once nothing has completed for a while.
const NAP: Duration = Duration::from_micros(50);

/// What the watcher asks whether the work it marks has completed: an event (fakes in tests).
pub(crate) trait Probe: Send + Sync {
    fn is_complete(&self) -> Result<bool>;
}

impl Probe for Event {
    fn is_complete(&self) -> Result<bool> {
        Event::is_complete(self)
    }
}

/// A watcher thread and its list. Dropping it ends the thread after its current sweep (the
/// process-wide one, [`Watcher::global`], lives as long as the process).
pub(crate) struct Watcher {
    shared: Arc<Shared>,
}

struct Shared {
    watches: Mutex<Watches>,
    arrived: Condvar,
}

struct Watches {
    list: Vec<Arc<Watched>>,
    closed: bool,
}

/// One wait: its probes, and what the task and the thread share.
struct Watched {
    probes: Vec<Arc<dyn Probe>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Set once, by the thread: every probe completed, or the first failure.
    outcome: Option<Result<()>>,
    waker: Option<Waker>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Watcher {
    /// Starts a watcher thread.
    pub(crate) fn start() -> Result<Self> {
        let shared = Arc::new(Shared {
            watches: Mutex::new(Watches { list: Vec::new(), closed: false }),
            arrived: Condvar::new(),
        });
        let theirs = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("cuda-mem-watcher".into())
            .spawn(move || theirs.run())
            .map_err(|_| CudaError::new(ErrorKind::Unsupported("spawning threads"), "starting the watcher thread"))?;
        Ok(Self { shared })
    }

    /// The process-wide watcher, started at the first call.
    pub(crate) fn global() -> Result<&'static Self> {
        static GLOBAL: OnceLock<Watcher> = OnceLock::new();
        if let Some(watcher) = GLOBAL.get() {
            return Ok(watcher);
        }
        let started = Self::start()?;
        // Two threads racing here may both start one; the loser's is dropped, and its thread ends.
        Ok(GLOBAL.get_or_init(|| started))
    }

    /// Watches `probes`: the returned future resolves once all of them have completed, or with
    /// the first query's failure. Dropping it withdraws the watch.
    pub(crate) fn watch(&self, probes: Vec<Arc<dyn Probe>>) -> Watch {
        let watched = Arc::new(Watched { probes, state: Mutex::new(State::default()) });
        lock(&self.shared.watches).list.push(Arc::clone(&watched));
        self.shared.arrived.notify_one();
        Watch { watched, shared: Arc::clone(&self.shared) }
    }

    /// How many waits the thread is watching now.
    #[cfg(test)]
    fn watching(&self) -> usize {
        lock(&self.shared.watches).list.len()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        lock(&self.shared.watches).closed = true;
        self.shared.arrived.notify_one();
    }
}

impl Shared {
    /// The thread: sweeps the list, firing the waits whose probes have all completed.
    fn run(&self) {
        let mut batch: Vec<Arc<Watched>> = Vec::new();
        let mut last_completion = Instant::now();
        loop {
            {
                let mut watches = lock(&self.watches);
                if watches.list.is_empty() && !watches.closed {
                    while watches.list.is_empty() && !watches.closed {
                        watches = self.arrived.wait(watches).unwrap_or_else(PoisonError::into_inner);
                    }
                    last_completion = Instant::now();
                }
                if watches.closed {
                    return;
                }
                batch.clone_from(&watches.list);
            }
            // Queried outside the list's lock: each watch owns its probes, so they stay valid
            // even if the task withdraws the watch meanwhile.
            let mut completed = false;
            for watched in batch.drain(..) {
                if let Some(outcome) = watched.check() {
                    lock(&self.watches).list.retain(|w| !Arc::ptr_eq(w, &watched));
                    watched.fire(outcome);
                    completed = true;
                }
            }
            if completed {
                last_completion = Instant::now();
            }
            if last_completion.elapsed() < SWEEP_FREELY_FOR {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }
}

impl Watched {
    /// `Some` once every probe has completed, or at the first failure.
    fn check(&self) -> Option<Result<()>> {
        for probe in &self.probes {
            match probe.is_complete() {
                Ok(true) => {}
                Ok(false) => return None,
                Err(err) => return Some(Err(err)),
            }
        }
        Some(Ok(()))
    }

    fn fire(&self, outcome: Result<()>) {
        let waker = {
            let mut state = lock(&self.state);
            state.outcome = Some(outcome);
            state.waker.take()
        };
        if let Some(waker) = waker {
            // A waker that panics must not end the thread every other wait depends on.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake()));
        }
    }
}

/// A watched wait; resolves once its probes have completed.
pub(crate) struct Watch {
    watched: Arc<Watched>,
    shared: Arc<Shared>,
}

impl Future for Watch {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut state = lock(&self.watched.state);
        if let Some(outcome) = &state.outcome {
            return Poll::Ready(outcome.clone());
        }
        if !state.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            state.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Watch {
    /// Withdraws the watch (a no-op once fired).
    fn drop(&mut self) {
        lock(&self.shared.watches).list.retain(|w| !Arc::ptr_eq(w, &self.watched));
    }
}

#[cfg(test)]
mod tests;
