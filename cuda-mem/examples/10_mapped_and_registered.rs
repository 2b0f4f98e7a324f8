//! Lesson 10, mapped (zero-copy) pinned memory and registered host memory: the device reads host memory
//! through its own pointer, and an existing Vec is page-locked in place.

use cuda_mem::{DeviceBuffer, HostAllocFlags, HostRegisterFlags, PinnedBuffer, RegisteredHost};

fn main() -> cuda_mem::Result<()> {
    let lookup: Vec<u32> = (0..4096).map(|i| i * 3).collect();
    let mapped = PinnedBuffer::from_slice(&lookup, HostAllocFlags::MAPPED)?;
    let mut device = DeviceBuffer::<u32>::zeroed(lookup.len())?;
    // The copy engine reads host memory through the mapped device pointer.
    device.as_mut_slice().copy_from_device(mapped.device_view()?)?;
    assert_eq!(device.to_vec()?, lookup);
    println!("read {} u32 of mapped host memory through its device pointer", lookup.len());

    let mut results = vec![0u32; lookup.len()];
    let mut registered = RegisteredHost::new(&mut results, HostRegisterFlags::MAPPED)?;
    registered.device_view_mut()?.copy_from_device(device.as_slice())?;
    assert_eq!(&registered[..], &lookup[..]);
    registered.unregister()?;
    println!("wrote a registered Vec from the device through its mapped view; unregistered it");
    Ok(())
}
