//! Driver functions reached through the runtime (`cudaGetDriverEntryPointByVersion`), so the
//! crate links no driver library: the runtime finds the one the process uses.

use crate::error::{CudaError, ErrorKind, Result};
use crate::raw::check;
use cuda_mem_sys as sys;
use std::ffi::{CStr, c_void};

/// The CUDA version whose ABI of each entry point the callers spell out.
const ENTRY_POINT_VERSION: u32 = 12000;

/// The address of the driver function `symbol` (as of CUDA 12.0's ABI); callers transmute it to
/// the function's type and keep it (a `OnceLock`), as the lookup costs a call into the runtime.
pub(crate) fn entry_point(symbol: &'static CStr) -> Result<usize> {
    let mut function: *mut c_void = std::ptr::null_mut();
    let mut status = sys::cudaDriverEntryPointQueryResult::cudaDriverEntryPointSymbolNotFound;
    // SAFETY: the symbol is a NUL-terminated string; both out-pointers are valid for writes.
    let code = unsafe {
        sys::cudaGetDriverEntryPointByVersion(
            symbol.as_ptr(),
            &mut function,
            ENTRY_POINT_VERSION,
            sys::cudaGetDriverEntryPointFlags::cudaEnableDefault.0.into(),
            &mut status,
        )
    };
    let name = symbol.to_string_lossy();
    check(code, || format!("cudaGetDriverEntryPointByVersion({name})"))?;
    if status != sys::cudaDriverEntryPointQueryResult::cudaDriverEntryPointSuccess || function.is_null() {
        let kind = ErrorKind::Unsupported("the driver lacks a function cuda-mem needs");
        return Err(CudaError::new(kind, format!("looking up {name}")));
    }
    Ok(function as usize)
}
