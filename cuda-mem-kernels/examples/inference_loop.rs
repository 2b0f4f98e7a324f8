//! An inference-like loop: weights resident in device memory, per-step temporaries from a
//! retaining stream-ordered pool, inputs staged through pooled pinned memory, outputs copied back
//! asynchronously, two streams (one per worker thread) overlapping. Prints what it did and the
//! time per step.

use cuda_mem::{Device, DeviceBuffer, HostAllocFlags, MemPool, PinnedPool, PoolProps, Stream, StreamBuffer};
use cuda_mem_kernels::axpy_f32;
use std::time::Instant;

const N: usize = 4 << 20; // 16 MiB of f32 per tensor
const STEPS_PER_STREAM: usize = 50;

fn main() -> cuda_mem::Result<()> {
    let device = Device::current()?;
    let weights = DeviceBuffer::from_slice(&vec![0.5f32; N])?;
    let pool = MemPool::new(PoolProps::new(device))?;
    let staging = PinnedPool::new(HostAllocFlags::PORTABLE);
    let started = Instant::now();
    let step_times: Vec<f64> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|worker| {
                let (weights, pool, staging) = (&weights, &pool, &staging);
                scope.spawn(move || -> cuda_mem::Result<Vec<f64>> {
                    device.set_current()?;
                    let stream = Stream::non_blocking()?;
                    let mut times = Vec::new();
                    for step in 0..STEPS_PER_STREAM {
                        let t0 = Instant::now();
                        let mut input = staging.alloc::<f32>(N)?;
                        input.fill((worker * 1000 + step) as f32);
                        let mut output = staging.alloc::<f32>(N)?;
                        let mut activations = StreamBuffer::<f32>::zeroed_from(pool, &stream, N)?;
                        let mut act = activations.as_mut_slice();
                        stream.scope(|s| -> cuda_mem::Result<()> {
                            s.copy_from_host(&mut act, &input)?;
                            axpy_f32(s, &mut act, 2.0, weights.as_slice())?; // act = 2 * w + act
                            s.copy_to_host(&mut output, &act)
                        })??;
                        let expected = 2.0 * 0.5 + (worker * 1000 + step) as f32;
                        assert!(output.iter().all(|&y| y == expected), "step {step} of worker {worker}");
                        drop(activations); // back to the pool in stream order
                        times.push(t0.elapsed().as_secs_f64());
                    }
                    Ok(times)
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("worker panicked").unwrap()).collect()
    });
    let total = started.elapsed().as_secs_f64();
    let mut sorted = step_times.clone();
    sorted.sort_by(f64::total_cmp);
    let pool_stats = pool.stats()?;
    let pinned_stats = staging.stats();
    println!(
        "{} steps on 2 streams in {:.1} ms: median {:.2} ms per step, {:.2} ms per step overall",
        step_times.len(),
        total * 1e3,
        sorted[sorted.len() / 2] * 1e3,
        total * 1e3 / step_times.len() as f64
    );
    println!(
        "pool: {} bytes reserved, peak used {} bytes; pinned staging: {} misses, {} hits; all outputs verified",
        pool_stats.reserved_current, pool_stats.used_high, pinned_stats.misses, pinned_stats.hits
    );
    Ok(())
}
