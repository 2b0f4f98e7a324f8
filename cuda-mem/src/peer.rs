//! Several GPUs in one process: peer access between devices, pool access for peers, peer copies.
//!
//! Operations that need a device current make it so and restore the caller's current device
//! afterwards ([`Device::run_on`] does the same for the caller's own code).

use crate::device::{CurrentDevice, Device};
use crate::error::Result;
use crate::pool::MemPool;
use crate::raw::{self, same_len};
use crate::scope::StreamScope;
use crate::slice::{DeviceSliceMut, DeviceSource};
use bytemuck::Pod;

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
    fn as_raw(self) -> raw::cudaMemAccessFlags {
        use raw::cudaMemAccessFlags as F;
        match self {
            Self::None => F::cudaMemAccessFlagsProtNone,
            Self::Read => F::cudaMemAccessFlagsProtRead,
            Self::ReadWrite => F::cudaMemAccessFlagsProtReadWrite,
        }
    }

    fn from_raw(flags: raw::cudaMemAccessFlags) -> Self {
        use raw::cudaMemAccessFlags as F;
        match flags {
            F::cudaMemAccessFlagsProtNone => Self::None,
            F::cudaMemAccessFlagsProtRead => Self::Read,
            _ => Self::ReadWrite,
        }
    }
}

impl Device {
    /// Whether this device can read and write `peer`'s memory directly
    /// (`cudaDeviceCanAccessPeer`).
    pub fn can_access_peer(self, peer: Device) -> Result<bool> {
        raw::peers::can_access(self.as_raw(), peer.as_raw())
    }

    /// Lets this device access `peer`'s `cudaMalloc` memory (`cudaDeviceEnablePeerAccess`).
    /// Enabling twice is not an error.
    pub fn enable_peer_access(self, peer: Device) -> Result<()> {
        let _guard = CurrentDevice::set(self)?;
        raw::peers::enable(self.as_raw(), peer.as_raw())
    }

    /// Revokes access enabled with [`Device::enable_peer_access`].
    pub fn disable_peer_access(self, peer: Device) -> Result<()> {
        let _guard = CurrentDevice::set(self)?;
        raw::peers::disable(self.as_raw(), peer.as_raw())
    }
}

impl MemPool {
    /// Grants `device` access to this pool's memory (`cudaMemPoolSetAccess`): needed before a
    /// kernel or copy on another GPU touches stream-ordered memory from this pool.
    pub fn set_access(&self, device: Device, access: PoolAccess) -> Result<()> {
        // SAFETY: the pool handle is valid while `self` lives.
        unsafe {
            raw::pools::set_access(self.as_raw(), device.as_raw(), access.as_raw(), || format!("{device}, {access:?}"))
        }
    }

    /// The access `device` has to this pool's memory (`cudaMemPoolGetAccess`).
    pub fn access(&self, device: Device) -> Result<PoolAccess> {
        // SAFETY: the pool handle is valid while `self` lives.
        unsafe { raw::pools::access(self.as_raw(), device.as_raw()) }.map(PoolAccess::from_raw)
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
        same_len(src_len, dst.len(), "cudaMemcpyPeerAsync")?;
        let bytes = dst.size_bytes();
        if bytes == 0 {
            return Ok(());
        }
        let call = self.stream().call()?;
        // SAFETY: both ranges cover `bytes` and are borrowed for 'scope, which ends only after
        // the stream has been synchronized; `call` checked the stream handle.
        unsafe {
            raw::peers::copy_async(
                dst_ptr.cast(),
                dst_device.as_raw(),
                src_ptr.cast(),
                src_device.as_raw(),
                bytes,
                call.as_raw(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_encode_as_the_runtime_expects() {
        assert_eq!(PoolAccess::None.as_raw().0, 0);
        assert_eq!(PoolAccess::ReadWrite.as_raw().0, 3);
        for access in [PoolAccess::None, PoolAccess::Read, PoolAccess::ReadWrite] {
            assert_eq!(PoolAccess::from_raw(access.as_raw()), access);
        }
    }
}
