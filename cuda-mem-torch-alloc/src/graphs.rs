//! CUDA graphs captured by PyTorch (`torch.cuda.graph`, `torch.cuda.make_graphed_callables`):
//! what a capture allocates comes from the graph's private pool, as in PyTorch's own allocator.
//!
//! A graph's kernels write the memory its capture allocated every time it replays, long after
//! the capture freed it. So a block allocated during a capture is never given to anything but
//! that pool: freed (during the capture or after), it waits in the pool for later allocations of
//! captures into the same pool on the same stream (the captured stream order then orders them, as
//! PyTorch's shared pools require: replay in capture order). Each pool keeps a cuda-mem-cache
//! `PrivatePool` per stream its captures allocated on (segments split into blocks, as PyTorch's
//! pools do), made of fresh memory (`cudaMalloc`), never of blocks the cache holds, which work
//! outside the graph may still use.
//! When PyTorch releases a pool (every graph using it was reset or destroyed), its blocks are
//! returned to the driver at the next `empty_cache` with no capture underway, after the whole
//! device is idle (a replay may still be running).
//!
//! While a capture is underway, other memory freed is handed to the cache only once the capture
//! has ended: the cache's bookkeeping may record or query events, which a capture refuses. (A free
//! on one thread that races the very beginning of a capture on another may still reach the cache:
//! at worst the capture fails, or a block is held back for good; memory is never handed out twice.)
//!
//! `Tensor.record_stream` on pool memory is not tracked: a pool block goes back to its pool at
//! the free, for later captures into the pool (whose replays run later still).
//!
//! PyTorch names the streams of a capture with a filter (a C++ `std::function`), called for each
//! allocation while captures are underway; the filter that cannot tell puts the memory in its
//! capture's pool (kept rather than reused under the graph).

use crate::backend::wrong_size;
use cuda_mem::caching::{CachedBlock, Config, PrivatePool, SegmentSource};
use cuda_mem::resource::StreamRef;
use cuda_mem::{CudaError, Result};
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// PyTorch's `MempoolId_t`.
pub type PoolId = (u64, u64);

/// Memory a pool holds; dropping it returns the memory to the driver.
pub type PoolBlock = Box<dyn Send>;

/// Where private pools get their segments.
///
/// # Safety
/// `allocate(bytes)` returns, on success, `bytes` bytes aligned to at least 256 that no one else
/// uses and that overlap no memory it returned whose [`PoolBlock`] is still alive: the pools split
/// segments into blocks for PyTorch trusting this.
pub unsafe trait PoolMemory: Send + Sync + fmt::Debug {
    /// A segment of `bytes`, held until its `PoolBlock` is dropped. A capture may be underway on
    /// the calling thread.
    fn allocate(&self, bytes: usize) -> Result<(NonNull<u8>, PoolBlock)>;

    /// Blocks until all work on the device has completed.
    fn synchronize(&self) -> Result<()>;
}

/// Which streams belong to a capture.
pub trait CaptureFilter: Send {
    /// Whether `stream` is being captured into this capture's pool; `None` when it cannot tell.
    fn accepts(&self, stream: StreamRef<'static>) -> Option<bool>;
}

/// The segments of a private pool, from the device's pool memory, counted.
struct Segments {
    memory: Arc<dyn PoolMemory>,
    /// Bytes every pool of the device holds (shared by their sources).
    reserved: Arc<AtomicUsize>,
    held: Mutex<FxHashMap<usize, PoolBlock>>,
}

impl fmt::Debug for Segments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("Segments").field("memory", &self.memory).field("held", &held).finish_non_exhaustive()
    }
}

