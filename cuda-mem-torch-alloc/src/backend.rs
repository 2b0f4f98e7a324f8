//! Where the allocator's memory comes from, behind a small trait: today a retaining pool per
//! device; a device caching allocator can replace it without touching the FFI layer.

use cuda_mem::resource::{MemoryResource, PoolResource, StreamRef};
use cuda_mem::{Device, MemPool, PoolProps, Result};
use std::fmt;
use std::ptr::NonNull;

/// Bytes the backend holds from the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reserved {
    /// Held now.
    pub current: usize,
    /// Highest since creation or the last `reset_peak`.
    pub peak: usize,
}

/// A stream-ordered source of device memory for one device.
pub trait Backend: Send + Sync + fmt::Debug {
    /// `bytes` (> 0) usable by work on `stream`.
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>>;

    /// Frees in stream order on `stream`.
    ///
    /// # Safety
    /// `ptr` came from `allocate` with `bytes`, is freed once, and nothing uses it after the work
    /// already queued on `stream`.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>);

    /// What the backend holds from the driver.
    fn reserved(&self) -> Reserved;

    /// Restarts the reserved peak from the current figure.
    fn reset_peak(&self);

    /// Returns cached memory to the driver.
    fn release_cached(&self) -> Result<()>;
}

/// A retaining pool (`cudaMallocFromPoolAsync` / `cudaFreeAsync`) of its own per device, so its
/// reserved figures are the allocator's alone.
#[derive(Debug)]
pub struct PoolBackend {
    resource: PoolResource,
}

impl PoolBackend {
    /// A new retaining pool on `device`.
    pub fn new(device: Device) -> Result<Self> {
        Ok(Self { resource: PoolResource::new(MemPool::new(PoolProps::new(device))?) })
    }
}

impl Backend for PoolBackend {
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        self.resource.allocate(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        // SAFETY: forwarded from the caller.
        unsafe { self.resource.deallocate(ptr, bytes, stream) }
    }

    fn reserved(&self) -> Reserved {
        let stats = self.resource.pool().stats().unwrap_or_default();
        Reserved { current: stats.reserved_current, peak: stats.reserved_high }
    }

    fn reset_peak(&self) {
        // A failure leaves the old peak, which the next reading shows.
        self.resource.pool().reset_highs().ok();
    }

    fn release_cached(&self) -> Result<()> {
        self.resource.pool().trim_to(0)
    }
}
