//! DLPack interop (feature `dlpack`): hand cuda-mem memory to PyTorch, CuPy, JAX and any other
//! DLPack consumer without a copy, and take theirs.
//!
//! | direction | type | ownership |
//! |---|---|---|
//! | export an owned buffer | [`DlpackTensor::owned`] → `DlpackTensor<'static>` → [`into_raw`](DlpackTensor::into_raw) | the deleter frees the buffer |
//! | export a borrowed buffer or view | [`DlpackTensor::shared`] / [`exclusive`](DlpackTensor::exclusive) → `DlpackTensor<'a>` | lives no longer than the borrow; never a raw pointer that outlives it |
//! | import | [`DlpackImport::from_raw`] → [`device_slice`](DlpackImport::device_slice) (compact tensors) or [`read_bytes`](DlpackImport::read_bytes) / [`write_bytes`](DlpackImport::write_bytes) (any strides) | the guard calls the producer's deleter on drop |
//!
//! The structs ([`ffi`]) are DLPack 1.x's, written from the specification (with the legacy
//! unversioned `DLManagedTensor`). Exports describe device memory as `kDLCUDA` with its ordinal,
//! managed memory as `kDLCUDAManaged`, pinned memory as `kDLCUDAHost`;
//! [`DlpackTensor::with_device`] presents managed memory as `kDLCUDA` and pinned memory as
//! `kDLCPU` for consumers that know only those.
//!
//! **Streams.** `__dlpack__(stream=s)` asks the producer to order the consumer's stream `s` after
//! its pending work; [`order_consumer_after`] does it with an event (record on the producer's
//! stream, `cudaStreamWaitEvent` on `s`). Memory with pending work on a stream
//! ([`StreamBuffer`](crate::StreamBuffer) and its views) names that stream in its export
//! ([`DlpackTensor::producer`], [`DlpackTensor::order_consumer`]), and keeps it through
//! [`into_raw`](DlpackTensor::into_raw): cuda-mem's own import recognises its exports and takes
//! the stream with them ([`DlpackImport::producer`]), so its views wait for the pending work.
//!
//! ```no_run
//! # fn main() -> Result<(), cuda_mem::CudaError> {
//! use cuda_mem::dlpack::{DlpackImport, DlpackTensor};
//! use cuda_mem::{Device, DeviceBuffer};
//! let buffer = DeviceBuffer::from_slice(&[1.0f32, 2.0, 3.0, 4.0])?;
//! let raw = DlpackTensor::owned(buffer)?.reshape(&[2, 2])?.into_raw();
//! // ... a consumer takes `raw`; here we take it back ourselves:
//! // SAFETY: `raw` is a live export whose ownership passes to the import.
//! let import = unsafe { DlpackImport::from_raw(raw)? };
//! assert_eq!(import.shape(), [2, 2]);
//! assert_eq!(import.device_slice::<f32>(Device::current()?)?.to_vec()?, [1.0, 2.0, 3.0, 4.0]);
//! drop(import); // the deleter frees the buffer
//! # Ok(()) }
//! ```

mod dtype;
mod export;
pub mod ffi;
mod import;
mod layout;
mod sources;
mod stream;
mod strided;
#[cfg(test)]
mod tests;

pub use dtype::{DataType, DlpackElement};
pub use export::{DlpackOwner, DlpackSource, DlpackSourceMut, DlpackTensor};
pub use ffi::DLDevice;
pub use import::{DlpackImport, MAX_NDIM};
pub use stream::{ConsumerStream, order_consumer_after};

use crate::error::{CudaError, ErrorKind};
use std::borrow::Cow;

/// The product of `extents`, or `None` when it overflows `usize`.
fn checked_elements(extents: impl IntoIterator<Item = usize>) -> Option<usize> {
    extents.into_iter().try_fold(1usize, usize::checked_mul)
}

fn invalid(what: &'static str, operation: impl Into<Cow<'static, str>>) -> CudaError {
    CudaError::new(ErrorKind::InvalidArgument(what), operation)
}
