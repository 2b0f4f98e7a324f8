//! The allocator over a backend with pages (growable segments): growth by what is missing,
//! coalescing across the range, pages moving between streams after their fences, `empty_cache`,
//! out of memory, and random traffic checked against the backend's page table. Pages of 16 KiB
//! keep the tests cheap under Miri.

use super::fake::FakeBackend;
use super::*;

const PAGE: usize = 16 << 10;
const KIB: usize = 1024;
const S: StreamKey = StreamKey(0x10);
const T: StreamKey = StreamKey(0x20);

fn paged(config: Config) -> (CachingAllocator<FakeBackend>, FakeBackend) {
    let backend = FakeBackend::with_pages(PAGE, 64 * PAGE);
    (CachingAllocator::new(backend.clone(), config).unwrap(), backend)
}

fn no_front() -> Config {
    Config { front_depth: 0, ..Config::default() }
}

fn free(cache: &CachingAllocator<FakeBackend>, block: CachedBlock) {
    // SAFETY: the fake backend's memory is never touched; blocks come from `cache`.
    unsafe { cache.free(block) };
}

fn addr(block: &CachedBlock) -> usize {
    block.ptr().as_ptr().addr()
}

#[test]
fn a_miss_maps_only_the_pages_the_stream_lacks_and_blocks_stay_contiguous() {
    let (cache, backend) = paged(no_front());
    assert_eq!(cache.page_bytes(), Some(PAGE));
    let a = cache.alloc(24 * KIB, &S).unwrap();
    assert_eq!(cache.stats().reserved.current, 2 * PAGE);
    // 8 KiB left free after `a`; a 20 KiB block needs one more page, right after.
    let b = cache.alloc(20 * KIB, &S).unwrap();
    assert_eq!(addr(&b), addr(&a) + 24 * KIB);
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.segment_allocations, stats.misses), (3 * PAGE, 2, 2));
    assert_eq!((backend.mapped_bytes(), backend.reserved()), (3 * PAGE, 3 * PAGE));
    assert!(backend.is_mapped(addr(&a), 24 * KIB) && backend.is_mapped(addr(&b), 20 * KIB));
    free(&cache, a);
    free(&cache, b);
    // Freed neighbours coalesce: one block serves what both held, with no new page.
    let both = cache.alloc(44 * KIB, &S).unwrap();
    assert_eq!(cache.stats().segment_allocations, 2);
    free(&cache, both);
    cache.check_invariants();
}

#[test]
fn a_miss_above_the_peak_unmaps_another_streams_free_pages_after_their_work() {
    let (cache, backend) = paged(no_front());
    let a = cache.alloc(64 * KIB, &S).unwrap();
    let used = backend.submit(S); // work on `a`, still running when it is freed
    free(&cache, a);
    assert!(!backend.is_complete(S, used));
    let b = cache.alloc(64 * KIB, &T).unwrap();
    assert!(backend.is_complete(S, used), "the pages left `S` only after its work on them");
    let stats = cache.stats();
    assert_eq!(stats.reserved.peak, 64 * KIB, "the peak held: {stats:?}");
    assert_eq!(stats.segment_releases, 1, "{stats:?}");
    assert!(backend.is_mapped(addr(&b), 64 * KIB));
    assert_eq!(backend.host_waits(), 1);
    free(&cache, b);
    cache.check_invariants();
}

#[test]
fn pages_moving_between_streams_are_kept_memory_mapped_again_and_empty_cache_gives_them_back() {
    let (cache, backend) = paged(no_front());
    let a = cache.alloc(64 * KIB, &S).unwrap();
    free(&cache, a);
    // T's miss unmaps S's free pages (kept by the backend) and maps them: no new memory.
    let b = cache.alloc(64 * KIB, &T).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.reserved.peak, stats.kept_bytes), (64 * KIB, 64 * KIB, 0), "{stats:?}");
    assert_eq!((backend.reserved(), backend.kept_bytes()), (64 * KIB, 0));
    free(&cache, b);
    // S's next miss takes T's pages back the same way.
    let c = cache.alloc(32 * KIB, &S).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.kept_bytes), (64 * KIB, 32 * KIB), "{stats:?}");
    assert_eq!(backend.kept_bytes(), 32 * KIB, "the whole free run was unmapped; half is kept");
    cache.check_invariants();
    free(&cache, c);
    assert_eq!(cache.empty_cache(), 64 * KIB, "kept and mapped pages, all given back");
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.kept_bytes, backend.reserved()), (0, 0, 0), "{stats:?}");
    cache.check_invariants();
}

