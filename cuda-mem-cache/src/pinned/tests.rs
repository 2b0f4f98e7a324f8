//! The pinned pool's bookkeeping over the fake backend: reuse, fences, the cap, shrinking,
//! counts, and the per-thread front caches (trim, thread exit, drop from another thread).

use super::cache::{Block, BlockCache, PinnedPoolStats};
use super::fake::{FakeBackend, FakeFence};
use super::front::{FRONT_DEPTH, LEASE_STOCK};
use super::size_class::class_of;
use std::sync::atomic::Ordering;
use std::sync::mpsc::channel;
use std::time::Duration;

fn alloc(cache: &BlockCache<FakeBackend>, bytes: usize) -> Block<FakeFence> {
    let class = class_of(bytes).unwrap();
    cache.take(class).unwrap_or_else(|| cache.allocate(class).unwrap())
}

#[test]
fn freed_blocks_are_reused_and_counted() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    let a = alloc(&cache, 1 << 20);
    let first_ptr = a.ptr();
    assert_eq!(
        cache.stats(),
        PinnedPoolStats { in_use_bytes: 1 << 20, peak_in_use_bytes: 1 << 20, misses: 1, ..Default::default() }
    );
    cache.put(a).unwrap();
    assert_eq!(cache.stats().cached_bytes, 1 << 20);
    assert_eq!(cache.stats().in_use_bytes, 0);
    let b = alloc(&cache, (1 << 20) - 5); // same class
    assert_eq!(b.ptr(), first_ptr);
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.cached_bytes, stats.in_use_bytes), (1, 1, 0, 1 << 20));
    cache.put(b).unwrap();
}

#[test]
fn a_block_is_not_reused_while_its_fence_is_pending() {
    // With front caches (no cap) and without; a fenced block never parks in a front cache.
    for cap in [usize::MAX, 1 << 30] {
        let cache = BlockCache::new(FakeBackend::default(), cap);
        let mut a = alloc(&cache, 8192);
        let fence = FakeFence::default();
        a.record(fence.clone());
        let a_ptr = a.ptr();
        cache.put(a).unwrap();
        let b = alloc(&cache, 8192);
        assert_ne!(b.ptr(), a_ptr, "reused while the DMA was in flight");
        assert_eq!(cache.stats().misses, 2);
        // Another thread cannot have it either.
        std::thread::scope(|s| {
            s.spawn(|| assert!(cache.take(class_of(8192).unwrap()).is_none()));
        });
        fence.store(true, Ordering::Release);
        let c = alloc(&cache, 8192);
        assert_eq!(c.ptr(), a_ptr);
        cache.put(b).unwrap();
        cache.put(c).unwrap();
    }
}

#[test]
fn a_block_freed_while_its_fence_is_pending_waits_even_behind_a_parked_one() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    let (mut fenced, plain) = (alloc(&cache, 4096), alloc(&cache, 4096));
    let fence = FakeFence::default();
    fenced.record(fence.clone());
    let (fenced_ptr, plain_ptr) = (fenced.ptr(), plain.ptr());
    cache.put(plain).unwrap(); // parked in this thread's front cache
    cache.put(fenced).unwrap(); // to the shared list
    let first = alloc(&cache, 4096);
    assert_eq!(first.ptr(), plain_ptr);
    let second = alloc(&cache, 4096);
    assert_ne!(second.ptr(), fenced_ptr, "handed out with its work pending");
    fence.store(true, Ordering::Release);
    let third = alloc(&cache, 4096);
    assert_eq!(third.ptr(), fenced_ptr);
    assert_eq!(cache.stats().in_use_bytes, 3 * 4096);
    for block in [first, second, third] {
        cache.put(block).unwrap();
    }
}

