//! The allocator over the fake backend: reuse on a stream, across streams only after fences,
//! splitting and coalescing, release, out of memory, exact figures, threads.

use super::fake::{FakeBackend, FakeError};
use super::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

const S: StreamKey = StreamKey(0x10);
const T: StreamKey = StreamKey(0x20);

const KIB: usize = 1024;

/// Small segments so that the tests stay cheap under miri: 4 KiB classes and below share 16 KiB
/// segments, larger ones share 64 KiB ones, and 32 KiB and up get their own (16 KiB multiples).
/// The rules that keep the reserve close to its use are off here, and tested on their own.
fn small_config() -> Config {
    Config {
        small_max: 4 * KIB,
        small_segment: 16 * KIB,
        large_segment: 64 * KIB,
        own_segment_from: 32 * KIB,
        granularity: 16 * KIB,
        front_depth: 4,
        front_max_bytes: 1 << 20,
        front_max_block: usize::MAX,
        front_large_slot: false,
        cross_stream_waits: false,
        small_segment_divisor: 0,
        small_fit_divisor: 0,
        large_fit_slack: usize::MAX,
        release_idle_on_miss: false,
        live_slack_percent: 0,
        expandable_segments: true,
        max_mapping_bytes: 0,
        map_ahead_bytes: 0,
        own_range_from: 0,
        lowest_for_whole_pages: false,
    }
}

fn allocator(config: Config) -> (CachingAllocator<FakeBackend>, FakeBackend) {
    let backend = FakeBackend::default();
    (CachingAllocator::new(backend.clone(), config).unwrap(), backend)
}

fn free(allocator: &CachingAllocator<FakeBackend>, block: CachedBlock) {
    // SAFETY: the fake backend's memory is never touched; blocks come from `allocator`.
    unsafe { allocator.free(block) };
}

fn addr(block: &CachedBlock) -> usize {
    block.ptr().as_ptr().addr()
}

#[test]
fn a_block_freed_on_its_stream_is_reused_there_at_once() {
    for depth in [4, 0] {
        let (cache, backend) = allocator(Config { front_depth: depth, ..small_config() });
        let a = cache.alloc(4000, &S).unwrap();
        assert_eq!((a.bytes(), a.requested(), a.stream()), (4096, 4000, S));
        assert_eq!(addr(&a) % 512, 0);
        let first = addr(&a);
        backend.submit(S); // work using `a`, still running: the stream orders the reuse
        free(&cache, a);
        let b = cache.alloc(3900, &S).unwrap();
        assert_eq!(addr(&b), first, "front depth {depth}");
        let stats = cache.stats();
        assert_eq!((stats.misses, stats.front_hits + stats.core_hits), (1, 1));
        assert_eq!(stats.front_hits, if depth > 0 { 1 } else { 0 });
        free(&cache, b);
        cache.check_invariants();
    }
}

#[test]
fn another_stream_gets_an_idle_segment_only_after_its_fence_completes() {
    // The segment moves between the core's shards.
    assert_ne!(super::allocator::shard_of(S), super::allocator::shard_of(T));
    // A request of 16 KiB fills a small segment's worth in the large pool: one block per segment.
    let (cache, backend) = allocator(Config { front_depth: 0, ..small_config() });
    let a = cache.alloc(64 * KIB, &S).unwrap();
    let a_addr = addr(&a);
    let used = backend.submit(S);
    free(&cache, a);
    let b = cache.alloc(64 * KIB, &T).unwrap();
    assert_ne!(addr(&b), a_addr, "handed to T while S's work may still use it");
    assert_eq!(cache.stats().misses, 2);
    backend.complete(S);
    let c = cache.alloc(64 * KIB, &T).unwrap();
    assert_eq!(addr(&c), a_addr, "the fence recorded at the first miss has completed");
    assert!(backend.is_ordered(S, used, T));
    let stats = cache.stats();
    assert_eq!((stats.misses, stats.segments_adopted, stats.stream_waits), (2, 1, 0));
    assert_eq!(cache.held_streams(), [T], "the cache holds nothing of S any more");
    free(&cache, b);
    free(&cache, c);
    cache.check_invariants();
}

#[test]
fn another_stream_may_instead_wait_on_the_device_for_an_idle_segment() {
    let (cache, backend) = allocator(Config { front_depth: 0, cross_stream_waits: true, ..small_config() });
    let a = cache.alloc(64 * KIB, &S).unwrap();
    let a_addr = addr(&a);
    let used = backend.submit(S);
    free(&cache, a);
    assert!(!backend.is_ordered(S, used, T));
    let b = cache.alloc(64 * KIB, &T).unwrap();
    assert_eq!(addr(&b), a_addr);
    assert!(backend.is_ordered(S, used, T), "T's later work waits for S's");
    assert!(!backend.is_complete(S, used), "without blocking the host");
    let stats = cache.stats();
    assert_eq!((stats.misses, stats.segments_adopted, stats.stream_waits), (1, 1, 1));
    free(&cache, b);
}

