//! CUDA graphs: stream capture, instantiation, launch, update, destruction, and the device's
//! graph-memory figures (`cudaDeviceGetGraphMemAttribute`, `cudaDeviceGraphMemTrim`).

use super::check;
use crate::error::Result;
use cuda_mem_sys as sys;
use std::ffi::{c_int, c_ulonglong, c_void};
use std::ptr::null_mut;

pub use sys::{
    cudaGraph_t, cudaGraphExec_t, cudaGraphExecUpdateResult, cudaGraphMemAttributeType, cudaStreamCaptureMode,
    cudaStreamCaptureStatus,
};

/// `cudaStreamBeginCapture`: work queued on `stream` from now on is recorded, not run.
///
/// # Safety
/// `stream` is a created (not built-in) stream handle, valid for the call.
pub(crate) unsafe fn begin_capture(stream: sys::cudaStream_t, mode: sys::cudaStreamCaptureMode) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaStreamBeginCapture(stream, mode) }, || format!("cudaStreamBeginCapture ({mode:?})"))
}

/// `cudaStreamEndCapture`: the captured graph. On failure the runtime may still return a graph
/// (an invalidated capture), which is handed back so the caller can destroy it.
///
/// # Safety
/// `stream` is valid for the call and capturing (begun by [`begin_capture`]).
pub(crate) unsafe fn end_capture(stream: sys::cudaStream_t) -> (Result<()>, sys::cudaGraph_t) {
    let mut graph: sys::cudaGraph_t = std::ptr::null_mut();
    // SAFETY: forwarded from the caller; `graph` is valid for writes.
    let code = unsafe { sys::cudaStreamEndCapture(stream, &mut graph) };
    (check(code, || "cudaStreamEndCapture".into()), graph)
}

/// `cudaStreamIsCapturing`.
///
/// # Safety
/// `stream` is valid for the call.
pub(crate) unsafe fn capture_status(stream: sys::cudaStream_t) -> Result<sys::cudaStreamCaptureStatus> {
    let mut status = sys::cudaStreamCaptureStatus::cudaStreamCaptureStatusNone;
    // SAFETY: forwarded from the caller; `status` is valid for writes.
    check(unsafe { sys::cudaStreamIsCapturing(stream, &mut status) }, || "cudaStreamIsCapturing".into())?;
    Ok(status)
}

/// `cudaStreamGetCaptureInfo`: the status and, while capturing, the capture's unique id. CUDA 13
/// declares it with edge data (`cudaStreamGetCaptureInfo_v3` of CUDA 12); only the status and
/// the id are asked for, so both versions call the same thing.
///
/// # Safety
/// `stream` is valid for the call.
pub(crate) unsafe fn capture_info(stream: sys::cudaStream_t) -> Result<(sys::cudaStreamCaptureStatus, u64)> {
    let mut status = sys::cudaStreamCaptureStatus::cudaStreamCaptureStatusNone;
    let mut id: c_ulonglong = 0;
    #[cfg(cuda_major = "13")]
    // SAFETY: forwarded from the caller; the outputs asked for are valid for writes, the others
    // are null (the documented way to skip them).
    let code = unsafe {
        sys::cudaStreamGetCaptureInfo(stream, &mut status, &mut id, null_mut(), null_mut(), null_mut(), null_mut())
    };
    #[cfg(cuda_major = "12")]
    // SAFETY: as above.
    let code = unsafe {
        sys::cudaStreamGetCaptureInfo_v3(stream, &mut status, &mut id, null_mut(), null_mut(), null_mut(), null_mut())
    };
    check(code, || "cudaStreamGetCaptureInfo".into())?;
    Ok((status, id))
}

/// `cudaGraphInstantiateWithFlags`.
///
/// # Safety
/// `graph` is a live graph handle.
pub(crate) unsafe fn instantiate(graph: sys::cudaGraph_t, flags: c_ulonglong) -> Result<sys::cudaGraphExec_t> {
    let mut exec: sys::cudaGraphExec_t = std::ptr::null_mut();
    // SAFETY: forwarded from the caller; `exec` is valid for writes.
    let code = unsafe { sys::cudaGraphInstantiateWithFlags(&mut exec, graph, flags) };
    check(code, || format!("cudaGraphInstantiateWithFlags (flags {flags:#x})"))?;
    Ok(exec)
}

/// `cudaGraphLaunch`: queues one run of `exec` on `stream`.
///
/// # Safety
/// Both handles are valid for the call, and everything the graph's nodes address stays valid
/// until the launch has completed.
#[inline]
pub(crate) unsafe fn launch(exec: sys::cudaGraphExec_t, stream: sys::cudaStream_t) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaGraphLaunch(exec, stream) }, || "cudaGraphLaunch".into())
}

