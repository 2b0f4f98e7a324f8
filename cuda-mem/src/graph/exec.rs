//! Executable graphs: instantiation, launches that wait before the borrows can end, launches
//! in a scope or a `Pending` that owns the executable graph, updates.

use super::capture::Graph;
use super::outputs::{GraphOutput, Outputs};
use super::pool::{GraphPool, Turns, merge_pools};
use super::slots::{HostSlot, SlotRecord};
use crate::device::Device;
use crate::error::{CudaError, ErrorKind, Result, UpdateRefusal};
use crate::pending::Pending;
use crate::raw::{self, graphs};
use crate::scope::{StreamScope, merge};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Stream;
use bytemuck::Pod;
use std::cell::Cell;
use std::marker::PhantomData;

bitflags::bitflags! {
    /// Flags of `cudaGraphInstantiateWithFlags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct GraphFlags: u64 {
        /// `cudaGraphInstantiateFlagAutoFreeOnLaunch`: a launch first frees what the previous
        /// launch allocated and did not free, so a graph whose allocations outlive a launch can
        /// be launched again.
        const AUTO_FREE_ON_LAUNCH = 1;
        /// `cudaGraphInstantiateFlagUseNodePriority`: kernel nodes keep the priority they were
        /// captured with rather than the launch stream's.
        const USE_NODE_PRIORITY = 8;
    }
}

impl UpdateRefusal {
    fn from_raw(result: graphs::cudaGraphExecUpdateResult) -> Self {
        use graphs::cudaGraphExecUpdateResult as R;
        match result {
            R::cudaGraphExecUpdateErrorTopologyChanged => Self::TopologyChanged,
            R::cudaGraphExecUpdateErrorNodeTypeChanged => Self::NodeTypeChanged,
            R::cudaGraphExecUpdateErrorFunctionChanged => Self::FunctionChanged,
            R::cudaGraphExecUpdateErrorParametersChanged => Self::ParametersChanged,
            R::cudaGraphExecUpdateErrorNotSupported => Self::NotSupported,
            R::cudaGraphExecUpdateErrorUnsupportedFunctionChange => Self::UnsupportedFunctionChange,
            R::cudaGraphExecUpdateErrorAttributesChanged => Self::AttributesChanged,
            other => Self::Other(other.0),
        }
    }
}

