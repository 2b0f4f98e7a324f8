//! `families`: every cuda-mem allocation family, measured exactly like `raw_reference` measures
//! the same operations in raw CUDA C++ (see the crate docs of cuda-mem-bench for the method).
//!
//! * Criterion group = section (`alloc`, `bandwidth`, `kernel`, `managed`), function id = the row key, which is the
//!   C++ program's key; with `--features cudarc` the same rows through cudarc run in the groups
//!   `cudarc-alloc`, `cudarc-bandwidth`.
//! * Each criterion iteration is one batch of K operations (`iter_custom`, K from the row
//!   catalogue); `SamplingMode::Flat` with 1 ns warm-up and measurement times makes criterion run
//!   one warm-up batch and then exactly one batch per sample. Criterion therefore prints "Unable to
//!   complete N samples" for every row: expected, and what makes the rows comparable with C++.
//! * The kernel rows (`read_*`, `managed_*_read_*`) launch cuda-mem-kernels' `stream_read_u32`
//!   in a `Stream::scope` (which synchronizes the stream) per operation; the C++ program's own
//!   kernel does the same work per launch.
//!
//! Without a usable GPU it exits with status 2 and one sentence (benchmark mode) or reports itself
//! skipped and exits 0 (test mode, as run by `cargo test --all-targets`).

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};
use cuda_mem::{
    CudaError, Device, DeviceBuffer, HostAllocFlags, HostRegisterFlags, MemPool, PoolProps, RegisteredHost, Stream,
};
use cuda_mem_bench::rows::{self, Peer, Row, Section, Unit, group_id};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[cfg(feature = "cudarc")]
#[path = "families/peer_cudarc.rs"]
mod peer_cudarc;

#[path = "shared/alloc_rows.rs"]
mod alloc_rows;
use alloc_rows::AllocRow;
#[path = "shared/copy_rows.rs"]
mod copy_rows;
use copy_rows::CopyRow;
#[path = "shared/read_rows.rs"]
mod read_rows;
use read_rows::ReadRow;
#[path = "shared/resource_stacks.rs"]
mod resource_stacks;
use resource_stacks::{ADAPTOR_STACKS, Stack};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let listing = args.iter().any(|a| a == "--list");
    let benchmarking = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    if !listing && let Err(reason) = gpu_present() {
        if benchmarking {
            eprintln!(
                "families: no usable CUDA GPU ({reason}), so there is nothing to benchmark: run it on a GPU host."
            );
            std::process::exit(2);
        }
        eprintln!("families: skipped, no usable CUDA GPU ({reason}); these benchmarks need a GPU host.");
        return;
    }
    let mut c = Criterion::default().without_plots().configure_from_args();
    alloc_section(&mut c);
    ffi_alloc_section(&mut c);
    bandwidth_section(&mut c);
    kernel_section(&mut c);
    managed_section(&mut c);
    features_section(&mut c);
    #[cfg(feature = "cudarc")]
    peer_cudarc::run(&mut c);
    c.final_summary();
}

/// `Ok` when a device is usable, else the runtime's reason.
fn gpu_present() -> Result<(), String> {
    let devices =
        Device::count().map_err(|e| e.code().map_or_else(|| e.to_string(), |code| code.name().into_owned()))?;
    if devices == 0 {
        return Err("0 devices".into());
    }
    let device = Device::new(0).map_err(|e| e.to_string())?;
    device.set_current().map_err(|e| e.to_string())
}

/// Ends the process with one sentence when a CUDA call fails mid-benchmark (no panic).
pub(crate) fn ok<T, E: std::fmt::Display>(result: Result<T, E>, key: &str) -> T {
    result.unwrap_or_else(|e| {
        eprintln!("families: row {key} failed: {e}");
        std::process::exit(1);
    })
}

/// A criterion group configured for the method: flat sampling, one warm-up batch, one batch per
/// sample.
pub(crate) fn group<'a>(c: &'a mut Criterion, section: Section, peer: Peer) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(group_id(section, peer));
    group
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_nanos(1))
        .measurement_time(Duration::from_nanos(1))
        .nresamples(10_000);
    group
}

/// Benchmarks one row: `setup` runs once, lazily (filtered-out rows allocate nothing); each
/// criterion iteration calls `batch(state, K)`, which performs K operations and returns the time
/// they took (any per-sample setup it does first is not timed).
pub(crate) fn bench_row<S, E: std::fmt::Display>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    row: &Row,
    setup: impl FnOnce() -> Result<S, E>,
    mut batch: impl FnMut(&mut S, u32) -> Result<Duration, E>,
) {
    group.sample_size(row.samples as usize);
    group.throughput(match row.unit() {
        Unit::Micros => Throughput::Elements(u64::from(row.k)),
        Unit::GigabytesPerSecond => Throughput::Bytes(u64::from(row.k) * row.bytes),
    });
    let mut setup = Some(setup);
    let mut state: Option<S> = None;
    group.bench_function(row.key, |b| {
        let state = state.get_or_insert_with(|| ok(setup.take().expect("setup runs once")(), row.key));
        b.iter_custom(|iters| (0..iters).map(|_| ok(batch(state, row.k), row.key)).sum());
    });
}

