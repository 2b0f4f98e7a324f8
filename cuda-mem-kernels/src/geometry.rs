//! Launch geometry: enough blocks to fill every multiprocessor, computed once per device.

use cuda_mem::{CudaError, Device, DeviceAttribute, ErrorKind, Result};
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Grid and block sizes for the grid-stride kernels of this crate on one device.
///
/// Blocks have [`Geometry::BLOCK_THREADS`] threads; a full grid is as many blocks as the device
/// holds resident at once (multiprocessors × blocks per multiprocessor, the latter limited by the
/// threads a multiprocessor can hold), so every thread runs from the start and loops over its
/// share of the data. Smaller jobs get only the blocks they need.
///
/// ```
/// use cuda_mem_kernels::Geometry;
/// // An H100/H200: 132 multiprocessors of 2048 threads: 8 blocks of 256 each.
/// let geometry = Geometry::from_limits(132, 2048)?;
/// assert_eq!(geometry.resident_blocks(), 1056);
/// assert_eq!(geometry.grid_for(1000), 4);
/// assert_eq!(geometry.grid_for(1 << 30), 1056);
/// # Ok::<(), cuda_mem::CudaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    multiprocessors: u32,
    blocks_per_multiprocessor: u32,
}

/// Geometries already computed, by device ordinal.
static CACHE: Mutex<BTreeMap<usize, Geometry>> = Mutex::new(BTreeMap::new());

/// The largest grid (`maxGridSize[0]`, the same on every supported device).
const MAX_GRID: u32 = i32::MAX as u32;

impl Geometry {
    /// Threads per block of every grid-stride kernel (a multiple of the warp size).
    pub const BLOCK_THREADS: u32 = 256;

    /// The geometry of a device with `multiprocessors` multiprocessors that each hold up to
    /// `max_threads_per_multiprocessor` resident threads. Errors if either is too small for one
    /// block.
    pub fn from_limits(multiprocessors: usize, max_threads_per_multiprocessor: usize) -> Result<Self> {
        let operation = || {
            format!("launch geometry for {multiprocessors} multiprocessors of {max_threads_per_multiprocessor} threads")
        };
        if multiprocessors == 0 {
            return Err(CudaError::new(
                ErrorKind::InvalidArgument("a device needs at least one multiprocessor"),
                operation(),
            ));
        }
        let blocks = max_threads_per_multiprocessor / Self::BLOCK_THREADS as usize;
        if blocks == 0 {
            let kind =
                ErrorKind::InvalidArgument("a multiprocessor must hold at least one block of BLOCK_THREADS threads");
            return Err(CudaError::new(kind, operation()));
        }
        let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(Self { multiprocessors: clamp(multiprocessors), blocks_per_multiprocessor: clamp(blocks) })
    }

    /// The geometry of `device`, read from its attributes the first time and cached afterwards.
    pub fn for_device(device: Device) -> Result<Self> {
        let ordinal = device.ordinal();
        if let Some(geometry) = CACHE.lock().unwrap_or_else(PoisonError::into_inner).get(&ordinal) {
            return Ok(*geometry);
        }
        let multiprocessors = device.multiprocessor_count()?;
        let threads = device.attribute(DeviceAttribute::MaxThreadsPerMultiProcessor)?;
        let geometry = Self::from_limits(multiprocessors, usize::try_from(threads).unwrap_or(0))?;
        CACHE.lock().unwrap_or_else(PoisonError::into_inner).insert(ordinal, geometry);
        Ok(geometry)
    }

    /// Number of multiprocessors.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// Blocks of [`Geometry::BLOCK_THREADS`] threads one multiprocessor holds at once.
    pub fn blocks_per_multiprocessor(&self) -> u32 {
        self.blocks_per_multiprocessor
    }

    /// Blocks the whole device holds at once: the largest grid the kernels are launched with.
    pub fn resident_blocks(&self) -> u32 {
        self.multiprocessors.saturating_mul(self.blocks_per_multiprocessor).min(MAX_GRID)
    }

    /// Blocks for a grid-stride kernel with `work_items` independent items: one thread per item
    /// up to [`Geometry::resident_blocks`], and always at least one block.
    pub fn grid_for(&self, work_items: usize) -> u32 {
        let needed = work_items.div_ceil(Self::BLOCK_THREADS as usize).max(1);
        u32::try_from(needed).unwrap_or(u32::MAX).min(self.resident_blocks())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fills_every_multiprocessor() {
        // A100: 108 SMs of 2048 threads; H100/H200 SXM: 132; a small part of 1536-thread SMs.
        let a100 = Geometry::from_limits(108, 2048).unwrap();
        assert_eq!((a100.multiprocessors(), a100.blocks_per_multiprocessor()), (108, 8));
        assert_eq!(a100.resident_blocks(), 864);
        let h200 = Geometry::from_limits(132, 2048).unwrap();
        assert_eq!(h200.resident_blocks(), 1056);
        let small = Geometry::from_limits(20, 1536).unwrap();
        assert_eq!((small.blocks_per_multiprocessor(), small.resident_blocks()), (6, 120));
        // Threads that do not fill a whole block are not counted.
        assert_eq!(Geometry::from_limits(1, 511).unwrap().blocks_per_multiprocessor(), 1);
    }

    #[test]
    fn grid_covers_small_jobs_and_caps_large_ones() {
        let g = Geometry::from_limits(132, 2048).unwrap();
        assert_eq!(g.grid_for(0), 1);
        assert_eq!(g.grid_for(1), 1);
        assert_eq!(g.grid_for(256), 1);
        assert_eq!(g.grid_for(257), 2);
        assert_eq!(g.grid_for(1056 * 256), 1056);
        assert_eq!(g.grid_for(1056 * 256 + 1), 1056);
        assert_eq!(g.grid_for(usize::MAX), 1056);
        let huge = Geometry::from_limits(usize::MAX, usize::MAX).unwrap();
        assert_eq!(huge.resident_blocks(), MAX_GRID);
    }

    #[test]
    fn impossible_limits_are_typed_errors() {
        let err = Geometry::from_limits(0, 2048).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
        let err = Geometry::from_limits(4, 255).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("255 threads"), "{err}");
    }
}
