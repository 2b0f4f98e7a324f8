//! Events: markers in a stream, for waiting, cross-stream ordering and timing.

use super::Stream;
use super::notify::Completion;
use crate::device::{CurrentDevice, Device};
use crate::error::Result;
use crate::raw;
use std::time::Duration;

/// A CUDA event (`cudaEventCreate`), destroyed on drop.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Event, Stream};
/// let (a, b) = (Stream::non_blocking()?, Stream::non_blocking()?);
/// let start = Event::new()?;
/// start.record(&a)?;
/// b.wait_event(&start)?; // b's later work runs after a's work so far
/// let end = a.record_event()?;
/// end.synchronize()?;
/// println!("{:?}", end.elapsed_since(&start)?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Event {
    raw: raw::cudaEvent_t,
    /// For a fence ([`Event::fence`]): the device whose spares take the handle back on drop.
    spare_of: Option<Device>,
}

// SAFETY: an event handle names one event from any thread (it is not relative to the current
// device or thread), and the runtime API is thread-safe: another thread may record it on a stream
// of any device, wait for it, query it, or destroy it by dropping the last owner.
unsafe impl Send for Event {}
// SAFETY: every method takes &self and passes the handle to thread-safe runtime calls; recording
// from two threads at once is ordered by the runtime (the later record wins).
unsafe impl Sync for Event {}

impl Event {
    /// A new event with timing enabled.
    pub fn new() -> Result<Self> {
        raw::events::create(true).map(|raw| Self { raw, spare_of: None })
    }

    /// A new event without timing: cheaper to record, what cross-stream ordering wants.
    pub fn without_timing() -> Result<Self> {
        raw::events::create(false).map(|raw| Self { raw, spare_of: None })
    }

    /// An untimed event recorded after the work queued on `stream` so far: what cross-stream
    /// ordering and completion checks use. Its handle comes from the spares of the stream's
    /// device and goes back there on drop, so a fence costs one runtime call (the record)
    /// instead of three (create, record, destroy). The handle is only reused once this value is
    /// gone: waits queued on it already are bound to this record, and nothing queries it later.
    pub(crate) fn fence(stream: &Stream) -> Result<Self> {
        let device = stream.device();
        let event = match spares::take(device) {
            Some(raw) => Self { raw, spare_of: Some(device) },
            None => {
                let _current = CurrentDevice::set(device)?;
                raw::events::create(false).map(|raw| Self { raw, spare_of: Some(device) })?
            }
        };
        event.record(stream)?;
        Ok(event)
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_raw(&self) -> raw::cudaEvent_t {
        self.raw
    }

    /// Captures the work queued on `stream` so far (`cudaEventRecord`). The stream of a running
    /// [`Stream::capture`] is [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument):
    /// there the event would be a graph node, and a stream waiting for it would join the capture.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        stream.require_outside_capture("Event::record")?;
        let call = stream.call()?;
        // SAFETY: the event is ours; `call` keeps the stream handle valid and meaning this stream.
        unsafe { raw::events::record(self.raw, call.as_raw()) }
    }

