//! What every launcher shares: the stream's device made current, the grid for the job, input
//! checks that fail with typed errors before anything is queued, and launch-status conversion.

use crate::geometry::Geometry;
pub(crate) use cuda_mem::launch::check;
pub(crate) use cuda_mem::launch::same_len;
use cuda_mem::launch::{CurrentDevice, cudaError_t, cudaStream_t};
use cuda_mem::{CudaError, DeviceSliceMut, DeviceSource, ErrorKind, Pod, Result, StreamScope};

/// A kernel that writes a 32-bit pattern over `n` elements (`fill`, the write probe).
pub(crate) type PatternKernel = unsafe extern "C" fn(*mut u32, usize, u32, u32, u32, cudaStream_t) -> cudaError_t;
/// A kernel that reads `n` u32 and writes one result (the checksum, the read probe).
pub(crate) type ReduceKernel<O> =
    unsafe extern "C" fn(*const u32, usize, *mut O, u32, u32, cudaStream_t) -> cudaError_t;
/// A kernel that writes `n` f32 from `n` f32 and a scalar (scale, axpy).
pub(crate) type MapKernel =
    unsafe extern "C" fn(*mut f32, *const f32, usize, f32, u32, u32, cudaStream_t) -> cudaError_t;

/// Everything a wrapper in kernels/*.cu needs besides its data: the grid and block sizes and
/// the scope's stream, with the stream's device current until the launch has been queued.
pub(crate) struct Launch {
    pub(crate) grid: u32,
    pub(crate) block: u32,
    pub(crate) stream: cudaStream_t,
    _device: CurrentDevice,
}

impl Launch {
    /// A grid-stride launch over `work_items` independent items on the scope's stream.
    pub(crate) fn grid_stride(scope: &StreamScope<'_, '_>, work_items: usize) -> Result<Self> {
        let stream = scope.stream();
        let geometry = Geometry::for_device(stream.device())?;
        let device = CurrentDevice::set(stream.device())?;
        Ok(Self {
            grid: geometry.grid_for(work_items),
            block: Geometry::BLOCK_THREADS,
            // Checked with the stream's device current: a per-thread stream only on its thread.
            stream: stream.checked_raw()?,
            _device: device,
        })
    }

    /// A launch of one thread (the pointer chase) on the scope's stream.
    pub(crate) fn single_thread(scope: &StreamScope<'_, '_>) -> Result<Self> {
        let stream = scope.stream();
        let device = CurrentDevice::set(stream.device())?;
        Ok(Self { grid: 1, block: 1, stream: stream.checked_raw()?, _device: device })
    }
}

/// Queues a pattern kernel over the `n` elements at `dst`, `per_thread` elements a work item.
///
/// # Safety
/// `dst` addresses `n` u32 of device-accessible memory lent to the scope (whose end synchronizes
/// the stream), and `kernel` writes only [0, n) of it.
pub(crate) unsafe fn queue_pattern(
    scope: &StreamScope<'_, '_>,
    kernel: (PatternKernel, &'static str),
    dst: *mut u32,
    n: usize,
    per_thread: usize,
    value: u32,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let launch = Launch::grid_stride(scope, n.div_ceil(per_thread))?;
    // SAFETY: the caller's contract.
    let code = unsafe { kernel.0(dst, n, value, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching {} on {n} elements", kernel.1))
}

/// Queues a reduction of `data` into `out` (exactly one element), `per_thread` elements a work
/// item.
///
/// # Safety
/// `kernel` reads only [0, n) of the data and writes only the one result element.
pub(crate) unsafe fn queue_reduce<'scope, 'v: 'scope, O: Pod>(
    scope: &StreamScope<'scope, '_>,
    kernel: (ReduceKernel<O>, &'static str),
    data: impl DeviceSource<'scope, u32>,
    per_thread: usize,
    out: &mut DeviceSliceMut<'v, O>,
) -> Result<()> {
    one_element(kernel.1, out.len())?;
    let (data_ptr, n) = scope.device_ptr(data)?;
    let out_ptr = scope.device_ptr_mut(out)?;
    let launch = Launch::grid_stride(scope, n.div_ceil(per_thread))?;
    // SAFETY: `data_ptr` addresses `n` u32 and `out_ptr` one element, both lent to the scope;
    // the caller vouches for what the kernel touches.
    let code = unsafe { kernel.0(data_ptr, n, out_ptr, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching {} on {n} elements", kernel.1))
}

/// Queues a map kernel writing `n` f32 at `out` from `n` f32 at `input` and `alpha`.
///
/// # Safety
/// `out` and `input` each address `n` f32 of device-accessible memory lent to the scope (they may
/// be the same: each element is read and then written by the same thread), and `kernel` touches
/// only [0, n) of each.
pub(crate) unsafe fn queue_map(
    scope: &StreamScope<'_, '_>,
    kernel: (MapKernel, &'static str),
    out: *mut f32,
    input: *const f32,
    n: usize,
    alpha: f32,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let launch = Launch::grid_stride(scope, n)?;
    // SAFETY: the caller's contract.
    let code = unsafe { kernel.0(out, input, n, alpha, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching {} on {n} elements", kernel.1))
}

/// A result slot (checksum, sink, chase end) must be exactly one element.
pub(crate) fn one_element(kernel: &'static str, len: usize) -> Result<()> {
    if len == 1 {
        return Ok(());
    }
    let kind = ErrorKind::InvalidArgument("the result slice must hold exactly one element");
    Err(CudaError::new(kind, format!("{kernel} with a result slice of {len} elements")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_mem::ErrorCode;

    #[test]
    fn length_mismatch_is_typed() {
        assert!(same_len(7, 7, "scale_f32").is_ok());
        let err = same_len(7, 6, "scale_f32").unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::LengthMismatch { src: 7, dst: 6 });
        assert_eq!(err.to_string(), "scale_f32 failed: source has 7 elements, destination 6");
    }

    #[test]
    fn result_slot_must_be_one_element() {
        assert!(one_element("checksum_u32", 1).is_ok());
        for len in [0, 2] {
            let err = one_element("checksum_u32", len).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
            assert!(err.to_string().contains(&format!("{len} elements")), "{err}");
        }
    }

    #[test]
    fn launch_status_keeps_the_runtime_code() {
        use cuda_mem_sys as sys;
        assert!(check(sys::cudaError::cudaSuccess, || unreachable!()).is_ok());
        let code = sys::cudaError::cudaErrorInvalidValue;
        let err = check(code, || "launching fill_u32 on 3 elements".into()).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::INVALID_VALUE));
        assert_eq!(err.operation(), "launching fill_u32 on 3 elements");
    }
}
