//! Memory resources: one allocation interface over every family, and adaptors that compose
//! (statistics, tracking with leak reports, limits and logging), after RAPIDS RMM's
//! `device_memory_resource` and PyTorch's allocator statistics. Memory snapshots in PyTorch's
//! format are the `cuda-mem-snapshot` crate's, through [`TrackingObserver`]; the logs
//! [`LoggingResource`] writes are read and replayed outside the library (`cuda-mem-workloads`'s
//! `log`, `cuda-mem-bench`'s `replay`).
//!
//! A [`MemoryResource`] allocates and frees raw bytes with a stream: stream-ordered where the
//! backing API is (pools), synchronous otherwise. [`ResourceBuffer`] is the typed, owning buffer
//! that frees through the resource that allocated it. Adaptors wrap any resource, including
//! another adaptor: `LimitingResource::new(StatisticsResource::new(PoolResource::new(pool)), cap)`.

/// The metadata methods of an adaptor, forwarded to its `inner` resource.
macro_rules! forward_metadata {
    () => {
        fn kind(&self) -> $crate::resource::MemoryKind {
            self.inner.kind()
        }
        fn device(&self) -> Option<$crate::Device> {
            self.inner.device()
        }
        fn pool_stats(&self) -> Option<$crate::PoolStats> {
            self.inner.pool_stats()
        }
    };
}

mod buffer;
mod defaults;
mod limiting;
mod logging;
mod outstanding;
mod sources;
mod statistics;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod testing;
mod threads;
mod tracking;

pub use buffer::{ResourceBuffer, ResourceHostBuffer};
pub use defaults::{default_resource, set_default_resource};
pub use limiting::LimitingResource;
pub use logging::{LogFormat, LoggingResource};
pub use sources::{DeviceResource, ManagedResource, PinnedPoolResource, PinnedResource, PoolResource};
pub use statistics::{ResourceStats, StatisticsResource};
pub use tracking::{AllocationRecord, DEFAULT_TRACKING_SLOTS, MAX_TRACKING_SLOTS, TrackingObserver, TrackingResource};

use crate::device::Device;
use crate::error::Result;
use crate::pool_stats::PoolStats;
pub use crate::stream::StreamRef;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// What kind of memory a resource hands out, which decides how it may be accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Device memory: device views only.
    Device,
    /// Managed memory: device views and host access.
    Managed,
    /// Page-locked host memory: host access.
    PinnedHost,
}

/// An allocator of raw bytes, stream-ordered where its backing API is.
///
/// # Safety
/// [`ResourceBuffer`] writes and hands out host slices and device views over what `allocate`
/// returns, trusting it. An implementation must guarantee:
/// - `allocate(bytes, stream)` returns, on success, memory of at least `bytes` bytes, aligned to
///   at least 256 bytes, that no one else uses until it is passed to `deallocate`; it is usable
///   by work queued on `stream` (and by the host after `stream` is synchronized);
/// - the memory is what [`kind`](MemoryResource::kind) says, and `kind` returns the same value
///   for the resource's whole life: device-accessible (on [`device`](MemoryResource::device)) for
///   `Device` and `Managed`, host-accessible (readable and writable through ordinary pointers)
///   for `PinnedHost` and `Managed`;
/// - `deallocate` frees only what it is given and never touches other memory.
///
/// Wrapping another resource and forwarding to it (as the adaptors do) keeps these guarantees.
///
/// A resource written without `unsafe impl` does not compile:
///
/// ```compile_fail,E0200
/// use cuda_mem::resource::{MemoryKind, MemoryResource, StreamRef};
/// use std::ptr::NonNull;
/// #[derive(Debug)]
/// struct Forged;
/// impl MemoryResource for Forged { // error: the trait requires an `unsafe impl`
///     fn allocate(&self, _: usize, _: StreamRef<'_>) -> cuda_mem::Result<NonNull<u8>> {
///         static BYTE: u8 = 0;
///         Ok(NonNull::from(&BYTE)) // read-only memory, handed out as writable
///     }
///     unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: StreamRef<'_>) {}
///     fn kind(&self) -> MemoryKind {
///         MemoryKind::PinnedHost
///     }
/// }
/// ```
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::resource::{MemoryResource, PoolResource, ResourceBuffer, StatisticsResource};
/// use cuda_mem::{Device, MemPool, Stream};
/// use std::sync::Arc;
/// let stats = Arc::new(StatisticsResource::new(PoolResource::new(MemPool::retaining(Device::current()?)?)));
/// let stream = Stream::non_blocking()?;
/// let buffer = ResourceBuffer::<f32>::zeroed(stats.clone(), &stream, 1 << 20)?;
/// assert_eq!(stats.stats().current_bytes, 4 << 20);
/// drop(buffer); // freed through the resource, on `stream`
/// # Ok(()) }
/// ```
pub unsafe trait MemoryResource: Send + Sync + fmt::Debug {
    /// Allocates `bytes` (> 0) ordered on `stream`.
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>>;

    /// Frees memory from [`MemoryResource::allocate`], ordered on `stream`.
    ///
    /// # Safety
    /// `ptr` came from this resource's `allocate` with the same `bytes`, is freed once, and no
    /// work uses it after the work already queued on `stream` (synchronous resources wait for
    /// `stream` themselves). `stream` is not being captured: resources may record events on it
    /// to order a reuse, and an event recorded in a capture marks no work.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>);

    /// What the memory is.
    fn kind(&self) -> MemoryKind;

    /// The device the memory belongs to, if any.
    fn device(&self) -> Option<Device> {
        None
    }

    /// The backing pool's figures, for resources backed by a [`MemPool`](crate::MemPool) or a
    /// [`DeviceCache`](crate::DeviceCache).
    fn pool_stats(&self) -> Option<PoolStats> {
        None
    }
}

/// Smart pointers to resources are resources, so stacks can hold `Arc<dyn MemoryResource>`.
macro_rules! forward_resource {
    ($pointer:ident) => {
        // SAFETY: every method forwards to the pointee, which upholds the contract.
        unsafe impl<R: MemoryResource + ?Sized> MemoryResource for $pointer<R> {
            fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
                (**self).allocate(bytes, stream)
            }
            unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
                // SAFETY: forwarded; the caller upholds the contract for the inner resource.
                unsafe { (**self).deallocate(ptr, bytes, stream) }
            }
            fn kind(&self) -> MemoryKind {
                (**self).kind()
            }
            fn device(&self) -> Option<Device> {
                (**self).device()
            }
            fn pool_stats(&self) -> Option<PoolStats> {
                (**self).pool_stats()
            }
        }
    };
}

forward_resource!(Arc);
forward_resource!(Box);
