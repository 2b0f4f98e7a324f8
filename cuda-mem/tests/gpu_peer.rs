//! Two GPUs in one process: peer access, peer copies, pool access for a peer. Named `gpu2_*` and
//! ignored by default; each skips, with a line on stderr, on hosts with fewer than two GPUs.

mod common;

use common::{MIB, assert_same, pattern};
use cuda_mem::*;

fn two_devices() -> (Device, Device) {
    (Device::new(0).unwrap(), Device::new(1).unwrap())
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu2_peer_access_and_peer_copy_both_ways() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let (d0, d1) = two_devices();
    assert!(d0.can_access_peer(d1).unwrap() && d1.can_access_peer(d0).unwrap());
    d0.enable_peer_access(d1).unwrap();
    d0.enable_peer_access(d1).unwrap(); // idempotent
    d1.enable_peer_access(d0).unwrap();
    let want = pattern(16 * MIB, 31);
    let on0 = d0.run_on(|| DeviceBuffer::from_slice(&want)).unwrap().unwrap();
    let mut on1 = d1.run_on(|| DeviceBuffer::<u32>::zeroed(want.len())).unwrap().unwrap();
    assert_eq!((on0.device(), on1.device()), (d0, d1));
    let stream1 = Stream::on_device(d1).unwrap();
    let mut dst = on1.as_mut_slice();
    stream1.scope(|s| s.copy_peer(&mut dst, d1, on0.as_slice(), d0)).unwrap().unwrap();
    assert_same(&on1.to_vec().unwrap(), &want);
    let mut back0 = d0.run_on(|| DeviceBuffer::<u32>::zeroed(want.len())).unwrap().unwrap();
    let stream0 = Stream::on_device(d0).unwrap();
    let mut dst = back0.as_mut_slice();
    stream0.scope(|s| s.copy_peer(&mut dst, d0, on1.as_slice(), d1)).unwrap().unwrap();
    assert_same(&back0.to_vec().unwrap(), &want);
    assert_eq!(Device::current().unwrap(), Device::current().unwrap());
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu2_pool_memory_of_gpu0_is_used_on_gpu1_after_set_access() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let (d0, d1) = two_devices();
    d1.enable_peer_access(d0).unwrap();
    let pool = MemPool::new(PoolProps::new(d0)).unwrap();
    assert_eq!(pool.access(d1).unwrap(), PoolAccess::None);
    pool.set_access(d1, PoolAccess::ReadWrite).unwrap();
    assert_eq!(pool.access(d1).unwrap(), PoolAccess::ReadWrite);
    assert_eq!(pool.access(d0).unwrap(), PoolAccess::ReadWrite);
    let stream0 = Stream::on_device(d0).unwrap();
    let stream1 = Stream::on_device(d1).unwrap();
    let want = pattern(8 * MIB, 47);
    let mut shared = StreamBuffer::<u32>::zeroed_from(&pool, &stream0, want.len()).unwrap();
    shared.use_on(&stream1).unwrap();
    let mut on1 = d1.run_on(|| DeviceBuffer::from_slice(&want)).unwrap().unwrap();
    let (mut view, mut local) = (shared.as_mut_slice(), on1.as_mut_slice());
    // GPU 1 writes the pool memory of GPU 0 and reads it back (device-to-device on GPU 1's stream).
    d1.run_on(|| stream1.scope(|s| s.copy_from_device(&mut view, &local).and_then(|()| s.set_bytes(&mut local, 0))))
        .unwrap()
        .unwrap()
        .unwrap();
    d1.run_on(|| stream1.scope(|s| s.copy_from_device(&mut local, &view))).unwrap().unwrap().unwrap();
    assert_same(&on1.to_vec().unwrap(), &want);
    drop(shared);
    stream0.synchronize().unwrap();
}
