//! `CacheBackend`: PyTorch's requests served by a caching allocator ([`BlockSource`]), with the
//! blocks kept by address (PyTorch frees by address) and PyTorch's raw stream handles resolved to
//! the cache's streams.
//!
//! **Streams.** PyTorch passes the handle of its current stream: 0 for its default stream (the
//! legacy default stream), a stream of its pool, or a handle the user wrapped
//! (`torch.cuda.ExternalStream`). 0 and `cudaStreamLegacy` (1) name the device's legacy stream.
//! Any other handle is borrowed as the stream it names, and the cache keeps it while it holds
//! memory freed there ([`AllocatorBackend`]'s `'static` handles). `cudaStreamPerThread` (2) is the one
//! handle that names a different stream on every thread, while PyTorch frees on whatever thread
//! drops the tensor, passing the allocating stream's handle: such blocks come from the legacy
//! stream, the allocating thread's per-thread stream waits for it (an event), and their free waits
//! for the whole device before the block returns to the legacy stream.
//!
//! **Frees.** PyTorch's pluggable allocator passes the stream the block was allocated on, so a
//! free is a return to that stream's cache, reusable there at once. A block that other streams
//! used too (`Tensor.record_stream`, through [`CacheBackend::record_stream`]; or a free on another
//! stream, from other callers of the C functions) is held back instead, as PyTorch's own
//! allocator does: an event is recorded on each of those streams at the free, and the block
//! returns to its own stream once all of them have completed (checked without blocking on later
//! allocations; waited for before the cache is emptied, or when an allocation finds no memory).
//! Its own stream's uses need no event: work queued there after the return runs after them.

use crate::backend::{AllocatorBackend, Figures, Reserved, unknown_block, wrong_size};
use cuda_mem::caching::{CachedBlock, Keep, StreamKey};
use cuda_mem::resource::StreamRef;
use cuda_mem::{CachingStats, Result};
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// `cudaStreamLegacy`, the legacy default stream's explicit name.
const LEGACY: usize = 1;
/// `cudaStreamPerThread`.
const PER_THREAD: usize = 2;

/// A caching allocator as [`CacheBackend`] uses it: blocks by stream, for one device.
pub trait BlockSource: Send + Sync + fmt::Debug {
    /// The allocator's stream handle.
    type Stream;

    /// A mark in a stream's work (an event).
    type Fence: Send;

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

    /// A mark after the work queued on `stream` so far.
    fn record(&self, stream: &Self::Stream) -> Result<Self::Fence>;

    /// True once the marked work has completed; never blocks.
    fn is_done(&self, fence: &Self::Fence) -> bool;

    /// Blocks until the marked work has completed.
    fn wait(&self, fence: &Self::Fence) -> Result<()>;

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

    /// Gives the memory behind the blocks still allocated back to the device, their addresses
    /// kept (and their bytes in pinned host memory with [`Keep::Contents`]); allocations are
    /// refused until [`wake`](Self::wake). Returns the bytes given back.
    ///
    /// # Safety
    /// As `DeviceCache::sleep_in_place`: until a wake succeeds no work uses any block's memory
    /// and no block is freed; no allocation is in progress; work queued on other streams than the
    /// blocks' own has completed.
    unsafe fn sleep(&self, keep: Keep) -> Result<usize>;

    /// New memory at the sleeping blocks' addresses, with their kept bytes; returns the bytes
    /// mapped. Out of memory leaves the source asleep with what it kept.
    fn wake(&self) -> Result<usize>;

    /// Bytes of pinned host memory the sleeps hold.
    fn host_backup_bytes(&self) -> usize;

    /// Frees the pinned host memory kept for the next sleep; returns its bytes.
    fn release_host_backups(&self) -> usize;
}

/// A block handed to PyTorch.
#[derive(Debug)]
struct Held {
    block: CachedBlock,
    /// The size asked for, which its free must give.
    bytes: usize,
    /// Allocated for `cudaStreamPerThread`: its users cannot be named at the free.
    per_thread: bool,
    /// Other streams that use it (`record_stream`).
    users: Vec<StreamRef<'static>>,
}

/// A freed block waiting for other streams' work.
struct Deferred<F> {
    block: CachedBlock,
    fences: Vec<F>,
}