#[test]
fn a_block_freed_on_a_foreign_stream_waits_for_that_streams_work() {
    let (cache, backend) = allocator(small_config());
    let a = cache.alloc(2048, &S).unwrap();
    let a_addr = addr(&a);
    let used = backend.submit(T); // T read the block (after waiting for S)
    // SAFETY: the last use was queued on T.
    unsafe { cache.free_on(a, &T).unwrap() };
    assert_eq!(cache.stats().pending_bytes, 2048);
    assert_eq!(cache.held_streams(), [S, T], "T's handle is kept while its fence is pending");
    let b = cache.alloc(2048, &S).unwrap();
    assert_ne!(addr(&b), a_addr, "reused on S while T's work may still use it");
    backend.complete(T);
    let c = cache.alloc(2048, &S).unwrap();
    assert_eq!(addr(&c), a_addr);
    assert!(backend.is_ordered(T, used, S));
    let stats = cache.stats();
    assert_eq!((stats.pending_bytes, stats.allocated.current, stats.misses), (0, 4096, 1));
    assert_eq!(cache.held_streams(), [S]);
    free(&cache, b);
    free(&cache, c);
    cache.check_invariants();
}

#[test]
fn a_fence_that_cannot_be_recorded_keeps_the_block_out_for_good() {
    let (cache, backend) = allocator(small_config());
    let a = cache.alloc(2048, &S).unwrap();
    backend.fail_records(true);
    // SAFETY: as above.
    assert!(unsafe { cache.free_on(a, &T) }.is_err());
    backend.fail_records(false);
    assert_eq!(cache.stats().allocated.current, 2048, "still counted as held");
    cache.empty_cache();
    assert_eq!(backend.reserved(), 16 * KIB, "its segment is not released");
    cache.check_invariants();
}

#[test]
fn blocks_split_from_a_segment_and_coalesce_back_into_it() {
    let (cache, _backend) = allocator(Config { front_depth: 0, ..small_config() });
    let blocks: Vec<_> = [1024, 2048, 4096, 512].into_iter().map(|b| cache.alloc(b, &S).unwrap()).collect();
    let base = addr(&blocks[0]);
    let offsets: Vec<_> = blocks.iter().map(|b| addr(b) - base).collect();
    assert_eq!(offsets, [0, 1024, 3072, 7168], "carved one after another from one segment");
    let stats = cache.stats();
    assert_eq!((stats.segments, stats.free_bytes, stats.largest_free_block), (1, 8704, 8704));
    assert_eq!(stats.idle_bytes, 0, "free space split off a segment in use is not idle");
    let mut blocks = blocks.into_iter();
    let (a, b, c, d) = (blocks.next().unwrap(), blocks.next().unwrap(), blocks.next().unwrap(), blocks.next().unwrap());
    free(&cache, b);
    free(&cache, d); // merges with the free tail
    let stats = cache.stats();
    assert_eq!((stats.free_bytes, stats.largest_free_block), (2048 + 9216, 9216));
    free(&cache, a); // merges with b
    assert_eq!((cache.stats().free_bytes, cache.stats().largest_free_block), (3072 + 9216, 9216));
    let e = cache.alloc(3072, &S).unwrap(); // fits the merged hole exactly: best fit
    assert_eq!(addr(&e), base);
    free(&cache, e);
    free(&cache, c); // everything merges: the segment is one free block again
    let stats = cache.stats();
    assert_eq!((stats.free_bytes, stats.largest_free_block, stats.reserved.current), (16 * KIB, 16 * KIB, 16 * KIB));
    assert_eq!(stats.idle_bytes, 16 * KIB);
    cache.check_invariants();
}

#[test]
fn large_requests_get_their_own_segment_and_its_rest_is_free() {
    let (cache, backend) = allocator(small_config());
    let a = cache.alloc(40 * KIB, &S).unwrap(); // class 40 KiB, own segment of 48 KiB
    assert_eq!(backend.live_segments().iter().map(|s| s.1).collect::<Vec<_>>(), [48 * KIB]);
    let b = cache.alloc(8 * KIB, &S).unwrap(); // the large pool's rest of it
    assert_eq!(addr(&b), addr(&a) + 40 * KIB);
    let c = cache.alloc(4 * KIB, &S).unwrap(); // the small pool: a segment of its own kind
    assert_eq!(backend.allocations(), 2);
    assert!(addr(&c) + 4 * KIB <= addr(&a) || addr(&c) >= addr(&a) + 48 * KIB, "not in the large segment");
    for block in [a, b, c] {
        free(&cache, block);
    }
}

