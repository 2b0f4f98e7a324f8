//! GPU tests for memory resources and adaptors. Ignored where no GPU exists.

mod common;

use common::{MIB, assert_same, pattern};
use cuda_mem::resource::*;
use cuda_mem::*;
use std::sync::Arc;

fn device() -> Device {
    Device::current().unwrap()
}

fn every_resource() -> Vec<Arc<dyn MemoryResource>> {
    let pool = MemPool::new(PoolProps::new(device())).unwrap();
    vec![
        Arc::new(DeviceResource::new(device())),
        Arc::new(ManagedResource::new(device())),
        Arc::new(PoolResource::new(pool)),
        Arc::new(PinnedResource::new(HostAllocFlags::empty())),
        Arc::new(PinnedPoolResource::new(PinnedPool::new(HostAllocFlags::PORTABLE))),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_every_resource_allocates_round_trips_and_frees() {
    let stream = Stream::non_blocking().unwrap();
    let want = pattern(MIB, 21);
    for resource in every_resource() {
        let kind = resource.kind();
        let counted: Arc<StatisticsResource<Arc<dyn MemoryResource>>> = Arc::new(StatisticsResource::new(resource));
        if kind == MemoryKind::PinnedHost {
            let mut buffer = ResourceHostBuffer::<u32>::zeroed(counted.clone(), &stream, want.len()).unwrap();
            assert!(buffer.to_vec().unwrap().iter().all(|&x| x == 0), "{kind:?} zeroed");
            buffer.host_mut().unwrap().copy_from_slice(&want);
            assert_same(&buffer.to_vec().unwrap(), &want);
            assert_eq!(counted.stats().current_bytes, 4 * MIB);
            // The other owner refuses this memory, with a typed error that names the right one.
            let err = ResourceBuffer::<u32>::zeroed(counted.clone(), &stream, 16).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("ResourceHostBuffer")), "{err}");
            drop(buffer);
        } else {
            let mut buffer = ResourceBuffer::<u32>::zeroed(counted.clone(), &stream, want.len()).unwrap();
            assert!(buffer.to_vec().unwrap().iter().all(|&x| x == 0), "{kind:?} zeroed");
            let mut view = buffer.as_mut_slice();
            stream.scope(|s| s.copy_from_host(&mut view, &want)).unwrap().unwrap();
            assert_same(&buffer.to_vec().unwrap(), &want);
            assert_eq!(buffer.is_managed(), kind == MemoryKind::Managed);
            assert_eq!(counted.stats().current_bytes, 4 * MIB);
            let err = ResourceHostBuffer::<u32>::zeroed(counted.clone(), &stream, 16).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(m) if m.contains("ResourceBuffer")), "{err}");
            drop(buffer);
        }
        stream.synchronize().unwrap();
        assert_eq!(counted.stats().current_bytes, 0);
        assert_eq!(counted.stats().peak_bytes, 4 * MIB);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_default_resource_is_the_retaining_pool_and_can_be_replaced() {
    let device = device();
    let default = default_resource(device).unwrap();
    assert_eq!(default.kind(), MemoryKind::Device);
    assert!(default.pool_stats().is_some(), "H200 supports pools: the default is the device pool");
    let replacement: Arc<dyn MemoryResource> = Arc::new(DeviceResource::new(device));
    let previous = set_default_resource(device, Arc::clone(&replacement)).unwrap();
    assert!(Arc::ptr_eq(&previous, &default));
    assert!(Arc::ptr_eq(&default_resource(device).unwrap(), &replacement));
    set_default_resource(device, previous);
}

/// The out-of-memory path for real: a cap, and the device itself. Alone (`gpu_alone_`): its
/// failed allocations make the driver trim every pool, and it asserts on its own pool's reserve.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_out_of_memory_messages_carry_the_figures() {
    if common::skip_unless_alone() {
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let pool = MemPool::new(PoolProps::new(device())).unwrap();
    let capped: Arc<dyn MemoryResource> =
        Arc::new(LimitingResource::new(StatisticsResource::new(PoolResource::new(pool.clone())), 64 * MIB));
    let held = ResourceBuffer::<u8>::zeroed(capped.clone(), &stream, 48 * MIB).unwrap();
    let err = ResourceBuffer::<u8>::zeroed(capped.clone(), &stream, 32 * MIB).unwrap_err();
    let message = err.to_string();
    assert!(err.is_out_of_memory(), "{message}");
    assert!(message.contains("33554432 bytes requested"), "{message}");
    assert!(message.contains("limit of 67108864 bytes would be exceeded (50331648 bytes in use"), "{message}");
    assert!(message.contains("pool reserved"), "{message}");
    drop(held);

    let (free, total) = device().mem_get_info().unwrap();
    let too_big = total + (1 << 30);
    let real = ResourceBuffer::<u8>::zeroed(Arc::new(PoolResource::new(pool.clone())), &stream, too_big).unwrap_err();
    let message = real.to_string();
    assert_eq!(real.code(), Some(ErrorCode::MEMORY_ALLOCATION), "{message}");
    assert!(message.contains(&format!("{too_big} bytes requested")), "{message}");
    assert!(message.contains("pool reserved") && message.contains("MemPool::trim_to"), "{message}");
    let ErrorKind::OutOfMemory { report, .. } = real.kind() else { panic!("{message}") };
    assert!(report.free.unwrap() <= free + (1 << 30) && report.total == Some(total));
    // A failed pool allocation may leave memory reserved in the pool: hand it back.
    stream.synchronize().unwrap();
    pool.trim_to(0).unwrap();
    assert_eq!(pool.stats().unwrap().reserved_current, 0);
    let plain = ResourceBuffer::<u8>::zeroed(Arc::new(DeviceResource::new(device())), &stream, too_big).unwrap_err();
    assert!(plain.to_string().contains("free of"), "{plain}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_tracking_reports_a_leak_with_its_backtrace() {
    let stream = Stream::non_blocking().unwrap();
    let tracked = Arc::new(TrackingResource::new(DeviceResource::new(device()), true));
    let kept = ResourceBuffer::<u8>::zeroed(tracked.clone(), &stream, 12345).unwrap();
    drop(ResourceBuffer::<u8>::zeroed(tracked.clone(), &stream, 999).unwrap());
    let report = tracked.leak_report();
    assert!(report.starts_with("1 allocation(s) not freed, 12345 bytes"), "{report}");
    assert!(report.contains("gpu_tracking_reports_a_leak_with_its_backtrace"), "{report}");
    drop(kept);
    assert_eq!(tracked.leak_report(), "no leaks: every allocation was freed");
}