/// An executable graph (`cudaGraphExec_t`), destroyed on drop. What the captured work borrows
/// stays borrowed for `'env`, as long as this value lives.
///
/// No launch is pending when this value is dropped or forgotten and the borrows end:
///
/// - [`GraphExec::launch`] waits for its stream before it returns, [`GraphExec::run`] after the
///   closure that queues any number of launches (the CPU prepares the next launch while the GPU
///   runs).
/// - [`GraphExec::launches_in`] queues launches in a [`StreamScope`] without a wait of their own:
///   the executable graph stays borrowed until the scope's end, which waits. In
///   [`Stream::queue`] and [`Pending::then`] that end is the [`Pending`]'s completion, so an
///   executable graph that owns everything it uses (`GraphExec<'static>`) is launched without a
///   host wait: [`GraphExec::launch_pending`] moves it into a `Pending` that gives it back once
///   its launches have completed. Dropping the `Pending` waits; forgetting it leaks the graph and
///   its memory.
///
/// A graph that borrows (`'env` shorter than `'static`) cannot go into a `Pending`: forgetting
/// the `Pending` would end the borrows while the launch runs.
///
/// ```compile_fail,E0597
/// # use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, Stream};
/// let stream: &'static Stream = Box::leak(Box::new(Stream::non_blocking().unwrap()));
/// let mut buffer = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let mut view = buffer.as_mut_slice();
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.set_bytes(&mut view, 1)).unwrap();
/// let exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// let pending = exec.launch_pending(stream).unwrap(); // error: `buffer` does not live long enough
/// # pending.wait().unwrap();
/// ```
///
/// ```compile_fail,E0597
/// # use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, Stream};
/// let stream: &'static Stream = Box::leak(Box::new(Stream::non_blocking().unwrap()));
/// let mut buffer = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let mut view = buffer.as_mut_slice();
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.set_bytes(&mut view, 1)).unwrap();
/// let exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// // error: `buffer` does not live long enough (`queue` takes `'static` values)
/// let pending = stream.queue(exec, |s, exec| exec.launches_in(s)?.launch()).unwrap();
/// # pending.wait().unwrap();
/// ```
///
/// Nor can an executable graph be reached while launches queued in a scope may run:
///
/// ```compile_fail,E0502
/// # use cuda_mem::{CaptureMode, GraphFlags, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let (graph, key) = stream
///     .capture_with(CaptureMode::ThreadLocal, |s| {
///         let (mut out, key) = s.output::<u32>(16)?;
///         s.set_bytes(&mut out, 1)?;
///         Ok(key)
///     })
///     .unwrap();
/// let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// stream.try_scope(|s| {
///     exec.launches_in(s)?.launch()?;
///     let view = exec.output(&key)?; // error: `exec` is borrowed until the scope's end
///     Ok(())
/// }).unwrap();
/// ```
///
/// Buffers the graph uses can be neither dropped nor mutated while it lives:
///
/// ```compile_fail,E0505
/// # use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let mut buffer = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let mut view = buffer.as_mut_slice();
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.set_bytes(&mut view, 1)).unwrap();
/// let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// drop(buffer); // error: cannot move out of `buffer` because it is borrowed
/// exec.launch(&stream).unwrap();
/// ```
///
/// ```compile_fail,E0502
/// # use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let weights = DeviceBuffer::from_slice(&[1u32; 16]).unwrap();
/// let mut host = vec![0u32; 16];
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.copy_to_host(&mut host, weights.as_slice())).unwrap();
/// let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// println!("{}", host[0]); // error: `host` is borrowed mutably by the graph
/// exec.launch(&stream).unwrap();
/// ```
///
/// ```compile_fail,E0506
/// # use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let mut buffer = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let host = vec![5u32; 16];
/// let mut view = buffer.as_mut_slice();
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.copy_from_host(&mut view, &host)).unwrap();
/// let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// buffer = DeviceBuffer::zeroed(16).unwrap(); // error: `buffer` is assigned while borrowed
/// exec.launch(&stream).unwrap();
/// # drop(buffer);
/// ```
///
/// Host memory a graph reads is borrowed too, so it cannot change under a launch:
///
/// ```compile_fail,E0502
/// # use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let mut buffer = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let mut host = vec![5u32; 16];
/// let mut view = buffer.as_mut_slice();
/// let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.copy_from_host(&mut view, &host)).unwrap();
/// let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// host[0] = 6; // error: `host` is borrowed by the graph
/// exec.launch(&stream).unwrap();
/// ```
///
/// Host memory lent through a slot is reached only through the executable graph, which takes
/// `&mut self` to launch:
///
/// ```compile_fail,E0502
/// # use cuda_mem::{CaptureMode, DeviceBuffer, GraphFlags, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let weights = DeviceBuffer::from_slice(&[1u32; 16]).unwrap();
/// let mut host = vec![0u32; 16];
/// let (graph, slot) = stream
///     .capture_with(CaptureMode::ThreadLocal, |s| s.copy_to_host_slot(&mut host, weights.as_slice()))
///     .unwrap();
/// let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// let out = exec.host(&slot).unwrap();
/// exec.launch(&stream).unwrap(); // error: `exec` is borrowed by `out`
/// println!("{}", out[0]);
/// ```
///
/// A graph output ([`CaptureScope::output`](crate::CaptureScope::output)) is read through a view
/// that borrows the executable graph, so the next launch, which frees and reallocates it, waits
/// for the view to end:
///
/// ```compile_fail,E0502
/// # use cuda_mem::{CaptureMode, GraphFlags, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let (graph, key) = stream
///     .capture_with(CaptureMode::ThreadLocal, |s| {
///         let (mut out, key) = s.output::<u32>(16)?;
///         s.set_bytes(&mut out, 1)?;
///         Ok(key)
///     })
///     .unwrap();
/// let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// exec.launch(&stream).unwrap();
/// let view = exec.output(&key).unwrap();
/// exec.launch(&stream).unwrap(); // error: `exec` is borrowed by `view`
/// println!("{:?}", view.to_vec());
/// ```
///
/// and so does the drop, which frees it:
///
/// ```compile_fail,E0505
/// # use cuda_mem::{CaptureMode, GraphFlags, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let (graph, key) = stream
///     .capture_with(CaptureMode::ThreadLocal, |s| {
///         let (mut out, key) = s.output::<u32>(16)?;
///         s.set_bytes(&mut out, 1)?;
///         Ok(key)
///     })
///     .unwrap();
/// let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
/// exec.launch(&stream).unwrap();
/// let view = exec.output(&key).unwrap();
/// drop(exec); // error: cannot move out of `exec` because it is borrowed
/// println!("{:?}", view.to_vec());
/// ```
#[derive(Debug)]
pub struct GraphExec<'env> {
    raw: graphs::cudaGraphExec_t,
    device: Device,
    slots: Vec<SlotRecord>,
    outputs: Outputs,
    /// The private pools of its graphs: launches take their turns, and their memory stays.
    pools: Vec<GraphPool>,
    _env: PhantomData<&'env mut ()>,
}

