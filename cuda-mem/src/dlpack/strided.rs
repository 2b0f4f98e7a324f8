//! Blocking copies between a strided device tensor and a row-major host buffer: one
//! `cudaMemcpy2D` per run of the longest positively strided dimension (one element wide, the
//! tensor's stride as the device pitch), or one copy per element where no stride is positive.

use super::layout::Layout;
use crate::error::Result;
use crate::raw::memory::{self, Direction};
use std::ffi::c_void;

/// Which way a strided copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    /// Device tensor to host.
    Gather,
    /// Host to device tensor.
    Scatter,
}

/// Copies every element of the tensor at `base` (the address of index 0) to or from `host`,
/// which holds them row-major. For a scatter where strides name an element more than once, one
/// of the values given for it stays.
///
/// # Safety
/// `base` addresses, on the device, elements of `elem_size` bytes at every offset `layout`
/// reaches (checked by [`Layout::checked`]), readable for a gather and writable for a scatter,
/// with no other writer during the call; `host` holds exactly the elements, row-major.
pub(crate) unsafe fn copy(base: *mut c_void, layout: &Layout, elem_size: usize, host: *mut u8, way: Way) -> Result<()> {
    let along = layout.copy_dimension();
    let (height, device_pitch, host_pitch) = match along {
        Some(d) => (layout.shape[d], layout.strides[d] as usize * elem_size, layout.host_stride(d) * elem_size),
        None => (1, elem_size, elem_size),
    };
    for (device_offset, host_offset) in layout.runs(along) {
        // Within the checked span (offsets times the element size fit, and stay in the address
        // space), so plain arithmetic cannot overflow here.
        let device = base.cast::<u8>().wrapping_offset(device_offset as isize * elem_size as isize).cast::<c_void>();
        let host = host.wrapping_add(host_offset * elem_size).cast::<c_void>();
        // SAFETY: each of the `height` rows is one element of the tensor (device side: `base`
        // plus an offset the layout reaches) and one element of `host` (row-major offsets below
        // its length); the caller vouches for both sides.
        unsafe {
            match way {
                Way::Gather => {
                    memory::copy_2d(host, host_pitch, device, device_pitch, elem_size, height, Direction::DeviceToHost)?
                }
                Way::Scatter => {
                    memory::copy_2d(device, device_pitch, host, host_pitch, elem_size, height, Direction::HostToDevice)?
                }
            }
        }
    }
    Ok(())
}
