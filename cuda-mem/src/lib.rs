//! # cuda-mem
//!
//! Safe, zero-overhead Rust over every CUDA memory-allocation family:
//!
//! | family | type | freed with |
//! |---|---|---|
//! | `cudaMalloc` (device) | [`DeviceBuffer`] | `cudaFree` |
//! | `cudaMallocHost` / `cudaHostAlloc` (pinned; portable, mapped, write-combined) | [`PinnedBuffer`] | `cudaFreeHost` |
//! | `cudaHostRegister` (pin existing memory) | [`RegisteredHost`] | `cudaHostUnregister` |
//! | `cudaMallocManaged` (unified; advise, prefetch) | [`ManagedBuffer`] | `cudaFree` |
//! | `cudaMallocAsync` / `cudaMallocFromPoolAsync` (stream-ordered, [`MemPool`]) | [`StreamBuffer`] | `cudaFreeAsync` |
//!
//! Views ([`DeviceSlice`], [`DeviceSliceMut`]) borrow from their owner, so they cannot outlive it.
//!
//! ## Which owner, which pool
//!
//! | memory | owner | from | use it for |
//! |---|---|---|---|
//! | device | [`DeviceBuffer`] | `cudaMalloc` | data that lives long: weights, KV caches, tables; allocate once |
//! | device | [`StreamBuffer`] | a [`MemPool`] (`cudaMallocFromPoolAsync`) | per-step temporaries freed in stream order; memory the driver may take back ([`MemPool::trim_to`]) or another process may import |
//! | device | [`CachedBuffer`] | a [`DeviceCache`] | per-step temporaries on a hot path, many threads: a free is reused at once by its stream, without a CUDA call |
//! | device | [`resource::ResourceBuffer`] | any [`resource::MemoryResource`] | code written against one interface, with statistics, limits, tracking or logging stacked on the source |
//! | device | [`GraphOutput`] | graph memory a captured graph leaves allocated ([`CaptureScope::output`]) | what a graph produces, read between its launches ([`GraphExec::output`]) |
//! | device | [`ImportedSlice`], [`IpcMapping`] | another process's pool or `cudaIpc*` handle | memory a producer process shares |
//! | unified | [`ManagedBuffer`] | `cudaMallocManaged` | prototypes, data larger than the GPU, CPU and GPU both touching it (prefetch it) |
//! | pinned host | [`PinnedBuffer`] | `cudaMallocHost` / `cudaHostAlloc` | the host side of asynchronous copies; mapped for kernels reading host memory |
//! | pinned host | [`PooledPinned`] | a [`PinnedPool`] | per-batch staging buffers: a hit costs no CUDA call |
//! | pinned host | [`RegisteredHost`] | `cudaHostRegister` | an existing allocation copied many times; register it once |
//! | pinned host | [`resource::ResourceHostBuffer`] | a pinned [`resource::MemoryResource`] | host memory behind the same interface and adaptors as `ResourceBuffer` |
//!
//! Pageable `Vec`s reach the GPU fastest through [`StagedCopier`]. `docs/choosing-an-allocator.md`
//! gives the figures behind each choice.
//!
//! Every device owner has one shape, the [`DeviceMemory`] trait (implemented by each; the
//! methods work without it in scope): `device`, `len`, and the views `as_slice` /
//! `as_mut_slice`, which cannot fail. [`Pending`], DLPack exports and NCCL registration take any
//! `DeviceMemory` that is `Send + 'static`. The three stream-ordered owners share
//! [`StreamOrdered`] too: `stream`, `use_on` for another stream's work, `free_on` / `free`. They
//! stay three types, rather than one buffer over any resource as in RMM, because the interface of
//! [`resource::MemoryResource`] frees by address on a stream it cannot keep alive: a
//! [`ResourceBuffer`](resource::ResourceBuffer) over a [`DeviceCache`] pays a lookup and two
//! events per pair, where a [`CachedBuffer`] keeps its block and its stream and frees into the
//! thread's cache without either; a [`StreamBuffer`] needs no resource object at all. Use
//! `ResourceBuffer` where adaptors or one interface matter more than that cost.
//!
//! ## The unsafe contract
//! Safe code cannot free memory that queued GPU work still uses, nor touch host memory a pending
//! copy reads or writes: asynchronous work that borrows memory goes through
//! [`Stream::scope`] / [`Stream::try_scope`], which synchronize the stream before the borrows end
//! (like `std::thread::scope`). Blocking operations (`copy_from_host`, `set_bytes`, ...) return
//! after the work is done. `cudaFree` waits for the device, so dropping device memory is always
//! safe. Element types are [`bytemuck::Pod`]: any bit pattern a DMA or memset writes is a valid
//! value.
//!
//! ## Asynchronous work on owned buffers
//! Work that should outlive the call (so the CPU prepares step k+1 while step k runs) takes its
//! buffers by value and returns a [`Pending`] at once: [`Stream::upload`], [`Stream::download`],
//! [`Stream::queue`] (any copies and kernels), [`Pending::then`] (more work, no wait),
//! [`Pending::join`], and the staged copies [`StagedCopier::copy_from_host_on`] /
//! [`StagedCopier::copy_to_host_on`]. The `Pending` owns every buffer its work touches until the
//! work has completed, then hands them back through [`Pending::wait`], [`Pending::try_take`] or
//! `.await`. Dropping it waits for the work; `mem::forget` leaks the buffers, never frees them.
//!
//! [`Pending`], [`Stream::synchronize_async`] and [`Event::wait_async`] are futures woken by the
//! GPU through `cudaLaunchHostFunc`, for any executor (cuda-mem depends on none). The wake comes
//! from a CUDA thread, where no CUDA call is allowed: a waker must schedule its task, never poll
//! it inline.
//!
//! ## Errors
//! Every fallible call returns [`CudaError`], which says what was attempted and why it failed
//! (including the runtime's code, name and message; out-of-memory errors carry the device's free
//! and total memory). Zero-length buffers make no CUDA call. Sticky errors are recognisable with
//! [`CudaError::is_sticky`].
//!
//! ```no_run
//! # fn main() -> Result<(), cuda_mem::CudaError> {
//! use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream};
//! let stream = Stream::non_blocking()?;
//! let mut input = PinnedBuffer::<f32>::zeroed(1 << 20)?;
//! input.fill(2.0);
//! let mut device = DeviceBuffer::<f32>::zeroed(input.len())?;
//! let mut output = PinnedBuffer::<f32>::zeroed(input.len())?;
//! let mut dev = device.as_mut_slice();
//! stream.try_scope(|s| {
//!     s.copy_from_host(&mut dev, &input)?;
//!     s.copy_to_host(&mut output, &dev)
//! })?;
//! assert_eq!(output[0], 2.0);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

