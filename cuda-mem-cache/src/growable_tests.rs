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

/// No front cache, and a mapping per page, so that the tests follow single pages; mappings of
/// several pages have tests of their own (`paged_in_mappings`).
fn no_front() -> Config {
    Config { front_depth: 0, max_mapping_bytes: PAGE, ..Config::default() }
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

/// `S` holds [x 32 KiB][y 16 KiB][z 32 KiB] on five pages and frees x and z: two free runs of
/// two pages each, neither large enough to lend for 64 KiB. Returns y.
fn two_free_runs(cache: &CachingAllocator<FakeBackend>) -> CachedBlock {
    let x = cache.alloc(32 * KIB, &S).unwrap();
    let y = cache.alloc(16 * KIB, &S).unwrap();
    let z = cache.alloc(32 * KIB, &S).unwrap();
    free(cache, x);
    free(cache, z);
    y
}

#[test]
fn a_miss_above_the_peak_borrows_another_streams_free_block_waiting_on_the_device() {
    let (cache, backend) = paged(no_front());
    let a = cache.alloc(64 * KIB, &S).unwrap();
    let a_addr = addr(&a);
    let used = backend.submit(S); // work on `a`, still running when it is freed
    free(&cache, a);
    let b = cache.alloc(64 * KIB, &T).unwrap();
    assert_eq!(addr(&b), a_addr, "S's free block, lent to T");
    assert!(b.is_lent() && b.stream() == T);
    assert!(!backend.is_complete(S, used) && backend.host_waits() == 0, "the host never waited");
    assert!(backend.is_ordered(S, used, T), "T's work comes after S's work on the block");
    let stats = cache.stats();
    assert_eq!((stats.reserved.peak, stats.misses, stats.blocks_lent, stats.stream_waits), (64 * KIB, 1, 1, 1));
    // T's free sends the block home pending T's work: S reuses it only after that.
    let t_used = backend.submit(T);
    free(&cache, b);
    assert_eq!(cache.stats().pending_bytes, 64 * KIB);
    cache.check_invariants();
    backend.complete_all();
    let c = cache.alloc(64 * KIB, &S).unwrap();
    assert!(backend.is_complete(T, t_used));
    assert_eq!((addr(&c), c.is_lent(), cache.stats().misses), (a_addr, false, 1), "S's own block again");
    free(&cache, c);
    assert!(cache.held_streams().iter().all(|&s| s == S), "T is forgotten once its lent block is home");
    cache.check_invariants();
}

#[test]
fn within_the_budget_a_miss_maps_pages_of_its_own_rather_than_borrow() {
    let (cache, backend) = paged(Config { live_slack_percent: 100, ..no_front() });
    let a = cache.alloc(128 * KIB, &S).unwrap();
    free(&cache, a);
    let held = cache.alloc(64 * KIB, &S).unwrap(); // S's own free block, cut: 64 KiB stay free
    // 64 KiB more for T stay within the budget (twice the bytes allocated): T maps its own.
    let (maps, _) = backend.page_calls();
    let b = cache.alloc(64 * KIB, &T).unwrap();
    assert!(!b.is_lent());
    assert_eq!(backend.page_calls().0, maps + 1);
    assert_eq!(cache.stats().blocks_lent, 0);
    free(&cache, b);
    free(&cache, held);
    cache.check_invariants();
}

#[test]
fn a_lent_block_freed_on_a_third_stream_waits_for_that_streams_work() {
    let (cache, backend) = paged(no_front());
    const U: StreamKey = StreamKey(0x30);
    let a = cache.alloc(64 * KIB, &S).unwrap();
    free(&cache, a);
    let b = cache.alloc(64 * KIB, &T).unwrap();
    assert!(b.is_lent());
    let used = backend.submit(U);
    // SAFETY: fake memory; `b` is this cache's.
    unsafe { cache.free_on(b, &U).unwrap() };
    let c = cache.alloc(64 * KIB, &S).unwrap(); // not the pending block: new pages
    assert!(!backend.is_complete(U, used));
    assert_eq!(cache.stats().pending_bytes, 64 * KIB);
    backend.complete(U);
    free(&cache, c);
    let d = cache.alloc(128 * KIB, &S).unwrap(); // both blocks home and merged
    assert_eq!(cache.stats().pending_bytes, 0);
    free(&cache, d);
    cache.check_invariants();
}

#[test]
fn a_miss_above_the_peak_unmaps_free_pages_whose_work_is_done_and_never_waits_for_the_rest() {
    let (cache, backend) = paged(no_front());
    let y = two_free_runs(&cache);
    // S's work is done: T's 64 KiB miss unmaps both free runs (no block is large enough to
    // lend) and maps the kept pages: the peak holds.
    let b = cache.alloc(64 * KIB, &T).unwrap();
    let stats = cache.stats();
    assert!(!b.is_lent());
    assert_eq!((stats.reserved.peak, stats.segment_releases, stats.kept_bytes), (80 * KIB, 2, 0), "{stats:?}");
    assert!(backend.is_mapped(addr(&b), 64 * KIB));
    free(&cache, b);
    // Now T frees while its work runs: S's miss above the peak does not wait for it, it grows.
    let t_used = backend.submit(T);
    let c = cache.alloc(64 * KIB, &T).unwrap();
    free(&cache, c);
    let d = cache.alloc(80 * KIB, &S).unwrap();
    assert!(!backend.is_complete(T, t_used) && backend.host_waits() == 0, "no host wait on a miss");
    assert!(cache.stats().reserved.current > 80 * KIB);
    free(&cache, d);
    free(&cache, y);
    cache.check_invariants();
}

#[test]
fn pages_moving_between_streams_are_kept_memory_mapped_again_and_empty_cache_gives_them_back() {
    let (cache, backend) = paged(no_front());
    let y = two_free_runs(&cache);
    // T's miss unmaps 48 KiB of S's free pages (only what it lacks: a whole run and the last
    // page of the other, kept by the backend) and maps them: no new memory, and S keeps its
    // other free page mapped.
    let b = cache.alloc(48 * KIB, &T).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.reserved.peak, stats.kept_bytes), (80 * KIB, 80 * KIB, 0));
    assert_eq!((backend.reserved(), backend.kept_bytes(), backend.mapped_bytes()), (80 * KIB, 0, 80 * KIB));
    assert_eq!((stats.segment_releases, stats.free_bytes), (2, 16 * KIB), "{stats:?}");
    cache.check_invariants();
    free(&cache, b);
    free(&cache, y);
    assert_eq!(cache.empty_cache(), 80 * KIB, "kept and mapped pages, all given back");
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, stats.kept_bytes, backend.reserved()), (0, 0, 0), "{stats:?}");
    cache.check_invariants();
}