#[test]
fn out_of_memory_releases_kept_pages_before_it_fails() {
    let (cache, backend) = paged(no_front());
    let a = cache.alloc(64 * KIB, &S).unwrap();
    free(&cache, a);
    let b = cache.alloc(32 * KIB, &T).unwrap(); // S's 64 KiB unmapped, 32 KiB kept after the map
    assert_eq!(backend.kept_bytes(), 32 * KIB);
    // A device with room for nothing more than what is taken: the kept pages are what is left.
    backend.set_capacity(Some(backend.reserved()));
    let c = cache.alloc(32 * KIB, &T).unwrap();
    assert_eq!((backend.kept_bytes(), cache.stats().reserved.current), (0, 64 * KIB), "kept pages served it");
    let err = cache.alloc(16 * KIB, &S).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(cache.stats().kept_bytes, 0);
    free(&cache, b);
    free(&cache, c);
    cache.check_invariants();
}

#[test]
fn without_release_on_miss_the_reserve_grows_instead() {
    let (cache, backend) = paged(Config { release_idle_on_miss: false, ..no_front() });
    let a = cache.alloc(64 * KIB, &S).unwrap();
    backend.submit(S);
    free(&cache, a);
    let b = cache.alloc(64 * KIB, &T).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.segment_releases, backend.host_waits()), (128 * KIB, 0, 0));
    free(&cache, b);
}

#[test]
fn the_block_a_miss_extends_is_not_trimmed_for_it() {
    let (cache, _backend) = paged(no_front());
    // [a 8 KiB][b 40 KiB][rest 0] then free b: a free block with a whole page inside, before
    // the unmapped tail. A 48 KiB request extends it rather than unmap its page and map another.
    let a = cache.alloc(8 * KIB, &S).unwrap();
    let b = cache.alloc(40 * KIB, &S).unwrap();
    free(&cache, b);
    let c = cache.alloc(48 * KIB, &S).unwrap();
    assert_eq!(addr(&c), addr(&a) + 8 * KIB);
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.segment_releases), (4 * PAGE, 0), "{stats:?}");
    free(&cache, a);
    free(&cache, c);
    cache.check_invariants();
}

#[test]
fn empty_cache_unmaps_every_free_page_and_frees_empty_ranges_but_keeps_held_blocks() {
    let (cache, backend) = paged(Config::default());
    let held = cache.alloc(20 * KIB, &S).unwrap();
    let parked = cache.alloc(100 * KIB, &S).unwrap();
    let other = cache.alloc(3 * KIB, &T).unwrap();
    free(&cache, parked); // into this thread's front cache
    free(&cache, other);
    backend.submit(S);
    assert!(cache.empty_cache() >= 64 * KIB);
    // Only the pages under `held` stay: the free rest of its last page cannot go.
    assert_eq!(cache.stats().reserved.current, 2 * PAGE);
    assert_eq!(backend.mapped_bytes(), 2 * PAGE);
    assert!(backend.is_mapped(addr(&held), 20 * KIB));
    assert_eq!(cache.held_streams(), [S], "T's ranges are gone, and its handle");
    cache.check_invariants();
    free(&cache, held);
    cache.empty_cache();
    assert_eq!((backend.mapped_bytes(), backend.live_ranges()), (0, 0));
    assert!(cache.held_streams().is_empty());
    // Growing again after that reserves anew.
    let again = cache.alloc(20 * KIB, &S).unwrap();
    assert!(backend.is_mapped(addr(&again), 20 * KIB));
    free(&cache, again);
}

