//! Sharing device memory with other processes: pools exported as POSIX file descriptors with
//! their allocations (`cudaMemPoolExportToShareableHandle` / `cudaMemPoolExportPointer`), and the
//! legacy `cudaIpcGetMemHandle` / `cudaIpcOpenMemHandle`.
//!
//! Ownership across processes: an exported buffer is wrapped in an `Exported*` type that never
//! frees on drop (it leaks instead), because only the user knows when every importer is done;
//! freeing it is an `unsafe` call that states that. Imports are owning values whose views borrow
//! them, so a view cannot outlive its import.

use crate::device::Device;
use crate::device_buffer::DeviceBuffer;
use crate::error::{CudaError, ErrorKind, Result};
use crate::memory::DeviceMemory;
use crate::memory::sealed::{Owner, Residence, UnseenUsers};
use crate::pool::MemPool;
use crate::raw::{self, byte_len};
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Stream;
use crate::stream_buffer::StreamBuffer;
use bytemuck::Pod;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// Export data travels as this many bytes: the runtime's 64 bytes and the allocation's length.
pub const EXPORT_BYTES: usize = 72;

fn encode(opaque: &[u8; 64], bytes: usize) -> [u8; EXPORT_BYTES] {
    let mut out = [0u8; EXPORT_BYTES];
    out[..64].copy_from_slice(opaque);
    out[64..].copy_from_slice(&(bytes as u64).to_le_bytes());
    out
}

fn decode(data: &[u8; EXPORT_BYTES]) -> ([u8; 64], usize) {
    let mut opaque = [0u8; 64];
    opaque.copy_from_slice(&data[..64]);
    let bytes = u64::from_le_bytes(data[64..].try_into().expect("8 bytes"));
    (opaque, bytes as usize)
}

/// Elements of `T` in `bytes`, or an error when they do not divide.
fn elements<T>(bytes: usize, operation: &'static str) -> Result<usize> {
    let size = size_of::<T>().max(1);
    if !bytes.is_multiple_of(size) {
        let kind = ErrorKind::InvalidArgument("the exported size is not a whole number of elements");
        return Err(CudaError::new(kind, operation));
    }
    Ok(bytes / size)
}

/// Export data as bytes for another process: the runtime's 64 opaque bytes and the length.
macro_rules! export_data {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            data: [u8; EXPORT_BYTES],
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name)).field("bytes", &decode(&self.data).1).finish()
            }
        }

        impl $name {
            /// The bytes to send.
            pub fn to_bytes(&self) -> [u8; EXPORT_BYTES] {
                self.data
            }

            /// Rebuilds it from received bytes.
            pub fn from_bytes(data: [u8; EXPORT_BYTES]) -> Self {
                Self { data }
            }
        }
    };
}

export_data!(
    /// One allocation of an exported pool, described for another process (send the bytes from
    /// [`PoolPointerExport::to_bytes`] over any channel).
    PoolPointerExport
);
export_data!(
    /// A legacy IPC handle of a `cudaMalloc` allocation (`cudaIpcMemHandle_t` plus the length).
    IpcMemHandle
);

impl IpcMemHandle {
    /// Maps the allocation into this process (`cudaIpcOpenMemHandle`, with lazy peer access) on
    /// the current device. Must be called in another process than the exporter.
    pub fn open<T: Pod>(&self) -> Result<IpcMapping<T>> {
        let (opaque, bytes) = decode(&self.data);
        let len = elements::<T>(bytes, "cudaIpcOpenMemHandle")?;
        let device = Device::current()?;
        let raw = raw::ipc::open_mem_handle(opaque, bytes)?;
        // From here the mapping is closed on drop, also when the length below is refused.
        let mapping = IpcMapping { ptr: mapped_ptr(raw), len, mapped: true, device };
        raw::require_mapped(raw, bytes, "cudaIpcOpenMemHandle")?;
        Ok(mapping)
    }
}

