//! `ManagedBuffer<T>`: unified memory from `cudaMallocManaged`, with advice and prefetch.
//!
//! The rule cuda-mem enforces for host access: GPU work that touches a managed buffer is queued
//! only through a [`StreamScope`](crate::StreamScope), which waits for its stream before its
//! borrows end. So whenever safe code can reach `host()`/`host_mut()`, no GPU work that uses this
//! buffer is in flight. On devices without `concurrentManagedAccess` the CPU may not touch any
//! managed memory while *any* kernel runs, which no borrow can rule out, so there
//! `host()`/`host_mut()` refuse with [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported):
//! use the blocking copies of the device views instead. Prefetch and advice never change the
//! data, so they need no scope.

use crate::device::{CurrentDevice, Device};
use crate::error::{CudaError, ErrorKind, Result};
use crate::memory::DeviceMemory;
use crate::memory::sealed::{Owner, Residence, UnseenUsers};
use crate::raw::managed::Place;
use crate::raw::{self, byte_len};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Stream;
use bytemuck::Pod;
use std::ptr::NonNull;

/// Where managed pages should live or be moved to.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, Location, ManagedBuffer, Stream};
/// let data = ManagedBuffer::<u8>::zeroed(1 << 20)?;
/// let stream = Stream::new()?;
/// data.prefetch(Location::Device(Device::current()?), &stream)?;
/// data.prefetch(Location::Host, &stream)?;
/// stream.synchronize()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// A device's memory.
    Device(Device),
    /// Host memory (the CUDA 12 `cudaCpuDeviceId`).
    Host,
}

/// Usage hints for managed memory (`cudaMemAdvise`).
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Advice, Device, Location, ManagedBuffer};
/// let table = ManagedBuffer::<u32>::zeroed(1 << 20)?;
/// table.advise(Advice::SetReadMostly)?;
/// table.advise(Advice::SetAccessedBy(Location::Device(Device::current()?)))?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Advice {
    /// Mostly read: devices that read it get read-only copies.
    SetReadMostly,
    /// Undo [`Advice::SetReadMostly`].
    UnsetReadMostly,
    /// Prefer to keep the pages at this location.
    SetPreferredLocation(Location),
    /// Undo [`Advice::SetPreferredLocation`].
    UnsetPreferredLocation,
    /// This location accesses the pages: keep them mapped there to avoid faults.
    SetAccessedBy(Location),
    /// Undo [`Advice::SetAccessedBy`] for this location.
    UnsetAccessedBy(Location),
}

/// Which streams may access new managed memory (`cudaMemAttachGlobal` / `cudaMemAttachHost`).
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Attach, ManagedBuffer};
/// let host_only = ManagedBuffer::<u8>::zeroed_attached(4096, Attach::Host)?;
/// assert_eq!(host_only.host()?.len(), 4096);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Attach {
    /// Any stream on any device.
    #[default]
    Global,
    /// Host only, until attached to a stream.
    Host,
}

/// `len` elements of managed (unified) memory, reachable from the host and from devices,
/// migrated on demand. Freed on drop with `cudaFree`.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Advice, Device, Location, ManagedBuffer, Stream};
/// let device = Device::current()?;
/// let stream = Stream::non_blocking()?;
/// let mut data = ManagedBuffer::<f32>::zeroed(1 << 20)?;
/// data.host_mut()?.fill(1.0); // written by the CPU
/// data.advise(Advice::SetPreferredLocation(Location::Device(device)))?;
/// data.prefetch(Location::Device(device), &stream)?; // the documented fix for first-touch faults
/// stream.scope(|s| s.set_bytes(&mut data.as_mut_slice(), 0))??;
/// assert!(data.host()?.iter().all(|&x| x == 0.0));
/// # Ok(()) }
/// ```
pub struct ManagedBuffer<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    device: Device,
    concurrent_access: bool,
}

// SAFETY: the buffer owns its memory like `Vec<T>` (T: Pod is Send). The thread it moves to may
// read and write it on the host (only where the device has concurrentManagedAccess), through views
// on any stream (scopes end before their borrows), and free it with its device made current.
unsafe impl<T: Pod> Send for ManagedBuffer<T> {}
// SAFETY: shared access gives `&[T]` or read-only device views only, which other threads may read.
unsafe impl<T: Pod> Sync for ManagedBuffer<T> {}

debug_fields!(ManagedBuffer: ptr, len, device);

impl<T: Pod> ManagedBuffer<T> {
    /// Allocates `len` zeroed elements attached globally (`cudaMallocManaged`). Zeroing writes
    /// every page (on the host where the device allows concurrent access, else with a blocking
    /// `cudaMemset`), so each page is populated before this returns. For data larger than the GPU
    /// that you fill yourself, [`ManagedBuffer::uninit`] leaves the pages untouched.
    pub fn zeroed(len: usize) -> Result<Self> {
        Self::zeroed_attached(len, Attach::Global)
    }

