//! Host-side work on a `Pending`'s memory that runs on other threads (the staging lanes of a
//! `StagedCopier`): a one-shot result the `Pending` joins or polls, like a thread's join handle.

use crate::error::Result;
use crate::stream::Event;
use std::sync::{Condvar, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

/// The shared state of one background job; its result is the events that fence the GPU work it
/// queued.
#[derive(Debug, Default)]
pub(crate) struct Job {
    state: Mutex<JobState>,
    finished: Condvar,
}

#[derive(Debug, Default)]
enum JobState {
    #[default]
    Running,
    Waiting(Waker),
    Finished(Result<Vec<Event>>),
    Taken,
}

impl Job {
    /// Stores the job's outcome and wakes whoever waits for it. Called once, by the job.
    pub(crate) fn finish(&self, outcome: Result<Vec<Event>>) {
        let previous = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *state, JobState::Finished(outcome))
        };
        self.finished.notify_all();
        if let JobState::Waiting(waker) = previous {
            waker.wake();
        }
    }

    /// Blocks until the job has finished and takes its outcome.
    pub(crate) fn join(&self) -> Result<Vec<Event>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let JobState::Finished(_) = &*state {
                return take(&mut state);
            }
            state = self.finished.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The outcome once finished; otherwise the task's waker is kept to be woken.
    pub(crate) fn poll(&self, cx: &Context<'_>) -> Poll<Result<Vec<Event>>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &*state {
            JobState::Finished(_) => Poll::Ready(take(&mut state)),
            JobState::Waiting(waker) if waker.will_wake(cx.waker()) => Poll::Pending,
            _ => {
                *state = JobState::Waiting(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// `Some(true)` once finished successfully, `Some(false)` while running, `None` after a
    /// failure (which `join` or `poll` returns). Never blocks.
    pub(crate) fn is_finished(&self) -> Option<bool> {
        match &*self.state.lock().unwrap_or_else(PoisonError::into_inner) {
            JobState::Finished(Ok(_)) => Some(true),
            JobState::Finished(Err(_)) | JobState::Taken => None,
            JobState::Running | JobState::Waiting(_) => Some(false),
        }
    }

    /// The finished job's events, left in place (for queries that must not consume them).
    pub(crate) fn with_events<R>(&self, f: impl FnOnce(&[Event]) -> R) -> Option<R> {
        match &*self.state.lock().unwrap_or_else(PoisonError::into_inner) {
            JobState::Finished(Ok(events)) => Some(f(events)),
            _ => None,
        }
    }
}

fn take(state: &mut JobState) -> Result<Vec<Event>> {
    match std::mem::replace(state, JobState::Taken) {
        JobState::Finished(outcome) => outcome,
        _ => unreachable!("`take` is only called on a finished job"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{CudaError, ErrorKind};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Counter(AtomicUsize);
    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_polled_job_wakes_its_task_when_it_finishes_on_another_thread() {
        let job = Arc::new(Job::default());
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let cx = Context::from_waker(&waker);
        assert!(job.poll(&cx).is_pending());
        assert_eq!(job.is_finished(), Some(false));
        let worker = Arc::clone(&job);
        std::thread::spawn(move || worker.finish(Ok(Vec::new()))).join().unwrap();
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(job.is_finished(), Some(true));
        assert_eq!(job.with_events(<[Event]>::len), Some(0));
        assert!(matches!(job.poll(&cx), Poll::Ready(Ok(events)) if events.is_empty()));
    }

    #[test]
    fn join_blocks_until_the_outcome_arrives_and_keeps_the_error() {
        let job = Arc::new(Job::default());
        let worker = Arc::clone(&job);
        let handle = std::thread::spawn(move || {
            worker.finish(Err(CudaError::new(ErrorKind::Unsupported("test"), "staged copy")));
        });
        let err = job.join().unwrap_err();
        handle.join().unwrap();
        assert_eq!(err.operation(), "staged copy");
        assert_eq!(job.is_finished(), None);
    }
}