// SAFETY: the executable graph is used by one thread at a time (launches and updates take
// `&mut self`; graph objects are not thread-safe, moving one is); the slot records stand for
// exclusive borrows of `Send` host slices.
unsafe impl Send for GraphExec<'_> {}

impl<'env> Graph<'env> {
    /// Instantiates the graph (`cudaGraphInstantiateWithFlags`). The graph is consumed: the
    /// executable graph takes over its borrows, and the host slots it lends back are then
    /// reachable through one executable graph only. A graph with outputs
    /// ([`CaptureScope::output`](crate::CaptureScope::output)) is always instantiated with
    /// [`GraphFlags::AUTO_FREE_ON_LAUNCH`]: without it, a second launch would fail while the
    /// first launch's outputs are allocated.
    pub fn instantiate(self, flags: GraphFlags) -> Result<GraphExec<'env>> {
        let mut graph = self;
        let outputs = Outputs::new(std::mem::take(&mut graph.outputs));
        let flags = if outputs.any() { flags | GraphFlags::AUTO_FREE_ON_LAUNCH } else { flags };
        // SAFETY: the graph handle is live (owned by `graph`).
        let raw = unsafe { graphs::instantiate(graph.raw, flags.bits()) }?;
        let slots = std::mem::take(&mut graph.slots);
        let pools = std::mem::take(&mut graph.pools);
        Ok(GraphExec { raw, device: graph.device, slots, outputs, pools, _env: PhantomData })
    }
}

/// Queues launches of one executable graph on one stream: inside [`GraphExec::run`], or in a
/// scope through [`GraphExec::launches_in`].
#[derive(Debug)]
pub struct Launches<'a> {
    exec: graphs::cudaGraphExec_t,
    stream: &'a Stream,
    how: How<'a>,
}

/// What keeps launches of a [`Launches`] apart from other graphs' and their borrows alive.
#[derive(Debug)]
enum How<'a> {
    /// Inside `run`, which holds the pools' turns and waits for the stream before it returns.
    /// Set once a launch is queued: the graph's outputs are allocated from then on.
    Run { queued: &'a Cell<bool> },
    /// In a scope, whose end waits: each launch takes its pools' turns while it queues and is
    /// ordered after their last launches by events.
    Scope { pools: &'a [GraphPool], outputs: &'a Outputs },
}

