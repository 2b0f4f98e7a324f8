//! Memory pools and stream-ordered allocation: create, destroy, the device's pools, attributes,
//! trimming, peer access, `cudaMallocFromPoolAsync` / `cudaFreeAsync`.

use super::{check, check_alloc};
use crate::error::{CudaError, ErrorKind, Result};
use cuda_mem_sys as sys;
use std::ffi::{c_int, c_void};

/// The location of device `ordinal`'s memory, as pools and CUDA 13's advice take it.
pub(crate) fn device_location(ordinal: c_int) -> sys::cudaMemLocation {
    sys::cudaMemLocation { type_: sys::cudaMemLocationType::cudaMemLocationTypeDevice, id: ordinal }
}

/// Props of a pool of pinned device memory on device `ordinal`.
pub(crate) fn device_pool_props(
    ordinal: c_int,
    handle_types: sys::cudaMemAllocationHandleType,
    max_size: usize,
) -> sys::cudaMemPoolProps {
    sys::cudaMemPoolProps {
        allocType: sys::cudaMemAllocationType::cudaMemAllocationTypePinned,
        handleTypes: handle_types,
        location: device_location(ordinal),
        maxSize: max_size,
        ..Default::default()
    }
}

/// `cudaMemPoolCreate`; `describe` names the props for the message.
pub(crate) fn create(props: &sys::cudaMemPoolProps, describe: impl FnOnce() -> String) -> Result<sys::cudaMemPool_t> {
    let mut pool: sys::cudaMemPool_t = std::ptr::null_mut();
    // SAFETY: both pointers are valid; the props are fully initialised.
    check(unsafe { sys::cudaMemPoolCreate(&mut pool, props) }, || format!("cudaMemPoolCreate on {}", describe()))?;
    Ok(pool)
}

/// `cudaMemPoolDestroy`; frees still pending in stream order complete first.
///
/// # Safety
/// `pool` was created (or imported) by this process, and no live allocation or handle uses it
/// after this call.
pub(crate) unsafe fn destroy(pool: sys::cudaMemPool_t) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaMemPoolDestroy(pool) }, || "cudaMemPoolDestroy".into())
}

/// `cudaDeviceGetMemPool`: the device's current pool.
pub(crate) fn current(ordinal: c_int) -> Result<sys::cudaMemPool_t> {
    let mut pool: sys::cudaMemPool_t = std::ptr::null_mut();
    // SAFETY: `pool` is valid for writes.
    check(unsafe { sys::cudaDeviceGetMemPool(&mut pool, ordinal) }, || {
        format!("cudaDeviceGetMemPool on device {ordinal}")
    })?;
    Ok(pool)
}

/// `cudaDeviceGetDefaultMemPool`.
pub(crate) fn driver_default(ordinal: c_int) -> Result<sys::cudaMemPool_t> {
    let mut pool: sys::cudaMemPool_t = std::ptr::null_mut();
    // SAFETY: `pool` is valid for writes.
    let code = unsafe { sys::cudaDeviceGetDefaultMemPool(&mut pool, ordinal) };
    check(code, || format!("cudaDeviceGetDefaultMemPool on device {ordinal}"))?;
    Ok(pool)
}

/// `cudaDeviceSetMemPool`.
///
/// # Safety
/// `pool` is valid, and stays alive while it is current.
pub(crate) unsafe fn set_current(ordinal: c_int, pool: sys::cudaMemPool_t) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaDeviceSetMemPool(ordinal, pool) }, || format!("cudaDeviceSetMemPool on device {ordinal}"))
}

/// `cudaMemPoolGetAttribute` of an `int` attribute (the reuse policies).
///
/// # Safety
/// `pool` is valid; `attr` is one of the `int` attributes.
pub(crate) unsafe fn flag(pool: sys::cudaMemPool_t, attr: sys::cudaMemPoolAttr) -> Result<bool> {
    let mut value: c_int = 0;
    // SAFETY: the attribute is an `int` (the caller's word); `value` is valid for writes.
    let code = unsafe { sys::cudaMemPoolGetAttribute(pool, attr, (&raw mut value).cast::<c_void>()) };
    check(code, || format!("cudaMemPoolGetAttribute({})", attr.0))?;
    Ok(value != 0)
}

/// `cudaMemPoolSetAttribute` of an `int` attribute.
///
/// # Safety
/// As for [`flag`].
pub(crate) unsafe fn set_flag(pool: sys::cudaMemPool_t, attr: sys::cudaMemPoolAttr, enabled: bool) -> Result<()> {
    let mut value = c_int::from(enabled);
    // SAFETY: the attribute is an `int` (the caller's word); `value` is valid for reads.
    let code = unsafe { sys::cudaMemPoolSetAttribute(pool, attr, (&raw mut value).cast::<c_void>()) };
    check(code, || format!("cudaMemPoolSetAttribute({}, {enabled})", attr.0))
}

