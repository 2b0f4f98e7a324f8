//! GPU tests for the core families. Ignored where no GPU exists; `cargo xtask test` on a GPU host
//! and the bundle's `run` include them.

mod common;

use common::{KIB, MIB, assert_same, pattern};
use cuda_mem::*;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_device_properties_are_readable() {
    assert!(Device::count().unwrap() >= 1);
    let device = Device::new(0).unwrap();
    device.set_current().unwrap();
    assert_eq!(Device::current().unwrap(), device);
    assert!(!device.name().unwrap().is_empty());
    let (major, _) = device.compute_capability().unwrap();
    assert!(major >= 5);
    let (free, total) = device.mem_get_info().unwrap();
    assert!(free > 0 && free <= total);
    assert_eq!(device.total_memory().unwrap(), total);
    assert!(device.multiprocessor_count().unwrap() > 0);
    for attribute in [
        DeviceAttribute::ConcurrentManagedAccess,
        DeviceAttribute::PageableMemoryAccess,
        DeviceAttribute::MemoryPoolsSupported,
        DeviceAttribute::CanMapHostMemory,
        DeviceAttribute::UnifiedAddressing,
    ] {
        let value = device.attribute(attribute).unwrap();
        assert!(value == 0 || value == 1, "{attribute:?} = {value}");
    }
    assert!(device.unified_addressing().unwrap());
    assert!(driver_version().unwrap().0 >= 12);
    device.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_invalid_device_ordinal_is_typed() {
    let count = Device::count().unwrap();
    let err = Device::new(count + 7).unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::InvalidDevice { ordinal: (count + 7) as i32, count: count as i32 });
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_device_round_trip_1kib_and_256mib() {
    for bytes in [KIB, 256 * MIB] {
        let host = pattern(bytes / 4, bytes as u32);
        let first = DeviceBuffer::from_slice(&host).unwrap();
        let mut second = DeviceBuffer::<u32>::zeroed(host.len()).unwrap();
        second.as_mut_slice().copy_from_device(first.as_slice()).unwrap();
        assert_same(&second.to_vec().unwrap(), &host);
        first.free().unwrap();
        second.free().unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_async_round_trip_through_pinned_on_a_non_blocking_stream() {
    let stream = Stream::non_blocking().unwrap();
    for bytes in [KIB, 256 * MIB] {
        let src = PinnedBuffer::from_slice(&pattern(bytes / 4, 7), HostAllocFlags::empty()).unwrap();
        let mut dst = PinnedBuffer::<u32>::zeroed(src.len()).unwrap();
        let mut a = DeviceBuffer::<u32>::zeroed(src.len()).unwrap();
        let mut b = DeviceBuffer::<u32>::zeroed(src.len()).unwrap();
        let (mut a, mut b) = (a.as_mut_slice(), b.as_mut_slice());
        stream
            .scope(|s| -> Result<()> {
                s.copy_from_host(&mut a, &src)?;
                s.copy_from_device(&mut b, &a)?;
                s.copy_to_host(&mut dst, &b)
            })
            .unwrap()
            .unwrap();
        assert_same(&dst, &src);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_every_pinned_kind_is_a_copy_source_and_destination() {
    let stream = Stream::non_blocking().unwrap();
    let kinds = [
        HostAllocFlags::empty(),
        HostAllocFlags::PORTABLE,
        HostAllocFlags::MAPPED,
        HostAllocFlags::WRITE_COMBINED,
        HostAllocFlags::PORTABLE | HostAllocFlags::MAPPED | HostAllocFlags::WRITE_COMBINED,
    ];
    for flags in kinds {
        let want = pattern(4 * MIB / 4, flags.bits() + 1);
        let src = PinnedBuffer::from_slice(&want, flags).unwrap();
        assert_eq!(src.flags(), flags);
        let mut dst = PinnedBuffer::<u32>::zeroed_with_flags(want.len(), flags).unwrap();
        let mut device = DeviceBuffer::<u32>::zeroed(want.len()).unwrap();
        // Synchronous path.
        device.as_mut_slice().copy_from_host(&src).unwrap();
        device.as_slice().copy_to_host(&mut dst).unwrap();
        assert_same(&dst, &want);
        // Asynchronous path.
        dst.fill(0);
        device.as_mut_slice().set_bytes(0).unwrap();
        let mut dev = device.as_mut_slice();
        stream
            .scope(|s| s.copy_from_host(&mut dev, &src).and_then(|()| s.copy_to_host(&mut dst, &dev)))
            .unwrap()
            .unwrap();
        assert_same(&dst, &want);
        src.free().unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_registered_memory_is_a_copy_source_and_destination() {
    let want = pattern(8 * MIB / 4, 99);
    let mut src = want.clone();
    let mut dst = vec![0u32; want.len()];
    let stream = Stream::non_blocking().unwrap();
    let src_reg = RegisteredHost::new(&mut src, HostRegisterFlags::PORTABLE).unwrap();
    let mut dst_reg = RegisteredHost::new(&mut dst, HostRegisterFlags::MAPPED).unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(want.len()).unwrap();
    let mut dev = device.as_mut_slice();
    stream
        .scope(|s| s.copy_from_host(&mut dev, &src_reg).and_then(|()| s.copy_to_host(&mut dst_reg, &dev)))
        .unwrap()
        .unwrap();
    assert_same(&dst_reg, &want);
    // The mapped view reads the same memory from the device side.
    let mut via_device = DeviceBuffer::<u32>::zeroed(want.len()).unwrap();
    via_device.as_mut_slice().copy_from_device(dst_reg.device_view().unwrap()).unwrap();
    assert_same(&via_device.to_vec().unwrap(), &want);
    drop(src_reg);
    dst_reg.unregister().unwrap();
}

/// Safe code cannot register the same memory twice (it takes `&mut [T]`). Disjoint slices that
/// share a page are a different matter: the H200's driver accepts both (seen 2026-11-29), and
/// each unregisters on its own.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_disjoint_slices_sharing_a_page_register_independently() {
    let mut host = vec![0u8; 3 * 4096];
    let (a, b) = host.split_at_mut(4096 + 100);
    let first = RegisteredHost::new(a, HostRegisterFlags::empty()).unwrap();
    let second = RegisteredHost::new(b, HostRegisterFlags::empty()).unwrap();
    first.unregister().unwrap();
    second.unregister().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_mapped_buffer_is_read_and_written_through_its_device_pointer() {
    let want = pattern(MIB / 4, 5);
    let mapped = PinnedBuffer::from_slice(&want, HostAllocFlags::MAPPED).unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(want.len()).unwrap();
    // The copy engine reads host memory through the device pointer.
    device.as_mut_slice().copy_from_device(mapped.device_view().unwrap()).unwrap();
    assert_same(&device.to_vec().unwrap(), &want);
    // And writes through it.
    let mut target = PinnedBuffer::<u32>::zeroed_with_flags(want.len(), HostAllocFlags::MAPPED).unwrap();
    target.device_view_mut().unwrap().copy_from_device(device.as_slice()).unwrap();
    assert_same(&target, &want);
    // Non-mapped memory has no device pointer.
    let plain = PinnedBuffer::<u32>::zeroed(4).unwrap();
    assert_eq!(plain.device_view().unwrap_err().kind(), &ErrorKind::NotMapped);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_managed_buffer_cpu_write_advise_prefetch_gpu_modify_cpu_read() {
    let device = Device::current().unwrap();
    let stream = Stream::non_blocking().unwrap();
    let len = 64 * MIB / 4;
    let want = pattern(len, 11);
    let mut managed = ManagedBuffer::<u32>::zeroed(len).unwrap();
    managed.host_mut().unwrap().copy_from_slice(&want); // CPU write
    for advice in [
        Advice::SetReadMostly,
        Advice::UnsetReadMostly,
        Advice::SetPreferredLocation(Location::Device(device)),
        Advice::SetAccessedBy(Location::Device(device)),
        Advice::SetAccessedBy(Location::Host),
    ] {
        managed.advise(advice).unwrap();
    }
    managed.prefetch(Location::Device(device), &stream).unwrap();
    // GPU modification: the first half is set to 0xAB bytes, the second half doubled via a copy.
    let doubled: Vec<u32> = want[len / 2..].iter().map(|x| x.wrapping_mul(2)).collect();
    let source = DeviceBuffer::from_slice(&doubled).unwrap();
    {
        let (mut low, mut high) = managed.as_mut_slice().split_at_mut(len / 2).unwrap();
        stream
            .scope(|s| s.set_bytes(&mut low, 0xAB).and_then(|()| s.copy_from_device(&mut high, source.as_slice())))
            .unwrap()
            .unwrap();
    }
    managed.prefetch(Location::Host, &stream).unwrap();
    stream.synchronize().unwrap();
    let host = managed.host().unwrap();
    assert!(host[..len / 2].iter().all(|&x| x == 0xABAB_ABAB));
    assert_same(&host[len / 2..], &doubled);
    managed.advise(Advice::UnsetPreferredLocation).unwrap();
    managed.advise(Advice::UnsetAccessedBy(Location::Device(device))).unwrap();
    managed.free().unwrap();
}

/// Alone (`gpu_alone_`): a failed allocation makes the driver trim every pool of the process.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_oversized_allocation_reports_requested_and_free_bytes() {
    if common::skip_unless_alone() {
        return;
    }
    let (_, total) = Device::current().unwrap().mem_get_info().unwrap();
    let requested = total * 2;
    let err = DeviceBuffer::<u8>::zeroed(requested).unwrap_err();
    match err.kind() {
        ErrorKind::OutOfMemory { code, report } => {
            assert_eq!(*code, Some(ErrorCode::MEMORY_ALLOCATION));
            assert_eq!(report.requested, requested);
            assert!(report.free.unwrap() <= report.total.unwrap());
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&format!("cudaMalloc of {requested} bytes")), "{message}");
    assert!(message.contains("free of"), "{message}");
    assert!(message.contains("free buffers"), "the message says what to try: {message}");
    // The failure must not poison later work.
    assert_eq!(DeviceBuffer::from_slice(&[1u32, 2, 3]).unwrap().to_vec().unwrap(), [1, 2, 3]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_streams_and_events_order_and_time_work() {
    let (least, greatest) = Stream::priority_range().unwrap();
    assert!(greatest <= least);
    let high = Stream::with_priority(greatest).unwrap();
    let other = Stream::new().unwrap();
    let start = Event::new().unwrap();
    start.record(&high).unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(32 * MIB / 4).unwrap();
    let mut dev = device.as_mut_slice();
    high.scope(|s| s.set_bytes(&mut dev, 1)).unwrap().unwrap();
    let end = high.record_event().unwrap();
    other.wait_event(&end).unwrap();
    end.synchronize().unwrap();
    assert!(end.is_complete().unwrap());
    assert!(end.elapsed_since(&start).unwrap() > std::time::Duration::ZERO);
    other.synchronize().unwrap();
    assert!(other.is_idle().unwrap());
    let per_thread = Stream::per_thread().unwrap();
    per_thread.synchronize().unwrap();
    Stream::legacy_default().unwrap().synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_length_mismatch_and_zero_length_need_no_device_work() {
    let mut device = DeviceBuffer::<u32>::zeroed(8).unwrap();
    let err = device.as_mut_slice().copy_from_host(&[1, 2, 3]).unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::LengthMismatch { src: 3, dst: 8 });
    let empty = DeviceBuffer::<u32>::zeroed(0).unwrap();
    assert!(empty.to_vec().unwrap().is_empty());
    let empty_managed = ManagedBuffer::<u32>::zeroed(0).unwrap();
    assert!(empty_managed.host().unwrap().is_empty());
}
