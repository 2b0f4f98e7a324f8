//! `paired`: cuda-mem and its baseline interleaved in one process (see `cuda_mem_bench::paired`).
//!
//! * Every allocation row of the catalogue against the raw C++ batch of `reference/alloc_batches.h`
//!   (the code `raw_reference` runs), on the same stream and pool, with the row's K and twice its
//!   samples.
//! * Every copy row against the raw C++ batch of `reference/copy_batches.h`, copying between the
//!   very same buffers.
//! * Every kernel and managed row against the raw C++ batch of `reference/read_batches.cuh` (the
//!   reference's own kernel and launch code), reading the same memory with the same sink and
//!   stream; first-read rows rewrite the buffer on the CPU before each batch of either side.
//! * The resource rows: a `ResourceBuffer` from a `PoolResource` against the raw C++
//!   `cudaMallocFromPoolAsync` batch on the same pool, and each adaptor stack against the plain
//!   `PoolResource`.
//!
//! Prints one JSON line per row to stdout (progress to stderr). Arguments that are not flags
//! filter rows by substring; `--missed PAIRED.jsonl` keeps only the rows that missed their target
//! in that earlier output. `--api-time` also records each side's time inside CUDA calls through
//! CUPTI (`cuda_mem_bench::api_time`; exit 3 when CUPTI cannot be loaded): a profile, not a
//! judged run. Without a usable GPU: exit 2 with one sentence in benchmark mode,
//! "skipped" and exit 0 in test mode (`cargo test --all-targets`).

use cuda_mem::resource::{MemoryResource, PoolResource, ResourceBuffer};
use cuda_mem::{CudaError, Device, MemPool, Stream};
use cuda_mem_bench::api_time::{self, ApiTotals};
use cuda_mem_bench::in_process::{RawBatch, resident_blocks, time_batch};
use cuda_mem_bench::paired::{self, Interleaved, PairedRow};
use cuda_mem_bench::rows::{self, Section};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "shared/alloc_rows.rs"]
mod alloc_rows;
use alloc_rows::{AllocRow, host_flags};
#[path = "shared/copy_rows.rs"]
mod copy_rows;
use copy_rows::CopyRow;
#[path = "shared/read_rows.rs"]
mod read_rows;
use read_rows::ReadRow;
#[path = "shared/resource_stacks.rs"]
mod resource_stacks;
use resource_stacks::ADAPTOR_STACKS;

/// Samples per side, relative to the catalogue's: the interleaved figure is judged against a
/// 2% target, so it gets more samples than a one-sided row.
const SAMPLE_FACTOR: u32 = 2;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let benchmarking = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    // `--missed PAIRED.jsonl`: only the rows that missed their target in that earlier run.
    let missed_file = args.iter().position(|a| a == "--missed").map(|at| args.get(at + 1).cloned());
    let only: Option<Vec<String>> = match missed_file {
        None => None,
        Some(None) => fail("--missed needs the path of an earlier run's output"),
        Some(Some(path)) => Some(
            std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| paired::missed_keys(&text))
                .unwrap_or_else(|e| fail(&format!("--missed {path}: {e}"))),
        ),
    };
    let filters: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|&(i, a)| !a.starts_with('-') && (i == 0 || args[i - 1] != "--missed"))
        .map(|(_, a)| a)
        .collect();
    let wanted = |key: &str| {
        only.as_ref().is_none_or(|keys| keys.iter().any(|k| k == key))
            && (filters.is_empty() || filters.iter().any(|f| key.contains(f.as_str())))
    };
    if args.iter().any(|a| a == "--list") {
        // The same shape as criterion's listing: one "key: benchmark" line per row.
        let catalogue = Section::ALL.into_iter().flat_map(rows::section_rows).map(|r| r.key);
        for key in catalogue.chain(RESOURCE_KEYS.iter().copied()).filter(|k| wanted(k)) {
            println!("{key}: benchmark");
        }
        return;
    }
    let profiled = args.iter().any(|a| a == "--api-time");
    if profiled {
        // Before the first CUDA call, so every call is seen.
        match api_time::start() {
            Ok(path) => eprintln!("paired: timing CUDA calls through {path}"),
            Err(reason) => {
                eprintln!("paired: --api-time needs CUPTI: {reason}.");
                std::process::exit(3);
            }
        }
    }
    let probe: Option<&dyn Fn() -> ApiTotals> = if profiled { Some(&api_time::totals) } else { None };
    let interleave = |samples,
                      base: &mut dyn FnMut() -> Result<Duration, String>,
                      ours: &mut dyn FnMut() -> Result<Duration, String>| {
        paired::interleave_probed(samples, probe, base, ours)
    };
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
            let times =
                interleave(samples, &mut || raw_batch(&alloc, row.k), &mut || alloc.cuda_mem(row.k).map_err(to_text))?;
            PairedRow::from_times(row.key, paired::RAW, row.k, &times).ok_or_else(|| "no samples".into())
        });
        emit(row.key, result);
    }
    for row in rows::section_rows(Section::Bandwidth).filter(|r| wanted(r.key)) {
        let mut registered = Vec::new();
        let result = CopyRow::setup(row, &mut registered).map_err(to_text).and_then(|mut copy| {
            let (dst, src, kind, sync_legacy) = copy.raw_copy();
            let batch = RawBatch::Copy { dst, src, kind, sync_legacy };
            let bytes = rows::COPY_BYTES as usize;
            let times = interleave(
                row.samples * SAMPLE_FACTOR,
                &mut || {
                    // SAFETY: both buffers belong to `copy`, alive and unused elsewhere during the run.
                    unsafe { time_batch(batch, bytes, row.k) }.map_err(|c| format!("raw C++ batch: CUDA error {c}"))
                },
                &mut || copy.cuda_mem(row.k).map_err(to_text),
            )?;
            PairedRow::from_times(row.key, paired::RAW, row.k, &times).ok_or_else(|| "no samples".into())
        });
        emit(row.key, result);
    }
    let blocks = resident_blocks().map_err(|code| format!("CUDA error {code} reading the device's limits"));
    for row in [Section::Kernel, Section::Managed].into_iter().flat_map(rows::section_rows).filter(|r| wanted(r.key)) {
        let result = blocks.clone().and_then(|blocks| {
            let read = std::cell::RefCell::new(ReadRow::setup(row).map_err(to_text)?);
            let times = interleave(
                row.samples * SAMPLE_FACTOR,
                &mut || {
                    let batch = read.borrow_mut().raw_batch(blocks).map_err(to_text)?;
                    // SAFETY: memory, sink and stream belong to `read`, alive and unused
                    // elsewhere during the batch.
                    unsafe { time_batch(batch, row.bytes as usize, row.k) }
                        .map_err(|c| format!("raw C++ batch: CUDA error {c}"))
                },
                &mut || read.borrow_mut().cuda_mem(row.k).map_err(to_text),
            )?;
            PairedRow::from_times(row.key, paired::RAW, row.k, &times).ok_or_else(|| "no samples".into())
        });
        emit(row.key, result);
    }
    for (key, result) in resource_rows(&wanted, &interleave) {
        emit(key, result);
    }
}

