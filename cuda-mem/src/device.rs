//! Devices: enumeration, selection, properties and attributes, memory figures, synchronization.

use crate::error::{CudaError, ErrorKind, Result};
use crate::raw;
use std::ffi::{CStr, c_int};
use std::fmt;
use std::marker::PhantomData;

/// A CUDA device, by ordinal. Cheap to copy; constructing one checks the ordinal exists.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::Device;
/// for device in Device::all()? {
///     let (free, total) = device.mem_get_info()?;
///     println!("{}: {} (sm_{}{}), {free} of {total} bytes free", device.ordinal(), device.name()?,
///              device.compute_capability()?.0, device.compute_capability()?.1);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    ordinal: c_int,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.ordinal)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}", self.ordinal)
    }
}

/// Device attributes users of a memory library ask about (a subset of `cudaDeviceAttr`).
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, DeviceAttribute};
/// let sms = Device::current()?.attribute(DeviceAttribute::MultiProcessorCount)?;
/// assert!(sms > 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceAttribute {
    /// The device can access managed memory concurrently with the CPU.
    ConcurrentManagedAccess,
    /// The device can access pageable host memory directly (HMM / ATS).
    PageableMemoryAccess,
    /// `cudaMallocAsync` and memory pools are supported.
    MemoryPoolsSupported,
    /// Host memory can be mapped into the device address space.
    CanMapHostMemory,
    /// The device shares a unified address space with the host.
    UnifiedAddressing,
    /// Managed memory is supported.
    ManagedMemory,
    /// Compute capability, major part.
    ComputeCapabilityMajor,
    /// Compute capability, minor part.
    ComputeCapabilityMinor,
    /// Number of multiprocessors.
    MultiProcessorCount,
    /// Maximum resident threads per multiprocessor.
    MaxThreadsPerMultiProcessor,
    /// The device can use host-registered memory as read-only (`cudaHostRegisterReadOnly`).
    HostRegisterReadOnlySupported,
    /// Memory bus width in bits.
    GlobalMemoryBusWidth,
    /// Supported handle types for memory pool IPC (bit mask of `cudaMemAllocationHandleType`).
    MemoryPoolSupportedHandleTypes,
}

impl DeviceAttribute {
    pub(crate) fn as_raw(self) -> raw::cudaDeviceAttr {
        use raw::cudaDeviceAttr as A;
        match self {
            Self::ConcurrentManagedAccess => A::cudaDevAttrConcurrentManagedAccess,
            Self::PageableMemoryAccess => A::cudaDevAttrPageableMemoryAccess,
            Self::MemoryPoolsSupported => A::cudaDevAttrMemoryPoolsSupported,
            Self::CanMapHostMemory => A::cudaDevAttrCanMapHostMemory,
            Self::UnifiedAddressing => A::cudaDevAttrUnifiedAddressing,
            Self::ManagedMemory => A::cudaDevAttrManagedMemory,
            Self::ComputeCapabilityMajor => A::cudaDevAttrComputeCapabilityMajor,
            Self::ComputeCapabilityMinor => A::cudaDevAttrComputeCapabilityMinor,
            Self::MultiProcessorCount => A::cudaDevAttrMultiProcessorCount,
            Self::MaxThreadsPerMultiProcessor => A::cudaDevAttrMaxThreadsPerMultiProcessor,
            Self::HostRegisterReadOnlySupported => A::cudaDevAttrHostRegisterReadOnlySupported,
            Self::GlobalMemoryBusWidth => A::cudaDevAttrGlobalMemoryBusWidth,
            Self::MemoryPoolSupportedHandleTypes => A::cudaDevAttrMemoryPoolSupportedHandleTypes,
        }
    }
}

impl Device {
    /// Number of CUDA devices (`cudaGetDeviceCount`). Without a driver this is an error
    /// (`cudaErrorInsufficientDriver` or `cudaErrorNoDevice`), not 0.
    pub fn count() -> Result<usize> {
        raw::device::count().map(|count| count.max(0) as usize)
    }

    /// The device with this ordinal, after checking that it exists.
    pub fn new(ordinal: usize) -> Result<Self> {
        let count = Self::count()?;
        if ordinal >= count {
            let ordinal = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
            let kind = ErrorKind::InvalidDevice { ordinal, count: count as c_int };
            return Err(CudaError::new(kind, format!("selecting device {ordinal}")));
        }
        Ok(Self { ordinal: ordinal as c_int })
    }

    /// Every device present.
    pub fn all() -> Result<Vec<Self>> {
        Ok((0..Self::count()? as c_int).map(|ordinal| Self { ordinal }).collect())
    }

    /// The calling thread's current device (`cudaGetDevice`).
    pub fn current() -> Result<Self> {
        raw::device::current().map(|ordinal| Self { ordinal })
    }

    /// Makes this the calling thread's current device (`cudaSetDevice`).
    pub fn set_current(self) -> Result<()> {
        raw::device::set_current(self.ordinal)
    }

    /// The ordinal.
    pub fn ordinal(self) -> usize {
        self.ordinal as usize
    }

    pub(crate) fn as_raw(self) -> c_int {
        self.ordinal
    }

