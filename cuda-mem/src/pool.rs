//! `MemPool`: the memory pools behind stream-ordered allocation (`cudaMallocAsync`).
//!
//! **Retention by default.** With the driver's default release threshold (0), every synchronize
//! hands a pool's free memory back to the driver, and the next `cudaMallocAsync` pays for a fresh
//! mapping (docs/choosing-an-allocator.md in the repository has the figures). So pools that cuda-mem creates
//! ([`MemPool::new`]) keep their memory (`release threshold = usize::MAX`), and the default
//! stream-ordered path ([`StreamBuffer::zeroed`](crate::StreamBuffer::zeroed),
//! [`default_resource`](crate::resource::default_resource)) allocates from one such pool per
//! device, [`MemPool::retaining`], created on first use. Call [`MemPool::trim_to`] to return
//! memory, or [`MemPool::set_release_threshold`] to choose another trade-off. cuda-mem never
//! reconfigures the driver's pools: [`MemPool::driver_default`] and [`MemPool::current`] return
//! them as they are.
//!
//! Pools need no particular size or alignment (the source document's "32 MB aligned" rule is
//! false: 32 MiB is only the pools' internal growth step), and memory allocated on one stream
//! may be freed on another when the two are ordered by an event.

use crate::device::Device;
use crate::error::{CudaError, ErrorKind, Result};
use crate::maybe_owned::MaybeOwned;
use crate::pool_stats::PoolStats;
use crate::raw;
use std::collections::HashMap;
use std::ffi::c_int;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

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
    raw: raw::cudaMemPool_t,
    device: Device,
    /// True for pools from `cudaMemPoolCreate`, which we destroy.
    owned: bool,
}

