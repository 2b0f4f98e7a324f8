//! The resources at the bottom of a stack: one per allocation family.

use super::{MemoryKind, MemoryResource, StreamRef};
use crate::device::{CurrentDevice, Device};
use crate::device_cache::DeviceCache;
use crate::error::{CudaError, ErrorKind, Result};
use crate::pinned_pool::PinnedPool;
use crate::pool::MemPool;
use crate::pool_stats::PoolStats;
use crate::raw;
use crate::raw::host_flags::HostAllocFlags;
use crate::stream::Event;
use std::ffi::c_void;
use std::ptr::NonNull;

/// Refuses a request of 0 bytes, which the runtime would answer with a null pointer.
fn nonzero(bytes: usize, operation: &'static str) -> Result<()> {
    if bytes == 0 {
        return Err(CudaError::new(ErrorKind::InvalidArgument("a resource allocation of 0 bytes"), operation));
    }
    Ok(())
}

fn non_null(raw: *mut c_void) -> NonNull<u8> {
    NonNull::new(raw.cast()).expect("the runtime reported success with a null pointer")
}

/// Waits for `stream`: synchronous frees must not overtake work queued on it.
fn wait_for(stream: StreamRef<'_>) {
    // SAFETY: the caller of `deallocate` keeps the stream handle valid.
    raw::quiet(unsafe { raw::streams::synchronize(stream.as_raw(), || "cudaStreamSynchronize".into()) });
}

/// A resource over one device's `cudaFree`-released family: synchronous frees (`cudaFree` waits
/// for the device, so queued work that uses the memory has finished first).
macro_rules! device_family_resource {
    ($(#[$doc:meta])* $name:ident, $kind:ident, $new_doc:literal, |$bytes:ident, $ordinal:ident| $alloc:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            device: Device,
        }

        impl $name {
            #[doc = $new_doc]
            pub fn new(device: Device) -> Self {
                Self { device }
            }
        }

        // SAFETY: the contract on `MemoryResource` holds: memory of the family below (at least
        // 256-byte aligned) counted against `device`, freed only by `deallocate`; the kind never
        // changes.
        unsafe impl MemoryResource for $name {
            fn allocate(&self, $bytes: usize, _stream: StreamRef<'_>) -> Result<NonNull<u8>> {
                nonzero($bytes, concat!(stringify!($name), "::allocate"))?;
                let _guard = CurrentDevice::set(self.device)?;
                let $ordinal = self.device.as_raw();
                $alloc.map(non_null)
            }

            unsafe fn deallocate(&self, ptr: NonNull<u8>, _bytes: usize, _stream: StreamRef<'_>) {
                let _guard = CurrentDevice::set(self.device);
                // SAFETY: from `allocate` (the caller's contract), freed once; cudaFree waits for
                // the device, so queued work that uses it has finished.
                raw::quiet(unsafe { raw::memory::free(ptr.as_ptr().cast(), || stringify!($name).into()) });
            }

            fn kind(&self) -> MemoryKind {
                MemoryKind::$kind
            }

            fn device(&self) -> Option<Device> {
                Some(self.device)
            }
        }
    };
}

device_family_resource!(
    /// `cudaMalloc` / `cudaFree` on one device. Frees are synchronous (`cudaFree` waits for the
    /// device).
    DeviceResource,
    Device,
    "A resource allocating on `device`.",
    |bytes, ordinal| raw::memory::malloc(bytes, ordinal)
);

device_family_resource!(
    /// `cudaMallocManaged` (attached globally) / `cudaFree`.
    ManagedResource,
    Managed,
    "A resource of managed memory, counted against `device`.",
    |bytes, ordinal| raw::managed::alloc(bytes, true, ordinal)
);

/// A resource that allocates from a pool it holds: the struct, `new` and `pool`.
macro_rules! pool_resource {
    ($(#[$doc:meta])* $name:ident($pool:ty), $new_doc:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            pool: $pool,
        }

        impl $name {
            #[doc = $new_doc]
            pub fn new(pool: $pool) -> Self {
                Self { pool }
            }

            /// The pool.
            pub fn pool(&self) -> &$pool {
                &self.pool
            }
        }
    };
}

pool_resource!(
    /// Stream-ordered allocation from a [`MemPool`] (`cudaMallocFromPoolAsync` / `cudaFreeAsync`).
    PoolResource(MemPool),
    "A resource over `pool` (which it keeps alive)."
);

