//! The caching pool's bookkeeping, independent of CUDA: per-class free lists whose blocks are
//! handed out again only when every fence (a recorded event) on them has completed, per-thread
//! front caches in front of them, a cap on cached bytes, trimming, and statistics. The CUDA pool
//! plugs in events and `cudaFreeHost` through [`PinnedBackend`]; the tests plug in plain flags and the
//! system allocator.
//!
//! **Where a free block is.** In the shared list of its class (under that class's lock), or,
//! in a pool without a cap and with no fence on it, in the front cache of the thread that freed
//! it (`front`). A block moving between a front cache and a list is held by the moving
//! thread alone, so no block is handed out twice. A pool with a cap keeps every free block in the
//! lists, where the cap is exact. A miss returns every thread's parked blocks to the lists and
//! looks once more before the caller allocates; trimming and dropping the pool return them too,
//! and a thread's exit returns its own. Locks nest in one order: the registry of front caches,
//! then one front cache or one list; a front cache and a list are never held together.
//!
//! **Counts.** Each thread counts its own calls in its front cache (a pool with a cap, or a
//! thread whose thread-locals are being torn down, counts in the pool); reading sums them.
//!
//! **Handles and leases.** A [`BlockCache`] is a handle of the pool; a buffer holds a [`Lease`],
//! which keeps the state alive without being a handle (front caches stock leases: see
//! `front`). When the last handle drops, the pool closes: every thread's front cache and
//! stock of leases is emptied, every cached block released, and blocks returned later are
//! released at once. The state itself goes with the last lease.

use super::front::{Counts, ENTRIES, Parked, Put, Stock, ThreadCache};
use super::size_class::{NUM_CLASSES, PinnedClass};
use crate::thread_cache::{self, Registered, ThreadExit};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};

/// What the cache needs from the memory system. The cache allocates through it, never
/// dereferences a block, and releases each allocation once, so a safe implementation is enough:
/// what the memory is (pinned, mapped, ...) is the backend's and its users' business.
pub trait PinnedBackend: Send + Sync + 'static {
    /// Marks the end of asynchronous work that used a block (a CUDA event).
    type Fence: Send;
    /// What [`PinnedBackend::allocate`] fails with.
    type Error;
    /// A new block of `bytes` (a size class's bytes, never 0) from the system.
    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>, Self::Error>;
    /// True when the work has completed; never blocks.
    fn is_done(&self, fence: &Self::Fence) -> bool;
    /// Blocks until the work has completed.
    fn wait(&self, fence: &Self::Fence);
    /// Returns a block's memory to the system.
    ///
    /// # Safety
    /// `ptr` came from this backend's `allocate(bytes)`, is released once, and every fence
    /// recorded on its block was waited for. The cache is the only caller that can promise it:
    /// blocks are made only by the cache, and return only to the pool that made them.
    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize);
}

/// A pinned block and the work that may still use it. Only a [`BlockCache`] makes one (from its
/// backend's allocation, or from its free lists), and it goes back only to the pool that made it
/// ([`BlockCache::put`], [`Lease::put`]): neither `Clone` nor constructible outside the cache, so
/// no block is handed out twice or released against its backend's contract. Dropping a block
/// instead of putting it back leaks its memory.
///
/// A block cannot be forged, copied, or have its fences dropped:
/// ```compile_fail,E0451
/// use cuda_mem_cache::pinned::{Block, class_of};
/// let class = class_of(4096).unwrap();
/// let _: Block<()> = Block { ptr: std::ptr::NonNull::dangling(), class, fences: Vec::new(), pool: 0 };
/// ```
/// ```compile_fail,E0599
/// fn twice(block: cuda_mem_cache::pinned::Block<()>) -> (cuda_mem_cache::pinned::Block<()>, cuda_mem_cache::pinned::Block<()>) {
///     (block.clone(), block)
/// }
/// ```
/// ```compile_fail,E0616
/// fn unfence(block: &mut cuda_mem_cache::pinned::Block<u32>) {
///     block.fences.clear();
/// }
/// ```
/// and a block put back is gone from its holder:
/// ```compile_fail,E0382
/// use cuda_mem_cache::pinned::{BlockCache, PinnedBackend};
/// fn put_twice<B: PinnedBackend>(cache: &BlockCache<B>, block: cuda_mem_cache::pinned::Block<B::Fence>) {
///     let _ = cache.put(block);
///     let _ = cache.put(block);
/// }
/// ```
#[derive(Debug)]
#[must_use = "a block dropped instead of put back leaks its memory"]
pub struct Block<F> {
    ptr: NonNull<u8>,
    class: PinnedClass,
    fences: Vec<F>,
    /// The pool that made it (`Shared::id`).
    pool: u64,
}

