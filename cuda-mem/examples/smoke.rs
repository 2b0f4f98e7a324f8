//! GPU smoke check: device count, versions, and a verified 256 MiB cudaMalloc → cudaMemcpy →
//! cudaFree round trip. Exits non-zero on any failure.

use cuda_mem::{Device, DeviceBuffer, driver_version, runtime_version};
use std::time::Instant;

fn main() -> Result<(), cuda_mem::CudaError> {
    let count = Device::count()?;
    let (driver, runtime) = (driver_version()?, runtime_version()?);
    println!("devices: {count}; driver CUDA {}.{}; runtime CUDA {}.{}", driver.0, driver.1, runtime.0, runtime.1);
    for device in Device::all()? {
        let (cc, (free, total)) = (device.compute_capability()?, device.mem_get_info()?);
        println!(
            "device {}: {}, compute capability {}.{}, {} SMs, {:.1} GiB free of {:.1} GiB",
            device.ordinal(),
            device.name()?,
            cc.0,
            cc.1,
            device.multiprocessor_count()?,
            gib(free),
            gib(total)
        );
    }

    let len = (256usize << 20) / size_of::<u32>();
    let pattern: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(2_654_435_761) ^ 0x5bd1_e995).collect();
    let started = Instant::now();
    let device = DeviceBuffer::from_slice(&pattern)?;
    let back = device.to_vec()?;
    device.free()?;
    let elapsed = started.elapsed();
    let verified = back == pattern;
    println!(
        "256 MiB round trip (cudaMalloc, cudaMemcpy H2D, cudaMemcpy D2H, cudaFree): {}, checksum {:#018x}, {:.1} ms",
        if verified { "verified" } else { "MISMATCH" },
        checksum(&back),
        elapsed.as_secs_f64() * 1e3
    );
    if !verified {
        std::process::exit(1);
    }
    Ok(())
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

fn checksum(data: &[u32]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}
