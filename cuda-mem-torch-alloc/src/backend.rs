//! Where the allocator's memory comes from, behind a small trait: cuda-mem's device caching
//! allocator ([`CacheBackend`](crate::CacheBackend), the default) or a retaining pool
//! ([`PoolBackend`](crate::PoolBackend)); the FFI layer does not depend on which.

use cuda_mem::resource::StreamRef;
use cuda_mem::{CudaError, ErrorKind, Result};
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

/// What a backend reports: the bytes it holds, and how it served requests where it counts that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// Bytes held from the driver.
    pub reserved: Reserved,
    /// Requests served from memory the backend already held (0 where not counted).
    pub cache_hits: u64,
    /// Requests that needed new memory from the driver (0 where not counted).
    pub cache_misses: u64,
    /// Segments held (0 where not counted).
    pub segments: u64,
    /// Segments given back to the driver (0 where not counted).
    pub segment_releases: u64,
    /// Allocations that found no memory, released the cache and tried again.
    pub alloc_retries: u64,
    /// Free bytes split off segments that are in use (0 where not counted).
    pub inactive_split_bytes: u64,
}

/// A stream-ordered source of device memory for one device.
///
/// Streams are `StreamRef<'static>`: a caching backend keeps a stream it was given for as long
/// as it holds memory freed on it, and records events on it until then, so a handle must stay
/// valid for good (the C functions' contract; PyTorch never destroys its streams).
pub trait AllocatorBackend: Send + Sync + fmt::Debug {
    /// `bytes` (> 0) usable by work on `stream`.
    fn allocate(&self, bytes: usize, stream: StreamRef<'static>) -> Result<NonNull<u8>>;

    /// Frees in stream order on `stream`. A `ptr` that is not a block `allocate` handed out and
    /// not freed since, or a `bytes` other than it was asked for, is refused (an
    /// `InvalidArgument` error) and nothing is freed: the C functions' callers can pass anything.
    ///
    /// # Safety
    /// Nothing uses the block after the work already queued on `stream`.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'static>) -> Result<()>;

    /// The refusal `deallocate` would give now, if any, without freeing (checked before a free
    /// is held back during a CUDA graph capture).
    fn check_free(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()>;

    /// Notes that work on `stream` uses the block at `ptr` (PyTorch's `Tensor.record_stream`), so
    /// that its free waits for that work. `Ok(false)` when `ptr` is not this backend's.
    fn record_stream(&self, ptr: NonNull<u8>, stream: StreamRef<'static>) -> Result<bool>;

    /// What the backend holds and counts.
    fn figures(&self) -> Figures;

    /// Restarts the reserved peak from the current figure.
    fn reset_peak(&self);

    /// Returns cached memory to the driver.
    fn release_cached(&self) -> Result<()>;

    /// While `hold` (a CUDA graph capture is underway), makes no event query or record of its
    /// own accord (a capture refuses them); cached memory waiting for events stays waiting.
    fn hold_event_queries(&self, hold: bool) {
        let _ = hold;
    }
}

impl Figures {
    /// The figures of two backends together.
    pub fn plus(self, other: Figures) -> Figures {
        Figures {
            reserved: Reserved {
                current: self.reserved.current + other.reserved.current,
                peak: self.reserved.peak + other.reserved.peak,
            },
            cache_hits: self.cache_hits + other.cache_hits,
            cache_misses: self.cache_misses + other.cache_misses,
            segments: self.segments + other.segments,
            segment_releases: self.segment_releases + other.segment_releases,
            alloc_retries: self.alloc_retries + other.alloc_retries,
            inactive_split_bytes: self.inactive_split_bytes + other.inactive_split_bytes,
        }
    }
}

/// Why a free of memory that is not a live block of the allocator is refused.
const UNKNOWN_BLOCK: &str = "a pointer this allocator did not hand out, or freed already";

/// The refusal of a free of memory that is not a live block of the allocator.
pub(crate) fn unknown_block(ptr: NonNull<u8>, bytes: usize) -> CudaError {
    CudaError::new(ErrorKind::InvalidArgument(UNKNOWN_BLOCK), format!("freeing {ptr:p} ({bytes} bytes)"))
}

/// True for [`unknown_block`]'s refusal: the memory may be another backend's.
pub(crate) fn is_unknown_block(err: &CudaError) -> bool {
    matches!(err.kind(), ErrorKind::InvalidArgument(why) if *why == UNKNOWN_BLOCK)
}

/// The refusal of a free with another size than the block was allocated with.
pub(crate) fn wrong_size(ptr: NonNull<u8>, bytes: usize, allocated: usize) -> CudaError {
    let kind = ErrorKind::InvalidArgument("a size other than the block was allocated with");
    CudaError::new(kind, format!("freeing {ptr:p} as {bytes} bytes (allocated as {allocated})"))
}