// SAFETY: the contract on `MemoryResource` holds: pool memory of `pool.device()` (aligned by the pool), freed in stream order; kind is always Device.
unsafe impl MemoryResource for PoolResource {
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        nonzero(bytes, "PoolResource::allocate")?;
        // SAFETY: the pool handle is valid while `self` lives; the caller keeps the stream's.
        unsafe {
            raw::pools::malloc_from_pool_async(bytes, self.pool.as_raw(), stream.as_raw(), || {
                format!("on {}", self.pool.device())
            })
        }
        .map(non_null)
        .map_err(|e| e.with_pool_stats(|| self.pool.stats().ok()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        // SAFETY: from this pool (the caller's contract), freed in stream order after its uses.
        raw::quiet(unsafe { raw::pools::free_async(ptr.as_ptr().cast(), stream.as_raw(), bytes) });
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn device(&self) -> Option<Device> {
        Some(self.pool.device())
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        self.pool.stats().ok()
    }
}

/// `cudaHostAlloc(flags)` / `cudaFreeHost`, uncached. Frees wait for the stream first.
#[derive(Debug, Clone, Copy)]
pub struct PinnedResource {
    flags: HostAllocFlags,
}

impl PinnedResource {
    /// A resource of pinned host memory allocated with `flags`.
    pub fn new(flags: HostAllocFlags) -> Self {
        Self { flags }
    }
}

// SAFETY: the contract on `MemoryResource` holds: `cudaHostAlloc` memory (page-aligned, host-accessible); kind is always PinnedHost.
unsafe impl MemoryResource for PinnedResource {
    fn allocate(&self, bytes: usize, _stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        nonzero(bytes, "PinnedResource::allocate")?;
        raw::host::alloc(bytes, self.flags).map(non_null)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        wait_for(stream);
        // SAFETY: from cudaHostAlloc (the caller's contract); the stream's work is done.
        raw::quiet(unsafe { raw::host::free(ptr.as_ptr().cast(), bytes) });
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::PinnedHost
    }
}

pool_resource!(
    /// Pinned host memory from a caching [`PinnedPool`]: a freed block is reused once the work
    /// queued on the freeing stream has completed (an event records it).
    PinnedPoolResource(PinnedPool),
    "A resource over `pool`."
);

// SAFETY: the contract on `MemoryResource` holds: blocks of the pinned pool (page-aligned, host-accessible) reused only after their fence; kind is always PinnedHost.
unsafe impl MemoryResource for PinnedPoolResource {
    fn allocate(&self, bytes: usize, _stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        nonzero(bytes, "PinnedPoolResource::allocate")?;
        self.pool.take_raw(bytes)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        let fence = Event::without_timing().and_then(|event| {
            // SAFETY: the caller of `deallocate` keeps the stream handle valid.
            unsafe { raw::events::record(event.as_raw(), stream.as_raw()) }.map(|()| event)
        });
        match fence {
            // SAFETY: from `take_raw(bytes)` on this pool (the caller's contract).
            Ok(event) => unsafe { self.pool.put_raw(ptr, bytes, Some(event)) },
            Err(_) => {
                // No event: wait on the host instead, then return the block unfenced.
                wait_for(stream);
                // SAFETY: as above; the stream's work is complete.
                unsafe { self.pool.put_raw(ptr, bytes, None) }
            }
        }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::PinnedHost
    }
}

// SAFETY: the contract on `MemoryResource` holds: `resource_allocate` hands out blocks of at
// least `bytes`, 256-byte aligned, device memory of the cache's device, out of the cache (used by
// no one else) until `deallocate`, ordered before the caller's stream; `resource_deallocate`
// returns only blocks it handed out, after the caller's stream (see `DeviceCache`'s
// resource methods).
unsafe impl MemoryResource for DeviceCache {
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        self.resource_allocate(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, _bytes: usize, stream: StreamRef<'_>) {
        // SAFETY: the caller's contract, which is the method's.
        unsafe { self.resource_deallocate(ptr, stream) }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn device(&self) -> Option<Device> {
        Some(DeviceCache::device(self))
    }

    fn pool_stats(&self) -> Option<PoolStats> {
        Some(self.as_pool_stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_byte_requests_are_refused_without_a_cuda_call() {
        let device = Device::new_unchecked_for_tests(0);
        let resources: [&dyn MemoryResource; 4] = [
            &DeviceResource::new(device),
            &ManagedResource::new(device),
            &PinnedResource::new(HostAllocFlags::empty()),
            &PinnedPoolResource::new(PinnedPool::new(HostAllocFlags::empty())),
        ];
        for resource in resources {
            let err = resource.allocate(0, StreamRef::LEGACY).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
        }
    }
}
