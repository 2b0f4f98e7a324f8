//! What each cuda-mem buffer and view says of its memory to an export.

use super::dtype::DlpackElement;
use super::export::{Described, DlpackOwner, DlpackSource, DlpackSourceMut, sealed};
use super::ffi::{self, DLDevice};
use super::invalid;
use crate::device::Device;
use crate::error::Result;
use crate::ipc::{ImportedSlice, IpcMapping};
use crate::raw::memory::{MemoryType, pointer_type};
use crate::resource::{MemoryKind, ResourceBuffer};
use crate::{CachedBuffer, DeviceBuffer, DeviceSlice, DeviceSliceMut, ManagedBuffer, PinnedBuffer, StreamBuffer};

fn described<T: DlpackElement>(data: *const T, len: usize, device: DLDevice) -> Described {
    Described { data: data.cast_mut().cast(), len, dtype: T::DTYPE, device, producer: None }
}

fn cuda(device: Device) -> DLDevice {
    DLDevice { device_type: ffi::kDLCUDA, device_id: device.as_raw() }
}

/// Marks an owning buffer as a source, writable source and owner (it owns itself).
macro_rules! owner {
    ($owner:ident) => {
        impl<T: DlpackElement> DlpackSource for $owner<T> {}
        impl<T: DlpackElement> DlpackSourceMut for $owner<T> {}
        impl<T: DlpackElement> DlpackOwner for $owner<T> {}
        impl<T: DlpackElement> sealed::Owner for $owner<T> {
            type Keep = Self;
            fn keep(self) -> Self {
                self
            }
        }
    };
}

owner!(DeviceBuffer);
owner!(ManagedBuffer);

impl<T: DlpackElement> DlpackSource for PinnedBuffer<T> {}
impl<T: DlpackElement> DlpackSourceMut for PinnedBuffer<T> {}
impl<T: DlpackElement> DlpackOwner for PinnedBuffer<T> {}
impl<T: DlpackElement> sealed::Owner for PinnedBuffer<T> {
    type Keep = WaitThenFree<Self>;
    fn keep(self) -> Self::Keep {
        WaitThenFree { devices: Waits::All, buffer: self }
    }
}

impl<T: DlpackElement> sealed::Source for DeviceBuffer<T> {
    fn describe(&self) -> Result<Described> {
        Ok(described(self.as_slice().as_device_ptr(), self.len(), cuda(self.device())))
    }
}

impl<T: DlpackElement> sealed::Source for ManagedBuffer<T> {
    fn describe(&self) -> Result<Described> {
        let device = DLDevice { device_type: ffi::kDLCUDAManaged, device_id: self.device().as_raw() };
        Ok(described(self.as_slice().as_device_ptr(), self.len(), device))
    }
}

impl<T: DlpackElement> sealed::Source for PinnedBuffer<T> {
    fn describe(&self) -> Result<Described> {
        Ok(described(self.as_ptr(), self.len(), DLDevice { device_type: ffi::kDLCUDAHost, device_id: 0 }))
    }
}

/// The stream-ordered owners: device memory of their stream's device, with pending work there.
macro_rules! stream_ordered {
    ($($owner:ident),*) => {$(
        impl<T: DlpackElement> sealed::Source for $owner<'_, T> {
            fn describe(&self) -> Result<Described> {
                let mut described = described(self.as_slice().as_device_ptr(), self.len(), cuda(self.stream().device()));
                described.producer = Some(self.stream().clone());
                Ok(described)
            }
        }
        impl<T: DlpackElement> DlpackSource for $owner<'_, T> {}
        impl<T: DlpackElement> DlpackSourceMut for $owner<'_, T> {}
        // `'static` only: the consumer may keep the export, and so the buffer, for any time.
        impl<T: DlpackElement> DlpackOwner for $owner<'static, T> {}
        impl<T: DlpackElement> sealed::Owner for $owner<'static, T> {
            type Keep = WaitThenFree<Self>;
            fn keep(self) -> Self::Keep {
                WaitThenFree { devices: Waits::One(self.stream().device()), buffer: self }
            }
        }
    )*};
}

stream_ordered!(StreamBuffer, CachedBuffer);

/// Memory from a resource: device, managed or pinned host memory as its resource says, ordered
/// on the buffer's stream.
impl<T: DlpackElement> sealed::Source for ResourceBuffer<'_, T> {
    fn describe(&self) -> Result<Described> {
        let kind = self.resource().kind();
        let device = self.resource().device().unwrap_or(self.stream().device());
        let device = match kind {
            MemoryKind::Device => cuda(device),
            MemoryKind::Managed => DLDevice { device_type: ffi::kDLCUDAManaged, device_id: device.as_raw() },
            MemoryKind::PinnedHost => DLDevice { device_type: ffi::kDLCUDAHost, device_id: 0 },
        };
        let mut described = described(self.as_ptr().cast_const(), self.len(), device);
        described.producer = Some(self.stream().clone());
        Ok(described)
    }
}
impl<T: DlpackElement> DlpackSource for ResourceBuffer<'_, T> {}
impl<T: DlpackElement> DlpackSourceMut for ResourceBuffer<'_, T> {}
impl<T: DlpackElement> DlpackOwner for ResourceBuffer<'static, T> {}
impl<T: DlpackElement> sealed::Owner for ResourceBuffer<'static, T> {
    type Keep = WaitThenFree<Self>;
    fn keep(self) -> Self::Keep {
        // Device memory is used by the consumer's streams of its device; managed and pinned host
        // memory may be used by any device's.
        let devices = match self.resource().kind() {
            MemoryKind::Device => Waits::One(self.stream().device()),
            MemoryKind::Managed | MemoryKind::PinnedHost => Waits::All,
        };
        WaitThenFree { devices, buffer: self }
    }
}

