//! Streams: ordered queues of device work, the events that mark points in them, their
//! completion as a future, and the borrowed handle resources and other CUDA code name them by.

pub(crate) mod event;
pub(crate) mod notify;
mod stream_ref;
pub(crate) mod uses;

pub use event::Event;
pub use notify::Completion;
pub use stream_ref::StreamRef;

use crate::device::{CurrentDevice, Device};
use crate::error::{CudaError, ErrorKind, Result};
use crate::maybe_owned::MaybeOwned;
use crate::raw;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

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
/// let mut dev = device.as_mut_slice();
/// stream.scope(|s| -> Result<(), cuda_mem::CudaError> {
///     s.copy_from_host(&mut dev, &host)?;
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
    raw: raw::cudaStream_t,
    device: Device,
    kind: StreamKind,
    /// For [`StreamKind::Created`]: how it was created, so a capture's private stream
    /// ([`Stream::capture`]) can be made alike.
    made: (Blocking, i32),
    /// For [`StreamKind::Capture`]: whether its capture still runs. Always true for the others.
    live: AtomicBool,
    /// The capture handles made for captures on this stream (see [`Stream::capture_handle`]),
    /// kept until the stream drops so references to them stay valid for the stream's borrow.
    // Boxed: references to the handles must survive the Vec growing.
    #[allow(clippy::vec_box)]
    capture_handles: Mutex<Vec<Box<Stream>>>,
}

impl StreamInner {
    fn new(raw: raw::cudaStream_t, device: Device, kind: StreamKind) -> Self {
        let made = (Blocking::NonBlocking, 0);
        Self { raw, device, kind, made, live: AtomicBool::new(true), capture_handles: Mutex::new(Vec::new()) }
    }
}

/// What a handle means. The built-in handles are not streams but names the runtime resolves at
/// each call, against the calling thread's current device and, for the per-thread stream, the
/// calling thread itself; cuda-mem resolves them only where that gives the stream they were
/// created for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    /// Created by `cudaStreamCreateWithPriority` and destroyed with the last clone.
    Created,
    /// Created by other code and kept valid by it ([`Stream::borrow_raw`]); never destroyed here.
    Borrowed,
    /// The legacy default stream (handle 0) of `device`.
    Legacy,
    /// `cudaStreamPerThread` of the creating thread on `device`.
    PerThread(ThreadId),
    /// A created stream's handle for the work of one capture ([`Stream::capture`]): usable
    /// while that capture runs, refused afterwards, never destroyed by this value. Memory
    /// allocated in the capture is ordered on it, so views of it that outlive the capture are
    /// refused by every operation instead of reaching memory the graph owns.
    Capture,
}

impl StreamKind {
    /// True for a handle that names one stream wherever it is used (not a built-in name).
    #[inline]
    fn names_one_stream(self) -> bool {
        matches!(self, Self::Created | Self::Borrowed | Self::Capture)
    }
}

// SAFETY: a created (or borrowed) stream's handle names one stream of one device from any thread,
// and the runtime API is thread-safe: another thread may queue work on it, wait for it, or destroy
// a created one with the last clone. A built-in handle means the calling thread's stream on the
// current device, so every use goes through `Stream::call`, which makes `device` current for the
// call and refuses a per-thread handle on any thread but its creator. The fields never change
// after creation.
unsafe impl Send for StreamInner {}
// SAFETY: as above: every method takes &self and reaches the runtime through `Stream::call`.
unsafe impl Sync for StreamInner {}

/// A stream handle checked for use on the calling thread, with the stream's device current
/// while a built-in handle is in use (restored on drop).
pub(crate) struct StreamCall {
    raw: raw::cudaStream_t,
    _device: Option<CurrentDevice>,
}

impl StreamCall {
    /// The handle, meaning the stream it was checked for until `self` drops.
    #[inline]
    pub(crate) fn as_raw(&self) -> raw::cudaStream_t {
        self.raw
    }

