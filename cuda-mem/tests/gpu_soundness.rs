//! Programs in safe Rust that broke the "no UB from safe code" promise at cf97dc0, each now a
//! typed error or correct behaviour (issue 17). Tests that need two GPUs start with `gpu2_`.

mod common;

use common::{MIB, pattern};
use cuda_mem::*;

fn is_invalid_argument(err: &CudaError) -> bool {
    matches!(err.kind(), ErrorKind::InvalidArgument(_))
}

/// Work queued through a scope of the per-thread stream from another thread would land on that
/// thread's stream, which the scope does not wait for: it is refused, and the borrowed host
/// memory is untouched once the scope has returned.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_per_thread_stream_refuses_work_from_another_thread() {
    let len = 64 * MIB / 4;
    let source = DeviceBuffer::from_slice(&pattern(len, 17)).unwrap();
    let stream = Stream::per_thread().unwrap();
    let mut host = vec![0u32; len];
    let outcome = stream
        .scope(|s| {
            std::thread::scope(|threads| threads.spawn(|| s.copy_to_host(&mut host, source.as_slice())).join().unwrap())
        })
        .unwrap();
    let err = outcome.expect_err("a per-thread stream accepted work from another thread");
    assert!(is_invalid_argument(&err), "{err}");
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(host.iter().all(|&x| x == 0), "the host buffer was written after the scope returned");

    // The creating thread may use it, and the scope waits for exactly that work.
    let mut back = vec![0u32; len];
    stream.scope(|s| s.copy_to_host(&mut back, source.as_slice())).unwrap().unwrap();
    assert!(back == pattern(len, 17));

    // Buffers, which may be freed on any thread, refuse it.
    let err = StreamBuffer::<u32>::zeroed(&stream, 16).unwrap_err();
    assert!(is_invalid_argument(&err), "{err}");
    let resource = resource::default_resource(Device::current().unwrap()).unwrap();
    let err = resource::ResourceBuffer::<u32>::zeroed(&resource, &stream, 16).unwrap_err();
    assert!(is_invalid_argument(&err), "{err}");
}

/// A clone of the per-thread stream moved to another thread cannot be synchronized there either.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_per_thread_stream_clone_on_another_thread_is_refused() {
    let stream = Stream::per_thread().unwrap();
    let moved = stream.clone();
    let err = std::thread::spawn(move || moved.synchronize()).join().unwrap().unwrap_err();
    assert!(is_invalid_argument(&err), "{err}");
    stream.synchronize().unwrap();
}

/// The legacy stream of device 0 keeps meaning device 0's stream while device 1 is current.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu2_legacy_stream_stays_on_its_device_when_another_is_current() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let (zero, one) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    zero.set_current().unwrap();
    let legacy = Stream::legacy_default().unwrap();
    let source = DeviceBuffer::from_slice(&pattern(MIB, 5)).unwrap();
    one.set_current().unwrap();
    let mut back = vec![0u32; MIB];
    legacy.scope(|s| s.copy_to_host(&mut back, source.as_slice())).unwrap().unwrap();
    assert!(back == pattern(MIB, 5));
    assert_eq!(Device::current().unwrap(), one, "the caller's current device is restored");
    zero.set_current().unwrap();
}

/// The per-thread stream of device 0 keeps meaning device 0's per-thread stream of this thread
/// while device 1 is current: a scope's work and its final synchronize go there, and the caller's
/// current device is restored.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu2_per_thread_stream_stays_on_its_device_when_another_is_current() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let (zero, one) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    zero.set_current().unwrap();
    let per_thread = Stream::per_thread().unwrap();
    assert_eq!(per_thread.device(), zero);
    let source = DeviceBuffer::from_slice(&pattern(MIB, 9)).unwrap();
    let mut target = DeviceBuffer::<u32>::zeroed(MIB).unwrap();
    one.set_current().unwrap();
    let mut back = vec![0u32; MIB];
    let mut view = target.as_mut_slice();
    per_thread
        .scope(|s| -> Result<()> {
            s.copy_from_device(&mut view, source.as_slice())?;
            s.copy_to_host(&mut back, &view)
        })
        .unwrap()
        .unwrap();
    assert!(back == pattern(MIB, 9));
    assert_eq!(Device::current().unwrap(), one, "the caller's current device is restored");
    per_thread.synchronize().unwrap();
    assert!(per_thread.is_idle().unwrap());
    assert_eq!(Device::current().unwrap(), one);
    zero.set_current().unwrap();
}

