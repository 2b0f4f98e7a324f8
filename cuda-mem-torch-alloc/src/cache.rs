//! `CacheBackend`: PyTorch's requests served by a caching allocator ([`BlockSource`]), with the
//! blocks kept by address (PyTorch frees by address) and PyTorch's raw stream handles resolved to
//! the cache's streams.
//!
//! **Streams.** PyTorch passes the handle of its current stream: 0 for its default stream (the
//! legacy default stream), a stream of its pool, or a handle the user wrapped
//! (`torch.cuda.ExternalStream`). 0 and `cudaStreamLegacy` (1) name the device's legacy stream.
//! Any other handle is borrowed as the stream it names, and the cache keeps it while it holds
//! memory freed there ([`Backend`]'s `'static` handles). `cudaStreamPerThread` (2) is the one
//! handle that names a different stream on every thread, while PyTorch frees on whatever thread
//! drops the tensor, passing the allocating stream's handle: such blocks come from the legacy
//! stream, the allocating thread's per-thread stream waits for it (an event), and their free waits
//! for the whole device before the block returns to the legacy stream.
//!
//! **Frees.** PyTorch's pluggable allocator passes the stream the block was allocated on, so a
//! free is a return to that stream's cache, reusable there at once. A free on another stream
//! (other callers of the C functions) returns the block once that stream's work is done.

use crate::backend::{Backend, Figures, Reserved};
use cuda_mem::caching::{CachedBlock, StreamKey};
use cuda_mem::resource::StreamRef;
use cuda_mem::{CachingStats, Result};
use rustc_hash::FxHashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// `cudaStreamLegacy`, the legacy default stream's explicit name.
const LEGACY: usize = 1;
/// `cudaStreamPerThread`.
const PER_THREAD: usize = 2;

/// A caching allocator as [`CacheBackend`] uses it: blocks by stream, for one device.
pub trait BlockSource: Send + Sync + fmt::Debug {
    /// The allocator's stream handle.
    type Stream;

    /// Runs `f` with the stream `stream` names: the device's legacy stream for 0, else the stream
    /// the handle names (never `cudaStreamLegacy` or `cudaStreamPerThread`: [`CacheBackend`]
    /// resolves those). Its blocks' [`CachedBlock::stream`] is `StreamKey(handle)`.
    fn with_stream<R>(&self, stream: StreamRef<'static>, f: impl FnOnce(&Self::Stream) -> Result<R>) -> Result<R>;

    /// A block of at least `bytes` for use on `stream`.
    fn alloc(&self, bytes: usize, stream: &Self::Stream) -> Result<CachedBlock>;

    /// Returns `block` for reuse on its own stream at once.
    ///
    /// # Safety
    /// `block` came from this source, and every use of it is ordered before the work queued on
    /// its stream after this call.
    unsafe fn free(&self, block: CachedBlock);

    /// Returns `block` once the work queued on `stream` so far has completed; on an error the
    /// block stays out for good.
    ///
    /// # Safety
    /// `block` came from this source, and every use of it is ordered before the work queued on
    /// `stream` after this call.
    unsafe fn free_on(&self, block: CachedBlock, stream: &Self::Stream) -> Result<()>;

    /// Makes the calling thread's per-thread default stream on the device wait for the work
    /// queued on `stream` so far.
    fn order_per_thread_after(&self, stream: &Self::Stream) -> Result<()>;

    /// Blocks until all work on the device has completed.
    fn synchronize(&self) -> Result<()>;

    /// The allocator's figures.
    fn stats(&self) -> CachingStats;

    /// Restarts the allocator's peaks.
    fn reset_peaks(&self);

    /// Releases the cached memory no block of which is in use; returns the bytes released.
    fn empty_cache(&self) -> usize;
}

/// A block handed to PyTorch.
#[derive(Debug)]
struct Held {
    block: CachedBlock,
    /// Allocated for `cudaStreamPerThread`: its users cannot be named at the free.
    per_thread: bool,
}

/// PyTorch's allocations from a [`BlockSource`] (cuda-mem's `DeviceCache` on a device), kept by
/// address until PyTorch frees them.
#[derive(Debug)]
pub struct CacheBackend<S: BlockSource> {
    source: S,
    held: Mutex<FxHashMap<usize, Held>>,
}

impl<S: BlockSource> CacheBackend<S> {
    /// A backend over `source`.
    pub fn new(source: S) -> Self {
        Self { source, held: Mutex::default() }
    }

