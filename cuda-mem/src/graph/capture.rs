//! Stream capture: [`Stream::capture`] and the [`CaptureScope`] the captured work is queued
//! through, and the [`Graph`] it makes.

use super::outputs::{GraphOutput, OutputRecord};
use super::pool::{CapturedBlocks, GraphPool};
use super::slots::{HostSlot, SlotRecord};
use crate::device::Device;
use crate::error::{CudaError, ErrorKind, Result};
use crate::raw::{self, graphs};
use crate::scope::StreamScope;
use crate::slice::{DeviceSliceMut, DeviceSource};
use crate::stream::Stream;
use bytemuck::Pod;
use std::cell::RefCell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a capture treats potentially unsafe API calls from other threads
/// (`cudaStreamCaptureMode`): calls such as `cudaMalloc`, which may synchronize implicitly, fail
/// while a capture they could disturb runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// Such calls fail on every thread while the capture runs.
    Global,
    /// Such calls fail on the capturing thread only.
    ThreadLocal,
    /// No call is refused; the caller makes sure none disturbs the capture.
    Relaxed,
}

impl CaptureMode {
    fn as_raw(self) -> graphs::cudaStreamCaptureMode {
        use graphs::cudaStreamCaptureMode as M;
        match self {
            Self::Global => M::cudaStreamCaptureModeGlobal,
            Self::ThreadLocal => M::cudaStreamCaptureModeThreadLocal,
            Self::Relaxed => M::cudaStreamCaptureModeRelaxed,
        }
    }
}

/// Graph ids, so a [`HostSlot`] finds its own graph's slice.
static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

/// A captured CUDA graph (`cudaGraph_t`), destroyed on drop. Everything its work borrows is
/// borrowed for `'env`. [`Graph::instantiate`] turns it into a launchable [`GraphExec`](crate::GraphExec).
///
/// Memory the captured work uses cannot be dropped or mutated while the graph lives:
///
/// ```compile_fail,E0505
/// # use cuda_mem::{CaptureMode, DeviceBuffer, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let mut buffer = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let mut view = buffer.as_mut_slice();
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.set_bytes(&mut view, 1)).unwrap();
/// drop(buffer); // error: `buffer` is borrowed by the graph
/// drop(graph);
/// ```
#[derive(Debug)]
pub struct Graph<'env> {
    pub(crate) raw: graphs::cudaGraph_t,
    pub(crate) device: Device,
    pub(crate) slots: Vec<SlotRecord>,
    pub(crate) outputs: Vec<OutputRecord>,
    /// The private pools the captured work allocated from (by id), whose turns its launches take.
    pub(crate) pools: Vec<GraphPool>,
    pub(crate) _env: PhantomData<&'env mut ()>,
}

// SAFETY: the graph handle is used by one thread at a time (every method takes `self` or
// `&mut self`; graph objects are not thread-safe, moving one is); the slot records stand for
// exclusive borrows of `Send` host slices (`T: Send` where they are made).
unsafe impl Send for Graph<'_> {}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the handle; executable graphs made from it do not need it.
        raw::quiet(unsafe { graphs::destroy(self.raw) });
    }
}

/// A graph allocation made in the capture, freed at its end.
#[derive(Debug)]
struct Temporary {
    ptr: *mut c_void,
    bytes: usize,
}

