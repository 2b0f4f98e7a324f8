//! [`GraphPool`]: a private pool of device memory that captures allocate from
//! ([`CaptureScope::cached`](crate::CaptureScope::cached)), shared by any number of graphs that
//! take turns on the device.

use crate::caching::{CachedBlock, CachingStats, Config, PrivatePool, SegmentSource};
use crate::device::{CurrentDevice, Device};
use crate::device_cache::DeviceCache;
use crate::error::{CudaError, ErrorKind, Result};
use crate::raw::{self, graphs};
use crate::stream::{Event, Stream};
use std::cell::RefCell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::ThreadId;

impl DeviceCache {
    /// A new private pool for CUDA graphs on the cache's device, with segments sized as the
    /// cache's: captures allocate from it with
    /// [`CaptureScope::cached`](crate::CaptureScope::cached). Its memory is its own, never handed
    /// to this cache's users nor released by [`DeviceCache::empty_cache`]; see [`GraphPool`].
    pub fn graph_pool(&self) -> Result<GraphPool> {
        GraphPool::with_config(self.device(), self.config())
    }
}

/// A private pool of device memory for CUDA graphs (PyTorch's `graph_pool_handle`). Made by
/// [`DeviceCache::graph_pool`](crate::DeviceCache::graph_pool); cloning shares it.
///
/// A capture takes blocks from it with [`CaptureScope::cached`](crate::CaptureScope::cached): the
/// block's address is baked into the graph, and at the end of the capture the block returns to
/// this pool's free lists, for later captures that share the pool, never for the cache's eager
/// users. So graphs captured one after another from one pool reuse the same memory, and K graphs
/// need about the memory of the largest of them, not the sum.
///
/// That is sound because the graphs of one pool never run at the same time: every
/// [`GraphExec::run`](crate::GraphExec::run) and [`GraphExec::launch`](crate::GraphExec::launch)
/// of a graph that allocated from the pool takes the pool's turn for the whole call (which waits
/// for its launches), on whatever stream it runs; a launch that does not wait
/// ([`GraphExec::launches_in`](crate::GraphExec::launches_in), [`GraphExec::launch_pending`](crate::GraphExec::launch_pending))
/// takes the turn while it queues, makes its stream wait (on the device) for the pool's last
/// such launch, and leaves a fence that the pool's next launch waits for in turn. A second
/// thread's launch waits for the turn. A
/// launch from inside another graph's `run` closure never waits: if the pool is busy (this
/// thread's own run, or another thread's, which might be waiting for this one) it is an
/// [`ErrorKind::InvalidArgument`] rather than a deadlock. The pool's segments are `cudaMalloc`
/// memory of its own: `empty_cache`, out-of-memory releases and trims of the cache never reach
/// them, and they are released when the pool and every graph made with it are gone.
#[derive(Clone)]
pub struct GraphPool {
    shared: Arc<PoolShared>,
}

struct PoolShared {
    id: u64,
    device: Device,
    pool: PrivatePool<GraphSegments>,
    /// The thread whose launches of the pool's graphs may be running now, if any.
    turn: Mutex<Option<ThreadId>>,
    turn_ended: Condvar,
    /// A fence after the last launch queued without a host wait ([`GraphExec::launches_in`](crate::GraphExec::launches_in)):
    /// the next launch of any graph of the pool is ordered after it on the device. Read and
    /// replaced only by the holder of the turn.
    last_launch: Mutex<Option<Arc<Event>>>,
}

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

impl fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphPool")
            .field("id", &self.shared.id)
            .field("device", &self.shared.device)
            .field("stats", &self.stats())
            .finish()
    }
}

impl GraphPool {
    /// An empty pool on `device` whose segments are sized as `config` says (the cache's figures
    /// for streams, releases and front caches do not apply). Makes no CUDA call.
    pub fn with_config(device: Device, config: &Config) -> Result<Self> {
        let pool = PrivatePool::new(GraphSegments { device }, config)?;
        let id = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        let shared = PoolShared {
            id,
            device,
            pool,
            turn: Mutex::new(None),
            turn_ended: Condvar::new(),
            last_launch: Mutex::new(None),
        };
        Ok(Self { shared: Arc::new(shared) })
    }