// SAFETY: a block is the address of memory owned by exactly one holder at a time (a pool or one
// user), never dereferenced by the cache; another thread may hold it, put it back or drop it.
unsafe impl<F: Send> Send for Block<F> {}

impl<F> Block<F> {
    /// The block's address.
    #[inline]
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Its size class: its bytes are `class().bytes()`.
    #[inline]
    pub fn class(&self) -> PinnedClass {
        self.class
    }

    /// Fences of work that may still use the block.
    pub fn fences(&self) -> &[F] {
        &self.fences
    }

    /// Marks asynchronous work that uses the block: once it is back in its pool, the block is
    /// handed out again only after `fence` is done (released only after a wait for it).
    pub fn record(&mut self, fence: F) {
        self.fences.push(fence);
    }

    /// Takes the block apart, for an owner that keeps its address and class apart (or only its
    /// address and size, as a resource freed by address does). Only
    /// [`BlockCache::block_from_raw_parts`] or [`Lease::block_from_raw_parts`] of its pool makes
    /// it a block again; without that its memory leaks.
    #[inline]
    pub fn into_raw_parts(self) -> (NonNull<u8>, PinnedClass, Vec<F>) {
        (self.ptr, self.class, self.fences)
    }
}

/// A block put into a pool that did not make it, given back to the caller.
#[derive(Debug)]
pub struct ForeignBlock<F> {
    block: Block<F>,
}

impl<F> ForeignBlock<F> {
    /// The block, to be put into its own pool.
    pub fn into_block(self) -> Block<F> {
        self.block
    }
}

impl<F> std::fmt::Display for ForeignBlock<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a pinned block of {} bytes put into a pool that did not make it", self.block.class.bytes())
    }
}

impl<F: std::fmt::Debug> std::error::Error for ForeignBlock<F> {}

/// Counters of a caching pool. `cached_bytes`, `in_use_bytes`, `hits` and `misses` are exact
/// whenever no call is in flight (each thread counts its own calls; reading sums them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PinnedPoolStats {
    /// Bytes in cached (free) blocks.
    pub cached_bytes: usize,
    /// Bytes in blocks handed out and not yet returned.
    pub in_use_bytes: usize,
    /// Highest `in_use_bytes` seen: exact while one thread allocates and frees (or for a pool with
    /// a cap), otherwise an upper bound (the threads' own peaks summed, and never above the peak
    /// of bytes held from the system).
    pub peak_in_use_bytes: usize,
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that needed a new block from the system.
    pub misses: u64,
}

/// One size class's cached blocks, oldest first.
type FreeList<F> = Mutex<Vec<Block<F>>>;

/// Every thread's front cache, and the counts of threads that exited.
type Registry = thread_cache::Registry<ThreadCache, Counts>;

/// The bookkeeping of one pool, as a handle of it. Cloning shares it; dropping the last handle
/// closes the pool.
pub struct BlockCache<B: PinnedBackend> {
    shared: Arc<Shared<B>>,
}

impl<B: PinnedBackend> std::fmt::Debug for BlockCache<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl<B: PinnedBackend> Clone for BlockCache<B> {
    fn clone(&self) -> Self {
        // Relaxed, as in `Arc::clone`: the new handle comes from one that keeps the count above 0.
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<B: PinnedBackend> Drop for BlockCache<B> {
    fn drop(&mut self) {
        // Release then Acquire, as in `Arc`'s drop: every handle's calls happen before the close.
        if self.shared.handles.fetch_sub(1, Ordering::Release) == 1 {
            fence(Ordering::Acquire);
            self.shared.close();
        }
    }
}

/// What a buffer holds so that its block can go back: the pool's state, kept alive, without
/// being a handle of the pool.
pub struct Lease<B: PinnedBackend> {
    shared: Arc<Shared<B>>,
}

impl<B: PinnedBackend> std::fmt::Debug for Lease<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").finish_non_exhaustive()
    }
}