fn timed(k: u32, mut op: impl FnMut() -> Result<(), CudaError>) -> Result<Duration, CudaError> {
    let start = Instant::now();
    for _ in 0..k {
        op()?;
    }
    Ok(start.elapsed())
}

/// Allocation + free pairs (µs per pair).
fn alloc_section(c: &mut Criterion) {
    let mut group = group(c, Section::Alloc, Peer::CudaMem);
    for row in rows::section_rows(Section::Alloc) {
        bench_row(&mut group, row, || AllocRow::setup(row), |alloc, k| alloc.cuda_mem(k));
    }
    group.finish();
}

/// Synchronous 256 MiB copies (GB/s). The blocking copies are `cudaMemcpy` underneath, like the
/// C++ rows; `copy_from_device` also waits for the legacy stream after the device-to-device
/// `cudaMemcpy`, and the C++ d2d row does the same (`cudaStreamSynchronize(0)`).
fn bandwidth_section(c: &mut Criterion) {
    // Host buffers of the registered rows live here so that RegisteredHost can borrow them; they
    // are allocated only when their row runs.
    let mut registered: Vec<Vec<u8>> = rows::section_rows(Section::Bandwidth).map(|_| Vec::new()).collect();
    let mut group = group(c, Section::Bandwidth, Peer::CudaMem);
    for (row, registered) in rows::section_rows(Section::Bandwidth).zip(registered.iter_mut()) {
        bench_row(&mut group, row, move || CopyRow::setup(row, registered), |copy, k| copy.cuda_mem(k));
    }
    group.finish();
}

/// The streaming-read kernel over device memory and mapped pinned host memory (GB/s).
fn kernel_section(c: &mut Criterion) {
    read_section(c, Section::Kernel);
}

/// Managed memory read by the GPU (GB/s). The first-read rows rewrite the buffer on the CPU before
/// each sample (untimed), then time [prefetch if any + streaming read + sync].
fn managed_section(c: &mut Criterion) {
    read_section(c, Section::Managed);
}

fn read_section(c: &mut Criterion, section: Section) {
    let mut group = group(c, section, Peer::CudaMem);
    for row in rows::section_rows(section) {
        bench_row(&mut group, row, || ReadRow::setup(row), |read, k| read.cuda_mem(k));
    }
    group.finish();
}

/// Diagnostic rows (group `ffi-alloc`, an extra column of the report): the stream-ordered alloc
/// rows with the runtime called directly through `cuda_mem::sys` from this same process, so a gap
/// between cuda-mem and the C++ program splits into the wrapper's cost (cuda-mem vs these rows)
/// and the process's (these rows vs C++). On the H200 hosts the sub-µs pairs are bimodal between
/// processes and rows (the report's noise column), which no wrapper comparison across processes
/// can resolve to 2%.
fn ffi_alloc_section(c: &mut Criterion) {
    use cuda_mem::sys;
    let check = |code: sys::cudaError_t, what: &str| -> Result<(), String> {
        if code == sys::cudaError::cudaSuccess { Ok(()) } else { Err(format!("{what}: error {}", code.0)) }
    };
    let mut group = group(c, Section::Alloc, Peer::Ffi);
    for row in rows::section_rows(Section::Alloc) {
        let bytes = row.bytes as usize;
        let family = row.family();
        let (from_pool, sync_each) = match family {
            "async_default_sync" | "async_retain_sync" => (false, true),
            "async_retain_nosync" => (false, false),
            "pool_odd" => (true, false),
            _ => continue,
        };
        let retain = family != "async_default_sync";
        let setup = move || -> Result<(Stream, MemPool), String> {
            let device = Device::current().map_err(|e| e.to_string())?;
            let pool = if from_pool {
                MemPool::new(PoolProps::new(device)).map_err(|e| e.to_string())?
            } else {
                MemPool::retaining(device).map_err(|e| e.to_string())?
            };
            if !retain {
                pool.set_release_threshold(0).map_err(|e| e.to_string())?;
            }
            Ok((Stream::non_blocking().map_err(|e| e.to_string())?, pool))
        };
        bench_row(&mut group, row, setup, move |(stream, pool), k| {
            let (raw_stream, raw_pool) = (stream.as_raw(), pool.as_raw());
            let start = Instant::now();
            for _ in 0..k {
                let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
                let code = if from_pool {
                    // SAFETY: `ptr` is valid for writes; pool and stream outlive the call.
                    unsafe { sys::cudaMallocFromPoolAsync(&mut ptr, bytes, raw_pool, raw_stream) }
                } else {
                    // SAFETY: `ptr` is valid for writes; the stream outlives the call.
                    unsafe { sys::cudaMallocAsync(&mut ptr, bytes, raw_stream) }
                };
                check(code, "cudaMallocAsync")?;
                // SAFETY: `ptr` was just allocated on this stream and is freed once, unread.
                check(unsafe { sys::cudaFreeAsync(black_box(ptr), raw_stream) }, "cudaFreeAsync")?;
                if sync_each {
                    // SAFETY: the stream handle is valid.
                    check(unsafe { sys::cudaStreamSynchronize(raw_stream) }, "cudaStreamSynchronize")?;
                }
            }
            if !sync_each {
                // SAFETY: the stream handle is valid.
                check(unsafe { sys::cudaStreamSynchronize(raw_stream) }, "cudaStreamSynchronize")?;
            }
            Ok(start.elapsed())
        });
    }
    if let Ok(device) = Device::current() {
        let _ = MemPool::retaining(device);
    }
    group.finish();
}