    /// The device of the pool's memory.
    pub fn device(&self) -> Device {
        self.shared.device
    }

    /// The pool's figures: `reserved` is its segments (current and peak), `allocated` the blocks
    /// held by captures running now.
    pub fn stats(&self) -> CachingStats {
        self.shared.pool.stats()
    }

    /// Restarts the peaks of [`GraphPool::stats`] from their current values.
    pub fn reset_peaks(&self) {
        self.shared.pool.reset_peaks();
    }

    /// Every segment of the pool as (address, bytes).
    pub fn segment_ranges(&self) -> Vec<(usize, usize)> {
        self.shared.pool.segment_ranges()
    }

    /// True if `ptr` lies in one of the pool's segments.
    pub fn contains<T>(&self, ptr: *const T) -> bool {
        self.shared.pool.contains(ptr as usize)
    }

    /// True if both are handles of one pool.
    pub fn same_pool(&self, other: &GraphPool) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// Adds the pools of `more` to `pools`, kept in the order turns are taken in (by id, each once).
pub(crate) fn merge_pools(pools: &mut Vec<GraphPool>, more: Vec<GraphPool>) {
    pools.extend(more);
    pools.sort_by_key(|p| p.shared.id);
    pools.dedup_by(|a, b| a.same_pool(b));
}

/// The turns of a graph's pools, held while its launches may run; given back on drop.
pub(crate) struct Turns<'a> {
    taken: &'a [GraphPool],
    /// Whether `TURNS_HELD` counts these.
    counted: bool,
}

impl<'a> Turns<'a> {
    /// Takes the turn of every pool of `pools` (sorted by id, so two threads never wait for each
    /// other's), waiting while another thread holds one. A pool whose turn this thread holds
    /// already (a launch from inside `run`'s closure) is an error, as waiting would never end.
    ///
    /// A thread that holds turns already (a launch from inside another graph's `run`) does not
    /// wait for another thread either: it could be waiting for a thread that waits for it, so a
    /// busy pool is an error there too.
    pub(crate) fn take(pools: &'a [GraphPool]) -> Result<Self> {
        if pools.is_empty() {
            return Ok(Turns { taken: pools, counted: false });
        }
        let me = std::thread::current().id();
        let nested = TURNS_HELD.get() > 0;
        let mut turns = Turns { taken: &pools[..0], counted: false };
        for (i, pool) in pools.iter().enumerate() {
            let shared = &*pool.shared;
            let mut turn = shared.turn.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                let why = match *turn {
                    None => break,
                    Some(holder) if holder == me => {
                        "a graph of this pool is being run by this thread (launch it after that run)"
                    }
                    Some(_) if nested => {
                        "a graph of this pool runs on another thread, and waiting for it inside a run could deadlock"
                    }
                    Some(_) => {
                        turn = shared.turn_ended.wait(turn).unwrap_or_else(PoisonError::into_inner);
                        continue;
                    }
                };
                let kind = ErrorKind::InvalidArgument(why);
                return Err(CudaError::new(kind, format!("launching a graph of GraphPool {}", shared.id)));
            }
            *turn = Some(me);
            turns.taken = &pools[..=i];
        }
        TURNS_HELD.set(TURNS_HELD.get() + 1);
        turns.counted = true;
        Ok(turns)
    }
}

impl Turns<'_> {
    /// Makes `stream` wait (on the device) for the last launch of each pool queued without a host
    /// wait, so no two graphs of a pool overlap whatever streams they run on.
    pub(crate) fn order_after_launches(&self, stream: &Stream) -> Result<()> {
        for pool in self.taken {
            let last = pool.shared.last_launch.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(fence) = last {
                stream.wait_event(&fence)?;
            }
        }
        Ok(())
    }

    /// Leaves a fence after the launch just queued on `stream` for the pools' next launches. If
    /// none can be recorded, waits for `stream` instead (before the turns are given back), so no
    /// later launch can overlap this one.
    pub(crate) fn fence_launch(&self, stream: &Stream) -> Result<()> {
        if self.taken.is_empty() {
            return Ok(());
        }
        let fence = match stream.record_event_untimed() {
            Ok(fence) => Arc::new(fence),
            Err(err) => return crate::scope::merge(Err(err), stream.synchronize()),
        };
        for pool in self.taken {
            *pool.shared.last_launch.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&fence));
        }
        Ok(())
    }
}