/// PyTorch's allocations from a [`BlockSource`] (cuda-mem's `DeviceCache` on a device), kept by
/// address until PyTorch frees them.
pub struct CacheBackend<S: BlockSource> {
    source: S,
    held: Mutex<FxHashMap<usize, Held>>,
    deferred: Mutex<Vec<Deferred<S::Fence>>>,
    /// `deferred.len()`, read without the lock on every allocation.
    deferred_count: AtomicUsize,
    /// A CUDA graph capture is underway: the held-back blocks' events are not queried.
    holding_queries: AtomicBool,
}

impl<S: BlockSource> fmt::Debug for CacheBackend<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBackend")
            .field("source", &self.source)
            .field("held", &self.held_blocks())
            .field("deferred", &self.deferred_blocks())
            .finish()
    }
}

/// The handle a stream's blocks are keyed by: the legacy stream's two names are one.
fn key_of(stream: StreamRef<'static>) -> usize {
    match stream.as_raw() as usize {
        LEGACY => 0,
        raw => raw,
    }
}

impl<S: BlockSource> CacheBackend<S> {
    /// A backend over `source`.
    pub fn new(source: S) -> Self {
        Self {
            source,
            held: Mutex::default(),
            deferred: Mutex::default(),
            deferred_count: AtomicUsize::new(0),
            holding_queries: AtomicBool::new(false),
        }
    }

    /// The source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Blocks held by PyTorch now.
    pub fn held_blocks(&self) -> usize {
        self.held().len()
    }

    /// Freed blocks waiting for other streams' work.
    pub fn deferred_blocks(&self) -> usize {
        self.deferred_count.load(Ordering::Relaxed)
    }

    /// Notes that work on `stream` uses the block at `ptr` (PyTorch's `Tensor.record_stream`): its
    /// free will wait for the work queued on `stream` by then. False when `ptr` is not a block
    /// this backend handed out (PyTorch calls the hook for any CUDA tensor's memory).
    pub fn note_user(&self, ptr: NonNull<u8>, stream: StreamRef<'static>) -> bool {
        let mut held = self.held();
        let Some(held) = held.get_mut(&(ptr.as_ptr() as usize)) else { return false };
        let key = key_of(stream);
        if StreamKey(key) != held.block.stream() && !held.users.iter().any(|&u| key_of(u) == key) {
            held.users.push(stream);
        }
        true
    }

    fn held(&self) -> MutexGuard<'_, FxHashMap<usize, Held>> {
        // The map is consistent at every point a panic could leave it.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the block at `ptr` out of the held ones, if it was handed out for `bytes`.
    fn take(&self, ptr: NonNull<u8>, bytes: usize) -> Result<Held> {
        match self.held().entry(ptr.as_ptr() as usize) {
            Entry::Occupied(held) if held.get().bytes == bytes => Ok(held.remove()),
            Entry::Occupied(held) => Err(wrong_size(ptr, bytes, held.get().bytes)),
            Entry::Vacant(_) => Err(unknown_block(ptr, bytes)),
        }
    }

