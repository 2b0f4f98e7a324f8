//! Measures what the staged copier's defaults are chosen from, on the GPU host: pageable copies
//! through the driver, pinned DMA, register-copy-unregister, the pinned pool against
//! cudaMallocHost, and staged copies over a sweep of lanes × chunk sizes. Prints tables; medians
//! of repeated runs, all in one process.

use cuda_mem::*;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    f()?; // warm-up
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        samples.push(start.elapsed());
    }
    Ok(median(samples))
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() -> Result<()> {
    if Device::count().is_err() {
        eprintln!("staged_tuning needs a CUDA GPU; none is usable here.");
        std::process::exit(2);
    }
    println!("== pinned allocation: alloc+free pair, median");
    let pool = PinnedPool::new(HostAllocFlags::empty());
    for bytes in [4096, MIB, 64 * MIB] {
        let reps = if bytes >= 64 * MIB { 10 } else { 50 };
        // SAFETY: never read; uninitialised contents are the point of this measurement.
        let raw = time(reps, || unsafe { PinnedBuffer::<u8>::uninit(bytes, HostAllocFlags::empty()) }.map(drop))?;
        let pooled = time(2000, || pool.alloc::<u8>(bytes).map(drop))?;
        println!(
            "{:>8} KiB  cudaMallocHost pair {:>10.1} us   PinnedPool hit pair {:>8.3} us   ({:.0}x)",
            bytes / 1024,
            raw.as_secs_f64() * 1e6,
            pooled.as_secs_f64() * 1e6,
            raw.as_secs_f64() / pooled.as_secs_f64()
        );
    }

    for bytes in [256 * MIB, 1024 * MIB] {
        println!("== {} MiB copies (GB/s, median of 7)", bytes / MIB);
        let host: Vec<u8> = (0..bytes).map(|i| (i * 7) as u8).collect();
        let mut back = vec![0u8; bytes];
        let mut device = DeviceBuffer::<u8>::zeroed(bytes)?;
        let pinned = PinnedBuffer::from_slice(&host, HostAllocFlags::empty())?;
        let mut pinned_back = PinnedBuffer::<u8>::zeroed(bytes)?;
        let h2d = time(7, || device.as_mut_slice().copy_from_host(&host))?;
        let d2h = time(7, || device.as_slice().copy_to_host(&mut back))?;
        println!("driver pageable           H2D {:6.1}  D2H {:6.1}", gbps(bytes, h2d), gbps(bytes, d2h));
        let h2d = time(7, || device.as_mut_slice().copy_from_host(&pinned))?;
        let d2h = time(7, || device.as_slice().copy_to_host(&mut pinned_back))?;
        println!("pinned DMA                H2D {:6.1}  D2H {:6.1}", gbps(bytes, h2d), gbps(bytes, d2h));
        let mut scratch = host.clone();
        let h2d = time(5, || {
            let registered = RegisteredHost::new(&mut scratch, HostRegisterFlags::empty())?;
            device.as_mut_slice().copy_from_host(&registered)?;
            registered.unregister().map(drop).map_err(Into::into)
        })?;
        let d2h = time(5, || {
            let mut registered = RegisteredHost::new(&mut back, HostRegisterFlags::empty())?;
            device.as_slice().copy_to_host(&mut registered)?;
            registered.unregister().map(drop).map_err(Into::into)
        })?;
        println!("register+copy+unregister  H2D {:6.1}  D2H {:6.1}", gbps(bytes, h2d), gbps(bytes, d2h));
        for lanes in [4, 6, 8, 12, 16] {
            for chunk in [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB] {
                let copier = StagedCopier::new(StagedConfig { lanes, chunk_bytes: chunk, small_copy_bytes: 0 })?;
                let h2d = time(7, || copier.copy_from_host(&mut device.as_mut_slice(), &host))?;
                let d2h = time(7, || copier.copy_to_host(&mut back, device.as_slice()))?;
                println!(
                    "staged lanes {lanes:2} chunk {:2} MiB H2D {:6.1}  D2H {:6.1}",
                    chunk / MIB,
                    gbps(bytes, h2d),
                    gbps(bytes, d2h)
                );
            }
        }
        assert!(back == host, "copies must round-trip");
    }
    for bytes in [256 << 10, MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB] {
        let host = vec![3u8; bytes];
        let mut back = vec![0u8; bytes];
        let mut device = DeviceBuffer::<u8>::zeroed(bytes)?;
        let copier = StagedCopier::new(StagedConfig { small_copy_bytes: 0, ..Default::default() })?;
        let plain = time(21, || device.as_mut_slice().copy_from_host(&host))?;
        let staged = time(21, || copier.copy_from_host(&mut device.as_mut_slice(), &host))?;
        let plain_back = time(21, || device.as_slice().copy_to_host(&mut back))?;
        let staged_back = time(21, || copier.copy_to_host(&mut back, device.as_slice()))?;
        println!(
            "small {:>6} KiB: H2D plain {:6.1} staged {:6.1} | D2H plain {:6.1} staged {:6.1} GB/s",
            bytes / 1024,
            gbps(bytes, plain),
            gbps(bytes, staged),
            gbps(bytes, plain_back),
            gbps(bytes, staged_back)
        );
    }
    Ok(())
}
