//! `MemPool`: the memory pools behind stream-ordered allocation (`cudaMallocAsync`).
//!
//! **Retention by default.** With the driver's default release threshold (0), every synchronize
//! hands a pool's free memory back to the driver, and the next `cudaMallocAsync` pays for a fresh
//! mapping, slower than `cudaMalloc` (the figures are in docs/choosing-an-allocator.md in the
//! repository). So pools that cuda-mem creates ([`MemPool::new`]) or hands out as the device
//! default ([`MemPool::device_default`]) keep their memory (`release threshold = u64::MAX`).
//! Call [`MemPool::trim_to`] to return memory, or [`MemPool::set_release_threshold`] to choose
//! another trade-off. [`MemPool::current`] returns the device's current pool untouched.
//!
//! Pools need no particular size or alignment (the source document's "32 MB aligned" rule is
//! false: 32 MiB is only the pools' internal growth step), and memory allocated on one stream
//! may be freed on another when the two are ordered by an event.

use crate::device::Device;
use crate::error::{CudaError, ErrorKind, Result};
use crate::raw::check;
use cuda_mem_sys as sys;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

/// A memory pool. Cloning shares it. Buffers allocated from it with
/// [`StreamBuffer::uninit_from`](crate::StreamBuffer::uninit_from) hold a clone, so a pool
/// cuda-mem created is destroyed only after its last allocation is gone (shared ownership rather
/// than a lifetime: per-step temporaries are stored in structs and moved across threads, and one
/// atomic increment is a small part of a pool allocation's cost).
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, MemPool, PoolProps, Stream, StreamBuffer};
/// let device = Device::current()?;
/// let pool = MemPool::new(PoolProps::new(device).max_size(1 << 30))?;
/// let stream = Stream::non_blocking()?;
/// let scratch = StreamBuffer::<f32>::zeroed_from(&pool, &stream, 16441)?; // any size is fine
/// drop(scratch); // cudaFreeAsync on `stream`
/// stream.synchronize()?;
/// assert!(pool.stats()?.reserved_current > 0); // retained for the next step
/// pool.trim_to(0)?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    raw: sys::cudaMemPool_t,
    device: Device,
    /// True for pools from `cudaMemPoolCreate`, which we destroy.
    owned: bool,
}

// SAFETY: a pool handle may be used from any thread (the runtime API is thread-safe) and the
// inner fields never change after creation.
unsafe impl Send for PoolInner {}
// SAFETY: as above; every method passes the handle to thread-safe runtime calls.
unsafe impl Sync for PoolInner {}

impl fmt::Debug for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool")
            .field("raw", &self.inner.raw)
            .field("device", &self.inner.device)
            .field("owned", &self.inner.owned)
            .finish()
    }
}

/// How a pool's memory may be shared with other processes.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, MemPool, PoolProps, ShareableHandle};
/// let props = PoolProps::new(Device::current()?).shareable(ShareableHandle::PosixFileDescriptor);
/// let exportable = MemPool::new(props)?;
/// # let _ = exportable;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ShareableHandle {
    /// Not shareable.
    #[default]
    None,
    /// Exportable as a POSIX file descriptor (`cudaMemHandleTypePosixFileDescriptor`).
    PosixFileDescriptor,
}

impl ShareableHandle {
    pub(crate) fn raw(self) -> sys::cudaMemAllocationHandleType {
        match self {
            Self::None => sys::cudaMemAllocationHandleType::cudaMemHandleTypeNone,
            Self::PosixFileDescriptor => sys::cudaMemAllocationHandleType::cudaMemHandleTypePosixFileDescriptor,
        }
    }
}

/// Properties of a pool created with [`MemPool::new`].
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, MemPool, PoolProps};
/// // 4 GiB cap; hand free memory back beyond 256 MiB at each synchronize.
/// let pool = MemPool::new(PoolProps::new(Device::current()?).max_size(4 << 30).release_threshold(256 << 20))?;
/// # let _ = pool;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolProps {
    device: Device,
    max_size: usize,
    handle: ShareableHandle,
    release_threshold: u64,
}