/// Another process's memory mapped into this one: device memory, described through the
/// runtime's pointer attributes as a view of it is. The mapping is released (`cudaIpcCloseMemHandle`,
/// or the import's stream-ordered free on the legacy stream) only after every device has been
/// waited for: neither release is documented to wait for the consumer's streams, and a peer
/// device of this process may be one of them.
macro_rules! mapped {
    ($($source:ty, owned as $owner:ty);*) => {$(
        impl<T: DlpackElement> sealed::Source for $source {
            fn describe(&self) -> Result<Described> {
                sealed::Source::describe(&self.as_slice())
            }
        }
        impl<T: DlpackElement> DlpackSource for $source {}
        impl<T: DlpackElement> DlpackSourceMut for $source {}
        impl<T: DlpackElement> DlpackOwner for $owner {}
        impl<T: DlpackElement> sealed::Owner for $owner {
            type Keep = WaitThenFree<Self>;
            fn keep(self) -> Self::Keep {
                WaitThenFree { devices: Waits::All, buffer: self }
            }
        }
    )*};
}

mapped!(IpcMapping<T>, owned as IpcMapping<T>; ImportedSlice<'_, T>, owned as ImportedSlice<'static, T>);

/// Which devices an owned export waits for before its buffer is freed.
#[derive(Debug)]
pub enum Waits {
    /// The memory's device: device memory, used by streams of its device.
    One(Device),
    /// Every device: host-accessible memory, which copies on any device's streams may use.
    All,
}

/// A buffer in an owned export whose free does not wait for the consumer's work by itself (a
/// stream-ordered free, or `cudaFreeHost`, which is not documented to wait): when the consumer
/// releases it, the devices its users may be on are waited for before the free, as the consumer's
/// streams are unknown.
#[derive(Debug)]
pub struct WaitThenFree<B> {
    devices: Waits,
    #[allow(dead_code)] // held for its drop, after the wait
    buffer: B,
}

impl<B> Drop for WaitThenFree<B> {
    fn drop(&mut self) {
        // Blocking waits, by design (see `DlpackTensor::owned`). If one fails the context is
        // broken, and the free that follows fails too (or leaves the memory allocated).
        match self.devices {
            Waits::One(device) => {
                crate::raw::quiet(device.synchronize());
            }
            Waits::All => {
                for device in Device::all().unwrap_or_default() {
                    crate::raw::quiet(device.synchronize());
                }
            }
        }
    }
}

impl<T: DlpackElement> sealed::Source for DeviceSlice<'_, T> {
    fn describe(&self) -> Result<Described> {
        let data = self.as_device_ptr();
        let device = if self.is_empty() {
            // No memory to look up: an empty view is reported on the current device.
            cuda(Device::current()?)
        } else {
            device_of(data.cast())?
        };
        let mut described = described(data, self.len(), device);
        described.producer = self.owner().cloned();
        Ok(described)
    }
}

/// Where the runtime says the memory at `data` lives, as DLPack names it.
fn device_of(data: *const std::ffi::c_void) -> Result<DLDevice> {
    Ok(match pointer_type(data)? {
        MemoryType::Device { device } => DLDevice { device_type: ffi::kDLCUDA, device_id: device },
        MemoryType::Managed { device } => DLDevice { device_type: ffi::kDLCUDAManaged, device_id: device },
        // Mapped pinned memory whose device address is its host address (unified addressing).
        MemoryType::Host { host, .. } if host.cast_const() == data => {
            DLDevice { device_type: ffi::kDLCUDAHost, device_id: 0 }
        }
        MemoryType::Host { .. } => {
            return Err(invalid(
                "mapped host memory whose device address differs from its host address",
                format!("exporting the view at {data:p}"),
            ));
        }
        MemoryType::Unregistered => {
            return Err(invalid("the view's address is not CUDA memory", format!("exporting the view at {data:p}")));
        }
    })
}
impl<T: DlpackElement> DlpackSource for DeviceSlice<'_, T> {}

impl<T: DlpackElement> sealed::Source for DeviceSliceMut<'_, T> {
    fn describe(&self) -> Result<Described> {
        sealed::Source::describe(&self.as_slice())
    }
}
impl<T: DlpackElement> DlpackSource for DeviceSliceMut<'_, T> {}
impl<T: DlpackElement> DlpackSourceMut for DeviceSliceMut<'_, T> {}
