//! GPU tests of DLPack imports (feature `dlpack`): stream order kept through the raw structs,
//! and strided layouts read and written element by element. Ignored where no GPU exists.
#![cfg(feature = "dlpack")]

mod common;

use common::{MIB, pattern};
use cuda_mem::dlpack::ffi::DLManagedTensorVersioned;
use cuda_mem::dlpack::{ConsumerStream, DlpackImport, DlpackTensor};
use cuda_mem::*;

fn device0() -> Device {
    let device = Device::new(0).unwrap();
    device.set_current().unwrap();
    device
}

/// A stream-ordered buffer whose zeroing is still queued behind slow work on `stream`, over
/// memory that last held `0xab` (the pool hands the freed block back). Returns the buffer and
/// the slow work, which must outlive the checks.
fn pending_zeroes(stream: &Stream, len: usize) -> (StreamBuffer<'static, u8>, StreamBuffer<'static, u8>) {
    let mut previous = StreamBuffer::<u8>::zeroed(stream.clone(), len).unwrap();
    previous.set_bytes_async(0xab).unwrap();
    drop(previous);
    stream.synchronize().unwrap();
    // Slow pending work first: zeroing 1 GiB, then the buffer's own zeroing behind it.
    let delay = StreamBuffer::<u8>::zeroed(stream.clone(), 1 << 30).unwrap();
    let buffer = StreamBuffer::<u8>::zeroed(stream.clone(), len).unwrap();
    (buffer, delay)
}

/// The regression of issue 38: an owned export of a `StreamBuffer` whose zeroing is queued,
/// through `into_raw` (and `into_raw_legacy`) and back, read with a blocking copy, must read
/// zeros, not the previous owner's bytes; a consumer on another stream, ordered by the import,
/// too.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dlpack_raw_exports_keep_their_stream_order() {
    let device = device0();
    let producer = Stream::non_blocking().unwrap();
    let consumer = Stream::non_blocking().unwrap();
    for round in 0..8 {
        let legacy = round % 2 == 1;
        let (buffer, delay) = pending_zeroes(&producer, 4 * MIB);
        let tensor = DlpackTensor::owned(buffer).unwrap();
        let import = if legacy {
            let raw = tensor.into_raw_legacy().unwrap();
            // SAFETY: our export, handed over once.
            unsafe { DlpackImport::from_raw_legacy(raw) }.unwrap()
        } else {
            let raw = tensor.into_raw();
            // SAFETY: our export, handed over once.
            unsafe { DlpackImport::from_raw(raw) }.unwrap()
        };
        assert_eq!(import.producer().map(Stream::as_raw), Some(producer.as_raw()), "round {round}");
        let view = import.device_slice::<u8>(device).unwrap();
        assert_eq!(view.stream().map(Stream::as_raw), Some(producer.as_raw()));
        let read = view.to_vec().unwrap();
        assert!(read.iter().all(|&b| b == 0), "round {round} (legacy: {legacy}): a blocking read overtook the zeroing");
        assert_eq!(import.read_bytes(device).unwrap(), read);
        drop(import);
        drop(delay);

        // A consumer on another stream, ordered by the import.
        let (buffer, delay) = pending_zeroes(&producer, 4 * MIB);
        // SAFETY: our export, handed over once.
        let import = unsafe { DlpackImport::from_raw(DlpackTensor::owned(buffer).unwrap().into_raw()) }.unwrap();
        // SAFETY: `consumer` outlives the ordering call.
        let wanted = unsafe { ConsumerStream::from_dlpack_arg(Some(consumer.as_raw() as i64)) }.unwrap();
        import.order_consumer(&wanted).unwrap();
        // SAFETY: the import keeps the memory; the copy on `consumer` is ordered by the call above,
        // and this view carries no stream, so only that ordering protects the read.
        let bare = unsafe { DeviceSlice::from_raw_parts(import.data_ptr().cast::<u8>(), import.len()) };
        let mut host = vec![0xffu8; import.len()];
        consumer.scope(|s| s.copy_to_host(&mut host, bare)).unwrap().unwrap();
        assert!(host.iter().all(|&b| b == 0), "round {round}: the consumer stream overtook the zeroing");
        drop(import);
        drop(delay);
    }
    device.synchronize().unwrap();
}

