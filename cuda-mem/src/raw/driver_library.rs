//! Whether the NVIDIA driver's library can be loaded at all. The runtime reports a missing driver
//! and a driver older than itself with the same code (`cudaErrorInsufficientDriver`, or
//! `cudaErrorNoDevice`); trying to load `libcuda.so.1` the way the runtime does tells them apart.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// The driver's library, as the runtime loads it.
pub(crate) const DRIVER_LIBRARY: &CStr = c"libcuda.so.1";

const RTLD_LAZY: c_int = 0x1;

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlclose(handle: *mut c_void) -> c_int;
}

/// True when `libcuda.so.1` loads in this process (probed once; the answer is kept).
pub(crate) fn driver_loadable() -> bool {
    static LOADABLE: OnceLock<bool> = OnceLock::new();
    *LOADABLE.get_or_init(|| {
        // SAFETY: a NUL-terminated name and a valid flag; loading the driver's library runs its
        // initializers, as the runtime itself does at its first call.
        let handle = unsafe { dlopen(DRIVER_LIBRARY.as_ptr(), RTLD_LAZY) };
        if handle.is_null() {
            return false;
        }
        // SAFETY: a handle dlopen returned, closed once. The runtime holds its own reference,
        // so this only drops ours.
        unsafe { dlclose(handle) };
        true
    })
}