fn fail(message: &str) -> ! {
    eprintln!("paired: {message}");
    std::process::exit(2);
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
const RESOURCE_KEYS: [&str; 5] = [
    "resource_pool_1m",
    "resource_stats_pool_1m",
    "resource_limit_pool_1m",
    "resource_limit_stats_pool_1m",
    "resource_tracking_pool_1m",
];

/// The resource rows of the feature catalogue, interleaved with their baselines.
/// [`paired::interleave_probed`] with the run's probe.
type Interleave<'a> = dyn Fn(
        u32,
        &mut dyn FnMut() -> Result<Duration, String>,
        &mut dyn FnMut() -> Result<Duration, String>,
    ) -> Result<Interleaved, String>
    + 'a;

fn resource_rows(
    wanted: &dyn Fn(&str) -> bool,
    interleave: &Interleave<'_>,
) -> Vec<(&'static str, Result<PairedRow, String>)> {
    let feature = |key: &str| cuda_mem_bench::features::FEATURE_ROWS.iter().find(|r| r.key == key).copied();
    let setup = || -> Result<(MemPool, Stream), String> {
        let pool = MemPool::retaining(Device::current().map_err(to_text)?).map_err(to_text)?; // retaining
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
                &mut || {
                    // SAFETY: `pool` and `stream` live until the end of this closure's caller.
                    unsafe { time_batch(batch, bytes, row.k) }.map_err(|c| format!("raw C++ batch: CUDA error {c}"))
                },
                &mut || resource_batch(&resource, &stream, bytes, row.k),
            )?;
            PairedRow::from_times(row.key, paired::RAW, row.k, &times).ok_or_else(|| "no samples".into())
        });
        out.push((row.key, result));
    }
    for (key, stack) in ADAPTOR_STACKS {
        let Some(row) = feature(key).filter(|r| wanted(r.key)) else { continue };
        let result = setup().and_then(|(pool, stream)| {
            let plain: Arc<dyn MemoryResource> = Arc::new(PoolResource::new(pool.clone()));
            let wrapped = stack(PoolResource::new(pool));
            let bytes = row.bytes as usize;
            let times = interleave(
                row.samples * SAMPLE_FACTOR,
                &mut || resource_batch(&plain, &stream, bytes, row.k),
                &mut || resource_batch(&wrapped, &stream, bytes, row.k),
            )?;
            PairedRow::from_times(row.key, "resource_pool_1m", row.k, &times).ok_or_else(|| "no samples".into())
        });
        out.push((row.key, result));
    }
    out
}
