//! The driver's record of which allocation an address belongs to (`cuMemGetAddressRange`),
//! reached through the runtime's driver entry points, so memory mapped from bytes another process
//! sent is never viewed beyond what the driver mapped.

use super::driver_entry::entry_point;
use crate::error::{CudaError, ErrorKind, Result};
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

/// `CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)`.
type GetAddressRange = unsafe extern "C" fn(*mut u64, *mut usize, u64) -> c_int;

fn get_address_range() -> Result<GetAddressRange> {
    static ENTRY: OnceLock<std::result::Result<usize, CudaError>> = OnceLock::new();
    match ENTRY.get_or_init(|| entry_point(c"cuMemGetAddressRange")) {
        // SAFETY: the driver returned this entry point for the signature of CUDA 12.0's ABI
        // (the `_v2` form, current since 3.2), which `GetAddressRange` spells out.
        Ok(function) => Ok(unsafe { std::mem::transmute::<usize, GetAddressRange>(*function) }),
        Err(err) => Err(err.clone()),
    }
}

/// Checks that `bytes` from `ptr` lie inside the allocation the driver mapped at `ptr`.
pub(crate) fn require_mapped(ptr: *const c_void, bytes: usize, operation: &'static str) -> Result<()> {
    let function = get_address_range()?;
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: both out-pointers are valid for writes; the address is only looked up.
    let result = unsafe { function(&mut base, &mut size, ptr as u64) };
    if result != 0 {
        let kind = ErrorKind::InvalidArgument("the driver knows no allocation at the mapped address");
        return Err(CudaError::new(kind, format!("{operation}: cuMemGetAddressRange returned {result}")));
    }
    let end = (base as usize).saturating_add(size);
    if (ptr as usize).saturating_add(bytes) > end {
        let kind = ErrorKind::InvalidArgument("the length in the received bytes exceeds the mapped allocation");
        let offset = (ptr as usize).saturating_sub(base as usize);
        return Err(CudaError::new(
            kind,
            format!("{operation} of {bytes} bytes at offset {offset} of a {size}-byte mapping"),
        ));
    }
    Ok(())
}