#[test]
fn a_miss_releases_idle_segments_rather_than_raise_the_high_water_mark() {
    let config = Config { front_depth: 0, release_idle_on_miss: true, large_fit_slack: 8 * KIB, ..small_config() };
    let (cache, backend) = allocator(config);
    let [a, b, c] = [128, 48, 32].map(|k| cache.alloc(k * KIB, &S).unwrap()); // own segments
    free(&cache, a);
    free(&cache, b);
    // 112 KiB fits neither idle segment closely; beside them the reserve would pass its 208 KiB.
    // Releasing the larger one is enough not to.
    let d = cache.alloc(112 * KIB, &S).unwrap();
    assert_eq!(backend.take_released().iter().map(|r| r.1).collect::<Vec<_>>(), [128 * KIB]);
    let stats = cache.stats();
    assert_eq!(stats.reserved, CurrentPeak { current: 192 * KIB, peak: 208 * KIB });
    assert_eq!(backend.host_waits(), 0, "S had no work left: nothing waited for");
    // The other idle segment stayed cached for a later hit.
    let e = cache.alloc(40 * KIB, &S).unwrap();
    assert_eq!((cache.stats().misses, cache.stats().reserved.current), (4, 192 * KIB));
    for block in [c, d, e] {
        free(&cache, block);
    }
    cache.check_invariants();
}

#[test]
fn a_miss_releases_an_idle_segment_only_after_its_last_use() {
    let (cache, backend) = allocator(Config { front_depth: 0, release_idle_on_miss: true, ..small_config() });
    let a = cache.alloc(64 * KIB, &S).unwrap();
    let used = backend.submit(S); // still running when the next miss looks at the segment
    free(&cache, a);
    let b = cache.alloc(80 * KIB, &S).unwrap();
    let released = backend.take_released();
    assert_eq!(released.iter().map(|r| r.1).collect::<Vec<_>>(), [64 * KIB]);
    assert!(backend.is_complete(S, used), "released only after S's work on it");
    assert_eq!(backend.host_waits(), 1);
    assert_eq!(cache.stats().reserved, CurrentPeak { current: 80 * KIB, peak: 80 * KIB });
    // A segment whose last use cannot be fenced stays: the miss grows instead.
    free(&cache, b);
    backend.fail_records(true);
    let c = cache.alloc(96 * KIB, &S).unwrap();
    assert!(backend.take_released().is_empty());
    assert_eq!(cache.stats().reserved.current, 176 * KIB);
    backend.fail_records(false);
    free(&cache, c);
    cache.check_invariants();
}

#[test]
fn a_large_free_block_is_not_cut_for_a_much_smaller_request() {
    let config = Config { front_depth: 0, large_fit_slack: 16 * KIB, ..small_config() };
    let (cache, backend) = allocator(config);
    let a = cache.alloc(128 * KIB, &S).unwrap();
    let a_addr = addr(&a);
    free(&cache, a);
    let b = cache.alloc(120 * KIB, &S).unwrap(); // leaves 8 KiB: close enough
    assert_eq!(addr(&b), a_addr);
    free(&cache, b);
    let c = cache.alloc(8 * KIB, &S).unwrap(); // would leave 120 KiB pinned by a small block
    assert!(addr(&c) < a_addr || addr(&c) >= a_addr + 128 * KIB, "a new large segment");
    assert_eq!(backend.live_segments().len(), 2);
    let c_addr = addr(&c);
    free(&cache, c);
    let d = cache.alloc(16 * KIB, &S).unwrap(); // a block of the large segments' size is cut freely
    assert_eq!(addr(&d), c_addr);
    assert_eq!(cache.stats().misses, 2);
    free(&cache, d);
    cache.check_invariants();
}

#[test]
fn small_segments_grow_with_the_small_pool_and_serve_close_requests() {
    let config = Config { front_depth: 0, small_segment_divisor: 4, small_fit_divisor: 8, ..small_config() };
    let (cache, backend) = allocator(config);
    let a = cache.alloc(3 * KIB, &S).unwrap(); // an empty pool grows by the request
    let b = cache.alloc(1024, &S).unwrap(); // then by a quarter of 3 KiB: 512 bytes
    let sizes = || backend.live_segments().iter().map(|s| s.1).collect::<Vec<_>>();
    let mut grown = sizes();
    grown.sort();
    assert_eq!(grown, [1024, 3 * KIB]);
    let a_addr = addr(&a);
    free(&cache, a);
    let c = cache.alloc(512, &S).unwrap(); // would leave 2.5 KiB of a 3 KiB block: a new segment
    assert!(addr(&c) != a_addr);
    let d = cache.alloc(2800, &S).unwrap(); // class 3 KiB: fits exactly
    assert_eq!(addr(&d), a_addr);
    for block in [b, c, d] {
        free(&cache, block);
    }
    cache.check_invariants();
}