thread_local! {
    /// How many `Turns` this thread holds (runs in progress on it).
    static TURNS_HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Drop for Turns<'_> {
    fn drop(&mut self) {
        if self.counted {
            TURNS_HELD.set(TURNS_HELD.get() - 1);
        }
        for pool in self.taken {
            *pool.shared.turn.lock().unwrap_or_else(PoisonError::into_inner) = None;
            pool.shared.turn_ended.notify_all();
        }
    }
}

/// The blocks a capture holds, returned to their pools at its end (or when it fails or unwinds),
/// and the pools its graph uses.
#[derive(Default)]
pub(crate) struct CapturedBlocks {
    blocks: RefCell<Vec<(GraphPool, CachedBlock)>>,
    /// The pools of blocks returned before the end of the capture, which the graph uses too.
    released: RefCell<Vec<GraphPool>>,
}

impl fmt::Debug for CapturedBlocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CapturedBlocks").field("blocks", &self.blocks.borrow().len()).finish()
    }
}

impl CapturedBlocks {
    /// A block of at least `bytes` (non-zero) from `pool`, held until the capture ends.
    pub(crate) fn alloc(&self, pool: &GraphPool, bytes: usize) -> Result<NonNull<u8>> {
        let block = pool.shared.pool.alloc(bytes)?;
        let ptr = block.ptr();
        self.blocks.borrow_mut().push((pool.clone(), block));
        Ok(ptr)
    }

    /// Returns the block at `ptr` of exactly `bytes` requested to its pool before the end of the
    /// capture; false if this capture holds no such block.
    ///
    /// # Safety
    /// No view of the block that captured work can reach is left (the caller consumed the whole
    /// view `alloc` was made for), and all captured work that used it is queued before the work
    /// captured after this call.
    pub(crate) unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) -> bool {
        let mut blocks = self.blocks.borrow_mut();
        let Some(at) = blocks.iter().position(|(_, b)| b.ptr() == ptr && b.requested() == bytes) else {
            return false;
        };
        let (pool, block) = blocks.swap_remove(at);
        // SAFETY: from this pool. The work that used the block so far is this capture's, ordered
        // before every later use of the memory in this graph (the caller's promise), and the graph
        // keeps the pool and takes turns with the pool's other graphs, as in `finish`. The pool
        // stays recorded for the graph through `pool`'s other blocks or, if none, below.
        unsafe { pool.shared.pool.free(block) };
        self.released.borrow_mut().push(pool);
        true
    }

    /// Returns every block to its pool (the end of the capture); the pools, for the graph.
    pub(crate) fn finish(&self) -> Vec<GraphPool> {
        let mut pools = std::mem::take(&mut *self.released.borrow_mut());
        for (pool, block) in self.blocks.borrow_mut().drain(..).rev() {
            // SAFETY: from this pool. The only work that uses the block is the captured graph's
            // (its views are refused once the capture ends): that graph holds the pool, so the
            // pool is dropped after it, and it runs only inside `GraphExec::run`, which holds the
            // turn of every pool the graph used until its launches have completed, or from
            // `Launches` in a scope, which takes the turns while it queues and orders the launch
            // after the pools' last one on the device (`Turns::order_after_launches`); so it never
            // runs concurrently with another graph of the pool, to which later blocks go. A
            // graph that is never made (a failed capture) runs nothing.
            unsafe { pool.shared.pool.free(block) };
            pools.push(pool);
        }
        let mut merged = Vec::new();
        merge_pools(&mut merged, pools);
        merged
    }
}

