//! `RegisteredHost<'a, T>`: ordinary host memory page-locked in place with `cudaHostRegister`,
//! unregistered on drop.

use crate::error::{CudaError, ErrorKind, Result};
use crate::raw::host::mapped_device_ptr;
use crate::raw::host_flags::HostRegisterFlags;
use crate::raw::{self, byte_len};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use bytemuck::Pod;
use std::ops::{Deref, DerefMut};

/// A borrowed host slice, registered (page-locked) with the driver for as long as this value
/// lives. Registering is slow (figures in docs/choosing-an-allocator.md): do it once for long-lived
/// buffers, not per copy.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{HostRegisterFlags, RegisteredHost};
/// let mut data = vec![0u64; 1 << 20];
/// let registered = RegisteredHost::new(&mut data, HostRegisterFlags::PORTABLE)?;
/// assert_eq!(registered.len(), 1 << 20);
/// drop(registered); // cudaHostUnregister
/// data[0] = 1;
/// # Ok(()) }
/// ```
pub struct RegisteredHost<'a, T: Pod> {
    slice: &'a mut [T],
    flags: HostRegisterFlags,
}

impl<T: Pod> std::fmt::Debug for RegisteredHost<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredHost")
            .field("ptr", &self.slice.as_ptr())
            .field("len", &self.slice.len())
            .field("flags", &self.flags)
            .finish()
    }
}

impl<'a, T: Pod> RegisteredHost<'a, T> {
    /// Registers `slice` (`cudaHostRegister`). An empty slice is accepted without a CUDA call.
    /// Registering memory that is already registered fails with
    /// `cudaErrorHostMemoryAlreadyRegistered`.
    pub fn new(slice: &'a mut [T], flags: HostRegisterFlags) -> Result<Self> {
        let bytes = byte_len::<T>(slice.len(), "cudaHostRegister")?;
        if bytes != 0 {
            // SAFETY: the slice is valid for `bytes` and stays borrowed (so allocated and unmoved)
            // until drop unregisters it.
            unsafe { raw::host::register(slice.as_mut_ptr().cast(), bytes, flags)? };
        }
        Ok(Self { slice, flags })
    }

    /// The flags it was registered with.
    pub fn flags(&self) -> HostRegisterFlags {
        self.flags
    }

    /// The device's view of the memory; needs [`HostRegisterFlags::MAPPED`].
    pub fn device_view(&self) -> Result<DeviceSlice<'_, T>> {
        let ptr = self.mapped_ptr()?;
        // SAFETY: the view borrows `self`; host writes need `&mut self`.
        Ok(unsafe { DeviceSlice::from_raw_parts(ptr, self.slice.len()) })
    }

    /// The device's exclusive view; needs MAPPED and not READ_ONLY.
    pub fn device_view_mut(&mut self) -> Result<DeviceSliceMut<'_, T>> {
        if self.flags.contains(HostRegisterFlags::READ_ONLY) {
            let kind = ErrorKind::InvalidArgument("memory registered READ_ONLY cannot be written by the device");
            return Err(CudaError::new(kind, "RegisteredHost::device_view_mut"));
        }
        let ptr = self.mapped_ptr()?;
        // SAFETY: the view borrows `self` exclusively.
        Ok(unsafe { DeviceSliceMut::from_raw_parts(ptr, self.slice.len()) })
    }

    fn mapped_ptr(&self) -> Result<*mut T> {
        let mapped = self.flags.contains(HostRegisterFlags::MAPPED);
        mapped_device_ptr(mapped, self.slice.as_ptr().cast_mut(), self.slice.len())
    }

    /// Unregisters now, reporting the runtime's verdict, and gives the slice back. On failure the
    /// registration comes back inside the error, still owned (`?` turns it into a [`CudaError`],
    /// and dropping it tries to unregister once more), so a failed attempt never frees the slice
    /// for reuse while it is still registered without saying so.
    pub fn unregister(mut self) -> std::result::Result<&'a mut [T], UnregisterError<'a, T>> {
        match self.release() {
            Ok(()) => {
                let mut this = std::mem::ManuallyDrop::new(self);
                Ok(std::mem::take(&mut this.slice))
            }
            Err(error) => Err(UnregisterError { host: self, error }),
        }
    }

    fn release(&mut self) -> Result<()> {
        if size_of_val(self.slice) == 0 {
            return Ok(());
        }
        // SAFETY: the pointer is the one registered in `new`.
        unsafe { raw::host::unregister(self.slice.as_mut_ptr().cast()) }
    }
}

/// A failed [`RegisteredHost::unregister`]: the error, and the registration, still in place.
pub struct UnregisterError<'a, T: Pod> {
    /// The registration, to retry or drop.
    pub host: RegisteredHost<'a, T>,
    /// What `cudaHostUnregister` returned.
    pub error: CudaError,
}

impl<T: Pod> std::fmt::Debug for UnregisterError<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnregisterError").field("host", &self.host).field("error", &self.error).finish()
    }
}

impl<T: Pod> std::fmt::Display for UnregisterError<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<T: Pod> std::error::Error for UnregisterError<'_, T> {}

impl<T: Pod> From<UnregisterError<'_, T>> for CudaError {
    /// Keeps the error; the registration is dropped, which tries to unregister once more.
    fn from(failed: UnregisterError<'_, T>) -> Self {
        failed.error
    }
}

impl<T: Pod> Deref for RegisteredHost<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

impl<T: Pod> DerefMut for RegisteredHost<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.slice
    }
}

impl<T: Pod> Drop for RegisteredHost<'_, T> {
    fn drop(&mut self) {
        raw::quiet(self.release());
    }
}
