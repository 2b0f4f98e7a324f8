//! Lesson 1, allocate: one owner per CUDA allocation family. Each frees itself when dropped;
//! `free()` does the same and returns the runtime's verdict. Views borrow from their owner.

use cuda_mem::{Device, DeviceBuffer, ManagedBuffer, PinnedBuffer};

fn main() -> cuda_mem::Result<()> {
    let device = Device::current()?;
    println!("{device}: {}", device.name()?);

    // Device memory (`cudaMalloc`): resident data such as weights. Allocate once, reuse.
    let weights: Vec<f32> = (0..1 << 20).map(|i| i as f32 * 0.5).collect();
    let on_device = DeviceBuffer::from_slice(&weights)?; // cudaMalloc + a blocking copy
    let mut replica = DeviceBuffer::<f32>::zeroed(weights.len())?;
    replica.as_mut_slice().copy_from_device(on_device.as_slice())?;
    let tail = replica.as_slice().slice(weights.len() - 4..)?.to_vec()?;
    assert_eq!(tail, weights[weights.len() - 4..]);
    println!("device: {} floats copied on the device, last four {tail:?}", replica.len());

    // Pinned host memory (`cudaMallocHost`): the host side of asynchronous copies. It derefs
    // to a slice, so the CPU reads and writes it directly.
    let mut staging = PinnedBuffer::<f32>::zeroed(4)?;
    staging.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    let mut small = DeviceBuffer::<f32>::zeroed(4)?;
    small.as_mut_slice().copy_from_host(&staging)?;
    assert_eq!(small.as_slice().to_vec()?, [1.0, 2.0, 3.0, 4.0]);
    println!("pinned: {:?} uploaded and read back", &staging[..]);

    // Managed memory (`cudaMallocManaged`): one address for CPU and GPU; the CPU side is
    // reached through `host()` / `host_mut()`, which wait until no GPU work can touch it.
    let mut shared = ManagedBuffer::<u32>::zeroed(8)?;
    shared.host_mut()?.iter_mut().enumerate().for_each(|(i, x)| *x = i as u32 * 10);
    assert_eq!(shared.as_slice().to_vec()?, [0, 10, 20, 30, 40, 50, 60, 70]);
    println!("managed: the CPU's writes read through a device view");

    // Zero-length buffers make no CUDA call; freeing explicitly reports the runtime's verdict.
    assert!(DeviceBuffer::<u8>::zeroed(0)?.is_empty());
    on_device.free()?;
    replica.free()?;
    shared.free()?;
    println!("freed without error");
    Ok(())
}
