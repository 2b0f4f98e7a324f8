//! `PinnedBuffer<T>`: page-locked host memory from `cudaMallocHost` / `cudaHostAlloc`, always
//! freed with `cudaFreeHost` (the source document's `cudaHostFree` does not exist).

use crate::error::Result;
use crate::raw::host_flags::HostAllocFlags;
use crate::raw::{self, byte_len};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use bytemuck::Pod;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// `len` elements of page-locked host memory: the source and destination that lets copies run
/// asynchronously at full PCIe speed. Dereferences to `[T]`.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{HostAllocFlags, PinnedBuffer};
/// let mut staging = PinnedBuffer::<u8>::zeroed(1 << 20)?; // cudaMallocHost
/// staging[..5].copy_from_slice(b"hello");
/// let mut mapped = PinnedBuffer::<u32>::zeroed_with_flags(256, HostAllocFlags::MAPPED | HostAllocFlags::PORTABLE)?;
/// let mut device_view = mapped.device_view_mut()?; // zero-copy: kernels read host memory directly
/// # let _ = device_view;
/// # Ok(()) }
/// ```
///
/// A device view cannot outlive its buffer:
///
/// ```compile_fail,E0597
/// # use cuda_mem::{HostAllocFlags, PinnedBuffer};
/// let view = {
///     let buffer = PinnedBuffer::<u32>::zeroed_with_flags(4, HostAllocFlags::MAPPED).unwrap();
///     buffer.device_view().unwrap()
/// }; // error: `buffer` does not live long enough
/// # let _ = view;
/// ```
pub struct PinnedBuffer<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    flags: HostAllocFlags,
}

// SAFETY: the buffer owns its memory exclusively, like `Vec<T>` (T: Pod is Send). The thread it
// moves to may read and write it on the host, lend it to scopes (which end before their borrows),
// and free it: `cudaFreeHost` works from any thread, whatever device is current.
unsafe impl<T: Pod> Send for PinnedBuffer<T> {}
// SAFETY: shared access only gives `&[T]` and read-only device views, like `&Vec<T>`.
unsafe impl<T: Pod> Sync for PinnedBuffer<T> {}

debug_fields!(PinnedBuffer: ptr, len, flags);

impl<T: Pod> PinnedBuffer<T> {
    /// Allocates without initialising: `cudaMallocHost` when `flags` is empty, else
    /// `cudaHostAlloc(flags)`.
    ///
    /// # Safety
    /// The memory is uninitialised host memory: the caller must write every element (through the
    /// returned buffer's `DerefMut`, a device copy or a memset) before reading any.
    pub unsafe fn uninit(len: usize, flags: HostAllocFlags) -> Result<Self> {
        let bytes = byte_len::<T>(len, "cudaHostAlloc")?;
        if bytes == 0 {
            return Ok(Self { ptr: NonNull::dangling(), len, flags });
        }
        let fresh = raw::host::alloc(bytes, flags)?;
        // SAFETY: allocated just now, never used.
        let ptr = raw::typed::<T>(fresh, "cudaHostAlloc", |p| unsafe { raw::host::free(p, bytes) })?;
        Ok(Self { ptr, len, flags })
    }

    /// Allocates `len` zeroed elements with `cudaMallocHost`.
    pub fn zeroed(len: usize) -> Result<Self> {
        Self::zeroed_with_flags(len, HostAllocFlags::empty())
    }

    /// Allocates `len` zeroed elements with `cudaHostAlloc(flags)`.
    pub fn zeroed_with_flags(len: usize, flags: HostAllocFlags) -> Result<Self> {
        // SAFETY: the bytes are zeroed before the buffer is handed out; all-zero is a valid Pod.
        let buffer = unsafe { Self::uninit(len, flags)? };
        if buffer.len * size_of::<T>() != 0 {
            // SAFETY: the allocation holds exactly `len * size_of::<T>()` writable bytes.
            unsafe { std::ptr::write_bytes(buffer.ptr.as_ptr(), 0, buffer.len) };
        }
        Ok(buffer)
    }

    /// Allocates a copy of `src` with `cudaHostAlloc(flags)` (`cudaMallocHost` if empty).
    pub fn from_slice(src: &[T], flags: HostAllocFlags) -> Result<Self> {
        // SAFETY: every element is written by the copy before the buffer is handed out.
        let mut buffer = unsafe { Self::uninit(src.len(), flags)? };
        if buffer.len * size_of::<T>() != 0 {
            // SAFETY: both ranges hold `len` elements and do not overlap (fresh allocation).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buffer.ptr.as_ptr(), src.len()) };
        }
        buffer.len = src.len();
        Ok(buffer)
    }

    /// The flags it was allocated with.
    pub fn flags(&self) -> HostAllocFlags {
        self.flags
    }

    mapped_host_views!();

    fn mapped_parts(&self) -> (bool, *mut T, usize) {
        (self.flags.contains(HostAllocFlags::MAPPED), self.ptr.as_ptr(), self.len)
    }

    /// Frees now (`cudaFreeHost`) and reports the runtime's verdict (drop ignores it).
    pub fn free(self) -> Result<()> {
        std::mem::ManuallyDrop::new(self).release()
    }

    fn release(&self) -> Result<()> {
        if self.len * size_of::<T>() == 0 {
            return Ok(());
        }
        // SAFETY: the pointer came from cudaMallocHost/cudaHostAlloc and is freed once.
        unsafe { raw::host::free(self.ptr.as_ptr().cast(), self.len * size_of::<T>()) }
    }
}

impl<T: Pod> Deref for PinnedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised elements (constructors guarantee it) live at `ptr` while `self` does.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Pod> DerefMut for PinnedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

crate::memory::pinned_host_memory!(PinnedBuffer);

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        raw::quiet(self.release());
    }
}
