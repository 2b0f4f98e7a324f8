//! `paired`: cuda-mem and its baseline interleaved in one process (see `cuda_mem_bench::paired`),
//! one JSON line per row on stdout (progress on stderr):
//! * every catalogue row against the raw C++ batch of `reference/` (the code `raw_reference`
//!   runs) on the same memory, pool and stream, with the row's K and twice its samples;
//! * `resource_pool_1m`, a `ResourceBuffer` from a `PoolResource`, against the raw C++
//!   `cudaMallocFromPoolAsync` batch on the same pool, and each adaptor stack against it;
//! * `device_cache_pair_*`, `DeviceCache` hot pairs, against the raw batch of
//!   `async_retain_nosync_*` on that row's pool and stream (`cuda_mem_bench::paired::CACHE_ROWS`);
//! * `graph_launch_*`, K launches of an executable graph and one synchronize, against the same
//!   through `cudaGraphLaunch` in C++ (`cuda_mem_bench::paired::GRAPH_ROWS`, [`graph_launches`]).
//!
//! Arguments that are not flags filter rows by substring; `--missed PAIRED.jsonl` keeps only the
//! rows that missed their target in that earlier output; `--list` lists the rows. `--api-time`
//! also records each side's time inside CUDA calls through CUPTI (`cuda_mem_bench::api_time`;
//! exit 3 when CUPTI cannot be loaded): a profile, not a judged run.

use cuda_mem::resource::{MemoryResource, PoolResource};
use cuda_mem::{CaptureMode, CudaError, Device, DeviceBuffer, DeviceCache, GraphFlags, MemPool, Stream};
use cuda_mem_bench::api_time::{self, ApiTotals};
use cuda_mem_bench::features::feature_row;
use cuda_mem_bench::in_process::{RawBatch, RawGraph, time_batch};
use cuda_mem_bench::paired::{self, CACHE_ROWS, GRAPH_NODES, GRAPH_ROWS, PairedRow, RAW};
use cuda_mem_bench::{inputs, rows, rows::ROWS, rows::Row};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "common.rs"]
mod common;
use common::{AllocRow, RESOURCE_STACKS, Side, pairs_then_sync, resource_pairs};

/// Samples per side, relative to the catalogue's: the interleaved figure is judged against a
/// 2% target, so it gets more samples than a one-sided row.
const SAMPLE_FACTOR: u32 = 2;

type Probe<'a> = Option<&'a dyn Fn() -> ApiTotals>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let missed = args.iter().position(|a| a == "--missed").map(|at| {
        let path = args.get(at + 1).unwrap_or_else(|| fail("--missed needs the path of an earlier run's output"));
        let keys = inputs::read(path.as_ref()).and_then(|text| paired::missed_keys(&text));
        keys.unwrap_or_else(|e| fail(&format!("--missed {path}: {e}")))
    });
    let filters: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|&(i, a)| !a.starts_with('-') && (i == 0 || args[i - 1] != "--missed"))
        .map(|(_, a)| a)
        .collect();
    let wanted = |key: &&str| {
        missed.as_ref().is_none_or(|keys| keys.iter().any(|k| k == key))
            && (filters.is_empty() || filters.iter().any(|f| key.contains(f.as_str())))
    };
    if flag("--list") {
        // The shape of criterion's listing: one "key: benchmark" line per row.
        ROWS.iter()
            .map(|r| r.key)
            .chain(RESOURCE_STACKS.map(|s| s.0))
            .chain(CACHE_ROWS.map(|c| c.0.key))
            .chain(GRAPH_ROWS.map(|g| g.key))
            .filter(wanted)
            .for_each(|k| println!("{k}: benchmark"));
        return;
    }
    let probe: Probe<'_> = flag("--api-time").then_some(&api_time::totals);
    if probe.is_some() {
        // Before the first CUDA call, so every call is seen.
        match api_time::start() {
            Ok(path) => eprintln!("paired: timing CUDA calls through {path}"),
            Err(reason) => {
                eprintln!("paired: --api-time needs CUPTI: {reason}.");
                std::process::exit(3);
            }
        }
    }
    common::require_gpu("paired", flag("--bench") && !flag("--test"));
    for row in ROWS.iter().filter(|r| wanted(&r.key)) {
        let mut registered = Vec::new();
        let result = common::setup(row, &mut registered).map_err(text).and_then(|mut side| {
            compare(row, RAW, probe, |base| match base {
                false => side.cuda_mem(row.k).map_err(text),
                // SAFETY: the memory, pool and stream of the batch belong to `side`, alive and
                // unused elsewhere during the batch.
                true => raw(unsafe { time_batch(side.raw().map_err(text)?, row.bytes as usize, row.k) }),
            })
        });
        emit(row.key, result);
    }
    for (key, stack) in RESOURCE_STACKS.into_iter().filter(|s| wanted(&s.0)) {
        let row = feature_row(key).expect("in the catalogue");
        let bytes = row.bytes as usize;
        let result = (|| {
            let pool = MemPool::retaining(Device::current().map_err(text)?).map_err(text)?;
            let stream = Stream::non_blocking().map_err(text)?;
            let plain: Arc<dyn MemoryResource> = Arc::new(PoolResource::new(pool.clone()));
            let wrapped = stack(PoolResource::new(pool.clone()));
            let batch = RawBatch::StreamOrdered {
                pool: pool.as_raw().cast(),
                stream: stream.as_raw().cast(),
                sync_each: false,
            };
            let against_raw = key == "resource_pool_1m";
            compare(row, if against_raw { RAW } else { "resource_pool_1m" }, probe, |base| match (base, against_raw) {
                (false, _) => resource_pairs(&wrapped, &stream, bytes, row.k).map_err(text),
                // SAFETY: `pool` and `stream` outlive the batch.
                (true, true) => raw(unsafe { time_batch(batch, bytes, row.k) }),
                (true, false) => resource_pairs(&plain, &stream, bytes, row.k).map_err(text),
            })
        })();
        emit(key, result);
    }
    for (row, raw_key) in CACHE_ROWS.iter().filter(|c| wanted(&c.0.key)) {
        let bytes = row.bytes as usize;
        let result = (|| {
            let cache = DeviceCache::for_device(Device::current().map_err(text)?).map_err(text)?;
            let mut side = AllocRow::setup(rows::row(raw_key).expect("in the catalogue")).map_err(text)?;
            let batch = side.raw().map_err(text)?;
            let AllocRow::Ordered(ordered) = &side else { unreachable!("{raw_key} is stream-ordered") };
            let stream = &ordered.stream;
            let pair = || {
                // SAFETY: never read; this measures allocation and free only.
                unsafe { cache.uninit::<u8>(stream, bytes) }.map(drop)
            };
            compare(row, RAW, probe, |base| match base {
                false => pairs_then_sync(stream, row.k, pair).map_err(text),
                // SAFETY: the row's pool and stream outlive the batch.
                true => raw(unsafe { time_batch(batch, bytes, row.k) }),
            })
        })();
        emit(row.key, result);
    }
    for row in GRAPH_ROWS.iter().filter(|r| wanted(&r.key)) {
        emit(row.key, graph_launches(row, probe));
    }
}