#[test]
fn empty_cache_releases_idle_segments_including_front_caches_and_keeps_held_ones() {
    let (cache, backend) = allocator(small_config());
    let held = cache.alloc(1024, &S).unwrap();
    let parked = cache.alloc(40 * KIB, &S).unwrap();
    backend.submit(S); // S's free space is not lent to T while S's work runs
    let other_thread = std::thread::scope(|s| {
        s.spawn(|| {
            let block = cache.alloc(64 * KIB, &T).unwrap();
            free(&cache, block); // parked in that thread's front cache until it exits
        });
        s.spawn(|| cache.alloc(2048, &T).unwrap()).join().unwrap()
    });
    free(&cache, parked);
    assert_eq!(backend.allocations(), 4);
    let reserved = cache.stats().reserved.current;
    let released = cache.empty_cache();
    assert_eq!(released, 48 * KIB + 64 * KIB);
    assert_eq!(reserved - released, 2 * 16 * KIB, "the two segments with held blocks stay");
    assert_eq!(backend.reserved(), 2 * 16 * KIB);
    assert!(backend.is_complete(S, 1), "released only after S's work completed");
    assert_eq!(backend.host_waits(), 1, "T had no work left: its fence needed no wait");
    let released_bytes: Vec<_> = backend.take_released().into_iter().map(|(_, bytes)| bytes).collect();
    assert_eq!(released_bytes.iter().sum::<usize>(), released);
    free(&cache, held);
    free(&cache, other_thread);
    assert_eq!(cache.empty_cache(), 2 * 16 * KIB);
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.segments, stats.segment_releases), (0, 0, 4));
    assert_eq!(backend.reserved(), 0);
    assert!(cache.held_streams().is_empty(), "no stream handle kept without memory");
    cache.check_invariants();
}

#[test]
fn out_of_memory_releases_the_cache_retries_once_and_reports_figures() {
    let (cache, backend) = allocator(small_config());
    backend.set_capacity(Some(48 * KIB));
    let small: Vec<_> = (0..4).map(|_| cache.alloc(4 * KIB, &S).unwrap()).collect(); // one 16 KiB segment
    for block in small {
        free(&cache, block); // parked in this thread's front cache
    }
    // An own segment of 48 KiB fits only once the parked blocks' segment is released.
    let big = cache.alloc(48 * KIB, &S).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.oom_retries, stats.segment_releases, stats.segments), (1, 1, 1));
    assert_eq!(stats.reserved, CurrentPeak { current: 48 * KIB, peak: 48 * KIB });
    assert_eq!(stats.parked_bytes, 0);
    // Nothing left to release: the second try fails too, with the figures in the report.
    let err = cache.alloc(512, &S).unwrap_err();
    let Error::OutOfMemory { source, stats: figures } = &err else { panic!("{err}") };
    assert_eq!((figures.reserved.current, figures.allocated.current, figures.oom_retries), (48 * KIB, 48 * KIB, 2));
    let FakeError::OutOfMemory { requested, .. } = source else { panic!("{source}") };
    assert_eq!(*requested, 16 * KIB, "the segment the backend refused");
    let message = err.to_string();
    assert!(message.contains("the caching allocator still reserves 49152 bytes (49152 allocated)"), "{message}");
    backend.set_capacity(None);
    backend.fail_next_allocations(2);
    assert!(cache.alloc(512, &T).unwrap_err().is_out_of_memory(), "refused twice: no third try");
    let block = cache.alloc(512, &T).unwrap();
    free(&cache, block);
    free(&cache, big);
    cache.check_invariants();
}

