//! What each cuda-mem buffer and view says of its memory to an export.

use super::dtype::DlpackElement;
use super::export::{Described, DlpackOwner, DlpackSource, DlpackSourceMut, sealed};
use super::ffi::{self, DLDevice};
use super::invalid;
use crate::device::Device;
use crate::error::Result;
use crate::memory::DeviceMemory;
use crate::memory::sealed::{Residence, UnseenUsers};
use crate::raw::memory::{MemoryType, pointer_type};
use crate::resource::ResourceHostBuffer;
use crate::{DeviceSlice, DeviceSliceMut, PinnedBuffer};

fn described<T: DlpackElement>(data: *const T, len: usize, device: DLDevice) -> Described {
    Described { data: data.cast_mut().cast(), len, dtype: T::DTYPE, device, producer: None }
}

fn cuda(device: Device) -> DLDevice {
    DLDevice { device_type: ffi::kDLCUDA, device_id: device.as_raw() }
}

/// Every device owner ([`DeviceMemory`]): what it says of itself. Its stream, when it keeps one,
/// is the producer the consumer orders after.
impl<M: DeviceMemory> sealed::Source for M
where
    M::Elem: DlpackElement,
{
    fn describe(&self) -> Result<Described> {
        let device = self.device().as_raw();
        let device = match self.residence() {
            Residence::Device => DLDevice { device_type: ffi::kDLCUDA, device_id: device },
            Residence::Managed => DLDevice { device_type: ffi::kDLCUDAManaged, device_id: device },
        };
        let mut described = described(self.as_slice().as_device_ptr(), self.len(), device);
        described.producer = self.producer().cloned();
        Ok(described)
    }
}
impl<M: DeviceMemory> DlpackSource for M where M::Elem: DlpackElement {}
impl<M: DeviceMemory> DlpackSourceMut for M where M::Elem: DlpackElement {}
// `'static` only: the consumer may keep the export, and so the buffer, for any time.
impl<M: DeviceMemory + Send + 'static> DlpackOwner for M where M::Elem: DlpackElement {}
impl<M: DeviceMemory + Send + 'static> sealed::Owner for M
where
    M::Elem: DlpackElement,
{
    type Keep = WaitThenFree<Self>;
    fn keep(self) -> Self::Keep {
        WaitThenFree { users: self.unseen_users(), buffer: self }
    }
}

/// Pinned host memory: the host owners an export takes, each used by copies on any device's
/// streams.
macro_rules! pinned_host {
    ($($owner:ty),*) => {$(
        impl<T: DlpackElement> sealed::Source for $owner {
            fn describe(&self) -> Result<Described> {
                Ok(described(self.as_ptr(), self.len(), DLDevice { device_type: ffi::kDLCUDAHost, device_id: 0 }))
            }
        }
        impl<T: DlpackElement> DlpackSource for $owner {}
        impl<T: DlpackElement> DlpackSourceMut for $owner {}
    )*};
}

pinned_host!(PinnedBuffer<T>, ResourceHostBuffer<'_, T>);

impl<T: DlpackElement> DlpackOwner for PinnedBuffer<T> {}
impl<T: DlpackElement> sealed::Owner for PinnedBuffer<T> {
    type Keep = WaitThenFree<Self>;
    fn keep(self) -> Self::Keep {
        // `cudaFreeHost` is not documented to wait for the copies that read or write the memory.
        WaitThenFree { users: UnseenUsers::AnyDevice, buffer: self }
    }
}
impl<T: DlpackElement> DlpackOwner for ResourceHostBuffer<'static, T> {}
impl<T: DlpackElement> sealed::Owner for ResourceHostBuffer<'static, T> {
    type Keep = WaitThenFree<Self>;
    fn keep(self) -> Self::Keep {
        WaitThenFree { users: UnseenUsers::AnyDevice, buffer: self }
    }
}

/// A buffer in an owned export whose free does not wait for the consumer's work by itself (a
/// stream-ordered free, or `cudaFreeHost`, which is not documented to wait): when the consumer
/// releases it, the devices its users may be on are waited for before the free, as the consumer's
/// streams are unknown.
#[derive(Debug)]
pub struct WaitThenFree<B> {
    users: UnseenUsers,
    #[allow(dead_code)] // held for its drop, after the wait
    buffer: B,
}

impl<B> Drop for WaitThenFree<B> {
    fn drop(&mut self) {
        // Blocking waits, by design (see `DlpackTensor::owned`). If one fails the context is
        // broken, and the free that follows fails too (or leaves the memory allocated).
        match self.users {
            UnseenUsers::FreeWaits => {}
            UnseenUsers::Device(device) => {
                crate::raw::quiet(device.synchronize());
            }
            UnseenUsers::AnyDevice => {
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
