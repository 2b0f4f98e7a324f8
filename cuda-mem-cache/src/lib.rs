//! The CUDA-free core of cuda-mem's caching allocators. It builds, tests, runs under Miri and
//! fuzzes without any CUDA toolkit; cuda-mem plugs the runtime in and re-exports this crate as
//! `cuda_mem::caching`.
//!
//! - [`CachingAllocator`]: a caching allocator of device memory. The runtime plugs in through
//!   [`Backend`] (segments, and events as fences); tests and fuzz targets plug in `fake`
//!   (feature `fake`).
//! - [`pinned`]: the bookkeeping of cuda-mem's `PinnedPool` (pinned host memory).
//! - Errors: the cache's own refusals and its backend's errors passed through, in one
//!   [`Error`] generic over the backend's error type.
//!
//! **Size classes.** Requests round up to a class: 512-byte steps up to 8 KiB, then sixteen
//! classes per power of two up to 32 MiB, so rounding wastes under a sixteenth of a request;
//! larger requests round to whole 2 MiB pages (from 1 GiB, to a 512th of the power of two), so a
//! large tensor strands under a page (see [`size_class`]). Every block of a class has exactly the class's bytes, so a cached block
//! serves any request of its class.
//!
//! **Growable segments** (the default where the backend has [`Pages`]: the CUDA backend when the
//! driver manages virtual memory, as PyTorch's `expandable_segments`). Each stream reserves one
//! address range per pool, as large as the device's memory, and backs it with mappings of whole
//! pages (2 MiB on current GPUs), laid out by [`MappingPlan`]: kept memory first, new memory for
//! the rest in mappings of at most the backend's size (a page on the CUDA backend). A mapping goes
//! back only whole (the driver unmaps whole mappings). A miss maps at the start of an unmapped run,
//! extending the free block before it, so a stream's blocks stay contiguous: a freed block merges
//! with its neighbours whatever their sizes, and a request of a new size is cut from the merged
//! space without a call. Memory moves between streams first as **lent blocks**: a miss that would
//! take the reserve above both its peak and [`Config::live_slack_percent`] (4%) above the bytes
//! allocated borrows the smallest fitting free block of another stream whose owner's work on it has
//! completed (a fence recorded on the owner after the block's return, polled, never waited for on
//! the host), or, when [`Config::cross_stream_waits`] allows, one the borrower waits for on the
//! device. A lent block is the borrower's until freed (its front cache may keep it for the
//! borrower's next request of its class), then returns to its owner pending a fence on the stream
//! it was freed on. When no free block fits, whole mappings inside free blocks (from the largest
//! runs, any stream's, whose owner's work on them has completed) are unmapped and mapped where the
//! miss needs them: only as many as the miss lacks, from the end of a run, so that the rest stays
//! mapped for its owner (the driver's cost is per mapping); a free block keeps what lies outside
//! them. The driver calls of a miss (map, unmap) run without the core's locks: the pages they
//! change are held out of every list meanwhile, so other threads' frees and hits never wait for
//! another thread's driver call. A miss whose pages fit the reserve's budget together with what
//! other misses are about to map maps at once; misses that would take it past the budget decide
//! one at a time (what to borrow or unmap, each counting what the ones before it are about to
//! map) and then map at once. Unmapped pages stay the cache's
//! memory, kept by the backend ([`Pages::unmap`]) and counted in the reserve: the miss that
//! unmapped them maps them again, so memory moving between sizes costs an unmap and a map, never
//! new memory. A miss never blocks on another stream's work: where no fence has completed it maps
//! new pages. The slack spares a workload whose live bytes climb a step at a time (a training run
//! meeting longer sequences) an unmap and a later map at every step. `empty_cache` (and out of
//! memory) waits for every stream's work, unmaps every free page, gives the kept pages back to the
//! device ([`Pages::release_kept`]) and gives back ranges with nothing mapped.
//! Without pages (or with [`Config::expandable_segments`] off) the cache works as below.
//!
//! **Segments.** Classes up to `small_max` (1 MiB) are carved from small segments, larger ones
//! from large segments (20 MiB), and classes from `own_segment_from` (10 MiB) up get a segment
//! of their own rounded to `granularity`; all of it is a [`Config`]. Small segments are a
//! thirty-second of the small pool's reserve (a power of two, up to 2 MiB, at least the request),
//! so a cache of a few megabytes grows in steps its size. A block is the best fit of its
//! stream's free blocks in its pool, split on the way out; a freed block merges with free
//! neighbours, and a segment that is one free block again is idle: it can be released
//! ([`CachingAllocator::empty_cache`], or on out of memory) or given to another stream.
//!
//! **Reserve.** Two rules keep the reserve close to what is in use, measured by replaying a
//! serving log and the stress example's log over the fake backend (the tests assert peak
//! reserved within 1.15 times peak requested). A free block larger than its pool's segments
//! (once a segment of its own) serves only requests close to its size (a long-lived small block
//! cut from it would strand the rest); and a miss that would take the reserve above its highest
//! figure so far first releases idle segments, after their last use (`cudaFree` waits for the
//! device anyway). Below the high-water mark idle segments stay cached: misses there cost a
//! `cudaMalloc` but no `cudaFree`. Neither rule touches the front caches' hot path.
//!
//! **Streams.** Every segment belongs to one stream, with all its free blocks. A block freed on
//! its stream is reusable on that stream at once: the caller guarantees that its uses are
//! ordered before later work there ([`CachingAllocator::free`]). Memory moves to another stream
//! as a lent block or an idle segment (a whole segment changes owner), and only after a fence
//! recorded on the owner after the block's return (or while the segment was idle) has completed
//! (checked without blocking), or, when [`Config::cross_stream_waits`] allows, after the new
//! stream was made to wait for that fence on the device. Lent blocks come back through a fence
//! on the stream they were freed on, like blocks freed on a foreign stream. Either way all work that used
//! the memory comes before the new stream's work: the fence follows every use, because every use
//! was ordered on the owner before its block was freed. Completed fences are preferred (no
//! dependency between streams); the device-side wait is there because the alternative, growing,
//! costs memory and a `cudaMalloc` that is slower than `cudaStreamWaitEvent`, and the driver's
//! own pools make the same choice by default. A block freed on a foreign stream
//! ([`CachingAllocator::free_on`]) gets a fence on that stream and rejoins its segment when the
//! fence completes. Segments are released only after a fence on their owner has completed. The
//! core keeps a clone of the [`Backend::Stream`] handle of every stream it holds memory or a
//! fence of, taken off the hot path, so a stream cannot be destroyed and its handle's value
//! reused by a new stream while blocks freed on it are cached; blocks and front caches name
//! streams by [`StreamKey`] only.
//!
//! **Front caches.** Each thread keeps, per allocator, up to `front_depth` freed blocks per
//! (stream, class) of up to `front_max_block` bytes, and one larger block it freed (the first
//! since its slot last emptied) until its next miss (`front_large_slot`), `front_max_bytes` in all, behind a lock that only that thread takes on
//! the hot path: an allocation after a free of its class on its stream locks no shared state,
//! allocates nothing and touches only that thread's counters. The shared core is sharded by
//! stream: a stream's segments, blocks and pending frees live in one of sixteen shards, each
//! under its own mutex, taken on misses and overflows, so threads with streams of their own do
//! not contend there either. Only the reserve's totals are shared (atomics, written when a
//! segment is allocated or released). A miss in its shard first returns the calling thread's
//! parked blocks, then everyone's; adoption looks for idle segments in every shard (completed
//! fences first), and releases on a miss take the largest idle segments of all shards. The allocator keeps every thread's cache in a registry, so
//! `empty_cache`, growth and out-of-memory retries return all parked blocks to the core first;
//! a thread's exit returns its blocks through its thread-local destructor. A block may be freed
//! on any thread: it parks in the freeing thread's cache under its own stream and class.
//!
//! **Soundness.** A block is in one place at a time: the core (free, or pending a fence), a
//! user's [`CachedBlock`] (neither `Clone` nor `Copy`, given back by value), or one front cache's
//! bin. A lent block stays in its owner's shard, marked lent to its borrower; its handle and its
//! front-cache entry name that shard, and only the borrower's stream reuses it before its fence. A shard changes under its mutex and a bin under its thread's lock; a block on its way
//! between a bin and the core is held by the moving thread alone, so no block is handed out
//! twice. Only idle segments (all of it one free block in the core) are released, under the
//! shard's mutex, so no released memory is out. A segment moves between shards only while idle
//! (taken out of one shard under its lock, added to the other under its lock), so a block out
//! always lies in the shard of its own stream, where its return is routed. `empty_cache` racing
//! with other threads' calls at worst misses a block on its way to the core, which then stays
//! cached. Locks nest in one order only: the registry of front caches, then one front cache or
//! one shard; a front cache and a shard, or two shards, are never held together, and the hot
//! path takes its front cache's lock alone.
//!
//! **Private pools.** [`PrivatePool`] is an allocator of its own whose blocks only one owner's
//! work uses (graphs of one private pool, which take turns); its segments are never released
//! while it lives, nor seen by any other allocator (see its module).
//!
//! **Out of memory.** When the backend refuses a segment or pages, every front cache is returned,
//! pending blocks are waited for, every idle segment is released, every free page unmapped, and
//! the allocation is tried once more;
//! if that fails too the error is [`Error::OutOfMemory`] with the cache's [`CachingStats`].

#[cfg(test)]
mod adversarial_tests;
mod allocator;
mod arena;
mod backend;
mod block;
mod config;
mod core;
#[cfg(test)]
mod corpus_tests;
mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
mod front;
mod growable;
#[cfg(test)]
mod growable_tests;
#[cfg(test)]
mod map_ahead_tests;
pub mod pinned;
mod private_pool;
#[cfg(test)]
mod private_pool_tests;
pub mod size_class;
mod size_steps;
#[cfg(test)]
mod sleep_tests;
mod stats;
#[cfg(test)]
mod tests;
mod thread_cache;

pub use allocator::CachingAllocator;
pub use backend::{Backend, Keep, Mapped, MappingPlan, Pages, StreamKey};
pub use block::CachedBlock;
pub use config::Config;
pub use error::{BackendError, Error, Result};
pub use private_pool::{PoolOrder, PrivatePool, SegmentSource};
pub use stats::{CachingStats, ClassStats, CurrentPeak};

/// The error of a request whose class or segment would not fit in `usize`.
#[cold]
fn size_overflow<E>(bytes: usize) -> Error<E> {
    Error::SizeOverflow { bytes }
}