#[test]
fn out_of_memory_unmaps_the_cache_and_retries_once() {
    let (cache, backend) = paged(Config { release_idle_on_miss: false, ..no_front() });
    backend.set_capacity(Some(8 * PAGE));
    let a = cache.alloc(6 * PAGE, &S).unwrap();
    free(&cache, a);
    let b = cache.alloc(8 * PAGE, &T).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.oom_retries, stats.reserved.current), (1, 8 * PAGE), "{stats:?}");
    let err = cache.alloc(PAGE, &S).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("caching allocator"), "{err}");
    free(&cache, b);
    cache.check_invariants();
}

#[test]
fn without_expandable_segments_the_cache_allocates_whole_segments() {
    let (cache, backend) = paged(Config { expandable_segments: false, ..no_front() });
    assert_eq!(cache.page_bytes(), None);
    let a = cache.alloc(24 * KIB, &S).unwrap();
    assert_eq!((backend.mapped_bytes(), backend.live_segments().len()), (0, 1));
    free(&cache, a);
}

/// Random traffic on three streams (allocations, frees on the block's stream and on others,
/// completions, `empty_cache`): after every step the bookkeeping holds, no two live blocks
/// overlap, and every live block lies on mapped pages.
#[test]
fn random_traffic_keeps_live_blocks_on_mapped_pages() {
    let (cache, backend) = paged(Config { front_depth: 2, front_max_bytes: 256 * KIB, ..Config::default() });
    let streams = [S, T, StreamKey(0x30)];
    let mut live: Vec<CachedBlock> = Vec::new();
    let mut seed = 0x2545_f491_u64;
    let steps = if cfg!(miri) { 300 } else { 5000 };
    for step in 0..steps {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let r = (seed >> 33) as usize;
        let stream = streams[r % 3];
        match (r >> 2) % 8 {
            0..=3 => {
                let bytes = 1 + (r >> 5) % (if r & 0x10 != 0 { 100 * KIB } else { 4 * KIB });
                live.push(cache.alloc(bytes, &stream).unwrap());
            }
            4 | 5 if !live.is_empty() => free(&cache, live.swap_remove((r >> 5) % live.len())),
            6 if !live.is_empty() => {
                let block = live.swap_remove((r >> 5) % live.len());
                backend.submit(stream);
                // SAFETY: as `free`.
                unsafe { cache.free_on(block, &stream).unwrap() };
            }
            7 if step % 64 == 7 => {
                cache.empty_cache();
            }
            _ => backend.complete(stream),
        }
        if r & 0x100 != 0 {
            backend.submit(streams[(r >> 9) % 3]);
        }
        let mut ranges: Vec<(usize, usize)> = live.iter().map(|b| (addr(b), b.bytes())).collect();
        ranges.sort_unstable();
        assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "overlap at step {step}");
        assert!(ranges.iter().all(|&(a, n)| backend.is_mapped(a, n)), "a live block off the map at step {step}");
        if step % 97 == 0 {
            cache.check_invariants();
        }
    }
    for block in live {
        free(&cache, block);
    }
    backend.complete_all();
    cache.empty_cache();
    cache.check_invariants();
    assert_eq!(backend.mapped_bytes(), 0);
}

#[test]
fn within_the_live_slack_a_miss_maps_without_unmapping() {
    for (slack, releases, reserved) in [(50, 0, 7 * PAGE), (0, 1, 6 * PAGE)] {
        let (cache, _backend) = paged(Config { live_slack_percent: slack, ..no_front() });
        let held = cache.alloc(4 * PAGE, &S).unwrap();
        let a = cache.alloc(PAGE, &T).unwrap();
        free(&cache, a); // one free page on `T`; the reserve's peak is 5 pages
        // 6 pages allocated after this miss: within half again of them, 7 pages may be mapped
        // without taking `T`'s page; with no slack the peak decides and the page moves.
        let b = cache.alloc(2 * PAGE, &S).unwrap();
        let stats = cache.stats();
        assert_eq!((stats.segment_releases, stats.reserved.current), (releases, reserved), "slack {slack}: {stats:?}");
        free(&cache, b);
        free(&cache, held);
        cache.check_invariants();
    }
}
