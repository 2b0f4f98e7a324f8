//! `PrivatePool`: a caching allocator whose blocks only its owner's work uses, kept apart from
//! every other allocator (CUDA graphs' private pools: PyTorch's `graph_pool_handle`).
//!
//! The pool is one [`CachingAllocator`] of its own over a [`SegmentSource`], so its segments and
//! free lists are never seen by another allocator: a block freed here is reused only by a later
//! allocation from this pool, never by eager users of the allocator the segments came from. Its
//! blocks are not ordered by streams: the owner guarantees that the work using blocks allocated
//! before a free never runs concurrently with the work using blocks allocated after it (graphs of
//! one pool take turns). So the pool records no fence, waits for nothing, and all its blocks live
//! on one key. Segments are never released while the pool lives, not even on out of memory:
//! graphs keep the addresses of freed blocks. They are released when the pool is dropped, which
//! the owner does only once no work that uses them can run.

use super::CachingAllocator;
use super::backend::{Backend, StreamKey};
use super::block::CachedBlock;
use super::config::Config;
use super::stats::CachingStats;
use crate::{BackendError, Error, Result};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where a [`PrivatePool`] takes its segments from and returns them to.
///
/// # Safety
/// `allocate(bytes)` returns `bytes` bytes aligned to at least 256, overlapping no segment it
/// returned before that has not been released.
pub unsafe trait SegmentSource: Send + Sync + 'static {
    /// What `allocate` fails with.
    type Error: BackendError;

    /// A new segment of `bytes` bytes.
    fn allocate(&self, bytes: usize) -> std::result::Result<NonNull<u8>, Self::Error>;

    /// Returns a segment.
    ///
    /// # Safety
    /// A segment from this source's `allocate`, released once, that no work uses any more.
    unsafe fn release(&self, base: NonNull<u8>, bytes: usize);
}

/// The one "stream" of a private pool: its blocks are ordered by the owner, not by streams.
#[derive(Debug, Clone, Copy)]
pub struct PoolOrder;

/// The private backend's errors: the source's, or a fence the pool does not make.
#[derive(Debug)]
enum PrivateError<E> {
    Source(E),
    Refused(&'static str),
}

impl<E: fmt::Display> fmt::Display for PrivateError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Source(err) => err.fmt(f),
            Self::Refused(why) => f.write_str(why),
        }
    }
}

impl<E: BackendError> std::error::Error for PrivateError<E> {}

impl<E: BackendError> BackendError for PrivateError<E> {
    fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::Source(err) if err.is_out_of_memory())
    }
}

/// The pool's errors in the source's terms: the refusals of fences become [`Error::Refused`].
fn in_source_terms<E>(err: Error<PrivateError<E>>) -> Error<E> {
    match err {
        Error::Backend(PrivateError::Source(err)) => Error::Backend(err),
        Error::OutOfMemory { source: PrivateError::Source(source), stats } => Error::OutOfMemory { source, stats },
        Error::Backend(PrivateError::Refused(why)) | Error::OutOfMemory { source: PrivateError::Refused(why), .. } => {
            Error::Refused(why)
        }
        Error::SizeOverflow { bytes } => Error::SizeOverflow { bytes },
        Error::InvalidConfig(why) => Error::InvalidConfig(why),
        Error::Refused(why) => Error::Refused(why),
        Error::SleepState(why) => Error::SleepState(why),
    }
}

/// The backend of the pool's allocator: segments from the source, and fences that exist only
/// once the pool is being dropped (so that its segments are released then and never before).
struct Private<S> {
    source: S,
    closing: AtomicBool,
}

// SAFETY: segments come from the source (its own promise). There is one stream key, so no block
// is freed on a foreign stream and no segment is adopted: `stream_wait` is never needed and
// fails. `record` succeeds only once `closing` is set, which `PrivatePool::drop` does when no
// handle of the pool is left: by `PrivatePool::free`'s contract every piece of work that used a
// block has completed by then, so a fence that is done at once covers it all. Before that no fence
// exists, so the allocator releases no segment (a segment whose fence cannot be recorded stays).
unsafe impl<S: SegmentSource> Backend for Private<S> {
    type Stream = PoolOrder;
    type Fence = ();
    type Error = PrivateError<S::Error>;

