//! GPU tests for the pinned caching pool and staged pageable copies. Ignored where no GPU exists.

mod common;

use common::{MIB, assert_same, pattern};
use cuda_mem::*;
use std::sync::Arc;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pinned_pool_reuses_blocks_and_counts_exactly() {
    let pool = PinnedPool::new(HostAllocFlags::empty());
    for bytes in [4096usize, MIB, 64 * MIB] {
        for _ in 0..5 {
            let mut block = pool.alloc::<u8>(bytes).unwrap();
            block[bytes - 1] = 7;
        }
    }
    let stats = pool.stats();
    assert_eq!((stats.misses, stats.hits), (3, 12), "{stats:?}");
    assert_eq!(stats.in_use_bytes, 0);
    assert_eq!(stats.cached_bytes, 4096 + MIB + 64 * MIB);
    assert_eq!(stats.peak_in_use_bytes, 64 * MIB);
    assert_eq!(pool.trim(), 4096 + MIB + 64 * MIB);
    assert_eq!(pool.stats().cached_bytes, 0);
}

/// Blocks parked in another thread's front cache are released by `trim`, and a thread's exit
/// returns its parked blocks to the pool.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pinned_pool_trim_and_thread_exit_reach_other_threads_front_caches() {
    let device = Device::current().unwrap();
    let pool = &PinnedPool::new(HostAllocFlags::empty());
    let ((parked, wait_parked), (trimmed, wait_trimmed)) = (std::sync::mpsc::channel(), std::sync::mpsc::channel());
    std::thread::scope(|s| {
        s.spawn(move || {
            device.set_current().unwrap();
            drop(pool.alloc::<u8>(MIB).unwrap());
            parked.send(()).unwrap();
            wait_trimmed.recv().unwrap();
            drop(pool.alloc::<u8>(MIB).unwrap()); // a new block: its cache was emptied
        });
        wait_parked.recv().unwrap();
        assert_eq!(pool.stats().cached_bytes, MIB);
        assert_eq!(pool.trim(), MIB);
        trimmed.send(()).unwrap();
    });
    let stats = pool.stats();
    assert_eq!((stats.misses, stats.hits, stats.cached_bytes), (2, 0, MIB), "{stats:?}");
    drop(pool.alloc::<u8>(MIB).unwrap()); // the exited thread's block
    assert_eq!((pool.stats().misses, pool.stats().hits), (2, 1));
    assert_eq!(pool.trim(), MIB);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pinned_pool_blocks_are_copy_sources_and_mapped_views_work() {
    let stream = Stream::non_blocking().unwrap();
    let mapped_pool = PinnedPool::new(HostAllocFlags::MAPPED | HostAllocFlags::PORTABLE);
    let want = pattern(MIB / 4, 8);
    let mut staging = mapped_pool.alloc::<u32>(want.len()).unwrap();
    staging.copy_from_slice(&want);
    let mut device = DeviceBuffer::<u32>::zeroed(want.len()).unwrap();
    let mut dev = device.as_mut_slice();
    stream.scope(|s| s.copy_from_host(&mut dev, &staging)).unwrap().unwrap();
    assert_same(&device.to_vec().unwrap(), &want);
    let mut via_mapped = DeviceBuffer::<u32>::zeroed(want.len()).unwrap();
    via_mapped.as_mut_slice().copy_from_device(staging.device_view().unwrap()).unwrap();
    assert_same(&via_mapped.to_vec().unwrap(), &want);
    let plain = PinnedPool::new(HostAllocFlags::empty()).alloc::<u32>(4).unwrap();
    assert_eq!(plain.device_view().unwrap_err().kind(), &ErrorKind::NotMapped);
}