impl PoolProps {
    /// A pool of device memory on `device`, unbounded, not shareable, retaining its memory.
    pub fn new(device: Device) -> Self {
        Self { device, max_size: 0, handle: ShareableHandle::None, release_threshold: u64::MAX }
    }

    /// Caps the pool's reserved memory (`maxSize`); allocations beyond it fail with an
    /// out-of-memory error. 0 means the driver's default (no cap).
    pub fn max_size(mut self, bytes: usize) -> Self {
        self.max_size = bytes;
        self
    }

    /// Makes the pool exportable to other processes.
    pub fn shareable(mut self, handle: ShareableHandle) -> Self {
        self.handle = handle;
        self
    }

    /// Sets the release threshold applied after creation (default `u64::MAX`: retain everything).
    pub fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = bytes;
        self
    }

    pub(crate) fn to_raw(self) -> sys::cudaMemPoolProps {
        sys::cudaMemPoolProps {
            allocType: sys::cudaMemAllocationType::cudaMemAllocationTypePinned,
            handleTypes: self.handle.raw(),
            location: sys::cudaMemLocation {
                type_: sys::cudaMemLocationType::cudaMemLocationTypeDevice,
                id: self.device.raw(),
            },
            maxSize: self.max_size,
            ..Default::default()
        }
    }
}

/// The reuse policies of a pool (each on by default in the driver).
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, MemPool, ReusePolicy};
/// let pool = MemPool::current(Device::current()?)?;
/// // Deterministic reuse: no opportunistic cross-stream reuse.
/// pool.set_reuse_policy(ReusePolicy::AllowOpportunistic, false)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReusePolicy {
    /// Reuse memory freed on another stream when an event dependency already orders the two.
    FollowEventDependencies,
    /// Reuse memory whose free has completed, without a dependency (may vary run to run).
    AllowOpportunistic,
    /// Reuse memory by inserting a dependency on the freeing stream's work.
    AllowInternalDependencies,
}

impl ReusePolicy {
    pub(crate) fn raw(self) -> sys::cudaMemPoolAttr {
        use sys::cudaMemPoolAttr as A;
        match self {
            Self::FollowEventDependencies => A::cudaMemPoolReuseFollowEventDependencies,
            Self::AllowOpportunistic => A::cudaMemPoolReuseAllowOpportunistic,
            Self::AllowInternalDependencies => A::cudaMemPoolReuseAllowInternalDependencies,
        }
    }
}

/// Memory figures of a pool, in bytes.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, MemPool};
/// let stats = MemPool::device_default(Device::current()?)?.stats()?;
/// println!("reserved {} used {} (peak {})", stats.reserved_current, stats.used_current, stats.used_high);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Memory the pool holds from the driver now.
    pub reserved_current: u64,
    /// Highest `reserved_current` since creation or the last [`MemPool::reset_highs`].
    pub reserved_high: u64,
    /// Memory in live allocations now.
    pub used_current: u64,
    /// Highest `used_current` since creation or the last reset.
    pub used_high: u64,
}

impl MemPool {
    /// Creates a pool (`cudaMemPoolCreate`) and applies the props' release threshold (retain by
    /// default). Errors with [`ErrorKind::Unsupported`] on devices without memory pools.
    pub fn new(props: PoolProps) -> Result<Self> {
        require_pools(props.device)?;
        let raw_props = props.to_raw();
        let mut raw: sys::cudaMemPool_t = std::ptr::null_mut();
        // SAFETY: both pointers are valid; the props are fully initialised.
        check(unsafe { sys::cudaMemPoolCreate(&mut raw, &raw_props) }, || {
            format!("cudaMemPoolCreate on {} ({props:?})", props.device)
        })?;
        let pool = Self { inner: Arc::new(PoolInner { raw, device: props.device, owned: true }) };
        pool.set_release_threshold(props.release_threshold)?;
        Ok(pool)
    }