impl Launches<'_> {
    /// Queues one launch (`cudaGraphLaunch`); it runs after the work queued on the stream so far
    /// and after earlier launches of the same graph. In a scope, a graph of a [`GraphPool`] is
    /// also ordered after the last launch of every graph of its pools, on any stream; its turn is
    /// taken for the call (waiting while another thread's [`GraphExec::run`] holds it).
    #[inline]
    pub fn launch(&self) -> Result<()> {
        match self.how {
            How::Run { queued } => {
                let call = self.stream.call()?;
                // SAFETY: the executable graph is live for the borrow this value holds; `run` waits
                // for the stream before that borrow, and the borrows of 'env, can end.
                unsafe { graphs::launch(self.exec, call.as_raw()) }?;
                queued.set(true);
                Ok(())
            }
            How::Scope { pools, outputs } => {
                let turns = Turns::take(pools)?;
                turns.order_after_launches(self.stream)?;
                let call = self.stream.call()?;
                // SAFETY: the executable graph is borrowed until the scope's end, which waits for
                // the stream (a `Pending`'s completion for `Stream::queue`; forgetting that leaks
                // the graph); it is ordered after the other graphs of its pools above.
                unsafe { graphs::launch(self.exec, call.as_raw()) }?;
                outputs.note_scope_launch();
                turns.fence_launch(self.stream)
            }
        }
    }

    /// The stream the launches are queued on.
    pub fn stream(&self) -> &Stream {
        self.stream
    }
}

/// Waits for the stream if `run`'s closure unwinds, so the borrows never end with a launch
/// pending.
struct SyncOnUnwind<'a>(&'a Stream);

impl Drop for SyncOnUnwind<'_> {
    fn drop(&mut self) {
        // An error here is consumed by `synchronize` (it goes through `check`).
        let _ = self.0.synchronize();
    }
}

impl<'env> GraphExec<'env> {
    /// Launches the graph once on `stream` and waits for it (`cudaGraphLaunch`,
    /// `cudaStreamSynchronize`). To launch without a host wait, see [`GraphExec::launches_in`]
    /// and [`GraphExec::launch_pending`].
    pub fn launch(&mut self, stream: &Stream) -> Result<()> {
        self.run(stream, |launches| launches.launch())
    }