/// What work queued during [`Stream::capture`] goes through. It dereferences to a
/// [`StreamScope`] whose lifetimes are both `'env`, so every copy, memset and kernel launcher of
/// cuda-mem and cuda-mem-kernels works here, and borrows what it is given for `'env`: for as long
/// as the [`Graph`] and the [`GraphExec`](crate::GraphExec) made from it live.
///
/// The stream it queues on ([`StreamScope::stream`]) is a handle of the capture's private stream
/// that works only while the capture runs: work on it is recorded, not run, and a synchronize on
/// it is an error of the runtime ([`ErrorCode::STREAM_CAPTURE_UNSUPPORTED`](crate::ErrorCode::STREAM_CAPTURE_UNSUPPORTED))
/// that fails the capture.
///
/// Sources take both forms of the API conventions. Memory from outside the capture is passed as
/// a view of its owner (`weights.as_slice()`) or as a reference to a view (`&view`); memory the
/// capture makes itself (`temporary`, `cached`, `output`) is a view that lives in the closure, so
/// it is passed by reference (`&tmp`), which lends the graph the memory, not the local variable:
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{CaptureMode, DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let weights = DeviceBuffer::from_slice(&[1.0f32; 64])?;
/// let mut out = DeviceBuffer::<f32>::zeroed(64)?;
/// let mut view = out.as_mut_slice();
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| {
///     let mut tmp = s.temporary::<f32>(64)?;
///     s.copy_from_device(&mut tmp, weights.as_slice())?; // a view of an owner outside
///     s.copy_from_device(&mut view, &tmp) // a capture's own memory, by reference
/// })?;
/// # drop(graph); Ok(()) }
/// ```
///
/// A view made from the closure's own variable borrows that variable, which ends with the closure:
///
/// ```compile_fail,E0597
/// # fn main() -> cuda_mem::Result<()> {
/// # use cuda_mem::{CaptureMode, DeviceBuffer, Stream};
/// # let stream = Stream::non_blocking()?;
/// # let mut out = DeviceBuffer::<f32>::zeroed(64)?;
/// # let mut view = out.as_mut_slice();
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| {
///     let tmp = s.temporary::<f32>(64)?;
///     s.copy_from_device(&mut view, tmp.as_slice()) // error: `tmp` does not live long enough
/// })?;
/// # drop(graph); Ok(()) }
/// ```
#[derive(Debug)]
pub struct CaptureScope<'env> {
    scope: StreamScope<'env, 'env>,
    stream: &'env Stream,
    graph: u64,
    /// The device's default pool, whose properties the graph's allocation nodes take (the graph
    /// allocates from graph memory, not from the pool). Looked up before the capture begins: a
    /// pool created or queried inside it could fail the capture.
    graph_pool: raw::cudaMemPool_t,
    temporaries: RefCell<Vec<Temporary>>,
    pooled: CapturedBlocks,
    slots: RefCell<Vec<SlotRecord>>,
    outputs: RefCell<Vec<OutputRecord>>,
}

impl<'env> Deref for CaptureScope<'env> {
    type Target = StreamScope<'env, 'env>;

    fn deref(&self) -> &Self::Target {
        &self.scope
    }
}

impl<'env> CaptureScope<'env> {
    /// The scope itself, for launchers that take a `&StreamScope` (deref coercion does this too).
    pub fn scope(&self) -> &StreamScope<'env, 'env> {
        &self.scope
    }

    /// `len` zeroed elements of graph memory (an allocation node, `cudaMallocFromPoolAsync` on
    /// the capturing stream, and a memset node), freed by a free node at the end of the graph.
    /// The graph owns the memory: it exists while a launch runs, at the same address every
    /// launch. The view is refused by every operation once the capture has ended.
    pub fn temporary<T: Pod>(&self, len: usize) -> Result<DeviceSliceMut<'env, T>> {
        // SAFETY: the memset below, captured right after the allocation, writes every byte.
        let view = unsafe { self.temporary_uninit::<T>(len)? };
        let call = self.stream.call()?;
        if view.size_bytes() != 0 {
            // SAFETY: the allocation holds `size_bytes`, captured in order after its allocation.
            unsafe { raw::memory::set_async(view.as_device_ptr().cast(), 0, view.size_bytes(), call.as_raw())? };
        }
        Ok(view)
    }

    /// [`CaptureScope::temporary`] without the memset.
    ///
    /// # Safety
    /// Captured work writes every element before any captured work reads it.
    pub unsafe fn temporary_uninit<T: Pod>(&self, len: usize) -> Result<DeviceSliceMut<'env, T>> {
        let (ptr, bytes) = self.allocation_node::<T>(len, "CaptureScope::temporary")?;
        if bytes != 0 {
            self.temporaries.borrow_mut().push(Temporary { ptr, bytes });
        }
        // SAFETY: the graph allocates `bytes` here before the captured work that follows and frees
        // them after all of it (`finish`); the view names the capture's stream, which refuses every
        // use once the capture has ended, so no work outside the graph reaches the address.
        Ok(unsafe { DeviceSliceMut::ordered_on(ptr.cast(), len, self.stream) })
    }

    /// `len` zeroed elements of graph memory that outlive the launch: an allocation node and a
    /// memset node, with no free node. The captured work writes the view; between launches,
    /// [`GraphExec::output`](crate::GraphExec::output) reads what the last launch left there.
    /// The executable graph frees it at the next launch (it is instantiated with
    /// [`GraphFlags::AUTO_FREE_ON_LAUNCH`](crate::GraphFlags::AUTO_FREE_ON_LAUNCH), whatever the
    /// flags asked for) and on drop. As for [`CaptureScope::temporary`], the view is refused once
    /// the capture has ended.
    pub fn output<T: Pod>(&self, len: usize) -> Result<(DeviceSliceMut<'env, T>, GraphOutput<T>)> {
        let (ptr, bytes) = self.allocation_node::<T>(len, "CaptureScope::output")?;
        let index = self.outputs.borrow().len();
        let (record, key) = OutputRecord::new::<T>(self.graph, index, ptr, len);
        self.outputs.borrow_mut().push(record);
        if bytes != 0 {
            let call = self.stream.call()?;
            // SAFETY: the allocation holds `bytes`, captured in order after its allocation.
            unsafe { raw::memory::set_async(ptr, 0, bytes, call.as_raw())? };
        }
        // SAFETY: the graph allocates `bytes` here before the captured work that follows and
        // frees them no earlier than the next launch or the executable graph's drop; the view
        // names the capture's stream, which refuses every use once the capture has ended.
        Ok((unsafe { DeviceSliceMut::ordered_on(ptr.cast(), len, self.stream) }, key))
    }

    /// Captures an allocation node of `len` elements of T: its address and size in bytes, or a
    /// dangling address and 0 for an empty request (no node).
    fn allocation_node<T: Pod>(&self, len: usize, what: &'static str) -> Result<(*mut c_void, usize)> {
        let bytes = raw::byte_len::<T>(len, what)?;
        if bytes == 0 {
            return Ok((std::ptr::NonNull::<T>::dangling().as_ptr().cast(), 0));
        }
        let call = self.stream.call()?;
        // SAFETY: the driver's default pool lives as long as the context, and the stream handle is
        // valid; the stream captures, so this adds an allocation node and returns the address the
        // graph will allocate at.
        let ptr = unsafe {
            raw::pools::malloc_from_pool_async(bytes, self.graph_pool, call.as_raw(), || "in a capture".into())?
        };
        if !ptr.cast::<T>().is_aligned() {
            // Freed at the end of the graph, should the closure go on despite the error.
            self.temporaries.borrow_mut().push(Temporary { ptr, bytes });
            return Err(raw::misaligned_error::<T>(ptr as usize, "cudaMallocFromPoolAsync in a capture"));
        }
        Ok((ptr, bytes))
    }

    /// `len` zeroed elements from the private pool `pool` (a memset node zeroes them at every
    /// launch). The address is baked into the graph; at the end of the capture the block returns
    /// to `pool`, where later captures sharing the pool reuse it, so graphs of one pool need about
    /// the memory of the largest, not the sum; launches of graphs of one pool take turns (see
    /// [`GraphPool`]). The view is refused by every operation once the capture has ended. A pool
    /// of another device is [`ErrorKind::InvalidArgument`].
    pub fn cached<T: Pod>(&self, pool: &GraphPool, len: usize) -> Result<DeviceSliceMut<'env, T>> {
        // SAFETY: the memset below, captured right after the allocation, writes every byte.
        let view = unsafe { self.cached_uninit::<T>(pool, len)? };
        let call = self.stream.call()?;
        if view.size_bytes() != 0 {
            // SAFETY: the block holds `size_bytes`; the memset is captured before any later work.
            unsafe { raw::memory::set_async(view.as_device_ptr().cast(), 0, view.size_bytes(), call.as_raw())? };
        }
        Ok(view)
    }

    /// [`CaptureScope::cached`] without the memset: at each launch the block holds what the last
    /// launch of a graph of the pool left there.
    ///
    /// # Safety
    /// Captured work writes every element before any captured work reads it.
    pub unsafe fn cached_uninit<T: Pod>(&self, pool: &GraphPool, len: usize) -> Result<DeviceSliceMut<'env, T>> {
        let bytes = raw::byte_len::<T>(len, "CaptureScope::cached")?;
        if pool.device() != self.stream.device() {
            let kind = ErrorKind::InvalidArgument("a graph pool of another device than the captured stream");
            return Err(CudaError::new(kind, format!("{pool:?} in a capture on {}", self.stream.device())));
        }
        if bytes == 0 {
            // SAFETY: an empty view is never dereferenced or passed to CUDA with a length.
            return Ok(unsafe { DeviceSliceMut::ordered_on(std::ptr::NonNull::dangling().as_ptr(), 0, self.stream) });
        }
        let ptr = self.pooled.alloc(pool, bytes)?;
        if !ptr.cast::<T>().is_aligned() {
            return Err(raw::misaligned_error::<T>(ptr.as_ptr() as usize, "GraphPool"));
        }
        // SAFETY: the block holds `bytes` and is this capture's until its end; then it returns to
        // the pool, whose graphs (this one included) take turns on the device and which the graph
        // keeps alive. The view names the capture's stream, which refuses every use once the
        // capture has ended, so no work outside the graph reaches the block through it.
        Ok(unsafe { DeviceSliceMut::ordered_on(ptr.as_ptr().cast(), len, self.stream) })
    }

    /// Returns a block of [`CaptureScope::cached`] to its pool before the end of the capture:
    /// allocations captured after this call (of this capture too) may get the same memory, and
    /// the graph orders their work after every use of `view` captured before (a capture's work
    /// runs in capture order). `view` must be the whole view `cached` returned (moved in, so no
    /// later captured work can use it); a sub-view, a view of another capture or of other memory
    /// is [`ErrorKind::InvalidArgument`] and the block stays the capture's until its end. An
    /// empty view is `Ok` and does nothing.
    ///
    /// ```compile_fail,E0382
    /// # use cuda_mem::{CaptureMode, DeviceCache, Device, Stream};
    /// # let stream = Stream::non_blocking().unwrap();
    /// # let pool = DeviceCache::for_device(Device::current().unwrap()).unwrap().graph_pool().unwrap();
    /// let graph = stream.capture(CaptureMode::ThreadLocal, |s| {
    ///     let mut scratch = s.cached::<u32>(&pool, 1024)?;
    ///     s.release_cached(scratch)?;
    ///     s.set_bytes(&mut scratch, 1) // error: `scratch` was moved into release_cached
    /// });
    /// ```
    pub fn release_cached<T: Pod>(&self, view: DeviceSliceMut<'env, T>) -> Result<()> {
        if view.size_bytes() == 0 {
            return Ok(());
        }
        let ours = view.stream().is_some_and(|s| s.is_same_stream(self.stream));
        let ptr = std::ptr::NonNull::new(view.as_device_ptr().cast::<u8>());
        // SAFETY: the view was moved in and `cached` made it for the whole block (the address
        // and the requested size match, and the stream handle is this capture's own), so no
        // other view of the block can reach captured work: sub-views are made by consuming the
        // view and cannot be joined again, and shared views of a lent `&DeviceSliceMut` last one
        // call. The capture queues everything on its one stream, so what used the block is
        // captured before what follows.
        let released = ours && ptr.is_some_and(|p| unsafe { self.pooled.release(p, view.size_bytes()) });
        if released {
            return Ok(());
        }
        let kind = ErrorKind::InvalidArgument("not a whole view made by this capture's `cached`");
        Err(CudaError::new(kind, format!("CaptureScope::release_cached of {view:?}")))
    }

    /// Captures a host-to-device copy from `src`, which the graph borrows exclusively for its
    /// life: the returned key lends it back between launches ([`GraphExec::host_mut`](crate::GraphExec::host_mut)),
    /// so each launch can read new input. From pinned memory the copy is a DMA node.
    pub fn copy_from_host_slot<'v: 'env, T: Pod + Send + Sync>(
        &self,
        dst: &mut DeviceSliceMut<'v, T>,
        src: &'env mut [T],
    ) -> Result<HostSlot<T>> {
        let (record, slot) = self.new_slot(src);
        let (ptr, len) = (src.as_ptr(), src.len());
        // SAFETY: a shared view of `src`, which is borrowed exclusively for 'env: only the graph
        // and, between launches, the executable graph's accessors reach it.
        let shared: &'env [T] = unsafe { std::slice::from_raw_parts(ptr, len) };
        self.scope.copy_from_host(dst, shared)?;
        self.slots.borrow_mut().push(record);
        Ok(slot)
    }

    /// Captures a device-to-host copy into `dst`, which the graph borrows exclusively for its
    /// life: the returned key lends it back between launches ([`GraphExec::host`](crate::GraphExec::host)).
    pub fn copy_to_host_slot<T: Pod + Send + Sync>(
        &self,
        dst: &'env mut [T],
        src: impl DeviceSource<'env, T>,
    ) -> Result<HostSlot<T>> {
        let (record, slot) = self.new_slot(dst);
        let (ptr, len) = (dst.as_mut_ptr(), dst.len());
        // SAFETY: `dst` is borrowed exclusively for 'env; this is the only reference made from it
        // during the capture, and the record keeps the address for the executable graph.
        let target: &'env mut [T] = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        self.scope.copy_to_host(target, src)?;
        self.slots.borrow_mut().push(record);
        Ok(slot)
    }

    fn new_slot<T: Pod>(&self, slice: &mut [T]) -> (SlotRecord, HostSlot<T>) {
        let index = self.slots.borrow().len();
        SlotRecord::new(self.graph, index, slice)
    }

    /// Frees the temporaries at the end of the captured work, newest first.
    fn free_temporaries(&self) -> Result<()> {
        let call = self.stream.call()?;
        for temp in self.temporaries.borrow_mut().drain(..).rev() {
            // SAFETY: allocated in this capture on this stream, freed once, after all captured
            // work (stream order); the views of it are refused from now on.
            unsafe { raw::pools::free_async(temp.ptr, call.as_raw(), temp.bytes)? };
        }
        Ok(())
    }
}

