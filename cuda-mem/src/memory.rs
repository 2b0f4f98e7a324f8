//! What an owner of memory is, said once. Each owner implements these traits in its own file;
//! [`Pending`](crate::Pending), DLPack exports, NCCL registration and the tests take the traits
//! instead of listing owners.
//!
//! - [`DeviceMemory`]: device (or managed) memory a value owns outright, with the device views
//!   every owner spells the same way.
//! - [`StreamOrdered`]: the owners whose free is queued on a stream, and may be moved to another.
//! - [`HostMemory`]: host memory a copy may read or write while a [`Pending`](crate::Pending)
//!   owns it.
//!
//! Sealed: an implementation promises that its memory stays at one address while the value
//! moves and is freed only by its own drop (or `free`), which is what lets a `Pending`, an
//! export or a communicator hold it by value while the GPU uses it. A type of the user's cannot
//! make that promise:
//!
//! ```compile_fail,E0277
//! use cuda_mem::{Device, DeviceMemory, DeviceSlice, DeviceSliceMut};
//! struct Forged(Vec<u32>); // host memory, freed whenever the Vec is
//! impl DeviceMemory for Forged { // error: `Forged: Owner` is not satisfied
//!     type Elem = u32;
//!     fn device(&self) -> Device { unimplemented!() }
//!     fn len(&self) -> usize { self.0.len() }
//!     fn as_slice(&self) -> DeviceSlice<'_, u32> { unimplemented!() }
//!     fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, u32> { unimplemented!() }
//! }
//! ```
//!
//! ```compile_fail,E0277
//! use cuda_mem::HostMemory;
//! struct Borrowed<'a>(&'a mut [u32]);
//! impl HostMemory for Borrowed<'static> { // error: `Borrowed: Host` is not satisfied
//!     type Elem = u32;
//!     fn host(&self) -> &[u32] { self.0 }
//!     fn host_mut(&mut self) -> &mut [u32] { self.0 }
//! }
//! ```

use crate::device::Device;
use crate::error::Result;
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Stream;
use bytemuck::Pod;

pub(crate) mod sealed {
    use crate::device::Device;
    use crate::stream::Stream;

    /// Where device-accessible memory lives, as an export names it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Residence {
        /// Device memory of the owner's device.
        Device,
        /// Managed (unified) memory, preferring the owner's device.
        Managed,
    }

    /// Who may still be using the memory when a holder the owner cannot see (a DLPack consumer)
    /// lets go of it, so must be waited for before the owner's free.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum UnseenUsers {
        /// Nobody: the free itself waits for the device (`cudaFree`).
        FreeWaits,
        /// Streams of this device: a stream-ordered free of device memory.
        Device(Device),
        /// Streams of any device: managed memory, or a mapping another device may use.
        AnyDevice,
    }

    /// What the public traits do not show.
    pub trait Owner {
        fn residence(&self) -> Residence;
        /// The stream the memory's pending work is ordered on, if the owner keeps one.
        fn producer(&self) -> Option<&Stream>;
        fn unseen_users(&self) -> UnseenUsers;
    }

    /// Host memory by value.
    pub trait Host {
        /// Whether DMA can use it directly (page-locked).
        const PINNED: bool;
    }
}

/// Device memory owned by value: [`DeviceBuffer`](crate::DeviceBuffer),
/// [`ManagedBuffer`](crate::ManagedBuffer), [`StreamBuffer`](crate::StreamBuffer),
/// [`CachedBuffer`](crate::CachedBuffer), [`ResourceBuffer`](crate::resource::ResourceBuffer),
/// [`IpcMapping`](crate::IpcMapping) and [`ImportedSlice`](crate::ImportedSlice). Every owner also
/// has these methods under the same names without the trait in scope.
///
/// Where a holder must keep the value for as long as it likes (a [`Pending`](crate::Pending), an
/// owned DLPack export) it asks for `DeviceMemory + Send + 'static`: an owner that borrows its
/// pool, cache, resource or stream for less cannot be handed over (forgetting the `Pending` would
/// leak a buffer that must then never outlive what it borrows).
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
pub trait DeviceMemory: sealed::Owner {
    /// The element type.
    type Elem: Pod;

    /// The device the memory belongs to.
    fn device(&self) -> Device;

    /// Number of elements.
    fn len(&self) -> usize;

    /// True when there are no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A shared view of every element, ordered on the owner's stream where it has one.
    fn as_slice(&self) -> DeviceSlice<'_, Self::Elem>;

    /// An exclusive view of every element, ordered as [`as_slice`](Self::as_slice).
    fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, Self::Elem>;
}

/// The owners whose free is queued on their stream ([`StreamBuffer`](crate::StreamBuffer),
/// [`CachedBuffer`](crate::CachedBuffer), [`ResourceBuffer`](crate::resource::ResourceBuffer)): use
/// on other streams is remembered, and the free waits for it.
pub trait StreamOrdered: DeviceMemory + Sized {
    /// The stream the memory is ordered on and freed on.
    fn stream(&self) -> &Stream;

    /// Prepares use on `other`: `other` waits (on the device) for the work queued on the owner's
    /// stream so far, and the free waits for the work queued on `other` up to the free. The
    /// per-thread stream and a capture's stream are refused
    /// ([`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)).
    fn use_on(&mut self, other: &Stream) -> Result<()>;

    /// Frees on `stream` instead of the owner's, after the owner's stream and every stream passed
    /// to `use_on`. A stream that cannot take the free is refused and the value is dropped, freed
    /// on its own stream.
    fn free_on(self, stream: &Stream) -> Result<()>;

    /// Frees now, on the owner's stream, and reports what drop would ignore.
    fn free(self) -> Result<()>;
}

/// Host memory a [`Pending`](crate::Pending) can own while a copy reads or writes it:
/// [`PinnedBuffer`](crate::PinnedBuffer) and [`PooledPinned`](crate::PooledPinned) (page-locked:
/// the DMA uses them directly) and `Vec<T>` (pageable: staged through pinned memory, see
/// [`Stream::upload`](crate::Stream::upload)).
pub trait HostMemory: sealed::Host {
    /// The element type.
    type Elem: Pod;

    /// The host's view.
    fn host(&self) -> &[Self::Elem];

    /// The host's exclusive view.
    fn host_mut(&mut self) -> &mut [Self::Elem];
}

impl<T: Pod> sealed::Host for Vec<T> {
    const PINNED: bool = false;
}

impl<T: Pod> HostMemory for Vec<T> {
    type Elem = T;
    fn host(&self) -> &[T] {
        self
    }
    fn host_mut(&mut self) -> &mut [T] {
        self
    }
}

/// [`HostMemory`] of a pinned owner that dereferences to `[T]`, in the owner's file.
macro_rules! pinned_host_memory {
    ($owner:ident) => {
        impl<T: Pod> crate::memory::sealed::Host for $owner<T> {
            const PINNED: bool = true;
        }
        impl<T: Pod> crate::memory::HostMemory for $owner<T> {
            type Elem = T;
            fn host(&self) -> &[T] {
                self
            }
            fn host_mut(&mut self) -> &mut [T] {
                self
            }
        }
    };
}
pub(crate) use pinned_host_memory;