#[test]
fn the_cap_releases_the_oldest_blocks_and_oversized_blocks_are_never_cached() {
    let cache = BlockCache::new(FakeBackend::default(), 3 * 4096);
    let blocks: Vec<_> = (0..5).map(|_| alloc(&cache, 4096)).collect();
    for block in blocks {
        cache.put(block).unwrap();
    }
    assert_eq!(cache.stats().cached_bytes, 3 * 4096);
    assert_eq!(cache.backend().released.lock().unwrap().len(), 2);
    let big = alloc(&cache, 1 << 20);
    cache.put(big).unwrap();
    assert_eq!(cache.stats().cached_bytes, 3 * 4096);
    assert_eq!(*cache.backend().released.lock().unwrap().last().unwrap(), 1 << 20);
}

#[test]
fn shrinking_releases_everything_and_reports_bytes() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    let (a, b) = (alloc(&cache, 4096), alloc(&cache, 10_000));
    let expected = a.class().bytes() + b.class().bytes();
    cache.put(a).unwrap();
    cache.put(b).unwrap();
    assert_eq!(cache.shrink_to(0, None), expected);
    assert_eq!(cache.stats().cached_bytes, 0);
    assert_eq!(cache.backend().released.lock().unwrap().iter().sum::<usize>(), expected);
}

