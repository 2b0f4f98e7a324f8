//! The one layer that calls the CUDA runtime. Each function wraps one runtime call and returns
//! `Result` with the operation's text; the owning types above never see a `cudaError_t`.
//! Functions that take raw pointers or handles are `unsafe`: the caller vouches for them.
//!
//! Drop paths, which cannot return an error, pass the `Result` to [`quiet`]: the failure was
//! already taken out of the runtime's last-error slot by [`check`], so it cannot surface later as
//! the failure of an unrelated launch.

mod address_range;
mod codes;
pub(crate) mod device;
mod driver_entry;
mod driver_library;
pub(crate) mod events;
pub(crate) mod graphs;
pub(crate) mod host;
pub(crate) mod host_flags;
pub(crate) mod ipc;
pub(crate) mod managed;
pub(crate) mod memory;
pub(crate) mod peers;
pub(crate) mod pools;
pub(crate) mod streams;
pub(crate) mod vmm;

pub(crate) use address_range::require_mapped;

use crate::error::{CudaError, ErrorCode, ErrorKind, OomReport, Result};
use cuda_mem_sys as sys;

/// The runtime's handle and descriptor types, named here so the layers above need no `sys` path.
pub use sys::{
    cudaDeviceAttr, cudaDeviceProp, cudaError_t, cudaEvent_t, cudaMemAccessFlags, cudaMemAllocationHandleType,
    cudaMemPool_t, cudaMemPoolAttr, cudaMemPoolProps, cudaMemoryAdvise, cudaStream_t,
};
#[cfg(test)]
pub use sys::{cudaMemAllocationType, cudaMemLocationType};

/// Turns a runtime return into `Result`. `operation` runs only on failure, so the hot path does
/// not format strings.
#[inline]
pub fn check(code: sys::cudaError_t, operation: impl FnOnce() -> String) -> Result<()> {
    if code == sys::cudaError::cudaSuccess {
        return Ok(());
    }
    Err(runtime_error(take_error(code), operation()))
}

/// The error for a runtime code: a missing driver is told apart from a driver too old, which the
/// runtime reports with the same codes.
#[cold]
#[inline(never)]
fn runtime_error(code: ErrorCode, operation: String) -> CudaError {
    CudaError::new(runtime_kind(code, driver_library::driver_loadable), operation)
}

/// [`ErrorKind::NoDriver`] when `code` says no usable driver or device and the driver's library
/// cannot be loaded (`driver_loadable` is asked only then), else [`ErrorKind::Runtime`].
fn runtime_kind(code: ErrorCode, driver_loadable: impl FnOnce() -> bool) -> ErrorKind {
    if code.is_no_driver_or_device() && !driver_loadable() {
        ErrorKind::NoDriver(code)
    } else {
        ErrorKind::Runtime(code)
    }
}

/// Like [`check`], but an allocation failure becomes [`ErrorKind::OutOfMemory`] with the device's
/// free and total memory read after the failure.
#[inline]
pub(crate) fn check_alloc(code: sys::cudaError_t, requested: usize, operation: impl FnOnce() -> String) -> Result<()> {
    if code == sys::cudaError::cudaSuccess {
        return Ok(());
    }
    Err(alloc_error(code, requested, operation()))
}

#[cold]
#[inline(never)]
fn alloc_error(code: sys::cudaError_t, requested: usize, operation: String) -> CudaError {
    let code = take_error(code);
    let kind = if code == ErrorCode::MEMORY_ALLOCATION {
        let (free, total) = device::mem_info().map_or((None, None), |(f, t)| (Some(f), Some(t)));
        let report = OomReport { requested, free, total, ..OomReport::default() };
        ErrorKind::OutOfMemory { code: Some(code), report: Box::new(report) }
    } else {
        runtime_kind(code, driver_library::driver_loadable)
    };
    CudaError::new(kind, operation)
}

/// For drop paths: whether the call succeeded. The error itself is dropped; [`check`] has already
/// cleared it from the thread's last-error slot.
#[inline]
pub(crate) fn quiet(result: Result<()>) -> bool {
    result.is_ok()
}

/// Resets the thread's last-error slot (non-sticky errors only), so a later launch check with
/// `cudaGetLastError` does not report an error the caller already received.
fn take_error(code: sys::cudaError_t) -> ErrorCode {
    last_error();
    ErrorCode(code.0)
}

/// The code in the thread's last-error slot, which the read clears (`cudaGetLastError`).
pub fn last_error() -> ErrorCode {
    // SAFETY: no arguments; reads and clears thread-local state.
    ErrorCode(unsafe { sys::cudaGetLastError() }.0)
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

/// A fresh allocation as `NonNull<T>`. Where its address does not suit `T` (only element types
/// aligned beyond what the allocator guarantees), or is null, `release` gives it back at once and
/// the error says why.
#[inline]
pub(crate) fn typed<T>(
    ptr: *mut std::ffi::c_void,
    operation: &'static str,
    release: impl FnOnce(*mut std::ffi::c_void) -> Result<()>,
) -> Result<std::ptr::NonNull<T>> {
    match std::ptr::NonNull::new(ptr.cast::<T>()) {
        Some(typed) if typed.as_ptr().is_aligned() => Ok(typed),
        _ => {
            if !ptr.is_null() {
                quiet(release(ptr));
            }
            Err(misaligned_error::<T>(ptr as usize, operation))
        }
    }
}

/// Refuses a copy (or kernel) whose source and destination differ in length, with
/// [`ErrorKind::LengthMismatch`] naming `operation`.
#[inline]
pub fn same_len(src: usize, dst: usize, operation: &'static str) -> Result<()> {
    if src == dst {
        return Ok(());
    }
    Err(CudaError::new(ErrorKind::LengthMismatch { src, dst }, operation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_told_apart_from_an_old_one() {
        for code in [ErrorCode::INSUFFICIENT_DRIVER, ErrorCode::NO_DEVICE] {
            assert_eq!(runtime_kind(code, || false), ErrorKind::NoDriver(code));
            assert_eq!(runtime_kind(code, || true), ErrorKind::Runtime(code));
        }
        let probed = std::cell::Cell::new(false);
        let other = runtime_kind(ErrorCode::MEMORY_ALLOCATION, || {
            probed.set(true);
            false
        });
        assert_eq!(other, ErrorKind::Runtime(ErrorCode::MEMORY_ALLOCATION));
        assert!(!probed.get(), "the driver's library is probed only for the no-driver codes");
    }

    #[test]
    fn byte_len_detects_overflow() {
        let err = byte_len::<u64>(usize::MAX / 4, "cudaMalloc").unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::SizeOverflow { len: usize::MAX / 4, elem_size: 8 });
        assert_eq!(byte_len::<u32>(10, "x").unwrap(), 40);
        assert_eq!(byte_len::<()>(usize::MAX, "x").unwrap(), 0);
    }

    #[test]
    #[cfg_attr(miri, ignore = "calls the CUDA runtime (cudaGetLastError), a foreign function Miri cannot run")]
    fn check_keeps_code_and_operation() {
        let err = check(sys::cudaError::cudaErrorInvalidValue, || "cudaFoo of 3 bytes".into()).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::INVALID_VALUE));
        assert_eq!(err.operation(), "cudaFoo of 3 bytes");
        assert!(err.to_string().starts_with("cudaFoo of 3 bytes failed: invalid argument (cudaErrorInvalidValue)"));
        assert!(check(sys::cudaError::cudaSuccess, || unreachable!()).is_ok());
    }
}
