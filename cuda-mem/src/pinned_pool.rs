//! `PinnedPool`: a caching allocator for pinned host memory.
//!
//! `cudaMallocHost` + `cudaFreeHost` are slow (the figures are in docs/staged-copies.md), so a
//! program that needs pinned staging buffers per batch spends its time in the allocator. The pool
//! keeps freed blocks in size classes (four per power of two) and hands them out again; a block
//! that asynchronous work used (see [`PooledPinned::record_use`]) is handed out only after that
//! work has completed, as PyTorch's caching host allocator does. A pool without a cap keeps a few
//! freed blocks per class in each thread's own front cache, so that a thread allocating what it
//! freed takes no lock another thread takes; the shared free lists have one lock per class, so
//! threads allocating different sizes never contend there either (see [`cuda_mem_cache::pinned`]).

pub use cuda_mem_cache::pinned::PinnedPoolStats;

use crate::error::{CudaError, ErrorKind, Result};
use crate::raw::host_flags::HostAllocFlags;
use crate::raw::{self, byte_len};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Event;
use crate::stream::Stream;
use bytemuck::Pod;
use cuda_mem_cache::pinned::{BlockCache, Lease, PinnedBackend, PinnedClass, class_of};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// `cudaHostAlloc` with a pool's flags, zeroed, as allocation; CUDA events as fences;
/// `cudaFreeHost` as release.
struct CudaBackend {
    flags: HostAllocFlags,
}

impl PinnedBackend for CudaBackend {
    type Fence = Event;
    type Error = CudaError;

    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>> {
        let fresh = raw::host::alloc(bytes, self.flags)?;
        // SAFETY: allocated just now, never used.
        let ptr = raw::typed::<u8>(fresh, "PinnedPool", |p| unsafe { raw::host::free(p, bytes) })?;
        // SAFETY: a fresh allocation of `bytes`; zeroing makes every later view initialised.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, bytes) };
        Ok(ptr)
    }

    fn is_done(&self, fence: &Event) -> bool {
        fence.allows_reuse()
    }

    fn wait(&self, fence: &Event) {
        raw::quiet(fence.synchronize());
    }

    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: the caller guarantees `ptr` came from `allocate(bytes)` (cudaHostAlloc) and has
        // no pending work.
        raw::quiet(unsafe { raw::host::free(ptr.as_ptr().cast(), bytes) });
    }
}

/// A caching pool of pinned host memory with fixed allocation flags. Cloning shares the pool.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{HostAllocFlags, PinnedPool};
/// let pool = PinnedPool::new(HostAllocFlags::PORTABLE);
/// for _batch in 0..100 {
///     let mut staging = pool.alloc::<f32>(1 << 20)?; // cudaHostAlloc once, then cache hits
///     staging.fill(0.0);
/// } // returned to the pool, not to the driver
/// let stats = pool.stats();
/// assert_eq!((stats.misses, stats.hits), (1, 99));
/// pool.trim(); // cudaFreeHost on everything cached
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PinnedPool {
    cache: BlockCache<CudaBackend>,
    flags: HostAllocFlags,
}

impl fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedPool").field("flags", &self.flags).field("stats", &self.stats()).finish()
    }
}

impl PinnedPool {
    /// A pool whose blocks are allocated with `flags` (empty: `cudaMallocHost`), caching without
    /// limit until [`PinnedPool::trim`]. Makes no CUDA call.
    pub fn new(flags: HostAllocFlags) -> Self {
        Self::with_max_cached_bytes(flags, usize::MAX)
    }

    /// A pool that keeps at most `max_cached_bytes` in free blocks; beyond that, freed blocks go
    /// back to the driver (oldest first). A block larger than the cap is never cached. The cap
    /// is exact because such a pool keeps every free block in its shared lists: only a pool
    /// without a cap (`usize::MAX`) has per-thread front caches.
    pub fn with_max_cached_bytes(flags: HostAllocFlags, max_cached_bytes: usize) -> Self {
        Self { cache: BlockCache::new(CudaBackend { flags }, max_cached_bytes), flags }
    }