#[test]
fn out_of_memory_releases_kept_pages_before_it_fails() {
    let (cache, backend) = paged(no_front());
    let y = two_free_runs(&cache);
    // A device with room for nothing more than what is taken. T's 96 KiB miss unmaps S's two
    // free runs (64 KiB, kept) and needs 32 KiB of new memory on top: out of memory. The retry
    // after releasing everything cached gives the kept pages back first, then fails too.
    backend.set_capacity(Some(backend.reserved()));
    let err = cache.alloc(96 * KIB, &T).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let stats = cache.stats();
    assert_eq!((stats.kept_bytes, backend.kept_bytes()), (0, 0), "kept pages given back");
    assert_eq!((stats.reserved.current, backend.reserved()), (16 * KIB, 16 * KIB), "only y's page is left");
    assert_eq!(stats.oom_retries, 1);
    // What fits now is served.
    let b = cache.alloc(48 * KIB, &T).unwrap();
    free(&cache, b);
    free(&cache, y);
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

#[test]
fn a_lent_block_whose_return_fence_is_refused_waits_as_pending_and_loses_nothing() {
    let (cache, backend) = paged(no_front());
    let a = cache.alloc(64 * KIB, &S).unwrap();
    free(&cache, a);
    let b = cache.alloc(64 * KIB, &T).unwrap();
    assert!(b.is_lent());
    backend.fail_records(true);
    free(&cache, b); // no fence on T can be recorded: the block stays out, pending
    let stats = cache.stats();
    assert_eq!((stats.allocated.current, stats.pending_bytes, stats.active.current), (0, 64 * KIB, 64 * KIB));
    cache.check_invariants();
    backend.fail_records(false);
    // The next poll records the fence; once T's (empty) work is done S has its block back.
    let c = cache.alloc(64 * KIB, &S).unwrap();
    assert_eq!((c.is_lent(), cache.stats().pending_bytes, cache.stats().misses), (false, 0, 1));
    free(&cache, c);
    assert_eq!(cache.empty_cache(), 64 * KIB);
    assert!(cache.held_streams().is_empty());
    cache.check_invariants();
}

#[test]
fn a_borrower_reuses_its_lent_block_from_its_front_cache_and_returns_it_when_flushed() {
    let (cache, backend) = paged(Config { front_depth: 2, ..Config::default() });
    let a = cache.alloc(64 * KIB, &S).unwrap();
    free(&cache, a);
    cache.flush_thread();
    let b = cache.alloc(64 * KIB, &T).unwrap();
    let b_addr = addr(&b);
    assert!(b.is_lent());
    let used = backend.submit(T);
    free(&cache, b); // parked in this thread's front cache under T
    let again = cache.alloc(64 * KIB, &T).unwrap();
    assert_eq!((addr(&again), again.is_lent(), cache.stats().blocks_lent), (b_addr, true, 1), "a front hit");
    free(&cache, again);
    cache.flush_thread(); // home, pending T's work
    assert_eq!(cache.stats().pending_bytes, 64 * KIB);
    backend.complete(T);
    assert!(backend.is_complete(T, used));
    let c = cache.alloc(64 * KIB, &S).unwrap();
    assert_eq!((addr(&c), c.is_lent()), (b_addr, false));
    free(&cache, c);
    cache.flush_thread();
    cache.check_invariants();
}

fn paged_in_mappings(max_pages: usize) -> (CachingAllocator<FakeBackend>, FakeBackend) {
    let backend = FakeBackend::with_pages(PAGE, 64 * PAGE);
    let config = Config { max_mapping_bytes: max_pages * PAGE, ..no_front() };
    (CachingAllocator::new(backend.clone(), config).unwrap(), backend)
}

#[test]
fn a_miss_maps_new_memory_in_mappings_of_several_pages() {
    let (cache, backend) = paged_in_mappings(4);
    let a = cache.alloc(5 * PAGE, &S).unwrap();
    let base = addr(&a);
    assert_eq!(backend.mappings(), [(base, 4 * PAGE), (base + 4 * PAGE, PAGE)]);
    assert_eq!(backend.page_calls().0, 1, "one map call for the run");
    free(&cache, a);
    cache.check_invariants();
}

#[test]
fn only_whole_mappings_inside_free_blocks_are_unmapped() {
    let (cache, backend) = paged_in_mappings(4);
    // One mapping of 4 pages: `held` keeps its first page in use, so none of it can go back.
    let whole = cache.alloc(4 * PAGE, &S).unwrap();
    free(&cache, whole);
    let held = cache.alloc(PAGE, &S).unwrap();
    assert_eq!(backend.mappings().len(), 1);
    // T needs 4 pages above the peak: nothing of S's can be lent (3 pages free) or unmapped (the
    // mapping is partly in use), so T maps new memory.
    let b = cache.alloc(4 * PAGE, &T).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.segment_releases, stats.reserved.current), (0, 8 * PAGE), "{stats:?}");
    free(&cache, held);
    // Now S's mapping is free whole: U's miss above the peak takes it... as a lent block first.
    const U: StreamKey = StreamKey(0x30);
    let c = cache.alloc(4 * PAGE, &U).unwrap();
    assert!(c.is_lent());
    free(&cache, b);
    free(&cache, c);
    assert_eq!(cache.empty_cache(), 8 * PAGE);
    assert!(backend.mappings().is_empty());
    cache.check_invariants();
}

