//! Bandwidth and latency of the memory families, measured by kernels and timed with CUDA events
//! (3 warm-up runs, then the median of 25):
//!
//! * streaming read and write over 1 GiB of device memory (GB/s, 10^9 bytes per second),
//! * streaming read over 256 MiB of mapped pinned host memory (zero-copy GB/s over the bus),
//! * a 256 MiB device-to-device `cudaMemcpyAsync`, bytes counted in one direction (GB/s),
//! * pointer-chase latency (ns per hop) over a 256 MiB random ring in device memory, mapped
//!   pinned host memory and managed memory (first touch, which faults pages over to the GPU, and
//!   after a prefetch to the GPU).
//!
//! ```text
//! cargo run --release -p cuda-mem-bench --example kernel_bandwidth
//! ```
//!
//! Exits with 2 and a message when there is no GPU or driver, with 1 on any other failure.

use cuda_mem::{Device, Result as CudaResult};
use cuda_mem::{DeviceBuffer, Event, HostAllocFlags, Location, ManagedBuffer, PinnedBuffer, Stream};
use cuda_mem_kernels::{Geometry, chase_cpu, chase_ring, pointer_chase, stream_read_u32, stream_write_u32};
use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
const WARMUP: usize = 3;
const REPEATS: usize = 25;
/// Bytes of the chase ring: several times the largest L2 cache (50 MiB on H100/H200).
const RING_BYTES: usize = 256 * MIB;
/// Hops per timed chase: enough to dwarf the launch, few enough to stay quick over the bus.
const DEVICE_HOPS: u64 = 200_000;
const HOST_HOPS: u64 = 20_000;

fn main() -> ExitCode {
    let device = match Device::count() {
        Ok(count) if count > 0 => Device::new(0),
        Ok(_) => {
            eprintln!("kernel_bandwidth needs a CUDA GPU: the driver reports no device");
            return ExitCode::from(2);
        }
        Err(err) => {
            eprintln!("kernel_bandwidth needs a CUDA GPU and its driver: {err}");
            return ExitCode::from(2);
        }
    };
    match device.map_err(Into::into).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kernel_bandwidth failed: {err}");
            ExitCode::FAILURE
        }
    }
}

/// One line of the table.
struct Row {
    what: &'static str,
    size: String,
    value: f64,
    unit: &'static str,
}

fn run(device: Device) -> Result<(), Box<dyn Error>> {
    device.set_current()?;
    let geometry = Geometry::for_device(device)?;
    println!(
        "kernel_bandwidth on {} ({} SMs, grids of up to {} x {} threads), kernels built for {}",
        device.name()?,
        geometry.multiprocessors(),
        geometry.resident_blocks(),
        Geometry::BLOCK_THREADS,
        cuda_mem_kernels::COMPILED_TARGETS
    );
    println!("median of {REPEATS} runs after {WARMUP} warm-up runs; GB/s = 10^9 bytes per second\n");
    let stream = Stream::non_blocking()?;
    let mut rows = Vec::new();
    bandwidth(&stream, &mut rows)?;
    latency(&stream, &mut rows)?;

    println!("{:<48} {:>8} {:>12}", "measurement", "size", "result");
    for row in rows {
        println!("{:<48} {:>8} {:>8.1} {}", row.what, row.size, row.value, row.unit);
    }
    Ok(())
}

/// Runs `launch` `WARMUP` times, then `REPEATS` times between two events; the median time.
/// `launch` gets the run's number, counting the warm-up runs.
fn median_time(stream: &Stream, mut launch: impl FnMut(usize) -> CudaResult<()>) -> CudaResult<Duration> {
    let (start, end) = (Event::new()?, Event::new()?);
    for run in 0..WARMUP {
        launch(run)?;
    }
    let mut times = Vec::with_capacity(REPEATS);
    for run in WARMUP..WARMUP + REPEATS {
        start.record(stream)?;
        launch(run)?;
        end.record(stream)?;
        end.synchronize()?;
        times.push(end.elapsed_since(&start)?);
    }
    times.sort();
    Ok(times[REPEATS / 2])
}

fn gb_per_s(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64() / 1e9
}

fn size(bytes: usize) -> String {
    if bytes >= GIB { format!("{} GiB", bytes / GIB) } else { format!("{} MiB", bytes / MIB) }
}

fn bandwidth(stream: &Stream, rows: &mut Vec<Row>) -> Result<(), Box<dyn Error>> {
    let words = |bytes: usize| bytes / size_of::<u32>();
    let mut sink = DeviceBuffer::<u32>::zeroed(1)?;
    let mut sink = sink.as_mut_slice();

    let mut device = DeviceBuffer::<u32>::zeroed(words(GIB))?;
    let mut device = device.as_mut_slice();
    let read = stream.scope(|s| median_time(s.stream(), |_| stream_read_u32(s, &device, &mut sink)))??;
    rows.push(Row { what: "streaming read, device memory", size: size(GIB), value: gb_per_s(GIB, read), unit: "GB/s" });
    let write = stream.scope(|s| median_time(s.stream(), |run| stream_write_u32(s, &mut device, run as u32)))??;
    rows.push(Row {
        what: "streaming write, device memory",
        size: size(GIB),
        value: gb_per_s(GIB, write),
        unit: "GB/s",
    });

    let bytes = 256 * MIB;
    let mapped = PinnedBuffer::<u32>::zeroed_with_flags(words(bytes), HostAllocFlags::MAPPED)?;
    let mapped = mapped.device_view()?;
    let read = stream.scope(|s| median_time(s.stream(), |_| stream_read_u32(s, mapped, &mut sink)))??;
    rows.push(Row {
        what: "streaming read, mapped pinned host (zero-copy)",
        size: size(bytes),
        value: gb_per_s(bytes, read),
        unit: "GB/s",
    });

    let source = DeviceBuffer::<u32>::zeroed(words(bytes))?;
    let mut destination = DeviceBuffer::<u32>::zeroed(words(bytes))?;
    let mut destination = destination.as_mut_slice();
    let copy =
        stream.scope(|s| median_time(s.stream(), |_| s.copy_from_device(&mut destination, source.as_slice())))??;
    rows.push(Row {
        what: "cudaMemcpyAsync device to device (one way)",
        size: size(bytes),
        value: gb_per_s(bytes, copy),
        unit: "GB/s",
    });
    Ok(())
}