impl<B: PinnedBackend> Lease<B> {
    /// Returns `block` to the pool: into this thread's front cache, this lease into the thread's
    /// stock beside it, if the block may park there; else into the shared list of its class.
    /// A block of another pool is refused and given back (the lease is dropped).
    #[inline(always)]
    pub fn put(self, block: Block<B::Fence>) -> Result<(), ForeignBlock<B::Fence>> {
        if block.pool != self.shared.id {
            return Err(ForeignBlock { block });
        }
        let lease = ManuallyDrop::new(self);
        if !put_block(&lease.shared, block, true) {
            drop(ManuallyDrop::into_inner(lease));
        }
        // Else the stock owns the lease's reference now, and another thread closing the pool may
        // drop the stock at any moment: the state may be gone.
        Ok(())
    }

    /// [`BlockCache::block_from_raw_parts`], for the pool this lease keeps.
    ///
    /// # Safety
    /// As there: `ptr` and `class` are the parts of a block of this lease's pool, and no block
    /// of them exists now.
    #[inline(always)]
    pub unsafe fn block_from_raw_parts(
        &self,
        ptr: NonNull<u8>,
        class: PinnedClass,
        fences: Vec<B::Fence>,
    ) -> Block<B::Fence> {
        self.shared.block(ptr, class, fences)
    }

    /// The lease a front cache's stock gave up on a hit (see [`ThreadCache::take`]).
    ///
    /// # Safety
    /// The stock of a front cache of `shared`'s pool gave up one of its references to the caller.
    #[inline(always)]
    unsafe fn from_stock(shared: &Arc<Shared<B>>) -> Self {
        // SAFETY: the stock's strong reference moves to this lease (the caller's guarantee); the
        // pointer is the state's, as `Arc::from_raw` needs.
        Self { shared: unsafe { Arc::from_raw(Arc::as_ptr(shared)) } }
    }
}

/// Returns `block` to the pool of `shared`, as [`Lease::put`] does. With `leased`, the caller's
/// lease may go into this thread's stock beside the block: true when it did, and then neither
/// the lease nor the state may be touched again (a closing thread may drop the stock), which is
/// why `shared` is the lease's `Arc`, never a reference to the state.
#[inline(always)]
fn put_block<B: PinnedBackend>(shared: &Arc<Shared<B>>, block: Block<B::Fence>, leased: bool) -> bool {
    if !(shared.fronts && block.fences.is_empty()) {
        put_counted(shared, block);
        return false;
    }
    let parked = Parked { ptr: block.ptr, class: block.class };
    match thread_cache::with_cache(&ENTRIES, shared.id, || register(shared), |cache| cache.put(parked, leased)) {
        Some(Put::Parked { stocked }) => stocked,
        // Counted by the front cache.
        Some(Put::Refused) => {
            shared.put_shared(block);
            false
        }
        None => {
            put_counted(shared, block);
            false
        }
    }
}

fn register<B: PinnedBackend>(shared: &Arc<Shared<B>>) -> Registered<ThreadCache> {
    // SAFETY: the pointer is `Arc::as_ptr` of the state, and the function drops a reference to
    // a `Shared<B>`.
    let stock = unsafe { Stock::new(Arc::as_ptr(shared).cast(), release_lease::<B>) };
    let registered = thread_cache::register(shared, &shared.threads, ThreadCache::new(stock));
    // After the push: a closing thread either found this cache in the registry and closed it,
    // or set the flag before this thread took the registry's lock.
    if shared.closed.load(Ordering::Relaxed) {
        drop(registered.0.close());
    }
    registered
}

/// Drops one stocked lease of a `Shared<B>` (a [`Stock`]'s `release`).
///
/// # Safety
/// `state` is `Arc::as_ptr` of an `Arc<Shared<B>>`, and the caller owns one strong reference.
unsafe fn release_lease<B: PinnedBackend>(state: *const ()) {
    // SAFETY: the caller's guarantee.
    unsafe { Arc::decrement_strong_count(state.cast::<Shared<B>>()) };
}