/// Classes above 8 KiB in the large pool, whose misses of two pages and more map allocations of
/// up to 8 pages, nothing mapped ahead and no front cache: one large mapping per large miss.
fn large_mappings() -> Config {
    Config {
        small_max: 8 * KIB,
        small_segment: 16 * KIB,
        max_mapping_bytes: 8 * PAGE,
        map_ahead_bytes: 0,
        front_large_slot: false,
        ..no_front()
    }
}

/// With `own_range_from`, a smaller class never lands in a large block's mapping after that
/// block's free, so the mapping goes back whole; without it, the small block keeps it mapped.
/// (Below the reserve's peak, so that the small block's miss maps without trimming.)
#[test]
fn apart_ranges_keep_smaller_blocks_out_of_large_mappings() {
    for apart in [false, true] {
        let backend = FakeBackend::with_pages(PAGE, 64 * PAGE);
        let config = Config { own_range_from: if apart { 2 * PAGE } else { 0 }, ..large_mappings() };
        let cache = CachingAllocator::new(backend.clone(), config).unwrap();
        free(&cache, cache.alloc(8 * PAGE, &T).unwrap());
        assert_eq!(cache.empty_cache(), 8 * PAGE);
        let large = cache.alloc(6 * PAGE, &S).unwrap();
        let large_at = addr(&large);
        assert_eq!(backend.mappings(), [(large_at, 6 * PAGE)], "one mapping for the large miss");
        free(&cache, large);
        // A class above `small_max` and below the line: the large pool's.
        let small = cache.alloc(PAGE, &S).unwrap();
        assert_eq!(addr(&small) == large_at, !apart, "apart: {apart}");
        let released = cache.empty_cache();
        if apart {
            assert_eq!(released, 6 * PAGE, "the large block's mapping goes back whole");
            assert_eq!(backend.mappings(), [(addr(&small), PAGE)]);
        } else {
            assert_eq!(released, 0, "the small block keeps the whole mapping");
            assert_eq!(backend.mappings(), [(large_at, 6 * PAGE)]);
        }
        free(&cache, small);
        cache.check_invariants();
    }
}

