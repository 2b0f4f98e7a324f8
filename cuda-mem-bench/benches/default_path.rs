//! The default stream-ordered path against the pools a user could choose, each pair followed by
//! a synchronize (what a per-step program does): `StreamBuffer::uninit(&stream, n)` (cuda-mem's
//! retaining pool), `uninit_from` a pool the user created (retaining), and `uninit_from` the
//! driver's default pool as found (release threshold 0). Batches of the three alternate in one
//! process; the medians and the ratios to the created pool are printed, one JSON line per size.
//! Issue 18.3's target is a ratio of the default path to the created retaining pool (see the issue).

use cuda_mem::{CudaError, Device, MemPool, PoolProps, Stream, StreamBuffer};
use std::time::{Duration, Instant};

const PAIRS: u32 = 200;
const BATCHES: usize = 31;

fn batch(stream: &Stream, pool: Option<&MemPool>, bytes: usize) -> Result<Duration, CudaError> {
    let start = Instant::now();
    for _ in 0..PAIRS {
        // SAFETY: dropped (cudaFreeAsync) without being read.
        let buffer = unsafe {
            match pool {
                Some(pool) => StreamBuffer::<u8>::uninit_from(pool, stream, bytes)?,
                None => StreamBuffer::<u8>::uninit(stream, bytes)?,
            }
        };
        drop(buffer);
        stream.synchronize()?;
    }
    Ok(start.elapsed() / PAIRS)
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

fn main() -> Result<(), CudaError> {
    // `cargo test --all-targets` runs benches without `--bench`: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("default_path: measures only when run with --bench (cargo bench, or the bundle)");
        return Ok(());
    }
    let device = match Device::count() {
        Ok(n) if n > 0 => Device::current()?,
        _ => {
            eprintln!("default_path: no CUDA device; nothing measured");
            std::process::exit(2);
        }
    };
    let stream = Stream::non_blocking()?;
    let created = MemPool::new(PoolProps::new(device))?;
    let driver = MemPool::driver_default(device)?;
    for (label, bytes) in [("4k", 4 << 10), ("1m", 1 << 20), ("64m", 64 << 20)] {
        let (mut default, mut retain, mut found) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..BATCHES {
            default.push(batch(&stream, None, bytes)?);
            retain.push(batch(&stream, Some(&created), bytes)?);
            found.push(batch(&stream, Some(&driver), bytes)?);
        }
        let (default, retain, found) = (median(default), median(retain), median(found));
        println!(
            "{{\"row\":\"default_stream_buffer_sync_{label}\",\"default_us\":{default:.3},\"created_retaining_us\":{retain:.3},\"driver_pool_as_found_us\":{found:.3},\"default_over_retaining\":{:.3},\"driver_over_retaining\":{:.3}}}",
            default / retain,
            found / retain
        );
    }
    Ok(())
}