/// Ends a capture however the closure left: on unwinding, the capture is ended and the partial
/// graph destroyed, so the stream captures no more.
struct Capturing<'a> {
    /// The capture's private stream (see [`Stream::capture`]).
    stream: &'a Stream,
    handle: &'a Stream,
}

impl Capturing<'_> {
    /// Ends the capture: the graph, or the first failure (the closure's, then the end's).
    fn finish<R>(self, queued: Result<R>) -> Result<(graphs::cudaGraph_t, R)> {
        let (ended, graph) = self.end();
        std::mem::forget(self);
        match (queued, ended) {
            (Ok(value), Ok(())) if !graph.is_null() => return Ok((graph, value)),
            (Ok(_), Ok(())) => {}
            (Ok(_), Err(err)) => return destroyed(graph, Err(err)),
            (Err(err), Ok(())) => return destroyed(graph, Err(err)),
            (Err(err), Err(end)) => return destroyed(graph, Err(err.with_later(end))),
        }
        let kind = ErrorKind::InvalidArgument("the runtime ended the capture without a graph");
        Err(CudaError::new(kind, "cudaStreamEndCapture"))
    }

    fn end(&self) -> (Result<()>, graphs::cudaGraph_t) {
        self.handle.end_capture_handle();
        // SAFETY: the private stream this capture began on, alive until the capture has ended.
        unsafe { graphs::end_capture(self.stream.as_raw()) }
    }
}

