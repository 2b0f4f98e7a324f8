//! Device memory (`cudaMalloc` / `cudaFree`) and the copies and memsets every family shares,
//! blocking and stream-ordered.

use super::{check, check_alloc};
use crate::error::Result;
use cuda_mem_sys as sys;
use std::ffi::c_void;
use std::fmt;

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

impl Direction {
    fn kind(self) -> sys::cudaMemcpyKind {
        match self {
            Self::HostToDevice => sys::cudaMemcpyKind::cudaMemcpyHostToDevice,
            Self::DeviceToHost => sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
            Self::DeviceToDevice => sys::cudaMemcpyKind::cudaMemcpyDeviceToDevice,
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::HostToDevice => "host to device",
            Self::DeviceToHost => "device to host",
            Self::DeviceToDevice => "device to device",
        })
    }
}

/// `cudaMalloc` of `bytes` (non-zero) on the current device (`ordinal`, for the message).
#[inline]
pub(crate) fn malloc(bytes: usize, ordinal: i32) -> Result<*mut c_void> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is valid for writes.
    let code = unsafe { sys::cudaMalloc(&mut ptr, bytes) };
    check_alloc(code, bytes, || format!("cudaMalloc of {bytes} bytes on device {ordinal}"))?;
    Ok(ptr)
}

/// `cudaFree` (also of managed memory). It waits for the device, so queued work that uses the
/// memory has finished first.
///
/// # Safety
/// `ptr` came from `cudaMalloc` or `cudaMallocManaged` and is freed once; nothing uses it after.
#[inline]
pub(crate) unsafe fn free(ptr: *mut c_void, describe: impl FnOnce() -> String) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaFree(ptr) }, || format!("cudaFree of {}", describe()))
}

/// Blocking `cudaMemcpy` of `bytes`.
///
/// # Safety
/// `src` is readable and `dst` writable for `bytes`, on the sides `direction` names, and nothing
/// else writes `dst` during the call.
pub(crate) unsafe fn copy(dst: *mut c_void, src: *const c_void, bytes: usize, direction: Direction) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemcpy(dst, src, bytes, direction.kind()) };
    check(code, || format!("cudaMemcpy of {bytes} bytes {direction}"))
}

/// Blocking `cudaMemcpy2D`: `height` rows of `width` bytes, rows `spitch` bytes apart at `src` and
/// `dpitch` bytes apart at `dst` (strided gathers and scatters: `width` one element).
///
/// # Safety
/// Each of the `height` rows is readable at `src + row * spitch` and writable at
/// `dst + row * dpitch` for `width` bytes, on the sides `direction` names, and nothing else
/// writes the destination rows during the call.
#[cfg(feature = "dlpack")] // only strided DLPack imports use it
pub(crate) unsafe fn copy_2d(
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    direction: Direction,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemcpy2D(dst, dpitch, src, spitch, width, height, direction.kind()) };
    check(code, || {
        format!("cudaMemcpy2D of {height} rows of {width} bytes {direction} (pitches {spitch} and {dpitch})")
    })
}

/// Blocking `cudaMemset` of `bytes` device bytes.
///
/// # Safety
/// `dst` is device-writable for `bytes`, and nothing else uses it during the call.
pub(crate) unsafe fn set(dst: *mut c_void, byte: u8, bytes: usize) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaMemset(dst, i32::from(byte), bytes) }, || format!("cudaMemset of {bytes} bytes"))
}

/// `cudaMemcpyAsync` of `bytes`, queued on `stream`; `what` names it for the message.
///
/// # Safety
/// Both ranges stay allocated, and untouched by anything but the stream, until the copy has
/// completed; `stream` is valid for the call.
#[inline]
pub(crate) unsafe fn copy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    direction: Direction,
    stream: sys::cudaStream_t,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemcpyAsync(dst, src, bytes, direction.kind(), stream) };
    check(code, || format!("cudaMemcpyAsync of {bytes} bytes {direction}"))
}

/// `cudaMemsetAsync` of `bytes` device bytes, queued on `stream`.
///
/// # Safety
/// `dst` is device-writable for `bytes` and stays allocated until the memset has completed;
/// `stream` is valid for the call.
#[inline]
pub(crate) unsafe fn set_async(dst: *mut c_void, byte: u8, bytes: usize, stream: sys::cudaStream_t) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemsetAsync(dst, i32::from(byte), bytes, stream) };
    check(code, || format!("cudaMemsetAsync of {bytes} bytes"))
}

/// What the runtime knows of an address (`cudaPointerGetAttributes`).
#[cfg(feature = "dlpack")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemoryType {
    /// Not allocated or registered through CUDA.
    Unregistered,
    /// Page-locked host memory; `host` is its host address when the runtime reports one.
    Host { device: i32, host: *mut c_void },
    /// Device memory of `device`.
    Device { device: i32 },
    /// Managed memory, allocated with `device` current.
    Managed { device: i32 },
}

/// `cudaPointerGetAttributes`.
#[cfg(feature = "dlpack")]
pub(crate) fn pointer_type(ptr: *const c_void) -> Result<MemoryType> {
    // SAFETY: a C struct of integers and pointers (and, in CUDA 13, reserved integers), for
    // which all-zero bytes are a valid value.
    let mut attributes: sys::cudaPointerAttributes = unsafe { std::mem::zeroed() };
    // SAFETY: `attributes` is valid for writes; the address is only looked up.
    check(unsafe { sys::cudaPointerGetAttributes(&mut attributes, ptr) }, || {
        format!("cudaPointerGetAttributes({ptr:p})")
    })?;
    let device = attributes.device;
    Ok(match attributes.type_ {
        sys::cudaMemoryType::cudaMemoryTypeHost => MemoryType::Host { device, host: attributes.hostPointer },
        sys::cudaMemoryType::cudaMemoryTypeDevice => MemoryType::Device { device },
        sys::cudaMemoryType::cudaMemoryTypeManaged => MemoryType::Managed { device },
        _ => MemoryType::Unregistered,
    })
}