impl Drop for CapturedBlocks {
    fn drop(&mut self) {
        self.finish();
    }
}

/// `cudaMalloc` segments on one device, also while the calling thread captures.
struct GraphSegments {
    device: Device,
}

impl GraphSegments {
    fn malloc(&self, bytes: usize) -> Result<NonNull<u8>> {
        let _device = CurrentDevice::set(self.device)?;
        let fresh = raw::memory::malloc(bytes, self.device.as_raw())?;
        // SAFETY: allocated just now, never used.
        raw::typed::<u8>(fresh, "GraphPool segment", |p| unsafe { raw::memory::free(p, || "a segment".into()) })
    }
}

// SAFETY: segments are fresh `cudaMalloc` memory (256-byte aligned) that no live segment
// overlaps, released once by `cudaFree`.
unsafe impl SegmentSource for GraphSegments {
    type Error = CudaError;

    fn allocate(&self, bytes: usize) -> Result<NonNull<u8>> {
        // A capture in global or thread-local mode refuses `cudaMalloc` on this thread; the
        // allocation is not a stream operation and the graph does not record it, so the thread
        // is relaxed for the call (as PyTorch's allocator does).
        graphs::with_capture_relaxed(
            || self.malloc(bytes),
            // SAFETY: allocated just now, never used, released once.
            |fresh| unsafe { self.release(fresh, bytes) },
        )
    }

    unsafe fn release(&self, base: NonNull<u8>, bytes: usize) {
        let device = CurrentDevice::set(self.device);
        // SAFETY: a segment of this source, released once, that no work uses (the caller's
        // contract); cudaFree waits for the device anyway.
        raw::quiet(unsafe { raw::memory::free(base.as_ptr().cast(), || format!("a {bytes}-byte graph segment")) });
        drop(device);
    }
}

#[cfg(test)]
mod tests {
    //! Turns without a GPU: a pool makes no CUDA call until a capture allocates from it.

    use super::*;
    use std::sync::mpsc;

    fn pool() -> GraphPool {
        GraphPool::with_config(Device::new_unchecked_for_tests(0), &Config::default()).unwrap()
    }

    fn refused(result: Result<Turns<'_>>) -> bool {
        matches!(result.map(drop).unwrap_err().kind(), ErrorKind::InvalidArgument(_))
    }

    #[test]
    fn a_thread_running_a_graph_of_a_pool_cannot_launch_another_of_it() {
        let (p, q) = (pool(), pool());
        let mut pools = Vec::new();
        merge_pools(&mut pools, vec![q.clone(), p.clone(), q.clone()]);
        assert_eq!(pools.len(), 2, "each pool once");
        let outer = Turns::take(&pools).unwrap();
        assert!(refused(Turns::take(std::slice::from_ref(&p))));
        drop(outer);
        let again = Turns::take(std::slice::from_ref(&p)).unwrap();
        let other = Turns::take(std::slice::from_ref(&q)).unwrap(); // nested, but free: taken
        drop((other, again));
    }

    #[test]
    fn another_thread_waits_for_the_turn_and_a_nested_take_refuses_to_wait() {
        let (p, q) = (pool(), pool());
        let (held_tx, held_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        std::thread::scope(|scope| {
            let held = &p;
            let holder = scope.spawn(move || {
                let turns = Turns::take(std::slice::from_ref(held)).unwrap();
                held_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                drop(turns);
            });
            held_rx.recv().unwrap();
            {
                // This thread holds q's turn: waiting for p (held by a thread that may wait for
                // q) is refused rather than risked.
                let outer = Turns::take(std::slice::from_ref(&q)).unwrap();
                assert!(refused(Turns::take(std::slice::from_ref(&p))));
                drop(outer);
            }
            let waiter = scope.spawn(|| Turns::take(std::slice::from_ref(&p)).map(drop).is_ok());
            go_tx.send(()).unwrap();
            holder.join().unwrap();
            assert!(waiter.join().unwrap(), "the waiting thread takes the turn once it is free");
        });
    }
}
