//! GPU tests of DLPack export and import (feature `dlpack`). Ignored where no GPU exists.
#![cfg(feature = "dlpack")]

mod common;

use common::{MIB, assert_same, pattern};
use cuda_mem::dlpack::ffi::{kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged};
use cuda_mem::dlpack::{ConsumerStream, DLDevice, DataType, DlpackImport, DlpackTensor};
use cuda_mem::*;

fn device0() -> Device {
    let device = Device::new(0).unwrap();
    device.set_current().unwrap();
    device
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dlpack_owned_device_buffer_round_trips_through_import() {
    let device = device0();
    let data = pattern(4096, 7);
    let buffer = DeviceBuffer::from_slice(&data).unwrap();
    let tensor = DlpackTensor::owned(buffer).unwrap().reshape(&[1024, 4]).unwrap();
    assert_eq!(tensor.device(), DLDevice { device_type: kDLCUDA, device_id: 0 });
    assert_eq!(tensor.dtype(), DataType::U32);
    // SAFETY: a live export whose ownership passes to the import.
    let mut import = unsafe { DlpackImport::from_raw(tensor.into_raw()) }.unwrap();
    assert_eq!(import.shape(), [1024, 4]);
    assert_same(&import.device_slice::<u32>(device).unwrap().to_vec().unwrap(), &data);
    import.device_slice_mut::<u32>(device).unwrap().copy_from_host(&vec![9; 4096]).unwrap();
    assert_eq!(import.device_slice::<u32>(device).unwrap().to_vec().unwrap(), vec![9; 4096]);
    drop(import); // the deleter frees the buffer (cudaFree)
    // Nothing left in the runtime's error slot: the next allocation succeeds.
    drop(DeviceBuffer::<u8>::zeroed(MIB).unwrap());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dlpack_views_name_their_memory_kind_and_device() {
    let device = device0();
    let ordinal = device.ordinal() as i32;
    let mut buffer = DeviceBuffer::from_slice(&pattern(256, 1)).unwrap();
    let view = buffer.as_slice().slice(16..80).unwrap();
    let shared = DlpackTensor::shared(&view).unwrap();
    assert_eq!(shared.device(), DLDevice { device_type: kDLCUDA, device_id: ordinal });
    assert_eq!((shared.len(), shared.data_ptr()), (64, view.as_device_ptr().cast_mut().cast()));
    assert!(!shared.is_writable());
    drop(shared);
    let mut whole = buffer.as_mut_slice();
    assert!(DlpackTensor::exclusive(&mut whole).unwrap().is_writable());

    let managed = ManagedBuffer::<f32>::zeroed(128).unwrap();
    let managed_view = managed.as_slice();
    let tensor = DlpackTensor::shared(&managed_view).unwrap();
    assert_eq!(tensor.device(), DLDevice { device_type: kDLCUDAManaged, device_id: ordinal });
    drop(tensor);
    let tensor = DlpackTensor::owned(managed).unwrap();
    assert_eq!(tensor.device().device_type, kDLCUDAManaged);
    let as_cuda = DLDevice { device_type: kDLCUDA, device_id: ordinal };
    assert_eq!(tensor.with_device(as_cuda).unwrap().device(), as_cuda);

    let mapped = PinnedBuffer::<u16>::zeroed_with_flags(64, HostAllocFlags::MAPPED).unwrap();
    let host_ptr = mapped.as_ptr();
    let mapped_view = mapped.device_view().unwrap();
    let tensor = DlpackTensor::shared(&mapped_view).unwrap();
    assert_eq!(tensor.device(), DLDevice { device_type: kDLCUDAHost, device_id: 0 });
    assert_eq!(tensor.data_ptr(), host_ptr.cast_mut().cast(), "unified addressing: one address");
    drop(tensor);
    let pinned = PinnedBuffer::from_slice(&[3u8; 32], HostAllocFlags::empty()).unwrap();
    let tensor = DlpackTensor::owned(pinned).unwrap().with_device(DLDevice { device_type: kDLCPU, device_id: 0 });
    assert_eq!(tensor.unwrap().device().device_type, kDLCPU);
}

/// The stream contract: a consumer stream ordered after the producer's pending work (a large
/// memset, then the memset of the exported buffer) reads the final values.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dlpack_consumer_stream_sees_the_producers_pending_work() {
    let device = device0();
    let producer = Stream::non_blocking().unwrap();
    let consumer = Stream::non_blocking().unwrap();
    for round in 0..4u8 {
        // Slow pending work on the producer: zeroing 1 GiB, then the exported buffer's fill.
        let delay = StreamBuffer::<u8>::zeroed(producer.clone(), 1 << 30).unwrap();
        let mut exported = StreamBuffer::<u8>::zeroed(producer.clone(), 4 * MIB).unwrap();
        let byte = 0x50 + round;
        exported.set_bytes_async(byte).unwrap();
        let tensor = DlpackTensor::owned(exported).unwrap();
        assert!(tensor.producer().is_some_and(|s| s.as_raw() == producer.as_raw()));
        // SAFETY: `consumer` outlives the ordering call.
        let wanted = unsafe { ConsumerStream::from_dlpack_arg(Some(consumer.as_raw() as i64)) }.unwrap();
        tensor.order_consumer(&wanted).unwrap();
        // SAFETY: the export keeps the memory; the read on `consumer` is ordered by the call above.
        let view = unsafe { DeviceSlice::from_raw_parts(tensor.data_ptr().cast::<u8>(), tensor.len()) };
        let mut host = vec![0u8; tensor.len()];
        consumer.scope(|s| s.copy_to_host(&mut host, view)).unwrap().unwrap();
        assert!(host.iter().all(|&b| b == byte), "round {round}: the consumer read before the producer's fill");
        drop(tensor); // waits for the device, then frees on the producer stream
        drop(delay);
    }
    device.synchronize().unwrap();
}