/// Code outside cuda-mem gets a built-in stream's raw handle only where it means that stream:
/// with the stream's device current (and, for the per-thread stream, on its thread).
#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu2_builtin_handles_are_refused_to_other_code_while_another_device_is_current() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let (zero, one) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    zero.set_current().unwrap();
    let (legacy, per_thread) = (Stream::legacy_default().unwrap(), Stream::per_thread().unwrap());
    assert!(legacy.checked_raw().is_ok() && per_thread.checked_raw().is_ok());
    one.set_current().unwrap();
    for stream in [&legacy, &per_thread] {
        let err = stream.checked_raw().unwrap_err();
        assert!(is_invalid_argument(&err), "{err}");
    }
    // A created stream names one stream from anywhere.
    let created = Stream::on_device(zero).unwrap();
    assert!(created.checked_raw().is_ok());
    zero.set_current().unwrap();
}

/// A zeroed stream-ordered buffer reused the previous owner's memory; blocking reads used to run
/// on the legacy stream before the zeroing on a busy non-blocking stream ran.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_blocking_reads_of_a_zeroed_stream_buffer_wait_for_its_zeroing() {
    let stream = Stream::non_blocking().unwrap();
    let pool = MemPool::new(PoolProps::new(Device::current().unwrap())).unwrap();
    let len = 64 * MIB;
    let big = DeviceBuffer::<u8>::zeroed(512 * MIB).unwrap();
    let mut busy = DeviceBuffer::<u8>::zeroed(512 * MIB).unwrap();
    for round in 0..5 {
        let mut previous = StreamBuffer::<u8>::zeroed_from(&pool, &stream, len).unwrap();
        previous.as_mut_slice().set_bytes(0xff).unwrap();
        drop(previous);
        // Keep the stream busy so its zeroing of the next buffer is late.
        let mut busy_view = busy.as_mut_slice();
        stream
            .scope(|s| {
                for _ in 0..8 {
                    s.copy_from_device(&mut busy_view, big.as_slice())?;
                }
                Ok::<_, CudaError>(())
            })
            .unwrap()
            .unwrap();
        let mut reused = StreamBuffer::<u8>::zeroed_from(&pool, &stream, len).unwrap();
        let seen = reused.as_slice().to_vec().unwrap();
        assert!(seen.iter().all(|&b| b == 0), "round {round}: a blocking read saw the previous owner's bytes");
        reused.as_mut_slice().copy_from_host(&vec![7u8; len]).unwrap();
        assert!(reused.as_slice().to_vec().unwrap().iter().all(|&b| b == 7));
    }
}

/// A scope on another stream is ordered after the buffer's own stream (its allocation and
/// zeroing) without a `use_on`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_scope_on_another_stream_waits_for_the_buffers_zeroing() {
    let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
    let len = 64 * MIB;
    let big = DeviceBuffer::<u8>::zeroed(512 * MIB).unwrap();
    let mut busy = DeviceBuffer::<u8>::zeroed(512 * MIB).unwrap();
    for round in 0..5 {
        let mut previous = StreamBuffer::<u8>::zeroed(&a, len).unwrap();
        previous.as_mut_slice().set_bytes(0xff).unwrap();
        drop(previous);
        let mut busy_view = busy.as_mut_slice();
        a.scope(|s| s.copy_from_device(&mut busy_view, big.as_slice())).unwrap().unwrap();
        let reused = StreamBuffer::<u8>::zeroed(&a, len).unwrap();
        let mut back = vec![1u8; len];
        b.scope(|s| s.copy_to_host(&mut back, reused.as_slice())).unwrap().unwrap();
        assert!(back.iter().all(|&x| x == 0), "round {round}: stream b read before a's zeroing");
    }
}