/// Imports `buffer`'s memory as a tensor of `shape` and element `strides` starting at element
/// `first`, through cuda-mem's own export with its shape and strides replaced.
fn strided_import(buffer: DeviceBuffer<u32>, first: usize, shape: &[i64], strides: &[i64]) -> DlpackImport {
    let tensor = DlpackTensor::owned(buffer).unwrap();
    let raw: *mut DLManagedTensorVersioned = tensor.into_raw();
    // Kept for the process: the import reads them while it lives (tests only).
    let shape: &'static mut [i64] = shape.to_vec().leak();
    let strides: &'static mut [i64] = strides.to_vec().leak();
    // SAFETY: `raw` is our live export, owned here; its struct is rewritten before the hand-over.
    unsafe {
        (*raw).dl_tensor.ndim = shape.len() as i32;
        (*raw).dl_tensor.shape = shape.as_mut_ptr();
        (*raw).dl_tensor.strides = strides.as_mut_ptr();
        (*raw).dl_tensor.byte_offset = (first * 4) as u64;
        DlpackImport::from_raw(raw).unwrap()
    }
}

/// Little-endian words of `bytes` (a byte vector need not be aligned for a cast).
fn words(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The elements a strided layout names, row-major, computed on the host.
fn gather(data: &[u32], first: usize, shape: &[i64], strides: &[i64]) -> Vec<u32> {
    let count: i64 = shape.iter().product();
    (0..count)
        .map(|mut linear| {
            let mut offset = first as i64;
            for d in (0..shape.len()).rev() {
                offset += (linear % shape[d]) * strides[d];
                linear /= shape[d];
            }
            data[offset as usize]
        })
        .collect()
}

/// Transposed, stepped, reversed and broadcast views of a device buffer: reads return the named
/// elements row-major; writes change those elements and no others.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dlpack_strided_imports_read_and_write_their_elements_only() {
    let device = device0();
    let data = pattern(24 * 16, 38);
    let cases: [(usize, &[i64], &[i64]); 6] = [
        (0, &[16, 24], &[1, 16]),      // x.T of a 24x16 tensor
        (0, &[24, 8], &[16, 2]),       // x[:, ::2]
        (3, &[5, 4, 3], &[48, 1, 16]), // a permuted 3-D view at an offset
        (383, &[24, 16], &[-16, -1]),  // both axes reversed, from the last element
        (5, &[7, 9], &[0, 1]),         // a row broadcast along the first axis
        (17, &[4], &[0]),              // one element broadcast: no positive stride
    ];
    for (first, shape, strides) in cases {
        let buffer = DeviceBuffer::from_slice(&data).unwrap();
        let ptr = buffer.as_slice().as_device_ptr();
        let mut import = strided_import(buffer, first, shape, strides);
        assert!(!import.is_compact(), "{shape:?} {strides:?}");
        let want = gather(&data, first, shape, strides);
        let got = words(&import.read_bytes(device).unwrap());
        assert_eq!(got, want, "read of {shape:?} with strides {strides:?}");
        // Write new values through the view; elements outside it keep theirs.
        let written: Vec<u32> = (0..want.len() as u32).map(|i| 0x8000_0000 | i).collect();
        import.write_bytes(device, bytemuck::cast_slice(&written)).unwrap();
        // SAFETY: the import keeps the whole buffer alive; read as a plain view for the check.
        let whole = unsafe { DeviceSlice::from_raw_parts(ptr, data.len()) }.to_vec().unwrap();
        let mut expected = data.clone();
        let count: i64 = shape.iter().product();
        for (linear, value) in (0..count).zip(&written) {
            let mut rest = linear;
            let mut offset = first as i64;
            for d in (0..shape.len()).rev() {
                offset += (rest % shape[d]) * strides[d];
                rest /= shape[d];
            }
            expected[offset as usize] = *value; // the last write to a repeated element stays
        }
        assert_eq!(whole, expected, "write of {shape:?} with strides {strides:?}");
        assert_eq!(words(&import.read_bytes(device).unwrap()), gather(&expected, first, shape, strides));
    }
}