fn put_counted<B: PinnedBackend>(shared: &Arc<Shared<B>>, block: Block<B::Fence>) {
    let bytes = block.class.bytes();
    count(shared, move |counts| counts.take_back(bytes));
    shared.put_shared(block);
}

/// Counts in this thread's front cache, or in the pool where there is none.
fn count<B: PinnedBackend>(shared: &Arc<Shared<B>>, f: impl FnOnce(&mut Counts) + Copy) {
    if shared.fronts
        && thread_cache::with_cache(&ENTRIES, shared.id, || register(shared), |cache| cache.count(f)).is_some()
    {
        return;
    }
    f(&mut lock(&shared.counts));
}

struct Shared<B: PinnedBackend> {
    id: u64,
    backend: B,
    classes: Box<[FreeList<B::Fence>]>,
    max_cached_bytes: usize,
    /// No cap: blocks without fences park in the freeing thread's front cache first.
    fronts: bool,
    /// Bytes in the shared lists.
    cached_bytes: AtomicUsize,
    /// Bytes taken from the system and not released, and their peak (bounds the peak in use).
    held_bytes: AtomicUsize,
    peak_held_bytes: AtomicUsize,
    /// Calls no front cache counted (every call, with a cap: a lock all threads take).
    counts: Mutex<Counts>,
    threads: Mutex<Registry>,
    /// Live [`BlockCache`] handles.
    handles: AtomicUsize,
    /// The last handle dropped: returned blocks are released.
    closed: AtomicBool,
}

impl<B: PinnedBackend> BlockCache<B> {
    /// An empty cache over `backend` keeping at most `max_cached_bytes` free (`usize::MAX`: no
    /// cap, and front caches).
    pub fn new(backend: B, max_cached_bytes: usize) -> Self {
        let shared = Shared {
            id: thread_cache::next_owner_id(),
            backend,
            classes: (0..NUM_CLASSES).map(|_| Mutex::new(Vec::new())).collect(),
            max_cached_bytes,
            fronts: max_cached_bytes == usize::MAX,
            cached_bytes: AtomicUsize::new(0),
            held_bytes: AtomicUsize::new(0),
            peak_held_bytes: AtomicUsize::new(0),
            counts: Mutex::new(Counts::default()),
            threads: Mutex::new(Registry::default()),
            handles: AtomicUsize::new(1),
            closed: AtomicBool::new(false),
        };
        Self { shared: Arc::new(shared) }
    }