// SAFETY: a pool handle names one pool of one device from any thread, whatever device is current
// there, and the runtime API is thread-safe: another thread may allocate from it, read and set its
// attributes, trim it, or destroy it with the last clone (an owned pool outlives every handle, and
// the driver's pools are never destroyed). The fields never change after creation.
unsafe impl Send for PoolInner {}
// SAFETY: as above; every method takes &self and passes the handle to thread-safe runtime calls.
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
    pub(crate) fn as_raw(self) -> raw::cudaMemAllocationHandleType {
        use raw::cudaMemAllocationHandleType as H;
        match self {
            Self::None => H::cudaMemHandleTypeNone,
            Self::PosixFileDescriptor => H::cudaMemHandleTypePosixFileDescriptor,
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
    release_threshold: usize,
}

impl PoolProps {
    /// A pool of device memory on `device`, unbounded, not shareable, retaining its memory.
    pub fn new(device: Device) -> Self {
        Self { device, max_size: 0, handle: ShareableHandle::None, release_threshold: usize::MAX }
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

    /// Sets the release threshold applied after creation (default `usize::MAX`: retain
    /// everything).
    pub fn release_threshold(mut self, bytes: usize) -> Self {
        self.release_threshold = bytes;
        self
    }

    pub(crate) fn to_raw(self) -> raw::cudaMemPoolProps {
        raw::pools::device_pool_props(self.device.as_raw(), self.handle.as_raw(), self.max_size)
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
    pub(crate) fn as_raw(self) -> raw::cudaMemPoolAttr {
        use raw::cudaMemPoolAttr as A;
        match self {
            Self::FollowEventDependencies => A::cudaMemPoolReuseFollowEventDependencies,
            Self::AllowOpportunistic => A::cudaMemPoolReuseAllowOpportunistic,
            Self::AllowInternalDependencies => A::cudaMemPoolReuseAllowInternalDependencies,
        }
    }
}

impl MemPool {
    /// Creates a pool (`cudaMemPoolCreate`) and applies the props' release threshold (retain by
    /// default). Errors with [`ErrorKind::Unsupported`] on devices without memory pools.
    pub fn new(props: PoolProps) -> Result<Self> {
        require_pools(props.device)?;
        let raw = raw::pools::create(&props.to_raw(), || format!("{} ({props:?})", props.device))?;
        let pool = Self { inner: Arc::new(PoolInner { raw, device: props.device, owned: true }) };
        pool.set_release_threshold(props.release_threshold)?;
        Ok(pool)
    }

    /// cuda-mem's pool for `device`: created on first use with [`PoolProps::new`] (retaining its
    /// memory, no cap), shared by the whole process and never destroyed. The default
    /// stream-ordered path allocates from it ([`StreamBuffer::zeroed`](crate::StreamBuffer::zeroed),
    /// [`default_resource`](crate::resource::default_resource)); the driver's pools are untouched.
    pub fn retaining(device: Device) -> Result<Self> {
        retaining_pool(device).cloned()
    }

    /// The driver's default pool of `device` (`cudaDeviceGetDefaultMemPool`), as it is: release
    /// threshold 0 unless someone changed it, so each synchronize returns its free memory.
    pub fn driver_default(device: Device) -> Result<Self> {
        require_pools(device)?;
        Ok(Self::borrowed(raw::pools::driver_default(device.as_raw())?, device))
    }

    /// The device's current pool (what `cudaMallocAsync` uses, `cudaDeviceGetMemPool`), as it is:
    /// the driver's default pool, or the pool made current with [`MemPool::set_current`] (a clone
    /// of it: the pool lives at least as long as the handle). A pool made current by code outside
    /// cuda-mem is refused with [`ErrorKind::Unsupported`]: nothing tells how long it lives.
    pub fn current(device: Device) -> Result<Self> {
        require_pools(device)?;
        let raw = raw::pools::current(device.as_raw())?;
        if let Some(pool) = lock(current_pools()).get(&device.as_raw()).filter(|pool| pool.as_raw() == raw) {
            return Ok(pool.clone());
        }
        if raw == raw::pools::driver_default(device.as_raw())? {
            return Ok(Self::borrowed(raw, device));
        }
        Err(CudaError::new(
            ErrorKind::Unsupported("a current pool set outside cuda-mem (its lifetime is unknown)"),
            format!("MemPool::current on {device}"),
        ))
    }

    /// A pool imported from another process: ours to destroy.
    pub(crate) fn from_imported(raw: raw::cudaMemPool_t, device: Device) -> Self {
        Self { inner: Arc::new(PoolInner { raw, device, owned: true }) }
    }

    fn borrowed(raw: raw::cudaMemPool_t, device: Device) -> Self {
        Self { inner: Arc::new(PoolInner { raw, device, owned: false }) }
    }

    /// Makes this the device's current pool, used by `cudaMallocAsync` (`cudaDeviceSetMemPool`).
    /// cuda-mem keeps a clone while the pool is current, so it is destroyed only after another
    /// pool has been made current with this method and its last clone is gone.
    pub fn set_current(&self) -> Result<()> {
        let device = self.inner.device;
        let mut current = lock(current_pools());
        // SAFETY: the handle is valid while `self` lives, and `current` keeps a clone while it
        // is current.
        unsafe { raw::pools::set_current(device.as_raw(), self.inner.raw)? };
        // The pool this replaces may be destroyed here, now that it is no longer current.
        current.insert(device.as_raw(), self.clone());
        Ok(())
    }

    /// The raw handle, valid while `self` lives.
    pub fn as_raw(&self) -> raw::cudaMemPool_t {
        self.inner.raw
    }

    /// The device whose memory the pool holds.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Bytes of free memory the pool keeps across a synchronize.
    pub fn release_threshold(&self) -> Result<usize> {
        self.get_u64(raw::cudaMemPoolAttr::cudaMemPoolAttrReleaseThreshold)
    }

    /// Sets the release threshold (`usize::MAX`: keep everything; 0: the driver default, which
    /// returns free memory at each synchronize).
    pub fn set_release_threshold(&self, bytes: usize) -> Result<()> {
        self.set_u64(raw::cudaMemPoolAttr::cudaMemPoolAttrReleaseThreshold, bytes)
    }

    /// Whether a reuse policy is enabled.
    pub fn reuse_policy(&self, policy: ReusePolicy) -> Result<bool> {
        // SAFETY: the handle is valid while `self` lives; reuse attributes are `int`.
        unsafe { raw::pools::flag(self.inner.raw, policy.as_raw()) }
    }

    /// Enables or disables a reuse policy.
    pub fn set_reuse_policy(&self, policy: ReusePolicy, enabled: bool) -> Result<()> {
        // SAFETY: the handle is valid while `self` lives; reuse attributes are `int`.
        unsafe { raw::pools::set_flag(self.inner.raw, policy.as_raw(), enabled) }
    }

    /// Reserved and used memory, current and high-water.
    pub fn stats(&self) -> Result<PoolStats> {
        use raw::cudaMemPoolAttr as A;
        Ok(PoolStats {
            reserved_current: self.get_u64(A::cudaMemPoolAttrReservedMemCurrent)?,
            reserved_high: self.get_u64(A::cudaMemPoolAttrReservedMemHigh)?,
            used_current: self.get_u64(A::cudaMemPoolAttrUsedMemCurrent)?,
            used_high: self.get_u64(A::cudaMemPoolAttrUsedMemHigh)?,
        })
    }

    /// Resets both high-water marks to the current values.
    pub fn reset_highs(&self) -> Result<()> {
        use raw::cudaMemPoolAttr as A;
        self.set_u64(A::cudaMemPoolAttrReservedMemHigh, 0)?;
        self.set_u64(A::cudaMemPoolAttrUsedMemHigh, 0)
    }

    /// Returns free memory to the driver until at most `min_bytes_to_keep` remain reserved beyond
    /// live allocations (`cudaMemPoolTrimTo`). Memory of pending frees is released once they
    /// complete in stream order, so synchronize first for an exact figure.
    pub fn trim_to(&self, min_bytes_to_keep: usize) -> Result<()> {
        // SAFETY: the handle is valid while `self` lives.
        unsafe { raw::pools::trim_to(self.inner.raw, min_bytes_to_keep) }
    }

    /// A `cuuint64_t` attribute, as a byte count (saturating where `usize` is narrower).
    fn get_u64(&self, attr: raw::cudaMemPoolAttr) -> Result<usize> {
        // SAFETY: the handle is valid while `self` lives; callers pass `cuuint64_t` attributes.
        unsafe { raw::pools::bytes(self.inner.raw, attr) }
    }

    fn set_u64(&self, attr: raw::cudaMemPoolAttr, value: usize) -> Result<()> {
        // SAFETY: as for `get_u64`.
        unsafe { raw::pools::set_bytes(self.inner.raw, attr, value) }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: created by cudaMemPoolCreate, destroyed once. Every buffer from this pool
            // held a clone, so none is alive; frees still pending in stream order are fine (the
            // runtime releases the pool once they complete).
            raw::quiet(unsafe { raw::pools::destroy(self.raw) });
        }
    }
}

/// The pools made current through [`MemPool::set_current`], by device ordinal: kept alive while
/// current, so [`MemPool::current`] can hand out owning clones.
fn current_pools() -> &'static Mutex<HashMap<c_int, MemPool>> {
    static CURRENT: OnceLock<Mutex<HashMap<c_int, MemPool>>> = OnceLock::new();
    CURRENT.get_or_init(Default::default)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// cuda-mem's retaining pool of `device`, created on first use (see [`MemPool::retaining`]).
/// After the first call for a device this is two atomic loads: it sits on the allocation path.
#[inline]
pub(crate) fn retaining_pool(device: Device) -> Result<&'static MemPool> {
    static POOLS: OnceLock<Box<[OnceLock<MemPool>]>> = OnceLock::new();
    let slots = match POOLS.get() {
        Some(slots) => slots,
        None => {
            let count = Device::count()?;
            POOLS.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect())
        }
    };
    let Some(slot) = slots.get(device.ordinal()) else {
        let kind = ErrorKind::InvalidDevice { ordinal: device.as_raw(), count: slots.len() as c_int };
        return Err(CudaError::new(kind, "MemPool::retaining"));
    };
    if let Some(pool) = slot.get() {
        return Ok(pool);
    }
    create_retaining(slot, device)
}