/// `lowest_for_whole_pages`: a request of whole pages takes the lowest free block that fits,
/// not the smallest; any other size keeps the smallest.
#[test]
fn whole_pages_take_the_lowest_fitting_block_when_asked() {
    for lowest in [false, true] {
        let config =
            Config { small_max: 8 * KIB, small_segment: 16 * KIB, lowest_for_whole_pages: lowest, ..no_front() };
        let (cache, _backend) = paged(config);
        let blocks: Vec<CachedBlock> = [3, 1, 2, 1].map(|pages| cache.alloc(pages * PAGE, &S).unwrap()).into();
        let at: Vec<usize> = blocks.iter().map(addr).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "in address order: {at:x?}");
        let [a, b, c, d] = <[CachedBlock; 4]>::try_from(blocks).unwrap();
        free(&cache, a);
        free(&cache, c);
        // Two free holes: 3 pages low, 2 pages higher.
        let half = cache.alloc(PAGE + PAGE / 2, &S).unwrap();
        assert_eq!(addr(&half), at[2], "a size of parts of pages takes the smallest hole (lowest: {lowest})");
        free(&cache, half);
        let two = cache.alloc(2 * PAGE, &S).unwrap();
        let expected = if lowest { at[0] } else { at[2] };
        assert_eq!(addr(&two), expected, "whole pages (lowest: {lowest})");
        for block in [b, d, two] {
            free(&cache, block);
        }
        cache.check_invariants();
    }
}

/// `trimmable_bytes` counts the free memory that could go back now: whole mappings inside free
/// blocks. A small block cut from a freed large block's mapping takes the whole mapping out of
/// it, though most of the mapping is free; its free takes it back.
#[test]
fn trimmable_bytes_are_the_whole_mappings_of_free_blocks() {
    let backend = FakeBackend::with_pages(PAGE, 64 * PAGE);
    let cache = CachingAllocator::new(backend.clone(), large_mappings()).unwrap();
    let large = cache.alloc(6 * PAGE, &S).unwrap();
    assert_eq!(backend.mappings().len(), 1, "one mapping for the large miss");
    let stats = cache.stats();
    assert_eq!((stats.free_bytes, stats.trimmable_bytes), (0, 0), "all of it out");
    free(&cache, large);
    let stats = cache.stats();
    assert_eq!((stats.free_bytes, stats.trimmable_bytes), (6 * PAGE, 6 * PAGE), "free, one whole mapping");
    let small = cache.alloc(PAGE, &S).unwrap();
    let stats = cache.stats();
    assert_eq!(stats.free_bytes, 5 * PAGE);
    assert_eq!(stats.trimmable_bytes, 0, "the small block holds the one mapping");
    free(&cache, small);
    assert_eq!(cache.stats().trimmable_bytes, 6 * PAGE);
    assert_eq!(cache.empty_cache(), 6 * PAGE, "what was trimmable goes back");
    assert_eq!(cache.stats().trimmable_bytes, 0);
    cache.check_invariants();
}