/// A `graph_launch_*` row: each side captures [`GRAPH_NODES`] memsets of its own buffer of the
/// row's bytes on one stream and instantiates them once; a batch is K launches and one
/// synchronize. cuda-mem's side is `GraphExec::run`, which queues the K launches and waits once,
/// as the C++ loop does; `GraphExec::launch` waits after every launch, so K of them would time
/// K synchronizes against the C++ side's one.
fn graph_launches(row: &Row, probe: Probe<'_>) -> Result<PairedRow, String> {
    let bytes = row.bytes as usize;
    let stream = Stream::non_blocking().map_err(text)?;
    let mut theirs = DeviceBuffer::<u8>::zeroed(bytes).map_err(text)?;
    let mut ours = DeviceBuffer::<u8>::zeroed(bytes).map_err(text)?;
    let theirs_ptr = theirs.as_mut_slice().as_device_ptr().cast();
    // SAFETY: `theirs` holds `bytes` on the stream's device; it and `stream` are dropped after
    // the graph (declared before it), and nothing else uses `theirs`.
    let raw_graph = unsafe { RawGraph::build(theirs_ptr, bytes, GRAPH_NODES, stream.as_raw().cast()) }
        .map_err(|code| format!("raw C++ graph: CUDA error {code}"))?;
    let mut view = ours.as_mut_slice();
    let graph = stream
        .capture(CaptureMode::ThreadLocal, |s| (0..GRAPH_NODES).try_for_each(|i| s.set_bytes(&mut view, i as u8)))
        .map_err(text)?;
    let mut exec = graph.instantiate(GraphFlags::empty()).map_err(text)?;
    let batch = RawBatch::GraphLaunches { exec: raw_graph.as_raw(), stream: stream.as_raw().cast() };
    compare(row, RAW, probe, |base| match base {
        false => {
            let start = Instant::now();
            exec.run(&stream, |launches| (0..row.k).try_for_each(|_| launches.launch())).map_err(text)?;
            Ok(start.elapsed())
        }
        // SAFETY: the C++ graph, its buffer and the stream outlive the batch; cuda-mem's side
        // waits for its launches before returning, so the stream is idle when a batch starts.
        true => raw(unsafe { time_batch(batch, bytes, row.k) }),
    })
}

/// Interleaves `batch(true)` (the baseline) and `batch(false)` (cuda-mem) for the row.
fn compare(
    row: &Row,
    baseline: &str,
    probe: Probe<'_>,
    batch: impl FnMut(bool) -> Result<Duration, String>,
) -> Result<PairedRow, String> {
    let times = paired::interleave(row.samples * SAMPLE_FACTOR, probe, batch)?;
    PairedRow::from_times(row.key, baseline, row.k, &times).ok_or_else(|| "no samples".into())
}

fn raw(result: Result<Duration, i32>) -> Result<Duration, String> {
    result.map_err(|code| format!("raw C++ batch: CUDA error {code}"))
}

fn text(e: CudaError) -> String {
    e.to_string()
}

fn fail(message: &str) -> ! {
    eprintln!("paired: {message}");
    std::process::exit(2);
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