#[cold]
fn create_retaining(slot: &'static OnceLock<MemPool>, device: Device) -> Result<&'static MemPool> {
    static CREATING: Mutex<()> = Mutex::new(());
    let _creating = lock(&CREATING);
    if let Some(pool) = slot.get() {
        return Ok(pool);
    }
    // A capture on this thread (global or thread-local mode) refuses cudaMemPoolCreate, and the
    // first stream-ordered allocation may come from inside one. Creating a pool is no stream
    // operation and the graph does not record it, so the thread is relaxed for the call.
    let pool = raw::graphs::with_capture_relaxed(|| MemPool::new(PoolProps::new(device)), drop)?;
    Ok(slot.get_or_init(|| pool))
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

/// A `MemPool` given by value to what takes `impl Into<MaybeOwned<MemPool>>`: kept alive by it.
impl From<MemPool> for MaybeOwned<'_, MemPool> {
    fn from(pool: MemPool) -> Self {
        Self::Owned(pool)
    }
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
        assert_eq!(raw.allocType, raw::cudaMemAllocationType::cudaMemAllocationTypePinned);
        assert_eq!(raw.handleTypes, raw::cudaMemAllocationHandleType::cudaMemHandleTypePosixFileDescriptor);
        assert_eq!((raw.location.type_, raw.location.id), (raw::cudaMemLocationType::cudaMemLocationTypeDevice, 2));
        assert_eq!(raw.maxSize, 1 << 30);
        assert!(raw.win32SecurityAttributes.is_null());
        assert_eq!(PoolProps::new(Device::new_unchecked_for_tests(0)).release_threshold, usize::MAX);
    }

    #[test]
    fn reuse_policies_encode_as_pool_attributes() {
        assert_eq!(ReusePolicy::FollowEventDependencies.as_raw().0, 1);
        assert_eq!(ReusePolicy::AllowOpportunistic.as_raw().0, 2);
        assert_eq!(ReusePolicy::AllowInternalDependencies.as_raw().0, 3);
        assert_eq!(ShareableHandle::None.as_raw().0, 0);
        assert_eq!(ShareableHandle::PosixFileDescriptor.as_raw().0, 1);
    }
}