/// `MemPool::current` used to return a non-owning handle that outlived the pool it named.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_current_pool_handle_keeps_its_pool_alive() {
    let device = Device::current().unwrap();
    let stream = Stream::non_blocking().unwrap();
    let created = MemPool::new(PoolProps::new(device)).unwrap();
    created.set_current().unwrap();
    let raw = created.as_raw();
    drop(created);
    let current = MemPool::current(device).unwrap();
    assert_eq!(current.as_raw(), raw);
    current.set_release_threshold(usize::MAX).unwrap();
    let buffer = StreamBuffer::<u32>::zeroed_from(&current, &stream, MIB).unwrap();
    assert!(current.stats().unwrap().used_current >= 4 * MIB);
    drop(buffer);
    stream.synchronize().unwrap();
    // Making the driver's pool current again releases ours once the last handle is gone.
    MemPool::driver_default(device).unwrap().set_current().unwrap();
    assert_ne!(MemPool::current(device).unwrap().as_raw(), raw);
    assert!(current.stats().is_ok(), "the handle still owns its pool");
}

/// Element types aligned beyond what the allocator returns are refused, never misaligned.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_over_aligned_element_types_are_refused_or_aligned() {
    #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
    #[repr(C, align(65536))]
    struct Page([[u8; 4096]; 16]);

    fn check<B>(result: Result<B>, address: impl Fn(&B) -> usize, family: &str) {
        match result {
            Ok(buffer) => assert_eq!(address(&buffer) % 65536, 0, "{family} handed out a misaligned buffer"),
            Err(err) => assert!(is_invalid_argument(&err), "{family}: {err}"),
        }
    }
    for _ in 0..4 {
        check(PinnedBuffer::<Page>::zeroed(1), |b| b.as_ptr() as usize, "PinnedBuffer");
        check(ManagedBuffer::<Page>::zeroed(1), |b| b.host().unwrap().as_ptr() as usize, "ManagedBuffer");
        check(DeviceBuffer::<Page>::zeroed(1), |b| b.as_slice().as_device_ptr() as usize, "DeviceBuffer");
        let stream = Stream::non_blocking().unwrap();
        check(StreamBuffer::<Page>::zeroed(&stream, 1), |b| b.as_slice().as_device_ptr() as usize, "StreamBuffer");
    }
}

/// A failed unregister gives the registration back instead of dropping it unannounced.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_failed_unregister_returns_the_registration() {
    let mut host = vec![0u8; 4 * MIB];
    let registered = RegisteredHost::new(&mut host, HostRegisterFlags::empty()).unwrap();
    // Unregistered behind the wrapper's back (what another library could do), so its own
    // unregister fails.
    // SAFETY: the pointer is the start of the registered range.
    let code = unsafe { sys::cudaHostUnregister(registered.as_ptr().cast_mut().cast()) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    let failed = registered.unregister().expect_err("unregistering twice succeeded");
    assert_eq!(failed.host.len(), 4 * MIB);
    let err: CudaError = failed.into();
    assert!(err.code().is_some(), "{err}");
    // The failure was consumed: the thread's last-error slot is clean.
    // SAFETY: no arguments.
    assert_eq!(unsafe { sys::cudaGetLastError() }, sys::cudaError::cudaSuccess);
}

/// A drop whose runtime call fails consumes the error, so a later `cudaGetLastError` does not
/// report it as the failure of an unrelated call.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_failed_drop_leaves_no_error_behind() {
    let mut host = vec![0u8; MIB];
    {
        let registered = RegisteredHost::new(&mut host, HostRegisterFlags::empty()).unwrap();
        // SAFETY: the pointer is the start of the registered range.
        let code = unsafe { sys::cudaHostUnregister(registered.as_ptr().cast_mut().cast()) };
        assert_eq!(code, sys::cudaError::cudaSuccess);
    } // drop: cudaHostUnregister fails
    // SAFETY: no arguments.
    assert_eq!(unsafe { sys::cudaGetLastError() }, sys::cudaError::cudaSuccess);
}
