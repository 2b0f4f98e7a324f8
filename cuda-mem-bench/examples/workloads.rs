//! The workload corpus (`cuda-mem-workloads`) on the GPU: each workload replayed through
//! cuda-mem's allocators, a thread per lane with a non-blocking stream each, as
//! `cuda-mem-bench/workloads/README.md` describes (the peers' replayers follow the same method):
//! two passes with one allocator (the first warms it), time per op over the second, peak
//! reserved over both, peak live from the script. Writes the corpus as workload files into OUT
//! (for the peers) and prints JSON lines.
//!
//! `workloads OUT [--only NAME,..] [--extra FILE.cmwl ..]`

use cuda_mem::caching::{CachedBlock, Config};
use cuda_mem::{Device, DeviceCache, MemPool, Result, Stream, StreamBuffer};
use cuda_mem_workloads::{Op, Workload, format};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// What a replay measured.
struct Measured {
    ns_per_op: [f64; 2],
    peak_reserved: usize,
    misses_pass2: Option<u64>,
    releases_pass2: Option<u64>,
}

/// An allocator under test: a block handle per live id.
trait Replayer: Sync {
    type Block: Send;
    fn alloc(&self, bytes: usize, stream: &Stream) -> Result<Self::Block>;
    fn free(&self, block: Self::Block) -> Result<()>;
    fn free_on(&self, block: Self::Block, other: &Stream) -> Result<()>;
    fn empty_cache(&self) -> Result<()>;
    /// (peak reserved, segment allocations, segment releases) so far.
    fn figures(&self) -> Result<(usize, Option<u64>, Option<u64>)>;
}

struct Cache(DeviceCache);

impl Replayer for Cache {
    type Block = CachedBlock;

    fn alloc(&self, bytes: usize, stream: &Stream) -> Result<CachedBlock> {
        self.0.alloc_block(bytes, stream)
    }

    fn free(&self, block: CachedBlock) -> Result<()> {
        // SAFETY: no device work ever uses a replay's memory.
        unsafe { self.0.free_block(block) };
        Ok(())
    }

    fn free_on(&self, block: CachedBlock, other: &Stream) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.0.free_block_on(block, other) }
    }

    fn empty_cache(&self) -> Result<()> {
        self.0.empty_cache();
        Ok(())
    }

    fn figures(&self) -> Result<(usize, Option<u64>, Option<u64>)> {
        let stats = self.0.stats();
        Ok((stats.reserved.peak, Some(stats.segment_allocations), Some(stats.segment_releases)))
    }
}

struct Pool(MemPool);

impl Replayer for Pool {
    type Block = StreamBuffer<'static, u8>;

    fn alloc(&self, bytes: usize, stream: &Stream) -> Result<Self::Block> {
        // SAFETY: never read.
        unsafe { StreamBuffer::uninit_from(self.0.clone(), stream.clone(), bytes) }
    }

    fn free(&self, block: Self::Block) -> Result<()> {
        block.free()
    }

    fn free_on(&self, block: Self::Block, other: &Stream) -> Result<()> {
        block.free_on(other)
    }

    fn empty_cache(&self) -> Result<()> {
        self.0.trim_to(0)
    }

    fn figures(&self) -> Result<(usize, Option<u64>, Option<u64>)> {
        Ok((self.0.stats()?.reserved_high, None, None))
    }
}

