use super::*;
use cuda_mem::ErrorKind;
use std::alloc::Layout;
use std::sync::atomic::AtomicBool;

const KIB: usize = 1024;

/// Small segments, so the tests can count them: blocks up to 4 KiB share 16 KiB segments, larger
/// ones take 64 KiB segments or, from 32 KiB, one of their own.
pub(crate) fn config() -> Config {
    Config {
        small_max: 4 * KIB,
        small_segment: 16 * KIB,
        large_segment: 64 * KIB,
        own_segment_from: 32 * KIB,
        granularity: 16 * KIB,
        small_segment_divisor: 0,
        small_fit_divisor: 0,
        expandable_segments: false,
        ..Config::default()
    }
}

const SMALL: usize = 16 * KIB;

/// Host memory standing in for the driver's: counts the bytes held and the synchronizes.
#[derive(Debug, Default)]
pub(crate) struct Driver {
    held: AtomicUsize,
    syncs: AtomicUsize,
    refuse_sync: AtomicBool,
}

#[derive(Debug)]
pub(crate) struct HostMemory(pub(crate) Arc<Driver>);

/// Host memory aligned as the driver's, given back when dropped.
struct Held {
    ptr: NonNull<u8>,
    layout: Layout,
    driver: Arc<Driver>,
}

// SAFETY: owns its allocation, which nothing here reads or writes.
unsafe impl Send for Held {}

