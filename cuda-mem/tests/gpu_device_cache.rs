//! The device caching allocator on a GPU (issue 20): reuse on a stream, ordering across streams
//! behind a held stream, out-of-memory release and retry, statistics, the resource form.

mod common;

use common::{MIB, assert_same, hold_stream, pattern};
use cuda_mem::caching::Config;
use cuda_mem::resource::{MemoryResource, ResourceBuffer};
use cuda_mem::{CudaError, Device, DeviceCache, ErrorKind, Stream};
use std::sync::Arc;

fn device() -> Device {
    Device::current().expect("a GPU")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_cached_buffers_round_trip_and_reuse_their_block_on_their_stream() {
    let cache = DeviceCache::new(device()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let data = pattern(MIB / 4, 7);
    let mut first = cache.zeroed::<u32>(&stream, data.len()).unwrap();
    assert!(first.as_slice().to_vec().unwrap().iter().all(|&x| x == 0));
    first.as_mut_slice().copy_from_host(&data).unwrap();
    assert_same(&first.as_slice().to_vec().unwrap(), &data);
    let address = first.as_slice().as_device_ptr();
    drop(first);
    let before = cache.stats();
    let second = cache.zeroed::<u32>(&stream, data.len()).unwrap();
    assert_eq!(second.as_slice().as_device_ptr(), address, "the freed block comes back on its stream");
    assert_eq!(cache.stats().front_hits, before.front_hits + 1);
    // Zeroed again in stream order: nothing of the previous contents shows.
    assert!(second.as_slice().to_vec().unwrap().iter().all(|&x| x == 0));
    // Views work in scopes and with the kernel launchers' device pointers.
    let mut third = cache.zeroed::<u32>(&stream, 1024).unwrap();
    let mut view = third.as_mut_slice();
    let host = vec![5u32; 1024];
    stream.scope(|s| s.copy_from_host(&mut view, &host)).unwrap().unwrap();
    assert_eq!(third.as_slice().to_vec().unwrap(), host);
}

/// Takes `len` words from `cache` on `other`, fills them with `byte` there, then lets `held` (whose
/// late zeroing of a freed block is still queued) run: true when that zeroing landed on the new
/// data, i.e. the freed block reached `other` before `held`'s work on it ended.
fn late_work_lands_on_new_data(cache: &DeviceCache, held: &Stream, other: &Stream, len: usize, byte: u8) -> bool {
    let mut fresh = cache.zeroed::<u32>(other, len).unwrap();
    other.scope(|s| s.set_bytes(&mut fresh.as_mut_slice(), byte)).unwrap().unwrap();
    held.synchronize().unwrap();
    let want = u32::from_ne_bytes([byte; 4]);
    !fresh.as_slice().to_vec().unwrap().iter().all(|&x| x == want)
}

/// A block freed on stream A while A's work on it is held back must not be written by stream B
/// before that work ends: B either gets other memory or waits for A on the device. Checked by
/// value: A's late zeroing must not land on what B wrote afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_block_freed_on_a_busy_stream_is_not_used_by_another_stream_before_that_work_ends() {
    for cross_stream_waits in [false, true] {
        // No front cache: the freed block goes to the core, where its segment is idle at once and
        // can be offered to B.
        let config = Config { front_depth: 0, cross_stream_waits, ..Config::default() };
        let cache = DeviceCache::with_config(device(), config).unwrap();
        let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
        let len = 256 * 1024;
        hold_stream(&a, 300);
        // The zeroing is queued on A behind the hold; the free on A does not wait for it.
        drop(cache.zeroed::<u32>(&a, len).unwrap());
        let landed = late_work_lands_on_new_data(&cache, &a, &b, len, 0x22);
        assert!(!landed, "cross_stream_waits = {cross_stream_waits}: A's late zeroing landed on B's data");
        // B got memory of its own, A's segment, or A's block lent (after a wait on the device).
        let stats = cache.stats();
        assert!(stats.segments_adopted + stats.segment_allocations + stats.blocks_lent >= 2, "{stats:?}");
    }
}

/// A block freed (`free_on`) inside a capture, on the stream `capture` was called on or on the
/// scope's own stream. A fence recorded in a capture is a graph node, not a mark of completed
/// work (querying such an event fails), so it must never let the block go to another stream
/// before the work already queued on its own stream ran: the outer stream is not the one that
/// captures (an ordinary cross-stream free), and the scope's stream is refused. As above, A's late
/// zeroing must not land on what another stream wrote afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_block_freed_on_a_capturing_stream_waits_for_its_own_streams_work() {
    use cuda_mem::CaptureMode;
    for mode in [CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
        for on_scope_stream in [false, true] {
            let config = Config { front_depth: 0, ..Config::default() };
            let cache = DeviceCache::with_config(device(), config).unwrap();
            let (a, c, d) =
                (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
            let len = 256 * 1024;
            hold_stream(&a, 300);
            // The zeroing is queued on A behind the hold.
            let buffer = cache.zeroed::<u32>(&a, len).unwrap();
            let capture =
                c.capture(mode, |s| if on_scope_stream { buffer.free_on(s.stream()) } else { buffer.free_on(&c) });
            if on_scope_stream {
                let err = capture.expect_err("a free on the capture's stream must be refused");
                assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
            } else {
                capture.expect("a free on the outer stream is an ordinary cross-stream free");
            }
            let landed = late_work_lands_on_new_data(&cache, &a, &d, len, 0x33);
            assert!(!landed, "{mode:?}, scope stream {on_scope_stream}: A's late zeroing landed on newer data");
        }
    }
}

/// Inside a capture the scope's stream cannot take cached blocks: the graph, launched later,
/// would use a block that the cache hands out again the moment it is freed on that stream.
/// Captures take memory from `CaptureScope::cached` (a `GraphPool`) instead.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_the_scope_stream_of_a_capture_cannot_allocate_or_use_cached_blocks() {
    use cuda_mem::CaptureMode;
    let cache = DeviceCache::new(device()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let mut outside = cache.zeroed::<u32>(&stream, 1024).unwrap();
    let result = stream.capture(CaptureMode::ThreadLocal, |s| {
        let refused = |r: Result<(), CudaError>| {
            let err = r.expect_err("refused on a capture's stream");
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
        };
        refused(cache.zeroed::<u32>(s.stream(), 1024).map(drop));
        refused(cache.alloc_block(4096, s.stream()).map(drop));
        refused(outside.use_on(s.stream()));
        Ok(())
    });
    result.unwrap();
    assert_eq!(outside.as_slice().to_vec().unwrap(), vec![0; 1024]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_statistics_follow_allocations_and_empty_cache_releases_segments() {
    let cache = DeviceCache::new(device()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let a = cache.zeroed::<u8>(&stream, 3 * MIB).unwrap();
    let b = cache.zeroed::<u8>(&stream, 5000).unwrap();
    let stats = cache.stats();
    assert_eq!(stats.requested.current, 3 * MIB + 5000);
    assert!(stats.allocated.current >= stats.requested.current);
    assert!(stats.reserved.current >= stats.allocated.current);
    assert!(stats.segment_allocations >= 2, "{stats:?}");
    drop((a, b));
    stream.synchronize().unwrap();
    let after = cache.stats();
    assert_eq!(after.allocated.current, 0);
    assert_eq!(after.allocated.peak, stats.allocated.peak);
    assert!(cache.class_stats().iter().map(|c| c.allocations).sum::<u64>() >= 2);
    let released = cache.empty_cache();
    assert!(released > 0);
    assert_eq!(cache.stats().reserved.current, 0, "{:?}", cache.stats());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_the_resource_form_orders_the_callers_stream() {
    let cache: Arc<dyn MemoryResource> = Arc::new(DeviceCache::new(device()).unwrap());
    let stream = Stream::non_blocking().unwrap();
    let data = pattern(4096, 3);
    for _ in 0..3 {
        let mut buffer = ResourceBuffer::<u32>::zeroed(&cache, &stream, data.len()).unwrap();
        assert!(buffer.to_vec().unwrap().iter().all(|&x| x == 0));
        buffer.as_mut_slice().copy_from_host(&data).unwrap();
        assert_same(&buffer.to_vec().unwrap(), &data);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_bad_requests_are_typed_errors() {
    let cache = DeviceCache::new(device()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let err = cache.zeroed::<u64>(&stream, usize::MAX / 4).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::SizeOverflow { .. }), "{err}");
    let per_thread = Stream::per_thread().unwrap();
    assert!(matches!(cache.zeroed::<u8>(&per_thread, 16).unwrap_err().kind(), ErrorKind::InvalidArgument(_)));
    let empty = cache.zeroed::<u8>(&stream, 0).unwrap();
    assert!(empty.is_empty());
}

/// Cached memory is released and the allocation tried again when the device runs out; beyond the
/// device, the error carries the cache's figures.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_out_of_memory_releases_the_cache_and_retries_once() {
    if common::skip_unless_alone() {
        return;
    }
    // Misses release nothing themselves here, so that the big request finds the device full.
    let config = Config { release_idle_on_miss: false, ..Config::default() };
    let cache = DeviceCache::with_config(device(), config).unwrap();
    let (stream, other) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
    let (free, total) = device().mem_get_info().unwrap();
    let piece = free / 8;
    let held: Vec<_> = (0..6).map(|_| cache.zeroed::<u8>(&stream, piece).unwrap()).collect();
    drop(held); // cached, not released
    stream.synchronize().unwrap();
    assert!(cache.stats().reserved.current >= 6 * piece);
    // Needs most of what the cache holds, on another stream (on `stream` the freed pieces, which
    // pages coalesce, would serve it): only a release makes room.
    let big = cache.zeroed::<u8>(&other, free / 2).unwrap();
    assert!(cache.stats().oom_retries >= 1, "{:?}", cache.stats());
    drop(big);
    let err = cache.zeroed::<u8>(&stream, total * 2).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("caching allocator"), "the report names the cache figures: {err}");
    cache.empty_cache();
}

/// Blocks by handle on streams borrowed from their raw handles (what PyTorch's allocator hooks
/// get): reuse on the stream, ordering against another stream's later use behind a held stream,
/// and the refusals. The owner outlives the cache (declared first, dropped last), as
/// `Stream::borrow_raw` requires.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_blocks_on_borrowed_raw_streams_are_reused_and_ordered() {
    let (owner, other_owner) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
    let cache = DeviceCache::with_config(device(), Config { front_depth: 0, ..Config::default() }).unwrap();
    // SAFETY: both owners outlive the cache and every clone of these values.
    let (a, b) = unsafe {
        (
            Stream::borrow_raw(owner.as_raw(), device()).unwrap(),
            Stream::borrow_raw(other_owner.as_raw(), device()).unwrap(),
        )
    };
    for builtin in [0usize, 1, 2] {
        // SAFETY: built-in handles are refused before any use.
        let err = unsafe { Stream::borrow_raw(builtin as cuda_mem::launch::cudaStream_t, device()) }.unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    }
    let len = MIB;
    let first = cache.alloc_block(len, &a).unwrap();
    let address = first.ptr();
    hold_stream(&a, 300);
    // Queued on A behind the hold: must land before B's write below, never after it.
    // SAFETY: the block holds `len` bytes; the memset is ordered on A, its stream.
    let code = unsafe { cuda_mem::sys::cudaMemsetAsync(address.as_ptr().cast(), 0, len, a.as_raw()) };
    assert_eq!(code, cuda_mem::sys::cudaError::cudaSuccess);
    // SAFETY: from this cache; its only use is ordered on A.
    unsafe { cache.free_block(first) };
    let again = cache.alloc_block(len, &a).unwrap();
    assert_eq!(again.ptr(), address, "reused on its own stream at once");
    // SAFETY: as above, never used since.
    unsafe { cache.free_block(again) };
    let on_b = cache.alloc_block(len, &b).unwrap();
    // SAFETY: the block holds `len` bytes, used on B.
    let code = unsafe { cuda_mem::sys::cudaMemsetAsync(on_b.ptr().as_ptr().cast(), 0x22, len, b.as_raw()) };
    assert_eq!(code, cuda_mem::sys::cudaError::cudaSuccess);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    let mut host = vec![0u8; len];
    // SAFETY: `host` holds `len` bytes; the block is device memory of `len` bytes, idle now.
    let code = unsafe {
        cuda_mem::sys::cudaMemcpy(
            host.as_mut_ptr().cast(),
            on_b.ptr().as_ptr().cast(),
            len,
            cuda_mem::sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
        )
    };
    assert_eq!(code, cuda_mem::sys::cudaError::cudaSuccess);
    assert!(host.iter().all(|&x| x == 0x22), "A's late zeroing landed on B's data");
    // The per-thread stream is refused.
    let per_thread = Stream::per_thread().unwrap();
    assert!(matches!(cache.alloc_block(16, &per_thread).unwrap_err().kind(), ErrorKind::InvalidArgument(_)));
    let stats = cache.stats();
    assert_eq!((stats.allocated.current, stats.front_hits), (len, 0), "{stats:?}");
    // Freed on A, where nothing used it: back once an event on A completes.
    // SAFETY: from this cache; B's work on it has completed.
    unsafe { cache.free_block_on(on_b, &a) }.unwrap();
    assert_eq!(cache.reserved(), cache.stats().reserved, "the lock-free reading agrees");
    cache.reset_peaks();
    assert_eq!(cache.stats().reserved.peak, cache.stats().reserved.current);
    cache.empty_cache();
    assert_eq!(cache.reserved().current, 0);
    let stats = cache.stats();
    assert_eq!((stats.allocated.current, stats.reserved.current, stats.pending_bytes), (0, 0, 0), "{stats:?}");
}

/// Eight threads, each with a stream of its own (so their blocks live in different shards of the
/// core), allocate mixed sizes, write and check them, and hand half of them to the next thread,
/// which checks and frees them on its own stream. No two live blocks overlap, no block shows
/// another's data, segments move between streams (and shards), and `empty_cache` returns every
/// segment once all is freed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_threads_with_streams_of_their_own_share_the_cache_without_overlap() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::mpsc;
    const THREADS: usize = 8;
    const ROUNDS: usize = 150;
    let cache = DeviceCache::new(device()).unwrap();
    let streams: Vec<Stream> = (0..THREADS).map(|_| Stream::non_blocking().unwrap()).collect();
    let live: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
    let claim = |ptr: u64, bytes: u64| {
        let mut live = live.lock().unwrap();
        let before = live.range(..=ptr).next_back().map(|(&p, &b)| p + b);
        let after = live.range(ptr..).next().map(|(&p, _)| p);
        assert!(before.is_none_or(|end| end <= ptr) && after.is_none_or(|next| ptr + bytes <= next), "overlap");
        live.insert(ptr, bytes);
    };
    let release = |ptr: u64| assert!(live.lock().unwrap().remove(&ptr).is_some());
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel()).unzip();
    std::thread::scope(|scope| {
        for (t, receiver) in receivers.into_iter().enumerate() {
            let (cache, streams, claim, release) = (&cache, &streams, &claim, &release);
            let next = senders[(t + 1) % THREADS].clone();
            scope.spawn(move || {
                let stream = &streams[t];
                let mut seed = t as u32 * 7919 + 1;
                for round in 0..ROUNDS {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    // 1 KiB .. 4 MiB of u32, log-spread.
                    let len = 256usize << (seed % 13);
                    let data = pattern(len, seed);
                    let mut buffer = cache.zeroed::<u32>(stream, len).unwrap();
                    let ptr = buffer.as_slice().as_device_ptr() as u64;
                    claim(ptr, (len * 4) as u64);
                    buffer.as_mut_slice().copy_from_host(&data).unwrap();
                    assert_same(&buffer.as_slice().to_vec().unwrap(), &data);
                    if round % 2 == 0 {
                        next.send((buffer, data, ptr)).unwrap();
                    } else {
                        release(ptr);
                        drop(buffer);
                    }
                    while let Ok((mut handed, data, ptr)) = receiver.try_recv() {
                        handed.use_on(stream).unwrap();
                        assert_same(&handed.as_slice().to_vec().unwrap(), &data);
                        release(ptr);
                        handed.free_on(stream).unwrap();
                    }
                }
                drop(next);
                // What the previous thread still sends.
                for (mut handed, data, ptr) in receiver {
                    handed.use_on(stream).unwrap();
                    assert_same(&handed.as_slice().to_vec().unwrap(), &data);
                    release(ptr);
                    handed.free_on(stream).unwrap();
                }
            });
        }
        drop(senders);
    });
    assert!(live.lock().unwrap().is_empty());
    for stream in &streams {
        stream.synchronize().unwrap();
    }
    let stats = cache.stats();
    assert_eq!(stats.allocated.current, 0, "{stats:?}");
    assert!(stats.segment_allocations >= THREADS as u64, "{stats:?}");
    cache.empty_cache();
    let after = cache.stats();
    assert_eq!((after.reserved.current, after.segments), (0, 0), "{after:?}");
}

/// Where the driver manages virtual memory, the cache grows by pages: a miss maps only what the
/// stream's range lacks, freed blocks coalesce across the range, and `empty_cache` unmaps every
/// free page (and a later miss maps anew).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pages_grow_by_what_is_missing_and_go_back_on_empty_cache() {
    let cache = DeviceCache::new(device()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let Some(page) = cache.page_bytes() else {
        eprintln!("this device's driver does not manage virtual memory: segments only");
        return;
    };
    let first = cache.zeroed::<u8>(&stream, 3 * MIB).unwrap();
    let reserved = cache.stats().reserved.current;
    assert_eq!(reserved, (3 * MIB).next_multiple_of(page), "whole pages, no more");
    // The free rest of the last page and new pages after it make the next block, contiguous.
    let data = pattern(5 * MIB / 4, 11);
    let mut second = cache.zeroed::<u32>(&stream, data.len()).unwrap();
    second.as_mut_slice().copy_from_host(&data).unwrap();
    assert_same(&second.as_slice().to_vec().unwrap(), &data);
    let stats = cache.stats();
    assert_eq!(stats.reserved.current, (8 * MIB).next_multiple_of(page), "{stats:?}");
    assert_eq!(second.as_slice().as_device_ptr() as usize, first.as_slice().as_device_ptr() as usize + 3 * MIB);
    drop((first, second));
    // Coalesced: one block serves what both held, with no new page.
    let both = cache.zeroed::<u8>(&stream, 8 * MIB).unwrap();
    assert_eq!(cache.stats().segment_allocations, stats.segment_allocations, "no map for a coalesced fit");
    drop(both);
    assert!(cache.empty_cache() >= 8 * MIB);
    assert_eq!(cache.stats().reserved.current, 0, "{:?}", cache.stats());
    let again = cache.zeroed::<u32>(&stream, data.len()).unwrap();
    assert!(again.as_slice().to_vec().unwrap().iter().all(|&x| x == 0));
}

/// A stream whose miss would raise the reserve's peak takes the free memory of another stream
/// (a lent block, or its pages unmapped and mapped again), but only after the work queued there
/// on it, waited for on the device or the host: a memset held behind a sleeping host function,
/// whose block was freed before it ran, completes without a fault, and the other stream's data
/// are what it wrote.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_free_pages_move_to_another_stream_only_after_their_work() {
    let cache = DeviceCache::new(device()).unwrap();
    if cache.page_bytes().is_none() {
        eprintln!("this device's driver does not manage virtual memory: segments only");
        return;
    }
    let (a, b) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
    let len = 64 * MIB / 4;
    drop(cache.zeroed::<u32>(&a, len).unwrap());
    a.synchronize().unwrap();
    let peak = cache.stats().reserved.peak;
    hold_stream(&a, 300);
    // The memset runs after the sleep, long after the free that follows at once.
    drop(cache.zeroed::<u32>(&a, len).unwrap());
    let data = pattern(len, 9);
    let mut other = cache.zeroed::<u32>(&b, len).unwrap();
    other.as_mut_slice().copy_from_host(&data).unwrap();
    let stats = cache.stats();
    assert!(stats.reserved.peak <= peak, "the peak held: {stats:?}");
    // `a`'s free block lent to `b` (waited for on the device), or its pages unmapped for `b`.
    assert!(stats.blocks_lent + stats.segment_releases >= 1, "`a`'s memory moved to `b`: {stats:?}");
    assert_eq!(stats.kept_bytes, 0, "`b` mapped the pages `a` gave up, no new ones: {stats:?}");
    a.synchronize().expect("the held memset ran on mapped memory");
    assert_same(&other.as_slice().to_vec().unwrap(), &data);
}

