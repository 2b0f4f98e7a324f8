//! `PoolStats`: a pool's memory figures, a leaf type that errors and resources report too.

/// Memory figures of a pool, in bytes.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{Device, MemPool};
/// let stats = MemPool::retaining(Device::current()?)?.stats()?;
/// println!("reserved {} used {} (peak {})", stats.reserved_current, stats.used_current, stats.used_high);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Memory the pool holds from the driver now.
    pub reserved_current: usize,
    /// Highest `reserved_current` since creation or the last [`MemPool::reset_highs`](crate::MemPool::reset_highs).
    pub reserved_high: usize,
    /// Memory in live allocations now.
    pub used_current: usize,
    /// Highest `used_current` since creation or the last reset.
    pub used_high: usize,
}
