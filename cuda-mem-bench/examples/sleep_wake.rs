//! Sleep and wake of a device cache on the GPU host (issue 52): tensors of 1 MiB–512 MiB
//! (log-uniform, seeded) up to a total, each filled with a byte of its own; the cache put to
//! sleep keeping their bytes and woken, several cycles; beside it, in the same process, one large
//! pinned `cudaMemcpy` each way, the copy engines' yardstick. Prints JSON lines: per cycle the
//! sleep's and the wake's seconds and GB/s (bytes of the tensors over the time), the device's
//! free memory awake and asleep, and the pinned host memory held; then whether every tensor's
//! first and last 64 KiB read back as written.
//!
//! `sleep_wake [TOTAL_GIB] [CYCLES]` (default 16 GiB, 4 cycles).

use cuda_mem::caching::CachedBlock;
use cuda_mem::{Device, DeviceBuffer, DeviceCache, Keep, PinnedBuffer, Result, Stream, sys};
use std::ffi::c_void;
use std::time::Instant;

const MIB: usize = 1 << 20;

/// xorshift64*: the tensor sizes, the same for a seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

fn sizes(total: usize) -> Vec<usize> {
    let (mut state, mut sum, mut sizes) = (0x5EED_u64, 0, Vec::new());
    let (lo, hi) = ((MIB as f64).ln(), ((512 * MIB) as f64).ln());
    while sum < total {
        let unit = (next(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
        let bytes = ((lo + unit * (hi - lo)).exp() as usize).next_multiple_of(MIB).min(total - sum).max(MIB);
        sizes.push(bytes);
        sum += bytes;
    }
    sizes
}

fn check(code: sys::cudaError_t, what: &str) {
    assert_eq!(code, sys::cudaError::cudaSuccess, "{what}");
}

/// True when the first and last 64 KiB of `block` hold `byte`.
fn reads_back(block: &CachedBlock, bytes: usize, byte: u8) -> bool {
    let edge = bytes.min(64 * 1024);
    let mut host = vec![0u8; edge];
    [0, bytes - edge].iter().all(|&offset| {
        // SAFETY: within the live block (`offset + edge <= bytes`).
        let src = unsafe { block.ptr().as_ptr().add(offset) }.cast::<c_void>();
        let (dst, kind) = (host.as_mut_ptr().cast::<c_void>(), sys::cudaMemcpyKind::cudaMemcpyDeviceToHost);
        // SAFETY: the block's bytes, which no work uses, into a host buffer of `edge` bytes.
        check(unsafe { sys::cudaMemcpy(dst, src, edge, kind) }, "read back");
        host.iter().all(|&b| b == byte)
    })
}

fn main() -> Result<()> {
    if Device::count().is_err() {
        eprintln!("sleep_wake needs a CUDA GPU; none is usable here.");
        std::process::exit(2);
    }
    let mut args = std::env::args().skip(1);
    let total = args.next().and_then(|a| a.parse::<usize>().ok()).unwrap_or(16) << 30;
    let cycles = args.next().and_then(|a| a.parse::<usize>().ok()).unwrap_or(4);
    let device = Device::current()?;

    // The yardstick: one large pinned copy each way.
    let big = 1 << 30;
    let dev = DeviceBuffer::<u8>::zeroed(big)?;
    let mut pinned = PinnedBuffer::<u8>::zeroed(big)?;
    let mut yardstick = |to_device: bool| {
        let start = Instant::now();
        let (dst, src, kind) = if to_device {
            (
                dev.as_slice().as_device_ptr() as *mut c_void,
                pinned.as_mut_ptr().cast::<c_void>().cast_const(),
                sys::cudaMemcpyKind::cudaMemcpyHostToDevice,
            )
        } else {
            (
                pinned.as_mut_ptr().cast::<c_void>(),
                dev.as_slice().as_device_ptr() as *const c_void,
                sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
            )
        };
        // SAFETY: a live device buffer and a pinned buffer of `big` bytes each, no other work.
        check(unsafe { sys::cudaMemcpy(dst, src, big, kind) }, "yardstick copy");
        big as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    let (d2h, h2d) =
        ((0..3).map(|_| yardstick(false)).fold(0.0, f64::max), (0..3).map(|_| yardstick(true)).fold(0.0, f64::max));
    println!("{{\"row\":\"pinned_memcpy_1g\",\"d2h_gbps\":{d2h:.2},\"h2d_gbps\":{h2d:.2}}}");
    drop((dev, pinned));

    let cache = DeviceCache::new(device)?;
    if cache.page_bytes().is_none() {
        eprintln!("this device's driver does not manage virtual memory: no sleep");
        std::process::exit(2);
    }
    let stream = Stream::non_blocking()?;
    let sizes = sizes(total);
    let mut blocks = Vec::with_capacity(sizes.len());
    for (i, &bytes) in sizes.iter().enumerate() {
        let block = cache.alloc_block(bytes, &stream)?;
        let byte = (i % 251) as u8;
        // SAFETY: a live block of `bytes`; the stream is the block's.
        check(
            unsafe { sys::cudaMemsetAsync(block.ptr().as_ptr().cast(), i32::from(byte), bytes, stream.as_raw()) },
            "fill",
        );
        blocks.push((block, bytes, byte));
    }
    stream.synchronize()?;
    let live: usize = sizes.iter().sum();
    println!("{{\"row\":\"tensors\",\"count\":{},\"bytes\":{live}}}", sizes.len());
    let mut cache = cache;
    for cycle in 0..cycles {
        let (free_awake, _) = device.mem_get_info()?;
        let start = Instant::now();
        let asleep = cache.sleep(Keep::Contents).map_err(|e| e.error)?;
        let slept = start.elapsed().as_secs_f64();
        let (free_asleep, _) = device.mem_get_info()?;
        let host = asleep.host_backup_bytes();
        let start = Instant::now();
        cache = asleep.wake().map_err(|e| e.error)?;
        let woke = start.elapsed().as_secs_f64();
        println!(
            "{{\"row\":\"cycle\",\"cycle\":{cycle},\"sleep_s\":{slept:.4},\"wake_s\":{woke:.4},\"sleep_gbps\":{:.2},\"wake_gbps\":{:.2},\"sleep_over_d2h\":{:.3},\"wake_over_h2d\":{:.3},\"free_awake\":{free_awake},\"free_asleep\":{free_asleep},\"given_back\":{},\"host_backup_bytes\":{host},\"host_over_live\":{:.4}}}",
            live as f64 / slept / 1e9,
            live as f64 / woke / 1e9,
            live as f64 / slept / 1e9 / d2h,
            live as f64 / woke / 1e9 / h2d,
            free_asleep as i64 - free_awake as i64,
            host as f64 / live as f64,
        );
    }
    let intact = blocks.iter().all(|(block, bytes, byte)| reads_back(block, *bytes, *byte));
    println!("{{\"row\":\"contents\",\"intact\":{intact}}}");
    for (block, _, _) in blocks {
        // SAFETY: every use above was synchronized.
        unsafe { cache.free_block(block) };
    }
    assert!(intact, "a tensor's bytes changed across sleep and wake");
    Ok(())
}