    /// Reads an integer attribute (`cudaDeviceGetAttribute`).
    pub fn attribute(self, attribute: DeviceAttribute) -> Result<i32> {
        raw::device::attribute(attribute.as_raw(), attribute, self.ordinal)
    }

    fn flag(self, attribute: DeviceAttribute) -> Result<bool> {
        self.attribute(attribute).map(|v| v != 0)
    }

    /// `concurrentManagedAccess`: CPU and GPU may touch managed memory at the same time.
    pub fn concurrent_managed_access(self) -> Result<bool> {
        self.flag(DeviceAttribute::ConcurrentManagedAccess)
    }

    /// `pageableMemoryAccess`: kernels may read pageable host memory directly.
    pub fn pageable_memory_access(self) -> Result<bool> {
        self.flag(DeviceAttribute::PageableMemoryAccess)
    }

    /// `memoryPoolsSupported`: stream-ordered allocation is available.
    pub fn memory_pools_supported(self) -> Result<bool> {
        self.flag(DeviceAttribute::MemoryPoolsSupported)
    }

    /// `canMapHostMemory`: mapped (zero-copy) host memory is available.
    pub fn can_map_host_memory(self) -> Result<bool> {
        self.flag(DeviceAttribute::CanMapHostMemory)
    }

    /// `unifiedAddressing`: host and device share one virtual address space.
    pub fn unified_addressing(self) -> Result<bool> {
        self.flag(DeviceAttribute::UnifiedAddressing)
    }

    /// Compute capability as (major, minor), e.g. (9, 0) for an H100/H200.
    pub fn compute_capability(self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(DeviceAttribute::ComputeCapabilityMajor)?,
            self.attribute(DeviceAttribute::ComputeCapabilityMinor)?,
        ))
    }

    /// Number of multiprocessors.
    pub fn multiprocessor_count(self) -> Result<usize> {
        self.attribute(DeviceAttribute::MultiProcessorCount).map(|v| v as usize)
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(self) -> Result<String> {
        let props = self.properties()?;
        // SAFETY: the runtime NUL-terminates `name` within its 256 bytes.
        let name = unsafe { CStr::from_ptr(props.name.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    /// All properties (`cudaGetDeviceProperties`); slower than [`Device::attribute`].
    pub fn properties(self) -> Result<raw::cudaDeviceProp> {
        raw::device::properties(self.ordinal)
    }

    /// Total device memory in bytes (from `cudaMemGetInfo`).
    pub fn total_memory(self) -> Result<usize> {
        self.mem_get_info().map(|(_, total)| total)
    }

    /// Free and total bytes on this device (`cudaMemGetInfo`, run with this device current and the
    /// previous current device restored).
    pub fn mem_get_info(self) -> Result<(usize, usize)> {
        let _guard = CurrentDevice::set(self)?;
        raw::device::mem_info()
    }

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

    /// Blocks until all work on this device has completed (`cudaDeviceSynchronize`).
    pub fn synchronize(self) -> Result<()> {
        let _guard = CurrentDevice::set(self)?;
        raw::device::synchronize(self.ordinal)
    }
}

/// Sets a device current for a scope and restores the previous one on drop, so operations that
/// need a device current leave the caller's choice unchanged.
///
/// The current device is a setting of the calling thread, so the guard stays on the thread that
/// made it (it is neither `Send` nor `Sync`): dropped on another thread it would change that
/// thread's device instead.
///
/// ```compile_fail,E0277
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::Device;
/// use cuda_mem::launch::CurrentDevice;
/// let guard = CurrentDevice::set(Device::new(0)?)?;
/// std::thread::spawn(move || drop(guard)); // error: `*const ()` cannot be sent between threads
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CurrentDevice {
    previous: Option<c_int>,
    _this_thread: PhantomData<*const ()>,
}

impl CurrentDevice {
    /// Makes `device` current until the guard drops (no runtime call beyond `cudaGetDevice`
    /// when it already is).
    pub fn set(device: Device) -> Result<Self> {
        let current = Device::current()?;
        if current == device {
            return Ok(Self { previous: None, _this_thread: PhantomData });
        }
        device.set_current()?;
        Ok(Self { previous: Some(current.ordinal), _this_thread: PhantomData })
    }
}

impl Drop for CurrentDevice {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // A failure leaves the newer device current, which the next operation that needs a
            // device sets again.
            raw::quiet(raw::device::set_current(previous));
        }
    }
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0) (`cudaDriverGetVersion`). Returns
/// (0, 0) when no driver is installed.
pub fn driver_version() -> Result<(u32, u32)> {
    raw::device::driver_version().map(split_version)
}

/// The linked runtime's version as (major, minor) (`cudaRuntimeGetVersion`).
pub fn runtime_version() -> Result<(u32, u32)> {
    raw::device::runtime_version().map(split_version)
}

fn split_version(version: c_int) -> (u32, u32) {
    let version = version.max(0) as u32;
    (version / 1000, version % 1000 / 10)
}

#[cfg(test)]
impl Device {
    /// A device value without asking the runtime, for encoding tests on machines with no GPU.
    pub(crate) fn new_unchecked_for_tests(ordinal: i32) -> Self {
        Self { ordinal }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_split_like_cudart_version() {
        assert_eq!(super::split_version(13000), (13, 0));
        assert_eq!(super::split_version(12090), (12, 9));
    }
}
