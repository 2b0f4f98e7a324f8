//! `CachingAllocator`: the front caches, the core, and the paths between them.

use super::arena::BlockId;
use super::backend::{Backend, Keep, Pages, StreamKey};
use super::block::CachedBlock;
use super::config::{Config, Pool};
use super::core::{Ahead, Core, CoreFigures, On, Totals, unmap_claimed};
use super::front::{BinKey, ENTRIES, FrontLimits, Parked, ThreadCache, ThreadTotals};
use super::size_class::{SizeClass, class_of};
use super::stats::{CachingStats, ClassStats, CurrentPeak};
use crate::thread_cache::{self, FrontCache, Registered, ThreadExit};
use crate::{Error, Result};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A caching allocator of device memory over a [`Backend`]. Cloning shares it.
///
/// Blocks are reused on the stream they were freed on at once; a freed block goes first to the
/// calling thread's front cache (no shared lock), and to the shared core when that is full or on
/// a miss. See the module documentation for the design.
pub struct CachingAllocator<B: Backend> {
    shared: Arc<Shared<B>>,
}

impl<B: Backend> Clone for CachingAllocator<B> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<B: Backend> fmt::Debug for CachingAllocator<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

struct Shared<B: Backend> {
    id: u64,
    backend: B,
    config: Config,
    limits: FrontLimits,
    /// The core, sharded by stream: a stream's segments, blocks and fences live in one shard,
    /// so threads that work on different streams take different locks on their misses.
    shards: Box<[Mutex<Core<B>>]>,
    totals: Totals,
    threads: Mutex<Registry>,
    /// Set while the cache sleeps: allocations are refused (their memory is not mapped).
    asleep: AtomicBool,
    /// Held by a sleep or a wake, so that one runs at a time.
    sleeping: Mutex<()>,
    /// Held by a miss over pages that would take the reserve past its budget while it decides
    /// (the block it borrows, the pages it unmaps): such misses decide one at a time, each
    /// counting what the misses before it decided to map and have not mapped yet
    /// ([`Totals::begin_miss`]), and then map at once. A miss within the budget
    /// ([`Totals::begin_miss_within`]), frees, hits and every other use of the core never take it.
    deciding: Mutex<()>,
}

/// Shards of the core: enough that a few dozen streams rarely share one.
const SHARDS: usize = 16;

/// The shard of `stream` (Fibonacci hashing: stream handles are addresses, alike in their low
/// bits).
#[inline]
pub(super) fn shard_of(stream: StreamKey) -> usize {
    ((stream.0 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARDS.trailing_zeros())) as usize
}

/// A block taken from the core, and whether it was lent (by a stream of which shard).
struct Taken {
    id: BlockId,
    ptr: NonNull<u8>,
    lent: Option<u8>,
}

impl Taken {
    /// Block `id` of `core`, the requesting stream's own.
    fn own<B: Backend>(core: &Core<B>, id: BlockId) -> Self {
        Self { id, ptr: core.arena().ptr(id), lent: None }
    }
}

const _: () = assert!(SHARDS <= u8::MAX as usize, "a shard's index fits a lent block's handle");

/// Every thread's front cache, and the figures of threads that exited (or had no cache).
type Registry = thread_cache::Registry<ThreadCache, ThreadTotals>;

