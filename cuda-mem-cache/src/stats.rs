//! Figures of the device caching allocator, after PyTorch's `memory_stats()`.
//!
//! The core's figures (reserved, active, segments, hits and misses of the core) change under its
//! shard's lock and are exact, with one exception: the active peak is each shard's peak summed
//! (streams hash to shards), exact with one shard and otherwise an upper bound. The reserved
//! figures, peak included, are the device's totals and exact. The figures of handed-out memory (allocated, requested, front-cache hits,
//! per-class counts) change on the hot path, so each thread counts its own in its front cache and
//! reading sums them: current values are exact whenever no call is in flight; a peak is exact
//! while one thread allocates and frees, and otherwise an upper bound (threads' own peaks need
//! not coincide, and no shared counter is touched on the hot path to find out).

/// A figure now and its highest value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CurrentPeak {
    /// The value now.
    pub current: usize,
    /// The highest value so far.
    pub peak: usize,
}

impl CurrentPeak {
    pub(super) fn add(&mut self, bytes: usize) {
        self.current += bytes;
        self.peak = self.peak.max(self.current);
    }

    pub(super) fn sub(&mut self, bytes: usize) {
        self.current -= bytes;
    }

    pub(super) fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Figures of a device caching allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CachingStats {
    /// Bytes of the blocks held by their users (each request rounded up to its size class).
    pub allocated: CurrentPeak,
    /// Bytes the users asked for: `allocated - requested` is the rounding waste.
    pub requested: CurrentPeak,
    /// Bytes of blocks out of the shared core: held by users, kept in threads' front caches, or
    /// freed on another stream and waiting for that stream's work. The current value is exact;
    /// the peak sums the shards' peaks: an upper bound where streams of several shards peak at
    /// different times.
    pub active: CurrentPeak,
    /// Bytes taken from the device: segments, mapped pages and kept pages. Exact, peak included.
    pub reserved: CurrentPeak,
    /// Bytes in the core's free blocks (`reserved - active - kept_bytes`).
    pub free_bytes: usize,
    /// Bytes of segments none of whose blocks is out (part of `free_bytes`); the rest of
    /// `free_bytes` is free space split off segments in use (PyTorch's `inactive_split_bytes`).
    pub idle_bytes: usize,
    /// Bytes of whole mappings inside the core's free blocks of growable segments (part of
    /// `free_bytes`): what unmapping could give back now without waiting for any block to be
    /// freed. The rest of `free_bytes` shares a mapping with blocks in use, and goes back only
    /// when they are freed. 0 over segments from `cudaMalloc`.
    pub trimmable_bytes: usize,
    /// The largest free block of the core: against `free_bytes`, a measure of fragmentation.
    pub largest_free_block: usize,
    /// Bytes kept in threads' front caches.
    pub parked_bytes: usize,
    /// Bytes freed on another stream than their own, waiting for that stream's work.
    pub pending_bytes: usize,
    /// Bytes of pages unmapped from free blocks and kept for later maps (part of `reserved`):
    /// a miss maps them again without creating memory; `empty_cache` and out of memory give
    /// them back to the device.
    pub kept_bytes: usize,
    /// Segments held.
    pub segments: usize,
    /// Segments taken from the device, ever.
    pub segment_allocations: u64,
    /// Segments given back to the device, ever.
    pub segment_releases: u64,
    /// Allocations served by the calling thread's front cache (no lock shared between threads).
    pub front_hits: u64,
    /// Allocations served by the core's free blocks.
    pub core_hits: u64,
    /// Allocations that needed a new segment.
    pub misses: u64,
    /// Free segments handed from one stream to another.
    pub segments_adopted: u64,
    /// Times a stream was made to wait on the device for another stream's work, to adopt its
    /// segment or borrow its free block.
    pub stream_waits: u64,
    /// Times an allocation failed for lack of memory, released the cache and tried again.
    pub oom_retries: u64,
    /// Allocations served by a free block of another stream, lent (part of `core_hits`): the
    /// block returns to its owner once the work queued before its free has completed.
    pub blocks_lent: u64,
}

/// Counts of one size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassStats {
    /// Bytes of a block of the class.
    pub bytes: usize,
    /// Allocations of the class.
    pub allocations: u64,
    /// Frees of the class (`allocations - frees` are held now).
    pub frees: u64,
    /// Allocations of the class served by a front cache.
    pub front_hits: u64,
}

/// Counts of one class kept by one thread.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ClassCounts {
    pub allocations: u64,
    pub frees: u64,
    pub front_hits: u64,
}

impl ClassCounts {
    pub(super) fn absorb(&mut self, other: ClassCounts) {
        self.allocations += other.allocations;
        self.frees += other.frees;
        self.front_hits += other.front_hits;
    }
}

/// Bytes handed out and freed by one thread: net (negative when it frees other threads' blocks)
/// and the highest net it reached.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ThreadCounters {
    pub allocated: isize,
    pub allocated_peak: isize,
    pub requested: isize,
    pub requested_peak: isize,
}

impl ThreadCounters {
    #[inline]
    pub(super) fn alloc(&mut self, bytes: usize, requested: usize) {
        self.allocated += bytes as isize;
        self.requested += requested as isize;
        self.allocated_peak = self.allocated_peak.max(self.allocated);
        self.requested_peak = self.requested_peak.max(self.requested);
    }

    #[inline]
    pub(super) fn free(&mut self, bytes: usize, requested: usize) {
        self.allocated -= bytes as isize;
        self.requested -= requested as isize;
    }

    pub(super) fn reset_peaks(&mut self) {
        self.allocated_peak = self.allocated;
        self.requested_peak = self.requested;
    }

    /// Adds another thread's figures; the sum of peaks bounds the peak of the sum.
    pub(super) fn absorb(&mut self, other: ThreadCounters) {
        self.allocated += other.allocated;
        self.requested += other.requested;
        self.allocated_peak += other.allocated_peak;
        self.requested_peak += other.requested_peak;
    }
}