    /// The backend (the fake's records, for tests).
    #[cfg(any(test, feature = "fake"))]
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// Holds the shared list of `class` and the registry of front caches (to prove that a path
    /// does not need them).
    #[cfg(test)]
    pub(super) fn hold_shared(&self, class: PinnedClass) -> impl Sized + '_ {
        (lock(&self.shared.classes[class.index()]), lock(&self.shared.threads))
    }

    /// A cached block of `class` whose work has completed: this thread's most recently freed
    /// one, else the shared list's most recently freed ready one (warm in caches), else, after
    /// every thread's front cache is returned to the lists, one from there.
    #[inline]
    pub fn take(&self, class: PinnedClass) -> Option<Block<B::Fence>> {
        let shared = &self.shared;
        if shared.fronts {
            let hit = thread_cache::with_cache(&ENTRIES, shared.id, || register(shared), |c| c.take(class, false));
            if let Some(Some((ptr, _))) = hit {
                return Some(shared.block(ptr, class, Vec::new()));
            }
        }
        self.take_shared(class)
    }

    /// [`BlockCache::take`], with a lease for the buffer that will hold the block: one this
    /// thread stocked, if any (no atomic operation), else a new one.
    #[inline(always)]
    pub fn take_leased(&self, class: PinnedClass) -> Option<(Block<B::Fence>, Lease<B>)> {
        let shared = &self.shared;
        if shared.fronts {
            let hit = thread_cache::with_cache(&ENTRIES, shared.id, || register(shared), |c| c.take(class, true));
            if let Some(Some((ptr, stocked))) = hit {
                // SAFETY: this pool's front cache gave up a stocked reference.
                let lease = if stocked { unsafe { Lease::from_stock(shared) } } else { self.lease() };
                return Some((shared.block(ptr, class, Vec::new()), lease));
            }
        }
        self.take_shared(class).map(|block| (block, self.lease()))
    }

    /// The block whose parts [`Block::into_raw_parts`] gave, with `fences` (those parts' or
    /// more).
    ///
    /// # Safety
    /// `ptr` and `class` are the parts of a block of this pool, and no block of them exists
    /// now: each block taken apart is made again at most once.
    pub unsafe fn block_from_raw_parts(
        &self,
        ptr: NonNull<u8>,
        class: PinnedClass,
        fences: Vec<B::Fence>,
    ) -> Block<B::Fence> {
        self.shared.block(ptr, class, fences)
    }

    /// A new lease of this pool.
    pub fn lease(&self) -> Lease<B> {
        Lease { shared: Arc::clone(&self.shared) }
    }

    #[inline(never)]
    fn take_shared(&self, class: PinnedClass) -> Option<Block<B::Fence>> {
        let shared = &self.shared;
        let mut block = shared.take_ready(class);
        if block.is_none() && shared.fronts {
            shared.flush_all();
            block = shared.take_ready(class);
        }
        let block = block?;
        count(shared, move |counts| counts.hand_out(class.bytes(), true));
        Some(block)
    }

    /// A new block of `class` from the backend, for a request the cache could not serve.
    pub fn allocate(&self, class: PinnedClass) -> Result<Block<B::Fence>, B::Error> {
        let shared = &self.shared;
        let ptr = shared.backend.allocate(class.bytes())?;
        let held = shared.held_bytes.fetch_add(class.bytes(), Ordering::Relaxed) + class.bytes();
        shared.peak_held_bytes.fetch_max(held, Ordering::Relaxed);
        count(shared, move |counts| counts.hand_out(class.bytes(), false));
        Ok(shared.block(ptr, class, Vec::new()))
    }

    /// Takes a block back without a buffer's lease (see [`Lease::put`] for buffers). A block
    /// of another pool is refused and given back.
    pub fn put(&self, block: Block<B::Fence>) -> Result<(), ForeignBlock<B::Fence>> {
        if block.pool != self.shared.id {
            return Err(ForeignBlock { block });
        }
        put_block(&self.shared, block, false);
        Ok(())
    }

    /// Releases cached blocks, every thread's front cache returned first, until at most `target`
    /// bytes stay cached; returns bytes released.
    /// Blocks of `first` go first, then the largest classes.
    pub fn shrink_to(&self, target: usize, first: Option<PinnedClass>) -> usize {
        self.shared.flush_all();
        self.shared.shrink_lists(target, first.map(PinnedClass::index))
    }

    /// The pool's counters: the pool's own, the exited threads' and every front cache's, summed.
    pub fn stats(&self) -> PinnedPoolStats {
        let shared = &*self.shared;
        let mut counts = *lock(&shared.counts);
        let mut parked = 0;
        {
            let registry = lock(&shared.threads);
            counts.absorb(registry.retired);
            for cache in &registry.caches {
                parked += cache.read(&mut counts);
            }
        }
        let in_use = usize::try_from(counts.in_use).unwrap_or(0);
        let summed_peaks = usize::try_from(counts.peak_in_use).unwrap_or(0);
        PinnedPoolStats {
            cached_bytes: shared.cached_bytes.load(Ordering::Relaxed) + parked,
            in_use_bytes: in_use,
            peak_in_use_bytes: summed_peaks.min(shared.peak_held_bytes.load(Ordering::Relaxed)).max(in_use),
            hits: counts.hits,
            misses: counts.misses,
        }
    }

    /// Strong references to the pool's state: handles, leases of buffers and stocked ones.
    #[cfg(test)]
    pub(super) fn references(&self) -> usize {
        Arc::strong_count(&self.shared)
    }

    /// Tells when the pool's state is gone.
    #[cfg(test)]
    pub(super) fn state(&self) -> std::sync::Weak<impl Sized + use<B>> {
        Arc::downgrade(&self.shared)
    }
}

