//! `PoolBackend`: a retaining memory pool per device (`cudaMallocFromPoolAsync` /
//! `cudaFreeAsync`), the allocator's first backend, kept for comparison.

use crate::backend::{AllocatorBackend, Figures, Reserved, unknown_block, wrong_size};
use cuda_mem::resource::{MemoryResource, PoolResource, StreamRef};
use cuda_mem::{CudaError, Device, ErrorKind, MemPool, PoolProps, Result};
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

/// A retaining pool (`cudaMallocFromPoolAsync` / `cudaFreeAsync`) of its own per device, so its
/// reserved figures are the allocator's alone.
#[derive(Debug)]
pub struct PoolBackend {
    resource: PoolResource,
    device: Device,
    /// The blocks handed out, by address, with their sizes: a free of anything else is refused
    /// before it reaches `cudaFreeAsync`.
    live: Mutex<FxHashMap<usize, usize>>,
}

impl PoolBackend {
    /// A new retaining pool on `device`.
    pub fn new(device: Device) -> Result<Self> {
        let resource = PoolResource::new(MemPool::new(PoolProps::new(device))?);
        Ok(Self { resource, device, live: Mutex::default() })
    }

    /// Takes `ptr` out of the live blocks, if it was handed out for `bytes`.
    fn take(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()> {
        // The map is consistent at every point a panic could leave it.
        match self.live.lock().unwrap_or_else(PoisonError::into_inner).entry(ptr.as_ptr() as usize) {
            Entry::Occupied(live) if *live.get() == bytes => {
                live.remove();
                Ok(())
            }
            Entry::Occupied(live) => Err(wrong_size(ptr, bytes, *live.get())),
            Entry::Vacant(_) => Err(unknown_block(ptr, bytes)),
        }
    }

    /// Runs `f` with the device current where the handle is a built-in one (0,
    /// `cudaStreamLegacy`, `cudaStreamPerThread`), which names a stream of the current device:
    /// PyTorch may free from another device's context.
    fn on_device<R>(&self, stream: StreamRef<'static>, f: impl FnOnce() -> R) -> Result<R> {
        if stream.as_raw() as usize > 2 {
            return Ok(f());
        }
        self.device.run_on(f)
    }
}

impl AllocatorBackend for PoolBackend {
    fn allocate(&self, bytes: usize, stream: StreamRef<'static>) -> Result<NonNull<u8>> {
        let ptr = self.on_device(stream, || self.resource.allocate(bytes, stream))??;
        self.live.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr.as_ptr() as usize, bytes);
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'static>) -> Result<()> {
        self.take(ptr, bytes)?;
        // A failure to make the device current leaves the memory allocated: a leak, never a free
        // on the wrong device's stream.
        // SAFETY: handed out by this pool's `allocate` and taken out of the live blocks just now
        // (so freed once); nothing uses it after the work queued on `stream` (the caller's
        // contract).
        let _ = self.on_device(stream, || unsafe { self.resource.deallocate(ptr, bytes, stream) });
        Ok(())
    }

    fn check_free(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()> {
        match self.live.lock().unwrap_or_else(PoisonError::into_inner).get(&(ptr.as_ptr() as usize)) {
            Some(&live) if live == bytes => Ok(()),
            Some(&live) => Err(wrong_size(ptr, bytes, live)),
            None => Err(unknown_block(ptr, bytes)),
        }
    }

    fn record_stream(&self, _: NonNull<u8>, _: StreamRef<'static>) -> Result<bool> {
        let kind = ErrorKind::InvalidArgument("record_stream is not supported by the pool backend (use \"cache\")");
        Err(CudaError::new(kind, "cuda-mem's PyTorch allocator"))
    }

    fn figures(&self) -> Figures {
        let stats = self.resource.pool().stats().unwrap_or_default();
        Figures {
            reserved: Reserved { current: stats.reserved_current, peak: stats.reserved_high },
            ..Figures::default()
        }
    }

    fn reset_peak(&self) {
        // A failure leaves the old peak, which the next reading shows.
        self.resource.pool().reset_highs().ok();
    }

    fn release_cached(&self) -> Result<()> {
        self.resource.pool().trim_to(0)
    }
}
