//! Streams: creation, destruction, synchronization, queries, waits on events.

use super::check;
use crate::error::Result;
use cuda_mem_sys as sys;

/// `cudaStreamCreateWithPriority`, non-blocking (`cudaStreamNonBlocking`) or not.
pub(crate) fn create(non_blocking: bool, priority: i32, ordinal: i32) -> Result<sys::cudaStream_t> {
    let flags = if non_blocking { sys::cudaStreamNonBlocking } else { sys::cudaStreamDefault };
    let mut stream: sys::cudaStream_t = std::ptr::null_mut();
    // SAFETY: `stream` is valid for writes; flags are the documented constants.
    let code = unsafe { sys::cudaStreamCreateWithPriority(&mut stream, flags, priority) };
    check(code, || format!("cudaStreamCreateWithPriority on device {ordinal}"))?;
    Ok(stream)
}

/// `cudaStreamDestroy`. Queued work still completes.
///
/// # Safety
/// `stream` was created by [`create`] and is not used after this call.
pub(crate) unsafe fn destroy(stream: sys::cudaStream_t) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaStreamDestroy(stream) }, || "cudaStreamDestroy".into())
}

/// `cudaStreamSynchronize`; `after` names what is waited for.
///
/// # Safety
/// `stream` is a valid handle (or a built-in one) for the call.
#[inline]
pub(crate) unsafe fn synchronize(stream: sys::cudaStream_t, after: impl FnOnce() -> String) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaStreamSynchronize(stream) }, after)
}

/// Waits for the legacy default stream, where the blocking `cudaMemcpy`/`cudaMemset` run.
pub(crate) fn synchronize_legacy(after: &'static str) -> Result<()> {
    // SAFETY: the null handle names the legacy default stream, which always exists.
    unsafe { synchronize(std::ptr::null_mut(), || format!("waiting for {after}")) }
}

/// `cudaStreamQuery`: true when all queued work has completed.
///
/// # Safety
/// `stream` is a valid handle for the call.
pub(crate) unsafe fn is_idle(stream: sys::cudaStream_t) -> Result<bool> {
    // SAFETY: forwarded from the caller.
    let code = unsafe { sys::cudaStreamQuery(stream) };
    if code == sys::cudaError::cudaErrorNotReady {
        return Ok(false);
    }
    check(code, || "cudaStreamQuery".into()).map(|()| true)
}

/// `cudaStreamGetDevice`: the ordinal of the device `stream` belongs to.
///
/// # Safety
/// `stream` is a valid handle for the call.
pub(crate) unsafe fn device_of(stream: sys::cudaStream_t) -> Result<i32> {
    let mut device = -1;
    // SAFETY: `device` is valid for writes; the handle per the caller.
    check(unsafe { sys::cudaStreamGetDevice(stream, &mut device) }, || format!("cudaStreamGetDevice({stream:p})"))?;
    Ok(device)
}

/// `cudaStreamWaitEvent`: later work on `stream` waits for `event`.
///
/// # Safety
/// Both handles are valid for the call.
pub(crate) unsafe fn wait_event(stream: sys::cudaStream_t, event: sys::cudaEvent_t) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaStreamWaitEvent(stream, event, 0) }, || "cudaStreamWaitEvent".into())
}

/// The callback type of [`launch_host_func`]: called once, on a thread the runtime owns, with the
/// `data` pointer it was launched with. It must not call the CUDA API.
pub(crate) type HostFn = unsafe extern "C" fn(data: *mut std::ffi::c_void);

/// `cudaLaunchHostFunc`: `callback(data)` runs on a runtime thread once the work queued on
/// `stream` so far has completed; later work on the stream waits for it to return. The runtime
/// does not call it once the context has failed.
///
/// # Safety
/// `stream` is a valid handle for the call; `callback` makes no CUDA call and may be called with
/// `data` on another thread at any time from now on (so `data` stays valid until it runs, or for
/// ever if it never does).
pub(crate) unsafe fn launch_host_func(
    stream: sys::cudaStream_t,
    callback: HostFn,
    data: *mut std::ffi::c_void,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaLaunchHostFunc(stream, Some(callback), data) }, || "cudaLaunchHostFunc".into())
}
