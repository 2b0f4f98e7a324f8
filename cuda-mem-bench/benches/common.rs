//! The cuda-mem side of every catalogue row, shared by `families` (criterion, against the raw C++
//! program) and `paired` (interleaved in one process with the same C++ batch on the same memory
//! and streams), with that raw batch. Like the C++ loops, each operation is the call and its free
//! with nothing in between: the runtime calls cannot be optimised away, so no `black_box` is
//! needed (it would store the buffer to memory).

use cuda_mem::resource::{LimitingResource, MemoryResource, PoolResource, StatisticsResource, TrackingResource};
use cuda_mem::sys::cudaMemcpyKind as Kind;
use cuda_mem::{Advice, CudaError, Device, DeviceBuffer, DeviceSlice, HostAllocFlags, HostRegisterFlags, Location};
use cuda_mem::{ManagedBuffer, MemPool, PinnedBuffer, PoolProps, RegisteredHost, Stream, StreamBuffer};
use cuda_mem_bench::in_process::RawBatch;
use cuda_mem_bench::rows::{Row, Section};
use cuda_mem_kernels::stream_read_u32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Makes device 0 current. Without a usable GPU: exits with status 2 and one sentence when
/// benchmarking, or reports the benchmark skipped (`cargo test --all-targets` runs it as a test).
pub fn require_gpu(name: &str, benchmarking: bool) {
    let present = match Device::count() {
        Ok(0) => Err("0 devices".into()),
        Ok(_) => Device::new(0).and_then(|d| d.set_current()).map_err(|e| e.to_string()),
        Err(e) => Err(e.code().map_or_else(|| e.to_string(), |code| code.name().into_owned())),
    };
    if let Err(reason) = present {
        if benchmarking {
            eprintln!("{name}: no usable CUDA GPU ({reason}), so there is nothing to benchmark: run it on a GPU host.");
            std::process::exit(2);
        }
        eprintln!("{name}: skipped, no usable CUDA GPU ({reason}); this benchmark needs a GPU host.");
        std::process::exit(0);
    }
}

/// K operations timed: the time `op` took K times.
pub fn timed(k: u32, mut op: impl FnMut() -> Result<(), CudaError>) -> Result<Duration, CudaError> {
    let start = Instant::now();
    for _ in 0..k {
        op()?;
    }
    Ok(start.elapsed())
}

/// One catalogue row, set up (untimed) as the C++ program sets it up.
pub trait Side {
    /// K operations through cuda-mem; the time they took.
    fn cuda_mem(&mut self, k: u32) -> Result<Duration, CudaError>;
    /// The raw C++ batch of the same operations on the same memory and stream (after the same
    /// untimed preparation).
    #[allow(dead_code, reason = "paired runs the raw batches; families compares with raw_reference instead")]
    fn raw(&mut self) -> Result<RawBatch, CudaError>;
}

/// The row's memory and streams; a registered copy row registers `registered` (resized to the
/// copy) once, here.
pub fn setup<'a>(row: &Row, registered: &'a mut Vec<u8>) -> Result<Box<dyn Side + 'a>, CudaError> {
    Ok(match row.section {
        Section::Alloc => Box::new(AllocRow::setup(row)?),
        Section::Bandwidth => Box::new(CopyRow::setup(row, registered)?),
        _ => Box::new(ReadRow::setup(row)?),
    })
}

/// The stream and pool of a stream-ordered row, configured as the row says.
pub struct Ordered {
    pub bytes: usize,
    pub stream: Stream,
    /// cuda-mem's retaining pool (what the default path allocates from), or for `pool_odd` a
    /// created pool; the raw batch allocates from it too.
    pub pool: MemPool,
    /// Allocate through the default path, `StreamBuffer::uninit` (else `uninit_from(pool)`).
    pub default_path: bool,
    pub sync_each: bool,
}

/// One allocation row: what one pair allocates, and how many bytes.
pub enum AllocRow {
    Device(usize),
    /// `cudaMallocHost` without flags, else `cudaHostAlloc`.
    Pinned(usize, HostAllocFlags),
    Managed(usize),
    Ordered(Ordered),
}

