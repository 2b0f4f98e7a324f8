//! The cuda-mem side of each kernel and managed row, shared by `families` (criterion, against the
//! raw C++ program) and `paired` (interleaved with the same C++ read batch on the same buffers).

use cuda_mem::{
    Advice, CudaError, Device, DeviceBuffer, DeviceSlice, HostAllocFlags, Location, ManagedBuffer, PinnedBuffer, Stream,
};
use cuda_mem_bench::in_process::RawBatch;
use cuda_mem_bench::rows::Row;
use cuda_mem_kernels::stream_read_u32;
use std::time::{Duration, Instant};

/// The 4-byte pattern the C++ program writes with `memset(.., 1, ..)`.
const ONES: u32 = 0x0101_0101;

/// What a row reads.
enum Memory {
    Device(DeviceBuffer<u32>),
    /// Mapped pinned host memory, read through its device pointer (zero-copy).
    Mapped(PinnedBuffer<u32>),
    Managed(ManagedBuffer<u32>),
}

impl Memory {
    /// The device view the kernel reads.
    fn view(&self) -> Result<DeviceSlice<'_, u32>, CudaError> {
        match self {
            Memory::Device(data) => Ok(data.as_slice()),
            Memory::Mapped(host) => host.device_view(),
            Memory::Managed(data) => Ok(data.as_device_slice()),
        }
    }
}

/// One kernel or managed row, ready to run batches: per operation, (a prefetch to the device,)
/// one streaming read and a stream synchronize, as the C++ program times it.
pub(crate) struct ReadRow {
    stream: Stream,
    memory: Memory,
    sink: DeviceBuffer<u32>,
    /// First-read rows: the CPU rewrites the buffer before each batch (untimed), so the pages are
    /// back on the host.
    rewrite: bool,
    /// Prefetch to this device before each read.
    prefetch: Option<Device>,
}

impl ReadRow {
    /// Allocates and fills the row's memory (untimed), as the C++ program does.
    pub(crate) fn setup(row: &Row) -> Result<Self, CudaError> {
        let elems = (row.bytes / 4) as usize;
        let device = Device::current()?;
        let stream = Stream::non_blocking()?;
        // A managed buffer the CPU writes before each batch (so its pages start on the host).
        let first_read = |advise: bool| -> Result<Memory, CudaError> {
            let data = ManagedBuffer::<u32>::zeroed(elems)?;
            if advise {
                data.advise(Advice::SetPreferredLocation(Location::Device(device)))?;
            }
            Ok(Memory::Managed(data))
        };
        let (memory, rewrite, prefetch) = match row.key {
            "read_device_1g" => {
                let mut data = DeviceBuffer::<u32>::zeroed(elems)?;
                data.as_mut_slice().set_bytes(1)?;
                (Memory::Device(data), false, None)
            }
            "read_mapped_256m" => {
                let mut host = PinnedBuffer::<u32>::zeroed_with_flags(elems, HostAllocFlags::MAPPED)?;
                host.fill(ONES);
                (Memory::Mapped(host), false, None)
            }
            "managed_first_read_fault_1g" => (first_read(false)?, true, None),
            "managed_first_read_prefetch_1g" => (first_read(false)?, true, Some(device)),
            "managed_first_read_advise_prefetch_1g" => (first_read(true)?, true, Some(device)),
            "managed_resident_read_1g" => {
                let mut data = ManagedBuffer::<u32>::zeroed(elems)?;
                data.host_mut()?.fill(ONES);
                data.prefetch(Location::Device(device), &stream)?;
                (Memory::Managed(data), false, None)
            }
            other => unreachable!("read row {other} has no benchmark"),
        };
        let mut read = Self { stream, memory, sink: DeviceBuffer::<u32>::zeroed(1)?, rewrite, prefetch };
        if row.key == "managed_resident_read_1g" {
            read.read_once()?; // resident from here on
        }
        Ok(read)
    }

    /// One streaming read, waited for: cudaMemsetAsync of the sink + launch + synchronize.
    fn read_once(&mut self) -> Result<(), CudaError> {
        let mut sink = self.sink.as_mut_slice();
        let data = self.memory.view()?;
        self.stream.scope(|s| stream_read_u32(s, data, &mut sink))?
    }

    /// The CPU rewrite of a first-read row (untimed by both sides).
    fn rewrite_on_host(&mut self) -> Result<(), CudaError> {
        if let (true, Memory::Managed(data)) = (self.rewrite, &mut self.memory) {
            data.host_mut()?.fill(ONES);
        }
        Ok(())
    }

    /// K operations through cuda-mem; returns the time they took.
    pub(crate) fn cuda_mem(&mut self, k: u32) -> Result<Duration, CudaError> {
        self.rewrite_on_host()?;
        let start = Instant::now();
        for _ in 0..k {
            if let (Some(device), Memory::Managed(data)) = (self.prefetch, &self.memory) {
                data.prefetch(Location::Device(device), &self.stream)?;
            }
            self.read_once()?;
        }
        Ok(start.elapsed())
    }

    /// The raw C++ batch of the same operations on the same memory, sink and stream, after the
    /// same untimed rewrite.
    #[allow(dead_code, reason = "used by paired; families compares with the C++ program instead")]
    pub(crate) fn raw_batch(&mut self, blocks: u32) -> Result<RawBatch, CudaError> {
        self.rewrite_on_host()?;
        let data = self.memory.view()?.as_device_ptr().cast();
        let prefetch_device = self.prefetch.map(|d| d.ordinal() as i32);
        let sink = self.sink.as_mut_slice().as_device_ptr().cast();
        Ok(RawBatch::Reads { data, sink, blocks, prefetch_device, stream: self.stream.as_raw().cast() })
    }
}
