//! Page-locked host memory: `cudaMallocHost` / `cudaHostAlloc`, `cudaFreeHost`, registration of
//! existing memory, and the device address of mapped memory.

use super::host_flags::{HostAllocFlags, HostRegisterFlags};
use super::{check, check_alloc};
use crate::error::{CudaError, ErrorKind, Result};
use cuda_mem_sys as sys;
use std::ffi::c_void;
use std::ptr::NonNull;

/// `cudaMallocHost` when `flags` is empty, else `cudaHostAlloc(flags)`, of `bytes` (non-zero).
pub(crate) fn alloc(bytes: usize, flags: HostAllocFlags) -> Result<*mut c_void> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    let code = if flags.is_empty() {
        // SAFETY: `ptr` is valid for writes.
        unsafe { sys::cudaMallocHost(&mut ptr, bytes) }
    } else {
        // SAFETY: `ptr` is valid for writes; the flags are the documented bits.
        unsafe { sys::cudaHostAlloc(&mut ptr, bytes, flags.bits()) }
    };
    check_alloc(code, bytes, || {
        if flags.is_empty() {
            format!("cudaMallocHost of {bytes} bytes")
        } else {
            format!("cudaHostAlloc of {bytes} bytes with {flags:?}")
        }
    })?;
    Ok(ptr)
}

/// `cudaFreeHost` of `bytes`.
///
/// # Safety
/// `ptr` came from [`alloc`] and is freed once, with no pending work on it.
pub(crate) unsafe fn free(ptr: *mut c_void, bytes: usize) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaFreeHost(ptr) }, || format!("cudaFreeHost of {bytes} bytes"))
}

/// `cudaHostRegister` of `bytes` (non-zero).
///
/// # Safety
/// `ptr` is valid for `bytes` and stays allocated and unmoved until [`unregister`].
pub(crate) unsafe fn register(ptr: *mut c_void, bytes: usize, flags: HostRegisterFlags) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaHostRegister(ptr, bytes, flags.bits()) };
    check(code, || format!("cudaHostRegister of {bytes} bytes with {flags:?}"))
}

/// `cudaHostUnregister`.
///
/// # Safety
/// `ptr` is the start of a registration made with [`register`], with no pending work on it.
pub(crate) unsafe fn unregister(ptr: *mut c_void) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaHostUnregister(ptr) }, || "cudaHostUnregister".into())
}

/// `cudaHostGetDevicePointer`: the device address of mapped host memory.
///
/// # Safety
/// `host` is the start of a live mapped allocation or registration.
pub(crate) unsafe fn device_pointer(host: *mut c_void) -> Result<*mut c_void> {
    let mut device: *mut c_void = std::ptr::null_mut();
    // SAFETY: `device` is valid for writes; the caller vouches for `host`.
    check(unsafe { sys::cudaHostGetDevicePointer(&mut device, host, 0) }, || "cudaHostGetDevicePointer".into())?;
    Ok(device)
}

/// The device address of mapped host memory; empty ranges map to a dangling address. Memory that
/// is not `mapped` is refused with [`ErrorKind::NotMapped`].
pub(crate) fn mapped_device_ptr<T>(mapped: bool, host: *mut T, len: usize) -> Result<*mut T> {
    if !mapped {
        return Err(CudaError::new(ErrorKind::NotMapped, "cudaHostGetDevicePointer"));
    }
    if len * size_of::<T>() == 0 {
        return Ok(NonNull::dangling().as_ptr());
    }
    // SAFETY: `host` is the start of a live mapped allocation (the caller's buffer).
    unsafe { device_pointer(host.cast()) }.map(|device| device.cast())
}
