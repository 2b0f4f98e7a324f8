//! Streams: ordered queues of device work.

use crate::device::{CurrentDevice, Device};
use crate::error::Result;
use crate::event::Event;
use crate::raw::check;
use crate::scope::StreamScope;
use cuda_mem_sys as sys;
use std::fmt;
use std::sync::Arc;

/// A CUDA stream. Cloning shares the stream; it is destroyed when the last clone drops (work
/// already queued still completes: `cudaStreamDestroy` does not wait and does not cancel).
///
/// Asynchronous work that borrows memory is queued through [`Stream::scope`], which waits for the
/// stream before the borrows end.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let host = vec![1.0f32; 1 << 20];
/// let mut device = DeviceBuffer::<f32>::zeroed(host.len())?;
/// let mut back = vec![0.0f32; host.len()];
/// let dev = device.as_mut_slice();
/// stream.scope(|s| -> Result<(), cuda_mem::CudaError> {
///     s.copy_from_host(&dev, &host)?;
///     s.copy_to_host(&mut back, &dev)?;
///     Ok(())
/// })??;
/// assert_eq!(host, back);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

struct StreamInner {
    raw: sys::cudaStream_t,
    device: Device,
    /// False for the built-in default streams, which are never destroyed.
    owned: bool,
}

// SAFETY: a cudaStream_t is a handle the runtime lets any thread use (the runtime API is
// thread-safe); the inner state is immutable after creation.
unsafe impl Send for StreamInner {}
// SAFETY: as above: every method takes &self and only passes the handle to thread-safe runtime calls.
unsafe impl Sync for StreamInner {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").field("raw", &self.inner.raw).field("device", &self.inner.device).finish()
    }
}

/// How a new stream relates to the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocking {
    /// Synchronizes with the legacy default stream (`cudaStreamDefault`).
    Blocking,
    /// Does not synchronize with the legacy default stream (`cudaStreamNonBlocking`).
    NonBlocking,
}

impl Stream {
    /// A new stream on the current device that synchronizes with the legacy default stream.
    pub fn new() -> Result<Self> {
        Self::create(Device::current()?, Blocking::Blocking, None)
    }

    /// A new stream on the current device that does not synchronize with the legacy default
    /// stream: what overlapping pipelines want.
    pub fn non_blocking() -> Result<Self> {
        Self::create(Device::current()?, Blocking::NonBlocking, None)
    }

    /// A new non-blocking stream with a priority (lower numbers run first; see
    /// [`Stream::priority_range`]).
    pub fn with_priority(priority: i32) -> Result<Self> {
        Self::create(Device::current()?, Blocking::NonBlocking, Some(priority))
    }

    /// A new non-blocking stream on `device` (the current device is restored afterwards).
    pub fn on_device(device: Device) -> Result<Self> {
        Self::create(device, Blocking::NonBlocking, None)
    }

    /// (least, greatest) priority; the greatest is the numerically lowest.
    pub fn priority_range() -> Result<(i32, i32)> {
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: both out-pointers are valid for writes.
        check(unsafe { sys::cudaDeviceGetStreamPriorityRange(&mut least, &mut greatest) }, || {
            "cudaDeviceGetStreamPriorityRange".into()
        })?;
        Ok((least, greatest))
    }

    fn create(device: Device, blocking: Blocking, priority: Option<i32>) -> Result<Self> {
        let _guard = CurrentDevice::set(device)?;
        let flags = match blocking {
            Blocking::Blocking => sys::cudaStreamDefault,
            Blocking::NonBlocking => sys::cudaStreamNonBlocking,
        };
        let mut raw: sys::cudaStream_t = std::ptr::null_mut();
        // SAFETY: `raw` is valid for writes; flags are the documented constants.
        let code = unsafe { sys::cudaStreamCreateWithPriority(&mut raw, flags, priority.unwrap_or(0)) };
        check(code, || format!("cudaStreamCreateWithPriority on {device}"))?;
        Ok(Self { inner: Arc::new(StreamInner { raw, device, owned: true }) })
    }

    /// The legacy default stream (handle 0) of the current device: it synchronizes with every
    /// blocking stream.
    pub fn legacy_default() -> Result<Self> {
        Self::builtin(std::ptr::null_mut())
    }

    /// The calling thread's per-thread default stream (`cudaStreamPerThread`).
    pub fn per_thread() -> Result<Self> {
        // `cudaStreamPerThread` is `((cudaStream_t)0x2)` in the headers.
        Self::builtin(0x2 as sys::cudaStream_t)
    }

    fn builtin(raw: sys::cudaStream_t) -> Result<Self> {
        Ok(Self { inner: Arc::new(StreamInner { raw, device: Device::current()?, owned: false }) })
    }

    /// The raw handle, for interoperation with other CUDA code. It stays valid while `self` lives.
    pub fn as_raw(&self) -> sys::cudaStream_t {
        self.inner.raw
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Blocks until all work queued so far has completed (`cudaStreamSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is valid while `self` lives.
        check(unsafe { sys::cudaStreamSynchronize(self.inner.raw) }, || "cudaStreamSynchronize".into())
    }

    /// True when all queued work has completed (`cudaStreamQuery`); never blocks.
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: the handle is valid while `self` lives.
        let code = unsafe { sys::cudaStreamQuery(self.inner.raw) };
        if code == sys::cudaError::cudaErrorNotReady {
            return Ok(false);
        }
        check(code, || "cudaStreamQuery".into()).map(|()| true)
    }

    /// Makes later work on this stream wait until `event` has completed (`cudaStreamWaitEvent`);
    /// the host does not block.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles are valid while their owners live.
        check(unsafe { sys::cudaStreamWaitEvent(self.inner.raw, event.as_raw(), 0) }, || "cudaStreamWaitEvent".into())
    }

    /// Records a new event at the current end of this stream.
    pub fn record_event(&self) -> Result<Event> {
        let event = Event::new()?;
        event.record(self)?;
        Ok(event)
    }

    /// Runs `f` with a scope through which work that borrows memory is queued on this stream, then
    /// waits for the stream, so everything borrowed for the scope is free of GPU work when `scope`
    /// returns — also if `f` panics. This is how cuda-mem makes asynchronous copies safe: host
    /// memory lent to the GPU cannot be touched, moved or dropped while a copy may still read or
    /// write it.
    ///
    /// The outer `Result` is the final synchronize; `f`'s own value comes back inside it.
    pub fn scope<'env, F, R>(&'env self, f: F) -> Result<R>
    where
        F: for<'scope> FnOnce(&'scope StreamScope<'scope, 'env>) -> R,
    {
        StreamScope::run(self, f)
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we created the handle and this is its last user. Queued work completes
            // after destruction; scopes have already waited for any work that borrowed memory.
            let _ = unsafe { sys::cudaStreamDestroy(self.raw) };
        }
    }
}