/// A panic under these locks can only come from a broken invariant (a bug) or a panicking
/// backend, which is called where the bookkeeping is consistent; either way the state is usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B: Backend> CachingAllocator<B> {
    /// An empty cache over `backend`. Makes no backend call.
    pub fn new(backend: B, config: Config) -> Result<Self, B::Error> {
        config.check().map_err(Error::InvalidConfig)?;
        let limits = FrontLimits {
            depth: config.front_depth,
            max_bytes: config.front_max_bytes,
            max_block: config.front_max_block,
            large_slot: config.front_large_slot,
        };
        let shared = Shared {
            id: thread_cache::next_owner_id(),
            backend,
            config,
            limits,
            shards: (0..SHARDS).map(|_| Mutex::new(Core::new())).collect(),
            totals: Totals::default(),
            threads: Mutex::new(Registry::default()),
            asleep: AtomicBool::new(false),
            sleeping: Mutex::new(()),
            deciding: Mutex::new(()),
        };
        Ok(Self { shared: Arc::new(shared) })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// The parameters.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The bytes of a page when the allocator grows growable segments ([`Config::expandable_segments`]
    /// over a backend with [`Pages`]), else `None`.
    pub fn page_bytes(&self) -> Option<usize> {
        self.shared.pages().map(|pages| pages.page_bytes())
    }

    /// A block of at least `bytes` for use on `stream`: from this thread's front cache, else from
    /// the core (growing it by a segment if needed). Out of memory is
    /// [`Error::OutOfMemory`] after the cache has released everything it held and tried again;
    /// its report carries the cache's figures.
    #[inline]
    pub fn alloc(&self, bytes: usize, stream: &B::Stream) -> Result<CachedBlock, B::Error> {
        let Some(class) = class_of(bytes) else {
            return Err(super::size_overflow(bytes));
        };
        let shared = &*self.shared;
        if shared.asleep.load(Ordering::Acquire) {
            return Err(Error::SleepState("an allocation from a sleeping cache: wake it first"));
        }
        let key = BinKey { stream: B::key(stream), class: class.index() };
        let hit = thread_cache::with_cache(
            &ENTRIES,
            shared.id,
            || self.register(),
            |cache| cache.take(key, class.bytes(), bytes, shared.limits),
        );
        match hit {
            Some(Some(parked)) => {
                Ok(shared.handle(Taken { id: parked.id, ptr: parked.ptr, lent: parked.lent }, class, bytes, key.stream))
            }
            _ => self.alloc_slow(class, bytes, stream),
        }
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, class: SizeClass, requested: usize, stream: &B::Stream) -> Result<CachedBlock, B::Error> {
        let shared = &*self.shared;
        let key = BinKey { stream: B::key(stream), class: class.index() };
        let large = thread_cache::with_existing(&ENTRIES, shared.id, |cache| cache.take_large_for_core()).flatten();
        if let Some(parked) = large {
            shared.give_back(parked);
        }
        let taken = shared.take_from_core(stream, class)?;
        let counted = thread_cache::with_cache(
            &ENTRIES,
            shared.id,
            || self.register(),
            |cache| cache.note_alloc(key, class.bytes(), requested, shared.limits),
        );
        if counted.is_none() {
            shared.count_without_cache(key, class.bytes(), requested, true);
        }
        Ok(shared.handle(taken, class, requested, key.stream))
    }

    /// Returns `block` for reuse on its own stream, at once.
    ///
    /// # Safety
    /// `block` came from this allocator, and every use of its memory is ordered before the work
    /// queued on `block.stream()` after this call (a use on another stream is, once the block's
    /// stream was made to wait for it, e.g. with `cudaStreamWaitEvent`; otherwise use
    /// [`CachingAllocator::free_on`]).
    #[inline]
    pub unsafe fn free(&self, block: CachedBlock) {
        let shared = &*self.shared;
        if block.allocator != shared.id {
            return foreign_block(block);
        }
        let key = BinKey { stream: block.stream, class: block.class.index() };
        let (bytes, requested) = (block.bytes(), block.requested);
        let parked = block.parked();
        let rejected = thread_cache::with_cache(
            &ENTRIES,
            shared.id,
            || self.register(),
            |cache| cache.put(key, parked, bytes, requested, shared.limits),
        );
        match rejected {
            Some(None) => {}
            Some(Some(parked)) => shared.give_back(parked),
            None => {
                shared.count_without_cache(key, bytes, requested, false);
                shared.give_back(block.parked());
            }
        }
    }

    /// Returns `block`, last used on `stream`: reusable once the work queued on `stream` so far
    /// has completed (a fence recorded there now). Freeing on the block's own stream is
    /// [`CachingAllocator::free`].
    ///
    /// If no fence can be recorded, the error is returned and the block stays allocated for
    /// good: it cannot be known when the stream's work ends.
    ///
    /// # Safety
    /// `block` came from this allocator, and every use of its memory is ordered before the work
    /// queued on `stream` after this call.
    pub unsafe fn free_on(&self, block: CachedBlock, stream: &B::Stream) -> Result<(), B::Error> {
        let on = On { key: B::key(stream), stream };
        if on.key == block.stream && block.lent.is_none() {
            // SAFETY: the caller's guarantee, for the block's own stream.
            unsafe { self.free(block) };
            return Ok(());
        }
        let shared = &*self.shared;
        if block.allocator != shared.id {
            foreign_block(block);
            return Ok(());
        }
        if let Some(shard) = block.lent {
            return shared.try_return_lent(block, shard, on);
        }
        {
            let mut core = shared.shard(block.stream);
            if !core.arena().is_out_at(block.id, block.ptr) {
                debug_assert!(false, "{block:?} is not out of this allocator");
                return Ok(());
            }
            core.free_pending(&shared.backend, block.id, on)?;
        }
        let key = BinKey { stream: block.stream, class: block.class.index() };
        let (bytes, requested) = (block.bytes(), block.requested);
        let counted = thread_cache::with_cache(
            &ENTRIES,
            shared.id,
            || self.register(),
            |cache| cache.note_free(key, bytes, requested, shared.limits),
        );
        if counted.is_none() {
            shared.count_without_cache(key, bytes, requested, false);
        }
        Ok(())
    }

    /// Returns this thread's front cache to the core.
    pub fn flush_thread(&self) {
        self.shared.flush_this_thread();
    }

    /// Releases every cached segment to the backend: all threads' front caches are returned to
    /// the core first, then every segment none of whose blocks is out is released. Blocks the
    /// calling thread until the last work on those segments (and on blocks freed on other
    /// streams) has completed. Returns the bytes released: none while the cache sleeps (its
    /// memory is given back already).
    pub fn empty_cache(&self) -> usize {
        self.shared.flush_all();
        self.shared.release_all()
    }

    /// Puts the cache to sleep: returns its free memory to the device (as
    /// [`empty_cache`](Self::empty_cache)), waits for the work queued so far on every stream it
    /// holds memory of, then gives back the memory behind the blocks still allocated too, keeping
    /// their addresses reserved and, with [`Keep::Contents`], their bytes in host memory
    /// ([`Pages::evict`]). Until [`wake`](Self::wake), allocations are refused with
    /// [`Error::SleepState`]. Returns the bytes the blocks still allocated gave back.
    ///
    /// Refused with [`Error::SleepState`] when the cache sleeps already, and with
    /// [`Error::Refused`] without [`Pages`] (segments from `cudaMalloc` cannot keep their
    /// addresses). A backend error leaves the cache awake with every block as it was.
    ///
    /// # Safety
    /// From this call until `wake` returns `Ok`, no work uses the memory of any block allocated
    /// from the cache, no block is freed, and no allocation is in progress when the call starts;
    /// work queued before this call on the streams of the cache's blocks is waited for here,
    /// work queued elsewhere must have completed.
    pub unsafe fn sleep(&self, keep: Keep) -> Result<usize, B::Error> {
        let shared = &*self.shared;
        let _one = lock(&shared.sleeping);
        if shared.asleep.load(Ordering::Acquire) {
            return Err(Error::SleepState("a sleep of a sleeping cache"));
        }
        let Some(pages) = shared.pages() else {
            return Err(Error::Refused("sleep needs pages: this cache's segments come from cudaMalloc"));
        };
        // Allocations are refused from here on, so that none maps pages the eviction would take.
        shared.asleep.store(true, Ordering::Release);
        let slept = (|| {
            shared.flush_all();
            shared.release_cached_memory();
            for shard in shared.shards.iter() {
                lock(shard).wait_for_streams(&shared.backend)?;
            }
            // SAFETY: the caller's contract: nothing uses the blocks until the wake, and the
            // cache makes no map or unmap call while asleep (allocations are refused, frees are
            // not made).
            unsafe { pages.evict(keep) }.map_err(Error::Backend)
        })();
        match slept {
            Ok(bytes) => shared.totals.slept(bytes),
            Err(_) => shared.asleep.store(false, Ordering::Release),
        }
        slept
    }

    /// Wakes a sleeping cache: new memory at the addresses of its blocks, with their bytes when
    /// the sleep kept them ([`Pages::restore`]); allocations work again. Returns the bytes mapped.
    /// Out of memory is [`Error::OutOfMemory`] with the cache's figures, and leaves the cache
    /// asleep with everything it kept: the wake can be tried again. Refused with
    /// [`Error::SleepState`] when the cache is awake.
    pub fn wake(&self) -> Result<usize, B::Error> {
        let shared = &*self.shared;
        let _one = lock(&shared.sleeping);
        if !shared.asleep.load(Ordering::Acquire) {
            return Err(Error::SleepState("a wake of an awake cache"));
        }
        let pages = shared.pages().expect("a sleeping cache has pages");
        let bytes = pages.restore().map_err(|err| Error::Backend(err).with_stats(|| shared.stats()))?;
        shared.totals.woke(bytes);
        shared.asleep.store(false, Ordering::Release);
        Ok(bytes)
    }

    /// True while the cache sleeps ([`CachingAllocator::sleep`]).
    pub fn is_asleep(&self) -> bool {
        self.shared.asleep.load(Ordering::Acquire)
    }

    /// The allocator's figures. Locks every thread's front cache in turn, then the core.
    pub fn stats(&self) -> CachingStats {
        self.shared.stats()
    }

    /// Restarts every peak of [`CachingAllocator::stats`] from its current value (each thread's
    /// peaks from that thread's current figures, whose sum the allocated peak reads).
    pub fn reset_peaks(&self) {
        {
            let mut registry = self.shared.threads();
            registry.retired.counters.reset_peaks();
            for cache in &registry.caches {
                cache.reset_peaks();
            }
        }
        for shard in self.shared.shards.iter() {
            lock(shard).figures.active.reset_peak();
        }
        self.shared.totals.reset_peak();
    }

    /// Every segment the allocator holds, as (address, bytes), in no particular order.
    pub fn segment_ranges(&self) -> Vec<(usize, usize)> {
        self.shared.shards.iter().flat_map(|shard| lock(shard).arena().segment_ranges()).collect()
    }

    /// Counts per size class, smallest class first (classes never allocated are left out).
    pub fn class_stats(&self) -> Vec<ClassStats> {
        let totals = self.shared.thread_totals();
        let mut classes: Vec<ClassStats> = totals
            .classes
            .iter()
            .map(|(&index, counts)| ClassStats {
                bytes: SizeClass::from_index(index).map_or(0, SizeClass::bytes),
                allocations: counts.allocations,
                frees: counts.frees,
                front_hits: counts.front_hits,
            })
            .collect();
        classes.sort_by_key(|c| c.bytes);
        classes
    }

    /// Holds the lock under which misses that move memory decide, until the guard drops.
    #[cfg(test)]
    pub(super) fn hold_deciding(&self) -> MutexGuard<'_, ()> {
        lock(&self.shared.deciding)
    }

    /// Panics if the core's bookkeeping is inconsistent.
    #[cfg(any(test, feature = "fake"))]
    pub fn check_invariants(&self) {
        let mut reserved = 0;
        for (index, shard) in self.shared.shards.iter().enumerate() {
            let core = lock(shard);
            core.check();
            reserved += core.figures.reserved + core.figures.unmapping;
            assert!(core.arena().segment_owners().all(|s| shard_of(s) == index), "segments in their owner's shard");
        }
        let (kept, asleep) = (self.shared.totals.kept(), self.shared.totals.asleep());
        assert_eq!(
            reserved + kept,
            self.shared.totals.reserved().current + asleep,
            "the shards' reserves (pages being unmapped included) and kept pages add up (with what a sleep gave back)"
        );
    }

    /// Bytes taken from the device now and at the peak, as in [`stats`](Self::stats), from two
    /// atomic loads: no lock, so a program may watch the reserve on its hot path.
    pub fn reserved(&self) -> CurrentPeak {
        self.shared.totals.reserved()
    }

    /// Bytes in free blocks of every shard, and how many of them fill whole pages of `page`
    /// bytes (which could be unmapped; the rest share their pages with blocks in use).
    #[cfg(test)]
    pub(super) fn free_in_pages(&self, page: usize) -> (usize, usize) {
        let (mut free, mut whole) = (0, 0);
        for shard in self.shared.shards.iter() {
            let (shard_free, shard_whole) = lock(shard).arena().free_in_pages(page);
            free += shard_free;
            whole += shard_whole;
        }
        (free, whole)
    }

    /// Keys of the streams the allocator holds a handle of.
    #[cfg(any(test, feature = "fake"))]
    pub fn held_streams(&self) -> Vec<StreamKey> {
        let mut keys: Vec<StreamKey> = self.shared.shards.iter().flat_map(|shard| lock(shard).held_streams()).collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Holds every shard's lock (to prove that a path does not need them).
    #[cfg(test)]
    pub(super) fn hold_core(&self) -> impl Drop + '_ {
        self.shared.shards.iter().map(lock).collect::<Vec<_>>()
    }

    fn register(&self) -> Registered<ThreadCache> {
        thread_cache::register(&self.shared, &self.shared.threads, ThreadCache::new())
    }
}