impl AllocRow {
    pub fn setup(row: &Row) -> Result<Self, CudaError> {
        let bytes = row.bytes as usize;
        let ordered = |default_path, pool: MemPool, sync_each| -> Result<_, CudaError> {
            Ok(AllocRow::Ordered(Ordered { bytes, stream: Stream::non_blocking()?, pool, default_path, sync_each }))
        };
        Ok(match row.family() {
            "malloc" => AllocRow::Device(bytes),
            "malloc_host" => AllocRow::Pinned(bytes, HostAllocFlags::empty()),
            "host_alloc_portable" => AllocRow::Pinned(bytes, HostAllocFlags::PORTABLE),
            "host_alloc_mapped" => AllocRow::Pinned(bytes, HostAllocFlags::MAPPED),
            "host_alloc_wc" => AllocRow::Pinned(bytes, HostAllocFlags::WRITE_COMBINED),
            "managed" => AllocRow::Managed(bytes),
            family @ ("async_default_sync" | "async_retain_sync" | "async_retain_nosync") => {
                let pool = MemPool::retaining(Device::current()?)?;
                if family == "async_default_sync" {
                    pool.set_release_threshold(0)?; // the driver's default
                }
                ordered(true, pool, family != "async_retain_nosync")?
            }
            "pool_odd" => ordered(false, MemPool::new(PoolProps::new(Device::current()?))?, false)?,
            family => unreachable!("alloc row family {family}"),
        })
    }
}

impl Side for AllocRow {
    fn cuda_mem(&mut self, k: u32) -> Result<Duration, CudaError> {
        match self {
            // SAFETY: dropped (cudaFree) without being read.
            AllocRow::Device(bytes) => timed(k, || unsafe { DeviceBuffer::<u8>::uninit(*bytes) }.map(drop)),
            AllocRow::Pinned(bytes, flags) => {
                // SAFETY: dropped (cudaFreeHost) without being read.
                timed(k, || unsafe { PinnedBuffer::<u8>::uninit(*bytes, *flags) }.map(drop))
            }
            // ManagedBuffer has only zeroed constructors: the CPU writes every byte, as the C++ batch does.
            AllocRow::Managed(bytes) => timed(k, || ManagedBuffer::<u8>::zeroed(*bytes).map(drop)),
            AllocRow::Ordered(o) => {
                let start = Instant::now();
                for _ in 0..k {
                    // SAFETY: dropped (cudaFreeAsync) without being read.
                    drop(unsafe {
                        if o.default_path {
                            StreamBuffer::<u8>::uninit(&o.stream, o.bytes)?
                        } else {
                            StreamBuffer::<u8>::uninit_from(&o.pool, &o.stream, o.bytes)?
                        }
                    });
                    if o.sync_each {
                        o.stream.synchronize()?;
                    }
                }
                if !o.sync_each {
                    o.stream.synchronize()?;
                }
                Ok(start.elapsed())
            }
        }
    }

    fn raw(&mut self) -> Result<RawBatch, CudaError> {
        Ok(match self {
            AllocRow::Device(_) => RawBatch::Device,
            AllocRow::Pinned(_, flags) if flags.is_empty() => RawBatch::MallocHost,
            AllocRow::Pinned(_, flags) => RawBatch::HostAlloc(flags.bits()),
            AllocRow::Managed(_) => RawBatch::Managed,
            AllocRow::Ordered(o) => RawBatch::StreamOrdered {
                pool: o.pool.as_raw().cast(),
                stream: o.stream.as_raw().cast(),
                sync_each: o.sync_each,
            },
        })
    }
}

impl Drop for AllocRow {
    fn drop(&mut self) {
        // Leave cuda-mem's pool as it hands it out (retaining), whatever ran.
        if let AllocRow::Ordered(o) = self
            && o.default_path
        {
            let _ = o.pool.set_release_threshold(usize::MAX);
        }
    }
}

/// Host memory of one copy row: what the C++ program copies from or into.
enum Host<'a> {
    Pageable(Vec<u8>),
    Pinned(PinnedBuffer<u8>),
    Registered(RegisteredHost<'a, u8>),
}

