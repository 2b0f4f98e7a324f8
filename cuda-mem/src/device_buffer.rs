//! `DeviceBuffer<T>`: device memory from `cudaMalloc`, freed with `cudaFree`.

use crate::device::{CurrentDevice, Device};
use crate::error::Result;
use crate::memory::DeviceMemory;
use crate::memory::sealed::{Owner, Residence, UnseenUsers};
use crate::raw::{self, byte_len};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use bytemuck::Pod;
use std::ptr::NonNull;

/// `len` elements of `T` in device memory (`cudaMalloc`), freed on drop (`cudaFree`).
///
/// A zero-length buffer (or one of a zero-sized `T`) makes no CUDA call and owns nothing, like an
/// empty `Vec`. `cudaFree` waits for the device, so work that used the buffer has ended when it
/// returns.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::DeviceBuffer;
/// let weights = DeviceBuffer::from_slice(&[0.5f32; 1024])?;
/// let mut copy = DeviceBuffer::<f32>::zeroed(1024)?;
/// copy.as_mut_slice().copy_from_device(weights.as_slice())?;
/// assert_eq!(copy.to_vec()?, vec![0.5; 1024]);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    device: Device,
}

// SAFETY: the buffer owns device memory of `device` that the host never dereferences. The thread
// it moves to may copy into and out of it, lend it to scopes on any stream (which end before their
// borrows), and free it: `release` makes `device` current for `cudaFree`, whatever that thread's
// current device is.
unsafe impl<T: Pod> Send for DeviceBuffer<T> {}
// SAFETY: `&DeviceBuffer` only gives shared views (reads), like `&Vec<T>`.
unsafe impl<T: Pod> Sync for DeviceBuffer<T> {}

debug_fields!(DeviceBuffer: ptr, len, device);

impl<T: Pod> DeviceBuffer<T> {
    /// Allocates `len` elements on the current device without initialising them.
    ///
    /// # Safety
    /// The contents are whatever the device memory held before (possibly data this process freed
    /// earlier). The caller must write every element before reading it back as meaningful data.
    pub unsafe fn uninit(len: usize) -> Result<Self> {
        let device = Device::current()?;
        let bytes = byte_len::<T>(len, "cudaMalloc")?;
        if bytes == 0 {
            return Ok(Self { ptr: NonNull::dangling(), len, device });
        }
        let fresh = raw::memory::malloc(bytes, device.as_raw())?;
        // SAFETY: allocated just now, never used.
        let ptr = raw::typed::<T>(fresh, "cudaMalloc", |p| unsafe {
            raw::memory::free(p, || "a misaligned allocation".into())
        })?;
        Ok(Self { ptr, len, device })
    }

    /// Allocates `len` elements on the current device without initialising them, as
    /// [`DeviceBuffer::uninit`], also while the calling thread captures a stream in global or
    /// thread-local mode (which refuses `cudaMalloc`): the thread's capture mode is relaxed for
    /// the call, as PyTorch's allocator does for its graphs' memory. The allocation is no stream
    /// operation and no graph records it; its `cudaFree` (the drop) is refused during such a
    /// capture, so drop it after.
    ///
    /// # Safety
    /// As [`DeviceBuffer::uninit`].
    pub unsafe fn uninit_relaxed(len: usize) -> Result<Self> {
        raw::graphs::with_capture_relaxed(
            // SAFETY: forwarded from the caller.
            || unsafe { Self::uninit(len) },
            drop,
        )
    }

    /// Allocates `len` zeroed elements on the current device.
    pub fn zeroed(len: usize) -> Result<Self> {
        // SAFETY: every byte is written by the memset below before anyone can read it.
        let mut buffer = unsafe { Self::uninit(len)? };
        buffer.as_mut_slice().set_bytes(0)?;
        Ok(buffer)
    }

    /// Allocates a copy of `src` on the current device.
    pub fn from_slice(src: &[T]) -> Result<Self> {
        // SAFETY: the copy below writes every element.
        let mut buffer = unsafe { Self::uninit(src.len())? };
        buffer.as_mut_slice().copy_from_host(src)?;
        Ok(buffer)
    }

    element_count!();

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A shared view of the whole buffer.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        // SAFETY: the view borrows `self`, so the memory stays allocated and unwritten meanwhile.
        unsafe { DeviceSlice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// An exclusive view of the whole buffer.
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
        // SAFETY: the view borrows `self` exclusively.
        unsafe { DeviceSliceMut::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Copies the whole buffer into a new `Vec` (blocking).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_slice().to_vec()
    }

    /// Frees the memory now and reports the runtime's verdict (drop ignores it).
    pub fn free(self) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        this.release()
    }

    fn release(&self) -> Result<()> {
        if self.size_bytes() == 0 {
            return Ok(());
        }
        // Memory is freed with its device current; under unified addressing any device would do,
        // but this keeps multi-GPU programs correct without relying on that.
        let _guard = CurrentDevice::set(self.device)?;
        // SAFETY: the pointer came from cudaMalloc and is freed once (drop and free are exclusive).
        unsafe {
            raw::memory::free(self.ptr.as_ptr().cast(), || format!("{} bytes on {}", self.size_bytes(), self.device))
        }
    }
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // Errors here mean a broken context; there is nothing better to do than leak.
        raw::quiet(self.release());
    }
}

// `cudaFree` waits for the device.
impl<T: Pod> Owner for DeviceBuffer<T> {
    fn residence(&self) -> Residence {
        Residence::Device
    }
    fn producer(&self) -> Option<&crate::stream::Stream> {
        None
    }
    fn unseen_users(&self) -> UnseenUsers {
        UnseenUsers::FreeWaits
    }
}

impl<T: Pod> DeviceMemory for DeviceBuffer<T> {
    forward_device_views!();

    fn device(&self) -> Device {
        self.device
    }
}
