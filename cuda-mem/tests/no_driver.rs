//! The no-driver path, against the real statically linked runtime: on a machine without an NVIDIA
//! driver (CI), every entry point must fail with a typed error naming the operation, and never
//! panic. On a GPU host the calls succeed, so every test here starts with
//! [`skip_if_a_driver_answers`] and returns after saying so on stderr.

use cuda_mem::*;

/// True (the test returns at once, having said why) when an NVIDIA driver is installed: there
/// nothing of the no-driver path can be tested. Without one `driver_version` is `Ok((0, 0))`; an
/// error is no proof of a driver, so the assertions run and report it.
fn skip_if_a_driver_answers() -> bool {
    use std::io::Write;
    let Ok((major, minor)) = driver_version() else { return false };
    if (major, minor) == (0, 0) {
        return false;
    }
    // Written to the stream itself, past the harness's capture of `eprintln!`, so that a plain
    // `cargo test` shows it.
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    let _ = writeln!(
        std::io::stderr(),
        "{test}: skipped: an NVIDIA driver is installed here (driver for CUDA {major}.{minor}): the no-driver path cannot be tested"
    );
    true
}

/// The documented codes for "no usable driver/device".
fn assert_no_driver<T: std::fmt::Debug>(result: Result<T>, operation: &str) {
    let err = result.expect_err("no driver is installed, so this must fail");
    let code = err.code().expect("a runtime error carries its code");
    assert!(code.is_no_driver_or_device(), "{operation}: unexpected {code:?} ({err})");
    assert!(err.operation().starts_with(operation), "{:?} should name {operation}", err.operation());
    assert!(!err.is_sticky());
    assert!(err.to_string().contains(&*code.name()), "{err}");
    // This machine has no driver at all, which the error says in words (not "too old").
    assert!(err.is_no_driver(), "{operation}: {err:?}");
    assert!(err.to_string().contains(NO_DRIVER_MESSAGE), "{err}");
    assert!(!err.to_string().contains("insufficient"), "{err}");
}

#[test]
fn no_driver_runtime_calls_report_insufficient_driver() {
    if skip_if_a_driver_answers() {
        return;
    }
    assert_no_driver(Device::count(), "cudaGetDeviceCount");
    // The runtime's own version needs no driver.
    let (major, _minor) = runtime_version().expect("cudaRuntimeGetVersion works without a driver");
    assert_eq!(major, sys::CUDA_MAJOR);
    // With no driver the driver version is reported as 0, without error.
    assert_eq!(driver_version().unwrap(), (0, 0));
}

#[test]
fn no_driver_error_names_and_messages_come_from_the_runtime() {
    if skip_if_a_driver_answers() {
        return;
    }
    assert_eq!(ErrorCode::INSUFFICIENT_DRIVER.name(), "cudaErrorInsufficientDriver");
    assert_eq!(
        ErrorCode::INSUFFICIENT_DRIVER.description(),
        "CUDA driver version is insufficient for CUDA runtime version"
    );
    assert_eq!(ErrorCode::MEMORY_ALLOCATION.description(), "out of memory");
    assert!(ErrorCode::ILLEGAL_ADDRESS.is_sticky());
    assert!(!ErrorCode::MEMORY_ALLOCATION.is_sticky());
    assert_eq!(ErrorCode(987_654).name(), "unrecognized error code");
}

#[test]
fn no_driver_every_constructor_fails_cleanly_without_a_driver() {
    if skip_if_a_driver_answers() {
        return;
    }
    assert_no_driver(Device::new(0), "cudaGetDeviceCount");
    assert_no_driver(Device::current().and_then(|d| d.mem_get_info()), "cudaGetDevice");
    assert_no_driver(Stream::new(), "cudaGetDevice");
    assert_no_driver(Event::new(), "cudaEventCreateWithFlags");
    assert_no_driver(DeviceBuffer::<f32>::zeroed(1024), "cudaGetDevice");
    assert_no_driver(DeviceBuffer::from_slice(&[1u8, 2, 3]), "cudaGetDevice");
    assert_no_driver(PinnedBuffer::<u64>::zeroed(512), "cudaMallocHost of 4096 bytes");
    assert_no_driver(
        PinnedBuffer::<u8>::zeroed_with_flags(64, HostAllocFlags::MAPPED | HostAllocFlags::WRITE_COMBINED),
        "cudaHostAlloc of 64 bytes with HostAllocFlags(MAPPED | WRITE_COMBINED)",
    );
    assert_no_driver(ManagedBuffer::<u32>::zeroed(16), "cudaGetDevice");
    let mut host = vec![0u32; 1024];
    assert_no_driver(RegisteredHost::new(&mut host, HostRegisterFlags::MAPPED), "cudaHostRegister of 4096 bytes");
}

