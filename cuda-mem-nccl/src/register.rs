//! Buffer registration (`ncclCommRegister`, NCCL 2.19 and later): the communicator prepares a
//! buffer once (IPC mappings for its peers inside a host, network registration across hosts)
//! instead of at every collective. A [`Registered`] owns its buffer, so the memory cannot be
//! freed while NCCL holds the registration: dropping deregisters first, and a forgotten one leaks
//! the buffer with it.

use crate::communicator::Communicator;
use crate::raw;
use crate::status::invalid;
use cuda_mem::launch::CurrentDevice;
use cuda_mem::{CudaError, DeviceMemory, DeviceSlice, DeviceSliceMut, Result};
use std::ffi::c_void;
use std::fmt;
use std::mem::ManuallyDrop;

/// The bound [`Communicator::register`] had before 2026-12-07: now any
/// [`DeviceMemory`](cuda_mem::DeviceMemory), whose address does not change while it moves and
/// which frees only in its own drop.
#[deprecated(since = "0.1.0", note = "use `cuda_mem::DeviceMemory`")]
pub trait Registrable: DeviceMemory {}
#[allow(deprecated)]
impl<B: DeviceMemory> Registrable for B {}

/// A buffer registered with a communicator (from [`Communicator::register`]). Use its views in
/// collectives as any other; dropping it deregisters, then frees the buffer.
pub struct Registered<'c, B: DeviceMemory> {
    buffer: ManuallyDrop<B>,
    /// Null for an empty buffer (nothing registered).
    handle: *mut c_void,
    comm: &'c Communicator,
}

/// Why [`Communicator::register`] failed, with the buffer handed back (not registered). `?`
/// turns it into the [`CudaError`], dropping the buffer.
pub struct RegisterError<B> {
    /// What failed.
    pub error: CudaError,
    /// The buffer, as it was.
    pub buffer: B,
}

impl<B> fmt::Debug for RegisterError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisterError").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<B> From<RegisterError<B>> for CudaError {
    fn from(failed: RegisterError<B>) -> Self {
        failed.error
    }
}

impl<B: DeviceMemory> fmt::Debug for Registered<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered")
            .field("ptr", &self.buffer.as_slice().as_device_ptr())
            .field("len", &self.buffer.as_slice().len())
            .field("comm", self.comm)
            .finish()
    }
}

impl Communicator {
    /// Whether the loaded NCCL can register buffers (`ncclCommRegister`, NCCL 2.19 and later).
    pub fn can_register() -> bool {
        raw::can_register()
    }

    /// Registers `buffer`, which must live on this communicator's device, with this
    /// communicator (`ncclCommRegister`). Collectives on the buffer's views then skip the
    /// per-call setup NCCL would otherwise do. Fails, handing the buffer back, where NCCL lacks
    /// registration ([`ErrorKind::Library`](cuda_mem::ErrorKind::Library) without a code) or
    /// refuses it.
    pub fn register<B: DeviceMemory>(&self, buffer: B) -> Result<Registered<'_, B>, RegisterError<B>> {
        let view = buffer.as_slice();
        let (ptr, bytes) = (view.as_device_ptr().cast_mut().cast::<c_void>(), view.size_bytes());
        if buffer.device() != self.device() {
            let operation =
                format!("ncclCommRegister of memory of {} with a communicator of {}", buffer.device(), self.device());
            let error = invalid("the buffer lives on another device than the communicator", operation);
            return Err(RegisterError { error, buffer });
        }
        let handle = if bytes == 0 {
            std::ptr::null_mut()
        } else {
            let registered = CurrentDevice::set(self.device()).and_then(|_device| {
                // SAFETY: a live communicator used by this thread only (`!Sync`); `ptr` addresses
                // `bytes` of the buffer's memory, which `Registered` keeps allocated until it has
                // deregistered (or forever, if forgotten).
                unsafe { raw::comm_register(self.as_raw(), ptr, bytes) }
            });
            match registered {
                Ok(handle) => handle,
                Err(error) => return Err(RegisterError { error, buffer }),
            }
        };
        Ok(Registered { buffer: ManuallyDrop::new(buffer), handle, comm: self })
    }
}

impl<'c, B: DeviceMemory> Registered<'c, B> {
    /// A shared view of the buffer.
    pub fn as_slice(&self) -> DeviceSlice<'_, B::Elem> {
        self.buffer.as_slice()
    }

    /// An exclusive view of the buffer.
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, B::Elem> {
        self.buffer.as_mut_slice()
    }

    /// The buffer, for reading its properties (its stream, its device).
    pub fn buffer(&self) -> &B {
        &self.buffer
    }

    /// The communicator it is registered with.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// Deregisters and hands the buffer back. If NCCL fails to deregister, the buffer is leaked
    /// (never freed: NCCL may still hold it) and the error returned.
    pub fn deregister(mut self) -> Result<B> {
        let deregistered = self.deregister_now();
        // Nothing left for the drop to do: the handle is null and the buffer is taken or leaked.
        let this = ManuallyDrop::new(self);
        deregistered?;
        // SAFETY: `this` is never used or dropped again, so the buffer is moved out once.
        Ok(unsafe { std::ptr::read(&*this.buffer) })
    }

    fn deregister_now(&mut self) -> Result<()> {
        let handle = std::mem::replace(&mut self.handle, std::ptr::null_mut());
        if handle.is_null() {
            return Ok(());
        }
        let _device = CurrentDevice::set(self.comm.device()).ok();
        // SAFETY: the handle came from `comm_register` on this live communicator (borrowed for
        // 'c), deregistered once (the field is now null); `!Sync`: used by this thread only.
        unsafe { raw::comm_deregister(self.comm.as_raw(), handle) }
    }
}

impl<B: DeviceMemory> Drop for Registered<'_, B> {
    fn drop(&mut self) {
        if self.deregister_now().is_ok() {
            // SAFETY: dropped once, here; NCCL no longer holds the memory.
            unsafe { ManuallyDrop::drop(&mut self.buffer) };
        }
        // Else the buffer leaks: NCCL may still use its memory.
    }
}