/// Writes `data` into a raw block's memory, or reads it back, with blocking copies.
fn block_io(block: &cuda_mem::caching::CachedBlock, data: &mut [u32], to_device: bool) {
    use cuda_mem::sys;
    let bytes = std::mem::size_of_val(data);
    assert!(bytes <= block.bytes());
    let device = block.ptr().as_ptr().cast::<std::ffi::c_void>();
    let host = data.as_mut_ptr().cast::<std::ffi::c_void>();
    // SAFETY: a live block of at least `bytes`, used by no other work; a host slice of `bytes`.
    let code = unsafe {
        if to_device {
            sys::cudaMemcpy(device, host, bytes, sys::cudaMemcpyKind::cudaMemcpyHostToDevice)
        } else {
            sys::cudaMemcpy(host, device, bytes, sys::cudaMemcpyKind::cudaMemcpyDeviceToHost)
        }
    };
    assert_eq!(code, sys::cudaError::cudaSuccess);
}

/// Raw blocks of several sizes (across mappings of one page and of several), each filled with a
/// pattern of its own; one more block freed before the sleep.
fn sleepy_blocks(cache: &DeviceCache, stream: &Stream) -> Vec<(cuda_mem::caching::CachedBlock, Vec<u32>)> {
    let sizes = [3 * MIB, 256 * 1024, 40 * MIB, 100 * MIB, 5 * MIB];
    let blocks: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &bytes)| {
            let block = cache.alloc_block(bytes, stream).unwrap();
            let mut data = pattern(bytes / 4, 40 + i as u32);
            block_io(&block, &mut data, true);
            (block, data)
        })
        .collect();
    let scratch = cache.alloc_block(30 * MIB, stream).unwrap();
    // SAFETY: never used.
    unsafe { cache.free_block(scratch) };
    blocks
}

