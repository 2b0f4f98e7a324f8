//! What the runtime knows of its error codes: the named constants of [`ErrorCode`], its names and
//! descriptions, and which codes are sticky.

use crate::error::ErrorCode;
use cuda_mem_sys as sys;
use std::borrow::Cow;
use std::ffi::CStr;

impl ErrorCode {
    /// `cudaErrorInvalidValue`
    pub const INVALID_VALUE: Self = Self(sys::cudaError::cudaErrorInvalidValue.0);
    /// `cudaErrorMemoryAllocation`
    pub const MEMORY_ALLOCATION: Self = Self(sys::cudaError::cudaErrorMemoryAllocation.0);
    /// `cudaErrorInsufficientDriver`: the installed driver is older than the runtime, or absent.
    pub const INSUFFICIENT_DRIVER: Self = Self(sys::cudaError::cudaErrorInsufficientDriver.0);
    /// `cudaErrorNoDevice`
    pub const NO_DEVICE: Self = Self(sys::cudaError::cudaErrorNoDevice.0);
    /// `cudaErrorInvalidDevice`
    pub const INVALID_DEVICE: Self = Self(sys::cudaError::cudaErrorInvalidDevice.0);
    /// `cudaErrorNotReady`: asynchronous work has not completed yet (not a failure for queries).
    pub const NOT_READY: Self = Self(sys::cudaError::cudaErrorNotReady.0);
    /// `cudaErrorNotSupported`
    pub const NOT_SUPPORTED: Self = Self(sys::cudaError::cudaErrorNotSupported.0);
    /// `cudaErrorHostMemoryAlreadyRegistered`
    pub const HOST_MEMORY_ALREADY_REGISTERED: Self = Self(sys::cudaError::cudaErrorHostMemoryAlreadyRegistered.0);
    /// `cudaErrorStreamCaptureUnsupported`: the operation is not allowed while a stream captures
    /// (a synchronize, a query, a blocking copy on a capturing stream).
    pub const STREAM_CAPTURE_UNSUPPORTED: Self = Self(sys::cudaError::cudaErrorStreamCaptureUnsupported.0);
    /// `cudaErrorStreamCaptureInvalidated`: an earlier error invalidated the capture.
    pub const STREAM_CAPTURE_INVALIDATED: Self = Self(sys::cudaError::cudaErrorStreamCaptureInvalidated.0);
    /// `cudaErrorCapturedEvent`: the event was last recorded in a capture, so it stands for a
    /// graph node, not for work queued on a stream.
    pub const CAPTURED_EVENT: Self = Self(sys::cudaError::cudaErrorCapturedEvent.0);
    /// `cudaErrorStreamCaptureImplicit`: work on the legacy stream while a capture in global or
    /// thread-local mode runs.
    pub const STREAM_CAPTURE_IMPLICIT: Self = Self(sys::cudaError::cudaErrorStreamCaptureImplicit.0);
    /// `cudaErrorGraphExecUpdateFailure`: the runtime refused to update an executable graph.
    pub const GRAPH_EXEC_UPDATE_FAILURE: Self = Self(sys::cudaError::cudaErrorGraphExecUpdateFailure.0);
    /// `cudaErrorIllegalAddress` (sticky)
    pub const ILLEGAL_ADDRESS: Self = Self(sys::cudaError::cudaErrorIllegalAddress.0);

    /// Codes after which the CUDA context is unusable: every later call fails, and the process
    /// must exit to recover (the runtime documentation's list for these codes).
    const STICKY: [sys::cudaError; 10] = [
        sys::cudaError::cudaErrorIllegalAddress,
        sys::cudaError::cudaErrorLaunchFailure,
        sys::cudaError::cudaErrorLaunchTimeout,
        sys::cudaError::cudaErrorAssert,
        sys::cudaError::cudaErrorHardwareStackError,
        sys::cudaError::cudaErrorIllegalInstruction,
        sys::cudaError::cudaErrorMisalignedAddress,
        sys::cudaError::cudaErrorInvalidAddressSpace,
        sys::cudaError::cudaErrorInvalidPc,
        sys::cudaError::cudaErrorECCUncorrectable,
    ];

    /// The symbol name, e.g. `cudaErrorMemoryAllocation` (from `cudaGetErrorName`).
    pub fn name(self) -> Cow<'static, str> {
        // SAFETY: cudaGetErrorName accepts any value and returns a static NUL-terminated string
        // (or "unrecognized error code"); it needs no driver.
        let ptr = unsafe { sys::cudaGetErrorName(sys::cudaError(self.0)) };
        static_str(ptr)
    }

    /// The runtime's description, e.g. "out of memory" (from `cudaGetErrorString`).
    pub fn description(self) -> Cow<'static, str> {
        // SAFETY: as for `name`: a static string for any input.
        let ptr = unsafe { sys::cudaGetErrorString(sys::cudaError(self.0)) };
        static_str(ptr)
    }

    /// True for errors that leave the context unusable (see the runtime's error documentation).
    pub fn is_sticky(self) -> bool {
        Self::STICKY.iter().any(|c| c.0 == self.0)
    }

    /// True when no usable driver or device exists (the path CI exercises).
    pub fn is_no_driver_or_device(self) -> bool {
        self == Self::INSUFFICIENT_DRIVER || self == Self::NO_DEVICE
    }
}

fn static_str(ptr: *const std::ffi::c_char) -> Cow<'static, str> {
    if ptr.is_null() {
        return Cow::Borrowed("unrecognized error code");
    }
    // SAFETY: the runtime returns pointers into its static string tables, valid for the process.
    let text: &'static CStr = unsafe { CStr::from_ptr(ptr) };
    text.to_string_lossy()
}
