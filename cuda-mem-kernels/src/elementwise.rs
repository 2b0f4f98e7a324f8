//! Element-wise kernels: fill (u32, f32), scale and axpy (f32).

use crate::ffi;
use crate::launch::{MapKernel, queue_map, queue_pattern, same_len};
use cuda_mem::{DeviceSliceMut, DeviceSource, Result, StreamScope};

/// Queues a kernel that sets every element of `dst` to `value`.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut buffer = DeviceBuffer::<u32>::zeroed(1 << 20)?;
/// let mut view = buffer.as_mut_slice();
/// stream.scope(|s| cuda_mem_kernels::fill_u32(s, &mut view, 7))??;
/// assert!(buffer.to_vec()?.iter().all(|&x| x == 7));
/// # Ok(()) }
/// ```
pub fn fill_u32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    dst: &mut DeviceSliceMut<'v, u32>,
    value: u32,
) -> Result<()> {
    let ptr = scope.device_ptr_mut(dst)?;
    // SAFETY: `ptr` addresses the view's elements, lent to the scope; fill writes exactly them.
    unsafe { queue_pattern(scope, (ffi::cmk_fill_b32, "fill_u32"), ptr, dst.len(), 1, value) }
}

/// Queues a kernel that sets every element of `dst` to `value`.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{ManagedBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut weights = ManagedBuffer::<f32>::zeroed(4096)?;
/// let mut view = weights.as_mut_slice();
/// stream.scope(|s| cuda_mem_kernels::fill_f32(s, &mut view, 0.5))??;
/// assert!(weights.host()?.iter().all(|&w| w == 0.5));
/// # Ok(()) }
/// ```
pub fn fill_f32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    dst: &mut DeviceSliceMut<'v, f32>,
    value: f32,
) -> Result<()> {
    // An f32 is stored as its 32 bits; the kernel copies bit patterns.
    let ptr = scope.device_ptr_mut(dst)?.cast::<u32>();
    // SAFETY: as in `fill_u32`.
    unsafe { queue_pattern(scope, (ffi::cmk_fill_b32, "fill_f32"), ptr, dst.len(), 1, value.to_bits()) }
}

/// Queues `dst[i] = alpha * src[i]` ([`scale_in_place_f32`] scales one view in place). Errors
/// with [`LengthMismatch`](cuda_mem::ErrorKind::LengthMismatch) unless both have the same length.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let x = DeviceBuffer::from_slice(&[1.0f32, 2.0, 3.0])?;
/// let mut y = DeviceBuffer::<f32>::zeroed(3)?;
/// let mut view = y.as_mut_slice();
/// stream.scope(|s| cuda_mem_kernels::scale_f32(s, &mut view, x.as_slice(), 2.0))??;
/// assert_eq!(y.to_vec()?, [2.0, 4.0, 6.0]);
/// # Ok(()) }
/// ```
pub fn scale_f32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    dst: &mut DeviceSliceMut<'v, f32>,
    src: impl DeviceSource<'scope, f32>,
    alpha: f32,
) -> Result<()> {
    map_f32(scope, (ffi::cmk_scale_f32, "scale_f32"), dst, src, alpha)
}

/// Queues `x[i] = alpha * x[i]`.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut x = DeviceBuffer::from_slice(&[1.0f32, 2.0, 3.0])?;
/// let mut view = x.as_mut_slice();
/// stream.scope(|s| cuda_mem_kernels::scale_in_place_f32(s, &mut view, 2.0))??;
/// assert_eq!(x.to_vec()?, [2.0, 4.0, 6.0]);
/// # Ok(()) }
/// ```
pub fn scale_in_place_f32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    x: &mut DeviceSliceMut<'v, f32>,
    alpha: f32,
) -> Result<()> {
    let ptr = scope.device_ptr_mut(x)?;
    // SAFETY: `ptr` addresses the view's f32, lent to the scope; in place is allowed by `queue_map`.
    unsafe { queue_map(scope, (ffi::cmk_scale_f32, "scale_in_place_f32"), ptr, ptr, x.len(), alpha) }
}

/// Queues `y[i] = alpha * x[i] + y[i]`, rounded once (a fused multiply-add, which
/// [`f32::mul_add`] reproduces on the CPU). Errors with
/// [`LengthMismatch`](cuda_mem::ErrorKind::LengthMismatch) unless `x` and `y` have the same length.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let x = DeviceBuffer::from_slice(&[1.0f32, 2.0])?;
/// let mut y = DeviceBuffer::from_slice(&[10.0f32, 20.0])?;
/// let mut y_view = y.as_mut_slice();
/// stream.scope(|s| cuda_mem_kernels::axpy_f32(s, &mut y_view, 3.0, x.as_slice()))??;
/// assert_eq!(y.to_vec()?, [13.0, 26.0]);
/// # Ok(()) }
/// ```
pub fn axpy_f32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    y: &mut DeviceSliceMut<'v, f32>,
    alpha: f32,
    x: impl DeviceSource<'scope, f32>,
) -> Result<()> {
    map_f32(scope, (ffi::cmk_axpy_f32, "axpy_f32"), y, x, alpha)
}

/// `out` from `input` (the same length) and `alpha` through a map kernel.
fn map_f32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    kernel: (MapKernel, &'static str),
    out: &mut DeviceSliceMut<'v, f32>,
    input: impl DeviceSource<'scope, f32>,
    alpha: f32,
) -> Result<()> {
    let (input_ptr, n) = scope.device_ptr(input)?;
    same_len(n, out.len(), kernel.1)?;
    let out_ptr = scope.device_ptr_mut(out)?;
    // SAFETY: both pointers address `n` f32 lent to the scope; the map kernels (scale, axpy)
    // touch only [0, n) of each.
    unsafe { queue_map(scope, kernel, out_ptr, input_ptr, n, alpha) }
}