#[test]
fn counters_are_exact_across_threads() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let cache = cache.clone();
            std::thread::spawn(move || {
                for i in 0..if cfg!(miri) { 20 } else { 500 } {
                    let block = alloc(&cache, 4096 << ((t + i) % 4));
                    cache.put(block).unwrap();
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

#[test]
fn a_front_cache_keeps_its_depth_per_class_and_the_rest_stays_cached() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    let n = FRONT_DEPTH + 3;
    let blocks: Vec<_> = (0..n).map(|_| alloc(&cache, 4096)).collect();
    for block in blocks {
        cache.put(block).unwrap();
    }
    let stats = cache.stats();
    assert_eq!((stats.cached_bytes, stats.in_use_bytes, stats.misses), (n * 4096, 0, n as u64));
    let again: Vec<_> = (0..n).map(|_| alloc(&cache, 4096)).collect();
    assert_eq!((cache.stats().hits, cache.stats().misses), (n as u64, n as u64));
    for block in again {
        cache.put(block).unwrap();
    }
    assert_eq!(cache.shrink_to(0, None), n * 4096);
}

#[test]
fn a_front_hit_takes_no_shared_lock() {
    let cache = &BlockCache::new(FakeBackend::default(), usize::MAX);
    let class = class_of(4096).unwrap();
    let ((warm, warmed), (go, started), (done, finished)) = (channel(), channel(), channel());
    std::thread::scope(|s| {
        s.spawn(move || {
            let block = alloc(cache, 4096);
            cache.put(block).unwrap();
            warm.send(()).unwrap();
            started.recv().unwrap();
            for _ in 0..100 {
                let block = cache.take(class).expect("a front hit");
                cache.put(block).unwrap();
            }
            done.send(()).unwrap();
        });
        warmed.recv().unwrap();
        let held = cache.hold_shared(class);
        go.send(()).unwrap();
        let pairs = finished.recv_timeout(Duration::from_secs(60));
        drop(held);
        pairs.expect("hot pairs waited for the shared list or the registry");
    });
}

#[test]
fn trimming_releases_blocks_parked_in_other_threads_front_caches() {
    let cache = &BlockCache::new(FakeBackend::default(), usize::MAX);
    let ((parked, wait_parked), (trimmed, wait_trimmed)) = (channel(), channel());
    std::thread::scope(|s| {
        s.spawn(move || {
            let block = alloc(cache, 1 << 20);
            cache.put(block).unwrap();
            parked.send(()).unwrap();
            wait_trimmed.recv().unwrap();
            // Its front cache was emptied: this is a new block.
            let block = alloc(cache, 1 << 20);
            assert_eq!(cache.stats().misses, 2);
            cache.put(block).unwrap();
        });
        wait_parked.recv().unwrap();
        assert_eq!(cache.stats().cached_bytes, 1 << 20);
        assert_eq!(cache.shrink_to(0, None), 1 << 20);
        assert_eq!(cache.stats().cached_bytes, 0);
        trimmed.send(()).unwrap();
    });
    assert_eq!(*cache.backend().released.lock().unwrap(), [1 << 20]);
}

#[test]
fn a_threads_exit_returns_its_front_cache_and_keeps_its_counts() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    let thread_cache = cache.clone();
    let parked_ptr = std::thread::spawn(move || {
        let block = alloc(&thread_cache, 8192);
        let ptr = block.ptr().as_ptr() as usize;
        thread_cache.put(block).unwrap();
        ptr
    })
    .join()
    .unwrap();
    assert_eq!(
        cache.stats(),
        PinnedPoolStats { cached_bytes: 8192, peak_in_use_bytes: 8192, misses: 1, ..Default::default() }
    );
    let block = alloc(&cache, 8192);
    assert_eq!(block.ptr().as_ptr() as usize, parked_ptr, "the exited thread's block is in the shared list");
    assert_eq!((cache.stats().hits, cache.stats().misses), (1, 1));
    cache.put(block).unwrap();
}

#[test]
fn dropping_the_pool_on_another_thread_releases_living_threads_parked_blocks_once() {
    let backend = FakeBackend::default();
    let released = std::sync::Arc::clone(&backend.released);
    let cache = BlockCache::new(backend, usize::MAX);
    let ((to_thread, from_main), (parked, wait_parked), (finish, wait_finish)) = (channel(), channel(), channel());
    let thread = std::thread::spawn(move || {
        let cache: BlockCache<FakeBackend> = from_main.recv().unwrap();
        let block = alloc(&cache, 4096);
        cache.put(block).unwrap();
        drop(cache);
        parked.send(()).unwrap();
        wait_finish.recv().unwrap();
        // A new pool on this thread: the dead pool's entry is pruned, its cache left alone.
        let other = BlockCache::new(FakeBackend::default(), usize::MAX);
        let block = alloc(&other, 4096);
        other.put(block).unwrap();
    }); // exits: the new pool's block returns to it; the dead pool's entry does nothing
    to_thread.send(cache.clone()).unwrap();
    wait_parked.recv_timeout(Duration::from_secs(60)).unwrap();
    let mine = alloc(&cache, 1 << 20);
    cache.put(mine).unwrap();
    drop(cache);
    let mut freed = released.lock().unwrap().clone();
    freed.sort_unstable();
    assert_eq!(freed, [4096, 1 << 20], "the thread's parked block was released with the pool");
    finish.send(()).unwrap();
    thread.join().unwrap();
    assert_eq!(released.lock().unwrap().len(), 2, "released once");
}

/// The bookkeeping cost of a hit pair without a GPU (take, the buffer's handle, put), for
/// comparing implementations: `cargo test --release -p cuda-mem --lib pinned_pool::tests::hit_pair
/// -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check: run it in release mode"]
fn hit_pair_bookkeeping_cost() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    let class = class_of(1 << 20).unwrap();
    let block = alloc(&cache, 1 << 20);
    cache.put(block).unwrap();
    let pairs = 1_000_000;
    let mut samples: Vec<f64> = (0..15)
        .map(|_| {
            let start = std::time::Instant::now();
            for _ in 0..pairs {
                let (block, lease) = std::hint::black_box(cache.take_leased(class).expect("a hit"));
                lease.put(block).unwrap();
            }
            start.elapsed().as_secs_f64() * 1e9 / f64::from(pairs)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    println!("pinned pool hit pair, bookkeeping only: {:.1} ns (median of 15)", samples[7]);
}

#[test]
fn hit_pairs_reuse_the_threads_stocked_lease() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    let class = class_of(1 << 20).unwrap();
    let block = alloc(&cache, 1 << 20);
    cache.lease().put(block).unwrap(); // the block parks, its lease in the stock
    let references = cache.references();
    assert_eq!(references, 2, "the handle and one stocked lease");
    for _ in 0..100 {
        let (block, lease) = cache.take_leased(class).expect("a front hit");
        assert_eq!(cache.references(), references, "the stocked lease was handed out, not a new one");
        lease.put(block).unwrap();
    }
    assert_eq!(cache.references(), references);
    assert_eq!(cache.stats().hits, 100);
}

#[test]
fn leases_stock_only_beside_parked_blocks_and_up_to_the_limit() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    // More blocks than park in one class: the extra leases are dropped with their blocks' trip to
    // the shared list.
    let n = FRONT_DEPTH + 2;
    let held: Vec<_> = (0..n).map(|_| (alloc(&cache, 4096), cache.lease())).collect();
    assert_eq!(cache.references(), 1 + n);
    for (block, lease) in held {
        lease.put(block).unwrap();
    }
    assert_eq!(cache.references(), 1 + FRONT_DEPTH, "one stocked lease per parked block");
    // Blocks of many classes park; the stock stops at its limit.
    // Distinct classes: powers of two, then 1.25 and 1.5 times them.
    let sizes: Vec<usize> = (0..LEASE_STOCK + 4).map(|i| (4096 << (i % 12)) + (i / 12) * (1024 << (i % 12))).collect();
    let held: Vec<_> = sizes.iter().map(|&bytes| (alloc(&cache, bytes), cache.lease())).collect();
    for (block, lease) in held {
        lease.put(block).unwrap();
    }
    assert_eq!(cache.references(), 1 + LEASE_STOCK);
    assert_eq!(cache.stats().in_use_bytes, 0);
}

