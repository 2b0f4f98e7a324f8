//! Strided page touch: one access every `stride_bytes`. Over managed memory whose pages live on
//! the host, every touch is a GPU page fault, so the time per touch measures fault handling and
//! migration; over resident memory it is a sparse-access probe.

use crate::ffi;
use crate::launch::{Launch, check, one_element};
use cuda_mem::{CudaError, DeviceSliceMut, DeviceSource, ErrorKind, Result, StreamScope};
use std::iter::StepBy;
use std::ops::Range;

/// The element indices a touch with `stride_bytes` reaches in a slice of `len` u32: `0`,
/// `stride_bytes / 4`, ... while below `len`. `stride_bytes` must be a positive multiple of 4
/// (else [`InvalidArgument`](cuda_mem::ErrorKind::InvalidArgument)).
///
/// ```
/// let touched: Vec<usize> = cuda_mem_kernels::touched_indices(10_000, 4096)?.collect();
/// assert_eq!(touched, [0, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 9216]);
/// # Ok::<(), cuda_mem::CudaError>(())
/// ```
pub fn touched_indices(len: usize, stride_bytes: usize) -> Result<StepBy<Range<usize>>> {
    Ok((0..len).step_by(stride_elements(stride_bytes)?))
}

fn stride_elements(stride_bytes: usize) -> Result<usize> {
    const ELEMENT: usize = size_of::<u32>();
    if stride_bytes == 0 || !stride_bytes.is_multiple_of(ELEMENT) {
        let kind = ErrorKind::InvalidArgument("stride_bytes must be a positive multiple of 4 (the element size)");
        return Err(CudaError::new(kind, format!("page touch with a stride of {stride_bytes} bytes")));
    }
    Ok(stride_bytes / ELEMENT)
}

/// Queues a kernel that writes `value` to every element [`touched_indices`] names (one thread per
/// touch) and leaves the others alone.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{Event, ManagedBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut managed = ManagedBuffer::<u32>::zeroed(256 << 20)?; // 1 GiB, first touched by the GPU
/// let mut view = managed.as_mut_slice();
/// let (start, end) = (Event::new()?, Event::new()?);
/// stream.scope(|s| -> cuda_mem::Result<()> {
///     start.record(s.stream())?;
///     cuda_mem_kernels::touch_pages_write(s, &mut view, 64 << 10, 1)?; // one touch per 64 KiB
///     end.record(s.stream())
/// })??;
/// println!("{:?} per touch", end.elapsed_since(&start)? / (1 << 14));
/// # Ok(()) }
/// ```
pub fn touch_pages_write<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    dst: &mut DeviceSliceMut<'v, u32>,
    stride_bytes: usize,
    value: u32,
) -> Result<()> {
    let stride = stride_elements(stride_bytes)?;
    let n = dst.len();
    if n == 0 {
        return Ok(());
    }
    let ptr = scope.device_ptr_mut(dst)?;
    let launch = Launch::grid_stride(scope, n.div_ceil(stride))?;
    // SAFETY: `ptr` addresses `n` u32 of device-accessible memory lent to the scope; the kernel
    // writes only indices k * stride < n.
    let code = unsafe { ffi::cmk_touch_write_u32(ptr, n, stride, value, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching touch_pages_write on {n} elements every {stride_bytes} bytes"))
}

/// Queues a kernel that reads every element [`touched_indices`] names and writes their XOR to
/// `sink` (exactly one element, else [`InvalidArgument`](cuda_mem::ErrorKind::InvalidArgument));
/// `sink` is zeroed on the stream first.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, ManagedBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let managed = ManagedBuffer::<u32>::from_slice(&vec![3; 1 << 20])?; // pages on the host
/// let mut sink = DeviceBuffer::<u32>::zeroed(1)?;
/// let mut sink_view = sink.as_mut_slice();
/// stream.scope(|s| cuda_mem_kernels::touch_pages_read(s, managed.as_slice(), 4096, &mut sink_view))??;
/// # Ok(()) }
/// ```
pub fn touch_pages_read<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    src: impl DeviceSource<'scope, u32>,
    stride_bytes: usize,
    sink: &mut DeviceSliceMut<'v, u32>,
) -> Result<()> {
    let stride = stride_elements(stride_bytes)?;
    one_element("touch_pages_read", sink.len())?;
    let (src_ptr, n) = scope.device_ptr(src)?;
    let sink_ptr = scope.device_ptr_mut(sink)?;
    let launch = Launch::grid_stride(scope, n.div_ceil(stride))?;
    // SAFETY: `src_ptr` addresses `n` u32 and `sink_ptr` one u32 of device-accessible memory lent
    // to the scope; the kernel reads only indices k * stride < n and writes only the sink.
    let code =
        unsafe { ffi::cmk_touch_read_u32(src_ptr, n, stride, sink_ptr, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching touch_pages_read on {n} elements every {stride_bytes} bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touches_start_at_zero_and_stay_in_bounds() {
        assert_eq!(touched_indices(0, 4096).unwrap().count(), 0);
        assert_eq!(touched_indices(1, 4096).unwrap().collect::<Vec<_>>(), [0]);
        assert_eq!(touched_indices(1024, 4096).unwrap().collect::<Vec<_>>(), [0]);
        assert_eq!(touched_indices(1025, 4096).unwrap().collect::<Vec<_>>(), [0, 1024]);
        assert_eq!(touched_indices(5, 4).unwrap().count(), 5);
        // 1 GiB of u32 touched every 2 MiB: 512 touches, the last at 511 * 512 Ki elements.
        let touched: Vec<usize> = touched_indices(1 << 28, 2 << 20).unwrap().collect();
        assert_eq!((touched.len(), touched.last().copied()), (512, Some(511 << 19)));
    }

    #[test]
    fn stride_must_be_a_positive_multiple_of_the_element() {
        for bad in [0, 1, 2, 3, 4097] {
            let err = touched_indices(100, bad).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{bad}: {err}");
        }
        assert_eq!(stride_elements(4).unwrap(), 1);
        assert_eq!(stride_elements(65536).unwrap(), 16384);
    }
}
