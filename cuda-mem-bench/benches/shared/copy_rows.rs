//! The cuda-mem side of each copy row, shared by `families` (criterion, against the raw C++
//! program) and `paired` (interleaved with the same C++ batch between the same buffers).

use cuda_mem::{CudaError, DeviceBuffer, HostAllocFlags, HostRegisterFlags, PinnedBuffer, RegisteredHost};
use cuda_mem_bench::rows::{self, Row};
use std::time::{Duration, Instant};

/// Host memory of one copy row: what the C++ program copies from or into.
pub(crate) enum Host<'a> {
    Pageable(Vec<u8>),
    Pinned(PinnedBuffer<u8>),
    Registered(RegisteredHost<'a, u8>),
}

impl Host<'_> {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Host::Pageable(v) => v,
            Host::Pinned(p) => p,
            Host::Registered(r) => r,
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Host::Pageable(v) => v,
            Host::Pinned(p) => p,
            Host::Registered(r) => r,
        }
    }
}

/// What one copy row copies between, set up (untimed) as the C++ program does.
pub(crate) enum CopyRow<'a> {
    /// `d2d`: device to device, waiting for the legacy stream after each copy.
    DeviceToDevice { src: DeviceBuffer<u8>, dst: DeviceBuffer<u8> },
    /// `h2d_*` (`upload`) and `d2h_*`.
    HostDevice { upload: bool, host: Host<'a>, device: DeviceBuffer<u8> },
}

impl<'a> CopyRow<'a> {
    /// Allocates and fills the row's buffers; a registered row registers `registered` (resized
    /// to the copy size) once, here.
    pub(crate) fn setup(row: &Row, registered: &'a mut Vec<u8>) -> Result<Self, CudaError> {
        let bytes = rows::COPY_BYTES as usize;
        if row.key == "d2d" {
            let src = DeviceBuffer::<u8>::from_slice(&vec![1u8; bytes])?;
            return Ok(CopyRow::DeviceToDevice { src, dst: DeviceBuffer::<u8>::zeroed(bytes)? });
        }
        let (direction, kind) = row.key.split_once('_').expect("copy keys are <direction>_<kind>");
        let host = match kind {
            "pageable" => Host::Pageable(vec![1u8; bytes]), // every page written, like the C++ memset
            "pinned" => Host::Pinned(PinnedBuffer::from_slice(&vec![1u8; bytes], HostAllocFlags::empty())?),
            "wc" => Host::Pinned(PinnedBuffer::from_slice(&vec![1u8; bytes], HostAllocFlags::WRITE_COMBINED)?),
            "registered" => {
                registered.resize(bytes, 1);
                Host::Registered(RegisteredHost::new(registered.as_mut_slice(), HostRegisterFlags::empty())?)
            }
            other => unreachable!("copy row kind {other} has no benchmark"),
        };
        Ok(CopyRow::HostDevice {
            upload: direction == "h2d",
            host,
            device: DeviceBuffer::<u8>::from_slice(&vec![1u8; bytes])?,
        })
    }

    /// K copies through cuda-mem; returns the time they took.
    pub(crate) fn cuda_mem(&mut self, k: u32) -> Result<Duration, CudaError> {
        let start = Instant::now();
        for _ in 0..k {
            match self {
                CopyRow::DeviceToDevice { src, dst } => dst.as_mut_slice().copy_from_device(src.as_slice())?,
                CopyRow::HostDevice { upload: true, host, device } => {
                    device.as_mut_slice().copy_from_host(host.bytes())?
                }
                CopyRow::HostDevice { upload: false, host, device } => {
                    device.as_slice().copy_to_host(host.bytes_mut())?
                }
            }
        }
        Ok(start.elapsed())
    }

    /// (dst, src, `cudaMemcpyKind`, wait for the legacy stream) of the same copy, for the raw batch.
    #[allow(dead_code, reason = "used by paired; families compares with the C++ program instead")]
    pub(crate) fn raw_copy(&mut self) -> (*mut std::ffi::c_void, *const std::ffi::c_void, u32, bool) {
        use cuda_mem::sys::cudaMemcpyKind as Kind;
        match self {
            CopyRow::DeviceToDevice { src, dst } => (
                dst.as_mut_slice().as_device_ptr().cast(),
                src.as_slice().as_device_ptr().cast(),
                Kind::cudaMemcpyDeviceToDevice.0,
                true,
            ),
            CopyRow::HostDevice { upload: true, host, device } => (
                device.as_mut_slice().as_device_ptr().cast(),
                host.bytes().as_ptr().cast(),
                Kind::cudaMemcpyHostToDevice.0,
                false,
            ),
            CopyRow::HostDevice { upload: false, host, device } => (
                host.bytes_mut().as_mut_ptr().cast(),
                device.as_slice().as_device_ptr().cast(),
                Kind::cudaMemcpyDeviceToHost.0,
                false,
            ),
        }
    }
}
