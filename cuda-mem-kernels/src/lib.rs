//! # cuda-mem-kernels
//!
//! CUDA C++ kernels for cuda-mem with safe launchers: they take a [`StreamScope`] and cuda-mem
//! views ([`DeviceSliceMut`] to write, any [`DeviceSource`] to read), so a kernel can only use
//! memory lent to the scope, which synchronizes its stream before the borrows end. No raw
//! pointers cross the API; bad input is a typed [`CudaError`], checked before anything is queued.
//!
//! | family | launchers | CPU mirror |
//! |---|---|---|
//! | element-wise | [`fill_u32`], [`fill_f32`], [`scale_f32`], [`axpy_f32`] | — |
//! | verification | [`checksum_u32`] (position-dependent u64, computed on the device) | [`checksum_cpu`] |
//! | bandwidth | [`stream_read_u32`], [`stream_write_u32`] (16-byte loads/stores) | — |
//! | managed-memory faults | [`touch_pages_read`], [`touch_pages_write`] (one access every `stride_bytes`) | [`touched_indices`] |
//! | latency | [`pointer_chase`] (one thread, dependent loads) | [`chase_cpu`], ring builder [`chase_ring`] |
//!
//! The kernels run over any device-accessible memory: device buffers, the device view of a
//! mapped pinned buffer (zero-copy host memory) and managed buffers. Grid-stride kernels are
//! launched with [`Geometry::for_device`]: as many blocks as the device holds resident.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! use cuda_mem::{DeviceBuffer, HostAllocFlags, PinnedBuffer, Stream};
//! use cuda_mem_kernels::{checksum_cpu, checksum_u32, fill_u32};
//! let stream = Stream::non_blocking()?;
//! let mut data = DeviceBuffer::<u32>::zeroed(1 << 20)?;
//! let mut mapped = PinnedBuffer::<u64>::zeroed_with_flags(1, HostAllocFlags::MAPPED)?;
//! let (mut view, mut sum) = (data.as_mut_slice(), mapped.device_view_mut()?);
//! stream.scope(|s| -> cuda_mem::Result<()> {
//!     fill_u32(s, &mut view, 3)?;
//!     checksum_u32(s, &view, &mut sum) // the result lands in host memory, no copy needed
//! })??;
//! assert_eq!(mapped[0], checksum_cpu(&vec![3; 1 << 20]));
//! # Ok(()) }
//! ```
//!
//! ## GPU targets: `CUDA_MEM_ARCHS`
//! The build compiles `kernels/*.cu` with nvcc for the targets in the environment variable
//! `CUDA_MEM_ARCHS`: a comma-separated list of `sm_XY` (machine code for that GPU architecture)
//! and `compute_XY` (PTX, which the driver compiles for GPUs newer than every `sm_XY` listed).
//! The default, `sm_80,sm_90,compute_90`, covers A100 and H100/H200 natively and later GPUs
//! through PTX. [`COMPILED_TARGETS`] says what this build holds. Changing the variable rebuilds
//! the kernels. nvcc is `$DEP_CUDART_BIN/nvcc` (the toolkit cuda-mem-sys links), else `$NVCC`,
//! else the first on `PATH`. With `DOCS_RS` set, nothing is compiled.
#![warn(missing_docs)]

mod bandwidth;
mod checksum;
mod elementwise;
mod ffi;
mod geometry;
mod launch;
mod page_touch;
mod pointer_chase;

pub use bandwidth::{stream_read_u32, stream_write_u32};
pub use checksum::{checksum_cpu, checksum_u32};
pub use elementwise::{axpy_f32, fill_f32, fill_u32, scale_f32, scale_in_place_f32};
pub use geometry::Geometry;
pub use page_touch::{touch_pages_read, touch_pages_write, touched_indices};
pub use pointer_chase::{MAX_RING_LEN, chase_cpu, chase_ring, pointer_chase};

#[cfg(doc)]
use cuda_mem::{CudaError, DeviceSliceMut, DeviceSource, StreamScope};

/// The GPU targets the kernels were compiled for, comma-separated as in `CUDA_MEM_ARCHS`
/// (default `sm_80,sm_90,compute_90`): `sm_XY` is machine code, `compute_XY` PTX.
pub const COMPILED_TARGETS: &str = env!("CUDA_MEM_KERNELS_TARGETS");