#[test]
fn no_driver_zero_length_buffers_make_no_cuda_call() {
    if skip_if_a_driver_answers() {
        return;
    }
    // Pinned and registered allocations need no device to be empty.
    let empty = PinnedBuffer::<u64>::zeroed(0).expect("empty pinned buffer without a CUDA call");
    assert!(empty.is_empty());
    assert_eq!(empty.device_view().unwrap_err().kind(), &ErrorKind::NotMapped);
    let mapped = PinnedBuffer::<u64>::zeroed_with_flags(0, HostAllocFlags::MAPPED).unwrap();
    assert_eq!(mapped.device_view().unwrap().len(), 0);
    let mut nothing: [u8; 0] = [];
    let registered = RegisteredHost::new(&mut nothing, HostRegisterFlags::empty()).unwrap();
    assert!(registered.unregister().unwrap().is_empty());
    empty.free().unwrap();
}

#[test]
fn no_driver_size_overflow_is_a_typed_error() {
    if skip_if_a_driver_answers() {
        return;
    }
    let err = PinnedBuffer::<u64>::zeroed(usize::MAX / 2).unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::SizeOverflow { len: usize::MAX / 2, elem_size: 8 });
    assert!(err.to_string().contains("overflow"), "{err}");
    let mut big = vec![0u8; 0];
    // A registered slice cannot overflow (it exists), but an element count in a typed request can:
    assert!(RegisteredHost::new(&mut big, HostRegisterFlags::PORTABLE).is_ok());
}

#[test]
fn no_driver_not_mapped_memory_has_no_device_pointer() {
    if skip_if_a_driver_answers() {
        return;
    }
    let mut host = [0u16; 0];
    let registered = RegisteredHost::new(&mut host, HostRegisterFlags::PORTABLE).unwrap();
    assert_eq!(registered.device_view().unwrap_err().kind(), &ErrorKind::NotMapped);
    let mut host = [0u16; 0];
    let mut read_only =
        RegisteredHost::new(&mut host, HostRegisterFlags::MAPPED | HostRegisterFlags::READ_ONLY).unwrap();
    assert!(matches!(read_only.device_view_mut().unwrap_err().kind(), ErrorKind::InvalidArgument(_)));
}

#[test]
fn no_driver_pools_and_stream_ordered_allocation_fail_cleanly() {
    if skip_if_a_driver_answers() {
        return;
    }
    // Without a driver even the device query fails first, with the documented code.
    assert_no_driver(Device::current().map(|d| MemPool::new(PoolProps::new(d))), "cudaGetDevice");
    let device_zero_err = Device::new(0).unwrap_err();
    assert!(device_zero_err.code().unwrap().is_no_driver_or_device());
    assert_no_driver(Stream::non_blocking(), "cudaGetDevice");
}

#[test]
fn no_driver_bad_configuration_is_refused_before_any_cuda_call() {
    if skip_if_a_driver_answers() {
        return;
    }
    let err = StagedCopier::new(StagedConfig { lanes: 0, ..Default::default() }).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
    #[repr(C, align(8192))]
    struct Page([[u8; 4096]; 2]);
    let err = PinnedPool::new(HostAllocFlags::empty()).alloc::<Page>(1).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    let overflow = PinnedPool::new(HostAllocFlags::empty()).alloc::<u64>(usize::MAX / 4).unwrap_err();
    assert!(matches!(overflow.kind(), ErrorKind::SizeOverflow { .. }), "{overflow}");
    // An empty pooled buffer takes no block and needs no driver.
    assert!(PinnedPool::new(HostAllocFlags::empty()).alloc::<u8>(0).unwrap().is_empty());
}