impl Drop for Held {
    fn drop(&mut self) {
        self.driver.held.fetch_sub(self.layout.size(), Ordering::Relaxed);
        // SAFETY: allocated in `allocate` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: distinct host allocations of the global allocator, aligned to 256, each held until its
// `Held` drops.
unsafe impl PoolMemory for HostMemory {
    fn allocate(&self, bytes: usize) -> Result<(NonNull<u8>, PoolBlock)> {
        let layout = Layout::from_size_align(bytes, 256).unwrap();
        // SAFETY: a non-zero size (the pools never ask for zero bytes).
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap();
        self.0.held.fetch_add(bytes, Ordering::Relaxed);
        Ok((ptr, Box::new(Held { ptr, layout, driver: Arc::clone(&self.0) })))
    }

    fn synchronize(&self) -> Result<()> {
        if self.0.refuse_sync.load(Ordering::Relaxed) {
            return Err(CudaError::new(ErrorKind::InvalidArgument("refused"), "a test's synchronize"));
        }
        self.0.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A capture of the streams listed; `None` for every stream when `unsure`.
struct Streams {
    captured: Vec<usize>,
    unsure: bool,
}

impl CaptureFilter for Streams {
    fn accepts(&self, stream: StreamRef<'static>) -> Option<bool> {
        (!self.unsure).then(|| self.captured.contains(&(stream.as_raw() as usize)))
    }
}

fn stream(handle: usize) -> StreamRef<'static> {
    // SAFETY: the handles are never used as streams here: the pools only compare them.
    unsafe { StreamRef::from_raw(handle as *mut _) }
}

fn capturing(streams: &[usize]) -> Box<dyn CaptureFilter> {
    Box::new(Streams { captured: streams.to_vec(), unsure: false })
}

fn pools() -> (GraphPools, Arc<Driver>) {
    let driver = Arc::new(Driver::default());
    (GraphPools::new(Box::new(HostMemory(Arc::clone(&driver))), config()), driver)
}

const P: PoolId = (1, 0);
const Q: PoolId = (2, 0);
const S1: usize = 0x10;
const S2: usize = 0x20;

/// Ends the capture into `pool`; the frees deferred until then, when it was the last.
fn ended(pools: &GraphPools, pool: PoolId) -> Vec<DeferredFree> {
    let mut handed = Vec::new();
    pools.end(pool, |deferred| handed = deferred);
    handed
}

/// Frees through the pools (during a capture, memory that is no pool block is the cache's).
fn free(pools: &GraphPools, ptr: NonNull<u8>, bytes: usize, on: usize) -> bool {
    // SAFETY: the tests use none of the blocks (host memory, never read).
    unsafe { pools.free(ptr, bytes, stream(on), || Ok(())) }.unwrap()
}

fn alloc(pools: &GraphPools, bytes: usize, on: usize) -> Option<NonNull<u8>> {
    pools.allocate(bytes, stream(on)).map(|r| r.expect("host memory"))
}

#[test]
fn outside_captures_the_cache_serves_and_frees_everything() {
    let (pools, driver) = pools();
    assert!(alloc(&pools, 100, S1).is_none());
    assert!(!free(&pools, NonNull::dangling(), 100, S1));
    assert_eq!((driver.held.load(Ordering::Relaxed), pools.reserved()), (0, 0));
}

#[test]
fn a_captures_blocks_are_fresh_and_come_back_only_to_its_pool_on_the_same_stream() {
    let (pools, driver) = pools();
    pools.begin(P, capturing(&[S1]), || ());
    assert!(alloc(&pools, 100, S2).is_none(), "a stream outside the capture is the cache's");
    let a = alloc(&pools, 100, S1).unwrap();
    assert_eq!((driver.held.load(Ordering::Relaxed), pools.reserved()), (SMALL, SMALL));
    assert!(free(&pools, a, 100, S1));
    assert_eq!(alloc(&pools, 200, S1), Some(a), "freed in the capture, reused in stream order");
    let b = alloc(&pools, 100, S1).unwrap();
    assert_ne!(a, b);
    assert!(ended(&pools, P).is_empty());

    assert!(alloc(&pools, 100, S1).is_none(), "after the capture the cache serves the stream");
    assert!(free(&pools, b, 100, S1), "a pool block never goes to the cache");
    assert!(free(&pools, a, 200, S1));

    pools.begin(Q, capturing(&[S1]), || ());
    let c = alloc(&pools, 100, S1).unwrap();
    assert!(c != a && c != b, "another pool never gets P's blocks");
    assert!(ended(&pools, Q).is_empty());

    pools.begin(P, capturing(&[S1, S2]), || ());
    let on_s2 = alloc(&pools, 100, S2).unwrap();
    assert!(on_s2 != a && on_s2 != b, "P's free blocks are reused on the stream they were used on only");
    let again = alloc(&pools, 100, S1).unwrap();
    assert!(again == a || again == b, "a capture sharing P reuses its blocks");
    ended(&pools, P);
    assert_eq!(driver.syncs.load(Ordering::Relaxed), 0);
}

#[test]
fn small_blocks_share_segments_and_large_blocks_are_kept_for_large_requests() {
    let (pools, driver) = pools();
    pools.begin(P, capturing(&[S1]), || ());
    let big = alloc(&pools, 1 << 20, S1).unwrap();
    assert!(free(&pools, big, 1 << 20, S1));
    let small = alloc(&pools, 1000, S1).unwrap();
    let other = alloc(&pools, 1000, S1).unwrap();
    assert!(small != big && other != big, "a small request never splits the large block");
    let (small_at, other_at) = (small.as_ptr() as usize, other.as_ptr() as usize);
    assert!(small_at.abs_diff(other_at) < SMALL, "two small blocks share one small segment");
    assert_eq!(pools.reserved(), (1 << 20) + SMALL);
    assert_eq!(driver.held.load(Ordering::Relaxed), pools.reserved());
    assert_eq!(alloc(&pools, 1 << 20, S1), Some(big), "the large block comes back for a large request");
    ended(&pools, P);
}

#[test]
fn a_released_pools_memory_goes_back_once_its_blocks_are_back_the_device_is_idle_and_no_capture_is_underway() {
    let (pools, driver) = pools();
    pools.begin(P, capturing(&[S1]), || ());
    let a = alloc(&pools, 4096, S1).unwrap();
    let output = alloc(&pools, 4096, S1).unwrap();
    assert_eq!(pools.reserved(), SMALL, "both in one small segment");
    assert!(free(&pools, a, 4096, S1));
    ended(&pools, P);
    assert_eq!(pools.release_freeable().unwrap(), 0, "the graph may still replay");

    pools.release(P);
    assert_eq!(pools.release_freeable().unwrap(), 0, "the graph's output is still out");
    assert_eq!(driver.syncs.load(Ordering::Relaxed), 0);

    pools.begin(Q, capturing(&[S2]), || ());
    assert!(free(&pools, output, 4096, S1), "the graph's output, freed after its pool was released");
    assert_eq!(pools.release_freeable().unwrap(), 0, "no cudaFree during a capture");
    assert_eq!(driver.held.load(Ordering::Relaxed), SMALL);
    ended(&pools, Q);
    assert_eq!(pools.release_freeable().unwrap(), SMALL);
    assert_eq!(driver.syncs.load(Ordering::Relaxed), 1, "after the device is idle");
    assert_eq!((driver.held.load(Ordering::Relaxed), pools.reserved()), (0, 0));
}

#[test]
fn a_pool_shared_by_two_graphs_lives_until_both_are_released() {
    let (pools, driver) = pools();
    for _ in 0..2 {
        pools.begin(P, capturing(&[S1]), || ());
        let block = alloc(&pools, 100, S1).unwrap();
        assert!(free(&pools, block, 100, S1));
        ended(&pools, P);
    }
    assert!(pools.release(P));
    assert_eq!(pools.release_freeable().unwrap(), 0, "the other graph still replays");
    assert!(pools.release(P));
    assert!(!pools.release(P), "one release too many is refused and changes nothing");
    assert!(!pools.release(Q), "a pool never captured into");
    assert_eq!(pools.release_freeable().unwrap(), SMALL);
    assert_eq!(driver.held.load(Ordering::Relaxed), 0);
}

#[test]
fn frees_of_the_caches_memory_wait_until_the_last_capture_ends() {
    let (pools, _) = pools();
    let foreign = NonNull::new(0x1000 as *mut u8).unwrap();
    let firsts = std::cell::Cell::new(0);
    pools.begin(P, capturing(&[S1]), || firsts.set(firsts.get() + 1));
    pools.begin(Q, capturing(&[S2]), || firsts.set(firsts.get() + 1));
    assert_eq!(firsts.get(), 1, "only the first capture underway holds the cache's event calls");
    let mut lasts = 0;
    assert!(!pools.end((9, 9), |_| lasts += 1));
    assert_eq!(lasts, 0, "an end without its begin changes nothing");
    assert!(free(&pools, foreign, 64, S2));
    assert!(ended(&pools, Q).is_empty(), "P is still being captured");
    let deferred = ended(&pools, P);
    assert_eq!(deferred.len(), 1);
    assert_eq!((deferred[0].ptr, deferred[0].bytes, deferred[0].stream.as_raw() as usize), (foreign, 64, S2));
    assert!(!free(&pools, foreign, 64, S2), "with no capture underway the cache frees at once");
}

#[test]
fn a_pool_block_with_another_size_and_memory_the_cache_does_not_hold_are_refused() {
    let (pools, _) = pools();
    pools.begin(P, capturing(&[S1]), || ());
    let block = alloc(&pools, 100, S1).unwrap();
    // SAFETY: the tests use none of the blocks; a refused free frees nothing.
    let refused =
        |ptr, bytes, cached: Result<()>| unsafe { pools.free(ptr, bytes, stream(S1), || cached) }.unwrap_err();
    assert!(refused(block, 200, Ok(())).to_string().contains("a size other than the block was allocated with"));
    let foreign = NonNull::new(0x1000 as *mut u8).unwrap();
    let not_cached = CudaError::new(ErrorKind::InvalidArgument("not the cache's"), "a test");
    assert!(refused(foreign, 64, Err(not_cached)).to_string().contains("not the cache's"));
    assert!(free(&pools, block, 100, S1), "still live after the refusal");
    assert_eq!(alloc(&pools, 60, S1), Some(block), "reused, now for 60 bytes");
    assert!(refused(block, 100, Ok(())).to_string().contains("(allocated as 60)"));
    assert!(free(&pools, block, 60, S1));
    assert!(ended(&pools, P).is_empty(), "nothing refused was held back");
}

#[test]
fn a_filter_that_cannot_tell_keeps_the_memory_in_its_pool() {
    let (pools, _) = pools();
    pools.begin(P, Box::new(Streams { captured: Vec::new(), unsure: true }), || ());
    let block = alloc(&pools, 100, S2).expect("kept in P rather than served by the cache");
    ended(&pools, P);
    assert!(free(&pools, block, 100, S2));
}

#[test]
fn a_failed_wait_for_the_device_keeps_the_blocks() {
    let (pools, driver) = pools();
    pools.begin(P, capturing(&[S1]), || ());
    let block = alloc(&pools, 100, S1).unwrap();
    ended(&pools, P);
    pools.release(P);
    assert!(free(&pools, block, 100, S1));
    driver.refuse_sync.store(true, Ordering::Relaxed);
    assert!(pools.release_freeable().is_err());
    assert_eq!((driver.held.load(Ordering::Relaxed), pools.reserved()), (SMALL, SMALL));
    driver.refuse_sync.store(false, Ordering::Relaxed);
    assert_eq!(pools.release_freeable().unwrap(), SMALL);
    assert_eq!(driver.held.load(Ordering::Relaxed), 0);
}

#[test]
fn captures_on_threads_never_share_a_block() {
    let (pools, _) = pools();
    let pools = &pools;
    let received: Vec<std::collections::HashSet<usize>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4usize)
            .map(|t| {
                scope.spawn(move || {
                    let (pool, on) = ((t as u64 + 10, 0), 0x100 * (t + 1));
                    pools.begin(pool, capturing(&[on]), || ());
                    let (mut live, mut received) = (Vec::new(), std::collections::HashSet::new());
                    for round in 0..200 {
                        let bytes = 64 + round % 3 * 200;
                        let block = alloc(pools, bytes, on).unwrap();
                        assert!(!live.iter().any(|&(b, _)| b == block), "handed out twice at once");
                        received.insert(block.as_ptr() as usize);
                        live.push((block, bytes));
                        if round % 2 == 1 {
                            let (block, bytes) = live.swap_remove(0);
                            assert!(free(pools, block, bytes, on));
                        }
                    }
                    ended(pools, pool);
                    received
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (i, mine) in received.iter().enumerate() {
        for theirs in &received[i + 1..] {
            assert!(mine.is_disjoint(theirs), "two pools shared a block");
        }
    }
}
