//! Device memory (`cudaMalloc`): resident data such as weights. Upload, copy on the device,
//! read back, free with the runtime's verdict.

use cuda_mem::{Device, DeviceBuffer};

fn main() -> cuda_mem::Result<()> {
    let device = Device::current()?;
    let weights: Vec<f32> = (0..1 << 20).map(|i| i as f32 * 0.5).collect();
    let on_device = DeviceBuffer::from_slice(&weights)?; // cudaMalloc + blocking cudaMemcpy
    let mut replica = DeviceBuffer::<f32>::zeroed(weights.len())?;
    replica.as_mut_slice().copy_from_device(on_device.as_slice())?;
    let tail = replica.as_slice().slice(weights.len() - 4..)?.to_vec()?;
    println!("{} floats on {} ({}); last four after a device copy: {tail:?}", replica.len(), device, device.name()?);
    assert_eq!(tail, weights[weights.len() - 4..]);
    on_device.free()?;
    replica.free()?;
    println!("freed both buffers (cudaFree) without error");
    Ok(())
}
