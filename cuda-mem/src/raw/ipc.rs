//! Sharing memory with other processes: legacy IPC handles, pools exported as file descriptors,
//! and pointers exported from such pools. Opaque export data travels as 64 bytes.

use super::check;
use crate::error::Result;
use cuda_mem_sys as sys;
use std::ffi::{c_char, c_int, c_void};

/// `cudaIpcGetMemHandle`: the opaque handle of a `cudaMalloc` allocation.
///
/// # Safety
/// `ptr` is the start of a live `cudaMalloc` allocation of `bytes`.
pub(crate) unsafe fn get_mem_handle(ptr: *mut c_void, bytes: usize) -> Result<[u8; 64]> {
    let mut handle = sys::cudaIpcMemHandle_st::default();
    // SAFETY: `handle` is valid for writes; the caller vouches for the pointer.
    check(unsafe { sys::cudaIpcGetMemHandle(&mut handle, ptr) }, || format!("cudaIpcGetMemHandle of {bytes} bytes"))?;
    Ok(std::array::from_fn(|i| handle.reserved[i] as u8))
}

/// `cudaIpcOpenMemHandle` with lazy peer access, on the current device. The runtime validates
/// the handle; the length (`bytes`) is only named in the message.
pub(crate) fn open_mem_handle(opaque: [u8; 64], bytes: usize) -> Result<*mut c_void> {
    let mut handle = sys::cudaIpcMemHandle_st::default();
    for (dst, src) in handle.reserved.iter_mut().zip(opaque) {
        *dst = src as c_char;
    }
    let mut ptr = std::ptr::null_mut();
    // SAFETY: `ptr` is valid for writes; the handle is plain data.
    let code = unsafe { sys::cudaIpcOpenMemHandle(&mut ptr, handle, sys::cudaIpcMemLazyEnablePeerAccess) };
    check(code, || format!("cudaIpcOpenMemHandle of {bytes} bytes"))?;
    Ok(ptr)
}

/// `cudaIpcCloseMemHandle`.
///
/// # Safety
/// `ptr` came from [`open_mem_handle`], is closed once, and nothing uses it after.
pub(crate) unsafe fn close_mem_handle(ptr: *mut c_void) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaIpcCloseMemHandle(ptr) }, || "cudaIpcCloseMemHandle".into())
}

/// `cudaMemPoolExportToShareableHandle` as a POSIX file descriptor, which the caller then owns.
///
/// # Safety
/// `pool` is valid for the call.
pub(crate) unsafe fn export_pool_fd(pool: sys::cudaMemPool_t, ordinal: c_int) -> Result<c_int> {
    let mut fd: c_int = -1;
    let handle_type = sys::cudaMemAllocationHandleType::cudaMemHandleTypePosixFileDescriptor;
    // SAFETY: for this handle type the runtime writes an `int` through the pointer.
    let code = unsafe { sys::cudaMemPoolExportToShareableHandle((&raw mut fd).cast(), pool, handle_type, 0) };
    check(code, || format!("cudaMemPoolExportToShareableHandle of a pool on device {ordinal}"))?;
    Ok(fd)
}

/// `cudaMemPoolImportFromShareableHandle` from a POSIX file descriptor, for device `ordinal`.
/// The caller keeps `fd` open for the call and owns the returned pool.
pub(crate) fn import_pool_fd(fd: c_int, ordinal: c_int) -> Result<sys::cudaMemPool_t> {
    let mut pool: sys::cudaMemPool_t = std::ptr::null_mut();
    let handle_type = sys::cudaMemAllocationHandleType::cudaMemHandleTypePosixFileDescriptor;
    // For file descriptors the handle argument is the descriptor's value itself.
    let handle = fd as usize as *mut c_void;
    // SAFETY: `pool` is valid for writes; the runtime only reads the descriptor.
    let code = unsafe { sys::cudaMemPoolImportFromShareableHandle(&mut pool, handle, handle_type, 0) };
    check(code, || format!("cudaMemPoolImportFromShareableHandle on device {ordinal}"))?;
    Ok(pool)
}

/// `cudaMemPoolExportPointer`: the opaque data naming one allocation of an exported pool.
///
/// # Safety
/// `ptr` is the start of a live allocation of `bytes` from a pool.
pub(crate) unsafe fn export_pointer(ptr: *mut c_void, bytes: usize) -> Result<[u8; 64]> {
    let mut data = sys::cudaMemPoolPtrExportData::default();
    // SAFETY: `data` is valid for writes; the caller vouches for the pointer.
    check(unsafe { sys::cudaMemPoolExportPointer(&mut data, ptr) }, || {
        format!("cudaMemPoolExportPointer of {bytes} bytes")
    })?;
    Ok(data.reserved)
}

/// `cudaMemPoolImportPointer`: maps an allocation of an imported pool. The runtime validates the
/// data; the length (`bytes`) is only named in the message.
///
/// # Safety
/// `pool` is valid for the call.
pub(crate) unsafe fn import_pointer(pool: sys::cudaMemPool_t, opaque: [u8; 64], bytes: usize) -> Result<*mut c_void> {
    let mut data = sys::cudaMemPoolPtrExportData { reserved: opaque };
    let mut ptr = std::ptr::null_mut();
    // SAFETY: both pointers are valid; the caller vouches for the pool.
    check(unsafe { sys::cudaMemPoolImportPointer(&mut ptr, pool, &mut data) }, || {
        format!("cudaMemPoolImportPointer of {bytes} bytes")
    })?;
    Ok(ptr)
}
