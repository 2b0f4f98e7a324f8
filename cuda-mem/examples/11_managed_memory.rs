//! Lesson 11, managed (unified) memory: written by the CPU, advised, prefetched (the documented fix for
//! first-touch page faults), changed on the GPU, read back by the CPU.

use cuda_mem::{Advice, Device, Location, ManagedBuffer, Stream};
use std::time::Instant;

fn main() -> cuda_mem::Result<()> {
    let device = Device::current()?;
    let stream = Stream::non_blocking()?;
    let mut table = ManagedBuffer::<u32>::zeroed(64 << 20)?; // 256 MiB
    table.host_mut()?.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32);
    table.advise(Advice::SetPreferredLocation(Location::Device(device)))?;
    let started = Instant::now();
    table.prefetch(Location::Device(device), &stream)?;
    stream.synchronize()?;
    println!("prefetched 256 MiB to {device} in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    let (mut low, _high) = table.as_mut_slice().split_at_mut(1 << 20)?;
    stream.scope(|s| s.set_bytes(&mut low, 0xff))??;
    table.prefetch(Location::Host, &stream)?;
    stream.synchronize()?;
    let host = table.host()?;
    assert!(host[..1 << 20].iter().all(|&x| x == u32::MAX));
    assert_eq!(host[(1 << 20) + 5], (1 << 20) + 5);
    println!("the GPU's memset is visible to the CPU; the rest kept the CPU's values");
    table.advise(Advice::UnsetPreferredLocation)?;
    Ok(())
}
