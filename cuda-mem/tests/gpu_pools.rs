//! GPU tests for stream-ordered allocation and memory pools. Ignored where no GPU exists.

mod common;

use common::{MIB, assert_same, pattern};
use cuda_mem::*;

fn device() -> Device {
    Device::current().unwrap()
}

/// Allocate on stream A, fill on stream B, free on A ordered by an event; data verified.
/// The bundle also runs this one under compute-sanitizer memcheck and racecheck.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alloc_on_a_fill_on_b_free_on_a_ordered_by_event() {
    let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
    let pool = MemPool::new(PoolProps::new(device())).unwrap();
    let want = pattern(4 * MIB / 4, 3);
    let mut back = vec![0u32; want.len()];
    for round in 0..4 {
        let mut buffer = StreamBuffer::<u32>::zeroed_from(&pool, &a, want.len()).unwrap();
        buffer.use_on(&b).unwrap(); // B waits for the allocation and memset on A
        let mut view = buffer.as_mut_slice();
        b.scope(|s| s.copy_from_host(&mut view, &want).and_then(|()| s.copy_to_host(&mut back, &view)))
            .unwrap()
            .unwrap();
        assert_same(&back, &want);
        back.fill(round);
        drop(buffer); // cudaFreeAsync on A after an event recorded on B
    }
    a.synchronize().unwrap();
    assert_eq!(pool.stats().unwrap().used_current, 0);
}

/// Unordered-looking but legal: B's work is queued without a host sync, and the free on A must
/// wait for it through the event `use_on` arranged.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_free_waits_for_the_other_streams_work() {
    let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
    let pool = MemPool::new(PoolProps::new(device())).unwrap();
    let mut keep = DeviceBuffer::<u32>::zeroed(16 * MIB / 4).unwrap();
    let mut temp = StreamBuffer::<u32>::zeroed_from(&pool, &a, keep.len()).unwrap();
    temp.use_on(&b).unwrap();
    let (mut keep_view, mut temp_view) = (keep.as_mut_slice(), temp.as_mut_slice());
    b.scope(|s| s.set_bytes(&mut temp_view, 0x5A).and_then(|()| s.copy_from_device(&mut keep_view, &temp_view)))
        .unwrap()
        .unwrap();
    temp.free_on(&b).unwrap();
    b.synchronize().unwrap();
    assert!(keep.to_vec().unwrap().iter().all(|&x| x == 0x5A5A_5A5A));
}

/// Alone (`gpu_alone_`): it asserts on the reserve, which the driver trims when an allocation
/// anywhere in the process fails for lack of memory.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_pool_statistics_follow_allocations_and_trim() {
    if common::skip_unless_alone() {
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let pool = MemPool::new(PoolProps::new(device())).unwrap();
    assert_eq!(pool.release_threshold().unwrap(), usize::MAX, "created pools retain by default");
    let before = pool.stats().unwrap();
    assert_eq!(before.used_current, 0);
    let first = StreamBuffer::<u8>::zeroed_from(&pool, &stream, 64 * MIB).unwrap();
    let used_one = pool.stats().unwrap().used_current;
    assert!(used_one >= 64 * MIB);
    let second = StreamBuffer::<u8>::zeroed_from(&pool, &stream, 32 * MIB).unwrap();
    let stats = pool.stats().unwrap();
    assert!(stats.used_current >= used_one + 32 * MIB);
    assert!(stats.reserved_current >= stats.used_current);
    drop(first);
    drop(second);
    stream.synchronize().unwrap();
    let after = pool.stats().unwrap();
    assert_eq!(after.used_current, 0);
    assert!(after.used_high >= 96 * MIB);
    assert!(after.reserved_current >= 96 * MIB, "retained after synchronize: {after:?}");
    pool.trim_to(0).unwrap();
    let trimmed = pool.stats().unwrap();
    assert_eq!(trimmed.reserved_current, 0, "{trimmed:?}");
    pool.reset_highs().unwrap();
    let reset = pool.stats().unwrap();
    assert_eq!((reset.reserved_high, reset.used_high), (0, 0));
}

/// The trap: with the driver's default threshold (0) a synchronize returns the memory. Alone: it
/// asserts on the reserve.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_release_threshold_zero_returns_memory_at_synchronize() {
    if common::skip_unless_alone() {
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let pool = MemPool::new(PoolProps::new(device()).release_threshold(0)).unwrap();
    assert_eq!(pool.release_threshold().unwrap(), 0);
    drop(StreamBuffer::<u8>::zeroed_from(&pool, &stream, 64 * MIB).unwrap());
    stream.synchronize().unwrap();
    assert_eq!(pool.stats().unwrap().reserved_current, 0);
    pool.set_release_threshold(usize::MAX).unwrap();
    drop(StreamBuffer::<u8>::zeroed_from(&pool, &stream, 64 * MIB).unwrap());
    stream.synchronize().unwrap();
    assert!(pool.stats().unwrap().reserved_current >= 64 * MIB);
}