    /// Runs `f`, which queues launches on `stream` through [`Launches::launch`], then waits for
    /// the stream (also if `f` panics): launches overlap with the CPU work `f` does between them.
    /// One `Result` comes back, `f`'s error first (as [`Stream::try_scope`]).
    pub fn run<T>(&mut self, stream: &Stream, f: impl FnOnce(&Launches<'_>) -> Result<T>) -> Result<T> {
        self.check_stream(stream)?;
        // Held until the launches have completed (dropped after the guard below).
        let turns = Turns::take(&self.pools)?;
        // After launches of the pools' graphs that did not wait (`launches_in`).
        turns.order_after_launches(stream)?;
        let start = self.outputs.begin_run(stream);
        let launches = Launches { exec: self.raw, stream, how: How::Run { queued: &self.outputs.queued } };
        let guard = SyncOnUnwind(stream);
        let value = f(&launches);
        std::mem::forget(guard);
        let result = merge(value, stream.synchronize());
        self.outputs.end_run(start, result.is_ok());
        result
    }

    /// Launches of the graph queued in `scope` without a wait of their own: the scope's end waits
    /// for them ([`Stream::scope`], [`Stream::try_scope`]), or, in [`Stream::queue`] and
    /// [`Pending::then`], the [`Pending`]'s completion, so that a `GraphExec<'static>` launched
    /// there never blocks the host (see [`GraphExec::launch_pending`]). The executable graph
    /// stays borrowed until the scope's end: its host slots and outputs are lent again only once
    /// every launch has completed. The scope's stream must be of the graph's device and not a
    /// capture's ([`ErrorKind::InvalidArgument`]).
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{CaptureMode, GraphFlags, Stream};
    /// let stream: &'static Stream = Box::leak(Box::new(Stream::non_blocking()?));
    /// let (graph, key) = stream.capture_with(CaptureMode::ThreadLocal, |s| {
    ///     let (mut out, key) = s.output::<u32>(1024)?; // the graph owns all it uses
    ///     s.set_bytes(&mut out, 3)?;
    ///     Ok(key)
    /// })?;
    /// let exec = graph.instantiate(GraphFlags::empty())?; // a GraphExec<'static>
    /// let pending = stream.queue(exec, |s, exec| {
    ///     let launches = exec.launches_in(s)?;
    ///     launches.launch()?;
    ///     launches.launch() // neither call waits
    /// })?;
    /// // ... the CPU prepares the next step here ...
    /// let pending = pending.then(|s, exec| exec.launches_in(s)?.launch())?; // still no wait
    /// let exec = pending.wait()?;
    /// assert_eq!(exec.output(&key)?.to_vec()?, vec![0x0303_0303; 1024]);
    /// # Ok(()) }
    /// ```
    pub fn launches_in<'scope>(&'scope mut self, scope: &StreamScope<'scope, '_>) -> Result<Launches<'scope>> {
        let stream = scope.stream();
        // A launch recorded into another graph would run outside every turn and borrow here.
        stream.require_outside_capture("GraphExec::launches_in")?;
        self.check_stream(stream)?;
        self.outputs.begin_scope(stream);
        Ok(Launches { exec: self.raw, stream, how: How::Scope { pools: &self.pools, outputs: &self.outputs } })
    }

    /// Refuses a stream of another device than the graph's.
    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.device() != self.device {
            let kind = ErrorKind::InvalidArgument("a graph is launched on a stream of the device it was captured on");
            return Err(CudaError::new(kind, format!("launching a graph of {} on {stream:?}", self.device)));
        }
        Ok(())
    }

    /// Updates the executable graph in place to `graph`'s parameters (`cudaGraphExecUpdate`):
    /// same topology, new addresses or kernel arguments. The executable graph keeps the borrows
    /// of both graphs, and `graph`'s host slots become reachable through it. A refusal is
    /// [`ErrorKind::GraphUpdateRefused`] with the runtime's reason, and leaves the executable
    /// graph as it was. A graph with outputs ([`CaptureScope::output`](crate::CaptureScope::output))
    /// is refused with [`ErrorKind::InvalidArgument`].
    pub fn update(&mut self, graph: Graph<'env>) -> Result<()> {
        if !graph.outputs.is_empty() {
            // Their allocations would need the auto-free flag and bookkeeping this value lacks.
            let kind = ErrorKind::InvalidArgument("an executable graph is not updated to a graph with outputs");
            return Err(CudaError::new(kind, "GraphExec::update"));
        }
        // SAFETY: both handles are live; `&mut self` excludes a concurrent launch, and no launch
        // is pending (`launch` and `run` wait before they return; launches in a scope borrow or
        // own `self` until they have completed).
        let (status, result) = unsafe { graphs::exec_update(self.raw, graph.raw) };
        if result != graphs::cudaGraphExecUpdateResult::cudaGraphExecUpdateSuccess {
            let kind = ErrorKind::GraphUpdateRefused(UpdateRefusal::from_raw(result));
            let err = CudaError::new(kind, "cudaGraphExecUpdate");
            return Err(match status {
                Err(status) if status.code() != Some(crate::ErrorCode::GRAPH_EXEC_UPDATE_FAILURE) => {
                    err.with_later(status)
                }
                _ => err,
            });
        }
        status?;
        let mut graph = graph;
        self.slots.append(&mut graph.slots);
        merge_pools(&mut self.pools, std::mem::take(&mut graph.pools));
        Ok(())
    }

    /// The host slice behind `slot`, as the last launch left it.
    pub fn host<T: Pod>(&self, slot: &HostSlot<T>) -> Result<&[T]> {
        let (ptr, len) = SlotRecord::find(&self.slots, slot)?;
        // SAFETY: the record stands for an exclusive borrow of `len` elements of T for 'env,
        // which `self` holds; no launch is pending (as in `update`) and none can start while this
        // shared borrow of `self` lives.
        Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// The host slice behind `slot`, to fill before the next launch.
    pub fn host_mut<T: Pod>(&mut self, slot: &HostSlot<T>) -> Result<&mut [T]> {
        let (ptr, len) = SlotRecord::find(&self.slots, slot)?;
        // SAFETY: as in `host`; `&mut self` makes this the only reference to the slice.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// A view of `key`'s graph output as the last launch left it. It borrows `self`, so no
    /// launch, which would free and reallocate the output, can start while it lives. Before the
    /// first launch, and after a `launch` or `run` that failed or panicked, the output is refused
    /// ([`ErrorKind::InvalidArgument`]).
    pub fn output<T: Pod>(&self, key: &GraphOutput<T>) -> Result<DeviceSlice<'_, T>> {
        let (ptr, len) = self.outputs.find(key)?;
        // SAFETY: the last launch allocated `len` elements of T at `ptr` and has completed (as in
        // `update`); they stay allocated until the next launch or the drop, neither
        // of which can happen while this borrow of `self` lives, and no other path writes them.
        Ok(unsafe { DeviceSlice::from_raw_parts(ptr, len) })
    }

    /// [`GraphExec::output`] to write, say to hand the result on in place.
    pub fn output_mut<T: Pod>(&mut self, key: &GraphOutput<T>) -> Result<DeviceSliceMut<'_, T>> {
        let (ptr, len) = self.outputs.find(key)?;
        // SAFETY: as in `output`; `&mut self` makes this the only view of the output.
        Ok(unsafe { DeviceSliceMut::from_raw_parts(ptr, len) })
    }

    /// The device the graph was captured on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The raw handle, valid while `self` lives, for other CUDA code (whose launches of it are
    /// that code's to order before the borrows end, and, for a graph of a
    /// [`GraphPool`], apart from the pool's other graphs).
    pub fn as_raw(&self) -> graphs::cudaGraphExec_t {
        self.raw
    }
}

