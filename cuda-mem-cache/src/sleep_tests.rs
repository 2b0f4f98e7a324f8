//! Sleep and wake over the fake backend: what a sleep gives back and keeps, what a wake restores,
//! and every refusal and failure leaving nothing lost.

use super::fake::{FakeBackend, FakeError};
use super::*;

const PAGE: usize = 16 << 10;
const KIB: usize = 1024;
const S: StreamKey = StreamKey(0x10);
const T: StreamKey = StreamKey(0x20);

fn paged() -> (CachingAllocator<FakeBackend>, FakeBackend) {
    let backend = FakeBackend::with_pages(PAGE, 256 * PAGE);
    let config = Config { front_depth: 2, max_mapping_bytes: 4 * PAGE, ..Config::default() };
    (CachingAllocator::new(backend.clone(), config).unwrap(), backend)
}

fn addr(block: &CachedBlock) -> usize {
    block.ptr().as_ptr().addr()
}

fn free(cache: &CachingAllocator<FakeBackend>, block: CachedBlock) {
    // SAFETY: the fake backend's memory is never touched; blocks come from `cache`.
    unsafe { cache.free(block) };
}

fn sleep(cache: &CachingAllocator<FakeBackend>, keep: Keep) -> Result<usize, FakeError> {
    // SAFETY: fake memory: no work uses it; the tests free nothing while the cache sleeps.
    unsafe { cache.sleep(keep) }
}

/// Blocks on two streams, each stamped with a token of its own (its mapping's contents), and a
/// freed one. Returns the live blocks with their tokens.
fn weights(cache: &CachingAllocator<FakeBackend>, backend: &FakeBackend) -> Vec<(CachedBlock, u64)> {
    let mut live = Vec::new();
    for (i, (bytes, stream)) in [(3 * PAGE, S), (40 * KIB, T), (9 * PAGE, S), (PAGE, T)].into_iter().enumerate() {
        let block = cache.alloc(bytes, &stream).unwrap();
        let token = 0xC0DE_0000 + i as u64;
        assert!(backend.stamp(addr(&block), token));
        live.push((block, token));
    }
    let scratch = cache.alloc(20 * PAGE, &S).unwrap();
    free(cache, scratch);
    live
}

#[test]
fn a_sleep_gives_back_every_page_and_a_wake_restores_the_blocks_at_their_addresses() {
    let (cache, backend) = paged();
    let live = weights(&cache, &backend);
    let live_mapped = backend.mapped_bytes();
    let slept = sleep(&cache, Keep::Contents).unwrap();
    assert!(cache.is_asleep());
    // The free scratch block's pages went back as in `empty_cache`; the rest were evicted.
    assert_eq!((backend.mapped_bytes(), backend.reserved()), (0, 0), "no device memory held while asleep");
    assert_eq!(backend.evicted_bytes(), slept);
    assert!(slept <= live_mapped && slept >= live.iter().map(|(b, _)| b.bytes()).sum::<usize>());
    assert_eq!(cache.stats().reserved.current, 0);
    cache.check_invariants();
    for (block, _) in &live {
        assert_eq!(backend.stamp_of(addr(block)), None, "nothing mapped at a sleeping block");
    }
    assert_eq!(cache.wake().unwrap(), slept);
    assert!(!cache.is_asleep());
    assert_eq!(cache.stats().reserved.current, slept);
    for (block, token) in &live {
        assert!(backend.is_mapped(addr(block), block.bytes()));
        assert_eq!(backend.stamp_of(addr(block)), Some(*token), "contents kept");
    }
    // The cache works as before: its blocks free and new ones come.
    let more = cache.alloc(5 * PAGE, &T).unwrap();
    assert!(backend.is_mapped(addr(&more), 5 * PAGE));
    free(&cache, more);
    live.into_iter().for_each(|(block, _)| free(&cache, block));
    cache.check_invariants();
    assert_eq!(cache.stats().allocated.current, 0);
}

#[test]
fn keeping_nothing_restores_the_addresses_without_the_contents() {
    let (cache, backend) = paged();
    let live = weights(&cache, &backend);
    sleep(&cache, Keep::Nothing).unwrap();
    cache.wake().unwrap();
    for (block, _) in &live {
        assert_eq!(backend.stamp_of(addr(block)), Some(0), "mapped, contents not kept");
    }
    live.into_iter().for_each(|(block, _)| free(&cache, block));
    cache.check_invariants();
}

#[test]
fn a_sleeping_cache_refuses_allocations_a_second_sleep_and_a_wake_when_awake() {
    let (cache, backend) = paged();
    let live = weights(&cache, &backend);
    assert!(matches!(cache.wake(), Err(Error::SleepState(_))), "a wake of an awake cache");
    sleep(&cache, Keep::Contents).unwrap();
    let calls = backend.driver_calls();
    for stream in [S, T, StreamKey(0x99)] {
        // Whatever the stream or size: a front cache's block as much as a miss.
        for bytes in [512, 40 * KIB, 3 * PAGE] {
            let err = cache.alloc(bytes, &stream).unwrap_err();
            assert!(matches!(err, Error::SleepState(_)), "{err}");
        }
    }
    let err = sleep(&cache, Keep::Nothing).unwrap_err();
    assert!(matches!(err, Error::SleepState(_)), "{err}");
    assert_eq!(backend.driver_calls(), calls, "no map, unmap or release while asleep");
    cache.wake().unwrap();
    for (block, token) in &live {
        assert_eq!(backend.stamp_of(addr(block)), Some(*token), "the refused second sleep kept nothing less");
    }
    live.into_iter().for_each(|(block, _)| free(&cache, block));
}