/// A pool without a cap, the sizes its backend released, and a watch on its state.
fn observed_cache()
-> (BlockCache<FakeBackend>, std::sync::Arc<std::sync::Mutex<Vec<usize>>>, std::sync::Weak<impl Sized>) {
    let backend = FakeBackend::default();
    let released = std::sync::Arc::clone(&backend.released);
    let cache = BlockCache::new(backend, usize::MAX);
    let state = cache.state();
    (cache, released, state)
}

#[test]
fn dropping_the_last_handle_closes_the_pool_while_buffers_and_stocks_hold_it() {
    let (cache, released, state) = observed_cache();
    let ((to_thread, from_main), (parked, wait_parked), (finish, wait_finish)) = (channel(), channel(), channel());
    let thread = std::thread::spawn(move || {
        // A buffer freed here stocks its lease in this thread's front cache, which outlives the
        // pool's last handle.
        let (block, lease) = from_main.recv().unwrap();
        crate::pinned::cache::Lease::put(lease, block).unwrap();
        parked.send(()).unwrap();
        wait_finish.recv().unwrap();
    });
    let sent = (alloc(&cache, 4096), cache.lease());
    to_thread.send(sent).unwrap();
    wait_parked.recv_timeout(Duration::from_secs(60)).unwrap();
    let outstanding = (alloc(&cache, 8192), cache.lease());
    let cached = alloc(&cache, 1 << 20);
    cache.put(cached).unwrap();
    drop(cache); // the last handle: the pool closes
    let mut freed = released.lock().unwrap().clone();
    freed.sort_unstable();
    assert_eq!(freed, [4096, 1 << 20], "the parked and the cached block are released at the close");
    assert!(state.upgrade().is_some(), "the outstanding buffer's lease keeps the state");
    let (block, lease) = outstanding;
    lease.put(block).unwrap();
    assert_eq!(released.lock().unwrap().len(), 3, "a block returned after the close is released");
    assert!(state.upgrade().is_none(), "the thread's stock was emptied at the close: nothing keeps the state");
    finish.send(()).unwrap();
    thread.join().unwrap();
    assert_eq!(released.lock().unwrap().len(), 3, "each block released once");
}

