//! The buffers a [`Pending`](crate::Pending) can own and lend to the GPU by value: host buffers
//! ([`OwnedHost`]) and device buffers ([`OwnedDevice`]). Sealed: each implementation owns its
//! memory outright, keeps it at a fixed address while moved, and frees it only in its own drop.

use crate::device_buffer::DeviceBuffer;
use crate::device_cache::CachedBuffer;
use crate::error::Result;
use crate::ipc::{ImportedSlice, IpcMapping};
use crate::managed::ManagedBuffer;
use crate::pinned::PinnedBuffer;
use crate::pinned_pool::PooledPinned;
use crate::resource::ResourceBuffer;
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream_buffer::StreamBuffer;
use bytemuck::Pod;

pub(crate) mod sealed {
    use super::*;

    /// Host memory by value. `PINNED` says whether DMA can use it directly.
    pub trait Host<T> {
        const PINNED: bool;
        fn host(&self) -> &[T];
        fn host_mut(&mut self) -> &mut [T];
    }

    /// Device memory by value. A view fails only for a [`ResourceBuffer`] of pinned host
    /// memory, which has none.
    pub trait Device<T> {
        fn view(&self) -> Result<DeviceSlice<'_, T>>;
        fn view_mut(&mut self) -> Result<DeviceSliceMut<'_, T>>;
    }
}

/// A host buffer a [`Pending`](crate::Pending) can own while a copy reads or writes it:
/// [`PinnedBuffer`] and [`PooledPinned`] (page-locked: the DMA uses them directly) and `Vec<T>`
/// (pageable: staged through pinned memory, see [`Stream::upload`](crate::Stream::upload)).
pub trait OwnedHost<T: Pod>: sealed::Host<T> + Send + 'static {}

/// A device buffer a [`Pending`](crate::Pending) can own while work on it runs: [`DeviceBuffer`],
/// [`ManagedBuffer`], and the stream-ordered owners when they own or borrow for good what they
/// name: a [`StreamBuffer<'static, T>`](StreamBuffer) (made from `stream.clone()`), a
/// [`CachedBuffer<'static, T>`](CachedBuffer) (from a `&'static` cache, such as
/// [`DeviceCache::for_device`](crate::DeviceCache::for_device)'s, and an owned stream) and a
/// [`ResourceBuffer<'static, T>`](ResourceBuffer) (an owned resource and stream; its device
/// views, so not pinned host memory); and another process's memory mapped here, an
/// [`IpcMapping`] or an [`ImportedSlice<'static, T>`](ImportedSlice) (of a pool that lives for
/// good), whose ordering with the other process stays the user's protocol. A buffer that
/// borrows for less cannot be handed over:
/// forgetting the `Pending` leaks the buffer, which must then never outlive what it borrows.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{Device, DeviceCache, PinnedBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let cache = DeviceCache::for_device(Device::current()?)?; // `&'static`
/// let device = cache.zeroed::<f32>(stream.clone(), 1024)?;
/// let (device, _host) = stream.upload(device, PinnedBuffer::from_slice(&[1.0f32; 1024], Default::default())?)?.wait()?;
/// # drop(device); Ok(()) }
/// ```
///
/// A cached buffer of a cache that does not live for good cannot be handed over:
///
/// ```compile_fail,E0597
/// # use cuda_mem::{Device, DeviceCache, PinnedBuffer, Stream};
/// let stream = Stream::non_blocking().unwrap();
/// let cache = DeviceCache::new(Device::current().unwrap()).unwrap();
/// let device = cache.zeroed::<u32>(stream.clone(), 16).unwrap(); // error: `cache` does not live long enough
/// let pending = stream.upload(device, PinnedBuffer::<u32>::zeroed(16).unwrap()).unwrap();
/// # pending.wait().unwrap();
/// ```
///
/// Nor can an import of a pool that does not live for good:
///
/// ```compile_fail,E0597
/// # use cuda_mem::{Device, MemPool, PinnedBuffer, PoolPointerExport, Stream};
/// # use std::os::fd::BorrowedFd;
/// fn upload(fd: BorrowedFd<'_>, export: &PoolPointerExport, stream: &Stream) {
///     let pool = MemPool::import_fd(fd, Device::current().unwrap()).unwrap();
///     let import = pool.import_pointer::<u32>(export).unwrap(); // error: `pool` does not live long enough
///     let pending = stream.upload(import, PinnedBuffer::<u32>::zeroed(16).unwrap()).unwrap();
///     pending.wait().unwrap();
/// }
/// ```
pub trait OwnedDevice<T: Pod>: sealed::Device<T> + Send + 'static {}

impl<T: Pod + Send> sealed::Host<T> for Vec<T> {
    const PINNED: bool = false;
    fn host(&self) -> &[T] {
        self
    }
    fn host_mut(&mut self) -> &mut [T] {
        self
    }
}
impl<T: Pod + Send> OwnedHost<T> for Vec<T> {}

/// Pinned host owners: they dereference to `[T]`.
macro_rules! pinned_host {
    ($($owner:ident),*) => {$(
        impl<T: Pod> sealed::Host<T> for $owner<T> {
            const PINNED: bool = true;
            fn host(&self) -> &[T] {
                self
            }
            fn host_mut(&mut self) -> &mut [T] {
                self
            }
        }
        impl<T: Pod> OwnedHost<T> for $owner<T> {}
    )*};
}

pinned_host!(PinnedBuffer, PooledPinned);

/// Device owners: every one names its views `as_slice` and `as_mut_slice`; `$wrap` makes an
/// infallible view a `Result`.
macro_rules! device_owner {
    ($($owner:ty $(: $wrap:path)?);*) => {$(
        impl<T: Pod> sealed::Device<T> for $owner {
            fn view(&self) -> Result<DeviceSlice<'_, T>> {
                $($wrap)?(self.as_slice())
            }
            fn view_mut(&mut self) -> Result<DeviceSliceMut<'_, T>> {
                $($wrap)?(self.as_mut_slice())
            }
        }
        impl<T: Pod> OwnedDevice<T> for $owner {}
    )*};
}

device_owner!(
    DeviceBuffer<T>: Ok;
    ManagedBuffer<T>: Ok;
    StreamBuffer<'static, T>: Ok;
    CachedBuffer<'static, T>: Ok;
    ResourceBuffer<'static, T>;
    IpcMapping<T>: Ok;
    ImportedSlice<'static, T>: Ok
);
