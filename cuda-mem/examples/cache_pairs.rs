//! Alloc + free pairs of the device caching allocator ([`DeviceCache`]) against the stream-ordered
//! path (`StreamBuffer` from cuda-mem's retaining pool: `cudaMallocFromPoolAsync` +
//! `cudaFreeAsync`, no synchronize per pair) and of `PinnedPool` hits, one thread and many. Prints
//! JSON lines: medians of 15 samples of K pairs, after a tenth of a second of warm-up, as
//! `docs/reference/torch_alloc.py` times PyTorch's allocators (run it in the same session): a
//! row's `peer` names that script's row of the same pair (`torch_caching_device_pair_*` for
//! `DeviceCache`, `torch_caching_host_pair_*`, `CachingHostAllocator` allocate + free, for
//! `PinnedPool`).
//!
//! `cargo run --release -p cuda-mem --example cache_pairs [-- --pairs K --threads 1,2,4,8]`

use cuda_mem::{Device, DeviceCache, HostAllocFlags, MemPool, PinnedPool, Result, Stream, StreamBuffer};
use std::time::Instant;

const SIZES: [(&str, usize); 3] = [("4k", 4 << 10), ("1m", 1 << 20), ("64m", 64 << 20)];

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Microseconds per pair: the median of 15 samples of `k` pairs, after at least a tenth of a
/// second of warm-up pairs (a core coming out of idle runs slower at first).
fn per_pair(k: usize, mut pairs: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    let warm_up = Instant::now();
    while warm_up.elapsed() < std::time::Duration::from_millis(100) {
        pairs(k)?;
    }
    let mut samples = Vec::with_capacity(15);
    for _ in 0..15 {
        let start = Instant::now();
        pairs(k)?;
        samples.push(start.elapsed().as_secs_f64() * 1e6 / k as f64);
    }
    Ok(median(samples))
}

fn cache_pairs(cache: &DeviceCache, stream: &Stream, bytes: usize, k: usize) -> Result<()> {
    for _ in 0..k {
        // SAFETY: never read; this measures allocation and free only.
        drop(unsafe { cache.uninit::<u8>(stream, bytes)? });
    }
    Ok(())
}

fn pool_pairs(pool: &MemPool, stream: &Stream, bytes: usize, k: usize) -> Result<()> {
    for _ in 0..k {
        // SAFETY: never read.
        drop(unsafe { StreamBuffer::<u8>::uninit_from(pool, stream, bytes)? });
    }
    stream.synchronize()
}

/// Aggregate pairs per second of `threads` threads, each on its own stream, for `seconds`.
fn threaded(threads: usize, bytes: usize, cache: Option<&DeviceCache>, pool: &MemPool) -> Result<f64> {
    let device = Device::current()?;
    let start = Instant::now();
    let counts = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || -> Result<u64> {
                    device.set_current()?;
                    let stream = Stream::non_blocking()?;
                    let mut done = 0u64;
                    let until = Instant::now() + std::time::Duration::from_millis(500);
                    while Instant::now() < until {
                        match cache {
                            Some(cache) => cache_pairs(cache, &stream, bytes, 1000)?,
                            None => pool_pairs(pool, &stream, bytes, 1000)?,
                        }
                        done += 1000;
                    }
                    Ok(done)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker panicked")).collect::<Result<Vec<u64>>>()
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let k: usize = value("--pairs").and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let thread_counts: Vec<usize> = value("--threads")
        .map(|v| v.split(',').filter_map(|t| t.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8]);

    let device = Device::current()?;
    let cache = DeviceCache::for_device(device)?;
    let pool = MemPool::retaining(device)?;
    let pinned = PinnedPool::new(HostAllocFlags::empty());
    let stream = Stream::non_blocking()?;
    for (name, bytes) in SIZES {
        let ours = per_pair(k, |k| cache_pairs(cache, &stream, bytes, k))?;
        let pool_us = per_pair(k, |k| pool_pairs(&pool, &stream, bytes, k))?;
        let pinned_us = per_pair(k, |k| {
            for _ in 0..k {
                drop(pinned.alloc::<u8>(bytes)?);
            }
            Ok(())
        })?;
        let peer = |kind: &str| format!(r#""peer": "torch_caching_{kind}_pair_{name}""#);
        println!(r#"{{"row": "device_cache_pair_{name}", "us": {ours:.4}, {}}}"#, peer("device"));
        println!(r#"{{"row": "stream_buffer_retaining_nosync_pair_{name}", "us": {pool_us:.4}}}"#);
        println!(r#"{{"row": "pinned_pool_hit_pair_{name}", "us": {pinned_us:.4}, {}}}"#, peer("host"));
    }
    for &threads in &thread_counts {
        let ours = threaded(threads, 1 << 20, Some(cache), &pool)?;
        let pool_rate = threaded(threads, 1 << 20, None, &pool)?;
        println!(r#"{{"row": "device_cache_threads_{threads}_1m", "pairs_per_s": {ours:.0}}}"#);
        println!(r#"{{"row": "stream_buffer_threads_{threads}_1m", "pairs_per_s": {pool_rate:.0}}}"#);
    }
    println!(r#"{{"row": "device_cache_stats", "stats": "{:?}"}}"#, cache.stats());
    Ok(())
}