impl Drop for Capturing<'_> {
    fn drop(&mut self) {
        let (_, graph) = self.end();
        let _ = destroyed(graph, Ok(()));
    }
}

/// Destroys a graph the capture will not hand out (null for none) and returns `result`.
fn destroyed<T>(graph: graphs::cudaGraph_t, result: Result<T>) -> Result<T> {
    if !graph.is_null() {
        // SAFETY: the graph came from cudaStreamEndCapture and was never handed out.
        raw::quiet(unsafe { graphs::destroy(graph) });
    }
    result
}

impl Stream {
    /// True while a capture on this stream runs (`cudaStreamIsCapturing`); an invalidated
    /// capture that has not been ended counts as running. [`Stream::capture`] records on a
    /// stream of its own, so this is true for its scope's stream
    /// ([`StreamScope::stream`](crate::StreamScope::stream)) and for streams other code
    /// captures, never for the stream `capture` was called on.
    pub fn is_capturing(&self) -> Result<bool> {
        let call = self.call()?;
        // SAFETY: the handle is valid while `self` lives and means this stream here (`call`).
        let status = unsafe { graphs::capture_status(call.as_raw()) }?;
        Ok(status != graphs::cudaStreamCaptureStatus::cudaStreamCaptureStatusNone)
    }

    /// The runtime's id of the capture running on this stream, if one runs
    /// (`cudaStreamGetCaptureInfo`).
    pub fn capture_id(&self) -> Result<Option<u64>> {
        let call = self.call()?;
        // SAFETY: as in `is_capturing`.
        let (status, id) = unsafe { graphs::capture_info(call.as_raw()) }?;
        Ok((status != graphs::cudaStreamCaptureStatus::cudaStreamCaptureStatusNone).then_some(id))
    }