    /// The checked handle as a [`StreamRef`], valid while the call guard lives.
    pub(crate) fn stream_ref(&self) -> StreamRef<'_> {
        StreamRef::new(self.raw)
    }
}

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
    ///
    /// The current device is the runtime's per-thread setting: a new thread starts on device 0
    /// until it calls [`Device::set_current`]. To create a stream for a device from any thread
    /// without changing that setting, use [`Stream::on_device`].
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
        raw::device::stream_priority_range()
    }

    fn create(device: Device, blocking: Blocking, priority: Option<i32>) -> Result<Self> {
        let _guard = CurrentDevice::set(device)?;
        let non_blocking = blocking == Blocking::NonBlocking;
        let priority = priority.unwrap_or(0);
        let raw = raw::streams::create(non_blocking, priority, device.as_raw())?;
        let mut inner = StreamInner::new(raw, device, StreamKind::Created);
        inner.made = (blocking, priority);
        Ok(Self { inner: Arc::new(inner) })
    }

    /// A new stream made as this created one was (device, blocking, priority): where
    /// [`Stream::capture`] records, so that no other handle can reach the capturing stream.
    pub(crate) fn private_twin(&self) -> Result<Stream> {
        let (blocking, priority) = self.inner.made;
        Self::create(self.inner.device, blocking, Some(priority))
    }

    /// The legacy default stream (handle 0) of the current device: it synchronizes with every
    /// blocking stream. cuda-mem makes this device current around each use, so the value keeps
    /// meaning this device's legacy stream on any thread.
    pub fn legacy_default() -> Result<Self> {
        Self::builtin(std::ptr::null_mut(), StreamKind::Legacy)
    }

    /// The calling thread's per-thread default stream (`cudaStreamPerThread`) on the current
    /// device. It means a different stream on every thread, so every operation on it from another
    /// thread fails with [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument), and
    /// buffers that may outlive the thread ([`StreamBuffer`](crate::StreamBuffer),
    /// [`ResourceBuffer`](crate::resource::ResourceBuffer)) refuse it.
    pub fn per_thread() -> Result<Self> {
        // `cudaStreamPerThread` is `((cudaStream_t)0x2)` in the headers.
        Self::builtin(0x2 as raw::cudaStream_t, StreamKind::PerThread(std::thread::current().id()))
    }

    fn builtin(raw: raw::cudaStream_t, kind: StreamKind) -> Result<Self> {
        Ok(Self { inner: Arc::new(StreamInner::new(raw, Device::current()?, kind)) })
    }

    /// A stream that other code created and keeps, named by its raw handle: for callers that
    /// receive raw handles, like the allocator hooks PyTorch calls. cuda-mem never destroys it.
    /// The handle is checked to name a stream of `device` (`cudaStreamGetDevice`); a built-in
    /// handle (0, `cudaStreamLegacy`, `cudaStreamPerThread`) is refused, as it names no one stream
    /// (see [`Stream::legacy_default`] and [`Stream::per_thread`]).
    ///
    /// # Safety
    /// `raw` is a stream handle that stays valid (the stream is not destroyed) until the returned
    /// value and every clone of it have been dropped. Clones may outlive the caller's own: a
    /// [`DeviceCache`](crate::DeviceCache) given the stream keeps one for as long as it holds
    /// memory allocated or freed on it, and records events on the stream until then, which for a
    /// cache that lives as long as the process can mean as long as the process lives. Streams
    /// that are never destroyed (PyTorch's default and pooled streams) meet this.
    pub unsafe fn borrow_raw(raw: raw::cudaStream_t, device: Device) -> Result<Self> {
        if (raw as usize) <= 2 {
            let kind = ErrorKind::InvalidArgument("a built-in stream handle cannot be borrowed as a stream");
            return Err(CudaError::new(kind, format!("Stream::borrow_raw({raw:p})")));
        }
        // SAFETY: a valid stream handle, per the caller.
        let ordinal = unsafe { raw::streams::device_of(raw) }?;
        if ordinal != device.as_raw() {
            let kind = ErrorKind::InvalidArgument("the stream belongs to another device");
            return Err(CudaError::new(
                kind,
                format!("Stream::borrow_raw({raw:p}) for {device}: a stream of device {ordinal}"),
            ));
        }
        Ok(Self { inner: Arc::new(StreamInner::new(raw, device, StreamKind::Borrowed)) })
    }

    /// The raw handle, for interoperation with other CUDA code. It stays valid while `self` lives.
    /// For the built-in streams it is the runtime's name (0 or `cudaStreamPerThread`), which means
    /// the calling thread's stream on its current device: see [`Stream::checked_raw`].
    pub fn as_raw(&self) -> raw::cudaStream_t {
        self.inner.raw
    }

    /// This stream as a [`StreamRef`] for memory resources (see [`Stream::as_raw`] for what the
    /// handle of a built-in stream means).
    pub fn as_stream_ref(&self) -> StreamRef<'_> {
        StreamRef::new(self.inner.raw)
    }

    /// The raw handle after checking that, here, it means this stream: for a built-in stream the
    /// current device must be the stream's, and for the per-thread stream the calling thread must
    /// be the one that created it. What launchers of other crates pass to the runtime.
    pub fn checked_raw(&self) -> Result<raw::cudaStream_t> {
        self.check_thread()?;
        self.check_capture_live()?;
        if !self.inner.kind.names_one_stream() {
            let current = Device::current()?;
            if current != self.inner.device {
                let kind = ErrorKind::InvalidArgument("a built-in stream used while another device is current");
                return Err(CudaError::new(kind, format!("{self:?} used with {current} current")));
            }
        }
        Ok(self.inner.raw)
    }

    /// True when both values name the same stream (clones, one handle created here and borrowed,
    /// or the same built-in stream of the same device and thread).
    pub(crate) fn is_same_stream(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.kind != StreamKind::Capture
                && self.inner.raw == other.inner.raw
                && self.inner.device == other.inner.device
                && (self.inner.kind == other.inner.kind
                    || (self.inner.kind.names_one_stream() && other.inner.kind.names_one_stream())))
    }

    /// Refuses the per-thread stream for `operation`, which keeps the stream for use on other
    /// threads (buffers may be freed anywhere), where it would mean another stream.
    pub(crate) fn require_thread_independent(&self, operation: &'static str) -> Result<()> {
        if !matches!(self.inner.kind, StreamKind::PerThread(_)) {
            return Ok(());
        }
        let kind = ErrorKind::InvalidArgument(
            "the per-thread default stream cannot order a buffer that may be freed on another thread",
        );
        Err(CudaError::new(kind, operation))
    }

    /// The bytes of a buffer of `len` elements of `T` ordered on this stream, which must not be
    /// the per-thread stream (see [`Stream::require_thread_independent`]).
    pub(crate) fn buffer_bytes<T>(&self, len: usize, operation: &'static str) -> Result<usize> {
        self.require_thread_independent(operation)?;
        raw::byte_len::<T>(len, operation)
    }

    /// Refuses a capture handle whose capture has ended.
    fn check_capture_live(&self) -> Result<()> {
        if self.inner.kind != StreamKind::Capture || self.inner.live.load(Ordering::Acquire) {
            return Ok(());
        }
        let kind = ErrorKind::InvalidArgument(
            "the stream of a capture that has ended (memory allocated in a capture belongs to its graph)",
        );
        Err(CudaError::new(kind, format!("{self:?}")))
    }

    /// True for a created stream (the only kind that can be captured).
    pub(crate) fn is_created(&self) -> bool {
        self.inner.kind == StreamKind::Created
    }

    /// A new handle of `capturing` (the private stream a capture of this stream records on) for
    /// the work of one capture, valid for as long as `self` is borrowed and usable until
    /// [`Stream::end_capture_handle`]. Each capture gets its own, so a view that escaped an
    /// earlier capture is refused in a later one too.
    pub(crate) fn capture_handle(&self, capturing: &Stream) -> &Stream {
        let inner = StreamInner::new(capturing.inner.raw, self.inner.device, StreamKind::Capture);
        // A poisoned list is still a list of boxes: pushing onto it is fine.
        let mut handles = self.inner.capture_handles.lock().unwrap_or_else(|e| e.into_inner());
        handles.push(Box::new(Stream { inner: Arc::new(inner) }));
        // Taken from the box once it is in the list: moving a `Box` asserts that it is unique, so
        // a pointer taken before the push would not survive it (Miri's Stacked Borrows says so).
        let at: *const Stream = &**handles.last().expect("just pushed");
        drop(handles);
        // SAFETY: the box is owned by `self.inner`, which never removes or moves it (only the box
        // pointer moves when the Vec grows) and drops it only with `self.inner`, which outlives
        // the borrow of `self` this reference is tied to.
        unsafe { &*at }
    }

    /// Refuses the handle of a running capture for `operation`, which would record an event or
    /// keep memory on it: an event recorded in a capture is a graph node (another stream waiting
    /// for it would join the capture, and querying it fails), and memory kept under the capture's
    /// stream would be handed out again while the graph, launched later, still uses it. Memory for
    /// captured work comes from the [`CaptureScope`](crate::CaptureScope).
    pub(crate) fn require_outside_capture(&self, operation: &'static str) -> Result<()> {
        if self.inner.kind != StreamKind::Capture {
            return Ok(());
        }
        Err(capture_refused(operation))
    }

    /// The one precondition of a stream that orders memory an owner may free on another thread
    /// or reuse later (a use or free on another stream, a cache's block, a completion): not the
    /// per-thread stream (see [`Stream::require_thread_independent`]) and not a capture's (see
    /// [`Stream::require_outside_capture`]).
    pub(crate) fn require_orderable(&self, operation: &'static str) -> Result<()> {
        self.require_thread_independent(operation)?;
        self.require_outside_capture(operation)
    }

    /// Ends a handle made by [`Stream::capture_handle`]: every later use is refused.
    pub(crate) fn end_capture_handle(&self) {
        debug_assert_eq!(self.inner.kind, StreamKind::Capture);
        self.inner.live.store(false, Ordering::Release);
    }

    fn check_thread(&self) -> Result<()> {
        if let StreamKind::PerThread(creator) = self.inner.kind
            && creator != std::thread::current().id()
        {
            let kind = ErrorKind::InvalidArgument(
                "the per-thread default stream used from a thread other than the one that created it",
            );
            return Err(CudaError::new(kind, format!("{self:?}")));
        }
        Ok(())
    }

    /// The handle for a runtime call on this thread: a created stream as it is; a built-in one
    /// with its device current until the returned value drops, and the per-thread stream only on
    /// its creating thread. Every runtime call cuda-mem makes with a stream goes through here.
    #[inline]
    pub(crate) fn call(&self) -> Result<StreamCall> {
        // A capture handle names one stream too, but only while its capture runs: it takes the
        // checked path, or a view that escaped a capture would reach memory its graph owns.
        if matches!(self.inner.kind, StreamKind::Created | StreamKind::Borrowed) {
            return Ok(StreamCall { raw: self.inner.raw, _device: None });
        }
        self.checked_call()
    }

    /// [`Stream::call`] for a capture handle (live captures only) or a built-in stream.
    #[cold]
    fn checked_call(&self) -> Result<StreamCall> {
        if self.inner.kind == StreamKind::Capture {
            self.check_capture_live()?;
            return Ok(StreamCall { raw: self.inner.raw, _device: None });
        }
        self.check_thread()?;
        let device = CurrentDevice::set(self.inner.device)?;
        Ok(StreamCall { raw: self.inner.raw, _device: Some(device) })
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Blocks until all work queued so far has completed (`cudaStreamSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        let call = self.call()?;
        // SAFETY: the handle is valid while `self` lives and means this stream here (`call`).
        unsafe { raw::streams::synchronize(call.as_raw(), || "cudaStreamSynchronize".into()) }
    }

    /// A future that resolves once the work queued so far has completed, woken through a host
    /// function (`cudaLaunchHostFunc`) queued now; no thread blocks. Later work on this stream
    /// waits for that host function to return (it only wakes the task). The waker must not call
    /// CUDA inline (see [`Completion`]). The per-thread stream is refused
    /// ([`ErrorKind::InvalidArgument`]): the future may be polled on another thread.
    ///
    /// ```no_run
    /// # async fn run() -> cuda_mem::Result<()> {
    /// let stream = cuda_mem::Stream::non_blocking()?;
    /// // ... queue work ...
    /// stream.synchronize_async()?.await?;
    /// # Ok(()) }
    /// ```
    pub fn synchronize_async(&self) -> Result<Completion> {
        Completion::after_stream(self)
    }

    /// True when all queued work has completed (`cudaStreamQuery`); never blocks.
    pub fn is_idle(&self) -> Result<bool> {
        let call = self.call()?;
        // SAFETY: the handle is valid while `self` lives and means this stream here (`call`).
        unsafe { raw::streams::is_idle(call.as_raw()) }
    }

    /// Makes later work on this stream wait until `event` has completed (`cudaStreamWaitEvent`);
    /// the host does not block.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let call = self.call()?;
        // SAFETY: both handles are valid while their owners live; `call` checked the stream's.
        unsafe { raw::streams::wait_event(call.as_raw(), event.as_raw()) }
    }

    /// Makes later work on this stream wait (on the device) for the work queued on `other` so
    /// far; nothing when both name the same stream. What code that queues work of its own on
    /// stream-ordered memory ([`DeviceSlice::stream`](crate::DeviceSlice::stream)) does first.
    pub fn wait_for(&self, other: &Stream) -> Result<()> {
        if other.is_same_stream(self) {
            return Ok(());
        }
        self.wait_event(&other.record_event_untimed()?)
    }

    /// Records a new event at the current end of this stream.
    pub fn record_event(&self) -> Result<Event> {
        let event = Event::new()?;
        event.record(self)?;
        Ok(event)
    }

    /// Records an event without timing (cheaper; for ordering and completion only): a fence
    /// ([`Event::fence`]).
    pub(crate) fn record_event_untimed(&self) -> Result<Event> {
        Event::fence(self)
    }
}