/// `cudaMemPoolGetAttribute` of a `cuuint64_t` attribute, as a byte count (saturating where
/// `usize` is narrower).
///
/// # Safety
/// `pool` is valid; `attr` is one of the `cuuint64_t` attributes.
pub(crate) unsafe fn bytes(pool: sys::cudaMemPool_t, attr: sys::cudaMemPoolAttr) -> Result<usize> {
    let mut value = 0u64;
    // SAFETY: the attribute is a `cuuint64_t` (the caller's word); `value` is valid for writes.
    let code = unsafe { sys::cudaMemPoolGetAttribute(pool, attr, (&raw mut value).cast::<c_void>()) };
    check(code, || format!("cudaMemPoolGetAttribute({})", attr.0))?;
    Ok(usize::try_from(value).unwrap_or(usize::MAX))
}

/// `cudaMemPoolSetAttribute` of a `cuuint64_t` attribute.
///
/// # Safety
/// As for [`bytes`].
pub(crate) unsafe fn set_bytes(pool: sys::cudaMemPool_t, attr: sys::cudaMemPoolAttr, value: usize) -> Result<()> {
    let mut value = value as u64;
    // SAFETY: the attribute is a `cuuint64_t` (the caller's word); `value` is valid for reads.
    let code = unsafe { sys::cudaMemPoolSetAttribute(pool, attr, (&raw mut value).cast::<c_void>()) };
    check(code, || format!("cudaMemPoolSetAttribute({}, {value})", attr.0))
}

/// `cudaMemPoolTrimTo`.
///
/// # Safety
/// `pool` is valid for the call.
pub(crate) unsafe fn trim_to(pool: sys::cudaMemPool_t, min_bytes_to_keep: usize) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaMemPoolTrimTo(pool, min_bytes_to_keep) }, || {
        format!("cudaMemPoolTrimTo({min_bytes_to_keep})")
    })
}

/// `cudaMemPoolSetAccess` for one device; `describe` names the request for the message.
///
/// # Safety
/// `pool` is valid for the call.
pub(crate) unsafe fn set_access(
    pool: sys::cudaMemPool_t,
    ordinal: c_int,
    flags: sys::cudaMemAccessFlags,
    describe: impl FnOnce() -> String,
) -> Result<()> {
    let desc = sys::cudaMemAccessDesc { location: device_location(ordinal), flags };
    // SAFETY: one valid descriptor; the caller vouches for the pool.
    check(unsafe { sys::cudaMemPoolSetAccess(pool, &desc, 1) }, || format!("cudaMemPoolSetAccess({})", describe()))
}

/// `cudaMemPoolGetAccess` for one device.
///
/// # Safety
/// `pool` is valid for the call.
pub(crate) unsafe fn access(pool: sys::cudaMemPool_t, ordinal: c_int) -> Result<sys::cudaMemAccessFlags> {
    let mut flags = sys::cudaMemAccessFlags::cudaMemAccessFlagsProtNone;
    let mut location = device_location(ordinal);
    // SAFETY: both pointers are valid; the caller vouches for the pool.
    check(unsafe { sys::cudaMemPoolGetAccess(&mut flags, pool, &mut location) }, || {
        format!("cudaMemPoolGetAccess(device {ordinal})")
    })?;
    Ok(flags)
}

/// `cudaMallocFromPoolAsync` of `bytes` (non-zero). Out-of-memory carries the device's figures; a
/// device without pools gets [`ErrorKind::Unsupported`]; `describe` says where, for the message.
///
/// # Safety
/// Both handles are valid for the call, and `stream` means the stream the caller orders on.
#[inline]
pub(crate) unsafe fn malloc_from_pool_async(
    bytes: usize,
    pool: sys::cudaMemPool_t,
    stream: sys::cudaStream_t,
    describe: impl Fn() -> String,
) -> Result<*mut c_void> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is valid for writes; the caller vouches for the handles.
    let code = unsafe { sys::cudaMallocFromPoolAsync(&mut ptr, bytes, pool, stream) };
    if code != sys::cudaError::cudaSuccess {
        return Err(pool_alloc_error(code, bytes, describe));
    }
    Ok(ptr)
}

#[cold]
#[inline(never)]
fn pool_alloc_error(code: sys::cudaError_t, bytes: usize, describe: impl Fn() -> String) -> CudaError {
    let operation = || format!("cudaMallocFromPoolAsync of {bytes} bytes {}", describe());
    if code == sys::cudaError::cudaErrorNotSupported {
        let _ = check(code, String::new); // clears the runtime's last-error slot
        let kind = ErrorKind::Unsupported("stream-ordered allocation (memoryPoolsSupported = 0)");
        return CudaError::new(kind, operation());
    }
    match check_alloc(code, bytes, operation) {
        Err(err) => err,
        Ok(()) => CudaError::new(ErrorKind::Runtime(crate::error::ErrorCode(code.0)), operation()),
    }
}

/// `cudaFreeAsync`: frees in stream order.
///
/// # Safety
/// `ptr` came from a stream-ordered allocation (or a pool import) and is freed once, ordered on
/// `stream` after every use; `stream` is valid for the call.
#[inline]
pub(crate) unsafe fn free_async(ptr: *mut c_void, stream: sys::cudaStream_t, bytes: usize) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaFreeAsync(ptr, stream) }, || format!("cudaFreeAsync of {bytes} bytes"))
}