    /// The device's default pool, configured by cuda-mem to retain memory (release threshold
    /// `u64::MAX`; see the module docs). This changes the pool for the whole process.
    pub fn device_default(device: Device) -> Result<Self> {
        require_pools(device)?;
        let mut raw: sys::cudaMemPool_t = std::ptr::null_mut();
        // SAFETY: `raw` is valid for writes.
        check(unsafe { sys::cudaDeviceGetDefaultMemPool(&mut raw, device.raw()) }, || {
            format!("cudaDeviceGetDefaultMemPool on {device}")
        })?;
        let pool = Self::borrowed(raw, device);
        pool.set_release_threshold(u64::MAX)?;
        Ok(pool)
    }

    /// The device's current pool (what `cudaMallocAsync` uses), left as it is.
    pub fn current(device: Device) -> Result<Self> {
        require_pools(device)?;
        let mut raw: sys::cudaMemPool_t = std::ptr::null_mut();
        // SAFETY: `raw` is valid for writes.
        check(unsafe { sys::cudaDeviceGetMemPool(&mut raw, device.raw()) }, || {
            format!("cudaDeviceGetMemPool on {device}")
        })?;
        Ok(Self::borrowed(raw, device))
    }

    /// A pool imported from another process: ours to destroy.
    pub(crate) fn from_imported(raw: sys::cudaMemPool_t, device: Device) -> Self {
        Self { inner: Arc::new(PoolInner { raw, device, owned: true }) }
    }

    fn borrowed(raw: sys::cudaMemPool_t, device: Device) -> Self {
        Self { inner: Arc::new(PoolInner { raw, device, owned: false }) }
    }

    /// Makes this the device's current pool, used by `cudaMallocAsync` (`cudaDeviceSetMemPool`).
    /// Dropping the last clone of a created pool destroys it, which makes the device's default
    /// pool current again (the runtime's rule); allocations still alive keep working, because the
    /// runtime releases a destroyed pool only once they are freed.
    pub fn set_current(&self) -> Result<()> {
        // SAFETY: the handle is valid while `self` lives.
        check(unsafe { sys::cudaDeviceSetMemPool(self.inner.device.raw(), self.inner.raw) }, || {
            format!("cudaDeviceSetMemPool on {}", self.inner.device)
        })
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_raw(&self) -> sys::cudaMemPool_t {
        self.inner.raw
    }

    /// The device whose memory the pool holds.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Bytes of free memory the pool keeps across a synchronize.
    pub fn release_threshold(&self) -> Result<u64> {
        self.get_u64(sys::cudaMemPoolAttr::cudaMemPoolAttrReleaseThreshold)
    }

    /// Sets the release threshold (`u64::MAX`: keep everything; 0: the driver default, which
    /// returns free memory at each synchronize).
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.set_u64(sys::cudaMemPoolAttr::cudaMemPoolAttrReleaseThreshold, bytes)
    }

    /// Whether a reuse policy is enabled.
    pub fn reuse_policy(&self, policy: ReusePolicy) -> Result<bool> {
        let mut value: std::ffi::c_int = 0;
        // SAFETY: reuse attributes are `int`; `value` is valid for writes.
        let code = unsafe { sys::cudaMemPoolGetAttribute(self.inner.raw, policy.raw(), (&raw mut value).cast()) };
        check(code, || format!("cudaMemPoolGetAttribute({policy:?})"))?;
        Ok(value != 0)
    }

    /// Enables or disables a reuse policy.
    pub fn set_reuse_policy(&self, policy: ReusePolicy, enabled: bool) -> Result<()> {
        let mut value = std::ffi::c_int::from(enabled);
        // SAFETY: reuse attributes are `int`; `value` is valid for reads.
        let code = unsafe { sys::cudaMemPoolSetAttribute(self.inner.raw, policy.raw(), (&raw mut value).cast()) };
        check(code, || format!("cudaMemPoolSetAttribute({policy:?}, {enabled})"))
    }

    /// Reserved and used memory, current and high-water.
    pub fn stats(&self) -> Result<PoolStats> {
        use sys::cudaMemPoolAttr as A;
        Ok(PoolStats {
            reserved_current: self.get_u64(A::cudaMemPoolAttrReservedMemCurrent)?,
            reserved_high: self.get_u64(A::cudaMemPoolAttrReservedMemHigh)?,
            used_current: self.get_u64(A::cudaMemPoolAttrUsedMemCurrent)?,
            used_high: self.get_u64(A::cudaMemPoolAttrUsedMemHigh)?,
        })
    }

