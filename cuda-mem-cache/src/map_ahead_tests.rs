//! A large miss below the reserve's peak maps ahead (`Config::map_ahead_bytes`): never above
//! the peak, never for the small pool, never at the cost of the request itself.

use super::fake::FakeBackend;
use super::*;

const MIB: usize = 1 << 20;
const S: StreamKey = StreamKey(0x10);

/// Pages of the driver's size in a range larger than any test, no front cache, so that every
/// request reaches the core.
fn paged(config: Config) -> (CachingAllocator<FakeBackend>, FakeBackend) {
    let backend = FakeBackend::with_pages(2 * MIB, 1 << 40);
    (CachingAllocator::new(backend.clone(), Config { front_depth: 0, ..config }).unwrap(), backend)
}

fn free(cache: &CachingAllocator<FakeBackend>, block: CachedBlock) {
    // SAFETY: the fake backend's memory is never touched; blocks come from `cache`.
    unsafe { cache.free(block) };
}

/// Raises the reserve's peak to `bytes` and empties the cache: the reserve is back at 0.
fn emptied_after_a_peak_of(cache: &CachingAllocator<FakeBackend>, bytes: usize) {
    let block = cache.alloc(bytes, &S).unwrap();
    free(cache, block);
    cache.empty_cache();
    let reserved = cache.stats().reserved;
    assert_eq!((reserved.current, reserved.peak), (0, bytes));
}

#[test]
fn a_large_miss_below_the_peak_maps_ahead_and_the_streams_next_misses_find_it_mapped() {
    let (cache, backend) = paged(Config::default());
    emptied_after_a_peak_of(&cache, 256 * MIB);
    let misses = cache.stats().misses;
    let a = cache.alloc(24 * MIB, &S).unwrap();
    assert_eq!(cache.stats().reserved.current, 88 * MIB, "24 MiB asked, 64 MiB more mapped");
    assert_eq!(backend.mapped_bytes(), 88 * MIB);
    let b = cache.alloc(32 * MIB, &S).unwrap();
    let c = cache.alloc(30 * MIB, &S).unwrap();
    assert_eq!(cache.stats().misses, misses + 1, "the next two found their memory mapped");
    for block in [a, b, c] {
        free(&cache, block);
    }
    cache.check_invariants();
}

#[test]
fn mapping_ahead_leaves_the_last_map_ahead_bytes_below_the_peak() {
    let (cache, _backend) = paged(Config::default());
    emptied_after_a_peak_of(&cache, 100 * MIB);
    let a = cache.alloc(20 * MIB, &S).unwrap();
    let reserved = cache.stats().reserved;
    assert_eq!((reserved.current, reserved.peak), (36 * MIB, 100 * MIB), "16 MiB ahead: 64 stay below the peak");
    let b = cache.alloc(16 * MIB, &S).unwrap();
    assert_eq!(cache.stats().reserved.current, 36 * MIB, "found mapped");
    free(&cache, a);
    free(&cache, b);
    cache.check_invariants();
}

#[test]
fn at_the_peak_and_in_the_small_pool_a_miss_maps_only_what_it_needs() {
    let (cache, _backend) = paged(Config::default());
    let a = cache.alloc(24 * MIB, &S).unwrap();
    assert_eq!(cache.stats().reserved.current, 24 * MIB, "the first miss raises the peak: nothing ahead");
    free(&cache, a);
    cache.empty_cache();
    let small = cache.alloc(64 << 10, &S).unwrap();
    assert_eq!(cache.stats().reserved.current, 2 * MIB, "the small pool maps its page alone");
    free(&cache, small);
    cache.check_invariants();
}

#[test]
fn with_map_ahead_bytes_0_a_miss_below_the_peak_maps_only_what_it_needs() {
    let (cache, _backend) = paged(Config { map_ahead_bytes: 0, ..Config::default() });
    emptied_after_a_peak_of(&cache, 256 * MIB);
    let a = cache.alloc(24 * MIB, &S).unwrap();
    assert_eq!(cache.stats().reserved.current, 24 * MIB);
    free(&cache, a);
}

#[test]
fn a_device_without_memory_for_the_extra_still_maps_the_request() {
    let (cache, backend) = paged(Config::default());
    emptied_after_a_peak_of(&cache, 256 * MIB);
    // Another process took the memory empty_cache gave back: 30 MiB are left.
    backend.set_capacity(Some(30 * MIB));
    let a = cache.alloc(24 * MIB, &S).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.reserved.current, backend.mapped_bytes()), (24 * MIB, 24 * MIB));
    assert_eq!(stats.oom_retries, 0, "the extra was dropped before any release and retry");
    free(&cache, a);
    cache.check_invariants();
}

#[test]
#[cfg_attr(miri, ignore = "threads held at a gate for real time")]
fn misses_mapping_ahead_at_once_never_take_the_reserve_above_its_peak_together() {
    let (cache, backend) = paged(Config::default());
    emptied_after_a_peak_of(&cache, 256 * MIB);
    // Four streams miss 24 MiB each while every map waits at the gate: each counts what the
    // others are about to map, and an extra leaves the last 64 MiB below the peak to the
    // others' requests: 64 + 64 + 0 + 0 MiB of extras, and every request fits below the peak.
    let gate = backend.hold_page_calls();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let cache = cache.clone();
            std::thread::spawn(move || cache.alloc(24 * MIB, &StreamKey(0x100 + i)).unwrap())
        })
        .collect();
    assert!(gate.wait_for_held(4, std::time::Duration::from_secs(10)), "the four maps reached the gate");
    gate.open();
    let blocks: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let reserved = cache.stats().reserved;
    assert_eq!((reserved.current, reserved.peak), (224 * MIB, 256 * MIB));
    for block in blocks {
        free(&cache, block);
    }
    cache.check_invariants();
}

#[test]
#[cfg_attr(miri, ignore = "a thread held at a gate for real time")]
fn a_miss_that_maps_again_maps_no_second_extra() {
    let config = Config { map_ahead_bytes: 16 * MIB, front_large_slot: false, ..Config::default() };
    let (cache, backend) = paged(config);
    emptied_after_a_peak_of(&cache, 1 << 30);
    // [a 40][b 56][16 free] mapped: freeing b leaves 72 MiB free at the end of S's memory.
    let a = cache.alloc(40 * MIB, &S).unwrap();
    let b = cache.alloc(56 * MIB, &S).unwrap();
    free(&cache, b);
    assert_eq!(cache.stats().reserved.current, 112 * MIB);
    // An 80 MiB miss extends those 72 MiB by 8 and maps 16 ahead; while its map waits, another
    // thread takes the 72 MiB, so the 24 mapped fall short and the miss maps again: the 56 it
    // lacks, without a second extra.
    let gate = backend.hold_page_calls();
    let miss = {
        let cache = cache.clone();
        std::thread::spawn(move || cache.alloc(80 * MIB, &S).unwrap())
    };
    assert!(gate.wait_for_held(1, std::time::Duration::from_secs(10)), "the miss's map reached the gate");
    let taken = cache.alloc(72 * MIB, &S).unwrap();
    gate.open();
    let big = miss.join().unwrap();
    assert_eq!(cache.stats().reserved.current, (112 + 24 + 56) * MIB);
    for block in [a, taken, big] {
        free(&cache, block);
    }
    cache.check_invariants();
}
