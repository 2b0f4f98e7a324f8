//! Futures woken by the GPU: a host function (`cudaLaunchHostFunc`) queued behind the awaited
//! work wakes the task, so no thread blocks in a synchronize. Runtime-agnostic: any executor's
//! `Waker` works.
//!
//! The host function runs on a thread the CUDA runtime owns, where no CUDA call is allowed. It
//! only sets a flag, moves a helper stream handle back to an idle list and calls `Waker::wake`.
//! The state it touches is an `Arc` whose reference was handed to it (`Arc::into_raw`) and is
//! reclaimed by it, so dropping or forgetting the future never leaves it with freed memory.

use super::Event;
use super::Stream;
use crate::device::Device;
use crate::error::{CudaError, ErrorKind, Result};
use crate::raw;
use std::ffi::c_void;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

/// A future that resolves once the GPU has passed a point in a stream: returned by
/// [`Stream::synchronize_async`] and [`Event::wait_async`].
///
/// It is woken from a thread of the CUDA runtime, where no CUDA call is allowed: the executor's
/// `Waker::wake` (and the waker's drop) must only schedule the task, never poll it inline, as the
/// wakers of tokio, async-std, smol and `futures::executor` do. Dropping the future does not block
/// and does not cancel anything; forgetting it leaks one small allocation at most.
///
/// After a failure that breaks the CUDA context the runtime no longer calls host functions; the
/// future reports the error at its next poll (every poll first queries the stream, without
/// blocking).
///
/// ```no_run
/// # async fn run() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut device = DeviceBuffer::<u8>::zeroed(1 << 20)?;
/// let mut view = device.as_mut_slice();
/// // ... queue work on `stream` ...
/// stream.synchronize_async()?.await?; // the executor thread is free meanwhile
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Completion {
    signal: Arc<Signal>,
    /// Queried for errors at each poll; the clone keeps the handle valid.
    probe: Stream,
}

/// What the host function and the future share.
#[derive(Debug, Default)]
struct Signal {
    state: Mutex<SignalState>,
}

#[derive(Debug, Default)]
struct SignalState {
    fired: bool,
    waker: Option<Waker>,
    /// A helper stream to give back to the idle list once it has passed its wait.
    helper: Option<Stream>,
}

/// Helper streams idle now, for waits on events: one is lent to each wait until its host function
/// has run, so no wait queues behind another. They live for the process (never destroyed, so the
/// host function can move them without a CUDA call).
static IDLE_HELPERS: Mutex<Vec<Stream>> = Mutex::new(Vec::new());

/// The host function: marks the signal fired, returns the helper stream, wakes the task. Makes no
/// CUDA call (the helper is moved, never dropped; the last `Arc` reference, if it is this one,
/// frees only plain memory and an empty waker slot).
unsafe extern "C" fn fire(data: *mut c_void) {
    // SAFETY: `data` came from `Arc::into_raw` in `Completion::launch`, which handed this one
    // reference to the runtime; the runtime calls the function once, so it is reclaimed once.
    let signal = unsafe { Arc::from_raw(data.cast_const().cast::<Signal>()) };
    // Nothing may unwind into the runtime's thread.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| signal.fire()));
}

impl Signal {
    fn fire(&self) {
        let (waker, helper) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.fired = true;
            (state.waker.take(), state.helper.take())
        };
        if let Some(helper) = helper {
            IDLE_HELPERS.lock().unwrap_or_else(PoisonError::into_inner).push(helper);
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// True when fired; otherwise `waker` is stored to be woken.
    fn fired_or_register(&self, waker: &Waker) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !state.fired && !state.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            state.waker = Some(waker.clone());
        }
        state.fired
    }
}

impl Completion {
    /// Resolves once the work queued on `stream` so far has completed. The per-thread stream is
    /// refused: the future may be polled on another thread.
    pub(crate) fn after_stream(stream: &Stream) -> Result<Self> {
        // A host function launched in a capture would fire at a graph launch, if ever.
        stream.require_orderable("Stream::synchronize_async")?;
        let signal = Arc::new(Signal::default());
        Self::launch(stream, &signal)?;
        Ok(Self { signal, probe: stream.clone() })
    }

    /// Resolves once every event in `events` has completed (an event never recorded counts as
    /// complete), through a helper stream of `device` that waits for them.
    pub(crate) fn after_events(device: Device, events: &[&Event]) -> Result<Self> {
        let helper = take_helper(device)?;
        let queued = events.iter().try_for_each(|event| helper.wait_event(event));
        let signal =
            Arc::new(Signal { state: Mutex::new(SignalState { helper: Some(helper.clone()), ..Default::default() }) });
        if let Err(err) = queued.and_then(|()| Self::launch(&helper, &signal)) {
            // Not launched: the helper goes back now (work queued on it only delays its next user).
            IDLE_HELPERS.lock().unwrap_or_else(PoisonError::into_inner).push(helper);
            return Err(err);
        }
        Ok(Self { signal, probe: helper })
    }