impl MemPool {
    /// Exports the pool as a POSIX file descriptor (`cudaMemPoolExportToShareableHandle`). The
    /// pool must have been created with [`ShareableHandle::PosixFileDescriptor`](crate::ShareableHandle::PosixFileDescriptor). Pass the
    /// descriptor to another process (fork inheritance or `SCM_RIGHTS`).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        // SAFETY: the pool handle is valid while `self` lives.
        let fd = unsafe { raw::ipc::export_pool_fd(self.as_raw(), self.device().as_raw())? };
        // SAFETY: the runtime created this descriptor for us; we own it from here.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Imports a pool exported by another process (`cudaMemPoolImportFromShareableHandle`).
    /// `device` is the pool's device as this process numbers it. The pool is released when the
    /// last clone drops.
    pub fn import_fd(fd: BorrowedFd<'_>, device: Device) -> Result<MemPool> {
        // The borrow keeps the descriptor open for the call.
        let raw = raw::ipc::import_pool_fd(fd.as_raw_fd(), device.as_raw())?;
        Ok(MemPool::from_imported(raw, device))
    }

    /// Maps one allocation of this (imported) pool (`cudaMemPoolImportPointer`). The exporter
    /// must have finished allocating it before the import is used; the import releases its mapping
    /// on drop (`cudaFreeAsync` on the legacy stream, waited for), which must happen before the
    /// exporter frees the memory.
    pub fn import_pointer<T: Pod>(&self, export: &PoolPointerExport) -> Result<ImportedSlice<'_, T>> {
        let (opaque, bytes) = decode(&export.data);
        let len = elements::<T>(bytes, "cudaMemPoolImportPointer")?;
        // SAFETY: the pool handle is valid while `self` lives.
        let raw = unsafe { raw::ipc::import_pointer(self.as_raw(), opaque, bytes)? };
        // From here the import is released on drop, also when the length below is refused.
        let import =
            ImportedSlice { ptr: mapped_ptr(raw), len, mapped: true, device: self.device(), _pool: PhantomData };
        raw::require_mapped(raw, bytes, "cudaMemPoolImportPointer")?;
        Ok(import)
    }
}

/// Device memory of another process, mapped through an imported pool; views borrow it, and it
/// borrows the pool. The import of a pool that lives for good is an `ImportedSlice<'static, T>`,
/// which a [`Pending`](crate::Pending) can own like any device buffer:
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// # use cuda_mem::{Device, MemPool, PinnedBuffer, PoolPointerExport, Stream};
/// # use std::os::fd::BorrowedFd;
/// # let (fd, export): (BorrowedFd<'static>, PoolPointerExport) = todo!();
/// let stream = Stream::non_blocking()?;
/// let pool: &'static MemPool = Box::leak(Box::new(MemPool::import_fd(fd, Device::current()?)?));
/// let import = pool.import_pointer::<u32>(&export)?; // sized for 16 elements by the exporter
/// let host = PinnedBuffer::from_slice(&[7u32; 16], Default::default())?;
/// let (import, _host) = stream.upload(import, host)?.wait()?; // returns at once; wait gives both back
/// import.close()
/// # }
/// ```
pub struct ImportedSlice<'pool, T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    /// True until released: a zero-length import is a mapping too.
    mapped: bool,
    /// The imported pool's device.
    device: Device,
    _pool: PhantomData<&'pool MemPool>,
}

/// Device memory of another process, mapped with `cudaIpcOpenMemHandle`; closed on drop.
pub struct IpcMapping<T: Pod> {
    ptr: NonNull<T>,
    len: usize,
    /// True until closed.
    mapped: bool,
    /// The device current when the handle was opened, which the mapping belongs to.
    device: Device,
}

/// The runtime's address as the typed pointer views use (dangling only for the null address,
/// which the runtime does not return on success).
fn mapped_ptr<T>(raw: *mut std::ffi::c_void) -> NonNull<T> {
    NonNull::new(raw.cast()).unwrap_or(NonNull::dangling())
}