/// `cudaGraphExecUpdate`: the runtime's verdict (`cudaGraphExecUpdateSuccess` or why not) and
/// the call's status. A refused update leaves `exec` as it was.
///
/// # Safety
/// Both handles are live; no launch of `exec` is being queued concurrently.
pub(crate) unsafe fn exec_update(
    exec: sys::cudaGraphExec_t,
    graph: sys::cudaGraph_t,
) -> (Result<()>, sys::cudaGraphExecUpdateResult) {
    let mut info = sys::cudaGraphExecUpdateResultInfo::default();
    // SAFETY: forwarded from the caller; `info` is valid for writes.
    let code = unsafe { sys::cudaGraphExecUpdate(exec, graph, &mut info) };
    (check(code, || "cudaGraphExecUpdate".into()), info.result)
}

/// `cudaGraphDestroy`.
///
/// # Safety
/// `graph` is live and not used after this call (executable graphs made from it stay valid).
pub(crate) unsafe fn destroy(graph: sys::cudaGraph_t) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaGraphDestroy(graph) }, || "cudaGraphDestroy".into())
}

/// `cudaGraphExecDestroy`. A launch still running completes; the runtime frees the executable
/// graph afterwards.
///
/// # Safety
/// `exec` is live and not used after this call.
pub(crate) unsafe fn exec_destroy(exec: sys::cudaGraphExec_t) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(unsafe { sys::cudaGraphExecDestroy(exec) }, || "cudaGraphExecDestroy".into())
}

/// `cudaDeviceGetGraphMemAttribute`: one of the device's graph-memory figures, in bytes.
pub(crate) fn graph_mem_attribute(ordinal: c_int, attribute: sys::cudaGraphMemAttributeType) -> Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: every graph-memory attribute is a 64-bit unsigned integer; `value` is valid for
    // writes of one.
    let code = unsafe { sys::cudaDeviceGetGraphMemAttribute(ordinal, attribute, (&raw mut value).cast::<c_void>()) };
    check(code, || format!("cudaDeviceGetGraphMemAttribute({attribute:?}) on device {ordinal}"))?;
    Ok(value)
}

/// `cudaDeviceSetGraphMemAttribute` with 0: resets a high watermark (the only value the runtime
/// accepts for the two `...High` attributes, the only settable ones).
pub(crate) fn reset_graph_mem_high(ordinal: c_int, attribute: sys::cudaGraphMemAttributeType) -> Result<()> {
    let mut zero: u64 = 0;
    // SAFETY: the value is a 64-bit unsigned integer, valid for reads during the call.
    let code = unsafe { sys::cudaDeviceSetGraphMemAttribute(ordinal, attribute, (&raw mut zero).cast::<c_void>()) };
    check(code, || format!("cudaDeviceSetGraphMemAttribute({attribute:?}, 0) on device {ordinal}"))
}

/// `cudaDeviceGraphMemTrim`: hands back to the system the graph memory no executable graph of
/// the device is using.
pub(crate) fn graph_mem_trim(ordinal: c_int) -> Result<()> {
    // SAFETY: plain value argument; the runtime validates the ordinal.
    check(unsafe { sys::cudaDeviceGraphMemTrim(ordinal) }, || format!("cudaDeviceGraphMemTrim on device {ordinal}"))
}

/// `cudaThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode, returning the
/// one it had. A thread in relaxed mode may make calls (`cudaMalloc`) that a capture in global or
/// thread-local mode refuses.
pub(crate) fn exchange_capture_mode(mode: sys::cudaStreamCaptureMode) -> Result<sys::cudaStreamCaptureMode> {
    let mut mode = mode;
    // SAFETY: `mode` is valid for reads and writes during the call.
    let code = unsafe { sys::cudaThreadExchangeStreamCaptureMode(&mut mode) };
    check(code, || "cudaThreadExchangeStreamCaptureMode".into())?;
    Ok(mode)
}

/// Runs `f` with the calling thread in relaxed capture mode, for calls that are no stream
/// operation (a pool's creation, a segment's `cudaMalloc`) but that a capture in global or
/// thread-local mode would refuse, as PyTorch's allocator does for its segments. Where the
/// thread's mode cannot be restored, `f`'s result goes to `undo` and the error is returned.
pub(crate) fn with_capture_relaxed<R>(f: impl FnOnce() -> Result<R>, undo: impl FnOnce(R)) -> Result<R> {
    let previous = exchange_capture_mode(sys::cudaStreamCaptureMode::cudaStreamCaptureModeRelaxed)?;
    let result = f();
    if let Err(err) = exchange_capture_mode(previous) {
        if let Ok(value) = result {
            undo(value);
        }
        return Err(err);
    }
    result
}
