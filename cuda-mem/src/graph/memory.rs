//! The device's graph-memory figures and trimming, as methods of [`Device`].

use crate::caching::CurrentPeak;
use crate::device::Device;
use crate::error::Result;
use crate::raw::graphs::{self, cudaGraphMemAttributeType as A};

/// Memory of a device's graph allocations (`cudaDeviceGetGraphMemAttribute`): `used` is what
/// graph allocations hold, `reserved` what the graphs' allocator holds from the system; `peak`
/// is the high watermark since the last [`Device::reset_graph_mem_peaks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphMemStats {
    /// Bytes associated with graph allocations.
    pub used: CurrentPeak,
    /// Bytes the graphs' allocator has reserved.
    pub reserved: CurrentPeak,
}

impl Device {
    /// The device's graph-memory figures.
    pub fn graph_mem_stats(self) -> Result<GraphMemStats> {
        let read = |attribute| graphs::graph_mem_attribute(self.as_raw(), attribute).map(|v| v as usize);
        Ok(GraphMemStats {
            used: CurrentPeak {
                current: read(A::cudaGraphMemAttrUsedMemCurrent)?,
                peak: read(A::cudaGraphMemAttrUsedMemHigh)?,
            },
            reserved: CurrentPeak {
                current: read(A::cudaGraphMemAttrReservedMemCurrent)?,
                peak: read(A::cudaGraphMemAttrReservedMemHigh)?,
            },
        })
    }

    /// Resets both high watermarks of [`Device::graph_mem_stats`] to the current figures.
    pub fn reset_graph_mem_peaks(self) -> Result<()> {
        graphs::reset_graph_mem_high(self.as_raw(), A::cudaGraphMemAttrUsedMemHigh)?;
        graphs::reset_graph_mem_high(self.as_raw(), A::cudaGraphMemAttrReservedMemHigh)
    }

    /// Hands graph memory that no executable graph is using back to the system
    /// (`cudaDeviceGraphMemTrim`).
    pub fn graph_mem_trim(self) -> Result<()> {
        graphs::graph_mem_trim(self.as_raw())
    }
}