    fn deferred(&self) -> MutexGuard<'_, Vec<Deferred<S::Fence>>> {
        // As above.
        self.deferred.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn allocate_block(&self, bytes: usize, stream: StreamRef<'static>) -> Result<(CachedBlock, bool)> {
        Ok(match key_of(stream) {
            PER_THREAD => (self.allocate_per_thread(bytes)?, true),
            0 => (self.source.with_stream(StreamRef::LEGACY, |s| self.source.alloc(bytes, s))?, false),
            _ => (self.source.with_stream(stream, |s| self.source.alloc(bytes, s))?, false),
        })
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

    /// Holds `block` back until the work queued on `users` so far has completed. Where no event
    /// can be recorded, the host waits for the device instead.
    fn defer(&self, block: CachedBlock, users: &[StreamRef<'static>]) {
        let mut fences = Vec::with_capacity(users.len());
        for &user in users {
            let user = if key_of(user) == 0 { StreamRef::LEGACY } else { user };
            match self.source.with_stream(user, |s| self.source.record(s)) {
                Ok(fence) => fences.push(fence),
                Err(_) => return self.free_after_device(block),
            }
        }
        let mut deferred = self.deferred();
        deferred.push(Deferred { block, fences });
        self.deferred_count.store(deferred.len(), Ordering::Relaxed);
    }

    /// Returns `block` once the whole device is idle; if that wait fails, the block stays out
    /// for good (never reused under work).
    fn free_after_device(&self, block: CachedBlock) {
        if self.source.synchronize().is_ok() {
            // SAFETY: from this source; every use of it has completed.
            unsafe { self.source.free(block) };
        }
    }

    /// Returns the held-back blocks whose streams' work has completed (all of them, waiting,
    /// when `wait`; a fence that cannot be waited for keeps its block back).
    fn settle(&self, wait: bool) {
        if self.deferred_blocks() == 0 || self.holding_queries.load(Ordering::Relaxed) {
            return;
        }
        let mut ready = Vec::new();
        {
            let mut deferred = self.deferred();
            let mut index = 0;
            while index < deferred.len() {
                let fences = &deferred[index].fences;
                if fences.iter().all(|f| self.source.is_done(f) || (wait && self.source.wait(f).is_ok())) {
                    ready.push(deferred.swap_remove(index).block);
                } else {
                    index += 1;
                }
            }
            self.deferred_count.store(deferred.len(), Ordering::Relaxed);
        }
        for block in ready {
            // SAFETY: from this source; the other streams' uses have completed (their fences),
            // and its own stream's uses come before the work queued there from now on.
            unsafe { self.source.free(block) };
        }
    }
}

impl<S: BlockSource> AllocatorBackend for CacheBackend<S> {
    fn allocate(&self, bytes: usize, stream: StreamRef<'static>) -> Result<NonNull<u8>> {
        self.settle(false);
        let (block, per_thread) = match self.allocate_block(bytes, stream) {
            Err(err) if err.is_out_of_memory() && self.deferred_blocks() > 0 => {
                // Held-back blocks may be what is missing: wait for them and try once more.
                self.settle(true);
                self.allocate_block(bytes, stream)?
            }
            other => other?,
        };
        let ptr = block.ptr();
        self.held().insert(ptr.as_ptr() as usize, Held { block, bytes, per_thread, users: Vec::new() });
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'static>) -> Result<()> {
        let Held { block, per_thread, mut users, .. } = self.take(ptr, bytes)?;
        let key = key_of(stream);
        if per_thread || key == PER_THREAD || users.iter().any(|&u| key_of(u) == PER_THREAD) {
            // Which thread's per-thread stream used the block cannot be known here.
            self.free_after_device(block);
            return Ok(());
        }
        if StreamKey(key) != block.stream() && !users.iter().any(|&u| key_of(u) == key) {
            users.push(stream);
        }
        if users.is_empty() {
            // SAFETY: from this source; the caller's contract: nothing uses it after the work
            // queued on its stream now.
            unsafe { self.source.free(block) };
        } else {
            // Every use is ordered before the work queued on its own stream or on one of `users`
            // after this call (the caller's contract, `record_stream`'s for the users).
            self.defer(block, &users);
        }
        Ok(())
    }

    fn check_free(&self, ptr: NonNull<u8>, bytes: usize) -> Result<()> {
        match self.held().get(&(ptr.as_ptr() as usize)) {
            Some(held) if held.bytes == bytes => Ok(()),
            Some(held) => Err(wrong_size(ptr, bytes, held.bytes)),
            None => Err(unknown_block(ptr, bytes)),
        }
    }

    fn record_stream(&self, ptr: NonNull<u8>, stream: StreamRef<'static>) -> Result<bool> {
        Ok(self.note_user(ptr, stream))
    }

    fn figures(&self) -> Figures {
        let stats = self.source.stats();
        Figures {
            reserved: Reserved { current: stats.reserved.current, peak: stats.reserved.peak },
            cache_hits: stats.front_hits + stats.core_hits,
            cache_misses: stats.misses,
            segments: stats.segments as u64,
            segment_releases: stats.segment_releases,
            alloc_retries: stats.oom_retries,
            inactive_split_bytes: (stats.free_bytes - stats.idle_bytes) as u64,
        }
    }

    fn reset_peak(&self) {
        self.source.reset_peaks();
    }

    fn release_cached(&self) -> Result<()> {
        if self.holding_queries.load(Ordering::Relaxed) {
            // A capture is underway: its fences and `cudaFree`s would end it.
            return Ok(());
        }
        self.settle(true);
        self.source.empty_cache();
        Ok(())
    }

    fn hold_event_queries(&self, hold: bool) {
        self.holding_queries.store(hold, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