#[cold]
fn capture_refused(operation: &'static str) -> CudaError {
    let kind = ErrorKind::InvalidArgument(
        "a capture's stream cannot record events or order cached memory (use the CaptureScope's memory)",
    );
    CudaError::new(kind, operation)
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        // A capture handle shares the handle of the private stream it was made for, which
        // destroys it.
        if self.kind == StreamKind::Created {
            // SAFETY: we created the handle and this is its last user. Queued work completes
            // after destruction; scopes have already waited for any work that borrowed memory.
            raw::quiet(unsafe { raw::streams::destroy(self.raw) });
        }
    }
}

/// A `Stream` given by value to what takes `impl Into<MaybeOwned<Stream>>`: kept alive by it.
impl From<Stream> for MaybeOwned<'_, Stream> {
    fn from(stream: Stream) -> Self {
        Self::Owned(stream)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stream that no runtime call ever reaches: borrowed (never destroyed), on a device that is
    /// not checked.
    pub(crate) fn unused_stream() -> Stream {
        unused_stream_at(std::ptr::NonNull::<u8>::dangling().as_ptr() as usize, StreamKind::Borrowed)
    }

    /// As [`unused_stream`], with the handle `handle` of `kind` (distinct handles name distinct
    /// streams; `PerThread` of the calling thread stands for the per-thread stream).
    pub(super) fn unused_stream_at(handle: usize, kind: StreamKind) -> Stream {
        let handle = handle as raw::cudaStream_t;
        Stream { inner: Arc::new(StreamInner::new(handle, Device::new_unchecked_for_tests(0), kind)) }
    }

    /// The H200 run of the graph merge found a view that escaped a capture reaching `cudaMemcpy`:
    /// the capture handle had joined the unchecked fast path. Every use of an ended capture's
    /// handle is refused before the runtime is called (no GPU needed to check it).
    #[test]
    fn an_ended_capture_handle_is_refused_by_every_call() {
        let stream = unused_stream();
        let handle = stream.capture_handle(&stream);
        assert!(handle.call().is_ok(), "a live capture's handle is usable");
        handle.end_capture_handle();
        for err in [handle.call().err(), handle.synchronize().err(), handle.checked_raw().err()] {
            let err = err.expect("an ended capture's handle must be refused");
            assert!(
                matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("capture that has ended")),
                "{err}"
            );
        }
        assert!(stream.call().is_ok(), "the stream itself stays usable");
    }

    /// A live capture's handle may queue borrowed work, but nothing that records an event on it
    /// or keeps memory under it: a fence recorded in a capture is a graph node, and a block kept
    /// under the capture's stream would be reused while the graph still uses it. Checked before
    /// the runtime is called.
    #[test]
    fn a_live_capture_handle_refuses_fences_and_owned_work() {
        let stream = unused_stream();
        let handle = stream.capture_handle(&stream);
        let refused = |err: Option<CudaError>, operation: &str| {
            let err = err.unwrap_or_else(|| panic!("{operation} on a capture's stream must be refused"));
            assert!(
                matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("capture's stream cannot record events")),
                "{operation}: {err}"
            );
            assert!(err.to_string().contains(operation), "{err}");
        };
        refused(handle.require_outside_capture("CachedBuffer::free_on").err(), "CachedBuffer::free_on");
        refused(handle.queue(vec![1u8; 4], |_, _| Ok(())).err(), "Stream::queue");
        let resource: Arc<dyn crate::resource::MemoryResource> =
            Arc::new(crate::resource::testing::HostResource::default());
        // SAFETY: refused before any memory exists.
        let buffer = unsafe { crate::resource::ResourceHostBuffer::<u32>::uninit(resource, handle, 16) };
        refused(buffer.err(), "ResourceHostBuffer");
        assert!(
            stream.require_outside_capture("CachedBuffer::free_on").is_ok(),
            "the stream itself is not the capture's"
        );
    }
}