impl<B: Backend> Shared<B> {
    /// The backend's pages, when the allocator grows growable segments.
    fn pages(&self) -> Option<&dyn Pages<Error = B::Error>> {
        self.backend.pages().filter(|_| self.config.expandable_segments)
    }

    fn shard(&self, stream: StreamKey) -> MutexGuard<'_, Core<B>> {
        lock(&self.shards[shard_of(stream)])
    }

    /// Releases every shard's idle segments and free pages (each shard's lock in turn), then the
    /// pages the backend keeps; returns the bytes given back to the device. Nothing while the
    /// cache sleeps: its memory is given back already, and no page may be unmapped until the
    /// wake (`Pages::evict`).
    fn release_all(&self) -> usize {
        if self.asleep.load(Ordering::Acquire) { 0 } else { self.release_cached_memory() }
    }

    /// What `release_all` does, whatever the sleep state (a sleep calls it before evicting).
    fn release_cached_memory(&self) -> usize {
        let released: usize =
            self.shards.iter().map(|shard| lock(shard).release_cached(&self.backend, &self.totals)).sum();
        released + self.release_kept()
    }

    /// Gives the pages the backend keeps back to the device; returns their bytes.
    fn release_kept(&self) -> usize {
        let Some(pages) = self.backend.pages() else { return 0 };
        let released = pages.release_kept();
        self.totals.released_kept(released);
        released
    }

    fn threads(&self) -> MutexGuard<'_, Registry> {
        lock(&self.threads)
    }

    #[inline]
    fn handle(&self, taken: Taken, class: SizeClass, requested: usize, stream: StreamKey) -> CachedBlock {
        let Taken { id, ptr, lent } = taken;
        CachedBlock { ptr, requested, class, stream, id, lent, allocator: self.id }
    }

    /// Takes back `block`, lent by a stream of shard `shard`, freed on `on` (`free_on`), and
    /// counts the free; a block the shard did not lend to its stream is leaked
    /// rather than trusted (a broken `free` contract).
    fn try_return_lent(&self, block: CachedBlock, shard: u8, on: On<'_, B::Stream>) -> Result<(), B::Error> {
        {
            let mut core = lock(&self.shards[usize::from(shard)]);
            if !core.is_lent_to(block.id, block.ptr, block.stream) {
                debug_assert!(false, "{block:?} is not lent by this allocator");
                return Ok(());
            }
            core.return_lent(&self.backend, block.id, Some(on))?;
        }
        let key = BinKey { stream: block.stream, class: block.class.index() };
        let (bytes, requested) = (block.bytes(), block.requested);
        let counted =
            thread_cache::with_existing(&ENTRIES, self.id, |cache| cache.note_free(key, bytes, requested, self.limits));
        if counted.is_none() {
            self.count_without_cache(key, bytes, requested, false);
        }
        Ok(())
    }

    /// A block from the core: the stream's free blocks; else, after every front cache is
    /// returned (parked blocks may be what is missing), a lent block, adoption or growth; on out
    /// of memory, once more after releasing everything cached.
    fn take_from_core(&self, stream: &B::Stream, class: SizeClass) -> Result<Taken, B::Error> {
        let on = On { key: B::key(stream), stream };
        let cached = || {
            let mut core = self.shard(on.key);
            let id = core.take_cached(&self.backend, &self.config, &self.totals, on.key, class)?;
            Some(Taken::own(&core, id))
        };
        if let Some(found) = cached() {
            return Ok(found);
        }
        // This thread's parked blocks first (other threads keep theirs, and their hits); then
        // everyone's, before adoption or growth.
        self.flush_this_thread();
        if let Some(found) = cached() {
            return Ok(found);
        }
        self.flush_all();
        match self.take_or_grow(&on, class) {
            Err(err) if err.is_out_of_memory() => {}
            other => return other,
        }
        self.flush_all();
        self.shard(on.key).figures.oom_retries += 1;
        self.release_all();
        self.take_or_grow(&on, class).map_err(|err| err.with_stats(|| self.stats()))
    }

    /// A block for `on`: from its shard (its free blocks, or an idle segment of a stream of the
    /// shard); else an idle segment of another shard's stream, or a free block of another
    /// stream lent; else a new segment, after idle segments anywhere were released if growing
    /// would raise the reserve's peak. One shard's lock at a time: no lock order between shards
    /// to keep.
    ///
    /// First every shard's blocks pending a fence that has completed (lent blocks returned,
    /// frees on other streams) become free: a shard polls its own only when its streams come to
    /// the core, so on many streams they would otherwise sit out of reach, counted as active,
    /// which both hides them from this miss and raises the budget it grows under.
    fn take_or_grow(&self, on: &On<'_, B::Stream>, class: SizeClass) -> Result<Taken, B::Error> {
        let (backend, config, totals) = (&self.backend, &self.config, &self.totals);
        let home = shard_of(on.key);
        self.poll_all_pending();
        if let Some(pages) = self.pages() {
            return self.take_or_map(pages, on, class);
        }
        let others = || self.shards.iter().enumerate().filter(move |&(i, _)| i != home).map(|(_, shard)| shard);
        // Memory whose last use is known to be complete first, anywhere; then memory `on` waits
        // for on the device. Whole idle segments before lent blocks: they change owner for good.
        for wait in [false, true] {
            {
                let mut core = lock(&self.shards[home]);
                if let Some(id) = core.take_local(backend, config, totals, on, class, wait) {
                    return Ok(Taken::own(&core, id));
                }
            }
            for shard in others() {
                let detached = lock(shard).detach_adoptable(backend, config, totals, on, class, wait);
                if let Some(detached) = detached {
                    let mut core = lock(&self.shards[home]);
                    let id = core.attach(detached, on, class);
                    return Ok(Taken::own(&core, id));
                }
            }
            if let Some(taken) = self.borrow(on, class, wait) {
                return Ok(taken);
            }
        }
        let bytes = Core::<B>::segment_bytes(config, totals, class)?;
        if config.release_idle_on_miss {
            // Only what would raise the high-water mark: below it, cached segments cost no more
            // than the peak already did, and keeping them saves `cudaFree`s and later misses.
            // Waiting for a segment's last use costs nothing `cudaFree` would not: it waits for
            // the whole device. (`live_slack_percent` is for pages: over whole segments it
            // raised the training workload's reserve and spared no miss.)
            let over = totals.over_budget(bytes, 0);
            if over > 0 {
                self.release_largest(over);
            }
        }
        let mut core = lock(&self.shards[home]);
        if let Some(id) = core.take_cached(backend, config, totals, on.key, class) {
            return Ok(Taken::own(&core, id));
        }
        core.grow(backend, config, totals, on, class, bytes).map(|id| Taken::own(&core, id))
    }

    /// A block for `on` from its growable segment: new pages, after free pages anywhere were
    /// unmapped if mapping would raise the reserve's peak. Memory moves between streams as lent
    /// blocks first: a request that would raise the peak borrows a free block of another stream
    /// (waited for on the device if need be) rather than have pages unmapped elsewhere and
    /// mapped here. Below the peak a miss maps pages of its own stream: lending there cost more
    /// time than it saved on the mixed and serving workloads
    /// (docs/measurements/2026-12-06-h100-lending-rules.txt). A stream's own free blocks are
    /// reused in its order without any call.
    fn take_or_map(
        &self,
        pages: &dyn Pages<Error = B::Error>,
        on: &On<'_, B::Stream>,
        class: SizeClass,
    ) -> Result<Taken, B::Error> {
        let (backend, config, totals) = (&self.backend, &self.config, &self.totals);
        let home = shard_of(on.key);
        let needed = |core: &Core<B>| core.pages_to_map(config, pages, on.key, class);
        let (bytes, _) = needed(&lock(&self.shards[home]));
        let budget = config.live_budget(self.active() + class.bytes());
        // Below the reserve's peak a large miss maps ahead for the stream's next ones.
        let ahead = match config.pool_of(class) {
            Pool::Large | Pool::Huge => Ahead { most: config.map_ahead_bytes, page: pages.page_bytes() },
            Pool::Small => Ahead::NONE,
        };
        // A miss that fits the budget with what the others are about to map maps at once;
        // only misses that would move memory (borrow, trim) decide in order.
        let in_flight = match totals.begin_miss_within(bytes, ahead, budget) {
            Some(in_flight) => in_flight,
            None => {
                let _deciding = lock(&self.deciding);
                // Misses before it may have mapped, trimmed or freed meanwhile: decide on now.
                let (bytes, keep) = needed(&lock(&self.shards[home]));
                let budget = config.live_budget(self.active() + class.bytes());
                let (in_flight, others) = totals.begin_miss(bytes);
                // Kept pages map without growing the reserve; what other misses are about to
                // map will.
                let over = totals.over_budget(bytes.saturating_add(others).saturating_sub(totals.kept()), budget);
                let moving = config.release_idle_on_miss && over > 0;
                if moving && let Some(taken) = self.borrow(on, class, true) {
                    return Ok(taken);
                }
                if moving {
                    self.trim_largest(pages, over, (home, keep));
                }
                in_flight
            }
        };
        let mut extra = in_flight.ahead();
        // The maps run without any lock, so that the stream's other threads and the shard's
        // other streams (their frees, their hits in the core) and other misses' maps never wait
        // for them. A free block the mapping extends may be taken meanwhile (by a hit of another
        // thread on the stream): then the mapped pages stay the stream's, and the miss maps
        // again.
        loop {
            let claim = {
                let mut core = lock(&self.shards[home]);
                if let Some(id) = core.take_cached(backend, config, totals, on.key, class) {
                    return Ok(Taken::own(&core, id));
                }
                core.claim_pages(pages, config, on, class, extra)?
            };
            // SAFETY: the claim's `room` bytes are unmapped pages of a range from `reserve`,
            // which no other call maps, unmaps or frees until `finish_map` (see `MapClaim`).
            let mapped = unsafe { pages.map(claim.at, claim.bytes(), claim.room, claim.max_new) };
            let mut core = lock(&self.shards[home]);
            match core.finish_map(config, totals, on, class, claim, mapped) {
                Ok(Some(id)) => return Ok(Taken::own(&core, id)),
                // The extra is mapped (the stream's free memory now): a map again is the
                // request's alone, within what was admitted.
                Ok(None) => extra = 0,
                // What the device lacks may be the extra alone: the request maps by itself.
                Err(err) if err.is_out_of_memory() && extra > 0 => extra = 0,
                Err(err) => return Err(err),
            }
        }
    }

    /// A free block of another stream lent to `on`: one whose owner's work on it is known to
    /// be complete, else, when `wait`, one that `on` waits for on the device; the shards with
    /// the smallest fitting blocks first, so that lending cuts large free blocks last. One
    /// shard's lock at a time.
    fn borrow(&self, on: &On<'_, B::Stream>, class: SizeClass, wait: bool) -> Option<Taken> {
        let mut order: Vec<(usize, usize)> = (self.shards.iter().enumerate())
            .filter_map(|(index, shard)| {
                Some((lock(shard).smallest_lendable(&self.config, &self.totals, on.key, class)?, index))
            })
            .collect();
        if order.is_empty() {
            return None;
        }
        order.sort_unstable();
        for wait in if wait { &[false, true][..] } else { &[false][..] } {
            for &(_, index) in &order {
                let mut core = lock(&self.shards[index]);
                if let Some(id) = core.lend(&self.backend, &self.config, &self.totals, on, class, *wait) {
                    let ptr = core.arena().ptr(id);
                    return Some(Taken { id, ptr, lent: Some(index as u8) });
                }
            }
        }
        None
    }

    /// Returns every shard's pending blocks whose fences have completed, so that a miss sees
    /// them free (and out of the budget) before it maps. One shard's lock at a time.
    fn poll_all_pending(&self) {
        for shard in self.shards.iter() {
            lock(shard).poll_pending(&self.backend);
        }
    }

    /// Bytes out of the core now: in users' hands, parked in front caches, or pending a fence.
    /// Every shard's lock in turn; only on misses, which call the backend anyway.
    fn active(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).figures.active.current).sum()
    }

    /// Unmaps free pages, from the shards with the largest runs first, until `enough` bytes are
    /// unmapped (or none is left that can be), keeping the free block `keep.1` of shard `keep.0`.
    /// One shard's lock at a time, and none across the unmaps.
    fn trim_largest(
        &self,
        pages: &dyn Pages<Error = B::Error>,
        enough: usize,
        keep: (usize, Option<BlockId>),
    ) -> usize {
        let mut order: Vec<(usize, usize)> =
            self.shards.iter().enumerate().map(|(i, shard)| (lock(shard).largest_trimmable(), i)).collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        let mut unmapped = 0;
        for (largest, index) in order {
            if unmapped >= enough || largest == 0 {
                break;
            }
            let kept = if index == keep.0 { keep.1 } else { None };
            let claimed = lock(&self.shards[index]).claim_trim(&self.backend, enough - unmapped, kept, false);
            // SAFETY: claims of `claim_trim`, not finished yet (see `UnmapClaim`); the unmaps run
            // without the shard's lock.
            unsafe { unmap_claimed(pages, &claimed) };
            unmapped += lock(&self.shards[index]).finish_trim(&self.totals, &claimed);
        }
        unmapped
    }

    /// Releases idle segments, the largest of every shard first, until `enough` bytes are
    /// released (or none is left that can be). One shard's lock at a time.
    fn release_largest(&self, enough: usize) -> usize {
        let mut keys: Vec<(Pool, usize)> = self.shards.iter().flat_map(|shard| lock(shard).idle_keys()).collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        let mut covered = 0;
        let from = keys.iter().find(|&&(_, bytes)| {
            covered += bytes;
            covered >= enough
        });
        let from = from.or(keys.last()).copied().unwrap_or((Pool::Small, 0));
        let mut released = 0;
        for shard in self.shards.iter() {
            if released >= enough {
                break;
            }
            released += lock(shard).release_idle(&self.backend, &self.totals, enough - released, from);
        }
        released
    }

    /// Returns a parked block to the core.
    fn give_back(&self, parked: Parked) {
        let mut core = lock(&self.shards[parked.shard()]);
        give_back_to(&self.backend, &mut core, parked);
    }

    /// Returns parked blocks to their shards, each shard's lock taken once.
    fn give_back_all(&self, mut parked: Vec<Parked>) {
        parked.sort_unstable_by_key(Parked::shard);
        let mut parked = parked.into_iter().peekable();
        while let Some(first) = parked.next() {
            let index = first.shard();
            let mut core = lock(&self.shards[index]);
            give_back_to(&self.backend, &mut core, first);
            while let Some(next) = parked.next_if(|p| p.shard() == index) {
                give_back_to(&self.backend, &mut core, next);
            }
        }
    }

    /// Returns this thread's front cache to the core.
    fn flush_this_thread(&self) {
        let mut parked = Vec::new();
        thread_cache::with_existing(&ENTRIES, self.id, |cache| cache.drain(&mut parked));
        self.give_back_all(parked);
    }

    /// Returns every thread's front cache to the core (under the registry's lock: see
    /// [`thread_cache::Registry::drain_all`]).
    fn flush_all(&self) {
        let registry = self.threads();
        self.give_back_all(registry.drain_all());
    }

    /// Counts an allocation or free of a thread without a front cache (at thread exit).
    #[cold]
    fn count_without_cache(&self, key: BinKey, bytes: usize, requested: usize, alloc: bool) {
        let mut registry = self.threads();
        let retired = &mut registry.retired;
        let counts = retired.classes.entry(key.class).or_default();
        if alloc {
            retired.counters.alloc(bytes, requested);
            counts.allocations += 1;
        } else {
            retired.counters.free(bytes, requested);
            counts.frees += 1;
        }
    }

    fn thread_totals(&self) -> ThreadTotals {
        let registry = self.threads();
        let mut totals = ThreadTotals::default();
        totals.counters.absorb(registry.retired.counters);
        totals.absorb_classes(&registry.retired.classes);
        for cache in &registry.caches {
            cache.read(&mut totals);
        }
        totals
    }

    fn stats(&self) -> CachingStats {
        let totals = self.thread_totals();
        let mut figures = CoreFigures::default();
        let (mut segments, mut free_bytes, mut largest_free_block, mut idle_bytes) = (0, 0, 0, 0);
        let mut trimmable_bytes = 0;
        for shard in self.shards.iter() {
            let core = lock(shard);
            figures.absorb(&core.figures);
            let (shard_segments, free, largest) = core.arena().free_figures();
            segments += shard_segments;
            free_bytes += free;
            largest_free_block = largest_free_block.max(largest);
            idle_bytes += core.arena().idle_bytes();
            trimmable_bytes += core.arena().trimmable_bytes();
        }
        let current = |net: isize| usize::try_from(net).unwrap_or(0);
        let allocated = current(totals.counters.allocated);
        // Both bound the true peak from above: one thread's peaks summed, and what was out of
        // the core (held blocks are a part of it).
        let allocated_peak = current(totals.counters.allocated_peak).min(figures.active.peak).max(allocated);
        let requested = current(totals.counters.requested);
        let requested_peak = current(totals.counters.requested_peak).min(allocated_peak).max(requested);
        CachingStats {
            allocated: CurrentPeak { current: allocated, peak: allocated_peak },
            requested: CurrentPeak { current: requested, peak: requested_peak },
            active: figures.active,
            reserved: self.totals.reserved(),
            free_bytes,
            idle_bytes,
            trimmable_bytes,
            largest_free_block,
            parked_bytes: totals.parked_bytes,
            pending_bytes: figures.pending_bytes,
            kept_bytes: self.totals.kept(),
            segments,
            segment_allocations: figures.segment_allocations,
            segment_releases: figures.segment_releases,
            front_hits: totals.front_hits,
            core_hits: figures.core_hits,
            misses: figures.misses,
            segments_adopted: figures.segments_adopted,
            stream_waits: figures.stream_waits,
            oom_retries: figures.oom_retries,
            blocks_lent: figures.blocks_lent,
        }
    }
}