#[test]
fn the_mapping_plan_remaps_kept_memory_first_and_creates_the_rest_in_few_mappings() {
    let kept = |sizes: &[(usize, usize)]| sizes.iter().map(|&(pages, n)| (pages * PAGE, n)).collect();
    let plan = |bytes, room, k: &std::collections::BTreeMap<usize, usize>| {
        MappingPlan::new(bytes * PAGE, room * PAGE, k, PAGE, 4 * PAGE)
    };
    let pages = |v: &[usize]| v.iter().map(|b| b / PAGE).collect::<Vec<_>>();
    // A kept mapping between the need and the room, alone: the smallest such.
    let p = plan(2, 10, &kept(&[(4, 1), (8, 1), (1, 3)]));
    assert_eq!((pages(&p.kept), pages(&p.new)), (vec![4], vec![]));
    // Else kept mappings no larger than what is left, largest first, then new ones of at most 4.
    let p = plan(11, 11, &kept(&[(4, 1), (2, 2), (16, 1)]));
    assert_eq!((pages(&p.kept), pages(&p.new), p.bytes()), (vec![4, 2, 2], vec![3], 11 * PAGE));
    let p = plan(9, 9, &kept(&[]));
    assert_eq!((pages(&p.kept), pages(&p.new)), (vec![], vec![4, 4, 1]));
    // A kept mapping larger than the room is left kept.
    let p = plan(3, 3, &kept(&[(4, 1)]));
    assert_eq!((pages(&p.kept), pages(&p.new)), (vec![], vec![3]));
}

#[test]
fn the_mapping_plan_of_any_input_ends_and_covers_the_need() {
    // Inputs no backend passes (a room below the need, a page of 0, a largest mapping of 0,
    // kept mappings of 0 bytes) still give a plan that covers the need, without a hang or panic.
    let zero_kept: std::collections::BTreeMap<usize, usize> = [(0, 3), (PAGE, 1)].into();
    for (bytes, room, page, max_new) in [
        (3 * PAGE, PAGE, PAGE, PAGE),
        (5000, 5000, 0, 0),
        (3 * PAGE, 3 * PAGE, PAGE, 0),
        (0, 0, PAGE, PAGE),
        (usize::MAX, 0, PAGE, usize::MAX),
    ] {
        let plan = MappingPlan::new(bytes, room, &zero_kept, page, max_new);
        assert_eq!(plan.bytes(), bytes, "{bytes} {room} {page} {max_new}: {plan:?}");
        assert!(plan.kept.iter().chain(&plan.new).all(|&size| size > 0));
    }
}

/// Threads with a stream each allocate, free on their own stream or hand blocks to another
/// stream, queue and complete work, flush and empty the cache, over mappings of up to three pages:
/// no two live blocks overlap, every block lies on mapped pages, and every block handed out comes
/// after the work of every earlier user of its memory (lent or not).
#[test]
fn threads_lending_between_their_streams_never_share_memory_or_reuse_it_early() {
    threads_never_share_memory_or_reuse_it_early(&[S, T, StreamKey(0x30), StreamKey(0x40)]);
}

/// Two threads on each stream: misses of one stream map and trim at once, each without the
/// shard's lock, and a miss whose extended free block the other thread took maps again.
#[test]
fn threads_sharing_streams_never_share_memory_or_reuse_it_early() {
    threads_never_share_memory_or_reuse_it_early(&[S, S, T, T, StreamKey(0x30), StreamKey(0x30)]);
}

