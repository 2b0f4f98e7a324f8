//! What the caching allocator needs from CUDA: segments of device memory, and fences (events)
//! recorded on streams that the host can query or wait for and that other streams can wait for.

use crate::error::Result;
use std::ptr::NonNull;

/// A stream as the cache knows it: the value of its raw handle, compared and hashed, never
/// dereferenced. The backend turns it back into a stream for its fence calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey(pub usize);

/// The memory system behind a [`CachingAllocator`](super::CachingAllocator).
///
/// # Safety
/// The cache hands out parts of segments and decides when memory may be reused from these
/// promises; an implementation that breaks one makes it hand out memory that is still in use:
/// - `allocate(bytes)` returns `bytes` bytes aligned to at least 256, overlapping no segment it
///   returned before that has not been released;
/// - a fence from `record(stream)` covers the work queued on `stream` before the call: `is_done`
///   is true and `wait` returns `Ok` only once that work has completed, and `stream_wait(other,
///   fence)` returns `Ok` only when work queued on `other` afterwards cannot start before it;
/// - a key means the same stream from the first time the cache is given it until the cache calls
///   `forget_stream` with it (a backend that keys streams by raw handle keeps each stream alive
///   until then, so that a destroyed stream's handle is not reused while its blocks are cached).
pub unsafe trait Backend: Send + Sync + 'static {
    /// A mark in a stream's work (a CUDA event).
    type Fence: Send + Sync + 'static;

    /// A new segment of `bytes` (a multiple of 512) bytes. Out of memory is
    /// `ErrorKind::OutOfMemory`, which makes the cache release what it holds and try once more.
    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>>;

    /// Returns a segment to the system.
    ///
    /// # Safety
    /// `base` and `bytes` are a segment from this backend's `allocate`, released once, and every
    /// piece of work that used its memory has completed.
    unsafe fn release(&self, base: NonNull<u8>, bytes: usize);

    /// A fence after the work queued on `stream` so far.
    fn record(&self, stream: StreamKey) -> Result<Self::Fence>;

    /// True when the fenced work has completed; never blocks.
    fn is_done(&self, fence: &Self::Fence) -> bool;

    /// Blocks the calling thread until the fenced work has completed.
    fn wait(&self, fence: &Self::Fence) -> Result<()>;

    /// Makes work queued on `stream` from now on wait for the fenced work, without blocking the
    /// host (`cudaStreamWaitEvent`).
    fn stream_wait(&self, stream: StreamKey, fence: &Self::Fence) -> Result<()>;

    /// The cache holds nothing of `stream` any more (no segment, no pending fence); it may come
    /// back later as a new stream.
    fn forget_stream(&self, stream: StreamKey) {
        let _ = stream;
    }
}