#[test]
fn a_buffer_freed_on_a_new_thread_after_the_close_is_released() {
    let (cache, released, state) = observed_cache();
    let outstanding = (alloc(&cache, 4096), cache.lease());
    drop(cache);
    std::thread::spawn(move || {
        let (block, lease) = outstanding;
        lease.put(block).unwrap(); // registers a front cache of the closed pool, which parks nothing
    })
    .join()
    .unwrap();
    assert_eq!(*released.lock().unwrap(), [4096]);
    assert!(state.upgrade().is_none());
}

#[test]
fn a_forgotten_buffer_leaks_its_block_and_the_state_and_nothing_is_released_twice() {
    let (cache, released, state) = observed_cache();
    // What `mem::forget` on a buffer leaves: its block and lease never come back (held here, so
    // that the test can return them at the end instead of leaking under miri).
    let forgotten = std::mem::ManuallyDrop::new((alloc(&cache, 4096), cache.lease()));
    let kept = alloc(&cache, 8192);
    cache.put(kept).unwrap();
    drop(cache);
    assert_eq!(
        *released.lock().unwrap(),
        [8192],
        "the cached block goes at the close; the forgotten one is never released"
    );
    assert!(state.upgrade().is_some(), "the forgotten lease keeps the state alive: a leak, never a free");
    let (block, lease) = std::mem::ManuallyDrop::into_inner(forgotten);
    lease.put(block).unwrap();
    assert_eq!(*released.lock().unwrap(), [8192, 4096]);
    assert!(state.upgrade().is_none());
}

/// The forgeries of the pinned cache's public API that compile (the rest are compile-fail doc
/// tests on `Block` and `PinnedClass`): each refused with a typed error, nothing released twice.
#[test]
fn a_block_put_into_another_pool_is_refused_and_given_back() {
    for cap in [usize::MAX, 1 << 30] {
        let (mine, other) =
            (BlockCache::new(FakeBackend::default(), cap), BlockCache::new(FakeBackend::default(), cap));
        let block = alloc(&mine, 4096);
        let ptr = block.ptr();
        let refused = other.put(block).unwrap_err();
        assert_eq!(refused.to_string(), "a pinned block of 4096 bytes put into a pool that did not make it");
        let refused = other.lease().put(refused.into_block()).unwrap_err();
        let block = refused.into_block();
        assert_eq!(block.ptr(), ptr, "the caller gets its block back");
        assert_eq!(other.stats(), PinnedPoolStats::default(), "the other pool counted nothing");
        mine.put(block).unwrap();
        let again = alloc(&mine, 4096);
        assert_eq!(again.ptr(), ptr, "its own pool reuses it");
        mine.put(again).unwrap();
        drop(other);
        assert!(mine.backend().released.lock().unwrap().is_empty());
    }
}

#[test]
fn a_block_outliving_its_pool_is_refused_by_a_new_one() {
    let block = {
        let pool = BlockCache::new(FakeBackend::default(), usize::MAX);
        alloc(&pool, 4096)
    };
    let next = BlockCache::new(FakeBackend::default(), usize::MAX);
    let refused = next.put(block).unwrap_err();
    assert!(next.backend().released.lock().unwrap().is_empty());
    // No pool can release it now (its memory would leak, as a forgotten block's does): the test
    // frees it itself, so that Miri's leak check stays on.
    let (ptr, class, _) = refused.into_block().into_raw_parts();
    let layout = std::alloc::Layout::from_size_align(class.bytes(), 4096).unwrap();
    // SAFETY: the fake allocated it with this layout, and nothing else will free it.
    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
}

#[test]
fn a_refused_allocation_is_a_typed_error_and_counts_nothing() {
    let cache = BlockCache::new(FakeBackend::default(), usize::MAX);
    cache.backend().refusals.store(1, Ordering::Relaxed);
    let class = class_of(8192).unwrap();
    assert_eq!(cache.allocate(class).unwrap_err(), super::fake::FakeRefusal { bytes: 8192 });
    assert_eq!(cache.stats(), PinnedPoolStats::default());
    let block = cache.allocate(class).unwrap();
    assert_eq!((cache.stats().misses, cache.stats().in_use_bytes), (1, 8192));
    cache.put(block).unwrap();
}