impl<B: PinnedBackend> Shared<B> {
    /// A block of this pool: the one place blocks are made.
    #[inline(always)]
    fn block(&self, ptr: NonNull<u8>, class: PinnedClass, fences: Vec<B::Fence>) -> Block<B::Fence> {
        Block { ptr, class, fences, pool: self.id }
    }

    /// The most recently freed block of `class` in its list whose work has completed.
    fn take_ready(&self, class: PinnedClass) -> Option<Block<B::Fence>> {
        let mut list = lock(&self.classes[class.index()]);
        let position = list.iter_mut().rposition(|block| {
            block.fences.retain(|fence| !self.backend.is_done(fence));
            block.fences.is_empty()
        })?;
        let block = list.swap_remove(position);
        drop(list);
        self.cached_bytes.fetch_sub(class.bytes(), Ordering::Relaxed);
        Some(block)
    }

    fn put_shared(&self, block: Block<B::Fence>) {
        let bytes = block.class.bytes();
        if bytes > self.max_cached_bytes || self.closed.load(Ordering::Relaxed) {
            self.release(block);
            return;
        }
        let index = block.class.index();
        lock(&self.classes[index]).push(block);
        let cached = self.cached_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if cached > self.max_cached_bytes {
            self.shrink_lists(self.max_cached_bytes, Some(index));
        }
    }

    /// Returns parked blocks to the lists.
    fn unpark(&self, parked: Vec<Parked>) {
        for Parked { ptr, class } in parked {
            self.put_shared(self.block(ptr, class, Vec::new()));
        }
    }

    /// Returns every thread's front cache to the lists (under the registry's lock: see
    /// [`thread_cache::Registry::drain_all`]).
    fn flush_all(&self) {
        if self.fronts {
            let registry = lock(&self.threads);
            self.unpark(registry.drain_all());
        }
    }

    /// Releases blocks of the lists until at most `target` bytes stay there.
    fn shrink_lists(&self, target: usize, first: Option<usize>) -> usize {
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
                self.cached_bytes.fetch_sub(block.class.bytes(), Ordering::Relaxed);
                released += block.class.bytes();
                self.release(block);
            }
        }
        released
    }

    fn release(&self, block: Block<B::Fence>) {
        for fence in &block.fences {
            self.backend.wait(fence);
        }
        self.held_bytes.fetch_sub(block.class.bytes(), Ordering::Relaxed);
        // SAFETY: the block came from the backend, is owned here alone, and its work is done.
        unsafe { self.backend.release(block.ptr, block.class.bytes()) };
    }
}

impl<B: PinnedBackend> Shared<B> {
    /// The last handle dropped: empties every thread's front cache and stock of leases, releases
    /// every cached block, and has later returns released (see the module's docs).
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let stocked: Vec<Stock> = {
            // Under the registry's lock, after the flag: a cache registered later sees the flag.
            let registry = lock(&self.threads);
            let stocked = registry.caches.iter().map(|cache| cache.close()).collect();
            self.unpark(registry.drain_all());
            stocked
        };
        self.shrink_lists(0, None);
        // No lock held: these may be the last references but for the closing handle's own.
        drop(stocked);
    }
}

impl<B: PinnedBackend> ThreadExit<ThreadCache> for Shared<B> {
    fn thread_exit(&self, cache: &Arc<ThreadCache>) {
        let stocked = {
            let mut registry = lock(&self.threads);
            let parked = registry.retire(cache);
            self.unpark(parked); // under the registry's lock, as in `flush_all`
            cache.close()
        };
        // The caller holds a reference, so these are not the last.
        drop(stocked);
    }
}

impl<B: PinnedBackend> Drop for Shared<B> {
    fn drop(&mut self) {
        // No handle is left, so no call is in flight; threads' front caches may still hold
        // blocks (their entries find the pool gone at exit and leave them).
        self.flush_all();
        self.shrink_lists(0, None);
    }
}

/// A poisoned lock only means another thread panicked while holding it, between plain Vec
/// operations or counter updates; the state itself is still consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