    /// Blocks until the captured work has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is valid while `self` lives.
        unsafe { raw::events::synchronize(self.raw) }
    }

    /// A future that resolves once the captured work has completed (at once for an event never
    /// recorded), woken through a host function on a helper stream that waits for the event; no
    /// thread blocks. Recording the event again later does not change what the future waits for.
    /// The waker must not call CUDA inline (see [`Completion`]).
    ///
    /// ```no_run
    /// # async fn run() -> cuda_mem::Result<()> {
    /// let stream = cuda_mem::Stream::non_blocking()?;
    /// let done = stream.record_event()?;
    /// done.wait_async()?.await?;
    /// # Ok(()) }
    /// ```
    pub fn wait_async(&self) -> Result<Completion> {
        Completion::after_events(Device::current()?, &[self])
    }

    /// True when the captured work has completed; never blocks.
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: the handle is valid while `self` lives.
        unsafe { raw::events::is_complete(self.raw) }
    }

    /// Whether memory this event fences may be reused: its work has completed, or the context is
    /// broken (the query fails, and no work runs any more). An event recorded in a capture (which
    /// safe code cannot make: [`Event::record`] refuses) is never done: it marks no stream's work.
    pub(crate) fn allows_reuse(&self) -> bool {
        match self.is_complete() {
            Ok(done) => done,
            Err(err) => err.code() != Some(crate::ErrorCode::CAPTURED_EVENT),
        }
    }

    /// Time from `start` to `self`; both must have completed and have timing enabled.
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration> {
        // SAFETY: both handles are valid while their owners live.
        unsafe { raw::events::elapsed(start.raw, self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(device) = self.spare_of
            && spares::put(device, self.raw)
        {
            return;
        }
        // SAFETY: we own the handle; destroying a recorded, pending event is allowed (the runtime
        // releases it once complete).
        raw::quiet(unsafe { raw::events::destroy(self.raw) });
    }
}

/// Untimed event handles of dropped fences, per device, for the next fences. A handle here has
/// no owner: recording it anew is all its next user does, and a record replaces the last one for
/// later queries and waits only (waits queued earlier keep the record they were queued after).
mod spares {
    use crate::device::Device;
    use crate::raw;
    use std::sync::{Mutex, PoisonError};

    /// Enough for the fences of a few hundred operations in flight; more are destroyed.
    const KEEP_PER_DEVICE: usize = 256;

    struct Handle(raw::cudaEvent_t);

    // SAFETY: an event handle names one event from any thread; a spare has no other user.
    unsafe impl Send for Handle {}

    /// By device ordinal.
    static SPARES: Mutex<Vec<Vec<Handle>>> = Mutex::new(Vec::new());

    pub(super) fn take(device: Device) -> Option<raw::cudaEvent_t> {
        let mut spares = SPARES.lock().unwrap_or_else(PoisonError::into_inner);
        spares.get_mut(device.ordinal())?.pop().map(|h| h.0)
    }

    /// Keeps `raw` for reuse on `device`; false when full (the caller destroys it).
    pub(super) fn put(device: Device, raw: raw::cudaEvent_t) -> bool {
        let mut spares = SPARES.lock().unwrap_or_else(PoisonError::into_inner);
        let index = device.ordinal();
        if spares.len() <= index {
            spares.resize_with(index + 1, Vec::new);
        }
        let list = &mut spares[index];
        if list.len() >= KEEP_PER_DEVICE {
            return false;
        }
        list.push(Handle(raw));
        true
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Spares are kept per device, newest first, up to the bound; the handles here are never
        /// passed to the runtime (device 7: no other test keeps spares there).
        #[test]
        fn spares_are_kept_per_device_up_to_the_bound() {
            let (mine, other) = (Device::new_unchecked_for_tests(7), Device::new_unchecked_for_tests(6));
            let handle = |i: usize| (i * 16 + 16) as raw::cudaEvent_t;
            assert_eq!(take(mine), None);
            for i in 0..KEEP_PER_DEVICE {
                assert!(put(mine, handle(i)), "spare {i} must be kept");
            }
            assert!(!put(mine, handle(KEEP_PER_DEVICE)), "one past the bound is the caller's to destroy");
            assert_eq!(take(other), None, "another device's spares are not shared");
            assert_eq!(take(mine), Some(handle(KEEP_PER_DEVICE - 1)));
            assert!(put(mine, handle(KEEP_PER_DEVICE)), "room again after a take");
            let mut left = 0;
            while take(mine).is_some() {
                left += 1;
            }
            assert_eq!(left, KEEP_PER_DEVICE);
        }
    }
}

#[cfg(test)]
impl Event {
    /// An event value around any handle, for drop-path tests.
    pub(crate) fn from_raw_for_tests(raw: raw::cudaEvent_t) -> Self {
        Self { raw, spare_of: None }
    }
}