// The modules in layers, lowest first: a module uses only modules of its own layer or of a lower
// one (`cargo xtask tidy` checks it against the imports).

// # Layer 1: foundations (the runtime's calls, errors, and the small types every layer shares)
#[macro_use]
mod owner_macros;
mod error;
mod maybe_owned;
mod pool_stats;
mod raw;

// # Layer 2: handles (devices, streams and pools: what memory is allocated from and ordered on)
mod device;
mod pool;
mod stream;
mod watcher;

// # Layer 3: views (borrowed device memory, scopes, and the traits every owner implements)
mod memory;
mod scope;
mod slice;

// # Layer 4: owners (one module per allocation family)
mod device_buffer;
mod device_cache;
mod ipc;
mod managed;
mod peer;
mod pinned;
mod pinned_pool;
mod registered;
mod stream_buffer;

// # Layer 5: work on owners (asynchronous work, staged copies, resources, exchange, graphs)
#[cfg(feature = "dlpack")]
pub mod dlpack;
mod graph;
mod pending;
pub mod resource;
pub(crate) mod staged;

// # Layer 6: testing (fakes for the users' tests)
#[cfg(feature = "testing")]
pub mod testing;

pub use bytemuck::{Pod, Zeroable};
pub use caching::Keep;
pub use caching::{CachingStats, CurrentPeak};
/// The CUDA-free core of the caching allocators (the `cuda-mem-cache` crate): [`DeviceCache`]
/// runs its [`CachingAllocator`](caching::CachingAllocator) over the runtime.
pub use cuda_mem_cache as caching;
pub use cuda_mem_sys as sys;
pub use device::{Device, DeviceAttribute, driver_version, runtime_version};
pub use device_buffer::DeviceBuffer;
pub use device_cache::{CachedBuffer, CudaSegments, DeviceCache, SleepError, SleepingCache};
pub use error::{CudaError, ErrorCode, ErrorKind, NO_DRIVER_MESSAGE, OomReport, Result, UpdateRefusal};
pub use graph::{
    CaptureMode, CaptureScope, Graph, GraphExec, GraphFlags, GraphMemStats, GraphOutput, GraphPool, HostSlot, Launches,
};
pub use ipc::{EXPORT_BYTES, Exportable, Exported, ImportedSlice, IpcMapping, IpcMemHandle, PoolPointerExport};
#[allow(deprecated)]
pub use ipc::{ExportedDeviceBuffer, ExportedStreamBuffer};
pub use managed::{Advice, Attach, Location, ManagedBuffer};
pub use maybe_owned::MaybeOwned;
pub use memory::{DeviceMemory, HostMemory, StreamOrdered};
pub use peer::PoolAccess;
#[allow(deprecated)]
pub use pending::owned::{OwnedDevice, OwnedHost};
pub use pending::{Pending, WakeUp};
pub use pinned::PinnedBuffer;
pub use pinned_pool::{PinnedPool, PinnedPoolStats, PooledPinned};
pub use pool::{MemPool, PoolProps, ReusePolicy, ShareableHandle};
pub use pool_stats::PoolStats;
pub use raw::host_flags::{HostAllocFlags, HostRegisterFlags};
pub use registered::{RegisteredHost, UnregisterError};
pub use scope::StreamScope;
pub use slice::{DeviceSlice, DeviceSliceMut, DeviceSource};
pub use staged::{MAX_LANES, StagedConfig, StagedCopier};
pub use stream::{Completion, Event, Stream};
pub use stream_buffer::StreamBuffer;

