//! The caching pool's bookkeeping, independent of CUDA: per-class free lists whose blocks are
//! handed out again only when every fence (a recorded event) on them has completed, a cap on
//! cached bytes, trimming, and statistics. The CUDA pool plugs in events and `cudaFreeHost`
//! through [`Backend`]; the tests plug in plain flags and the system allocator.

use super::size_class::{NUM_CLASSES, SizeClass};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What the cache needs from the memory system.
pub trait Backend: Send + Sync {
    /// Marks the end of asynchronous work that used a block (a CUDA event).
    type Fence: Send;
    /// True when the work has completed; never blocks.
    fn is_done(&self, fence: &Self::Fence) -> bool;
    /// Blocks until the work has completed.
    fn wait(&self, fence: &Self::Fence);
    /// Returns a block's memory to the system.
    ///
    /// # Safety
    /// `ptr` came from this backend's allocation of `bytes` and is released once, with no
    /// pending work.
    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize);
}

/// A pinned block and the work that may still use it.
pub struct Block<F> {
    pub ptr: NonNull<u8>,
    pub class: SizeClass,
    pub fences: Vec<F>,
}

// SAFETY: a block is plain memory owned by exactly one holder at a time (the cache or one buffer).
unsafe impl<F: Send> Send for Block<F> {}

/// Counters of a caching pool. All figures are exact (updated under the same rules as the lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PinnedPoolStats {
    /// Bytes in cached (free) blocks.
    pub cached_bytes: usize,
    /// Bytes in blocks handed out and not yet returned.
    pub in_use_bytes: usize,
    /// Highest `in_use_bytes` seen.
    pub peak_in_use_bytes: usize,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that needed a new block from the system.
    pub misses: u64,
}

/// One size class's cached blocks, oldest first.
type FreeList<F> = Mutex<Vec<Block<F>>>;