// SAFETY: segments are what `PoolMemory::allocate` returned (its `unsafe impl` promises 256-byte
// alignment and no overlap with live segments), each held until `release` drops its `PoolBlock`.
unsafe impl SegmentSource for Segments {
    type Error = CudaError;

    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>> {
        let (ptr, block) = self.memory.allocate(bytes)?;
        self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr.as_ptr() as usize, block);
        self.reserved.fetch_add(bytes, Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn release(&self, base: NonNull<u8>, bytes: usize) {
        let block = self.held.lock().unwrap_or_else(PoisonError::into_inner).remove(&(base.as_ptr() as usize));
        if block.is_some() {
            self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        }
        drop(block); // the memory goes back to the driver
    }
}

/// A block handed out from a pool.
struct Live {
    pool: PoolId,
    /// The stream it was allocated for: its free returns it to that stream's private pool.
    stream: usize,
    block: CachedBlock,
    /// The size asked for, which its free must give.
    requested: usize,
}

/// A PyTorch pool: a private pool per stream its captures allocated on.
#[derive(Default)]
struct Pool {
    /// Captures begun into it that PyTorch has not released yet.
    uses: usize,
    /// Blocks handed out, not yet freed.
    live: usize,
    streams: FxHashMap<usize, PrivatePool<Segments>>,
}

/// A free that waits for the end of the captures underway (the cache's own memory).
#[derive(Debug)]
pub struct DeferredFree {
    /// The block.
    pub ptr: NonNull<u8>,
    /// Its size as allocated.
    pub bytes: usize,
    /// The stream it was freed on.
    pub stream: StreamRef<'static>,
}

// SAFETY: a `DeferredFree` names memory and a stream; it is only handed back to the allocator
// that made it, on whatever thread ends the capture, as PyTorch may free on any thread.
unsafe impl Send for DeferredFree {}

#[derive(Default)]
struct State {
    captures: Vec<(PoolId, Box<dyn CaptureFilter>)>,
    pools: FxHashMap<PoolId, Pool>,
    /// Blocks handed out from pools, by address.
    live: FxHashMap<usize, Live>,
    /// The private pools of released pools with no block out: dropped (their segments returned
    /// to the driver) once the device is idle.
    freeable: Vec<PrivatePool<Segments>>,
    deferred: Vec<DeferredFree>,
}

/// One device's private pools and the captures underway.
pub struct GraphPools {
    memory: Arc<dyn PoolMemory>,
    /// How the private pools size their segments.
    config: Config,
    /// Captures underway (read without the lock on every allocation).
    underway: AtomicUsize,
    /// Pool blocks handed out (read without the lock on every free).
    live: AtomicUsize,
    /// Bytes the pools hold from the driver.
    reserved: Arc<AtomicUsize>,
    state: Mutex<State>,
}

impl fmt::Debug for GraphPools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphPools")
            .field("underway", &self.underway.load(Ordering::Relaxed))
            .field("live", &self.live.load(Ordering::Relaxed))
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl GraphPools {
    /// No pools yet; their segments will come from `memory`, sized as `config` says (its figures
    /// for streams, releases and front caches do not apply to private pools).
    pub fn new(memory: Box<dyn PoolMemory>, config: Config) -> Self {
        Self {
            memory: Arc::from(memory),
            config,
            underway: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            reserved: Arc::new(AtomicUsize::new(0)),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change to the state is complete before anything that could panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a capture is underway.
    pub fn capturing(&self) -> bool {
        self.underway.load(Ordering::Acquire) > 0
    }

    /// Bytes the pools hold from the driver.
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// A capture into `pool` begins (PyTorch's `beginAllocateToPool`): the streams `filter`
    /// accepts allocate from the pool until [`GraphPools::end`]. `first` runs, under the pools'
    /// lock, when no other capture was underway.
    pub fn begin(&self, pool: PoolId, filter: Box<dyn CaptureFilter>, first: impl FnOnce()) {
        let mut state = self.state();
        if state.captures.is_empty() {
            first();
        }
        state.pools.entry(pool).or_default().uses += 1;
        state.captures.push((pool, filter));
        self.underway.store(state.captures.len(), Ordering::Release);
    }

    /// The capture into `pool` has ended (PyTorch's `endAllocateToPool`). When it was the last
    /// one underway, `last` gets the frees deferred until then, under the pools' lock (so that no
    /// capture begins while the cache takes them). False, changing nothing, when no capture into
    /// `pool` is underway.
    pub fn end(&self, pool: PoolId, last: impl FnOnce(Vec<DeferredFree>)) -> bool {
        let mut state = self.state();
        let Some(at) = state.captures.iter().position(|(id, _)| *id == pool) else { return false };
        drop(state.captures.remove(at));
        self.underway.store(state.captures.len(), Ordering::Release);
        if state.captures.is_empty() {
            last(std::mem::take(&mut state.deferred));
        }
        true
    }

    /// PyTorch no longer replays graphs of `pool` captured once (PyTorch's `releasePool`, once
    /// per capture). When no capture of it remains and its last block is back, its memory waits
    /// for [`GraphPools::release_freeable`]. False, changing nothing, for a pool no capture began
    /// into, or released as often as captured into.
    pub fn release(&self, pool: PoolId) -> bool {
        let mut state = self.state();
        let Some(entry) = state.pools.get_mut(&pool).filter(|entry| entry.uses > 0) else { return false };
        entry.uses -= 1;
        if entry.uses == 0 && entry.live == 0 {
            retire(&mut state, pool);
        }
        true
    }

    /// `bytes` for `stream` from the pool of the capture it belongs to; `None` when no capture
    /// underway takes it (the cache serves it).
    pub fn allocate(&self, bytes: usize, stream: StreamRef<'static>) -> Option<Result<NonNull<u8>>> {
        if !self.capturing() {
            return None;
        }
        let mut guard = self.state();
        let state = &mut *guard;
        let pool =
            state.captures.iter().find(|(_, filter)| filter.accepts(stream).unwrap_or(true)).map(|(pool, _)| *pool)?;
        let key = stream.as_raw() as usize;
        let entry = state.pools.entry(pool).or_default();
        let private = match entry.streams.entry(key) {
            Entry::Occupied(private) => private.into_mut(),
            Entry::Vacant(vacant) => {
                let segments = Segments {
                    memory: Arc::clone(&self.memory),
                    reserved: Arc::clone(&self.reserved),
                    held: Mutex::default(),
                };
                match PrivatePool::new(segments, &self.config) {
                    Ok(private) => vacant.insert(private),
                    Err(err) => return Some(Err(err.into())),
                }
            }
        };
        let block = match private.alloc(bytes) {
            Ok(block) => block,
            Err(err) => return Some(Err(err.into())),
        };
        entry.live += 1;
        let ptr = block.ptr();
        state.live.insert(ptr.as_ptr() as usize, Live { pool, stream: key, block, requested: bytes });
        self.live.store(state.live.len(), Ordering::Release);
        Some(Ok(ptr))
    }

    /// Takes the free of `ptr` when it is a pool block (back to its pool, whose memory waits for
    /// [`GraphPools::release_freeable`] once the pool is released and this was its last block)
    /// or when a capture is underway (deferred until the captures end; [`GraphPools::end`] hands
    /// it back). False: the cache frees it now.
    ///
    /// Refused (an error, nothing freed): a pool block freed with another size than it was
    /// allocated with, and, during a capture, memory that is no pool block and that `cached`
    /// (the cache's check of the free) refuses.
    ///
    /// # Safety
    /// Nothing uses the block after the work queued on `stream` (a pool block goes back to its
    /// pool at once).
    pub unsafe fn free(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        stream: StreamRef<'static>,
        cached: impl FnOnce() -> Result<()>,
    ) -> Result<bool> {
        if self.live.load(Ordering::Acquire) == 0 && !self.capturing() {
            return Ok(false);
        }
        let mut guard = self.state();
        // Fields borrowed apart: the entry into `live` and the captures and deferred frees.
        let state = &mut *guard;
        let live = match state.live.entry(ptr.as_ptr() as usize) {
            Entry::Occupied(live) if live.get().requested == bytes => live.remove(),
            Entry::Occupied(live) => return Err(wrong_size(ptr, bytes, live.get().requested)),
            Entry::Vacant(_) if state.captures.is_empty() => return Ok(false),
            Entry::Vacant(_) => {
                cached()?;
                state.deferred.push(DeferredFree { ptr, bytes, stream });
                return Ok(true);
            }
        };
        self.live.store(state.live.len(), Ordering::Release);
        let entry = state.pools.get_mut(&live.pool).expect("a live block's pool is kept");
        let private = entry.streams.get(&live.stream).expect("a live block's private pool is kept");
        // SAFETY: allocated from this private pool. Later blocks of it go to captures into the
        // same pool on the same stream, which the captured stream order runs after the work that
        // used this one (PyTorch's rule for shared pools: graphs replay in capture order); the
        // pool is dropped only after the device is idle (`release_freeable`).
        unsafe { private.free(live.block) };
        entry.live -= 1;
        if entry.uses == 0 && entry.live == 0 {
            retire(state, live.pool);
        }
        Ok(true)
    }

    /// Returns the memory of released pools to the driver, once the device is idle; nothing
    /// while a capture is underway (a `cudaFree` would end it). Returns the bytes released.
    pub fn release_freeable(&self) -> Result<usize> {
        // The lock is held throughout: no capture can begin before the memory is released.
        let mut state = self.state();
        if !state.captures.is_empty() || state.freeable.is_empty() {
            return Ok(0);
        }
        // Until the device is idle the memory stays: it may still run a replay that uses it.
        self.memory.synchronize()?;
        let before = self.reserved();
        // Dropping a private pool with no block out returns every segment.
        state.freeable.clear();
        Ok(before - self.reserved())
    }
}

/// Moves the private pools of `pool`, released with no block out, to the freeable memory.
fn retire(state: &mut State, pool: PoolId) {
    if let Some(entry) = state.pools.remove(&pool) {
        state.freeable.extend(entry.streams.into_values());
    }
}

#[cfg(test)]
pub(crate) mod tests;
