//! `families`: every catalogue row through cuda-mem, measured as `raw_reference` measures the same
//! operations in raw C++ (the method: the crate docs of cuda-mem-bench); the stream-ordered
//! allocation rows with the runtime called directly through `cuda_mem::sys` (group `ffi-alloc`);
//! the feature rows (group `features`); with `--features cudarc`, the same rows through cudarc.
//! Criterion prints "Unable to complete N samples" for every row: expected (one batch per sample).

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};
use cuda_mem::{CudaError, DeviceBuffer, HostAllocFlags, HostRegisterFlags, MemPool, PinnedPool, RegisteredHost};
use cuda_mem::{Device, StagedConfig, StagedCopier, Stream, resource::PoolResource, sys};
use cuda_mem_bench::features::feature_row;
use cuda_mem_bench::rows::{self, Peer, Row, Section, Unit, group_id};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[path = "common.rs"]
mod common;
use common::{AllocRow, RESOURCE_STACKS, timed};

#[cfg(feature = "cudarc")]
#[path = "families/peer_cudarc.rs"]
mod peer_cudarc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    if !flag("--list") {
        common::require_gpu("families", flag("--bench") && !flag("--test"));
    }
    let mut c = Criterion::default().without_plots().configure_from_args();
    for section in Section::ALL {
        let mut group = group(&mut c, section, Peer::CudaMem);
        for row in rows::section_rows(section) {
            let mut registered = Vec::new();
            bench_row(&mut group, row, || common::setup(row, &mut registered), |side, k| side.cuda_mem(k));
        }
        group.finish();
        if section == Section::Alloc {
            ffi_alloc(&mut c);
        }
    }
    features(&mut c);
    #[cfg(feature = "cudarc")]
    peer_cudarc::run(&mut c);
    c.final_summary();
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
    group.sampling_mode(SamplingMode::Flat).warm_up_time(Duration::from_nanos(1));
    group.measurement_time(Duration::from_nanos(1)).nresamples(10_000);
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
    group.throughput(match row.unit {
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

/// Diagnostic rows (an extra column of the report): the stream-ordered allocation rows with the
/// runtime called directly from this process on the same pool and stream, so a gap between
/// cuda-mem and the C++ program splits into the wrapper's cost (cuda-mem vs these rows) and the
/// process's (these rows vs C++).
fn ffi_alloc(c: &mut Criterion) {
    let check = |code: sys::cudaError_t| match code {
        sys::cudaError::cudaSuccess => Ok(()),
        code => Err(format!("CUDA error {}", code.0)),
    };
    let mut group = group(c, Section::Alloc, Peer::Ffi);
    for row in
        rows::section_rows(Section::Alloc).filter(|r| r.family().starts_with("async") || r.family() == "pool_odd")
    {
        let bytes = row.bytes as usize;
        bench_row(
            &mut group,
            row,
            || AllocRow::setup(row).map_err(|e| e.to_string()),
            move |alloc, k| {
                let AllocRow::Ordered(o) = alloc else { unreachable!("a stream-ordered row") };
                let (stream, pool) = (o.stream.as_raw(), o.pool.as_raw());
                let start = Instant::now();
                for _ in 0..k {
                    let mut ptr = std::ptr::null_mut();
                    // SAFETY: `ptr` is valid for writes; pool and stream outlive the call.
                    check(unsafe { sys::cudaMallocFromPoolAsync(&mut ptr, bytes, pool, stream) })?;
                    // SAFETY: `ptr` was just allocated on this stream and is freed once, unread.
                    check(unsafe { sys::cudaFreeAsync(black_box(ptr), stream) })?;
                    if o.sync_each {
                        // SAFETY: the stream handle is valid.
                        check(unsafe { sys::cudaStreamSynchronize(stream) })?;
                    }
                }
                if !o.sync_each {
                    // SAFETY: the stream handle is valid.
                    check(unsafe { sys::cudaStreamSynchronize(stream) })?;
                }
                Ok(start.elapsed())
            },
        );
    }
    group.finish();
}

/// What cuda-mem adds beyond the families: the pinned caching pool, staged pageable copies and
/// the resource adaptors. The report sets each against its baseline.
fn features(c: &mut Criterion) {
    let mut group = group(c, Section::Features, Peer::CudaMem);
    let row = |key: &str| feature_row(key).expect("in the catalogue");
    for key in ["pinned_pool_hit_4k", "pinned_pool_hit_1m", "pinned_pool_hit_64m"] {
        let bytes = row(key).bytes as usize;
        let setup = || -> Result<PinnedPool, CudaError> {
            let pool = PinnedPool::new(HostAllocFlags::empty());
            drop(pool.alloc::<u8>(bytes)?); // the one miss, outside the timing
            Ok(pool)
        };
        bench_row(&mut group, row(key), setup, |pool, k| timed(k, || pool.alloc::<u8>(bytes).map(drop)));
    }
    for key in ["staged_h2d_256m", "staged_d2h_256m", "staged_h2d_1g", "staged_d2h_1g"] {
        let bytes = row(key).bytes as usize;
        let setup = || -> Result<_, CudaError> {
            let host: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
            Ok((StagedCopier::new(StagedConfig::default())?, host, DeviceBuffer::<u8>::zeroed(bytes)?))
        };
        bench_row(&mut group, row(key), setup, |(copier, host, device), k| {
            timed(k, || match key.contains("h2d") {
                true => copier.copy_from_host(&mut device.as_mut_slice(), host),
                false => copier.copy_to_host(host, device.as_slice()),
            })
        });
    }
    let key = "register_copy_unregister_h2d_256m";
    let bytes = row(key).bytes as usize;
    let setup = || -> Result<_, CudaError> { Ok((vec![1u8; bytes], DeviceBuffer::<u8>::zeroed(bytes)?)) };
    bench_row(&mut group, row(key), setup, |(host, device), k| {
        timed(k, || {
            let registered = RegisteredHost::new(host, HostRegisterFlags::empty())?;
            device.as_mut_slice().copy_from_host(&registered)?;
            registered.unregister().map(drop).map_err(CudaError::from)
        })
    });
    for (key, stack) in RESOURCE_STACKS {
        let bytes = row(key).bytes as usize;
        let setup = || -> Result<_, CudaError> {
            let pool = MemPool::retaining(Device::current()?)?; // retaining, like the raw row
            Ok((stack(PoolResource::new(pool)), Stream::non_blocking()?))
        };
        bench_row(&mut group, row(key), setup, |(resource, stream), k| {
            common::resource_pairs(resource, stream, bytes, k)
        });
    }
    group.finish();
}