    /// Queues `fire` on `stream` with one reference to `signal`.
    fn launch(stream: &Stream, signal: &Arc<Signal>) -> Result<()> {
        let call = stream.call()?;
        let data = Arc::into_raw(Arc::clone(signal)).cast_mut().cast::<c_void>();
        // SAFETY: the handle means the stream here (`call`); `fire` makes no CUDA call and owns
        // the reference behind `data` until it runs (for ever if the runtime never calls it).
        let launched = unsafe { raw::streams::launch_host_func(call.as_raw(), fire, data) };
        if launched.is_err() {
            // SAFETY: the runtime refused the launch, so it will never call `fire` with `data`:
            // the reference made for it above is reclaimed here, once.
            drop(unsafe { Arc::from_raw(data.cast_const().cast::<Signal>()) });
        }
        launched
    }
}

/// An idle helper stream of `device`, or a new one.
fn take_helper(device: Device) -> Result<Stream> {
    {
        let mut idle = IDLE_HELPERS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = idle.iter().position(|s| s.device() == device) {
            return Ok(idle.swap_remove(at));
        }
    }
    Stream::on_device(device)
}

impl Future for Completion {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.signal.fired_or_register(cx.waker()) {
            return Poll::Ready(Ok(()));
        }
        // A broken context never runs the host function: report it instead of waiting for ever.
        match self.probe.is_idle() {
            Err(err) => Poll::Ready(Err(err)),
            Ok(_) => Poll::Pending,
        }
    }
}

impl Drop for Completion {
    /// Takes the registered waker out, so the host function never wakes (or drops the last
    /// reference to) a task that no longer waits here: a task's last reference may own values
    /// whose drop calls CUDA, which the runtime's thread must not do.
    fn drop(&mut self) {
        let waker = self.signal.state.lock().unwrap_or_else(PoisonError::into_inner).waker.take();
        drop(waker);
    }
}

/// The error of polling a future again after it returned `Ready`.
pub(crate) fn polled_after_completion(what: &'static str) -> CudaError {
    CudaError::new(ErrorKind::InvalidArgument("polled again after it completed"), what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The host function's half without CUDA: a reference handed out through `Arc::into_raw`, as
    /// `Completion::launch` does, then `fire` called as the runtime would.
    fn hand_to_callback(signal: &Arc<Signal>) -> *mut c_void {
        Arc::into_raw(Arc::clone(signal)).cast_mut().cast()
    }

    #[test]
    fn firing_wakes_the_registered_waker_once_and_reclaims_its_reference() {
        let signal = Arc::new(Signal::default());
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        assert!(!signal.fired_or_register(&waker));
        assert!(!signal.fired_or_register(&waker), "a second poll keeps one waker");
        let data = hand_to_callback(&signal);
        assert_eq!(Arc::strong_count(&signal), 2);
        // SAFETY: `data` holds one reference, handed to this single call.
        unsafe { fire(data) };
        assert_eq!(Arc::strong_count(&signal), 1, "the callback's reference is released");
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert!(signal.fired_or_register(&waker));
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "no wake after firing");
    }

    #[test]
    fn a_signal_dropped_by_its_future_stays_valid_for_the_callback() {
        let signal = Arc::new(Signal::default());
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        assert!(!signal.fired_or_register(&Waker::from(Arc::clone(&counter))));
        let data = hand_to_callback(&signal);
        drop(signal); // the future went away (dropped or forgotten) before the GPU got there
        // SAFETY: as above; the callback now holds the last reference and frees it.
        unsafe { fire(data) };
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "the waker still fires (the task may be gone)");
        assert_eq!(Arc::strong_count(&counter), 1, "the waker was consumed, not leaked");
    }

    #[test]
    fn a_waker_that_panics_does_not_unwind_into_the_runtime() {
        struct Panicking;
        impl Wake for Panicking {
            fn wake(self: Arc<Self>) {
                panic!("executor bug");
            }
        }
        let signal = Arc::new(Signal::default());
        assert!(!signal.fired_or_register(&Waker::from(Arc::new(Panicking))));
        // SAFETY: as above.
        unsafe { fire(hand_to_callback(&signal)) };
        assert!(signal.fired_or_register(&Waker::noop().clone()));
    }

    #[test]
    fn polling_after_completion_is_a_typed_error() {
        let err = polled_after_completion("Pending");
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    }
}
