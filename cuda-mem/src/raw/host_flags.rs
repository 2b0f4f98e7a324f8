//! Typed flag sets for `cudaHostAlloc` and `cudaHostRegister`.

use cuda_mem_sys as sys;

bitflags::bitflags! {
    /// Flags of `cudaHostAlloc`; empty means `cudaMallocHost` (page-locked, cached).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cuda_mem::CudaError> {
    /// use cuda_mem::{HostAllocFlags, PinnedBuffer};
    /// let flags = HostAllocFlags::PORTABLE | HostAllocFlags::MAPPED;
    /// let buffer = PinnedBuffer::<u8>::zeroed_with_flags(4096, flags)?;
    /// assert!(buffer.flags().contains(HostAllocFlags::MAPPED));
    /// # Ok(()) }
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct HostAllocFlags: u32 {
        /// Pinned for every CUDA context, not only the current one (`cudaHostAllocPortable`).
        const PORTABLE = sys::cudaHostAllocPortable;
        /// Mapped into the device address space: kernels may read and write it directly
        /// (`cudaHostAllocMapped`).
        const MAPPED = sys::cudaHostAllocMapped;
        /// Write-combined: faster host writes and PCIe reads on some systems, very slow host reads
        /// (`cudaHostAllocWriteCombined`).
        const WRITE_COMBINED = sys::cudaHostAllocWriteCombined;
    }
}

bitflags::bitflags! {
    /// Flags of `cudaHostRegister`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cuda_mem::CudaError> {
    /// use cuda_mem::{HostRegisterFlags, RegisteredHost};
    /// let mut data = vec![0f32; 1024];
    /// let pinned = RegisteredHost::new(&mut data, HostRegisterFlags::MAPPED | HostRegisterFlags::READ_ONLY)?;
    /// let view = pinned.device_view()?; // the device reads it in place
    /// # let _ = view;
    /// # Ok(()) }
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct HostRegisterFlags: u32 {
        /// Pinned for every CUDA context (`cudaHostRegisterPortable`).
        const PORTABLE = sys::cudaHostRegisterPortable;
        /// Mapped into the device address space (`cudaHostRegisterMapped`).
        const MAPPED = sys::cudaHostRegisterMapped;
        /// The device only reads the memory (`cudaHostRegisterReadOnly`); needs
        /// `DeviceAttribute::HostRegisterReadOnlySupported`.
        const READ_ONLY = sys::cudaHostRegisterReadOnly;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_encode_as_the_runtime_constants() {
        assert_eq!(HostAllocFlags::empty().bits(), 0);
        assert_eq!(HostAllocFlags::PORTABLE.bits(), 1);
        assert_eq!(HostAllocFlags::MAPPED.bits(), 2);
        assert_eq!(HostAllocFlags::WRITE_COMBINED.bits(), 4);
        assert_eq!((HostAllocFlags::PORTABLE | HostAllocFlags::MAPPED | HostAllocFlags::WRITE_COMBINED).bits(), 7);
        assert_eq!(HostRegisterFlags::PORTABLE.bits(), 1);
        assert_eq!(HostRegisterFlags::MAPPED.bits(), 2);
        assert_eq!(HostRegisterFlags::READ_ONLY.bits(), 8);
        // Unknown bits are never produced from user input.
        assert_eq!(HostAllocFlags::from_bits(8), None);
    }
}
