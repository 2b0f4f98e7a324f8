//! Stress: N threads × M streams doing mixed allocations from every resource and from the caching
//! allocator (`DeviceCache`'s buffers, copied across streams with `use_on` and freed on other
//! streams with `free_on`), copies, memsets and frees in random order, verifying every buffer's
//! data by checksum. At the end the pools and the cache are trimmed and their reserved memory
//! must be back at the starting figure, and the tracking adaptor and the cache's figures must
//! show no leak. Bounded in operations and time.
//!
//! `stress [--threads 8] [--streams 4] [--ops 100000] [--seconds 600] [--log PATH]`
//!
//! `--log PATH` records the pool family's allocations and frees (`LoggingResource`, JSON lines)
//! for the `replay` example; with `--threads 1` the log's order is the order the statistics saw,
//! so replaying it gives the same peak as the "pool" line printed here.

use cuda_mem::resource::*;
use cuda_mem::*;
use cuda_mem_workloads::stress::{StressOp, StressSchedule};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Args {
    threads: usize,
    streams: usize,
    ops: u64,
    seconds: u64,
    log: Option<std::path::PathBuf>,
}

fn parse_args() -> Args {
    let mut args = Args { threads: 8, streams: 4, ops: 100_000, seconds: 600, log: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--log" {
            args.log = it.next().map(Into::into);
            continue;
        }
        let value = it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or_else(|| {
            eprintln!("usage: stress [--threads N] [--streams N] [--ops N] [--seconds N] [--log PATH]");
            std::process::exit(2)
        });
        match flag.as_str() {
            "--threads" => args.threads = value as usize,
            "--streams" => args.streams = value as usize,
            "--ops" => args.ops = value,
            "--seconds" => args.seconds = value,
            _ => {
                eprintln!("unknown flag {flag}");
                std::process::exit(2)
            }
        }
    }
    args
}

/// A buffer's contents: xorshift from `seed`.
fn fill(seed: u64, len: usize) -> Vec<u32> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        })
        .collect()
}

/// A buffer of a resource family or of the cache.
enum Held<'a> {
    Resource(ResourceBuffer<'a, u32>),
    PinnedResource(ResourceHostBuffer<'a, u32>),
    Cached(CachedBuffer<'a, u32>),
}

/// A live buffer and the data it must hold.
struct Live<'a> {
    held: Held<'a>,
    want: Vec<u32>,
}

impl Live<'_> {
    fn to_vec(&self) -> Result<Vec<u32>> {
        match &self.held {
            Held::Resource(buffer) => buffer.to_vec(),
            Held::PinnedResource(buffer) => buffer.to_vec(),
            Held::Cached(buffer) => buffer.as_slice().to_vec(),
        }
    }
}

