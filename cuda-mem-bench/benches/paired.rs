//! `paired`: cuda-mem and its baseline interleaved in one process (see `cuda_mem_bench::paired`).
//!
//! * Every allocation row of the catalogue against the raw C++ batch of `reference/alloc_batches.h`
//!   (the code `raw_reference` runs), on the same stream and pool, with the row's K and twice its
//!   samples.
//! * The resource rows: a `ResourceBuffer` from a `PoolResource` against the raw C++
//!   `cudaMallocFromPoolAsync` batch on the same pool, and each adaptor stack against the plain
//!   `PoolResource`.
//!
//! Prints one JSON line per row to stdout (progress to stderr). Arguments that are not flags
//! filter rows by substring. Without a usable GPU: exit 2 with one sentence in benchmark mode,
//! "skipped" and exit 0 in test mode (`cargo test --all-targets`).

use cuda_mem::resource::{
    LimitingResource, MemoryResource, PoolResource, ResourceBuffer, StatisticsResource, TrackingResource,
};
use cuda_mem::{CudaError, Device, MemPool, Stream};
use cuda_mem_bench::in_process::{RawBatch, time_batch};
use cuda_mem_bench::paired::{self, PairedRow, interleave};
use cuda_mem_bench::rows::{self, Section};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "shared/alloc_rows.rs"]
mod alloc_rows;
use alloc_rows::{AllocRow, host_flags};

/// Samples per side, relative to the catalogue's: the interleaved figure is judged against a
/// 2% target, so it gets more samples than a one-sided row.
const SAMPLE_FACTOR: u32 = 2;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let benchmarking = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let wanted = |key: &str| filters.is_empty() || filters.iter().any(|f| key.contains(f.as_str()));
    if args.iter().any(|a| a == "--list") {
        // The same shape as criterion's listing: one "key: benchmark" line per row.
        let alloc = rows::section_rows(Section::Alloc).map(|r| r.key);
        for key in alloc.chain(RESOURCE_KEYS.iter().copied()).filter(|k| wanted(k)) {
            println!("{key}: benchmark");
        }
        return;
    }
    if let Err(reason) = gpu_present() {
        if benchmarking {
            eprintln!("paired: no usable CUDA GPU ({reason}), so there is nothing to benchmark: run it on a GPU host.");
            std::process::exit(2);
        }
        eprintln!("paired: skipped, no usable CUDA GPU ({reason}); this benchmark needs a GPU host.");
        return;
    }
    for row in rows::section_rows(Section::Alloc).filter(|r| wanted(r.key)) {
        let result = AllocRow::setup(row).map_err(|e| e.to_string()).and_then(|alloc| {
            let samples = row.samples * SAMPLE_FACTOR;
            let times = interleave(samples, || raw_batch(&alloc, row.k), || alloc.cuda_mem(row.k).map_err(to_text))?;
            PairedRow::from_times(row.key, paired::RAW, row.k, &times).ok_or_else(|| "no samples".into())
        });
        emit(row.key, result);
    }
    for (key, result) in resource_rows(&wanted) {
        emit(key, result);
    }
}

fn to_text(e: CudaError) -> String {
    e.to_string()
}

fn emit(key: &str, result: Result<PairedRow, String>) {
    match result {
        Ok(row) => {
            eprintln!("paired: {key}: {:.3} vs {:.3} µs, ratio {:.3}", row.ours_us, row.base_us, row.ratio());
            println!("{}", row.to_line());
        }
        Err(e) => {
            eprintln!("paired: row {key} failed: {e}");
            std::process::exit(1);
        }
    }
}

fn gpu_present() -> Result<(), String> {
    let devices =
        Device::count().map_err(|e| e.code().map_or_else(|| e.to_string(), |code| code.name().into_owned()))?;
    if devices == 0 {
        return Err("0 devices".into());
    }
    Device::new(0).and_then(|d| d.set_current()).map_err(|e| e.to_string())
}

