//! Lesson 8, DLPack: hand cuda-mem memory to another framework (PyTorch, CuPy, JAX, or any
//! DLPack consumer) without a copy, and take theirs. The exported tensor owns the buffer; the
//! consumer's call of the deleter frees it. Needs the `dlpack` feature.

use cuda_mem::dlpack::{DlpackImport, DlpackTensor};
use cuda_mem::{Device, DeviceBuffer};

fn main() -> Result<(), cuda_mem::CudaError> {
    let device = Device::current()?;
    let buffer = DeviceBuffer::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;

    // Export: the buffer moves into the tensor; shape and strides describe it.
    let tensor = DlpackTensor::owned(buffer)?.reshape(&[2, 3])?;
    let raw = tensor.into_raw(); // a `DLManagedTensor*`, as a capsule carries it to Python

    // A consumer takes the pointer. Here we import it ourselves, as cuda-mem imports a tensor
    // that PyTorch exported.
    // SAFETY: `raw` is a live export whose ownership passes to the import.
    let import = unsafe { DlpackImport::from_raw(raw)? };
    assert_eq!(import.shape(), [2, 3]);
    let values = import.device_slice::<f32>(device)?.to_vec()?;
    assert_eq!(values, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    println!("a 2 x 3 tensor went out through DLPack and came back: {values:?}");

    // Views are checked against what the tensor says: another element type or device is refused.
    assert!(import.device_slice::<u64>(device).is_err());
    drop(import); // calls the exporter's deleter, which frees the device buffer
    println!("the deleter freed the buffer");
    Ok(())
}
