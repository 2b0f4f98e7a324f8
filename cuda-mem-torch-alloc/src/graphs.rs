//! CUDA graphs captured by PyTorch (`torch.cuda.graph`, `torch.cuda.make_graphed_callables`):
//! what a capture allocates comes from the graph's private pool, as in PyTorch's own allocator.
//!
//! A graph's kernels write the memory its capture allocated every time it replays, long after
//! the capture freed it. So a block allocated during a capture is never given to anything but
//! that pool: freed (during the capture or after), it waits in the pool for later allocations of
//! captures into the same pool on the same stream (the captured stream order then orders them, as
//! PyTorch's shared pools require: replay in capture order). Pools are made of fresh memory
//! (`cudaMalloc`), never of blocks the cache holds, which work outside the graph may still use.
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
use cuda_mem::Result;
use cuda_mem::resource::StreamRef;
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// PyTorch's `MempoolId_t`.
pub type PoolId = (u64, u64);

/// Memory a pool holds; dropping it returns the memory to the driver.
pub type PoolBlock = Box<dyn Send>;

/// Allocation granularity of pool blocks (PyTorch's too).
const GRANULE: usize = 512;

/// Where private pools get fresh memory.
pub trait PoolMemory: Send + Sync + fmt::Debug {
    /// `bytes` of memory no one else uses.
    fn allocate(&self, bytes: usize) -> Result<(NonNull<u8>, PoolBlock)>;

    /// Blocks until all work on the device has completed.
    fn synchronize(&self) -> Result<()>;
}

/// Which streams belong to a capture.
pub trait CaptureFilter: Send {
    /// Whether `stream` is being captured into this capture's pool; `None` when it cannot tell.
    fn accepts(&self, stream: StreamRef<'static>) -> Option<bool>;
}

/// A block in a pool: `ptr` of `bytes`, allocated for `stream`.
struct Block {
    ptr: usize,
    bytes: usize,
    /// The size asked for when last handed out, which its free must give.
    requested: usize,
    stream: usize,
    /// Held for its drop, which returns the memory.
    _memory: PoolBlock,
}

/// A private pool.
#[derive(Default)]
struct Pool {
    /// Captures begun into it that PyTorch has not released yet.
    uses: usize,
    /// Handed out, not yet freed.
    live: usize,
    /// Freed, kept for the pool's later captures.
    free: Vec<Block>,
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
    /// Blocks handed out from pools, by address, with their pool.
    live: FxHashMap<usize, (PoolId, Block)>,
    /// Blocks of released pools, returned to the driver once the device is idle.
    freeable: Vec<Block>,
    deferred: Vec<DeferredFree>,
}

/// One device's private pools and the captures underway.
pub struct GraphPools {
    memory: Box<dyn PoolMemory>,
    /// Captures underway (read without the lock on every allocation).
    underway: AtomicUsize,
    /// Pool blocks handed out (read without the lock on every free).
    live: AtomicUsize,
    /// Bytes the pools hold from the driver.
    reserved: AtomicUsize,
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
    /// No pools yet; their memory will come from `memory`.
    pub fn new(memory: Box<dyn PoolMemory>) -> Self {
        Self {
            memory,
            underway: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
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
    /// per capture). When no capture of it remains, its free blocks, and later its live ones as
    /// they are freed, wait for [`GraphPools::release_freeable`]. False, changing nothing, for a
    /// pool no capture began into, or released as often as captured into.
    pub fn release(&self, pool: PoolId) -> bool {
        let mut state = self.state();
        let Some(entry) = state.pools.get_mut(&pool).filter(|entry| entry.uses > 0) else { return false };
        entry.uses -= 1;
        if entry.uses > 0 {
            return true;
        }
        let free = std::mem::take(&mut entry.free);
        if entry.live == 0 {
            state.pools.remove(&pool);
        }
        state.freeable.extend(free);
        true
    }

    /// `bytes` for `stream` from the pool of the capture it belongs to; `None` when no capture
    /// underway takes it (the cache serves it).
    pub fn allocate(&self, bytes: usize, stream: StreamRef<'static>) -> Option<Result<NonNull<u8>>> {
        if !self.capturing() {
            return None;
        }
        let mut state = self.state();
        let pool =
            state.captures.iter().find(|(_, filter)| filter.accepts(stream).unwrap_or(true)).map(|(pool, _)| *pool)?;
        let key = stream.as_raw() as usize;
        let entry = state.pools.entry(pool).or_default();
        // The smallest free block of this stream that fits without wasting more than it holds.
        let fit = (entry.free.iter().enumerate())
            .filter(|(_, b)| b.stream == key && b.bytes >= bytes && b.bytes <= bytes.saturating_mul(2).max(GRANULE))
            .min_by_key(|(_, b)| b.bytes)
            .map(|(at, _)| at);
        let block = match fit {
            Some(at) => Block { requested: bytes, ..entry.free.swap_remove(at) },
            None => {
                let rounded = bytes.div_ceil(GRANULE).saturating_mul(GRANULE);
                let (ptr, memory) = match self.memory.allocate(rounded) {
                    Ok(fresh) => fresh,
                    Err(err) => return Some(Err(err)),
                };
                self.reserved.fetch_add(rounded, Ordering::Relaxed);
                Block { ptr: ptr.as_ptr() as usize, bytes: rounded, requested: bytes, stream: key, _memory: memory }
            }
        };
        entry.live += 1;
        let ptr = NonNull::new(block.ptr as *mut u8).expect("pool memory is never null");
        state.live.insert(block.ptr, (pool, block));
        self.live.store(state.live.len(), Ordering::Release);
        Some(Ok(ptr))
    }

    /// Takes the free of `ptr` when it is a pool block (back to its pool, or to the freeable
    /// blocks if the pool was released) or when a capture is underway (deferred until the
    /// captures end; [`GraphPools::end`] hands it back). False: the cache frees it now.
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
        let (pool, block) = match state.live.entry(ptr.as_ptr() as usize) {
            Entry::Occupied(live) if live.get().1.requested == bytes => live.remove(),
            Entry::Occupied(live) => return Err(wrong_size(ptr, bytes, live.get().1.requested)),
            Entry::Vacant(_) if state.captures.is_empty() => return Ok(false),
            Entry::Vacant(_) => {
                cached()?;
                state.deferred.push(DeferredFree { ptr, bytes, stream });
                return Ok(true);
            }
        };
        self.live.store(state.live.len(), Ordering::Release);
        let entry = state.pools.get_mut(&pool).expect("a live block's pool is kept");
        entry.live -= 1;
        if entry.uses > 0 {
            entry.free.push(block);
            return Ok(true);
        }
        if entry.live == 0 {
            state.pools.remove(&pool);
        }
        state.freeable.push(block);
        Ok(true)
    }

    /// Returns the blocks of released pools to the driver, once the device is idle; nothing
    /// while a capture is underway (a `cudaFree` would end it). Returns the bytes released.
    pub fn release_freeable(&self) -> Result<usize> {
        // The lock is held throughout: no capture can begin before the memory is released.
        let mut state = self.state();
        if !state.captures.is_empty() || state.freeable.is_empty() {
            return Ok(0);
        }
        // Until the device is idle the blocks stay: it may still run a replay that uses them.
        self.memory.synchronize()?;
        let bytes = state.freeable.drain(..).map(|b| b.bytes).sum();
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests;
