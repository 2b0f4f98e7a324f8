//! Peer-copy bandwidth between GPU 0 and GPU 1 (cudaMemcpyPeerAsync, 256 MiB, median of 20),
//! with and without peer access enabled.

use cuda_mem::*;
use std::time::Instant;

fn main() -> Result<()> {
    if Device::count().unwrap_or(0) < 2 {
        eprintln!("peer_bandwidth needs two GPUs");
        std::process::exit(2);
    }
    let (d0, d1) = (Device::new(0)?, Device::new(1)?);
    let bytes = 256usize << 20;
    let src = d0.run_on(|| DeviceBuffer::<u8>::zeroed(bytes))??;
    let mut dst = d1.run_on(|| DeviceBuffer::<u8>::zeroed(bytes))??;
    let stream = Stream::on_device(d1)?;
    let mut measure = |label: &str| -> Result<()> {
        let mut view = dst.as_mut_slice();
        let mut samples = Vec::new();
        for i in 0..21 {
            let start = Instant::now();
            stream.scope(|s| s.copy_peer(&mut view, d1, src.as_slice(), d0))??;
            if i > 0 {
                samples.push(start.elapsed().as_secs_f64());
            }
        }
        samples.sort_by(f64::total_cmp);
        println!("{label}: {:.1} GB/s (GPU 0 -> GPU 1, 256 MiB, median of 20)", bytes as f64 / samples[10] / 1e9);
        Ok(())
    };
    measure("peer access disabled")?;
    d1.enable_peer_access(d0)?;
    d0.enable_peer_access(d1)?;
    measure("peer access enabled")?;
    Ok(())
}