    /// The process-wide pool that [`Stream::upload`] and [`Stream::download`] stage pageable
    /// `Vec`s through (portable, caching without limit: [`PinnedPool::trim`] hands its blocks
    /// back). Makes no CUDA call until its first allocation.
    pub fn staging() -> &'static PinnedPool {
        static STAGING: OnceLock<PinnedPool> = OnceLock::new();
        STAGING.get_or_init(|| PinnedPool::new(HostAllocFlags::PORTABLE))
    }

    /// The flags every block is allocated with.
    pub fn flags(&self) -> HostAllocFlags {
        self.flags
    }

    /// `len` elements from the cache, or from the driver on a miss. The contents are zero for a
    /// new block and whatever the previous user left for a cached one (always valid `T`s: every
    /// user wrote plain data). Zero-length requests take no block.
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<PooledPinned<T>> {
        let bytes = byte_len::<T>(len, "PinnedPool::alloc")?;
        if align_of::<T>() > cuda_mem_cache::pinned::MIN_BLOCK {
            let kind = ErrorKind::InvalidArgument("element alignment above 4096 bytes");
            return Err(CudaError::new(kind, "PinnedPool::alloc"));
        }
        if bytes == 0 {
            return Ok(PooledPinned::empty(len, self.flags));
        }
        let class = class_of(bytes).ok_or_else(|| {
            CudaError::new(ErrorKind::SizeOverflow { len, elem_size: size_of::<T>() }, "PinnedPool::alloc")
        })?;
        let (block, lease) = match self.cache.take_leased(class) {
            Some(held) => held,
            None => (self.cache.allocate(class)?, self.cache.lease()),
        };
        let (ptr, class, fences) = block.into_raw_parts();
        Ok(PooledPinned { ptr: ptr.cast(), len, lease: Some(lease), class, fences, flags: self.flags })
    }

    /// A block of at least `bytes` (> 0) as a raw pointer, for [`PinnedPoolResource`](crate::resource::PinnedPoolResource).
    pub(crate) fn take_raw(&self, bytes: usize) -> Result<NonNull<u8>> {
        let class = class_of(bytes).ok_or_else(|| {
            CudaError::new(ErrorKind::SizeOverflow { len: bytes, elem_size: 1 }, "PinnedPool::take_raw")
        })?;
        let block = match self.cache.take(class) {
            Some(block) => block,
            None => self.cache.allocate(class)?,
        };
        Ok(block.into_raw_parts().0) // made again by `put_raw`
    }

    /// Returns a block from [`PinnedPool::take_raw`], reusable once `fence` (if any) completes.
    ///
    /// # Safety
    /// `ptr` came from `take_raw(bytes)` on this pool and is returned once.
    pub(crate) unsafe fn put_raw(&self, ptr: NonNull<u8>, bytes: usize, fence: Option<Event>) {
        let class = class_of(bytes).expect("take_raw accepted this size");
        // SAFETY: the parts of a block `take_raw` took apart, made again once (the caller's
        // guarantee); the same size gives the same class.
        let block = unsafe { self.cache.block_from_raw_parts(ptr, class, fence.into_iter().collect()) };
        drop(self.cache.put(block)); // this pool's own block: never refused
    }

    /// Returns every cached block to the driver (`cudaFreeHost`), those in every thread's front
    /// cache included, waiting for pending work on them; blocks in use are untouched. Returns the
    /// bytes released.
    pub fn trim(&self) -> usize {
        self.cache.shrink_to(0, None)
    }

    /// Cached and in-use bytes, peak, hits and misses.
    pub fn stats(&self) -> PinnedPoolStats {
        self.cache.stats()
    }
}

/// `len` elements of pinned memory from a [`PinnedPool`], returned to it on drop (if the pool
/// has closed, its last handle dropped, the block goes back to the driver). Dereferences to `[T]`.
pub struct PooledPinned<T: Pod> {
    /// The block (dangling for zero elements, which take none).
    ptr: NonNull<T>,
    len: usize,
    /// What returns the block to its pool; none for zero elements. The block's parts are kept
    /// apart, not as one `Block`, so that creating and dropping a buffer moves words, not a
    /// struct (which the compiler copies in wider pieces than it wrote them, a stall each).
    lease: Option<Lease<CudaBackend>>,
    class: PinnedClass,
    /// Ends of asynchronous work that used the block (see [`PooledPinned::record_use`]).
    fences: Vec<Event>,
    flags: HostAllocFlags,
}