#[test]
fn figures_are_exact_in_one_thread() {
    let (cache, _backend) = allocator(small_config());
    let a = cache.alloc(1000, &S).unwrap(); // class 1024
    let b = cache.alloc(3000, &S).unwrap(); // class 3072
    let stats = cache.stats();
    assert_eq!(stats.allocated, CurrentPeak { current: 4096, peak: 4096 });
    assert_eq!(stats.requested, CurrentPeak { current: 4000, peak: 4000 });
    assert_eq!(stats.reserved, CurrentPeak { current: 16 * KIB, peak: 16 * KIB });
    free(&cache, a);
    let stats = cache.stats();
    assert_eq!(stats.allocated, CurrentPeak { current: 3072, peak: 4096 });
    assert_eq!(stats.requested, CurrentPeak { current: 3000, peak: 4000 });
    assert_eq!(stats.active, CurrentPeak { current: 4096, peak: 4096 }, "the parked block is out of the core");
    assert_eq!(stats.parked_bytes, 1024);
    let c = cache.alloc(100, &S).unwrap(); // class 512: the core splits the free tail
    let d = cache.alloc(1024, &S).unwrap(); // the parked block
    let stats = cache.stats();
    assert_eq!(stats.allocated, CurrentPeak { current: 4608, peak: 4608 });
    assert_eq!(stats.requested, CurrentPeak { current: 4124, peak: 4124 });
    assert_eq!((stats.front_hits, stats.core_hits, stats.misses), (1, 2, 1));
    assert_eq!(stats.free_bytes, 16 * KIB - 4608);
    let big = cache.alloc(40 * KIB, &T).unwrap();
    assert_eq!(cache.stats().reserved, CurrentPeak { current: 64 * KIB, peak: 64 * KIB });
    for block in [b, c, d, big] {
        free(&cache, block);
    }
    cache.empty_cache();
    let stats = cache.stats();
    assert_eq!(stats.allocated, CurrentPeak { current: 0, peak: 4608 + 40 * KIB });
    assert_eq!(stats.reserved, CurrentPeak { current: 0, peak: 64 * KIB });
    assert_eq!((stats.segment_allocations, stats.segment_releases, stats.active.current), (2, 2, 0));
    let classes: Vec<ClassStats> = cache.class_stats();
    let classes: Vec<_> = classes.iter().map(|c| (c.bytes, c.allocations, c.frees, c.front_hits)).collect();
    assert_eq!(classes, [(512, 1, 1, 0), (1024, 2, 2, 1), (3072, 1, 1, 0), (40 * KIB, 1, 1, 0)]);
}

#[test]
fn peaks_restart_from_the_current_figures_in_every_thread() {
    let (cache, _backend) = allocator(small_config());
    let kept = cache.alloc(1024, &S).unwrap();
    let other = cache.clone();
    std::thread::spawn(move || {
        let block = other.alloc(3000, &S).unwrap(); // class 3072, freed by this thread's exit
        free(&other, block);
    })
    .join()
    .unwrap();
    let big = cache.alloc(40 * KIB, &T).unwrap();
    free(&cache, big);
    cache.empty_cache();
    let before = cache.stats();
    assert_eq!(before.reserved, CurrentPeak { current: 16 * KIB, peak: 16 * KIB + 48 * KIB });
    assert!(before.allocated.peak >= 1024 + 40 * KIB, "{before:?}");
    cache.reset_peaks();
    let after = cache.stats();
    assert_eq!(after.reserved, CurrentPeak { current: 16 * KIB, peak: 16 * KIB });
    assert_eq!(after.active, CurrentPeak { current: 1024, peak: 1024 });
    assert_eq!(after.allocated, CurrentPeak { current: 1024, peak: 1024 });
    assert_eq!(after.requested, CurrentPeak { current: 1024, peak: 1024 });
    let again = cache.alloc(2048, &S).unwrap();
    assert_eq!(cache.stats().allocated.peak, 1024 + 2048);
    free(&cache, again);
    free(&cache, kept);
    cache.check_invariants();
}

#[test]
fn a_hot_pair_takes_no_shared_lock() {
    use std::sync::mpsc::channel;
    let (cache, _backend) = allocator(small_config());
    let cache = &cache;
    let ((warm, warmed), (go, started), (done, finished)) = (channel(), channel(), channel());
    let ((locked, held), (unlock, unlocked)) = (channel(), channel());
    std::thread::scope(|s| {
        s.spawn(move || {
            let block = cache.alloc(4096, &S).unwrap();
            free(cache, block);
            warm.send(()).unwrap();
            started.recv().unwrap();
            for _ in 0..100 {
                let block = cache.alloc(4096, &S).unwrap();
                free(cache, block);
            }
            done.send(()).unwrap();
        });
        warmed.recv().unwrap();
        s.spawn(move || {
            let _core = cache.hold_core();
            locked.send(()).unwrap();
            unlocked.recv().unwrap();
        });
        held.recv().unwrap();
        go.send(()).unwrap();
        let pairs = finished.recv_timeout(std::time::Duration::from_secs(60));
        unlock.send(()).unwrap();
        pairs.expect("hot pairs waited for the core's lock");
    });
}