#[test]
fn a_wake_without_memory_is_out_of_memory_leaves_the_cache_asleep_and_can_be_retried() {
    let (cache, backend) = paged();
    let live = weights(&cache, &backend);
    let slept = sleep(&cache, Keep::Contents).unwrap();
    // Another user took the device: room for less than the blocks.
    backend.set_capacity(Some(slept - PAGE));
    let err = cache.wake().unwrap_err();
    assert!(err.is_out_of_memory() && matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(cache.is_asleep());
    assert_eq!((backend.mapped_bytes(), backend.evicted_bytes()), (0, slept), "nothing half mapped");
    assert!(cache.alloc(PAGE, &S).is_err(), "still asleep");
    backend.fail_next_allocations(1);
    assert!(cache.wake().unwrap_err().is_out_of_memory(), "a refused create");
    backend.set_capacity(None);
    assert_eq!(cache.wake().unwrap(), slept);
    for (block, token) in &live {
        assert_eq!(backend.stamp_of(addr(block)), Some(*token), "contents kept through the failed wakes");
    }
    live.into_iter().for_each(|(block, _)| free(&cache, block));
    cache.check_invariants();
}

#[test]
fn a_failed_sleep_leaves_the_cache_awake_with_every_block_and_its_contents() {
    let (cache, backend) = paged();
    let live = weights(&cache, &backend);
    // The eviction fails (no host memory for the kept bytes, say).
    backend.fail_next_evictions(1);
    let err = sleep(&cache, Keep::Contents).unwrap_err();
    assert!(matches!(err, Error::Backend(FakeError::EvictionRefused)), "{err}");
    assert!(!cache.is_asleep());
    // A stream whose fence cannot be recorded (a broken context): the sleep stops before evicting.
    backend.fail_records(true);
    let err = sleep(&cache, Keep::Contents).unwrap_err();
    assert!(matches!(err, Error::Backend(FakeError::FenceRefused)), "{err}");
    assert!(!cache.is_asleep());
    backend.fail_records(false);
    for (block, token) in &live {
        assert!(backend.is_mapped(addr(block), block.bytes()));
        assert_eq!(backend.stamp_of(addr(block)), Some(*token));
    }
    let more = cache.alloc(2 * PAGE, &S).unwrap();
    free(&cache, more);
    // And a sleep after the failures works.
    sleep(&cache, Keep::Contents).unwrap();
    cache.wake().unwrap();
    live.into_iter().for_each(|(block, _)| free(&cache, block));
    cache.check_invariants();
}

#[test]
fn a_sleep_waits_for_the_work_queued_on_the_blocks_streams() {
    let (cache, backend) = paged();
    let live = weights(&cache, &backend);
    let (s_work, t_work) = (backend.submit(S), backend.submit(T));
    sleep(&cache, Keep::Contents).unwrap();
    assert!(backend.is_complete(S, s_work) && backend.is_complete(T, t_work), "evicted after the work on them");
    cache.wake().unwrap();
    live.into_iter().for_each(|(block, _)| free(&cache, block));
}

#[test]
fn a_cache_of_whole_segments_cannot_sleep() {
    let cache = CachingAllocator::new(FakeBackend::default(), Config::default()).unwrap();
    let block = cache.alloc(4 * KIB, &S).unwrap();
    assert!(matches!(
        // SAFETY: fake memory.
        unsafe { cache.sleep(Keep::Contents) },
        Err(Error::Refused(_))
    ));
    assert!(!cache.is_asleep());
    free(&cache, block);
}

/// Many cycles: the contents after every wake are the ones before the sleep, and the device
/// and the cache hold the same memory after every cycle.
#[test]
fn a_thousand_cycles_keep_contents_and_memory_flat() {
    let (cache, backend) = paged();
    let mut live = weights(&cache, &backend);
    let cycles = if cfg!(miri) { 20 } else { 1000 };
    let (mapped, reserved) = {
        sleep(&cache, Keep::Contents).unwrap();
        cache.wake().unwrap();
        (backend.mapped_bytes(), cache.stats().reserved.current)
    };
    for cycle in 0..cycles {
        // Work between cycles: new contents, and a block freed and allocated again.
        for (i, (block, token)) in live.iter_mut().enumerate() {
            *token = (cycle as u64) << 8 | i as u64;
            assert!(backend.stamp(addr(block), *token));
        }
        let scratch = cache.alloc(7 * PAGE, &T).unwrap();
        free(&cache, scratch);
        sleep(&cache, Keep::Contents).unwrap();
        assert_eq!(backend.mapped_bytes(), 0);
        cache.wake().unwrap();
        for (block, token) in &live {
            assert_eq!(backend.stamp_of(addr(block)), Some(*token), "cycle {cycle}");
        }
        assert_eq!((backend.mapped_bytes(), cache.stats().reserved.current), (mapped, reserved), "cycle {cycle}");
    }
    live.into_iter().for_each(|(block, _)| free(&cache, block));
    cache.check_invariants();
}