    /// Allocates `len` zeroed elements with the given attachment (see [`ManagedBuffer::zeroed`]).
    pub fn zeroed_attached(len: usize, attach: Attach) -> Result<Self> {
        // SAFETY: every byte is zeroed below before the buffer is handed out.
        let mut buffer = unsafe { Self::uninit_attached(len, attach)? };
        let bytes = buffer.len * size_of::<T>();
        if bytes != 0 {
            if buffer.concurrent_access {
                // SAFETY: fresh allocation of `len` elements; nothing on the GPU uses it yet, and
                // the device lets the host touch managed memory while kernels run.
                unsafe { std::ptr::write_bytes(buffer.ptr.as_ptr(), 0, buffer.len) };
            } else {
                let _device = CurrentDevice::set(buffer.device)?;
                buffer.as_mut_slice().set_bytes(0)?;
            }
        }
        Ok(buffer)
    }

    /// Allocates `len` elements attached globally without touching a page: nothing is populated
    /// until first use, on the host or a GPU.
    ///
    /// # Safety
    /// The contents are unspecified until written; the caller must write every element before
    /// reading it.
    pub unsafe fn uninit(len: usize) -> Result<Self> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::uninit_attached(len, Attach::Global) }
    }

    /// [`ManagedBuffer::uninit`] with the given attachment.
    ///
    /// # Safety
    /// As for [`ManagedBuffer::uninit`].
    pub unsafe fn uninit_attached(len: usize, attach: Attach) -> Result<Self> {
        let device = Device::current()?;
        let bytes = byte_len::<T>(len, "cudaMallocManaged")?;
        let concurrent_access = device.concurrent_managed_access()?;
        if bytes == 0 {
            return Ok(Self { ptr: NonNull::dangling(), len, device, concurrent_access });
        }
        let fresh = raw::managed::alloc(bytes, attach == Attach::Global, device.as_raw())?;
        // SAFETY: allocated just now, never used.
        let ptr = raw::typed::<T>(fresh, "cudaMallocManaged", |p| unsafe {
            raw::memory::free(p, || "a misaligned allocation".into())
        })?;
        Ok(Self { ptr, len, device, concurrent_access })
    }

    /// Allocates a copy of `src` (written by the CPU where the device allows concurrent access,
    /// else copied with a blocking `cudaMemcpy`).
    pub fn from_slice(src: &[T]) -> Result<Self> {
        // SAFETY: every element is written below before the buffer is handed out.
        let mut buffer = unsafe { Self::uninit(src.len())? };
        if buffer.concurrent_access {
            buffer.host_mut()?.copy_from_slice(src);
        } else {
            buffer.as_mut_slice().copy_from_host(src)?;
        }
        Ok(buffer)
    }

    element_count!();

    /// The device that was current at allocation (the memory's preferred home until advised).
    pub fn device(&self) -> Device {
        self.device
    }

    host_views!();

    fn before_host_access(&self) -> Result<()> {
        if self.size_bytes() == 0 {
            return Ok(());
        }
        require_concurrent_access(self.concurrent_access)
    }

    /// A device view, for scopes and kernels (the host's views are `host` and `host_mut`).
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        // SAFETY: borrowed from `self`, so allocated and not written by the host meanwhile.
        unsafe { DeviceSlice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// An exclusive device view.
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
        // SAFETY: borrowed exclusively from `self`.
        unsafe { DeviceSliceMut::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// [`as_slice`](Self::as_slice) under its name before 2026-12-03.
    #[deprecated(since = "0.1.0", note = "use `as_slice`, the device view's name on every owner")]
    pub fn as_device_slice(&self) -> DeviceSlice<'_, T> {
        self.as_slice()
    }

    /// [`as_mut_slice`](Self::as_mut_slice) under its name before 2026-12-03.
    #[deprecated(since = "0.1.0", note = "use `as_mut_slice`, the device view's name on every owner")]
    pub fn as_device_slice_mut(&mut self) -> DeviceSliceMut<'_, T> {
        self.as_mut_slice()
    }

    /// Gives the driver a usage hint for the whole buffer (`cudaMemAdvise`).
    pub fn advise(&self, advice: Advice) -> Result<()> {
        let bytes = self.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        let (raw_advice, location) = advice_parts(advice, self.device);
        // SAFETY: the range is this live managed allocation.
        unsafe {
            raw::managed::advise(self.ptr.as_ptr().cast(), bytes, raw_advice, location.place(), || {
                format!("{advice:?}")
            })
        }
    }

    /// Queues migration of the whole buffer to `to` on `stream` (`cudaMemPrefetchAsync`). The
    /// data does not change, so no scope is needed; the buffer stays borrowed only for the call
    /// because freeing (`cudaFree`) waits for the device.
    pub fn prefetch(&self, to: Location, stream: &Stream) -> Result<()> {
        let bytes = self.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        let call = stream.call()?;
        // SAFETY: the range is this live managed allocation; `call` checked the stream handle.
        unsafe { raw::managed::prefetch_async(self.ptr.as_ptr().cast(), bytes, to.place(), call.as_raw()) }
    }

    /// Frees now and reports the runtime's verdict (drop ignores it).
    pub fn free(self) -> Result<()> {
        std::mem::ManuallyDrop::new(self).release()
    }

    fn release(&self) -> Result<()> {
        if self.size_bytes() == 0 {
            return Ok(());
        }
        let _guard = CurrentDevice::set(self.device)?;
        // SAFETY: allocated by cudaMallocManaged, freed once; cudaFree waits for the device.
        unsafe { raw::memory::free(self.ptr.as_ptr().cast(), || "managed memory".into()) }
    }
}

