//! Devices: enumeration, the current device, attributes, properties, memory figures, versions.

use super::check;
use crate::error::Result;
use cuda_mem_sys as sys;
use std::ffi::c_int;
use std::fmt;

/// `cudaGetDeviceCount`.
pub(crate) fn count() -> Result<c_int> {
    let mut count: c_int = 0;
    // SAFETY: `count` is valid for writes.
    check(unsafe { sys::cudaGetDeviceCount(&mut count) }, || "cudaGetDeviceCount".into())?;
    Ok(count)
}

/// `cudaGetDevice`: the calling thread's current device.
#[inline]
pub(crate) fn current() -> Result<c_int> {
    let mut ordinal: c_int = 0;
    // SAFETY: `ordinal` is valid for writes.
    check(unsafe { sys::cudaGetDevice(&mut ordinal) }, || "cudaGetDevice".into())?;
    Ok(ordinal)
}

/// `cudaSetDevice`.
pub(crate) fn set_current(ordinal: c_int) -> Result<()> {
    // SAFETY: plain value argument; the runtime validates the ordinal.
    check(unsafe { sys::cudaSetDevice(ordinal) }, || format!("cudaSetDevice({ordinal})"))
}

/// `cudaDeviceGetAttribute`; `name` is the attribute as the message shows it.
pub(crate) fn attribute(attribute: sys::cudaDeviceAttr, name: impl fmt::Debug, ordinal: c_int) -> Result<i32> {
    let mut value: c_int = 0;
    // SAFETY: `value` is valid for writes; the attribute is a known enumerator.
    let code = unsafe { sys::cudaDeviceGetAttribute(&mut value, attribute, ordinal) };
    check(code, || format!("cudaDeviceGetAttribute({name:?}) on device {ordinal}"))?;
    Ok(value)
}

/// `cudaGetDeviceProperties`.
pub(crate) fn properties(ordinal: c_int) -> Result<sys::cudaDeviceProp> {
    let mut props = sys::cudaDeviceProp::default();
    // SAFETY: `props` is valid for writes of one cudaDeviceProp.
    let code = unsafe { sys::cudaGetDeviceProperties(&mut props, ordinal) };
    check(code, || format!("cudaGetDeviceProperties on device {ordinal}"))?;
    Ok(props)
}

/// `cudaMemGetInfo`: free and total bytes of the current device.
pub(crate) fn mem_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are valid for writes.
    check(unsafe { sys::cudaMemGetInfo(&mut free, &mut total) }, || "cudaMemGetInfo".into())?;
    Ok((free, total))
}

/// `cudaDeviceSynchronize` of the current device (`ordinal`, for the message).
pub(crate) fn synchronize(ordinal: c_int) -> Result<()> {
    // SAFETY: no arguments.
    check(unsafe { sys::cudaDeviceSynchronize() }, || format!("cudaDeviceSynchronize on device {ordinal}"))
}

/// `cudaDeviceGetStreamPriorityRange`: (least, greatest).
pub(crate) fn stream_priority_range() -> Result<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: both out-pointers are valid for writes.
    let code = unsafe { sys::cudaDeviceGetStreamPriorityRange(&mut least, &mut greatest) };
    check(code, || "cudaDeviceGetStreamPriorityRange".into())?;
    Ok((least, greatest))
}

/// `cudaDriverGetVersion` (0 without a driver).
pub(crate) fn driver_version() -> Result<c_int> {
    let mut version: c_int = 0;
    // SAFETY: `version` is valid for writes.
    check(unsafe { sys::cudaDriverGetVersion(&mut version) }, || "cudaDriverGetVersion".into())?;
    Ok(version)
}

/// `cudaRuntimeGetVersion`.
pub(crate) fn runtime_version() -> Result<c_int> {
    let mut version: c_int = 0;
    // SAFETY: `version` is valid for writes.
    check(unsafe { sys::cudaRuntimeGetVersion(&mut version) }, || "cudaRuntimeGetVersion".into())?;
    Ok(version)
}
