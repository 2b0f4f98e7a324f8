//! Two GPUs: a kernel on GPU 1 writes and reads stream-ordered memory from a pool on GPU 0 after
//! `MemPool::set_access`. Named `gpu2_*`: skipped on hosts with fewer than two GPUs.

use cuda_mem::*;
use cuda_mem_kernels::{checksum_cpu, checksum_u32, fill_u32};

#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu2_kernel_on_gpu1_uses_pool_memory_of_gpu0_after_set_access() {
    assert!(Device::count().unwrap() >= 2, "needs two GPUs");
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
