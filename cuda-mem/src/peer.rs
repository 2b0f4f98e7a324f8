//! Several GPUs in one process: peer access between devices, pool access for peers, peer copies.
//!
//! Operations that need a device current make it so and restore the caller's current device
//! afterwards ([`Device::run_on`] does the same for the caller's own code).

use crate::device::{CurrentDevice, Device};
use crate::error::Result;
use crate::pool::MemPool;
use crate::raw::{check, length_mismatch};
use crate::scope::StreamScope;
use crate::slice::{DeviceSliceMut, DeviceSource};
use bytemuck::Pod;
use cuda_mem_sys as sys;

/// What a device may do with a pool's memory (`cudaMemAccessFlags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolAccess {
    /// No access (`ProtNone`); the pool's own device always has read-write access.
    None,
    /// Read only (`ProtRead`): can be reported, but pools grant only `None` or `ReadWrite`.
    Read,
    /// Read and write (`ProtReadWrite`).
    ReadWrite,
}

impl PoolAccess {
    pub(crate) fn raw(self) -> sys::cudaMemAccessFlags {
        match self {
            Self::None => sys::cudaMemAccessFlags::cudaMemAccessFlagsProtNone,
            Self::Read => sys::cudaMemAccessFlags::cudaMemAccessFlagsProtRead,
            Self::ReadWrite => sys::cudaMemAccessFlags::cudaMemAccessFlagsProtReadWrite,
        }
    }

    fn from_raw(flags: sys::cudaMemAccessFlags) -> Self {
        match flags {
            sys::cudaMemAccessFlags::cudaMemAccessFlagsProtNone => Self::None,
            sys::cudaMemAccessFlags::cudaMemAccessFlagsProtRead => Self::Read,
            _ => Self::ReadWrite,
        }
    }
}

pub(crate) fn device_location(device: Device) -> sys::cudaMemLocation {
    sys::cudaMemLocation { type_: sys::cudaMemLocationType::cudaMemLocationTypeDevice, id: device.raw() }
}

impl Device {
    /// Runs `f` with this device current, then restores the caller's current device.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cuda_mem::CudaError> {
    /// use cuda_mem::{Device, DeviceBuffer};
    /// let second = Device::new(1)?;
    /// let on_second = second.run_on(|| DeviceBuffer::<f32>::zeroed(1024))??;
    /// assert_eq!(on_second.device(), second);
    /// # Ok(()) }
    /// ```
    pub fn run_on<R>(self, f: impl FnOnce() -> R) -> Result<R> {
        let _guard = CurrentDevice::set(self)?;
        Ok(f())
    }

    /// Whether this device can read and write `peer`'s memory directly
    /// (`cudaDeviceCanAccessPeer`).
    pub fn can_access_peer(self, peer: Device) -> Result<bool> {
        let mut can = 0;
        // SAFETY: `can` is valid for writes.
        check(unsafe { sys::cudaDeviceCanAccessPeer(&mut can, self.raw(), peer.raw()) }, || {
            format!("cudaDeviceCanAccessPeer({self}, {peer})")
        })?;
        Ok(can != 0)
    }

    /// Lets this device access `peer`'s `cudaMalloc` memory (`cudaDeviceEnablePeerAccess`).
    /// Enabling twice is not an error.
    pub fn enable_peer_access(self, peer: Device) -> Result<()> {
        let _guard = CurrentDevice::set(self)?;
        // SAFETY: plain arguments; the runtime validates the peer.
        let code = unsafe { sys::cudaDeviceEnablePeerAccess(peer.raw(), 0) };
        if code == sys::cudaError::cudaErrorPeerAccessAlreadyEnabled {
            let _ = check(code, String::new); // clears the last-error slot
            return Ok(());
        }
        check(code, || format!("cudaDeviceEnablePeerAccess from {self} to {peer}"))
    }

    /// Revokes access enabled with [`Device::enable_peer_access`].
    pub fn disable_peer_access(self, peer: Device) -> Result<()> {
        let _guard = CurrentDevice::set(self)?;
        // SAFETY: plain argument.
        check(unsafe { sys::cudaDeviceDisablePeerAccess(peer.raw()) }, || {
            format!("cudaDeviceDisablePeerAccess from {self} to {peer}")
        })
    }
}

impl MemPool {
    /// Grants `device` access to this pool's memory (`cudaMemPoolSetAccess`): needed before a
    /// kernel or copy on another GPU touches stream-ordered memory from this pool.
    pub fn set_access(&self, device: Device, access: PoolAccess) -> Result<()> {
        let desc = sys::cudaMemAccessDesc { location: device_location(device), flags: access.raw() };
        // SAFETY: one valid descriptor.
        check(unsafe { sys::cudaMemPoolSetAccess(self.as_raw(), &desc, 1) }, || {
            format!("cudaMemPoolSetAccess({device}, {access:?}) on a pool of {}", self.device())
        })
    }

    /// The access `device` has to this pool's memory (`cudaMemPoolGetAccess`).
    pub fn access(&self, device: Device) -> Result<PoolAccess> {
        let mut flags = sys::cudaMemAccessFlags::cudaMemAccessFlagsProtNone;
        let mut location = device_location(device);
        // SAFETY: both pointers are valid.
        check(unsafe { sys::cudaMemPoolGetAccess(&mut flags, self.as_raw(), &mut location) }, || {
            format!("cudaMemPoolGetAccess({device})")
        })?;
        Ok(PoolAccess::from_raw(flags))
    }
}

impl<'scope> StreamScope<'scope, '_> {
    /// Queues a copy between memory on two devices (`cudaMemcpyPeerAsync`); with peer access
    /// enabled it goes over NVLink/PCIe directly, else through the host.
    pub fn copy_peer<'v: 'scope, T: Pod>(
        &self,
        dst: &mut DeviceSliceMut<'v, T>,
        dst_device: Device,
        src: impl DeviceSource<'scope, T>,
        src_device: Device,
    ) -> Result<()> {
        let (src_ptr, src_len) = self.device_ptr(src)?;
        let dst_ptr = self.device_ptr_mut(dst)?;
        if src_len != dst.len() {
            return Err(length_mismatch(src_len, dst.len(), "cudaMemcpyPeerAsync"));
        }
        let bytes = dst.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        let call = self.stream().call()?;
        // SAFETY: both ranges cover `bytes` and are borrowed for 'scope, which ends only after
        // the stream has been synchronized; `call` checked the stream handle.
        let code = unsafe {
            sys::cudaMemcpyPeerAsync(
                dst_ptr.cast(),
                dst_device.raw(),
                src_ptr.cast(),
                src_device.raw(),
                bytes,
                call.raw(),
            )
        };
        check(code, || format!("cudaMemcpyPeerAsync of {bytes} bytes from {src_device} to {dst_device}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_and_locations_encode_as_the_runtime_expects() {
        assert_eq!(PoolAccess::None.raw().0, 0);
        assert_eq!(PoolAccess::ReadWrite.raw().0, 3);
        for access in [PoolAccess::None, PoolAccess::Read, PoolAccess::ReadWrite] {
            assert_eq!(PoolAccess::from_raw(access.raw()), access);
        }
        let location = device_location(Device::new_unchecked_for_tests(1));
        assert_eq!((location.type_, location.id), (sys::cudaMemLocationType::cudaMemLocationTypeDevice, 1));
    }
}