macro_rules! device_views {
    ($type:ident $(<$lt:lifetime>)?) => {
        // SAFETY: a mapping of another process's device memory, which the host never
        // dereferences. The thread it moves to may use it through views (scopes end before their
        // borrows) and release it; the mapping is process-wide, not tied to a thread or to the
        // current device.
        unsafe impl<$($lt,)? T: Pod> Send for $type<$($lt,)? T> {}
        // SAFETY: shared access only gives shared (read-only) views.
        unsafe impl<$($lt,)? T: Pod> Sync for $type<$($lt,)? T> {}

        impl<$($lt,)? T: Pod> fmt::Debug for $type<$($lt,)? T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($type)).field("ptr", &self.ptr).field("len", &self.len).field("device", &self.device).finish()
            }
        }

        impl<$($lt,)? T: Pod> $type<$($lt,)? T> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// True when empty.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// A shared view.
            pub fn as_slice(&self) -> DeviceSlice<'_, T> {
                // SAFETY: the mapping lives as long as `self`, which the view borrows.
                unsafe { DeviceSlice::from_raw_parts(self.ptr.as_ptr(), self.len) }
            }

            /// An exclusive view (exclusive within this process: the other process may still
            /// touch the memory; ordering across processes is the user's protocol).
            pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
                // SAFETY: as above, borrowed exclusively.
                unsafe { DeviceSliceMut::from_raw_parts(self.ptr.as_ptr(), self.len) }
            }
        }

        // Released without waiting for streams it does not know of, which may be any device's
        // (peer access).
        impl<$($lt,)? T: Pod> Owner for $type<$($lt,)? T> {
            fn residence(&self) -> Residence {
                Residence::Device
            }
            fn producer(&self) -> Option<&Stream> {
                None
            }
            fn unseen_users(&self) -> UnseenUsers {
                UnseenUsers::AnyDevice
            }
        }

        impl<$($lt,)? T: Pod> DeviceMemory for $type<$($lt,)? T> {
            forward_device_views!();

            fn device(&self) -> Device {
                self.device
            }
        }
    };
}

device_views!(ImportedSlice<'pool>);
device_views!(IpcMapping);

impl<T: Pod> ImportedSlice<'_, T> {
    /// Releases the import now (`cudaFreeAsync`, waited for) and reports the runtime's verdict
    /// (drop ignores it).
    /// The exporter may free the memory once every importer has done this.
    pub fn close(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        if !std::mem::replace(&mut self.mapped, false) {
            return Ok(());
        }
        let bytes = self.len * size_of::<T>();
        // Released in stream order on the legacy stream and waited for, rather than with
        // `cudaFree`: the same release, but compute-sanitizer's leak check only counts this form
        // (docs/repro/ipc_import_free.cu). No work can still use the memory here: views borrow
        // `self`, and scopes synchronize their stream before those borrows end.
        // SAFETY: imported with cudaMemPoolImportPointer and released once; nothing queued uses
        // it; the legacy stream handle is always valid.
        unsafe { raw::pools::free_async(self.ptr.as_ptr().cast(), std::ptr::null_mut(), bytes)? };
        // The release is complete when this returns, so the exporter may free the memory next.
        raw::streams::synchronize_legacy("releasing an import")
    }
}

impl<T: Pod> Drop for ImportedSlice<'_, T> {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

impl<T: Pod> Drop for IpcMapping<T> {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: opened with cudaIpcOpenMemHandle, closed once.
            raw::quiet(unsafe { raw::ipc::close_mem_handle(self.ptr.as_ptr().cast()) });
        }
    }
}

/// An owner whose memory other processes may be using: a [`StreamBuffer`] exported to processes
/// that imported its pool ([`StreamBuffer::export`]) or a [`DeviceBuffer`] shared through a legacy
/// IPC handle ([`DeviceBuffer::export_ipc`]). Dropping it leaks the memory (safe, but kept until
/// the process exits or the pool is destroyed); freeing it is the `unsafe`
/// [`Exported::free_after_importers`].
pub struct Exported<B: Exportable> {
    inner: ManuallyDrop<B>,
}

/// The owners [`Exported`] wraps: [`StreamBuffer`] and [`DeviceBuffer`]. Sealed.
pub trait Exportable: DeviceMemory + sealed_export::Free {}

mod sealed_export {
    /// How the wrapped owner frees now.
    pub trait Free {
        fn free_now(self) -> crate::Result<()>;
    }
}

impl<T: Pod> sealed_export::Free for StreamBuffer<'_, T> {
    fn free_now(self) -> Result<()> {
        self.free()
    }
}
impl<T: Pod> Exportable for StreamBuffer<'_, T> {}

impl<T: Pod> sealed_export::Free for DeviceBuffer<T> {
    fn free_now(self) -> Result<()> {
        self.free()
    }
}
impl<T: Pod> Exportable for DeviceBuffer<T> {}

