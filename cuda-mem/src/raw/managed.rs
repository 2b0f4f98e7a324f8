//! Managed (unified) memory: `cudaMallocManaged`, `cudaMemAdvise`, `cudaMemPrefetchAsync`.

use super::{check, check_alloc};
use crate::error::Result;
use cuda_mem_sys as sys;
use std::ffi::{c_int, c_void};

/// Where managed memory is advised to live or migrates to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Device(c_int),
    Host,
}

/// CUDA 13 takes a `cudaMemLocation`.
#[cfg(cuda_major = "13")]
fn mem_location(place: Place) -> sys::cudaMemLocation {
    match place {
        Place::Device(ordinal) => super::pools::device_location(ordinal),
        Place::Host => sys::cudaMemLocation { type_: sys::cudaMemLocationType::cudaMemLocationTypeHost, id: 0 },
    }
}

/// CUDA 12 takes a device ordinal, with `cudaCpuDeviceId` for the host.
#[cfg(cuda_major = "12")]
fn device_id(place: Place) -> c_int {
    match place {
        Place::Device(ordinal) => ordinal,
        Place::Host => sys::cudaCpuDeviceId,
    }
}

/// `cudaMallocManaged` of `bytes` (non-zero), attached globally or to the host.
pub(crate) fn alloc(bytes: usize, attach_global: bool, ordinal: c_int) -> Result<*mut c_void> {
    let flags = if attach_global { sys::cudaMemAttachGlobal } else { sys::cudaMemAttachHost };
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is valid for writes; flags are the documented constants.
    let code = unsafe { sys::cudaMallocManaged(&mut ptr, bytes, flags) };
    check_alloc(code, bytes, || format!("cudaMallocManaged of {bytes} bytes on device {ordinal}"))?;
    Ok(ptr)
}

/// `cudaMemAdvise` over `bytes`; `describe` names the advice for the message.
///
/// # Safety
/// `ptr..ptr+bytes` lies in one live managed allocation.
pub(crate) unsafe fn advise(
    ptr: *const c_void,
    bytes: usize,
    advice: sys::cudaMemoryAdvise,
    at: Place,
    describe: impl FnOnce() -> String,
) -> Result<()> {
    #[cfg(cuda_major = "13")]
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemAdvise(ptr, bytes, advice, mem_location(at)) };
    #[cfg(cuda_major = "12")]
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemAdvise(ptr, bytes, advice, device_id(at)) };
    check(code, || format!("cudaMemAdvise({}) over {bytes} bytes", describe()))
}

/// `cudaMemPrefetchAsync` of `bytes` to `to`, queued on `stream`.
///
/// # Safety
/// `ptr..ptr+bytes` lies in one live managed allocation; `stream` is valid for the call.
pub(crate) unsafe fn prefetch_async(
    ptr: *const c_void,
    bytes: usize,
    to: Place,
    stream: sys::cudaStream_t,
) -> Result<()> {
    #[cfg(cuda_major = "13")]
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemPrefetchAsync(ptr, bytes, mem_location(to), 0, stream) };
    #[cfg(cuda_major = "12")]
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemPrefetchAsync(ptr, bytes, device_id(to), stream) };
    check(code, || format!("cudaMemPrefetchAsync of {bytes} bytes to {to:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(cuda_major = "13")]
    fn places_encode_as_cuda_13_mem_locations() {
        let loc = mem_location(Place::Device(3));
        assert_eq!((loc.type_, loc.id), (sys::cudaMemLocationType::cudaMemLocationTypeDevice, 3));
        let host = mem_location(Place::Host);
        assert_eq!(host.type_, sys::cudaMemLocationType::cudaMemLocationTypeHost);
    }

    #[test]
    #[cfg(cuda_major = "12")]
    fn places_encode_as_cuda_12_device_ids() {
        assert_eq!(device_id(Place::Device(3)), 3);
        assert_eq!(device_id(Place::Host), sys::cudaCpuDeviceId);
    }
}
