//! `PoolBackend`: a retaining memory pool per device (`cudaMallocFromPoolAsync` /
//! `cudaFreeAsync`), the allocator's first backend, kept for comparison.

use crate::backend::{AllocatorBackend, Figures, Reserved};
use cuda_mem::resource::{MemoryResource, PoolResource, StreamRef};
use cuda_mem::{CudaError, Device, ErrorKind, MemPool, PoolProps, Result};
use std::ptr::NonNull;

/// A retaining pool (`cudaMallocFromPoolAsync` / `cudaFreeAsync`) of its own per device, so its
/// reserved figures are the allocator's alone.
#[derive(Debug)]
pub struct PoolBackend {
    resource: PoolResource,
    device: Device,
}

impl PoolBackend {
    /// A new retaining pool on `device`.
    pub fn new(device: Device) -> Result<Self> {
        Ok(Self { resource: PoolResource::new(MemPool::new(PoolProps::new(device))?), device })
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
        self.on_device(stream, || self.resource.allocate(bytes, stream))?
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'static>) {
        // A failure to make the device current leaves the memory allocated: a leak, never a free
        // on the wrong device's stream.
        // SAFETY: forwarded from the caller.
        let _ = self.on_device(stream, || unsafe { self.resource.deallocate(ptr, bytes, stream) });
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
