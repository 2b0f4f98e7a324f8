//! Peer access between devices and copies between them.

use super::check;
use crate::error::Result;
use cuda_mem_sys as sys;
use std::ffi::{c_int, c_void};

/// `cudaDeviceCanAccessPeer`.
pub(crate) fn can_access(device: c_int, peer: c_int) -> Result<bool> {
    let mut can = 0;
    // SAFETY: `can` is valid for writes.
    check(unsafe { sys::cudaDeviceCanAccessPeer(&mut can, device, peer) }, || {
        format!("cudaDeviceCanAccessPeer(device {device}, device {peer})")
    })?;
    Ok(can != 0)
}

/// `cudaDeviceEnablePeerAccess` from the current device (`device`, for the message); enabling
/// twice is not an error.
pub(crate) fn enable(device: c_int, peer: c_int) -> Result<()> {
    // SAFETY: plain arguments; the runtime validates the peer.
    let code = unsafe { sys::cudaDeviceEnablePeerAccess(peer, 0) };
    if code == sys::cudaError::cudaErrorPeerAccessAlreadyEnabled {
        let _ = check(code, String::new); // clears the last-error slot
        return Ok(());
    }
    check(code, || format!("cudaDeviceEnablePeerAccess from device {device} to device {peer}"))
}

/// `cudaDeviceDisablePeerAccess` from the current device (`device`, for the message).
pub(crate) fn disable(device: c_int, peer: c_int) -> Result<()> {
    // SAFETY: plain argument.
    check(unsafe { sys::cudaDeviceDisablePeerAccess(peer) }, || {
        format!("cudaDeviceDisablePeerAccess from device {device} to device {peer}")
    })
}

/// `cudaMemcpyPeerAsync` of `bytes` from `src` on `src_device` to `dst` on `dst_device`.
///
/// # Safety
/// Both ranges lie in live memory of the named devices and stay allocated, and untouched by
/// anything but the stream, until the copy has completed; `stream` is valid for the call.
pub(crate) unsafe fn copy_async(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    bytes: usize,
    stream: sys::cudaStream_t,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream) };
    check(code, || format!("cudaMemcpyPeerAsync of {bytes} bytes from device {src_device} to device {dst_device}"))
}