    /// The source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Blocks held by PyTorch now.
    pub fn held_blocks(&self) -> usize {
        self.held().len()
    }

    fn held(&self) -> MutexGuard<'_, FxHashMap<usize, Held>> {
        // The map is consistent at every point a panic could leave it.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn allocate_per_thread(&self, bytes: usize) -> Result<CachedBlock> {
        self.source.with_stream(StreamRef::LEGACY, |legacy| {
            let block = self.source.alloc(bytes, legacy)?;
            if let Err(err) = self.source.order_per_thread_after(legacy) {
                // SAFETY: from this source, never used.
                unsafe { self.source.free(block) };
                return Err(err);
            }
            Ok(block)
        })
    }
}

/// The handle a stream's blocks are keyed by: the legacy stream's two names are one.
fn key_of(stream: StreamRef<'static>) -> usize {
    match stream.as_raw() as usize {
        LEGACY => 0,
        raw => raw,
    }
}

impl<S: BlockSource> Backend for CacheBackend<S> {
    fn allocate(&self, bytes: usize, stream: StreamRef<'static>) -> Result<NonNull<u8>> {
        let (block, per_thread) = match key_of(stream) {
            PER_THREAD => (self.allocate_per_thread(bytes)?, true),
            0 => (self.source.with_stream(StreamRef::LEGACY, |s| self.source.alloc(bytes, s))?, false),
            _ => (self.source.with_stream(stream, |s| self.source.alloc(bytes, s))?, false),
        };
        let ptr = block.ptr();
        self.held().insert(ptr.as_ptr() as usize, Held { block, per_thread });
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, _bytes: usize, stream: StreamRef<'static>) {
        let Some(Held { block, per_thread }) = self.held().remove(&(ptr.as_ptr() as usize)) else {
            debug_assert!(false, "{ptr:p} was not allocated here");
            return;
        };
        let key = key_of(stream);
        if per_thread || key == PER_THREAD {
            // Which thread's per-thread stream used the block cannot be known here: once the
            // whole device is idle, no use is pending anywhere. If the wait fails, the block
            // stays out for good (never reused under work).
            if self.source.synchronize().is_ok() {
                // SAFETY: from this source; every use of it has completed.
                unsafe { self.source.free(block) };
            }
            return;
        }
        if block.stream() == StreamKey(key) {
            // SAFETY: from this source; the caller's contract: nothing uses it after the work
            // queued on its stream now.
            unsafe { self.source.free(block) };
            return;
        }
        let stream = if key == 0 { StreamRef::LEGACY } else { stream };
        // A failure (the handle refused, or no event recorded) leaves the block out for good.
        let _ = self.source.with_stream(stream, |s| {
            // SAFETY: from this source; the caller's contract: nothing uses it after the work
            // queued on `stream` now.
            unsafe { self.source.free_on(block, s) }
        });
    }

    fn figures(&self) -> Figures {
        let stats = self.source.stats();
        Figures {
            reserved: Reserved { current: stats.reserved.current, peak: stats.reserved.peak },
            cache_hits: stats.front_hits + stats.core_hits,
            cache_misses: stats.misses,
            segments: stats.segments as u64,
        }
    }

    fn reset_peak(&self) {
        self.source.reset_peaks();
    }

    fn release_cached(&self) -> Result<()> {
        self.source.empty_cache();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