impl GraphExec<'static> {
    /// Queues one launch on `stream` and returns at once with a [`Pending`] that owns the
    /// executable graph until the launch has completed: `wait`, `try_take` or `.await` give it
    /// back, and [`Pending::then`] with [`GraphExec::launches_in`] queues more launches without a
    /// wait. Only a graph that owns everything it uses can be moved in (`'static`: captured on a
    /// `'static` stream from graph memory, pools and `'static` data), as forgetting the `Pending`
    /// must leak what the launch uses. Dropping the `Pending` waits for the launch.
    ///
    /// If the launch fails, the stream is waited for, the executable graph dropped and the error
    /// returned (as [`Stream::queue`]).
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{CaptureMode, GraphFlags, Stream};
    /// let stream: &'static Stream = Box::leak(Box::new(Stream::non_blocking()?));
    /// let (graph, key) = stream.capture_with(CaptureMode::ThreadLocal, |s| {
    ///     let (mut out, key) = s.output::<u8>(256)?;
    ///     s.set_bytes(&mut out, 7)?;
    ///     Ok(key)
    /// })?;
    /// let exec = graph.instantiate(GraphFlags::empty())?;
    /// let pending = exec.launch_pending(stream)?; // returns without waiting for the GPU
    /// let exec = pending.wait()?;
    /// assert_eq!(exec.output(&key)?.to_vec()?, vec![7; 256]);
    /// # Ok(()) }
    /// ```
    pub fn launch_pending(self, stream: &Stream) -> Result<Pending<Self>> {
        stream.queue(self, |s, exec| exec.launches_in(s)?.launch())
    }
}

impl Drop for GraphExec<'_> {
    fn drop(&mut self) {
        // Graph memory the last launch left allocated stays allocated after the executable graph
        // is destroyed until something frees it.
        self.outputs.free_outstanding();
        // SAFETY: we own the handle; no launch is pending (as in `update`: a scope or `Pending`
        // that launched holds `self` until its launches complete, and a forgotten `Pending`
        // never drops it), and a launch still running would be completed before the runtime
        // frees the graph. The pools (fields) are dropped after this, with nothing running.
        raw::quiet(unsafe { graphs::exec_destroy(self.raw) });
    }
}