impl Host<'_> {
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Host::Pageable(v) => v,
            Host::Pinned(p) => p,
            Host::Registered(r) => r,
        }
    }
}

/// One copy row: `d2d` (device to device, waiting for the legacy stream after each copy, as
/// `copy_from_device` does) or host and device (`upload`: `h2d_*`).
enum CopyRow<'a> {
    DeviceToDevice { src: DeviceBuffer<u8>, dst: DeviceBuffer<u8> },
    HostDevice { upload: bool, host: Host<'a>, device: DeviceBuffer<u8> },
}

impl<'a> CopyRow<'a> {
    fn setup(row: &Row, registered: &'a mut Vec<u8>) -> Result<Self, CudaError> {
        let bytes = row.bytes as usize;
        let filled = || DeviceBuffer::<u8>::from_slice(&vec![1u8; bytes]);
        if row.key == "d2d" {
            return Ok(CopyRow::DeviceToDevice { src: filled()?, dst: DeviceBuffer::<u8>::zeroed(bytes)? });
        }
        let (direction, kind) = row.key.split_once('_').expect("copy keys are <direction>_<kind>");
        let pinned = |flags| PinnedBuffer::from_slice(&vec![1u8; bytes], flags).map(Host::Pinned);
        let host = match kind {
            "pageable" => Host::Pageable(vec![1u8; bytes]), // every page written, like the C++ memset
            "pinned" => pinned(HostAllocFlags::empty())?,
            "wc" => pinned(HostAllocFlags::WRITE_COMBINED)?,
            "registered" => {
                registered.resize(bytes, 1);
                Host::Registered(RegisteredHost::new(registered.as_mut_slice(), HostRegisterFlags::empty())?)
            }
            other => unreachable!("copy row kind {other}"),
        };
        Ok(CopyRow::HostDevice { upload: direction == "h2d", host, device: filled()? })
    }
}

impl Side for CopyRow<'_> {
    fn cuda_mem(&mut self, k: u32) -> Result<Duration, CudaError> {
        timed(k, || match self {
            CopyRow::DeviceToDevice { src, dst } => dst.as_mut_slice().copy_from_device(src.as_slice()),
            CopyRow::HostDevice { upload: true, host, device } => device.as_mut_slice().copy_from_host(host.bytes()),
            CopyRow::HostDevice { upload: false, host, device } => device.as_slice().copy_to_host(host.bytes()),
        })
    }

    fn raw(&mut self) -> Result<RawBatch, CudaError> {
        let (dst, src, kind, sync_legacy) = match self {
            CopyRow::DeviceToDevice { src, dst } => (
                dst.as_mut_slice().as_device_ptr(),
                src.as_slice().as_device_ptr(),
                Kind::cudaMemcpyDeviceToDevice,
                true,
            ),
            CopyRow::HostDevice { upload: true, host, device } => {
                (device.as_mut_slice().as_device_ptr(), host.bytes().as_ptr(), Kind::cudaMemcpyHostToDevice, false)
            }
            CopyRow::HostDevice { upload: false, host, device } => {
                (host.bytes().as_mut_ptr(), device.as_slice().as_device_ptr(), Kind::cudaMemcpyDeviceToHost, false)
            }
        };
        Ok(RawBatch::Copy { dst: dst.cast(), src: src.cast(), kind: kind.0, sync_legacy })
    }
}

/// The 4-byte pattern the C++ program writes with `memset(.., 1, ..)`.
const ONES: u32 = 0x0101_0101;

/// What a read row reads: device memory, mapped pinned host memory (through its device pointer),
/// or managed memory.
enum Memory {
    Device(DeviceBuffer<u32>),
    Mapped(PinnedBuffer<u32>),
    Managed(ManagedBuffer<u32>),
}

impl Memory {
    fn view(&self) -> Result<DeviceSlice<'_, u32>, CudaError> {
        match self {
            Memory::Device(data) => Ok(data.as_slice()),
            Memory::Mapped(host) => host.device_view(),
            Memory::Managed(data) => Ok(data.as_slice()),
        }
    }
}

