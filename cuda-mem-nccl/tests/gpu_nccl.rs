//! NCCL all-reduce over cuda-mem memory on the GPU host (libnccl.so.2 there).
//!
//! `gpu_` tests need one GPU: a one-rank communicator, whose all-reduce is a copy, proves the
//! binding end to end (creation, dtype, stream, borrow, destruction) with sums that can be
//! checked. `gpu2_` tests need two GPUs (on one, each skips with a line on stderr) and cover both
//! ways to drive them: one process per GPU (this binary re-executed as each rank) and one
//! process with a clique (a group from one thread, and a thread per GPU).
//!
//! The tests of this binary hold one lock each: NCCL kernels of one test waiting for their peers
//! must not share the device with another test's synchronizing calls. Run with
//! `NCCL_NVLS_ENABLE=0` where the host's notes ask for it (the bundle's `run` exports it).

#[path = "../../cuda-mem/tests/common/mod.rs"]
mod common;

use cuda_mem::{
    CachedBuffer, Device, DeviceCache, DeviceSliceMut, ErrorKind, MemPool, PoolProps, Stream, StreamBuffer,
};
use cuda_mem_nccl::{Communicator, Group, NcclType, ReduceOp, UniqueId};
use std::sync::{Mutex, MutexGuard, PoisonError};

const LEN: usize = (4 << 20) + 3;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Rank `rank`'s contribution: small integers, so sums over a few ranks are exact in f32.
fn contribution(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (rank + 1) as f32 + (i % 97) as f32).collect()
}

/// The element-wise sum of every rank's contribution.
fn sum_of(ranks: usize, len: usize) -> Vec<f32> {
    let base = (ranks * (ranks + 1) / 2) as f32;
    (0..len).map(|i| base + (ranks * (i % 97)) as f32).collect()
}

#[track_caller]
fn assert_equal<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: element {i} is {:?}, expected {:?}", got[i], want[i]);
    }
}

fn fill<T: NcclType>(view: &mut DeviceSliceMut<'_, T>, host: &[T]) {
    view.copy_from_host(host).unwrap();
}