impl<T: Pod> Drop for ManagedBuffer<T> {
    fn drop(&mut self) {
        raw::quiet(self.release());
    }
}

/// Host access to managed memory needs `concurrentManagedAccess`: without it the CPU faults on
/// managed memory while any kernel of the device runs, which no borrow can rule out.
pub(crate) fn require_concurrent_access(concurrent_managed_access: bool) -> Result<()> {
    if concurrent_managed_access {
        return Ok(());
    }
    Err(CudaError::new(
        ErrorKind::Unsupported("host access to managed memory without concurrentManagedAccess"),
        "ManagedBuffer host access (use the device views' blocking copies instead)",
    ))
}

impl Location {
    fn place(self) -> Place {
        match self {
            Location::Device(device) => Place::Device(device.as_raw()),
            Location::Host => Place::Host,
        }
    }
}

fn advice_parts(advice: Advice, own_device: Device) -> (raw::cudaMemoryAdvise, Location) {
    use raw::cudaMemoryAdvise as A;
    match advice {
        // ReadMostly ignores the location; pass the buffer's device.
        Advice::SetReadMostly => (A::cudaMemAdviseSetReadMostly, Location::Device(own_device)),
        Advice::UnsetReadMostly => (A::cudaMemAdviseUnsetReadMostly, Location::Device(own_device)),
        Advice::SetPreferredLocation(at) => (A::cudaMemAdviseSetPreferredLocation, at),
        Advice::UnsetPreferredLocation => (A::cudaMemAdviseUnsetPreferredLocation, Location::Device(own_device)),
        Advice::SetAccessedBy(by) => (A::cudaMemAdviseSetAccessedBy, by),
        Advice::UnsetAccessedBy(by) => (A::cudaMemAdviseUnsetAccessedBy, by),
    }
}

// `cudaFree` waits for the device.
impl<T: Pod> Owner for ManagedBuffer<T> {
    fn residence(&self) -> Residence {
        Residence::Managed
    }
    fn producer(&self) -> Option<&crate::stream::Stream> {
        None
    }
    fn unseen_users(&self) -> UnseenUsers {
        UnseenUsers::FreeWaits
    }
}

impl<T: Pod> DeviceMemory for ManagedBuffer<T> {
    forward_device_views!();

    fn device(&self) -> Device {
        self.device
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_access_needs_concurrent_managed_access() {
        assert!(require_concurrent_access(true).is_ok());
        let err = require_concurrent_access(false).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::Unsupported("host access to managed memory without concurrentManagedAccess")
        );
    }

    #[test]
    fn advice_maps_to_the_runtime_enumerators() {
        let own = Device::new_unchecked_for_tests(0);
        let other = Device::new_unchecked_for_tests(1);
        assert_eq!(advice_parts(Advice::SetReadMostly, own).0, raw::cudaMemoryAdvise::cudaMemAdviseSetReadMostly);
        assert_eq!(
            advice_parts(Advice::SetAccessedBy(Location::Device(other)), own),
            (raw::cudaMemoryAdvise::cudaMemAdviseSetAccessedBy, Location::Device(other))
        );
        assert_eq!(
            advice_parts(Advice::SetPreferredLocation(Location::Host), own),
            (raw::cudaMemoryAdvise::cudaMemAdviseSetPreferredLocation, Location::Host)
        );
        assert_eq!(advice_parts(Advice::UnsetPreferredLocation, own).0.0, 4);
    }
}