/// One kernel or managed row: per operation, (a prefetch to the device,) one streaming read and a
/// stream synchronize, as the C++ program times it.
struct ReadRow {
    stream: Stream,
    memory: Memory,
    sink: DeviceBuffer<u32>,
    /// First-read rows: the CPU rewrites the buffer before each batch (untimed), so the pages are
    /// back on the host.
    rewrite: bool,
    prefetch: Option<Device>,
}

impl ReadRow {
    fn setup(row: &Row) -> Result<Self, CudaError> {
        let elems = (row.bytes / 4) as usize;
        let device = Device::current()?;
        let stream = Stream::non_blocking()?;
        let managed = |advise: bool| -> Result<Memory, CudaError> {
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
            "managed_first_read_fault_1g" => (managed(false)?, true, None),
            "managed_first_read_prefetch_1g" => (managed(false)?, true, Some(device)),
            "managed_first_read_advise_prefetch_1g" => (managed(true)?, true, Some(device)),
            "managed_resident_read_1g" => {
                let Memory::Managed(mut data) = managed(false)? else { unreachable!() };
                data.host_mut()?.fill(ONES);
                data.prefetch(Location::Device(device), &stream)?;
                (Memory::Managed(data), false, None)
            }
            other => unreachable!("read row {other}"),
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
}

impl Side for ReadRow {
    fn cuda_mem(&mut self, k: u32) -> Result<Duration, CudaError> {
        self.rewrite_on_host()?;
        timed(k, || {
            if let (Some(device), Memory::Managed(data)) = (self.prefetch, &self.memory) {
                data.prefetch(Location::Device(device), &self.stream)?;
            }
            self.read_once()
        })
    }

    fn raw(&mut self) -> Result<RawBatch, CudaError> {
        self.rewrite_on_host()?;
        let data = self.memory.view()?.as_device_ptr().cast();
        let prefetch_device = self.prefetch.map(|d| d.ordinal() as i32);
        let sink = self.sink.as_mut_slice().as_device_ptr().cast();
        Ok(RawBatch::Reads { data, sink, prefetch_device, stream: self.stream.as_raw().cast() })
    }
}

/// Builds one resource row's resource over a `PoolResource`.
pub type Stack = fn(PoolResource) -> Arc<dyn MemoryResource>;

/// The resource rows' keys and stacks: the plain pool first, then each adaptor stack. The limit
/// is never reached (`usize::MAX`): the rows measure the bookkeeping.
pub const RESOURCE_STACKS: [(&str, Stack); 5] = [
    ("resource_pool_1m", |pool| Arc::new(pool)),
    ("resource_stats_pool_1m", |pool| Arc::new(StatisticsResource::new(pool))),
    ("resource_limit_pool_1m", |pool| Arc::new(LimitingResource::new(pool, usize::MAX))),
    ("resource_limit_stats_pool_1m", |pool| Arc::new(LimitingResource::new(StatisticsResource::new(pool), usize::MAX))),
    ("resource_tracking_pool_1m", |pool| Arc::new(TrackingResource::new(pool, false))),
];

/// K pairs, then one synchronize of `stream` (as the raw batch without one per pair): their time.
pub fn pairs_then_sync(
    stream: &Stream,
    k: u32,
    op: impl FnMut() -> Result<(), CudaError>,
) -> Result<Duration, CudaError> {
    let start = Instant::now();
    timed(k, op)?;
    stream.synchronize()?;
    Ok(start.elapsed())
}

/// K `ResourceBuffer` pairs from `resource` on `stream`, one synchronize per batch.
pub fn resource_pairs(
    resource: &Arc<dyn MemoryResource>,
    stream: &Stream,
    bytes: usize,
    k: u32,
) -> Result<Duration, CudaError> {
    let pair = || {
        // SAFETY: never read; this measures allocation and free only.
        unsafe { cuda_mem::resource::ResourceBuffer::<u8>::uninit(resource, stream, bytes) }.map(drop)
    };
    pairs_then_sync(stream, k, pair)
}