/// A thread per entry of `streams`, on that stream, allocating and freeing at random (frees on
/// other streams too), emptying the cache now and then: no two live blocks overlap, every live
/// block is on mapped pages, and memory is reused only after the work that last used it.
fn threads_never_share_memory_or_reuse_it_early(streams: &[StreamKey]) {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    let backend = FakeBackend::with_pages(PAGE, 64 * PAGE);
    let config = Config { front_depth: 2, max_mapping_bytes: 3 * PAGE, ..Config::default() };
    let cache = CachingAllocator::new(backend.clone(), config).unwrap();
    // Live blocks by address: end. Last users of freed memory by address: (end, stream, work).
    let live: Mutex<BTreeMap<usize, usize>> = Mutex::default();
    let history: Mutex<BTreeMap<usize, (usize, StreamKey, u64)>> = Mutex::default();
    let steps = if cfg!(miri) { 150 } else { 4000 };
    std::thread::scope(|scope| {
        for (index, &stream) in streams.iter().enumerate() {
            let (cache, backend, live, history) = (&cache, &backend, &live, &history);
            scope.spawn(move || {
                let mut seed = 0x9e37_79b9_u64 * (index as u64 + 1);
                let mut held: Vec<CachedBlock> = Vec::new();
                for _ in 0..steps {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    let r = (seed >> 33) as usize;
                    match r % 16 {
                        0..=6 => {
                            let bytes = 1 + (r >> 4) % (if r & 0x400 != 0 { 96 * KIB } else { 6 * KIB });
                            let block = cache.alloc(bytes, &stream).unwrap();
                            let (start, end) = (addr(&block), addr(&block) + block.bytes());
                            assert!(backend.is_mapped(start, block.bytes()), "{block:?} off the map");
                            {
                                let mut live = live.lock().unwrap();
                                assert!(
                                    live.range(..end).next_back().is_none_or(|(_, &e)| e <= start),
                                    "{block:?} overlaps"
                                );
                                live.insert(start, end);
                            }
                            let history = history.lock().unwrap();
                            for (_, &(e, from, seq)) in history.range(..end) {
                                if e > start {
                                    assert!(
                                        backend.is_ordered(from, seq, stream),
                                        "{block:?} reused before {from:?}'s work"
                                    );
                                }
                            }
                            drop(history);
                            held.push(block);
                        }
                        7..=11 if !held.is_empty() => {
                            let block = held.swap_remove((r >> 4) % held.len());
                            let to = if r & 0x800 != 0 { streams[(r >> 12) % streams.len()] } else { stream };
                            let (start, end) = (addr(&block), addr(&block) + block.bytes());
                            live.lock().unwrap().remove(&start);
                            // Recorded before the free: a later holder must come after this work.
                            let seq = backend.queued(to);
                            {
                                let mut history = history.lock().unwrap();
                                let stale: Vec<usize> =
                                    history.range(..end).filter(|(_, v)| v.0 > start).map(|(&s, _)| s).collect();
                                for s in stale {
                                    history.remove(&s);
                                }
                                history.insert(start, (end, to, seq));
                            }
                            // SAFETY: fake memory, never touched; every use is ordered on `to`.
                            unsafe { cache.free_on(block, &to).unwrap() };
                        }
                        12 => {
                            backend.submit(stream);
                        }
                        13 => backend.complete(stream),
                        14 => cache.flush_thread(),
                        15 if r & 0x3f00 == 0 => {
                            cache.empty_cache();
                        }
                        _ => {}
                    }
                }
                for block in held {
                    live.lock().unwrap().remove(&addr(&block));
                    free(cache, block);
                }
            });
        }
    });
    backend.complete_all();
    cache.empty_cache();
    cache.check_invariants();
    let stats = cache.stats();
    assert_eq!((stats.allocated.current, stats.pending_bytes, backend.mapped_bytes()), (0, 0, 0), "{stats:?}");
    assert!(stats.blocks_lent > 0, "the test lends: {stats:?}");
    eprintln!("lent {}, stream waits {}, misses {}", stats.blocks_lent, stats.stream_waits, stats.misses);
}

/// Runs `op` on a thread of its own; true if it returned within ten seconds (else it is left to
/// finish once whatever holds it lets go).
fn finishes_soon<T: Send + 'static>(op: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(op()));
    finished.recv_timeout(std::time::Duration::from_secs(10)).ok()
}