/// A sleep gives the device memory of a cache's blocks back and a wake maps it again at the same
/// addresses, with the same bytes; the cache allocates again afterwards. Alone: it reads the
/// device's free memory.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_a_sleeping_cache_gives_its_memory_back_and_wakes_with_its_blocks_bytes() {
    if common::skip_unless_alone() {
        return;
    }
    let cache = DeviceCache::new(device()).unwrap();
    if cache.page_bytes().is_none() {
        eprintln!("this device's driver does not manage virtual memory: no sleep");
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let blocks = sleepy_blocks(&cache, &stream);
    let addresses: Vec<usize> = blocks.iter().map(|(b, _)| b.ptr().as_ptr() as usize).collect();
    let (free_awake, _) = device().mem_get_info().unwrap();
    let asleep = cache.sleep(cuda_mem::Keep::Contents).unwrap();
    let (free_asleep, _) = device().mem_get_info().unwrap();
    let live: usize = blocks.iter().map(|(b, _)| b.bytes()).sum();
    assert!(asleep.slept_bytes() >= live, "{} slept, {live} live", asleep.slept_bytes());
    assert!(free_asleep >= free_awake + live, "device memory given back: {free_awake} -> {free_asleep}");
    assert!(asleep.host_backup_bytes() >= live);
    assert_eq!(asleep.stats().reserved.current, 0, "{:?}", asleep.stats());
    let cache = asleep.wake().unwrap();
    for ((block, data), address) in blocks.iter().zip(&addresses) {
        assert_eq!(block.ptr().as_ptr() as usize, *address);
        let mut back = vec![0u32; data.len()];
        block_io(block, &mut back, false);
        assert_same(&back, data);
    }
    let again = cache.zeroed::<u32>(&stream, MIB).unwrap();
    assert!(again.as_slice().to_vec().unwrap().iter().all(|&x| x == 0));
    drop(again);
    for (block, _) in blocks {
        // SAFETY: every use above was a blocking copy.
        unsafe { cache.free_block(block) };
    }
}