    fn key(_: &PoolOrder) -> StreamKey {
        StreamKey(0)
    }

    fn allocate(&self, bytes: usize) -> std::result::Result<NonNull<u8>, Self::Error> {
        self.source.allocate(bytes).map_err(PrivateError::Source)
    }

    unsafe fn release(&self, base: NonNull<u8>, bytes: usize) {
        // SAFETY: the allocator's contract, which is this one's.
        unsafe { self.source.release(base, bytes) }
    }

    fn record(&self, _: &PoolOrder) -> std::result::Result<(), Self::Error> {
        if self.closing.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(PrivateError::Refused("a private pool keeps its segments while it lives"))
    }

    fn is_done(&self, (): &()) -> bool {
        true
    }

    fn wait(&self, (): &()) -> std::result::Result<(), Self::Error> {
        Ok(())
    }

    fn stream_wait(&self, _: &PoolOrder, (): &()) -> std::result::Result<(), Self::Error> {
        Err(PrivateError::Refused("a private pool has one order"))
    }
}

/// A private caching pool over a [`SegmentSource`]: see the module documentation.
pub struct PrivatePool<S: SegmentSource> {
    allocator: CachingAllocator<Private<S>>,
}

impl<S: SegmentSource> std::fmt::Debug for PrivatePool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivatePool").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl<S: SegmentSource> PrivatePool<S> {
    /// An empty pool taking segments from `source`, sized as `config` says; the parts of the
    /// config about streams, releases and front caches do not apply (blocks go straight back to
    /// the pool's free lists). Makes no call to the source.
    pub fn new(source: S, config: &Config) -> Result<Self, S::Error> {
        let config = Config {
            front_depth: 0,
            front_max_bytes: 0,
            cross_stream_waits: false,
            release_idle_on_miss: false,
            ..config.clone()
        };
        let backend = Private { source, closing: AtomicBool::new(false) };
        Ok(Self { allocator: CachingAllocator::new(backend, config).map_err(in_source_terms)? })
    }

    /// The segment source.
    pub fn source(&self) -> &S {
        &self.allocator.backend().source
    }

    /// A block of at least `bytes`: a free block of the pool, else a new segment.
    pub fn alloc(&self, bytes: usize) -> Result<CachedBlock, S::Error> {
        self.allocator.alloc(bytes, &PoolOrder).map_err(in_source_terms)
    }

    /// Returns `block` to the pool's free lists, for later allocations from this pool only.
    ///
    /// # Safety
    /// `block` came from this pool's [`PrivatePool::alloc`]; the work that used it never runs
    /// concurrently with work using a block allocated from this pool after this call, and has
    /// completed before the pool is dropped.
    pub unsafe fn free(&self, block: CachedBlock) {
        // SAFETY: blocks of the pool all live on one key, so "ordered before later work on the
        // block's stream" is the caller's promise of turns.
        unsafe { self.allocator.free(block) }
    }

    /// The pool's figures: reserved is its segments, allocated the blocks out now.
    pub fn stats(&self) -> CachingStats {
        self.allocator.stats()
    }

    /// Restarts the peaks of [`PrivatePool::stats`] from their current values.
    pub fn reset_peaks(&self) {
        self.allocator.reset_peaks();
    }

    /// Every segment of the pool, as (address, bytes).
    pub fn segment_ranges(&self) -> Vec<(usize, usize)> {
        self.allocator.segment_ranges()
    }

    /// True if `address` lies in one of the pool's segments.
    pub fn contains(&self, address: usize) -> bool {
        self.segment_ranges().iter().any(|&(base, bytes)| address >= base && address - base < bytes)
    }

    /// Tries to give idle segments back to the source; a private pool keeps them while it lives,
    /// so this releases nothing (tests prove it).
    #[cfg(test)]
    pub(super) fn try_empty(&self) -> usize {
        self.allocator.empty_cache()
    }

    /// Panics if the bookkeeping is inconsistent.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        self.allocator.check_invariants();
    }
}

impl<S: SegmentSource> Drop for PrivatePool<S> {
    fn drop(&mut self) {
        // The allocator releases its idle segments when dropped, which fences now allow; blocks
        // still out (forgotten handles) keep their segments.
        self.allocator.backend().closing.store(true, Ordering::Release);
    }
}
