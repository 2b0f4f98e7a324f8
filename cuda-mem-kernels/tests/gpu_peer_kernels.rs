//! Two GPUs: a kernel on GPU 1 writes and reads stream-ordered memory from a pool on GPU 0 after
//! `MemPool::set_access`; kernels on GPU 0's built-in streams while GPU 1 is current. Named
//! `gpu2_*`: each skips, with a line on stderr, on hosts with fewer than two GPUs.

#[path = "../../cuda-mem/tests/common/mod.rs"]
mod common;

use cuda_mem::*;
use cuda_mem_kernels::{checksum_cpu, checksum_u32, fill_u32};

#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu2_kernel_on_gpu1_uses_pool_memory_of_gpu0_after_set_access() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let (d0, d1) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    d1.enable_peer_access(d0).unwrap();
    let pool = MemPool::new(PoolProps::new(d0)).unwrap();
    pool.set_access(d1, PoolAccess::ReadWrite).unwrap();
    let stream0 = Stream::on_device(d0).unwrap();
    let stream1 = Stream::on_device(d1).unwrap();
    let len = (1 << 22) + 3;
    let mut shared = StreamBuffer::<u32>::zeroed_from(&pool, &stream0, len).unwrap();
    shared.use_on(&stream1).unwrap();
    let mut sum = d1.run_on(|| DeviceBuffer::<u64>::zeroed(1)).unwrap().unwrap();
    let (mut view, mut sum_view) = (shared.as_mut_slice(), sum.as_mut_slice());
    stream1
        .scope(|s| fill_u32(s, &mut view, 0xA5A5_0001).and_then(|()| checksum_u32(s, &view, &mut sum_view)))
        .unwrap()
        .unwrap();
    let expected = checksum_cpu(&vec![0xA5A5_0001u32; len]);
    assert_eq!(sum.to_vec().unwrap(), [expected], "checksum computed on GPU 1");
    assert!(shared.as_slice().to_vec().unwrap().iter().all(|&x| x == 0xA5A5_0001), "data seen from the host");
    drop(shared); // freed on GPU 0's stream after GPU 1's work
    stream0.synchronize().unwrap();
}

/// Kernels queued on device 0's legacy and per-thread streams while device 1 is current run on
/// device 0 (the launcher makes the stream's device current for the launch), and the caller's
/// device is restored.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu2_kernels_on_builtin_streams_of_gpu0_run_there_while_gpu1_is_current() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let (d0, d1) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    d0.set_current().unwrap();
    let (legacy, per_thread) = (Stream::legacy_default().unwrap(), Stream::per_thread().unwrap());
    let len = (1 << 20) + 5;
    let mut data = DeviceBuffer::<u32>::zeroed(len).unwrap();
    let mut sum = DeviceBuffer::<u64>::zeroed(1).unwrap();
    d1.set_current().unwrap();
    for (stream, value) in [(&legacy, 7u32), (&per_thread, 9)] {
        let (mut view, mut sum_view) = (data.as_mut_slice(), sum.as_mut_slice());
        stream
            .scope(|s| fill_u32(s, &mut view, value).and_then(|()| checksum_u32(s, &view, &mut sum_view)))
            .unwrap()
            .unwrap();
        assert_eq!(Device::current().unwrap(), d1, "the caller's current device is restored");
        assert_eq!(sum.to_vec().unwrap(), [checksum_cpu(&vec![value; len])], "value {value}");
        assert!(data.to_vec().unwrap().iter().all(|&x| x == value), "value {value}");
    }
    d0.set_current().unwrap();
}