/// For crates that launch their own kernels on cuda-mem's memory and streams (as
/// `cuda-mem-kernels` and `cuda-mem-nccl` do): the one path from a runtime status to
/// [`CudaError`], the guard that makes a stream's device current while a launch is queued, the
/// length check that fails before anything is queued, and the runtime's handle types.
///
/// A launcher makes the stream's device current, takes the raw handle of a stream it borrows
/// within a [`StreamScope`] (so the memory the kernel touches stays borrowed until the stream has
/// finished with it), queues the kernel, and turns its status into a [`Result`]:
///
/// ```no_run
/// use cuda_mem::launch::{CurrentDevice, check, cudaError_t, cudaStream_t, same_len};
/// use cuda_mem::{DeviceSliceMut, DeviceSource, Result, StreamScope};
///
/// // What a `.cu` file's host wrapper looks like from Rust (it returns `cudaGetLastError()`).
/// type Axpy = unsafe extern "C" fn(*mut f32, *const f32, usize, f32, cudaStream_t) -> cudaError_t;
///
/// fn axpy<'s>(
///     scope: &StreamScope<'s, '_>,
///     kernel: Axpy,
///     y: &mut DeviceSliceMut<'s, f32>,
///     x: impl DeviceSource<'s, f32>,
///     a: f32,
/// ) -> Result<()> {
///     let (x, n) = scope.device_ptr(x)?;
///     same_len(n, y.len(), "axpy")?; // a typed error, nothing queued
///     let stream = scope.stream();
///     let _device = CurrentDevice::set(stream.device())?;
///     let y = scope.device_ptr_mut(y)?;
///     // SAFETY: both views hold `n` f32 lent to the scope, whose end waits for the stream.
///     check(unsafe { kernel(y, x, n, a, stream.checked_raw()?) }, || "axpy".into())
/// }
/// ```
pub mod launch {
    pub use crate::device::CurrentDevice;
    pub use crate::raw::{check, cudaError_t, cudaStream_t, last_error, same_len};
}