    /// Resets both high-water marks to the current values.
    pub fn reset_highs(&self) -> Result<()> {
        use sys::cudaMemPoolAttr as A;
        self.set_u64(A::cudaMemPoolAttrReservedMemHigh, 0)?;
        self.set_u64(A::cudaMemPoolAttrUsedMemHigh, 0)
    }

    /// Returns free memory to the driver until at most `min_bytes_to_keep` remain reserved beyond
    /// live allocations (`cudaMemPoolTrimTo`). Memory of pending frees is released once they
    /// complete in stream order, so synchronize first for an exact figure.
    pub fn trim_to(&self, min_bytes_to_keep: usize) -> Result<()> {
        // SAFETY: the handle is valid while `self` lives.
        check(unsafe { sys::cudaMemPoolTrimTo(self.inner.raw, min_bytes_to_keep) }, || {
            format!("cudaMemPoolTrimTo({min_bytes_to_keep})")
        })
    }

    fn get_u64(&self, attr: sys::cudaMemPoolAttr) -> Result<u64> {
        let mut value = 0u64;
        // SAFETY: these attributes are `cuuint64_t`; `value` is valid for writes.
        let code = unsafe { sys::cudaMemPoolGetAttribute(self.inner.raw, attr, (&raw mut value).cast::<c_void>()) };
        check(code, || format!("cudaMemPoolGetAttribute({})", attr.0))?;
        Ok(value)
    }

    fn set_u64(&self, attr: sys::cudaMemPoolAttr, mut value: u64) -> Result<()> {
        // SAFETY: these attributes are `cuuint64_t`; `value` is valid for reads.
        let code = unsafe { sys::cudaMemPoolSetAttribute(self.inner.raw, attr, (&raw mut value).cast::<c_void>()) };
        check(code, || format!("cudaMemPoolSetAttribute({}, {value})", attr.0))
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: created by cudaMemPoolCreate, destroyed once. Every buffer from this pool
            // held a clone, so none is alive; frees still pending in stream order are fine (the
            // runtime releases the pool once they complete).
            let _ = unsafe { sys::cudaMemPoolDestroy(self.raw) };
        }
    }
}

/// Errors with [`ErrorKind::Unsupported`] when the device has no memory pools.
pub(crate) fn require_pools(device: Device) -> Result<()> {
    if device.memory_pools_supported()? {
        return Ok(());
    }
    Err(CudaError::new(
        ErrorKind::Unsupported("memory pools / stream-ordered allocation (memoryPoolsSupported = 0)"),
        format!("using memory pools on {device}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn props_encode_as_cuda_mem_pool_props() {
        let raw = PoolProps::new(Device::new_unchecked_for_tests(2))
            .max_size(1 << 30)
            .shareable(ShareableHandle::PosixFileDescriptor)
            .to_raw();
        assert_eq!(raw.allocType, sys::cudaMemAllocationType::cudaMemAllocationTypePinned);
        assert_eq!(raw.handleTypes, sys::cudaMemAllocationHandleType::cudaMemHandleTypePosixFileDescriptor);
        assert_eq!((raw.location.type_, raw.location.id), (sys::cudaMemLocationType::cudaMemLocationTypeDevice, 2));
        assert_eq!(raw.maxSize, 1 << 30);
        assert!(raw.win32SecurityAttributes.is_null());
        assert_eq!(PoolProps::new(Device::new_unchecked_for_tests(0)).release_threshold, u64::MAX);
    }

    #[test]
    fn reuse_policies_encode_as_pool_attributes() {
        assert_eq!(ReusePolicy::FollowEventDependencies.raw().0, 1);
        assert_eq!(ReusePolicy::AllowOpportunistic.raw().0, 2);
        assert_eq!(ReusePolicy::AllowInternalDependencies.raw().0, 3);
        assert_eq!(ShareableHandle::None.raw().0, 0);
        assert_eq!(ShareableHandle::PosixFileDescriptor.raw().0, 1);
    }
}