#[test]
fn raw_parts_make_the_same_block_again() {
    let cache = BlockCache::new(FakeBackend::default(), 1 << 30);
    let mut block = alloc(&cache, 5000);
    let fence = FakeFence::default();
    block.record(fence.clone());
    let (ptr, class, fences) = block.into_raw_parts();
    assert_eq!((class.bytes(), fences.len()), (5120, 1));
    // SAFETY: the parts of this pool's block, made again once.
    let block = unsafe { cache.lease().block_from_raw_parts(ptr, class, fences) };
    cache.lease().put(block).unwrap();
    let other = alloc(&cache, 5000);
    assert_ne!(other.ptr(), ptr, "its fence still holds it");
    fence.store(true, Ordering::Release);
    let again = alloc(&cache, 5000);
    assert_eq!(again.ptr(), ptr);
    cache.put(other).unwrap();
    cache.put(again).unwrap();
}

#[test]
fn shrinking_takes_the_named_class_first() {
    let cache = BlockCache::new(FakeBackend::default(), 1 << 30);
    let (small, large) = (alloc(&cache, 4096), alloc(&cache, 1 << 20));
    let small_class = small.class();
    cache.put(small).unwrap();
    cache.put(large).unwrap();
    assert_eq!(cache.shrink_to(1 << 20, Some(small_class)), 4096);
    assert_eq!(*cache.backend().released.lock().unwrap(), [4096]);
}

/// A backend written by a user, safe code only, that lies: every allocation returns the same
/// dangling address and fences are never done. The cache never dereferences a block, so what it
/// can still owe is its own contract: each allocation released once, with its bytes, after a wait
/// for its fences, and never a panic.
#[test]
fn a_lying_backend_gets_each_allocation_released_once_after_its_fences() {
    #[derive(Default)]
    struct Liar {
        allocated: std::sync::Mutex<Vec<usize>>,
        released: std::sync::Mutex<Vec<usize>>,
        waits: std::sync::atomic::AtomicUsize,
    }
    impl super::cache::PinnedBackend for Liar {
        type Fence = ();
        type Error = ();
        fn allocate(&self, bytes: usize) -> Result<std::ptr::NonNull<u8>, ()> {
            self.allocated.lock().unwrap().push(bytes);
            Ok(std::ptr::NonNull::dangling())
        }
        fn is_done(&self, (): &()) -> bool {
            false
        }
        fn wait(&self, (): &()) {
            self.waits.fetch_add(1, Ordering::Relaxed);
        }
        unsafe fn release(&self, _: std::ptr::NonNull<u8>, bytes: usize) {
            self.released.lock().unwrap().push(bytes);
        }
    }
    for cap in [usize::MAX, 1 << 30] {
        let cache = BlockCache::new(Liar::default(), cap);
        let class = class_of(8192).unwrap();
        let (mut a, b) = (cache.allocate(class).unwrap(), cache.allocate(class).unwrap());
        assert_eq!(a.ptr(), b.ptr(), "the liar's address, twice");
        a.record(());
        cache.put(a).unwrap();
        cache.put(b).unwrap();
        // The fenced block is never ready (its fence never completes); the plain one is.
        let c = cache.take(class).expect("the unfenced block");
        assert!(cache.take(class).is_none(), "a block whose fence is pending is not handed out");
        cache.put(c).unwrap();
        assert_eq!(cache.shrink_to(0, None), 2 * 8192);
        assert_eq!(*cache.backend().released.lock().unwrap(), [8192, 8192], "each allocation released once");
        assert_eq!(*cache.backend().allocated.lock().unwrap(), [8192, 8192]);
        assert_eq!(cache.backend().waits.load(Ordering::Relaxed), 1, "released only after a wait for its fence");
    }
}
