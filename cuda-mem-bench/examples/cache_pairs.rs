//! Alloc + free pairs of the device caching allocator ([`DeviceCache`]) against the stream-ordered
//! path (`StreamBuffer` from cuda-mem's retaining pool: `cudaMallocFromPoolAsync` +
//! `cudaFreeAsync`, no synchronize per pair) and of `PinnedPool` hits, one thread and many. Prints
//! JSON lines. Threads: for each count, the median of 5 rounds (counts alternating in order) of
//! each thread's warmed-up pairs over a window all threads start together. One thread: medians
//! of 15 samples of K pairs, after a tenth of a second of warm-up, as
//! `docs/reference/torch_alloc.py` times PyTorch's allocators (run it in the same device call): a
//! row's `peer` names that script's row of the same pair (`torch_caching_device_pair_*` for
//! `DeviceCache`, `torch_caching_host_pair_*`, `CachingHostAllocator` allocate + free, for
//! `PinnedPool`).
//!
//! `cargo run --release -p cuda-mem-bench --example cache_pairs [-- --pairs K --threads 1,2,4,8 --only pairs|threads --front-max-block BYTES]`
//! (`--only` runs one part: the bench's `cache` and `threads` sections each run one).

use cuda_mem::{Device, DeviceCache, HostAllocFlags, MemPool, PinnedPool, Result, Stream, StreamBuffer};
use std::sync::Barrier;
use std::time::{Duration, Instant};

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

/// How long each thread runs pairs before the measured window (its stream's first pairs miss,
/// and a core coming out of idle runs slower at first), and the window.
const THREAD_WARM_UP: Duration = Duration::from_millis(100);
const THREAD_WINDOW: Duration = Duration::from_millis(300);
/// Rounds of every thread count, in alternating order, so that drift in the host's speed falls
/// on every count alike; each row is the median round.
const THREAD_ROUNDS: usize = 5;

/// Aggregate pairs per second of `threads` threads, each on its own stream: every thread warms
/// up, then all start their windows together (a barrier), and each counts its own pairs over its
/// own window.
fn threaded(threads: usize, bytes: usize, cache: Option<&DeviceCache>, pool: &MemPool) -> Result<f64> {
    let device = Device::current()?;
    let start_together = Barrier::new(threads);
    let rates = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let start_together = &start_together;
                scope.spawn(move || -> Result<f64> {
                    let pairs = |stream: &Stream| match cache {
                        Some(cache) => cache_pairs(cache, stream, bytes, 1000),
                        None => pool_pairs(pool, stream, bytes, 1000),
                    };
                    // Set up and warm up; a failure still meets the barrier, so no thread waits for ever.
                    let ready = device.set_current().and_then(|()| Stream::non_blocking()).and_then(|stream| {
                        let warm_up = Instant::now();
                        while warm_up.elapsed() < THREAD_WARM_UP {
                            pairs(&stream)?;
                        }
                        Ok(stream)
                    });
                    start_together.wait();
                    let stream = ready?;
                    let (start, mut done) = (Instant::now(), 0u64);
                    while start.elapsed() < THREAD_WINDOW {
                        pairs(&stream)?;
                        done += 1000;
                    }
                    Ok(done as f64 / start.elapsed().as_secs_f64())
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker panicked")).collect::<Result<Vec<f64>>>()
    })?;
    Ok(rates.iter().sum())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let k: usize = value("--pairs").and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let thread_counts: Vec<usize> = value("--threads")
        .map(|v| v.split(',').filter_map(|t| t.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8]);
    let only = value("--only");
    if only.as_deref().is_some_and(|o| o != "pairs" && o != "threads") {
        eprintln!("cache_pairs: --only takes pairs or threads");
        std::process::exit(2);
    }
    let (run_pairs, run_threads) = (only.as_deref() != Some("threads"), only.as_deref() != Some("pairs"));

    let device = Device::current()?;
    // `--front-max-block BYTES`: the cache with another `Config::front_max_block` than the default.
    let cache = match value("--front-max-block").map(|v| v.parse::<usize>()) {
        None => DeviceCache::for_device(device)?,
        Some(Ok(front_max_block)) => {
            let config = cuda_mem::caching::Config { front_max_block, ..Default::default() };
            &*Box::leak(Box::new(DeviceCache::with_config(device, config)?))
        }
        Some(Err(_)) => {
            eprintln!("cache_pairs: --front-max-block takes a number of bytes");
            std::process::exit(2);
        }
    };
    let pool = MemPool::retaining(device)?;
    let pinned = PinnedPool::new(HostAllocFlags::empty());
    let stream = Stream::non_blocking()?;
    for (name, bytes) in SIZES.into_iter().filter(|_| run_pairs) {
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
    let counts = if run_threads { thread_counts.len() } else { 0 };
    let (mut ours, mut pools) = (vec![Vec::new(); counts], vec![Vec::new(); counts]);
    for round in (0..THREAD_ROUNDS).filter(|_| counts > 0) {
        let order: Vec<usize> = if round % 2 == 0 { (0..counts).collect() } else { (0..counts).rev().collect() };
        for i in order {
            ours[i].push(threaded(thread_counts[i], 1 << 20, Some(cache), &pool)?);
            pools[i].push(threaded(thread_counts[i], 1 << 20, None, &pool)?);
        }
    }
    for ((threads, ours), pools) in thread_counts.iter().zip(ours).zip(pools) {
        let rounds: Vec<String> = ours.iter().map(|r| format!("{r:.0}")).collect();
        let (ours, pool_rate) = (median(ours), median(pools));
        println!(
            r#"{{"row": "device_cache_threads_{threads}_1m", "pairs_per_s": {ours:.0}, "rounds": [{}]}}"#,
            rounds.join(", ")
        );
        println!(r#"{{"row": "stream_buffer_threads_{threads}_1m", "pairs_per_s": {pool_rate:.0}}}"#);
    }
    println!(r#"{{"row": "device_cache_stats", "stats": "{:?}"}}"#, cache.stats());
    Ok(())
}