fn one_rank(device: Device) -> Communicator {
    let comm = Communicator::init_rank(device, 1, &UniqueId::new().unwrap(), 0).unwrap();
    assert_eq!(comm.query().unwrap(), (device.ordinal(), 0, 1));
    assert_eq!((comm.device(), comm.rank(), comm.ranks()), (device, 0, 1));
    comm
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_one_rank_all_reduce_of_pool_buffers_copies_and_keeps_the_sums() {
    let _serial = serial();
    let device = Device::new(0).unwrap();
    let comm = one_rank(device);
    let stream = Stream::on_device(device).unwrap();
    let pool = MemPool::new(PoolProps::new(device)).unwrap();
    let mut src = StreamBuffer::<f32>::zeroed_from(&pool, &stream, LEN).unwrap();
    let mut dst = StreamBuffer::<f32>::zeroed_from(&pool, &stream, LEN).unwrap();
    let want = contribution(0, LEN);
    fill(&mut src.as_mut_slice(), &want);
    let mut dst_view = dst.as_mut_slice();
    stream.try_scope(|s| comm.all_reduce(s, src.as_slice(), &mut dst_view, ReduceOp::Sum)).unwrap();
    assert_equal(&dst.as_slice().to_vec().unwrap(), &sum_of(1, LEN), "out of place");
    // Over one rank every operation is the identity, in place too.
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg] {
        let mut view = dst.as_mut_slice();
        stream.try_scope(|s| comm.all_reduce_in_place(s, &mut view, op)).unwrap();
        assert_equal(&dst.as_slice().to_vec().unwrap(), &want, &format!("in place, {op:?}"));
    }
    // Integers: u32 and i8 reduce as themselves.
    let ints: Vec<u32> = (0..LEN as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let mut a = StreamBuffer::<u32>::zeroed_from(&pool, &stream, LEN).unwrap();
    fill(&mut a.as_mut_slice(), &ints);
    let mut b = StreamBuffer::<u32>::zeroed_from(&pool, &stream, LEN).unwrap();
    let mut b_view = b.as_mut_slice();
    stream.try_scope(|s| comm.all_reduce(s, a.as_slice(), &mut b_view, ReduceOp::Sum)).unwrap();
    assert_equal(&b.as_slice().to_vec().unwrap(), &ints, "u32");
    let bytes: Vec<i8> = (0..4099).map(|i| (i % 251) as i8).collect();
    let mut c = StreamBuffer::<i8>::zeroed_from(&pool, &stream, bytes.len()).unwrap();
    fill(&mut c.as_mut_slice(), &bytes);
    let mut c_view = c.as_mut_slice();
    stream.try_scope(|s| comm.all_reduce_in_place(s, &mut c_view, ReduceOp::Max)).unwrap();
    assert_equal(&c.as_slice().to_vec().unwrap(), &bytes, "i8");
    comm.async_error().unwrap();
    drop((src, dst, a, b, c));
    comm.destroy().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_one_rank_all_reduce_of_device_cache_buffers() {
    let _serial = serial();
    let device = Device::new(0).unwrap();
    let comm = one_rank(device);
    let stream = Stream::on_device(device).unwrap();
    let cache = DeviceCache::new(device).unwrap();
    let want: Vec<f64> = (0..LEN).map(|i| i as f64 * 0.5).collect();
    let mut src: CachedBuffer<'_, f64> = cache.zeroed(&stream, LEN).unwrap();
    fill(&mut src.as_mut_slice(), &want);
    let mut dst: CachedBuffer<'_, f64> = cache.zeroed(&stream, LEN).unwrap();
    let mut dst_view = dst.as_mut_slice();
    stream.try_scope(|s| comm.all_reduce(s, src.as_slice(), &mut dst_view, ReduceOp::Sum)).unwrap();
    assert_equal(&dst.as_slice().to_vec().unwrap(), &want, "cached, out of place");
    // A scope on another stream of the device waits for the buffers' own stream first.
    let other = Stream::on_device(device).unwrap();
    let mut view = dst.as_mut_slice();
    other.try_scope(|s| comm.all_reduce_in_place(s, &mut view, ReduceOp::Sum)).unwrap();
    assert_equal(&dst.as_slice().to_vec().unwrap(), &want, "cached, in place, another stream");
    // The device's legacy stream works through the scope too.
    let legacy = device.run_on(Stream::legacy_default).unwrap().unwrap();
    let mut view = dst.as_mut_slice();
    legacy.try_scope(|s| comm.all_reduce_in_place(s, &mut view, ReduceOp::Sum)).unwrap();
    assert_equal(&dst.as_slice().to_vec().unwrap(), &want, "cached, legacy stream");
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_registered_pool_and_cached_buffers_reduce_and_come_back() {
    let _serial = serial();
    assert!(Communicator::can_register(), "the host's NCCL (2.19 or later) has ncclCommRegister");
    let device = Device::new(0).unwrap();
    let comm = one_rank(device);
    let stream = Stream::on_device(device).unwrap();
    let pool = MemPool::new(PoolProps::new(device)).unwrap();
    let cache = DeviceCache::new(device).unwrap();
    let want = contribution(0, LEN);

    let mut pooled = comm.register(StreamBuffer::<f32>::zeroed_from(&pool, &stream, LEN).unwrap()).unwrap();
    let mut cached = comm.register(cache.zeroed::<f32>(&stream, LEN).unwrap()).unwrap();
    fill(&mut pooled.as_mut_slice(), &want);
    let mut cached_view = cached.as_mut_slice();
    stream.try_scope(|s| comm.all_reduce(s, pooled.as_slice(), &mut cached_view, ReduceOp::Sum)).unwrap();
    assert_equal(&cached.as_slice().to_vec().unwrap(), &sum_of(1, LEN), "registered cache buffer");
    let mut pooled_view = pooled.as_mut_slice();
    stream.try_scope(|s| comm.all_reduce_in_place(s, &mut pooled_view, ReduceOp::Sum)).unwrap();

    let pooled = pooled.deregister().unwrap();
    assert_equal(&pooled.as_slice().to_vec().unwrap(), &want, "the pool buffer after deregistering");
    drop(cached); // deregisters, then returns the block to the cache
    // Registering nothing makes no NCCL call.
    let empty = comm.register(cache.zeroed::<f32>(&stream, 0).unwrap()).unwrap();
    assert_eq!(empty.as_slice().len(), 0);
    drop(empty);
    drop(pooled);
    comm.destroy().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_bad_arguments_are_refused_before_nccl() {
    let _serial = serial();
    let device = Device::new(0).unwrap();
    let comm = one_rank(device);
    let stream = Stream::on_device(device).unwrap();
    let src = StreamBuffer::<u32>::zeroed(&stream, 8).unwrap();
    let mut dst = StreamBuffer::<u32>::zeroed(&stream, 9).unwrap();
    let mut dst_view = dst.as_mut_slice();
    let err = stream.try_scope(|s| comm.all_reduce(s, src.as_slice(), &mut dst_view, ReduceOp::Sum)).unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::LengthMismatch { src: 8, dst: 9 });
    // A group takes created streams only.
    let legacy = Stream::legacy_default().unwrap();
    let mut view = dst.as_mut_slice();
    let mut group = Group::new();
    let err = group.all_reduce_in_place(&comm, &legacy, &mut view, ReduceOp::Sum).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    group.run().unwrap(); // nothing recorded: nothing launched
    assert!(matches!(UniqueId::from_hex("00").unwrap_err().kind(), ErrorKind::InvalidArgument(_)));
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_a_one_device_clique_runs_a_group_and_is_destroyed_after_it() {
    let _serial = serial();
    let device = Device::new(0).unwrap();
    let clique = Communicator::init_all(&[device]).unwrap();
    assert_eq!(clique.len(), 1);
    assert_eq!(clique.comms()[0].query().unwrap(), (device.ordinal(), 0, 1));
    let stream = Stream::on_device(device).unwrap();
    let want = contribution(0, LEN);
    let mut a = StreamBuffer::<f32>::zeroed(&stream, LEN).unwrap();
    fill(&mut a.as_mut_slice(), &want);
    let mut b = StreamBuffer::<f32>::zeroed(&stream, LEN).unwrap();
    {
        let (a_view, mut b_view) = (a.as_slice(), b.as_mut_slice());
        let mut group = Group::new();
        group.all_reduce(&clique.comms()[0], &stream, a_view, &mut b_view, ReduceOp::Sum).unwrap();
        group.run().unwrap();
    }
    assert_equal(&b.as_slice().to_vec().unwrap(), &want, "group, out of place");
    clique.destroy().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Two GPUs.

fn two_devices() -> [Device; 2] {
    [Device::new(0).unwrap(), Device::new(1).unwrap()]
}

/// One rank's part of a sum over `ranks`: a pool buffer and a cached buffer of its device,
/// filled with its contribution, all-reduced (in place and out of place), then checked.
fn rank_buffers<'a>(
    device: Device,
    stream: &'a Stream,
    pool: &'a MemPool,
    cache: &'a DeviceCache,
    rank: usize,
) -> (StreamBuffer<'a, f32>, CachedBuffer<'a, f32>) {
    assert_eq!(stream.device(), device);
    let mut pooled = StreamBuffer::<f32>::zeroed_from(pool, stream, LEN).unwrap();
    fill(&mut pooled.as_mut_slice(), &contribution(rank, LEN));
    (pooled, cache.zeroed(stream, LEN).unwrap())
}

#[test]
#[ignore = "needs two CUDA GPUs and libnccl"]
fn gpu2_one_process_two_communicators_group_sums_pool_and_cache_buffers() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let _serial = serial();
    let devices = two_devices();
    let clique = Communicator::init_all(&devices).unwrap();
    let streams = devices.map(|d| Stream::on_device(d).unwrap());
    let pools = devices.map(|d| MemPool::new(PoolProps::new(d)).unwrap());
    let caches = devices.map(|d| DeviceCache::new(d).unwrap());
    let mut buffers: Vec<_> = (0..2).map(|r| rank_buffers(devices[r], &streams[r], &pools[r], &caches[r], r)).collect();
    {
        let mut views: Vec<_> = buffers.iter_mut().map(|(p, c)| (p.as_mut_slice(), c.as_mut_slice())).collect();
        let mut group = Group::new();
        for (r, (pooled, cached)) in views.iter_mut().enumerate() {
            group.all_reduce(&clique.comms()[r], &streams[r], pooled.as_slice(), cached, ReduceOp::Sum).unwrap();
        }
        group.run().unwrap();
    }
    {
        let mut views: Vec<_> = buffers.iter_mut().map(|(p, _)| p.as_mut_slice()).collect();
        let mut group = Group::new();
        for (r, pooled) in views.iter_mut().enumerate() {
            group.all_reduce_in_place(&clique.comms()[r], &streams[r], pooled, ReduceOp::Sum).unwrap();
        }
        group.run().unwrap();
    }
    let want = sum_of(2, LEN);
    for (r, (pooled, cached)) in buffers.iter().enumerate() {
        assert_equal(&cached.as_slice().to_vec().unwrap(), &want, &format!("rank {r}, cache, out of place"));
        assert_equal(&pooled.as_slice().to_vec().unwrap(), &want, &format!("rank {r}, pool, in place"));
    }
    drop(buffers);
    clique.destroy().unwrap();
}

#[test]
#[ignore = "needs two CUDA GPUs and libnccl"]
fn gpu2_one_thread_per_gpu_scopes_of_a_clique_and_registered_buffers() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let _serial = serial();
    let devices = two_devices();
    let mut clique = Communicator::init_all(&devices).unwrap();
    std::thread::scope(|threads| {
        for (rank, comm) in clique.comms_mut().iter_mut().enumerate() {
            let device = devices[rank];
            threads.spawn(move || {
                device.set_current().unwrap();
                let stream = Stream::on_device(device).unwrap();
                let pool = MemPool::new(PoolProps::new(device)).unwrap();
                let cache = DeviceCache::new(device).unwrap();
                let (pooled, cached) = rank_buffers(device, &stream, &pool, &cache, rank);
                let comm = &*comm;
                let pooled = comm.register(pooled).unwrap();
                let mut cached = comm.register(cached).unwrap();
                let mut view = cached.as_mut_slice();
                stream.try_scope(|s| comm.all_reduce(s, pooled.as_slice(), &mut view, ReduceOp::Sum)).unwrap();
                let got = cached.as_slice().to_vec().unwrap();
                assert_equal(&got, &sum_of(2, LEN), &format!("rank {rank}, registered, thread per GPU"));
            });
        }
    });
    clique.destroy().unwrap();
}

#[test]
#[ignore = "needs two CUDA GPUs and libnccl"]
fn gpu2_a_stream_or_buffer_of_another_device_is_refused() {
    if common::skip_unless_two_gpus() {
        return;
    }
    let _serial = serial();
    let [d0, d1] = two_devices();
    let comm = one_rank(d0);
    let stream1 = Stream::on_device(d1).unwrap();
    let mut on1 = StreamBuffer::<f32>::zeroed(&stream1, 16).unwrap();
    let mut view = on1.as_mut_slice();
    let err = stream1.try_scope(|s| comm.all_reduce_in_place(s, &mut view, ReduceOp::Sum)).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    let failed = comm.register(on1).unwrap_err();
    assert!(matches!(failed.error.kind(), ErrorKind::InvalidArgument(_)), "{}", failed.error);
    assert_eq!(failed.buffer.len(), 16, "the buffer comes back");
}

const RANK_ENV: &str = "CUDA_MEM_NCCL_TEST_RANK";
const ID_ENV: &str = "CUDA_MEM_NCCL_TEST_ID";
const PROCESS_TEST: &str = "gpu2_one_process_per_gpu_sums_pool_and_registered_cache_buffers";

/// The parent makes the id and runs this same test in two child processes (this binary, this
/// test only), one rank each; each child checks its sums, and the parent checks that both ran
/// the test and passed.
#[test]
#[ignore = "needs two CUDA GPUs and libnccl"]
fn gpu2_one_process_per_gpu_sums_pool_and_registered_cache_buffers() {
    if common::skip_unless_two_gpus() {
        return;
    }
    if let (Ok(rank), Ok(id)) = (std::env::var(RANK_ENV), std::env::var(ID_ENV)) {
        return rank_process(rank.parse().unwrap(), &UniqueId::from_hex(&id).unwrap());
    }
    let _serial = serial();
    let id = UniqueId::new().unwrap();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([PROCESS_TEST, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
                .env(RANK_ENV, rank.to_string())
                .env(ID_ENV, id.to_hex())
                .env("NCCL_NVLS_ENABLE", std::env::var("NCCL_NVLS_ENABLE").unwrap_or_else(|_| "0".into()))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "rank {rank} failed: {stdout}");
        assert!(stdout.contains("test result: ok. 1 passed"), "rank {rank} did not run the test: {stdout}");
    }
}

fn rank_process(rank: usize, id: &UniqueId) {
    let device = Device::new(rank).unwrap();
    device.set_current().unwrap();
    let comm = Communicator::init_rank(device, 2, id, rank).unwrap();
    assert_eq!(comm.query().unwrap(), (rank, rank, 2));
    let stream = Stream::on_device(device).unwrap();
    let pool = MemPool::new(PoolProps::new(device)).unwrap();
    let cache = DeviceCache::new(device).unwrap();
    let (mut pooled, cached) = rank_buffers(device, &stream, &pool, &cache, rank);
    let mut cached = comm.register(cached).unwrap();
    let mut view = cached.as_mut_slice();
    stream.try_scope(|s| comm.all_reduce(s, pooled.as_slice(), &mut view, ReduceOp::Sum)).unwrap();
    let mut view = pooled.as_mut_slice();
    stream.try_scope(|s| comm.all_reduce_in_place(s, &mut view, ReduceOp::Sum)).unwrap();
    let want = sum_of(2, LEN);
    assert_equal(&cached.as_slice().to_vec().unwrap(), &want, &format!("rank {rank}, registered cache buffer"));
    assert_equal(&pooled.as_slice().to_vec().unwrap(), &want, &format!("rank {rank}, pool buffer, in place"));
    drop(cached);
    drop(pooled);
    comm.destroy().unwrap();
}
