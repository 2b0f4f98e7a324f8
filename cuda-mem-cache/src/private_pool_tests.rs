//! The private pool over the fake backend: its blocks never reach another allocator, it keeps
//! its segments while it lives (empty_cache, out of memory), and pools shared by several owners
//! peak at the largest owner's need, not the sum.

use super::fake::{FakeBackend, FakeError};
use super::*;

const KIB: usize = 1024;

/// The fake backend as a segment source, sharing its state with an eager allocator.
#[derive(Clone, Default)]
struct Source(FakeBackend);

// SAFETY: the fake backend's segments are distinct live ranges (its `Backend` promise).
unsafe impl SegmentSource for Source {
    type Error = FakeError;

    fn allocate(&self, bytes: usize) -> std::result::Result<std::ptr::NonNull<u8>, FakeError> {
        self.0.allocate(bytes)
    }

    unsafe fn release(&self, base: std::ptr::NonNull<u8>, bytes: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.release(base, bytes) }
    }
}

fn config() -> Config {
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
        cross_stream_waits: true,
        small_segment_divisor: 0,
        small_fit_divisor: 0,
        large_fit_slack: usize::MAX,
        release_idle_on_miss: true,
        live_slack_percent: 0,
        expandable_segments: true,
        max_mapping_bytes: 0,
        map_ahead_bytes: 0,
        own_range_from: 0,
        lowest_for_whole_pages: false,
    }
}

/// Allocates `sizes` as one capture would, then frees them all (the end of the capture).
fn capture(pool: &PrivatePool<Source>, sizes: &[usize]) -> Vec<usize> {
    let blocks: Vec<_> = sizes.iter().map(|&b| pool.alloc(b).unwrap()).collect();
    let addresses = blocks.iter().map(|b| b.ptr().as_ptr() as usize).collect();
    for block in blocks {
        // SAFETY: the fake memory is never used.
        unsafe { pool.free(block) };
    }
    pool.check_invariants();
    addresses
}

#[test]
fn private_blocks_never_reach_the_eager_allocator() {
    let fake = FakeBackend::default();
    let eager = CachingAllocator::new(fake.clone(), config()).unwrap();
    let pool = PrivatePool::new(Source(fake.clone()), &config()).unwrap();
    let private = capture(&pool, &[KIB, 3 * KIB, 20 * KIB, 40 * KIB]);
    assert!(private.iter().all(|&a| pool.contains(a)));
    let stream = StreamKey(1);
    let mut held = Vec::new();
    for bytes in [KIB, 3 * KIB, 20 * KIB, 40 * KIB, KIB, 3 * KIB, 20 * KIB, 40 * KIB] {
        let block = eager.alloc(bytes, &stream).unwrap();
        assert!(!pool.contains(block.ptr().as_ptr() as usize), "an eager block in the private pool");
        held.push(block);
    }
    for block in held {
        // SAFETY: never used.
        unsafe { eager.free(block) };
    }
    eager.check_invariants();
}

#[test]
fn private_segments_survive_empty_cache_and_out_of_memory() {
    let fake = FakeBackend::default();
    let eager = CachingAllocator::new(fake.clone(), config()).unwrap();
    let pool = PrivatePool::new(Source(fake.clone()), &config()).unwrap();
    capture(&pool, &[2 * KIB, 48 * KIB]);
    let segments = pool.segment_ranges();
    assert!(!segments.is_empty());
    assert_eq!(pool.try_empty(), 0, "a private pool releases nothing while it lives");
    eager.empty_cache();
    // The eager allocator runs out: it releases what it holds, and the private pool keeps its own.
    fake.set_capacity(Some(fake.reserved()));
    let err = eager.alloc(64 * KIB, &StreamKey(1)).unwrap_err();
    assert!(err.is_out_of_memory());
    // The pool itself runs out: it too keeps its segments.
    let err = pool.alloc(256 * KIB).unwrap_err();
    assert!(err.is_out_of_memory());
    assert!(fake.take_released().is_empty(), "no private segment released");
    let live = fake.live_segments();
    assert!(segments.iter().all(|s| live.contains(s)));
    // A free block still serves the pool after its failed growth.
    capture(&pool, &[48 * KIB]);
    fake.set_capacity(None);
    drop(pool);
    let mut released = fake.take_released();
    released.sort();
    let mut segments = segments;
    segments.sort();
    assert_eq!(released, segments, "dropping the pool releases its segments");
}

#[test]
fn shared_pool_peaks_at_the_larger_capture_not_the_sum() {
    let a = [3 * KIB, 24 * KIB, 40 * KIB, 512, 10 * KIB];
    let b = [2 * KIB, 20 * KIB, 44 * KIB, 4 * KIB];
    let peak = |captures: &[&[usize]]| {
        let pool = PrivatePool::new(Source::default(), &config()).unwrap();
        for sizes in captures {
            capture(&pool, sizes);
        }
        pool.stats().reserved.peak
    };
    let (alone_a, alone_b, shared) = (peak(&[&a]), peak(&[&b]), peak(&[&a, &b]));
    assert!(shared < alone_a + alone_b, "{shared} vs {alone_a} + {alone_b}");
    assert!(shared * 10 <= alone_a.max(alone_b) * 11, "{shared} vs max({alone_a}, {alone_b})");
}

#[test]
fn later_captures_reuse_the_blocks_of_earlier_ones() {
    let pool = PrivatePool::new(Source::default(), &config()).unwrap();
    let first = capture(&pool, &[KIB, 40 * KIB]);
    let misses = pool.stats().misses;
    let second = capture(&pool, &[KIB, 40 * KIB]);
    assert_eq!(pool.stats().misses, misses, "the second capture grows nothing");
    let mut first = first;
    let mut second = second;
    first.sort();
    second.sort();
    assert_eq!(first, second);
    assert_eq!(pool.stats().allocated.current, 0);
}

#[test]
fn blocks_out_are_never_handed_out_twice() {
    let pool = PrivatePool::new(Source::default(), &config()).unwrap();
    let held: Vec<_> = (0..6).map(|_| pool.alloc(3 * KIB).unwrap()).collect();
    let again = capture(&pool, &[3 * KIB; 6]);
    assert!(again.iter().all(|a| held.iter().all(|b| b.ptr().as_ptr() as usize != *a)));
    for block in held {
        // SAFETY: never used.
        unsafe { pool.free(block) };
    }
    pool.check_invariants();
}