/// Alone (`gpu_alone_`): the allocation over `max_size` fails for lack of memory.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_odd_sizes_allocate_and_max_size_is_enforced() {
    if common::skip_unless_alone() {
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let pool = MemPool::new(PoolProps::new(device()).max_size(256 * MIB)).unwrap();
    for bytes in [1usize, 16441, 67_121_209] {
        let buffer = StreamBuffer::<u8>::zeroed_from(&pool, &stream, bytes).unwrap();
        assert_eq!(buffer.len(), bytes);
        assert!(buffer.as_slice().to_vec().is_ok());
    }
    stream.synchronize().unwrap();
    let err = StreamBuffer::<u8>::zeroed_from(&pool, &stream, 512 * MIB).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("cudaMallocFromPoolAsync of 536870912 bytes"), "{err}");
    match err.kind() {
        ErrorKind::OutOfMemory { report, .. } => {
            let pool_stats = report.pool.expect("pool figures attached");
            assert!(pool_stats.reserved_current >= pool_stats.used_current);
            assert!(report.pool_slack().is_some());
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("MemPool::trim_to"), "{err}");
    // The pool still works after the failure.
    assert!(StreamBuffer::<u8>::zeroed_from(&pool, &stream, 16 * MIB).is_ok());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_current_and_default_pools() {
    let device = device();
    let stream = Stream::non_blocking().unwrap();
    let retaining = MemPool::retaining(device).unwrap();
    assert_eq!(retaining.release_threshold().unwrap(), usize::MAX, "cuda-mem's default pool retains");
    let driver = MemPool::driver_default(device).unwrap();
    assert_ne!(driver.as_raw(), retaining.as_raw(), "the default path does not use the driver's pool");
    let created = MemPool::new(PoolProps::new(device)).unwrap();
    created.set_current().unwrap();
    assert_eq!(MemPool::current(device).unwrap().as_raw(), created.as_raw());
    // The default path allocates from the retaining pool whatever pool is current.
    let from_default = StreamBuffer::<u32>::zeroed(&stream, MIB).unwrap();
    assert_eq!(from_default.pool().as_raw(), retaining.as_raw());
    assert_eq!(created.stats().unwrap().used_current, 0, "nothing came from the current pool");
    drop(from_default);
    drop(created); // still current, so still alive
    assert!(MemPool::current(device).unwrap().stats().is_ok());
    driver.set_current().unwrap();
    assert_eq!(MemPool::current(device).unwrap().as_raw(), driver.as_raw());
    for policy in
        [ReusePolicy::FollowEventDependencies, ReusePolicy::AllowOpportunistic, ReusePolicy::AllowInternalDependencies]
    {
        let pool = MemPool::new(PoolProps::new(device)).unwrap();
        pool.set_reuse_policy(policy, false).unwrap();
        assert!(!pool.reuse_policy(policy).unwrap());
        pool.set_reuse_policy(policy, true).unwrap();
        assert!(pool.reuse_policy(policy).unwrap());
    }
    stream.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_stream_buffers_work_wherever_device_slices_do() {
    let stream = Stream::non_blocking().unwrap();
    let want = pattern(MIB, 17);
    let mut staged = StreamBuffer::<u32>::zeroed(&stream, want.len()).unwrap();
    let mut device_copy = DeviceBuffer::<u32>::zeroed(want.len()).unwrap();
    let (mut view, mut copy_view) = (staged.as_mut_slice(), device_copy.as_mut_slice());
    stream
        .scope(|s| s.copy_from_host(&mut view, &want).and_then(|()| s.copy_from_device(&mut copy_view, &view)))
        .unwrap()
        .unwrap();
    assert_same(&device_copy.to_vec().unwrap(), &want);
    assert_same(&staged.as_slice().to_vec().unwrap(), &want);
    let empty = StreamBuffer::<u32>::zeroed(&stream, 0).unwrap();
    assert!(empty.is_empty());
    empty.free().unwrap();
    staged.free().unwrap();
}

/// Dropping every handle of a pool while an allocation is alive: the buffer owns the pool.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dropping_a_pool_with_live_allocations_keeps_them_valid() {
    let stream = Stream::non_blocking().unwrap();
    let want = pattern(MIB, 61);
    let mut buffer = {
        let pool = MemPool::new(PoolProps::new(device())).unwrap();
        StreamBuffer::<u32>::zeroed_from(pool, &stream, want.len()).unwrap() // moved in: owned
    }; // the last handle the caller had is gone
    let mut view = buffer.as_mut_slice();
    stream.scope(|s| s.copy_from_host(&mut view, &want)).unwrap().unwrap();
    assert_same(&buffer.as_slice().to_vec().unwrap(), &want);
    assert!(buffer.pool().stats().unwrap().used_current >= 4 * MIB);
    buffer.free().unwrap();
    stream.synchronize().unwrap();
}
