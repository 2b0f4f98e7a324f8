//! Lesson 4, the device cache: per-step temporaries on a hot path. `DeviceCache` keeps freed
//! blocks per stream; a block freed on a stream is reused there at once, from the freeing
//! thread's own cache, without a CUDA call or a shared lock.

use cuda_mem::{Device, DeviceCache, Stream};

fn main() -> cuda_mem::Result<()> {
    // One cache per device for the whole process (or `DeviceCache::new` for a private one).
    let cache = DeviceCache::for_device(Device::current()?)?;
    let stream = Stream::non_blocking()?;

    // A training-like loop: the same shapes every step. The first step misses (the cache maps
    // or allocates memory); later steps hit.
    for step in 0..100u32 {
        let mut activations = cache.zeroed::<f32>(&stream, 4 << 20)?; // zeroed on `stream`
        let mut scratch = cache.zeroed::<u32>(&stream, 1 << 16)?;
        let mut head = scratch.as_mut_slice();
        stream.try_scope(|s| s.set_bytes(&mut head, step as u8))?;
        let _ = activations.as_mut_slice(); // ... kernels would use both here ...
        // Dropping frees in stream order: no wait, the next step's request reuses the block.
    }
    let stats = cache.stats();
    println!(
        "100 steps: {} hits from the thread's cache, {} from the shared core, {} misses; {} bytes reserved",
        stats.front_hits, stats.core_hits, stats.misses, stats.reserved.current
    );
    assert!(stats.front_hits + stats.core_hits >= 2 * 99);

    // Memory used on another stream: `use_on` records it, so the block's reuse on its own
    // stream waits (on the device) for that stream's work.
    let other = Stream::non_blocking()?;
    let mut shared = cache.zeroed::<f32>(&stream, 1 << 20)?;
    shared.use_on(&other)?;
    let back = shared.as_slice().to_vec()?; // a blocking read, ordered after `stream`
    assert!(back.iter().all(|&x| x == 0.0));
    drop(shared);

    // The cache keeps what it reserved until asked: hand idle memory back to the driver.
    stream.synchronize()?;
    let released = cache.empty_cache();
    println!("empty_cache released {released} bytes; {} reserved now", cache.stats().reserved.current);
    Ok(())
}