/// Compile-time proof of the Send/Sync claims made by each `unsafe impl`.
#[cfg(test)]
mod auto_traits {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn owners_views_and_handles_are_send_and_sync() {
        send_sync::<DeviceBuffer<f32>>();
        send_sync::<PinnedBuffer<u8>>();
        send_sync::<ManagedBuffer<u64>>();
        send_sync::<RegisteredHost<'static, u32>>();
        send_sync::<DeviceSlice<'static, f32>>();
        send_sync::<DeviceSliceMut<'static, f32>>();
        send_sync::<Stream>();
        send_sync::<StreamBuffer<u16>>();
        send_sync::<MemPool>();
        send_sync::<PinnedPool>();
        send_sync::<resource::ResourceBuffer<f64>>();
        send_sync::<resource::ResourceHostBuffer<f64>>();
        send_sync::<resource::StreamRef<'static>>();
        send_sync::<resource::PoolResource>();
        send_sync::<resource::PinnedPoolResource>();
        send_sync::<resource::LimitingResource<resource::DeviceResource>>();
        send_sync::<PooledPinned<u8>>();
        send_sync::<Event>();
        send_sync::<CudaError>();
        send_sync::<Completion>();
    }

    fn send<T: Send>() {}

    fn owned_by_a_pending<T: Pod, D: DeviceMemory<Elem = T> + Send + 'static>() {}

    /// Every device owner that owns its memory can be lent to the GPU by a `Pending` (a compile
    /// check: the calls name the types).
    #[test]
    fn every_owning_device_buffer_can_be_owned_by_a_pending() {
        owned_by_a_pending::<f32, DeviceBuffer<f32>>();
        owned_by_a_pending::<f32, ManagedBuffer<f32>>();
        owned_by_a_pending::<f32, StreamBuffer<'static, f32>>();
        owned_by_a_pending::<f32, CachedBuffer<'static, f32>>();
        owned_by_a_pending::<f32, resource::ResourceBuffer<'static, f32>>();
        owned_by_a_pending::<f32, IpcMapping<f32>>();
        owned_by_a_pending::<f32, ImportedSlice<'static, f32>>();
    }

    #[allow(deprecated)]
    fn named_before_2026_12_07<T: Pod, D: OwnedDevice<T>, H: OwnedHost<T>>() {}

    /// The traits' names before 2026-12-07 stay one release, deprecated, and every buffer a
    /// `Pending` takes still meets them (a compile check).
    #[test]
    fn the_pending_traits_old_names_still_take_every_owner() {
        named_before_2026_12_07::<f32, DeviceBuffer<f32>, Vec<f32>>();
        named_before_2026_12_07::<f32, CachedBuffer<'static, f32>, PinnedBuffer<f32>>();
        named_before_2026_12_07::<f32, resource::ResourceBuffer<'static, f32>, PooledPinned<f32>>();
    }

    #[cfg(feature = "dlpack")]
    fn owned_by_an_export<O: dlpack::DlpackOwner>() {}

    /// Likewise for owned DLPack exports, host memory included.
    #[cfg(feature = "dlpack")]
    #[test]
    fn every_owning_buffer_can_be_owned_by_a_dlpack_export() {
        owned_by_an_export::<DeviceBuffer<f32>>();
        owned_by_an_export::<ManagedBuffer<f32>>();
        owned_by_an_export::<PinnedBuffer<f32>>();
        owned_by_an_export::<StreamBuffer<'static, f32>>();
        owned_by_an_export::<CachedBuffer<'static, f32>>();
        owned_by_an_export::<resource::ResourceBuffer<'static, f32>>();
        owned_by_an_export::<resource::ResourceHostBuffer<'static, f32>>();
        owned_by_an_export::<IpcMapping<f32>>();
        owned_by_an_export::<ImportedSlice<'static, f32>>();
    }

    #[test]
    fn pending_work_moves_between_threads_with_its_buffers() {
        send::<Pending<(StreamBuffer<'static, f32>, PinnedBuffer<f32>)>>();
        send::<Pending<(DeviceBuffer<u8>, Vec<u8>)>>();
    }
}

/// The README's Rust examples, compiled as doc tests so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The Chinese README's Rust examples, compiled as doc tests too.
#[cfg(doctest)]
#[doc = include_str!("../../README.zh-CN.md")]
pub struct ReadmeZhDoctests;