pub struct BlockCache<B: Backend> {
    pub backend: B,
    classes: Box<[FreeList<B::Fence>]>,
    max_cached_bytes: usize,
    cached_bytes: AtomicUsize,
    in_use_bytes: AtomicUsize,
    peak_in_use_bytes: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<B: Backend> BlockCache<B> {
    pub fn new(backend: B, max_cached_bytes: usize) -> Self {
        Self {
            backend,
            classes: (0..NUM_CLASSES).map(|_| Mutex::new(Vec::new())).collect(),
            max_cached_bytes,
            cached_bytes: AtomicUsize::new(0),
            in_use_bytes: AtomicUsize::new(0),
            peak_in_use_bytes: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// A cached block of `class` whose work has completed, most recently freed first (warm in
    /// caches). Locks only that class's list.
    pub fn take(&self, class: SizeClass) -> Option<Block<B::Fence>> {
        let mut list = lock(&self.classes[class.index]);
        let backend = &self.backend;
        let position = list.iter_mut().rposition(|block| {
            block.fences.retain(|fence| !backend.is_done(fence));
            block.fences.is_empty()
        })?;
        let block = list.swap_remove(position);
        drop(list);
        self.cached_bytes.fetch_sub(class.bytes, Ordering::Relaxed);
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.note_in_use(class.bytes);
        Some(block)
    }

    /// Records a block that had to come from the system.
    pub fn note_miss(&self, class: SizeClass) {
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.note_in_use(class.bytes);
    }

    fn note_in_use(&self, bytes: usize) {
        let now = self.in_use_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_in_use_bytes.fetch_max(now, Ordering::Relaxed);
    }

    /// Takes a block back. Over the cap, cached blocks are released (waiting for their fences):
    /// first this class's oldest, then other classes from the largest down.
    pub fn put(&self, block: Block<B::Fence>) {
        let bytes = block.class.bytes;
        self.in_use_bytes.fetch_sub(bytes, Ordering::Relaxed);
        if bytes > self.max_cached_bytes {
            self.release(block);
            return;
        }
        let index = block.class.index;
        lock(&self.classes[index]).push(block);
        let cached = self.cached_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if cached > self.max_cached_bytes {
            self.shrink_to(self.max_cached_bytes, Some(index));
        }
    }

    /// Releases cached blocks until at most `target` bytes stay cached; returns bytes released.
    pub fn shrink_to(&self, target: usize, first: Option<usize>) -> usize {
        let order = first.into_iter().chain((0..NUM_CLASSES).rev());
        let mut released = 0;
        for index in order {
            while self.cached_bytes.load(Ordering::Relaxed) > target {
                // Oldest first: the front of the list was freed longest ago.
                let Some(block) = ({
                    let mut list = lock(&self.classes[index]);
                    (!list.is_empty()).then(|| list.remove(0))
                }) else {
                    break;
                };
                self.cached_bytes.fetch_sub(block.class.bytes, Ordering::Relaxed);
                released += block.class.bytes;
                self.release(block);
            }
        }
        released
    }

    fn release(&self, block: Block<B::Fence>) {
        for fence in &block.fences {
            self.backend.wait(fence);
        }
        // SAFETY: the block came from the backend, is owned here alone, and its work is done.
        unsafe { self.backend.release(block.ptr, block.class.bytes) };
    }

    pub fn stats(&self) -> PinnedPoolStats {
        PinnedPoolStats {
            cached_bytes: self.cached_bytes.load(Ordering::Relaxed),
            in_use_bytes: self.in_use_bytes.load(Ordering::Relaxed),
            peak_in_use_bytes: self.peak_in_use_bytes.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

impl<B: Backend> Drop for BlockCache<B> {
    fn drop(&mut self) {
        self.shrink_to(0, None);
    }
}

/// A poisoned list only means another thread panicked between two plain Vec operations; the
/// list itself is still consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A backend over the system allocator with fences completed by hand, for tests and fuzzing.
#[cfg(any(test, fuzzing))]
pub mod fake {
    use super::super::size_class::class_of;
    use super::*;
    use std::alloc::Layout;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// The system allocator and fences that tests complete by hand.
    #[derive(Default)]
    pub struct FakeBackend {
        /// Sizes of released blocks, in order.
        pub released: Mutex<Vec<usize>>,
        /// Fences the cache waited for (a real backend blocks until the work completes).
        pub waits: AtomicUsize,
    }

    /// Completed by setting it.
    pub type FakeFence = Arc<AtomicBool>;

    impl Backend for FakeBackend {
        type Fence = FakeFence;
        fn is_done(&self, fence: &FakeFence) -> bool {
            fence.load(Ordering::Acquire)
        }
        fn wait(&self, fence: &FakeFence) {
            // Waiting ends with the work complete.
            self.waits.fetch_add(1, Ordering::Relaxed);
            fence.store(true, Ordering::Release);
        }
        unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
            self.released.lock().unwrap().push(bytes);
            // SAFETY: allocated by `fake_block` with this layout.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), Layout::from_size_align(bytes, 4096).unwrap()) };
        }
    }

    /// A new block from the system allocator, as a miss would produce.
    pub fn fake_block(bytes: usize) -> Block<FakeFence> {
        let class = class_of(bytes).unwrap();
        // SAFETY: non-zero size, valid alignment.
        let ptr = unsafe { std::alloc::alloc(Layout::from_size_align(class.bytes, 4096).unwrap()) };
        Block { ptr: NonNull::new(ptr).unwrap(), class, fences: Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::super::size_class::class_of;
    use super::fake::{FakeBackend, FakeFence, fake_block};
    use super::*;
    use std::sync::Arc;

    fn alloc(cache: &BlockCache<FakeBackend>, bytes: usize) -> Block<FakeFence> {
        let class = class_of(bytes).unwrap();
        cache.take(class).unwrap_or_else(|| {
            cache.note_miss(class);
            fake_block(bytes)
        })
    }

    #[test]
    fn freed_blocks_are_reused_and_counted() {
        let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
        let a = alloc(&cache, 1 << 20);
        let first_ptr = a.ptr;
        assert_eq!(
            cache.stats(),
            PinnedPoolStats { in_use_bytes: 1 << 20, peak_in_use_bytes: 1 << 20, misses: 1, ..Default::default() }
        );
        cache.put(a);
        assert_eq!(cache.stats().cached_bytes, 1 << 20);
        assert_eq!(cache.stats().in_use_bytes, 0);
        let b = alloc(&cache, (1 << 20) - 5); // same class
        assert_eq!(b.ptr, first_ptr);
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.cached_bytes, stats.in_use_bytes), (1, 1, 0, 1 << 20));
        cache.put(b);
    }

    #[test]
    fn a_block_is_not_reused_while_its_fence_is_pending() {
        let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
        let mut a = alloc(&cache, 8192);
        let fence = FakeFence::default();
        a.fences.push(fence.clone());
        let a_ptr = a.ptr;
        cache.put(a);
        let b = alloc(&cache, 8192);
        assert_ne!(b.ptr, a_ptr, "reused while the DMA was in flight");
        assert_eq!(cache.stats().misses, 2);
        fence.store(true, Ordering::Release);
        let c = alloc(&cache, 8192);
        assert_eq!(c.ptr, a_ptr);
        cache.put(b);
        cache.put(c);
    }

    #[test]
    fn the_cap_releases_the_oldest_blocks_and_oversized_blocks_are_never_cached() {
        let cache = BlockCache::new(FakeBackend::default(), 3 * 4096);
        let blocks: Vec<_> = (0..5).map(|_| alloc(&cache, 4096)).collect();
        for block in blocks {
            cache.put(block);
        }
        assert_eq!(cache.stats().cached_bytes, 3 * 4096);
        assert_eq!(cache.backend.released.lock().unwrap().len(), 2);
        let big = alloc(&cache, 1 << 20);
        cache.put(big);
        assert_eq!(cache.stats().cached_bytes, 3 * 4096);
        assert_eq!(*cache.backend.released.lock().unwrap().last().unwrap(), 1 << 20);
    }

    #[test]
    fn shrinking_releases_everything_and_reports_bytes() {
        let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
        let (a, b) = (alloc(&cache, 4096), alloc(&cache, 10_000));
        let expected = a.class.bytes + b.class.bytes;
        cache.put(a);
        cache.put(b);
        assert_eq!(cache.shrink_to(0, None), expected);
        assert_eq!(cache.stats().cached_bytes, 0);
        assert_eq!(cache.backend.released.lock().unwrap().iter().sum::<usize>(), expected);
    }

    #[test]
    fn counters_are_exact_across_threads() {
        let cache = Arc::new(BlockCache::new(FakeBackend::default(), usize::MAX));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let cache = Arc::clone(&cache);
                std::thread::spawn(move || {
                    for i in 0..if cfg!(miri) { 20 } else { 500 } {
                        let block = alloc(&cache, 4096 << ((t + i) % 4));
                        cache.put(block);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let stats = cache.stats();
        assert_eq!(stats.hits + stats.misses, 8 * if cfg!(miri) { 20 } else { 500 });
        assert_eq!(stats.in_use_bytes, 0);
        assert!(stats.misses <= 8 * 4, "at most one live block per thread and class: {stats:?}");
        assert!(stats.peak_in_use_bytes <= 8 * (4096 << 3));
    }
}
