//! Lesson 9, pinned host memory (`cudaMallocHost` / `cudaHostAlloc`): the source and destination of
//! asynchronous DMA, and the caching pool that makes per-batch staging buffers cheap.

use cuda_mem::{DeviceBuffer, HostAllocFlags, PinnedBuffer, PinnedPool, Stream};
use std::time::Instant;

fn main() -> cuda_mem::Result<()> {
    let stream = Stream::non_blocking()?;
    let len = 16 << 20; // 64 MiB of u32
    let mut input = PinnedBuffer::<u32>::zeroed_with_flags(len, HostAllocFlags::PORTABLE)?;
    input.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32);
    let mut output = PinnedBuffer::<u32>::zeroed(len)?;
    let mut device = DeviceBuffer::<u32>::zeroed(len)?;
    let mut dev = device.as_mut_slice();
    let started = Instant::now();
    stream.scope(|s| s.copy_from_host(&mut dev, &input).and_then(|()| s.copy_to_host(&mut output, &dev)))??;
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(output[len - 1], (len - 1) as u32);
    let moved = 2.0 * (len * size_of::<u32>()) as f64;
    println!("64 MiB to the device and back through pinned memory: {:.1} GB/s", moved / seconds / 1e9);

    let pool = PinnedPool::new(HostAllocFlags::empty());
    let started = Instant::now();
    for batch in 0..100u32 {
        let mut staging = pool.alloc::<u32>(1 << 20)?; // one cudaMallocHost, then cache hits
        staging[0] = batch;
    }
    let stats = pool.stats();
    println!(
        "100 staging buffers of 4 MiB from PinnedPool in {:.2} ms: {} miss, {} hits, {} bytes cached",
        started.elapsed().as_secs_f64() * 1e3,
        stats.misses,
        stats.hits,
        stats.cached_bytes
    );
    Ok(())
}
