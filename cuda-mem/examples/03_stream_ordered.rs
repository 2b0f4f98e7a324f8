//! Lesson 3, stream-ordered allocation from a memory pool: cheap per-step temporaries that are
//! freed in stream order without blocking (the figures are in docs/choosing-an-allocator.md),
//! and the release threshold trap the source document half-describes.

use cuda_mem::{Device, MemPool, PoolProps, Stream, StreamBuffer};
use std::time::Instant;

fn pairs_per_second(pool: &MemPool, stream: &Stream, sync_each: bool) -> cuda_mem::Result<f64> {
    let started = Instant::now();
    for _ in 0..2000 {
        // SAFETY: the buffer is never read; this measures allocation only.
        let buffer = unsafe { StreamBuffer::<u8>::uninit_from(pool, stream, 1 << 20)? };
        drop(buffer);
        if sync_each {
            stream.synchronize()?;
        }
    }
    stream.synchronize()?;
    Ok(started.elapsed().as_secs_f64() / 2000.0 * 1e6)
}

fn main() -> cuda_mem::Result<()> {
    let device = Device::current()?;
    let stream = Stream::non_blocking()?;
    let retaining = MemPool::new(PoolProps::new(device))?; // cuda-mem's default: keep memory
    let releasing = MemPool::new(PoolProps::new(device).release_threshold(0))?; // the driver's default
    println!("alloc+free pair, 1 MiB:");
    println!("  retaining pool, no sync:        {:7.2} us", pairs_per_second(&retaining, &stream, false)?);
    println!("  retaining pool, sync each pair: {:7.2} us", pairs_per_second(&retaining, &stream, true)?);
    println!("  threshold 0,   sync each pair:  {:7.2} us", pairs_per_second(&releasing, &stream, true)?);
    let odd = StreamBuffer::<u8>::zeroed_from(&retaining, &stream, 67_121_209)?; // no 32 MB rule
    println!("allocated {} bytes (an odd size) from the pool", odd.len());
    drop(odd);
    stream.synchronize()?;
    println!("reserved before trim: {} bytes", retaining.stats()?.reserved_current);
    retaining.trim_to(0)?;
    println!("reserved after trim_to(0): {} bytes", retaining.stats()?.reserved_current);
    Ok(())
}