fn latency(stream: &Stream, rows: &mut Vec<Row>) -> Result<(), Box<dyn Error>> {
    let ring = chase_ring(RING_BYTES / size_of::<u32>(), 0x0c0f_fee5)?;
    let len = ring.len() as u64;
    // Each run starts somewhere else on the cycle, so no run finds the previous one's lines in L2.
    let start_of = |run: usize| ((run as u64 + 1) * 0x9e37_79b9 % len) as u32;
    let mut end = DeviceBuffer::<u32>::zeroed(1)?;

    // Copied on the stream inside a scope: it has landed when the scope returns.
    let mut device_ring = DeviceBuffer::<u32>::zeroed(ring.len())?;
    let mut view = device_ring.as_mut_slice();
    stream.scope(|s| s.copy_from_host(&mut view, &ring))??;
    let time = chase(stream, &mut end, device_ring.as_slice(), DEVICE_HOPS, start_of)?;
    verify(&ring, &end, start_of(WARMUP + REPEATS - 1), DEVICE_HOPS)?;
    rows.push(Row {
        what: "pointer chase, device memory",
        size: size(RING_BYTES),
        value: ns_per_hop(time, DEVICE_HOPS),
        unit: "ns/hop",
    });
    drop(device_ring);

    let mapped_ring = PinnedBuffer::from_slice(&ring, HostAllocFlags::MAPPED)?;
    let time = chase(stream, &mut end, mapped_ring.device_view()?, HOST_HOPS, start_of)?;
    verify(&ring, &end, start_of(WARMUP + REPEATS - 1), HOST_HOPS)?;
    rows.push(Row {
        what: "pointer chase, mapped pinned host memory",
        size: size(RING_BYTES),
        value: ns_per_hop(time, HOST_HOPS),
        unit: "ns/hop",
    });
    drop(mapped_ring);

    // Written by the host, so its pages start there: the first chase faults every page it
    // reaches over to the GPU; the timed runs then find them resident.
    let managed_ring = ManagedBuffer::from_slice(&ring)?;
    let cold_start = len as u32 / 2;
    let first_touch = {
        let mut out = end.as_mut_slice();
        let (start, stop) = (Event::new()?, Event::new()?);
        stream.scope(|s| -> CudaResult<Duration> {
            start.record(s.stream())?;
            pointer_chase(s, managed_ring.as_slice(), cold_start, HOST_HOPS, &mut out)?;
            stop.record(s.stream())?;
            stop.synchronize()?;
            stop.elapsed_since(&start)
        })??
    };
    verify(&ring, &end, cold_start, HOST_HOPS)?;
    rows.push(Row {
        what: "pointer chase, managed memory, first touch",
        size: size(RING_BYTES),
        value: ns_per_hop(first_touch, HOST_HOPS),
        unit: "ns/hop",
    });
    // Then all of it moved to the GPU, and chased from fresh starts like the device ring.
    managed_ring.prefetch(Location::Device(stream.device()), stream)?;
    stream.synchronize()?;
    let time = chase(stream, &mut end, managed_ring.as_slice(), HOST_HOPS, start_of)?;
    verify(&ring, &end, start_of(WARMUP + REPEATS - 1), HOST_HOPS)?;
    rows.push(Row {
        what: "pointer chase, managed memory, prefetched",
        size: size(RING_BYTES),
        value: ns_per_hop(time, HOST_HOPS),
        unit: "ns/hop",
    });
    Ok(())
}

/// The median time of a `hops`-long chase over `ring`, run `run` starting at `start_of(run)`.
fn chase(
    stream: &Stream,
    end: &mut DeviceBuffer<u32>,
    ring: cuda_mem::DeviceSlice<'_, u32>,
    hops: u64,
    start_of: impl Fn(usize) -> u32,
) -> CudaResult<Duration> {
    let mut out = end.as_mut_slice();
    stream.scope(|s| median_time(s.stream(), |run| pointer_chase(s, ring, start_of(run), hops, &mut out)))?
}

/// The chase's end index must be the one the CPU computes: the kernel really followed the ring.
fn verify(ring: &[u32], end: &DeviceBuffer<u32>, start: u32, hops: u64) -> Result<(), Box<dyn Error>> {
    let got = end.to_vec()?[0];
    let want = chase_cpu(ring, start, hops).ok_or("empty ring")?;
    if got != want {
        return Err(format!("pointer chase from {start} for {hops} hops ended at {got}, the CPU says {want}").into());
    }
    Ok(())
}

fn ns_per_hop(time: Duration, hops: u64) -> f64 {
    time.as_nanos() as f64 / hops as f64
}