/// Runs `workload` twice through `replayer`.
fn replay<R: Replayer>(replayer: &R, workload: &Workload) -> Result<Measured> {
    let streams: Vec<Stream> = workload.lanes.iter().map(|_| Stream::non_blocking()).collect::<Result<_>>()?;
    let mut ns_per_op = [0.0; 2];
    let mut before = (0, None, None);
    for (pass, ns) in ns_per_op.iter_mut().enumerate() {
        if pass == 1 {
            before = replayer.figures()?;
        }
        let barrier = Barrier::new(streams.len());
        let times: Vec<Result<Duration>> = std::thread::scope(|scope| {
            let handles: Vec<_> = workload
                .lanes
                .iter()
                .enumerate()
                .map(|(lane, ops)| {
                    let (streams, barrier) = (&streams, &barrier);
                    scope.spawn(move || -> Result<Duration> {
                        let stream = &streams[lane];
                        let mut live: Vec<Option<R::Block>> = Vec::new();
                        barrier.wait();
                        let start = Instant::now();
                        for op in &ops.ops {
                            match *op {
                                Op::Alloc { id, bytes } => {
                                    let id = id as usize;
                                    if live.len() <= id {
                                        live.resize_with(id + 1, || None);
                                    }
                                    live[id] = Some(replayer.alloc(bytes as usize, stream)?);
                                }
                                Op::Free { id } => replayer.free(live[id as usize].take().expect("a live id"))?,
                                Op::FreeOn { id, lane } => {
                                    let block = live[id as usize].take().expect("a live id");
                                    replayer.free_on(block, &streams[usize::from(lane)])?;
                                }
                                Op::EmptyCache => replayer.empty_cache()?,
                            }
                        }
                        let elapsed = start.elapsed();
                        stream.synchronize()?;
                        Ok(elapsed)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a replay thread panicked")).collect()
        });
        let mut total = Duration::ZERO;
        for time in times {
            total += time?;
        }
        for stream in &streams {
            stream.synchronize()?;
        }
        *ns = total.as_nanos() as f64 / workload.ops() as f64;
    }
    let (peak_reserved, misses, releases) = replayer.figures()?;
    Ok(Measured {
        ns_per_op,
        peak_reserved,
        misses_pass2: misses.zip(before.1).map(|(a, b)| a - b),
        releases_pass2: releases.zip(before.2).map(|(a, b)| a - b),
    })
}

fn json_opt(value: Option<u64>) -> String {
    value.map_or("null".into(), |v| v.to_string())
}

fn report(workload: &Workload, allocator: &str, config: &str, measured: Result<Measured>) {
    let shape = workload.shape();
    let head = format!(
        "{{\"workload\":\"{}\",\"allocator\":\"{allocator}\",\"lanes\":{},\"ops\":{}",
        workload.name,
        workload.lanes.len(),
        workload.ops()
    );
    match measured {
        Ok(m) => println!(
            "{head},\"ns_per_op\":{:.1},\"ns_per_op_pass1\":{:.1},\"peak_reserved_bytes\":{},\"peak_live_bytes\":{},\"reserved_over_live\":{:.4},\"misses_pass2\":{},\"releases_pass2\":{},\"allocations_pass2\":{},\"config\":\"{config}\",\"version\":\"cuda-mem {}\"}}",
            m.ns_per_op[1],
            m.ns_per_op[0],
            m.peak_reserved,
            shape.peak_live_round_robin,
            m.peak_reserved as f64 / shape.peak_live_round_robin as f64,
            json_opt(m.misses_pass2),
            json_opt(m.releases_pass2),
            shape.allocations,
            env!("CARGO_PKG_VERSION"),
        ),
        Err(err) => println!("{head},\"error\":{:?}}}", err.to_string()),
    }
}

/// The cache's parameters the rows compare: the default, and each with one choice changed.
fn named_config(name: &str) -> Option<Config> {
    let default = Config::default();
    Some(match name {
        "default" => default,
        "throughput" => Config::throughput(),
        "segments" => Config { expandable_segments: false, ..default },
        "front_unbounded" => Config { front_max_block: usize::MAX, ..default },
        "no_live_slack" => Config { live_slack_percent: 0, ..default },
        "live_slack_5" => Config { live_slack_percent: 5, ..default },
        "no_large_slot" => Config { front_large_slot: false, ..default },
        "neither" => Config { live_slack_percent: 0, front_large_slot: false, ..default },
        // Mappings of up to N MiB per new physical allocation (`mappings_8`, `mappings_64`, ..).
        _ => {
            let mib: usize = name.strip_prefix("mappings_")?.parse().ok()?;
            Config { max_mapping_bytes: mib << 20, ..default }
        }
    })
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: workloads OUT [--only NAME,..] [--extra FILE..] [--configs NAME,..]";
    let out = std::path::PathBuf::from(args.next().ok_or(usage)?);
    let (mut only, mut extra, mut chosen) = (None, Vec::new(), None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--only" => only = Some(args.next().ok_or("--only needs names")?),
            "--configs" => chosen = Some(args.next().ok_or("--configs needs names")?),
            "--extra" => extra.push(args.next().ok_or("--extra needs a file")?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    std::fs::create_dir_all(&out)?;
    let mut workloads = cuda_mem_workloads::corpus();
    for file in &extra {
        workloads.push(format::read(&mut std::io::BufReader::new(std::fs::File::open(file)?))?);
    }
    if let Some(only) = &only {
        workloads.retain(|w| only.split(',').any(|n| n == w.name));
    }
    let device = Device::new(0)?;
    for workload in &workloads {
        let path = out.join(format!("{}.cmwl", workload.name));
        format::write(workload, &mut std::io::BufWriter::new(std::fs::File::create(&path)?))?;
        let names = chosen.as_deref().unwrap_or("default,throughput,segments,front_unbounded");
        for name in names.split(',') {
            let config = named_config(name).ok_or_else(|| format!("unknown config {name}"))?;
            let cache = Cache(DeviceCache::with_config(device, config)?);
            report(workload, &format!("cuda_mem_cache_{name}"), name, replay(&cache, workload));
        }
        let pool = Pool(MemPool::retaining(device)?);
        // The pool may be one the process made before: start its figures from nothing.
        pool.0.trim_to(0)?;
        pool.0.reset_highs()?;
        report(workload, "cuda_mem_stream_pool", "MemPool::retaining", replay(&pool, workload));
    }
    Ok(())
}