    /// Captures the work `f` queues into a [`Graph`] (`cudaStreamBeginCapture` ..
    /// `cudaStreamEndCapture`). Nothing runs now: the graph runs when a
    /// [`GraphExec`](crate::GraphExec) made from it is launched. Whatever `f` lends to the scope
    /// stays borrowed for as long as the graph and its executable graphs live.
    ///
    /// The capture records on a new stream made like `self` (device, blocking, priority), which
    /// only the scope's handle reaches: work queued through `self`, or a clone of it on another
    /// thread, while `f` runs is ordinary work that runs now, so no work the scope did not check
    /// can slip into the graph. On the scope's stream, recording events and cached memory
    /// ([`DeviceCache`](crate::DeviceCache), [`ResourceBuffer`](crate::resource::ResourceBuffer),
    /// [`PooledPinned::record_use`](crate::PooledPinned::record_use)) are
    /// [`ErrorKind::InvalidArgument`]: an event recorded there would join other streams to the
    /// capture, and a block kept under it would be reused while the graph still uses it.
    ///
    /// If `f` fails or panics, or the runtime invalidates the capture (a synchronize inside it,
    /// an operation the capture does not support), the capture is ended, the partial graph
    /// destroyed, and the stream can be used (and captured) again. Only streams made by
    /// cuda-mem's constructors can be captured; the built-in streams are
    /// [`ErrorKind::InvalidArgument`].
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, Stream};
    /// let stream = Stream::non_blocking()?;
    /// let mut buffer = DeviceBuffer::<u8>::zeroed(1024)?;
    /// let mut view = buffer.as_mut_slice();
    /// let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.set_bytes(&mut view, 7))?;
    /// graph.instantiate(GraphFlags::empty())?.launch(&stream)?;
    /// # Ok(()) }
    /// ```
    pub fn capture<'env, F>(&'env self, mode: CaptureMode, f: F) -> Result<Graph<'env>>
    where
        F: for<'s> FnOnce(&'s CaptureScope<'env>) -> Result<()>,
    {
        self.capture_with(mode, f).map(|(graph, ())| graph)
    }

    /// [`Stream::capture`] for a closure that returns a value too (host slot keys, say).
    pub fn capture_with<'env, F, R>(&'env self, mode: CaptureMode, f: F) -> Result<(Graph<'env>, R)>
    where
        F: for<'s> FnOnce(&'s CaptureScope<'env>) -> Result<R>,
    {
        if !self.is_created() {
            let kind = ErrorKind::InvalidArgument("only streams created by cuda-mem can be captured");
            return Err(CudaError::new(kind, format!("capturing {self:?}")));
        }
        let graph_pool = raw::pools::driver_default(self.device().as_raw())?;
        // Declared before `capturing`, so dropped after the capture has ended (unwinding too).
        let private = self.private_twin()?;
        let handle = self.capture_handle(&private);
        // SAFETY: a created stream, valid while `private` lives.
        if let Err(err) = unsafe { graphs::begin_capture(private.as_raw(), mode.as_raw()) } {
            handle.end_capture_handle();
            return Err(err);
        }
        let capturing = Capturing { stream: &private, handle };
        let graph = NEXT_GRAPH.fetch_add(1, Ordering::Relaxed);
        let scope = CaptureScope {
            scope: StreamScope::capturing(handle),
            stream: handle,
            graph,
            graph_pool,
            temporaries: RefCell::new(Vec::new()),
            pooled: CapturedBlocks::default(),
            slots: RefCell::new(Vec::new()),
            outputs: RefCell::new(Vec::new()),
        };
        let queued = f(&scope).and_then(|value| scope.free_temporaries().map(|()| value));
        let pools = scope.pooled.finish();
        let (raw, value) = capturing.finish(queued)?;
        let (slots, outputs) = (scope.slots.into_inner(), scope.outputs.into_inner());
        Ok((Graph { raw, device: self.device(), slots, outputs, pools, _env: PhantomData }, value))
    }
}
