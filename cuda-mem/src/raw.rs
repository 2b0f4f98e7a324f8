//! The one path from runtime return codes to `Result`, and size arithmetic shared by the buffers.

use crate::error::{CudaError, ErrorCode, ErrorKind, OomReport, Result};
use cuda_mem_sys as sys;

/// Turns a runtime return into `Result`. `operation` runs only on failure, so the hot path does
/// not format strings.
#[inline]
pub(crate) fn check(code: sys::cudaError_t, operation: impl FnOnce() -> String) -> Result<()> {
    if code == sys::cudaError::cudaSuccess {
        return Ok(());
    }
    Err(CudaError::new(ErrorKind::Runtime(take_error(code)), operation()))
}

/// Like [`check`], but an allocation failure becomes [`ErrorKind::OutOfMemory`] with the device's
/// free and total memory read after the failure.
#[inline]
pub(crate) fn check_alloc(code: sys::cudaError_t, requested: usize, operation: impl FnOnce() -> String) -> Result<()> {
    if code == sys::cudaError::cudaSuccess {
        return Ok(());
    }
    let code = take_error(code);
    let kind = if code == ErrorCode::MEMORY_ALLOCATION {
        let (free, total) = mem_info().map_or((None, None), |(f, t)| (Some(f), Some(t)));
        let report = OomReport { requested, free, total, ..OomReport::default() };
        ErrorKind::OutOfMemory { code: Some(code), report: Box::new(report) }
    } else {
        ErrorKind::Runtime(code)
    };
    Err(CudaError::new(kind, operation()))
}

/// For drop paths, which cannot return an error: a failure is consumed here, so it does not stay
/// in the thread's last-error slot and surface later as the failure of an unrelated launch.
/// Returns whether the call succeeded.
#[inline]
pub(crate) fn discard(code: sys::cudaError_t) -> bool {
    if code == sys::cudaError::cudaSuccess {
        return true;
    }
    take_error(code);
    false
}

/// Resets the thread's last-error slot (non-sticky errors only), so a later launch check with
/// `cudaGetLastError` does not report an error the caller already received.
fn take_error(code: sys::cudaError_t) -> ErrorCode {
    // SAFETY: cudaGetLastError takes no arguments and only reads/clears thread-local state.
    let _ = unsafe { sys::cudaGetLastError() };
    ErrorCode(code.0)
}

/// Free and total bytes of the current device.
pub(crate) fn mem_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are valid for writes.
    check(unsafe { sys::cudaMemGetInfo(&mut free, &mut total) }, || "cudaMemGetInfo".into())?;
    Ok((free, total))
}

/// `len * size_of::<T>()`, or [`ErrorKind::SizeOverflow`] naming `operation`.
#[inline]
pub(crate) fn byte_len<T>(len: usize, operation: &'static str) -> Result<usize> {
    len.checked_mul(size_of::<T>())
        .ok_or_else(|| CudaError::new(ErrorKind::SizeOverflow { len, elem_size: size_of::<T>() }, operation))
}

/// The error for memory whose address does not suit the element type `T` (only element types
/// aligned beyond what the allocator guarantees can get it).
#[cold]
pub(crate) fn misaligned_error<T>(address: usize, operation: &'static str) -> CudaError {
    let kind = ErrorKind::InvalidArgument("the allocation is not aligned for the element type");
    CudaError::new(
        kind,
        format!("{operation} returned {address:#x} for an element type aligned to {}", align_of::<T>()),
    )
}

/// The error for copies between slices of different lengths.
pub(crate) fn length_mismatch(src: usize, dst: usize, operation: &'static str) -> CudaError {
    CudaError::new(ErrorKind::LengthMismatch { src, dst }, operation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_len_detects_overflow() {
        let err = byte_len::<u64>(usize::MAX / 4, "cudaMalloc").unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::SizeOverflow { len: usize::MAX / 4, elem_size: 8 });
        assert_eq!(byte_len::<u32>(10, "x").unwrap(), 40);
        assert_eq!(byte_len::<()>(usize::MAX, "x").unwrap(), 0);
    }

    #[test]
    fn check_keeps_code_and_operation() {
        let err = check(sys::cudaError::cudaErrorInvalidValue, || "cudaFoo of 3 bytes".into()).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::INVALID_VALUE));
        assert_eq!(err.operation(), "cudaFoo of 3 bytes");
        assert!(err.to_string().starts_with("cudaFoo of 3 bytes failed: invalid argument (cudaErrorInvalidValue)"));
        assert!(check(sys::cudaError::cudaSuccess, || unreachable!()).is_ok());
    }
}