fn main() -> Result<()> {
    let args = parse_args();
    if Device::count().is_err() {
        eprintln!("stress needs a CUDA GPU; none is usable here.");
        std::process::exit(2);
    }
    let device = Device::current()?;
    let device_pool = MemPool::new(PoolProps::new(device))?;
    let baseline = device_pool.stats()?.reserved_current;
    let pinned_pool = PinnedPool::with_max_cached_bytes(HostAllocFlags::empty(), 256 << 20);
    let cache = DeviceCache::new(device)?;
    // One tracking + statistics stack per family.
    let log = match &args.log {
        Some(path) => Some(std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| {
            CudaError::new(ErrorKind::InvalidArgument("cannot create the log file"), format!("{}: {e}", path.display()))
        })?)),
        None => None,
    };
    let tracked: Vec<Arc<Tracked>> = families(device, &device_pool, &pinned_pool, log)
        .into_iter()
        .map(|family| Arc::new(TrackingResource::new(StatisticsResource::new(family), false)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let done_ops = AtomicU64::new(0);
    let verified = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let (tracked, cache, done_ops, verified) = (&tracked, &cache, &done_ops, &verified);
                let args = &args;
                scope.spawn(move || -> Result<()> {
                    device.set_current()?;
                    let streams: Vec<Stream> =
                        (0..args.streams).map(|_| Stream::non_blocking()).collect::<Result<_>>()?;
                    // The cache is the last family.
                    let schedule = StressSchedule::new(t as u64 + 1, streams.len(), tracked.len() + 1);
                    let mut live: Vec<Live> = Vec::new();
                    for (op, step) in schedule.take(args.ops as usize).enumerate() {
                        if op % 256 == 0 && Instant::now() > deadline {
                            break;
                        }
                        match step {
                            // allocate, write through a scope, remember
                            StressOp::Allocate { stream, family, len, fill_seed } => {
                                let stream = &streams[stream];
                                let want = fill(fill_seed, len);
                                let held = match tracked.get(family) {
                                    Some(family) if family.kind() == MemoryKind::PinnedHost => {
                                        let mut buffer =
                                            ResourceHostBuffer::<u32>::zeroed(family.clone(), stream, len)?;
                                        buffer.host_mut()?.copy_from_slice(&want);
                                        Held::PinnedResource(buffer)
                                    }
                                    Some(family) => {
                                        let mut buffer = ResourceBuffer::<u32>::zeroed(family.clone(), stream, len)?;
                                        let mut view = buffer.as_mut_slice();
                                        stream.scope(|s| s.copy_from_host(&mut view, &want))??;
                                        Held::Resource(buffer)
                                    }
                                    None => {
                                        let mut buffer = cache.zeroed::<u32>(stream, len)?;
                                        let mut view = buffer.as_mut_slice();
                                        stream.scope(|s| s.copy_from_host(&mut view, &want))??;
                                        Held::Cached(buffer)
                                    }
                                };
                                live.push(Live { held, want });
                            }
                            // verify a random live buffer
                            StressOp::Verify { index, .. } => {
                                let got = live[index].to_vec()?;
                                assert!(got == live[index].want, "thread {t} op {op}: data corrupted");
                                verified.fetch_add(1, Ordering::Relaxed);
                            }
                            // copy one device-visible buffer into another of the same length
                            StressOp::Copy { stream, index } => {
                                let stream = &streams[stream];
                                let want = live[index].want.clone();
                                let held = match &mut live[index].held {
                                    Held::Resource(source) => Held::Resource(copy_resource(source)?),
                                    Held::PinnedResource(source) => {
                                        let (resource, on) = (source.resource().clone(), source.stream().clone());
                                        let mut fresh = ResourceHostBuffer::<u32>::zeroed(resource, on, want.len())?;
                                        fresh.host_mut()?.copy_from_slice(source.host()?);
                                        Held::PinnedResource(fresh)
                                    }
                                    Held::Cached(source) => {
                                        // On this operation's stream, which may be another one:
                                        // it waits for the source's stream, and the source's free
                                        // will wait for it.
                                        source.use_on(stream)?;
                                        let mut fresh = cache.zeroed::<u32>(stream, want.len())?;
                                        let (from, mut to) = (source.as_slice(), fresh.as_mut_slice());
                                        stream.scope(|s| s.copy_from_device(&mut to, from))??;
                                        Held::Cached(fresh)
                                    }
                                };
                                live.push(Live { held, want });
                            }
                            // free a random buffer (random order)
                            StressOp::Free { stream, index } => {
                                match live.swap_remove(index).held {
                                    // Freed on this operation's stream: reusable once its work
                                    // so far completes (its own stream frees at once).
                                    Held::Cached(buffer) => buffer.free_on(&streams[stream])?,
                                    Held::Resource(buffer) => drop(buffer),
                                    Held::PinnedResource(buffer) => drop(buffer),
                                }
                            }
                            StressOp::Idle { .. } => {}
                        }
                        done_ops.fetch_add(1, Ordering::Relaxed);
                    }
                    for entry in &live {
                        assert!(entry.to_vec()? == entry.want, "thread {t}: final check failed");
                        verified.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(live);
                    for stream in &streams {
                        stream.synchronize()?;
                    }
                    Ok(())
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("a stress thread panicked")?;
        }
        Ok(())
    })?;
    device.synchronize()?;
    device_pool.trim_to(0)?;
    pinned_pool.trim();
    let after = device_pool.stats()?.reserved_current;
    let cached = cache.stats();
    // Settles the blocks freed on other streams, then releases every segment.
    let cache_released = cache.empty_cache();
    let emptied = cache.stats();
    let cache_after = emptied.reserved.current;
    let stats: Vec<ResourceStats> = tracked.iter().map(|t| t.inner().stats()).collect();
    let (allocations, peak): (u64, usize) =
        (stats.iter().map(|s| s.total_count).sum(), stats.iter().map(|s| s.peak_bytes).sum());
    let ops = done_ops.load(Ordering::Relaxed);
    println!(
        "{} threads x {} streams: {ops} operations ({} per thread), {} buffers verified, {allocations} allocations, \
         sum of per-family peaks {peak} bytes, {:.1} s",
        args.threads,
        args.streams,
        ops / args.threads as u64,
        verified.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    println!("pool reserved: baseline {baseline} bytes, after trim {after} bytes");
    println!(
        "cache: peak {} bytes allocated in {} allocations ({} front-cache hits, {} core hits, {} segment \
         allocations, {} adopted by another stream); {} bytes held at the end; peak reserved {} bytes, \
         {cache_released} released by empty_cache, {cache_after} left",
        cached.allocated.peak,
        cache.class_stats().iter().map(|c| c.allocations).sum::<u64>(),
        cached.front_hits,
        cached.core_hits,
        cached.segment_allocations,
        cached.segments_adopted,
        cached.allocated.current,
        cached.reserved.peak,
    );
    for ((family, t), s) in ["device", "managed", "pool", "pinned", "pinned-pool"].iter().zip(&tracked).zip(&stats) {
        println!("{family}: peak {} bytes in {} allocations; {}", s.peak_bytes, s.total_count, t.leak_report());
    }
    let no_leaks = tracked.iter().all(|t| t.outstanding().is_empty()) && stats.iter().all(|s| s.current_bytes == 0);
    let cache_clean = emptied.allocated.current == 0 && emptied.pending_bytes == 0 && cache_after == 0;
    let ok = after == baseline && no_leaks && cache_clean;
    if !ok {
        eprintln!("stress: memory did not return to baseline or a leak was reported");
        std::process::exit(1);
    }
    println!("stress: all data verified, memory back to baseline, no leaks");
    Ok(())
}

type Tracked = TrackingResource<StatisticsResource<Arc<dyn MemoryResource>>>;

/// Every resource family, in the order the report names them.
fn families(
    device: Device,
    pool: &MemPool,
    pinned: &PinnedPool,
    log: Option<impl std::io::Write + Send + 'static>,
) -> Vec<Arc<dyn MemoryResource>> {
    let pool_resource = PoolResource::new(pool.clone());
    let pool_family: Arc<dyn MemoryResource> = match log {
        Some(sink) => Arc::new(LoggingResource::new(pool_resource, sink, LogFormat::JsonLines)),
        None => Arc::new(pool_resource),
    };
    vec![
        Arc::new(DeviceResource::new(device)),
        Arc::new(ManagedResource::new(device)),
        pool_family,
        Arc::new(PinnedResource::new(HostAllocFlags::empty())),
        Arc::new(PinnedPoolResource::new(pinned.clone())),
    ]
}

/// A copy of `source` from its resource, on its stream.
fn copy_resource<'a>(source: &ResourceBuffer<'a, u32>) -> Result<ResourceBuffer<'a, u32>> {
    let mut fresh = ResourceBuffer::<u32>::zeroed(source.resource().clone(), source.stream().clone(), source.len())?;
    let (from, mut to) = (source.as_slice(), fresh.as_mut_slice());
    // On the buffer's own stream: ordered after its zeroing.
    source.stream().scope(|s| s.copy_from_device(&mut to, from))??;
    Ok(fresh)
}
