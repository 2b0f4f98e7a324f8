//! Lesson 6, resources: one `MemoryResource` interface over every source of memory, and
//! adaptors that stack on it (statistics, limits, tracking with leak reports, logging).
//! `ResourceBuffer` allocates from any of them and frees through the same one.

use cuda_mem::resource::{
    LimitingResource, MemoryResource, PoolResource, ResourceBuffer, StatisticsResource, TrackingResource,
};
use cuda_mem::{Device, ErrorKind, MemPool, Stream};
use std::sync::Arc;

fn main() -> cuda_mem::Result<()> {
    let stream = Stream::non_blocking()?;
    // A retaining memory pool, capped at 64 MiB, counted, with every live allocation tracked.
    let pool = PoolResource::new(MemPool::retaining(Device::current()?)?);
    let stats = Arc::new(StatisticsResource::new(LimitingResource::new(TrackingResource::new(pool, false), 64 << 20)));
    let resource: Arc<dyn MemoryResource> = stats.clone();

    let a = ResourceBuffer::<f32>::zeroed(resource.clone(), &stream, 4 << 20)?; // 16 MiB
    let b = ResourceBuffer::<f32>::zeroed(resource.clone(), &stream, 8 << 20)?; // 32 MiB
    assert!(a.to_vec()?.iter().all(|&x| x == 0.0));
    let now = stats.stats();
    println!("live: {} allocations, {} bytes", now.current_count, now.current_bytes);
    assert_eq!(now.current_bytes, 48 << 20);

    // The limit refuses what would pass it, with a typed out-of-memory error.
    match ResourceBuffer::<f32>::zeroed(resource.clone(), &stream, 8 << 20) {
        Err(err) if matches!(err.kind(), ErrorKind::OutOfMemory { code: None, .. }) => {
            println!("refused by the limit: {err}")
        }
        other => panic!("expected the limit to refuse, got {other:?}"),
    }

    // The tracker below the limit knows every live allocation (and, with backtraces on, where
    // each was made): what a leak report prints.
    let tracker = stats.inner().inner();
    assert_eq!(tracker.outstanding().len(), 2);
    println!("{}", tracker.leak_report());

    drop((a, b)); // freed through the resource, in stream order on `stream`
    stream.synchronize()?;
    let end = stats.stats();
    println!(
        "after drop: {} live, peak {} bytes over {} allocations",
        end.current_count, end.peak_bytes, end.total_count
    );
    assert_eq!((end.current_count, end.peak_bytes), (0, 48 << 20));
    Ok(())
}