#[test]
fn a_threads_exit_returns_its_front_cache_to_the_core() {
    let (cache, _backend) = allocator(small_config());
    let thread_cache = cache.clone();
    let parked_addr = std::thread::spawn(move || {
        let block = thread_cache.alloc(2048, &S).unwrap();
        let addr = addr(&block);
        free(&thread_cache, block);
        assert_eq!(thread_cache.stats().parked_bytes, 2048);
        addr
    })
    .join()
    .unwrap();
    let stats = cache.stats();
    assert_eq!((stats.parked_bytes, stats.active.current, stats.allocated.current), (0, 0, 0));
    assert_eq!(stats.allocated.peak, 2048, "the exited thread's figures are kept");
    let block = cache.alloc(2048, &S).unwrap();
    assert_eq!(addr(&block), parked_addr);
    assert_eq!(cache.stats().core_hits, 1);
    free(&cache, block);
}

#[test]
fn dropping_the_allocator_releases_everything_even_from_living_threads_caches() {
    let backend = FakeBackend::default();
    let (to_thread, from_main) = std::sync::mpsc::channel::<CachingAllocator<FakeBackend>>();
    let (parked, wait_parked) = std::sync::mpsc::channel();
    let (finish, wait_finish) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let cache = from_main.recv().unwrap();
        let block = cache.alloc(4096, &S).unwrap();
        free(&cache, block);
        drop(cache);
        parked.send(()).unwrap();
        wait_finish.recv().unwrap();
        // A new allocator on the same thread: the dead one's entry is pruned.
        let (cache, backend) = allocator(small_config());
        let block = cache.alloc(4096, &S).unwrap();
        free(&cache, block);
        drop(cache);
        assert_eq!(backend.reserved(), 0);
    });
    let cache = CachingAllocator::new(backend.clone(), small_config()).unwrap();
    to_thread.send(cache.clone()).unwrap();
    wait_parked.recv().unwrap();
    assert_eq!(cache.stats().parked_bytes, 4096);
    drop(cache);
    assert_eq!(backend.reserved(), 0, "the thread's parked block was flushed");
    finish.send(()).unwrap();
    thread.join().unwrap();
}

#[test]
fn threads_on_their_own_streams_exchange_blocks_without_overlap() {
    let (cache, backend) = allocator(Config { cross_stream_waits: true, ..small_config() });
    let threads = 4;
    let rounds = if cfg!(miri) { 12 } else { 400 };
    let live: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
    let claim = |block: &CachedBlock| {
        let mut live = live.lock().unwrap();
        let start = addr(block);
        if let Some((&prev, &len)) = live.range(..=start).next_back() {
            assert!(prev + len <= start, "{block:?} overlaps a live block");
        }
        if let Some((&next, _)) = live.range(start..).next() {
            assert!(start + block.bytes() <= next, "{block:?} overlaps a live block");
        }
        live.insert(start, block.bytes());
    };
    let release = |block: &CachedBlock| assert!(live.lock().unwrap().remove(&addr(block)).is_some());
    let channels: Vec<_> = (0..threads).map(|_| std::sync::mpsc::channel::<CachedBlock>()).collect();
    let (senders, receivers): (Vec<_>, Vec<_>) = channels.into_iter().unzip();
    std::thread::scope(|s| {
        for (t, inbox) in receivers.into_iter().enumerate() {
            let next = senders[(t + 1) % threads].clone();
            let (cache, claim, release) = (&cache, &claim, &release);
            s.spawn(move || {
                let stream = StreamKey(0x100 + t);
                for round in 0..rounds {
                    let bytes = [512, 4000, 20 * KIB, 40 * KIB][(t + round) % 4];
                    let block = cache.alloc(bytes, &stream).unwrap();
                    claim(&block);
                    if round % 3 == 0 {
                        next.send(block).unwrap(); // freed by the next thread
                    } else {
                        release(&block);
                        free(cache, block);
                    }
                    while let Ok(block) = inbox.try_recv() {
                        release(&block);
                        free(cache, block);
                    }
                    if t == 0 && round % 5 == 0 {
                        cache.empty_cache();
                    }
                }
                drop(next);
                // The previous thread may still send: drain until every sender is gone.
                for block in inbox {
                    release(&block);
                    free(cache, block);
                }
            });
        }
        drop(senders);
    });
    assert!(live.lock().unwrap().is_empty());
    cache.check_invariants();
    let stats = cache.stats();
    assert_eq!(stats.allocated.current, 0);
    assert_eq!(stats.requested.current, 0);
    let allocations: u64 = cache.class_stats().iter().map(|c| c.allocations).sum();
    assert_eq!(allocations, (threads * rounds) as u64);
    assert_eq!(stats.front_hits + stats.core_hits + stats.misses, allocations);
    backend.complete_all();
    cache.empty_cache();
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.active.current, stats.parked_bytes), (0, 0, 0));
    assert_eq!(backend.reserved(), 0);
    assert_eq!(stats.segment_allocations, stats.segment_releases);
}

