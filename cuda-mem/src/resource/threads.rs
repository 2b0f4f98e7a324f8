//! A process-wide index for every thread that allocates through an adaptor: dense, never reused,
//! read from a thread-local on the allocation path. Tracking records it instead of a
//! `ThreadId`; statistics give the first threads counters of their own.

use std::sync::{Mutex, PoisonError};
use std::thread::ThreadId;

/// Every registered thread, by index, with its name.
static THREADS: Mutex<Vec<(ThreadId, Option<String>)>> = Mutex::new(Vec::new());

thread_local! {
    static THIS_THREAD: u64 = {
        let thread = std::thread::current();
        let mut threads = THREADS.lock().unwrap_or_else(PoisonError::into_inner);
        threads.push((thread.id(), thread.name().map(str::to_owned)));
        threads.len() as u64 - 1
    };
}

/// This thread's index (registered on first use). No other thread ever gets it.
#[inline]
pub(crate) fn this_thread() -> u64 {
    THIS_THREAD.with(|index| *index)
}

/// The thread id and name behind an index from [`this_thread`].
pub(crate) fn registered_thread(index: u64) -> (ThreadId, Option<String>) {
    let threads = THREADS.lock().unwrap_or_else(PoisonError::into_inner);
    // Indices only come from `THIS_THREAD`, which pushed the entry first.
    threads[index as usize].clone()
}