/// What cuda-mem adds beyond the families (criterion group `features`): the pinned caching pool,
/// staged pageable copies, and resource adaptors. The report sets each against its baseline.
fn features_section(c: &mut Criterion) {
    use cuda_mem::resource::{MemoryResource, PoolResource, ResourceBuffer};
    use cuda_mem::{PinnedPool, StagedConfig, StagedCopier};
    use cuda_mem_bench::features::{FEATURE_ROWS, GROUP};
    use std::sync::Arc;

    let mut group = c.benchmark_group(GROUP);
    group
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_nanos(1))
        .measurement_time(Duration::from_nanos(1))
        .nresamples(10_000);
    let row = |key: &str| FEATURE_ROWS.iter().find(|r| r.key == key).expect("in the catalogue").as_row();

    for key in ["pinned_pool_hit_4k", "pinned_pool_hit_1m", "pinned_pool_hit_64m"] {
        let row = row(key);
        let bytes = row.bytes as usize;
        bench_row(
            &mut group,
            &row,
            || -> Result<PinnedPool, CudaError> {
                let pool = PinnedPool::new(HostAllocFlags::empty());
                drop(pool.alloc::<u8>(bytes)?); // the one miss, outside the timing
                Ok(pool)
            },
            |pool, k| timed(k, || pool.alloc::<u8>(bytes).map(drop)),
        );
    }

    for (key, upload) in
        [("staged_h2d_256m", true), ("staged_d2h_256m", false), ("staged_h2d_1g", true), ("staged_d2h_1g", false)]
    {
        let row = row(key);
        let bytes = row.bytes as usize;
        bench_row(
            &mut group,
            &row,
            || -> Result<_, CudaError> {
                let copier = StagedCopier::new(StagedConfig::default())?;
                let host: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
                Ok((copier, host, DeviceBuffer::<u8>::zeroed(bytes)?))
            },
            |(copier, host, device), k| {
                timed(k, || {
                    if upload {
                        copier.copy_from_host(&mut device.as_mut_slice(), host)
                    } else {
                        copier.copy_to_host(host, device.as_slice())
                    }
                })
            },
        );
    }

    let row_rcu = row("register_copy_unregister_h2d_256m");
    let bytes = row_rcu.bytes as usize;
    bench_row(
        &mut group,
        &row_rcu,
        || -> Result<_, CudaError> { Ok((vec![1u8; bytes], DeviceBuffer::<u8>::zeroed(bytes)?)) },
        |(host, device), k| {
            timed(k, || {
                let registered = RegisteredHost::new(host, HostRegisterFlags::empty())?;
                device.as_mut_slice().copy_from_host(&registered)?;
                registered.unregister().map(drop).map_err(CudaError::from)
            })
        },
    );

    let plain: Stack = |pool| Arc::new(pool);
    let stacks = std::iter::once(("resource_pool_1m", plain)).chain(ADAPTOR_STACKS);
    for (key, stack) in stacks {
        let row = row(key);
        let bytes = row.bytes as usize;
        bench_row(
            &mut group,
            &row,
            || -> Result<_, CudaError> {
                let pool = MemPool::retaining(Device::current()?)?; // retaining, like the raw row
                Ok((stack(PoolResource::new(pool)), Stream::non_blocking()?))
            },
            |(resource, stream): &mut (Arc<dyn MemoryResource>, Stream), k| {
                let (resource, stream) = (&*resource, &*stream);
                let start = Instant::now();
                for _ in 0..k {
                    // SAFETY: never read; this measures allocation and free only.
                    drop(unsafe { ResourceBuffer::<u8>::uninit(resource, stream, bytes)? });
                }
                stream.synchronize()?;
                Ok(start.elapsed())
            },
        );
    }
    group.finish();
}