#[test]
fn bad_configurations_and_sizes_are_errors() {
    let backend = FakeBackend::default();
    let err = CachingAllocator::new(backend, Config { small_segment: 1000, ..Config::default() }).unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    let (cache, backend) = allocator(small_config());
    let err = cache.alloc(usize::MAX, &S).unwrap_err();
    assert_eq!(err, Error::SizeOverflow { bytes: usize::MAX });
    assert_eq!(backend.allocations(), 0);
}

#[test]
fn the_allocator_is_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CachingAllocator<FakeBackend>>();
    send_sync::<CachedBlock>();
}

#[test]
fn flushing_returns_this_threads_parked_blocks() {
    let (cache, _backend) = allocator(small_config());
    assert_eq!(cache.config(), &small_config());
    let block = cache.alloc(2048, &S).unwrap();
    free(&cache, block);
    std::thread::scope(|s| s.spawn(|| cache.flush_thread()).join().unwrap());
    assert_eq!(cache.stats().parked_bytes, 2048, "another thread's flush leaves this thread's cache");
    cache.flush_thread();
    let stats = cache.stats();
    assert_eq!((stats.parked_bytes, stats.active.current, stats.free_bytes), (0, 0, 16 * KIB));
    assert_eq!(cache.backend().allocations(), 1);
}

#[test]
fn the_fake_backend_models_streams_and_fences() {
    let backend = FakeBackend::default();
    assert_eq!(backend.submit(S), 1);
    let fence = Backend::record(&backend, &S).unwrap();
    assert_eq!((backend.queued(S), backend.is_done(&fence)), (1, false));
    backend.stream_wait(&T, &fence).unwrap();
    assert!(backend.is_ordered(S, 1, T) && !backend.is_ordered(S, 1, StreamKey(3)));
    assert!(backend.is_ordered(S, 2, S), "a stream is ordered after itself");
    let u = StreamKey(3);
    backend.stream_wait(&u, &Backend::record(&backend, &T).unwrap()).unwrap();
    assert!(backend.is_ordered(S, 1, u), "u waits for T, which waits for S");
    assert_eq!(backend.queued(T), 1, "the wait is work on T");
    let after_wait = Backend::record(&backend, &T).unwrap();
    backend.wait(&after_wait).unwrap();
    assert!(backend.is_done(&fence) && backend.is_complete(S, 1), "T's work completes after S's");
    assert_eq!(backend.host_waits(), 1);
    let segment = backend.allocate(4096).unwrap();
    assert_eq!(backend.live_segments(), [(segment.as_ptr().addr(), 4096)]);
    // SAFETY: allocated just now, unused.
    unsafe { backend.release(segment, 4096) };
    assert_eq!(backend.take_released(), [(segment.as_ptr().addr(), 4096)]);
    assert_eq!(backend.reserved(), 0);
}

#[test]
fn blocks_above_the_front_limit_return_to_the_core_at_once() {
    let (cache, _backend) = allocator(Config { front_max_block: 8 * KIB, front_large_slot: false, ..small_config() });
    let small = cache.alloc(8 * KIB, &S).unwrap();
    let large = cache.alloc(16 * KIB, &S).unwrap();
    free(&cache, small);
    free(&cache, large);
    let before = cache.stats();
    assert_eq!(before.parked_bytes, 8 * KIB, "only the small block parks: {before:?}");
    let again = cache.alloc(16 * KIB, &S).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.front_hits, stats.core_hits), (0, before.core_hits + 1), "from the core: {stats:?}");
    free(&cache, again);
    cache.check_invariants();
}

#[test]
fn one_large_block_per_thread_parks_in_the_front_cache_until_its_next_miss() {
    let (cache, _backend) = allocator(Config { front_max_block: 8 * KIB, front_large_slot: true, ..small_config() });
    let a = cache.alloc(16 * KIB, &S).unwrap();
    let b = cache.alloc(32 * KIB, &S).unwrap();
    free(&cache, a);
    free(&cache, b);
    let before = cache.stats();
    assert_eq!(before.parked_bytes, 16 * KIB, "the first large block parks, the second does not: {before:?}");
    let again = cache.alloc(16 * KIB, &S).unwrap();
    assert_eq!(cache.stats().front_hits, 1);
    assert_eq!(cache.stats().parked_bytes, 0);
    // The slot is free again: the 32 KiB block, from the core, parks on its free.
    let other = cache.alloc(32 * KIB, &S).unwrap();
    free(&cache, other);
    assert_eq!(cache.stats().parked_bytes, 32 * KIB);
    free(&cache, again);
    assert_eq!(cache.stats().parked_bytes, 32 * KIB, "one large block at a time");
    // A miss of this thread (a class never allocated) returns it to the core first.
    let miss = cache.alloc(48 * KIB, &S).unwrap();
    assert_eq!(cache.stats().parked_bytes, 0);
    free(&cache, miss);
    cache.check_invariants();
}