/// [`Exported`] of a [`StreamBuffer`], under its name before 2026-12-07.
#[deprecated(since = "0.1.0", note = "use `Exported<StreamBuffer<'a, T>>`")]
pub type ExportedStreamBuffer<'a, T> = Exported<StreamBuffer<'a, T>>;
/// [`Exported`] of a [`DeviceBuffer`], under its name before 2026-12-07.
#[deprecated(since = "0.1.0", note = "use `Exported<DeviceBuffer<T>>`")]
pub type ExportedDeviceBuffer<T> = Exported<DeviceBuffer<T>>;

impl<B: Exportable + fmt::Debug> fmt::Debug for Exported<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exported").field("inner", &*self.inner).finish()
    }
}

impl<B: Exportable> Exported<B> {
    /// A shared view.
    pub fn as_slice(&self) -> DeviceSlice<'_, B::Elem> {
        self.inner.as_slice()
    }

    /// An exclusive view (within this process).
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, B::Elem> {
        self.inner.as_mut_slice()
    }

    /// The exported owner, for reading its properties (its stream, its device).
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Frees the memory: in stream order on its stream for a [`StreamBuffer`], with `cudaFree`
    /// for a [`DeviceBuffer`].
    ///
    /// # Safety
    /// Every process that imported the memory (or opened the handle) has dropped its import or
    /// closed the handle, and its work on the memory is complete; the runtime requires importers
    /// to let go first.
    pub unsafe fn free_after_importers(self) -> Result<()> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: taken once; `this` is never used again.
        let inner = unsafe { ManuallyDrop::take(&mut this.inner) };
        inner.free_now()
    }
}

impl<'a, T: Pod> StreamBuffer<'a, T> {
    /// Exports the buffer's memory for another process that imported its pool
    /// (`cudaMemPoolExportPointer`). The buffer must come from a pool created with
    /// [`ShareableHandle::PosixFileDescriptor`](crate::ShareableHandle::PosixFileDescriptor) and already exported with [`MemPool::export_fd`].
    pub fn export(self) -> Result<(Exported<StreamBuffer<'a, T>>, PoolPointerExport)> {
        let bytes = byte_len::<T>(self.len(), "cudaMemPoolExportPointer")?;
        // SAFETY: the pointer is the start of this live pool allocation of `bytes`.
        let opaque = unsafe { raw::ipc::export_pointer(self.as_slice().as_device_ptr().cast_mut().cast(), bytes)? };
        let export = PoolPointerExport { data: encode(&opaque, bytes) };
        Ok((Exported { inner: ManuallyDrop::new(self) }, export))
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// Exports the buffer through a legacy IPC handle (`cudaIpcGetMemHandle`).
    pub fn export_ipc(self) -> Result<(Exported<DeviceBuffer<T>>, IpcMemHandle)> {
        let bytes = byte_len::<T>(self.len(), "cudaIpcGetMemHandle")?;
        // SAFETY: the pointer is the start of this live cudaMalloc allocation of `bytes`.
        let opaque = unsafe { raw::ipc::get_mem_handle(self.as_slice().as_device_ptr().cast_mut().cast(), bytes)? };
        Ok((Exported { inner: ManuallyDrop::new(self) }, IpcMemHandle { data: encode(&opaque, bytes) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_data_round_trips_through_bytes_with_its_length() {
        let opaque: [u8; 64] = std::array::from_fn(|i| i as u8 * 3);
        let data = encode(&opaque, 16441);
        assert_eq!(decode(&data), (opaque, 16441));
        let export = PoolPointerExport::from_bytes(data);
        assert_eq!(PoolPointerExport::from_bytes(export.to_bytes()), export);
        assert_eq!(format!("{export:?}"), "PoolPointerExport { bytes: 16441 }");
        assert_eq!(elements::<u32>(16, "x").unwrap(), 4);
        assert!(matches!(elements::<u32>(15, "x").unwrap_err().kind(), ErrorKind::InvalidArgument(_)));
    }

    #[test]
    fn a_handle_with_a_ragged_length_is_refused_before_any_cuda_call() {
        let handle = IpcMemHandle::from_bytes(encode(&[0; 64], 10));
        assert!(matches!(handle.open::<u64>().unwrap_err().kind(), ErrorKind::InvalidArgument(_)));
    }
}