/// Runs `held` on a thread of its own until its page call waits at `backend`'s gate (`what` is
/// that call, for the message), then `meanwhile` on another (`None` if it did not finish within
/// ten seconds), then lets the page call go: the results of both.
fn while_a_page_call_waits<H: Send + 'static, M: Send + 'static>(
    backend: &FakeBackend,
    what: &str,
    held: impl FnOnce() -> H + Send + 'static,
    meanwhile: impl FnOnce() -> M + Send + 'static,
) -> (H, Option<M>) {
    let gate = backend.hold_page_calls();
    let held = std::thread::spawn(held);
    assert!(gate.wait_for_held(1, std::time::Duration::from_secs(10)), "{what} reached the gate");
    let meanwhile = finishes_soon(meanwhile);
    gate.open();
    (held.join().unwrap(), meanwhile)
}

#[test]
#[cfg_attr(miri, ignore = "threads held at a gate for real time")]
fn a_miss_maps_without_the_shards_lock_and_maps_again_if_the_free_block_it_extends_is_taken() {
    let (cache, backend) = paged(no_front());
    let a = cache.alloc(16 * KIB, &S).unwrap();
    free(&cache, a); // a free page at the start of S's range
    // A 64 KiB miss extends that free page by three pages: its map waits at the gate, while
    // another thread takes that free page on the same stream (the same shard).
    let (miss, meanwhile) = (cache.clone(), cache.clone());
    let (big, other) = while_a_page_call_waits(
        &backend,
        "the miss's map",
        move || miss.alloc(64 * KIB, &S).unwrap(),
        move || meanwhile.alloc(16 * KIB, &S).unwrap(),
    );
    let other = other.expect("an allocation on the shard waited for a map in flight");
    // The miss found its three pages too few and mapped again; nothing overlaps.
    let (a, b) = (addr(&other), addr(&big));
    assert!(a + 16 * KIB <= b || b + 64 * KIB <= a, "{a:#x} and {b:#x} overlap");
    assert!(backend.is_mapped(a, 16 * KIB) && backend.is_mapped(b, 64 * KIB));
    assert_eq!(cache.stats().misses, 3, "the first page, the map that came too late, the map again");
    free(&cache, other);
    free(&cache, big);
    cache.check_invariants();
}

#[test]
#[cfg_attr(miri, ignore = "threads held at a gate for real time")]
fn a_trim_unmaps_without_the_shards_lock() {
    let (cache, backend) = paged(no_front());
    let y = two_free_runs(&cache);
    // T's miss above the peak unmaps 48 KiB of S's free pages: the unmap waits at the gate,
    // with S's last free page still free, while S allocates that page and frees y.
    let (miss, on_s) = (cache.clone(), cache.clone());
    let (b, on_s) = while_a_page_call_waits(
        &backend,
        "the trim's unmap",
        move || miss.alloc(48 * KIB, &T).unwrap(),
        move || {
            let free_then = on_s.stats().free_bytes;
            let page = on_s.alloc(16 * KIB, &S).unwrap();
            free(&on_s, y);
            (free_then, page)
        },
    );
    let (free_then, page) = on_s.expect("S's shard waited for another stream's trim");
    assert_eq!(free_then, 16 * KIB, "the claimed pages left the free lists before the unmap");
    assert!(backend.is_mapped(addr(&page), 16 * KIB) && backend.is_mapped(addr(&b), 48 * KIB));
    assert_eq!(cache.stats().reserved.peak, 80 * KIB, "the peak held");
    free(&cache, page);
    free(&cache, b);
    cache.check_invariants();
}

#[test]
#[cfg_attr(miri, ignore = "threads held at a lock for real time")]
fn a_miss_within_the_budget_maps_while_another_decides_and_one_above_it_waits_its_turn() {
    let (cache, backend) = paged(no_front());
    let deciding = cache.hold_deciding();
    // An empty cache: one page for 16 KiB is within the budget, and needs no decision in order.
    let within = {
        let cache = cache.clone();
        finishes_soon(move || cache.alloc(16 * KIB, &S).unwrap())
    };
    let a = within.expect("a miss within the budget waited for another miss deciding");
    free(&cache, a);
    // Now nothing is allocated and a page is free: two more pages on T would take the reserve
    // above its peak and above the bytes allocated, so that miss decides (what to trim) in turn.
    let (done, finished) = std::sync::mpsc::channel();
    let above = {
        let cache = cache.clone();
        std::thread::spawn(move || done.send(cache.alloc(32 * KIB, &T).unwrap()))
    };
    let waited = finished.recv_timeout(std::time::Duration::from_millis(200));
    assert!(waited.is_err(), "a miss above the budget decided while another held the decision");
    drop(deciding);
    let b = finished.recv_timeout(std::time::Duration::from_secs(10)).expect("the miss went on");
    above.join().unwrap().expect("the result was received");
    assert_eq!(cache.stats().reserved.peak, 2 * PAGE, "S's free page moved to T: the peak held");
    assert!(backend.is_mapped(addr(&b), 32 * KIB));
    free(&cache, b);
    cache.check_invariants();
}