/// A block with recorded work is not handed out again until that work completes: while a long
/// DMA reads block A, a new request gets a different block; afterwards A comes back. Alone
/// (`gpu_alone_`): another test's synchronizing call (`cudaFreeHost`) would drain the stream.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_pinned_pool_never_hands_out_a_block_with_dma_in_flight() {
    if common::skip_unless_alone() {
        return;
    }
    let pool = PinnedPool::new(HostAllocFlags::empty());
    let stream = Stream::non_blocking().unwrap();
    let bytes = 256 * MIB;
    let mut device = DeviceBuffer::<u8>::zeroed(bytes).unwrap();
    let mut first = pool.alloc::<u8>(bytes).unwrap();
    first.fill(1);
    let first_ptr = first.as_ptr();
    // A host function that sleeps holds the stream, so the DMAs behind it are surely pending when
    // the pool decides (no other test runs meanwhile to drain it with a synchronizing call).
    unsafe extern "C" fn hold_the_stream(_: *mut std::ffi::c_void) {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // SAFETY: a valid stream and a callback that makes no CUDA call.
    let code = unsafe { sys::cudaLaunchHostFunc(stream.as_raw(), Some(hold_the_stream), std::ptr::null_mut()) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    // Queue several DMAs reading the block, outside any scope, then give the block back.
    for _ in 0..8 {
        // SAFETY: the pool keeps the block alive and unused until the recorded event completes;
        // the device buffer outlives the stream synchronize below.
        let code = unsafe {
            sys::cudaMemcpyAsync(
                device.as_mut_slice().as_device_ptr().cast(),
                first.as_ptr().cast(),
                bytes,
                sys::cudaMemcpyKind::cudaMemcpyHostToDevice,
                stream.as_raw(),
            )
        };
        assert_eq!(code, sys::cudaError::cudaSuccess);
    }
    first.record_use(&stream).unwrap();
    drop(first);
    // The stream is held for 300 ms with 2 GiB of DMA behind it; the pool decides within
    // microseconds.
    let in_flight = !stream.is_idle().unwrap();
    let second = pool.alloc::<u8>(bytes).unwrap();
    if in_flight {
        assert_ne!(second.as_ptr(), first_ptr, "a block was reused while its DMA was in flight");
    }
    stream.synchronize().unwrap();
    drop(second);
    let third = pool.alloc::<u8>(bytes).unwrap();
    let fourth = pool.alloc::<u8>(bytes).unwrap();
    assert!(third.as_ptr() == first_ptr || fourth.as_ptr() == first_ptr);
    assert!(in_flight, "the DMA finished before the next allocation: the test proved nothing");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_staged_copies_are_exact_for_every_size_from_1_byte_to_1_gib() {
    let copier = StagedCopier::new(StagedConfig::default()).unwrap();
    let mut sizes: Vec<usize> = vec![1, 3, 4095, 4096, 4097, 65_537, MIB - 1, 4 * MIB - 1, 4 * MIB, 4 * MIB + 1];
    sizes.extend([16441, 67_121_209, 100 * MIB + 13, 256 * MIB, 1024 * MIB]);
    for bytes in sizes {
        let words = bytes.div_ceil(4);
        let mut host: Vec<u8> = bytemuck::cast_slice(&pattern(words, bytes as u32)).to_vec();
        host.truncate(bytes);
        let mut device = DeviceBuffer::<u8>::zeroed(bytes).unwrap();
        copier.copy_from_host(&mut device.as_mut_slice(), &host).unwrap();
        // Checked through the plain path, then back through the staged path.
        let plain = device.to_vec().unwrap();
        assert!(plain == host, "staged upload of {bytes} bytes differs");
        let mut back = vec![0u8; bytes];
        copier.copy_to_host(&mut back, device.as_slice()).unwrap();
        assert!(back == host, "staged download of {bytes} bytes differs");
    }
}

/// Many threads, each with its own stream, copying through one shared copier and one shared
/// pinned pool at once: every byte verified, so no staging slot or cached block was reused while
/// its DMA was in flight.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_staging_stress_many_threads_and_streams() {
    let device = Device::current().unwrap();
    let copier =
        Arc::new(StagedCopier::new(StagedConfig { lanes: 6, chunk_bytes: 2 * MIB, small_copy_bytes: MIB }).unwrap());
    let pool = PinnedPool::with_max_cached_bytes(HostAllocFlags::empty(), 64 * MIB);
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let (copier, pool) = (Arc::clone(&copier), pool.clone());
            std::thread::spawn(move || {
                device.set_current().unwrap();
                let stream = Stream::non_blocking().unwrap();
                for i in 0..12u32 {
                    let words = [1usize, 1000, 300_000, 3 * MIB + 5][(t + i) as usize % 4];
                    let want = pattern(words, t * 1000 + i);
                    let mut device_buf = DeviceBuffer::<u32>::zeroed(words).unwrap();
                    copier.copy_from_host(&mut device_buf.as_mut_slice(), &want).unwrap();
                    let mut staging = pool.alloc::<u32>(words).unwrap();
                    let dev = device_buf.as_mut_slice();
                    stream.scope(|s| s.copy_to_host(&mut staging, &dev)).unwrap().unwrap();
                    assert_same(&staging, &want);
                    staging.record_use(&stream).unwrap();
                    drop(staging);
                    let mut back = vec![0u32; words];
                    copier.copy_to_host(&mut back, device_buf.as_slice()).unwrap();
                    assert_same(&back, &want);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = pool.stats();
    assert_eq!(stats.in_use_bytes, 0);
    assert!(stats.cached_bytes <= 64 * MIB);
}
