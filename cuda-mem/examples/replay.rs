//! Replays an allocation log (written by `LoggingResource`, CSV or JSON lines) against a chosen
//! resource and prints time and peak memory. `cargo xtask replay LOG [RESOURCE]` runs it.
//!
//! RESOURCE: `pool` (a retaining memory pool; the default), `device` (cudaMalloc), `managed`,
//! `pinned` (cudaHostAlloc), `pinned-pool` (the caching pinned pool).

use cuda_mem::resource::{
    DeviceResource, ManagedResource, MemoryResource, PinnedPoolResource, PinnedResource, PoolResource,
    StatisticsResource, parse_log, replay,
};
use cuda_mem::{Device, HostAllocFlags, MemPool, PinnedPool, PoolProps, Stream};

fn main() {
    if let Err(message) = run() {
        eprintln!("replay: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: replay LOG [pool|device|managed|pinned|pinned-pool]")?;
    let which = args.next().unwrap_or_else(|| "pool".into());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let events = parse_log(&text)?;
    let device = Device::current().map_err(|e| e.to_string())?;
    let inner: Box<dyn MemoryResource> = match which.as_str() {
        "pool" => Box::new(PoolResource::new(MemPool::new(PoolProps::new(device)).map_err(|e| e.to_string())?)),
        "device" => Box::new(DeviceResource::new(device)),
        "managed" => Box::new(ManagedResource::new(device)),
        "pinned" => Box::new(PinnedResource::new(HostAllocFlags::empty())),
        "pinned-pool" => Box::new(PinnedPoolResource::new(PinnedPool::new(HostAllocFlags::empty()))),
        other => return Err(format!("unknown resource {other:?}")),
    };
    let resource = StatisticsResource::new(inner);
    let stream = Stream::non_blocking().map_err(|e| e.to_string())?;
    let report = replay(&events, &resource, stream.as_stream_ref()).map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    println!(
        "{} events against {which}: {} allocations, {} frees in {:.3} ms; peak {} bytes; \
         {} never freed in the log, {} unmatched frees",
        events.len(),
        report.allocations,
        report.frees,
        report.elapsed.as_secs_f64() * 1e3,
        report.peak_bytes,
        report.unfreed_in_log,
        report.unmatched_frees
    );
    Ok(())
}
