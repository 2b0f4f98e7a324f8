#![doc = include_str!("../README.md")]
#![no_std]
#![allow(
    // Names mirror the C headers.
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc,
    missing_debug_implementations,
    // bindgen derives PartialEq on structs that hold callbacks (cudaHostNodeParams).
    unpredictable_function_pointer_comparisons
)]

mod error;

#[cfg(cuda_bindgen)]
include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[cfg(all(not(cuda_bindgen), cuda_major = "13"))]
include!("bindings/cuda_13_0.rs");

#[cfg(all(not(cuda_bindgen), cuda_major = "12"))]
include!("bindings/cuda_12_9.rs");

/// The CUDA 12 headers rename these to `_v2` with `#define`; bindgen sees only the new names, so
/// the documented names are restored here (CUDA 13 declares them under their plain names).
#[cfg(all(not(cuda_bindgen), cuda_major = "12"))]
pub use self::{
    cudaGetDeviceProperties_v2 as cudaGetDeviceProperties,
    cudaSignalExternalSemaphoresAsync_v2 as cudaSignalExternalSemaphoresAsync,
    cudaStreamGetCaptureInfo_v2 as cudaStreamGetCaptureInfo,
    cudaWaitExternalSemaphoresAsync_v2 as cudaWaitExternalSemaphoresAsync,
};

/// `cudaCpuDeviceId` is `((int)-1)` in the headers, a cast bindgen does not evaluate.
pub const cudaCpuDeviceId: core::ffi::c_int = -1;
/// `cudaInvalidDeviceId` is `((int)-2)` in the headers.
pub const cudaInvalidDeviceId: core::ffi::c_int = -2;

/// The CUDA major version these bindings were selected for (12 or 13).
#[cfg(cuda_major = "13")]
pub const CUDA_MAJOR: u32 = 13;
/// The CUDA major version these bindings were selected for (12 or 13).
#[cfg(cuda_major = "12")]
pub const CUDA_MAJOR: u32 = 12;
