//! The buffers a [`Pending`](crate::Pending) can own and lend to the GPU by value: host buffers
//! ([`OwnedHost`]) and device buffers ([`OwnedDevice`]). Sealed: each implementation owns its
//! memory outright, keeps it at a fixed address while moved, and frees it only in its own drop.

use crate::device_buffer::DeviceBuffer;
use crate::managed::ManagedBuffer;
use crate::pinned::PinnedBuffer;
use crate::pinned_pool::PooledPinned;
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

    /// Device memory by value.
    pub trait Device<T> {
        fn view(&self) -> DeviceSlice<'_, T>;
        fn view_mut(&mut self) -> DeviceSliceMut<'_, T>;
    }
}

/// A host buffer a [`Pending`](crate::Pending) can own while a copy reads or writes it:
/// [`PinnedBuffer`] and [`PooledPinned`] (page-locked: the DMA uses them directly) and `Vec<T>`
/// (pageable: staged through pinned memory, see [`Stream::upload`](crate::Stream::upload)).
pub trait OwnedHost<T: Pod>: sealed::Host<T> + Send + 'static {}

/// A device buffer a [`Pending`](crate::Pending) can own while work on it runs: [`DeviceBuffer`],
/// [`ManagedBuffer`] and a [`StreamBuffer`] that owns its stream and pool handles
/// (`StreamBuffer<'static, T>`, made from `stream.clone()`). A buffer that borrows its stream
/// cannot be handed over: forgetting the `Pending` would end that borrow.
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

/// Device owners, with the methods that give their device views.
macro_rules! device_owner {
    ($($owner:ty: $view:ident, $view_mut:ident);*) => {$(
        impl<T: Pod> sealed::Device<T> for $owner {
            fn view(&self) -> DeviceSlice<'_, T> {
                self.$view()
            }
            fn view_mut(&mut self) -> DeviceSliceMut<'_, T> {
                self.$view_mut()
            }
        }
        impl<T: Pod> OwnedDevice<T> for $owner {}
    )*};
}

device_owner!(
    DeviceBuffer<T>: as_slice, as_mut_slice;
    StreamBuffer<'static, T>: as_slice, as_mut_slice;
    ManagedBuffer<T>: as_device_slice, as_device_slice_mut
);
