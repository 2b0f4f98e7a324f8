//! Replays an allocation log (written by `LoggingResource`, CSV or JSON lines) against a chosen
//! resource and prints time, peak requested bytes and, where the resource reports one, its peak
//! reserve and the ratio of the two. `cargo xtask replay LOG [RESOURCE]` runs it.
//!
//! RESOURCE: `pool` (a retaining memory pool; the default), `cache` (`DeviceCache`, the caching
//! allocator, through its `MemoryResource` form), `device` (cudaMalloc), `managed`, `pinned`
//! (cudaHostAlloc), `pinned-pool` (the caching pinned pool).
//!
//! Prints one line for people and one JSON object for scripts (`"replay"` names the log):
//! `peak_reserved` is the pool's or the cache's reserve high-water mark, `null` for resources
//! without one.

use cuda_mem::resource::{
    DeviceResource, ManagedResource, MemoryResource, PinnedPoolResource, PinnedResource, PoolResource,
    StatisticsResource,
};
use cuda_mem::{Device, DeviceCache, HostAllocFlags, MemPool, PinnedPool, PoolProps, Stream};
use cuda_mem_bench::replay::replay;
use cuda_mem_workloads::log::parse_log;
use std::sync::Arc;

const USAGE: &str = "usage: replay LOG [pool|cache|device|managed|pinned|pinned-pool]";

fn main() {
    if let Err(message) = run() {
        eprintln!("replay: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or(USAGE)?;
    let which = args.next().unwrap_or_else(|| "pool".into());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let events = parse_log(&text)?;
    let device = Device::current().map_err(|e| e.to_string())?;
    let mut cache = None;
    let inner: Box<dyn MemoryResource> = match which.as_str() {
        "pool" => Box::new(PoolResource::new(MemPool::new(PoolProps::new(device)).map_err(|e| e.to_string())?)),
        "cache" => {
            let shared = Arc::new(DeviceCache::new(device).map_err(|e| e.to_string())?);
            cache = Some(Arc::clone(&shared));
            Box::new(shared)
        }
        "device" => Box::new(DeviceResource::new(device)),
        "managed" => Box::new(ManagedResource::new(device)),
        "pinned" => Box::new(PinnedResource::new(HostAllocFlags::empty())),
        "pinned-pool" => Box::new(PinnedPoolResource::new(PinnedPool::new(HostAllocFlags::empty()))),
        other => return Err(format!("unknown resource {other:?}; {USAGE}")),
    };
    let resource = StatisticsResource::new(inner);
    let stream = Stream::non_blocking().map_err(|e| e.to_string())?;
    let report = replay(&events, &resource, stream.as_stream_ref()).map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    let requested = resource.stats().peak_bytes;
    let reserved = resource.pool_stats().map(|p| p.reserved_high);
    let ratio = reserved.map(|r| r as f64 / requested.max(1) as f64);
    let elapsed_ms = report.elapsed.as_secs_f64() * 1e3;
    let reserve = match (reserved, ratio) {
        (Some(reserved), Some(ratio)) => format!("peak reserved {reserved} bytes, {ratio:.4} x requested"),
        _ => "no reserve figure".to_string(),
    };
    let segments = cache.as_ref().map_or(String::new(), |c| {
        let s = c.stats();
        format!("; {} segment allocations, {} releases", s.segment_allocations, s.segment_releases)
    });
    println!(
        "{} events against {which}: {} allocations, {} frees in {elapsed_ms:.3} ms; peak requested {requested} \
         bytes, {reserve}{segments}; {} never freed in the log, {} unmatched frees",
        events.len(),
        report.allocations,
        report.frees,
        report.unfreed_in_log,
        report.unmatched_frees
    );
    let number = |value: Option<String>| value.unwrap_or_else(|| "null".into());
    println!(
        "{{\"replay\":\"{}\",\"resource\":\"{which}\",\"events\":{},\"allocations\":{},\"frees\":{},\
         \"elapsed_ms\":{elapsed_ms:.3},\"peak_requested\":{requested},\"peak_reserved\":{},\
         \"reserved_over_requested\":{},\"unfreed_in_log\":{},\"unmatched_frees\":{}}}",
        path.replace('\\', "\\\\").replace('"', "\\\""),
        events.len(),
        report.allocations,
        report.frees,
        number(reserved.map(|r| r.to_string())),
        number(ratio.map(|r| format!("{r:.4}"))),
        report.unfreed_in_log,
        report.unmatched_frees
    );
    Ok(())
}