#[test]
fn large_blocks_parked_by_other_threads_come_back_on_exit_and_on_empty_cache() {
    let (cache, backend) = allocator(Config { front_max_block: 8 * KIB, front_large_slot: true, ..small_config() });
    let blocks: Vec<_> = (0..4).map(|_| cache.alloc(48 * KIB, &S).unwrap()).collect();
    let leaked = cache.alloc(48 * KIB, &S).unwrap();
    let mut blocks = blocks.into_iter();
    // Freed on another thread, which exits: its slot goes back to the core with it.
    let first = blocks.next().unwrap();
    std::thread::scope(|s| s.spawn(|| free(&cache, first)).join().unwrap());
    assert_eq!(cache.stats().parked_bytes, 0, "a thread's exit returns its slot");
    // Parked on a thread that stays alive while another thread empties the cache.
    let (parked_tx, parked_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let second = blocks.next().unwrap();
    std::thread::scope(|s| {
        let cache = &cache;
        s.spawn(move || {
            free(cache, second);
            parked_tx.send(()).unwrap();
            done_rx.recv().unwrap();
        });
        parked_rx.recv().unwrap();
        assert_eq!(cache.stats().parked_bytes, 48 * KIB);
        cache.empty_cache();
        assert_eq!(cache.stats().parked_bytes, 0, "empty_cache takes other threads' slots");
        done_tx.send(()).unwrap();
    });
    // The same block cannot come out twice: each allocation below is a distinct address.
    for block in blocks {
        free(&cache, block);
    }
    let again: Vec<_> = (0..3).map(|_| cache.alloc(48 * KIB, &S).unwrap()).collect();
    let mut addresses: Vec<_> = again.iter().map(|b| b.ptr().as_ptr().addr()).collect();
    addresses.push(leaked.ptr().as_ptr().addr());
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), 4, "no block handed out twice");
    for block in again {
        free(&cache, block);
    }
    // A handle never given back (`CachedBlock` has no `Drop`: going out of scope is forgetting
    // it) leaks its segment; it is never released under its holder.
    let leaked_at = leaked.ptr().as_ptr().addr();
    let _ = leaked;
    cache.empty_cache();
    assert!(backend.live_segments().iter().any(|&(base, bytes)| (base..base + bytes).contains(&leaked_at)));
    cache.check_invariants();
}

#[test]
#[cfg(target_pointer_width = "64")]
fn a_lent_blocks_shard_fits_the_handles_padding() {
    // What a handle carries on the hot path did not grow with lending.
    assert_eq!(std::mem::size_of::<CachedBlock>(), 56);
}

/// A segment adopted by another stream (waited for on the device) and then cut and lent on:
/// the lent rest must come after the first owner's work too. Before 2026-12-06 the adopted
/// block kept its old owner's count of returns (or 0 when it changed shard), so an older fence
/// of the new owner, recorded before its wait, passed for one that follows the old owner's work
/// (found by the `device_cache` fuzz target; this is its minimized input).
#[test]
fn a_block_lent_from_an_adopted_segment_comes_after_the_first_owners_work() {
    let config = Config {
        front_depth: 3,
        front_max_bytes: 256 * KIB,
        front_max_block: 8 * KIB,
        front_large_slot: true,
        cross_stream_waits: true,
        small_segment_divisor: 4,
        ..small_config()
    };
    let (cache, backend) = allocator(config);
    let (a, b, c) = (StreamKey(1), StreamKey(2), StreamKey(3));
    let c_block = cache.alloc(17412, &c).unwrap();
    let a_block = cache.alloc(262140, &a).unwrap();
    let a_work = backend.submit(a);
    let b_block = cache.alloc(64564, &b).unwrap();
    let lent_to_a = cache.alloc(19532, &a).unwrap();
    free(&cache, a_block);
    // `c` adopts `a`'s idle segment, waiting for `a`'s work on the device.
    let c_cut = cache.alloc(85068, &c).unwrap();
    assert!(backend.is_ordered(a, a_work, c));
    // The rest of the segment, lent to `b`, must come after `a`'s work as well.
    let lent_to_b = cache.alloc(27724, &b).unwrap();
    let overlaps_a = addr(&lent_to_b) >= addr(&c_cut) && addr(&lent_to_b) < addr(&c_cut) + 262144;
    assert!(!overlaps_a || backend.is_ordered(a, a_work, b), "{lent_to_b:?} before {a:?}'s work");
    for block in [c_block, b_block, lent_to_a, c_cut, lent_to_b] {
        free(&cache, block);
    }
    cache.check_invariants();
}