/// Twenty cycles with new contents each time: every wake gives the bytes of the last sleep back;
/// pinned backups are reused (their total does not grow), and a cache asleep in place refuses to
/// allocate, to sleep again, and a wake while awake, with typed errors.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sleep_and_wake_cycles_keep_the_bytes_and_refuse_what_the_state_forbids() {
    let cache = DeviceCache::new(device()).unwrap();
    if cache.page_bytes().is_none() {
        eprintln!("this device's driver does not manage virtual memory: no sleep");
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let mut blocks = sleepy_blocks(&cache, &stream);
    let state_error = |err: CudaError| assert!(matches!(err.kind(), ErrorKind::SleepState(_)), "{err}");
    state_error(cache.wake_in_place().unwrap_err());
    let mut backups = None;
    for cycle in 0..20u32 {
        for (i, (block, data)) in blocks.iter_mut().enumerate() {
            *data = pattern(data.len(), cycle * 100 + i as u32);
            block_io(block, data, true);
        }
        // SAFETY: every use of the blocks was a blocking copy; none is used or freed until the wake.
        unsafe { cache.sleep_in_place(cuda_mem::Keep::Contents).unwrap() };
        assert!(cache.is_asleep());
        state_error(cache.alloc_block(4096, &stream).unwrap_err());
        // SAFETY: as above.
        state_error(unsafe { cache.sleep_in_place(cuda_mem::Keep::Nothing) }.unwrap_err());
        let held = cache.host_backup_bytes();
        assert_eq!(*backups.get_or_insert(held), held, "cycle {cycle}: backups reused");
        cache.wake_in_place().unwrap();
        for (block, data) in &blocks {
            let mut back = vec![0u32; data.len()];
            block_io(block, &mut back, false);
            assert_same(&back, data);
        }
    }
    // Keeping nothing: the blocks are mapped again and writable.
    // SAFETY: as above.
    unsafe { cache.sleep_in_place(cuda_mem::Keep::Nothing).unwrap() };
    cache.wake_in_place().unwrap();
    for (block, data) in &mut blocks {
        block_io(block, data, true);
        let mut back = vec![0u32; data.len()];
        block_io(block, &mut back, false);
        assert_same(&back, data);
    }
    for (block, _) in blocks {
        // SAFETY: every use above was a blocking copy.
        unsafe { cache.free_block(block) };
    }
}