/// The raw C++ batch of an allocation row, on the row's own stream and pool.
fn raw_batch(alloc: &AllocRow, k: u32) -> Result<Duration, String> {
    let batch = match (&alloc.ordered, alloc.family) {
        (Some(o), _) => RawBatch::StreamOrdered {
            pool: if o.from_pool { o.pool.as_raw().cast() } else { std::ptr::null_mut() },
            stream: o.stream.as_raw().cast(),
            sync_each: o.sync_each,
        },
        (None, "malloc") => RawBatch::Device,
        (None, "managed") => RawBatch::Managed,
        (None, "malloc_host") => RawBatch::MallocHost,
        (None, family) => RawBatch::HostAlloc(host_flags(family).ok_or(format!("no raw batch for {family}"))?.bits()),
    };
    // SAFETY: the stream and pool belong to `alloc`, which outlives the call.
    unsafe { time_batch(batch, alloc.bytes, k) }.map_err(|code| format!("raw C++ batch failed with CUDA error {code}"))
}

/// K `ResourceBuffer` pairs from `resource`, one synchronize per batch (like the raw batch).
fn resource_batch(
    resource: &Arc<dyn MemoryResource>,
    stream: &Stream,
    bytes: usize,
    k: u32,
) -> Result<Duration, String> {
    let start = Instant::now();
    for _ in 0..k {
        // SAFETY: never read; this measures allocation and free only.
        drop(unsafe { ResourceBuffer::<u8>::uninit(resource, stream, bytes) }.map_err(to_text)?);
    }
    stream.synchronize().map_err(to_text)?;
    Ok(start.elapsed())
}

/// The resource rows, in the order they run.
const RESOURCE_KEYS: [&str; 4] =
    ["resource_pool_1m", "resource_stats_pool_1m", "resource_limit_stats_pool_1m", "resource_tracking_pool_1m"];

/// The resource rows of the feature catalogue, interleaved with their baselines.
fn resource_rows(wanted: &dyn Fn(&str) -> bool) -> Vec<(&'static str, Result<PairedRow, String>)> {
    type Stack = fn(PoolResource) -> Arc<dyn MemoryResource>;
    let stacks: [(&str, Stack); 3] = [
        ("resource_stats_pool_1m", |pool| Arc::new(StatisticsResource::new(pool))),
        ("resource_limit_stats_pool_1m", |pool| {
            Arc::new(LimitingResource::new(StatisticsResource::new(pool), usize::MAX))
        }),
        ("resource_tracking_pool_1m", |pool| Arc::new(TrackingResource::new(pool, false))),
    ];
    let feature = |key: &str| cuda_mem_bench::features::FEATURE_ROWS.iter().find(|r| r.key == key).copied();
    let setup = || -> Result<(MemPool, Stream), String> {
        let pool = MemPool::device_default(Device::current().map_err(to_text)?).map_err(to_text)?; // retaining
        Ok((pool, Stream::non_blocking().map_err(to_text)?))
    };
    let mut out = Vec::new();
    if let Some(row) = feature("resource_pool_1m").filter(|r| wanted(r.key)) {
        let result = setup().and_then(|(pool, stream)| {
            let resource: Arc<dyn MemoryResource> = Arc::new(PoolResource::new(pool.clone()));
            let batch = RawBatch::StreamOrdered {
                pool: pool.as_raw().cast(),
                stream: stream.as_raw().cast(),
                sync_each: false,
            };
            let bytes = row.bytes as usize;
            let times = interleave(
                row.samples * SAMPLE_FACTOR,
                // SAFETY: `pool` and `stream` live until the end of this closure's caller.
                || unsafe { time_batch(batch, bytes, row.k) }.map_err(|c| format!("raw C++ batch: CUDA error {c}")),
                || resource_batch(&resource, &stream, bytes, row.k),
            )?;
            PairedRow::from_times(row.key, paired::RAW, row.k, &times).ok_or_else(|| "no samples".into())
        });
        out.push((row.key, result));
    }
    for (key, stack) in stacks {
        let Some(row) = feature(key).filter(|r| wanted(r.key)) else { continue };
        let result = setup().and_then(|(pool, stream)| {
            let plain: Arc<dyn MemoryResource> = Arc::new(PoolResource::new(pool.clone()));
            let wrapped = stack(PoolResource::new(pool));
            let bytes = row.bytes as usize;
            let times = interleave(
                row.samples * SAMPLE_FACTOR,
                || resource_batch(&plain, &stream, bytes, row.k),
                || resource_batch(&wrapped, &stream, bytes, row.k),
            )?;
            PairedRow::from_times(row.key, "resource_pool_1m", row.k, &times).ok_or_else(|| "no samples".into())
        });
        out.push((row.key, result));
    }
    out
}