/// A block given to an allocator that did not hand it out (a broken `free` contract): leaked
/// rather than cached where it does not belong.
#[cold]
fn foreign_block(block: CachedBlock) {
    debug_assert!(false, "{block:?} belongs to another allocator");
}

/// Returns a parked block to the core, if it is one the core handed out (it always is, unless a
/// caller broke `free`'s contract; then it is leaked rather than trusted).
fn give_back_to<B: Backend>(backend: &B, core: &mut Core<B>, parked: Parked) {
    if parked.lent.is_some() {
        if core.is_lent_to(parked.id, parked.ptr, parked.stream) {
            // The block's uses were ordered on its stream before its free: a fence there now
            // follows them.
            core.return_lent_or_retry(backend, parked.id);
        } else {
            debug_assert!(false, "{parked:?} is not lent by this allocator");
        }
    } else if core.arena().is_out_at(parked.id, parked.ptr) {
        core.give_back(parked.id);
    } else {
        debug_assert!(false, "{parked:?} is not out of this allocator");
    }
}

impl<B: Backend> ThreadExit<ThreadCache> for Shared<B> {
    fn thread_exit(&self, cache: &Arc<ThreadCache>) {
        let mut registry = self.threads();
        let parked = registry.retire(cache);
        self.give_back_all(parked); // under the registry's lock, as in `flush_all`
    }
}

impl<B: Backend> Drop for Shared<B> {
    fn drop(&mut self) {
        // No handle is left, so no call is in flight; threads' caches may still hold blocks.
        let parked = lock(&self.threads).drain_all();
        self.give_back_all(parked);
        // Segments with blocks still out (forgotten handles) stay allocated: leaked, never
        // released under a holder.
        self.release_all();
    }
}