/// A cache of `cudaMalloc` segments cannot keep its addresses: its sleep is refused as
/// unsupported and the cache comes back as it was.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_cache_of_whole_segments_refuses_to_sleep_and_stays_usable() {
    let config = Config { expandable_segments: false, ..Config::default() };
    let cache = DeviceCache::with_config(device(), config).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let kept = cache.zeroed::<u32>(&stream, 1024).unwrap().as_slice().to_vec().unwrap();
    let err = cache.sleep(cuda_mem::Keep::Contents).unwrap_err();
    assert!(matches!(err.error.kind(), ErrorKind::Unsupported(_)), "{}", err.error);
    let cache = err.cache;
    assert!(!cache.is_asleep());
    let again = cache.zeroed::<u32>(&stream, 1024).unwrap();
    assert_eq!(again.as_slice().to_vec().unwrap(), kept);
}

/// A CUDA graph captured on a cache's blocks replays after a sleep and a wake without being
/// captured again: the blocks keep their addresses, and the bytes the graph reads were kept.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_graph_captured_on_blocks_replays_after_a_wake_without_recapture() {
    use cuda_mem::sys;
    let cache = DeviceCache::new(device()).unwrap();
    if cache.page_bytes().is_none() {
        eprintln!("this device's driver does not manage virtual memory: no sleep");
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let bytes = 24 * MIB;
    let (from, to) = (cache.alloc_block(bytes, &stream).unwrap(), cache.alloc_block(bytes, &stream).unwrap());
    let mut source = pattern(bytes / 4, 77);
    block_io(&from, &mut source, true);
    let ok = |code: sys::cudaError_t| assert_eq!(code, sys::cudaError::cudaSuccess);
    let raw = stream.as_raw();
    let (mut graph, mut exec) = (std::ptr::null_mut(), std::ptr::null_mut());
    let (dst, src) = (to.ptr().as_ptr().cast::<std::ffi::c_void>(), from.ptr().as_ptr().cast::<std::ffi::c_void>());
    // SAFETY: a capture on this test's stream of a copy between two live blocks of `bytes`;
    // the graph and its executable are destroyed below, after their last launch completed.
    unsafe {
        ok(sys::cudaStreamBeginCapture(raw, sys::cudaStreamCaptureMode::cudaStreamCaptureModeThreadLocal));
        ok(sys::cudaMemsetAsync(dst, 0, bytes, raw));
        ok(sys::cudaMemcpyAsync(dst, src, bytes, sys::cudaMemcpyKind::cudaMemcpyDeviceToDevice, raw));
        ok(sys::cudaStreamEndCapture(raw, &mut graph));
        ok(sys::cudaGraphInstantiate(&mut exec, graph, 0));
    }
    for round in 0..3 {
        // SAFETY: the blocks are unused by other work; no launch is pending.
        unsafe { cache.sleep_in_place(cuda_mem::Keep::Contents).unwrap() };
        cache.wake_in_place().unwrap();
        // SAFETY: the executable's nodes name the blocks' addresses, mapped again by the wake.
        ok(unsafe { sys::cudaGraphLaunch(exec, raw) });
        stream.synchronize().unwrap();
        let mut copied = vec![0u32; source.len()];
        block_io(&to, &mut copied, false);
        assert_same(&copied, &source);
        // New contents for the next round, read by the same graph.
        source = pattern(source.len(), 78 + round);
        block_io(&from, &mut source, true);
    }
    // SAFETY: created above; the last launch was synchronized.
    unsafe {
        ok(sys::cudaGraphExecDestroy(exec));
        ok(sys::cudaGraphDestroy(graph));
        cache.free_block(from);
        cache.free_block(to);
    }
}
