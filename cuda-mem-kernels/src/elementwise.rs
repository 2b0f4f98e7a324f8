//! Element-wise kernels: fill (u32, f32), scale and axpy (f32).

use crate::ffi;
use crate::launch::{Launch, check, same_len};
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
    fill_bits(scope, ptr, dst.len(), value, "fill_u32")
}

/// Queues a kernel that sets every element of `dst` to `value`.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{ManagedBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut weights = ManagedBuffer::<f32>::zeroed(4096)?;
/// let mut view = weights.as_device_slice_mut();
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
    fill_bits(scope, ptr, dst.len(), value.to_bits(), "fill_f32")
}

fn fill_bits(scope: &StreamScope<'_, '_>, ptr: *mut u32, n: usize, bits: u32, kernel: &'static str) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let launch = Launch::grid_stride(scope, n)?;
    // SAFETY: `ptr` addresses `n` 32-bit elements of device-accessible memory lent to the scope
    // (whose end synchronizes the stream); the kernel writes exactly [0, n) on the scope's stream.
    let code = unsafe { ffi::cmk_fill_b32(ptr, n, bits, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching {kernel} on {n} elements"))
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
    let (src_ptr, n) = scope.device_ptr(src)?;
    same_len("scale_f32", n, dst.len())?;
    if n == 0 {
        return Ok(());
    }
    let dst_ptr = scope.device_ptr_mut(dst)?;
    // SAFETY: both pointers address `n` f32 lent to the scope, as `launch_scale` requires.
    unsafe { launch_scale(scope, dst_ptr, src_ptr, n, alpha, "scale_f32") }
}

/// Launches `dst[i] = alpha * src[i]` over `n` elements on the scope's stream.
///
/// # Safety
/// `dst` and `src` each address `n` f32 of device-accessible memory lent to the scope (they may
/// be the same: each element is read and then written by the same thread).
unsafe fn launch_scale(
    scope: &StreamScope<'_, '_>,
    dst: *mut f32,
    src: *const f32,
    n: usize,
    alpha: f32,
    kernel: &'static str,
) -> Result<()> {
    let launch = Launch::grid_stride(scope, n)?;
    // SAFETY: the caller's contract; the kernel touches exactly [0, n) of each on the scope's
    // stream, whose end synchronizes it.
    let code = unsafe { ffi::cmk_scale_f32(dst, src, n, alpha, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching {kernel} on {n} elements"))
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
    let n = x.len();
    if n == 0 {
        return Ok(());
    }
    let ptr = scope.device_ptr_mut(x)?;
    // SAFETY: `ptr` addresses `n` f32 lent to the scope; in place is allowed by `launch_scale`.
    unsafe { launch_scale(scope, ptr, ptr, n, alpha, "scale_in_place_f32") }
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
    let (x_ptr, n) = scope.device_ptr(x)?;
    same_len("axpy_f32", n, y.len())?;
    if n == 0 {
        return Ok(());
    }
    let y_ptr = scope.device_ptr_mut(y)?;
    let launch = Launch::grid_stride(scope, n)?;
    // SAFETY: both pointers address `n` f32 of device-accessible memory lent to the scope; each
    // element is read and then written by the same thread.
    let code = unsafe { ffi::cmk_axpy_f32(y_ptr, x_ptr, n, alpha, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching axpy_f32 on {n} elements"))
}