// SAFETY: owns its block exclusively, like `Vec<T>`; Pod types are Send + Sync.
unsafe impl<T: Pod> Send for PooledPinned<T> {}
// SAFETY: shared access gives `&[T]` only.
unsafe impl<T: Pod> Sync for PooledPinned<T> {}

impl<T: Pod> fmt::Debug for PooledPinned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledPinned").field("ptr", &self.ptr()).field("len", &self.len).finish()
    }
}

impl<T: Pod> PooledPinned<T> {
    fn empty(len: usize, flags: HostAllocFlags) -> Self {
        let class = class_of(0).expect("the smallest class"); // never read without a lease
        Self { ptr: NonNull::dangling(), len, lease: None, class, fences: Vec::new(), flags }
    }

    fn ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Bytes in the underlying block (the request rounded up to its size class).
    pub fn capacity_bytes(&self) -> usize {
        if self.lease.is_some() { self.class.bytes() } else { 0 }
    }

    /// Marks the end of work queued on `stream` so far as a use of this block: after the buffer is
    /// dropped, the pool hands the block out again only once that work has completed. Scopes need
    /// no such call (they wait before their borrows end); use it for work queued outside them.
    pub fn record_use(&mut self, stream: &Stream) -> Result<()> {
        if self.lease.is_some() {
            self.fences.push(Event::fence(stream)?);
        }
        Ok(())
    }

    mapped_host_views!();

    fn mapped_parts(&self) -> (bool, *mut T, usize) {
        (self.flags.contains(HostAllocFlags::MAPPED), self.ptr(), self.len)
    }
}

impl<T: Pod> Deref for PooledPinned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the block holds at least `len` initialised `T`s (zeroed when new, plain data
        // since), is aligned to a page, and belongs to this buffer alone.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl<T: Pod> DerefMut for PooledPinned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

crate::memory::pinned_host_memory!(PooledPinned);

impl<T: Pod> Drop for PooledPinned<T> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            // Most buffers record no use: then no move of the list (as for the fields above).
            let fences = if self.fences.is_empty() { Vec::new() } else { std::mem::take(&mut self.fences) };
            // SAFETY: the parts `alloc` took from a block of the lease's pool, made again once
            // (the lease is taken out above).
            let block = unsafe { lease.block_from_raw_parts(self.ptr.cast(), self.class, fences) };
            drop(lease.put(block)); // its own pool's block: never refused
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole hit pair of a `PinnedPool` without a GPU (`alloc` + drop of a `PooledPinned`), over
    /// a block of system memory put in by hand: `cargo test --release -p cuda-mem --lib
    /// pinned_pool::tests::whole_hit_pair -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check: run it in release mode"]
    fn whole_hit_pair_cost() {
        let pool = PinnedPool::new(HostAllocFlags::empty());
        let block = system_block(1 << 20);
        // SAFETY: not the contract's block (system memory, not the pool's): what the contract
        // protects is the release, and the pool is forgotten below, so it never releases it.
        pool.cache
            .put(unsafe { pool.cache.block_from_raw_parts(block, class_of(1 << 20).unwrap(), Vec::new()) })
            .unwrap();
        let pairs = 1_000_000;
        let mut samples: Vec<f64> = (0..15)
            .map(|_| {
                let start = std::time::Instant::now();
                for _ in 0..pairs {
                    // As `examples/cache_pairs.rs` times it; the size is opaque, as it is there.
                    drop(pool.alloc::<u8>(std::hint::black_box(1 << 20)).expect("a hit"));
                }
                start.elapsed().as_secs_f64() * 1e9 / f64::from(pairs)
            })
            .collect();
        samples.sort_by(f64::total_cmp);
        println!("pinned pool hit pair, whole: {:.1} ns (median of 15)", samples[7]);
        // The block is system memory: the pool must never hand it to cudaFreeHost.
        std::mem::forget(pool);
    }

    /// Page-aligned system memory of `bytes`, leaked.
    fn system_block(bytes: usize) -> NonNull<u8> {
        let layout = std::alloc::Layout::from_size_align(bytes, 4096).unwrap();
        // SAFETY: a non-zero size and a valid alignment.
        NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap()
    }
}