#[test]
fn misses_within_the_budget_count_what_the_others_are_about_to_map() {
    use super::core::{Ahead, Totals};
    let totals = Totals::default();
    let first = totals.begin_miss_within(64 * KIB, Ahead::NONE, 100 * KIB).expect("64 KiB within 100");
    assert!(totals.begin_miss_within(64 * KIB, Ahead::NONE, 100 * KIB).is_none(), "64 more with 64 in flight");
    let second = totals.begin_miss_within(32 * KIB, Ahead::NONE, 100 * KIB).expect("32 more with 64 in flight");
    drop(first);
    let third = totals.begin_miss_within(64 * KIB, Ahead::NONE, 100 * KIB).expect("64 more with 32 in flight");
    assert!(totals.begin_miss_within(usize::MAX, Ahead::NONE, usize::MAX).is_none(), "a sum past usize::MAX");
    drop((second, third));
    assert!(totals.begin_miss_within(100 * KIB, Ahead::NONE, 100 * KIB).is_some(), "every guard gave its bytes back");
}

#[test]
fn misses_within_the_budget_at_once_never_exceed_it_together() {
    use super::core::{Ahead, Totals};
    const THREADS: usize = 16;
    let totals = Totals::default();
    let barrier = std::sync::Barrier::new(THREADS);
    let admitted = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                let guard = totals.begin_miss_within(10 * KIB, Ahead::NONE, 100 * KIB);
                if guard.is_some() {
                    admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                // Every thread tries while the admitted ones still count.
                barrier.wait();
                drop(guard);
            });
        }
    });
    assert_eq!(admitted.into_inner(), 10, "exactly the misses the budget holds");
}

#[test]
#[cfg_attr(miri, ignore = "unwinds through the allocator")]
fn a_backend_that_panics_in_a_map_or_an_unmap_leaves_the_cache_usable() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let (cache, backend) = paged(no_front());
    backend.panic_next_page_call();
    let mapping = catch_unwind(AssertUnwindSafe(|| cache.alloc(16 * KIB, &S)));
    assert!(mapping.is_err(), "the map panicked through the allocation");
    // The pages that map claimed may or may not be mapped now: they are never handed out again.
    let a = cache.alloc(16 * KIB, &S).unwrap();
    assert!(backend.is_mapped(addr(&a), 16 * KIB));
    free(&cache, a);
    let y = two_free_runs(&cache);
    // T's miss above the peak unmaps S's free pages: the unmap panics, under the lock of deciding.
    backend.panic_next_page_call();
    let trim = catch_unwind(AssertUnwindSafe(|| cache.alloc(48 * KIB, &T)));
    assert!(trim.is_err(), "the unmap panicked through the allocation");
    // The lock recovers, the claimed pages stay out of every list, and nothing is handed out twice.
    let b = cache.alloc(48 * KIB, &T).unwrap();
    let c = cache.alloc(16 * KIB, &S).unwrap();
    let blocks = [(addr(&y), 16 * KIB), (addr(&b), 48 * KIB), (addr(&c), 16 * KIB)];
    for (i, &(at, bytes)) in blocks.iter().enumerate() {
        assert!(backend.is_mapped(at, bytes), "block {i} is mapped");
        for &(other, other_bytes) in &blocks[i + 1..] {
            assert!(at + bytes <= other || other + other_bytes <= at, "{at:#x} and {other:#x} overlap");
        }
    }
    for block in [y, b, c] {
        free(&cache, block);
    }
    cache.check_invariants();
    cache.empty_cache();
    cache.check_invariants();
    assert_eq!(cache.stats().allocated.current, 0);
}
