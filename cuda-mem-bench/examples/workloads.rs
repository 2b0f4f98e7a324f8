//! The workload corpus (`cuda-mem-workloads`) on the GPU: each workload replayed through
//! cuda-mem's allocators, a thread per lane with a non-blocking stream each, as
//! `cuda-mem-bench/workloads/README.md` describes (the peers' replayers follow the same method):
//! two passes with one allocator (the first warms it), time per op over the second, peak
//! reserved over both, peak live from the script. Writes the corpus as workload files into OUT
//! (for the peers) and prints JSON lines.
//!
//! `workloads OUT [--only NAME,..] [--extra FILE.cmwl ..] [--configs NAME,..] [--breakdown] [--at-peak]`
//!
//! `--breakdown` times every operation of the second pass too (which costs the fast paths a
//! clock read each, so its rows are for finding where time goes, not for comparing) and adds
//! the time spent in slow allocations, slow frees and `empty_cache`, the cache's hit and miss
//! counts, and the most bytes live at once as the threads ran (the script's peak live is the
//! round-robin order's, which threads running free may exceed).
//!
//! `--at-peak` reads the cache's reserve after every allocation (two atomic loads) and, each
//! time it passes its highest so far, the cache's figures (every lock of the cache: its rows are
//! for finding what holds the reserve, not for comparing): the row's `at_peak` gives them as
//! they stood when the reserve was at its highest, in both passes. What the reserve holds
//! beyond the blocks in users' hands splits into free memory that unmapping could give back now
//! (`trimmable`), free memory sharing a mapping with blocks in use, blocks parked in threads'
//! front caches, blocks pending another stream's work, and kept pages.

use cuda_mem::caching::{CachedBlock, Config};
use cuda_mem::{Device, DeviceCache, MemPool, Result, Stream, StreamBuffer};
use cuda_mem_workloads::{Op, Workload, format};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What a replay measured.
struct Measured {
    ns_per_op: [f64; 2],
    /// With `--breakdown`: the second pass's time by operation, and the cache's (front hits,
    /// core hits, misses, blocks lent) over it.
    breakdown: Option<(Breakdown, Option<[u64; 4]>)>,
    peak_reserved: usize,
    misses_pass2: Option<u64>,
    releases_pass2: Option<u64>,
    /// With `--at-peak`: the cache's figures when its reserve was at its highest (JSON).
    at_peak: Option<String>,
}

/// Operations slower than this count as slow in a breakdown: far above a hit (tens to
/// hundreds of ns), below any driver call that maps or unmaps.
const SLOW: Duration = Duration::from_micros(4);

/// Where a pass's time went, summed over its threads: (count, ns) per kind of operation.
#[derive(Default, Clone, Copy)]
struct Breakdown {
    allocs: (u64, u128),
    slow_allocs: (u64, u128),
    frees: (u64, u128),
    slow_frees: (u64, u128),
    empty_caches: (u64, u128),
    /// The most bytes live at once as the threads interleaved (the script's peak is the
    /// round-robin order's).
    live_peak: usize,
}

impl Breakdown {
    fn add(&mut self, other: &Breakdown) {
        for (a, b) in [
            (&mut self.allocs, other.allocs),
            (&mut self.slow_allocs, other.slow_allocs),
            (&mut self.frees, other.frees),
            (&mut self.slow_frees, other.slow_frees),
            (&mut self.empty_caches, other.empty_caches),
        ] {
            a.0 += b.0;
            a.1 += b.1;
        }
    }

    fn note(&mut self, kind: &Op, took: Duration) {
        let slow = took >= SLOW;
        let (all, slow_bucket) = match kind {
            Op::Alloc { .. } => (&mut self.allocs, Some(&mut self.slow_allocs)),
            Op::Free { .. } | Op::FreeOn { .. } => (&mut self.frees, Some(&mut self.slow_frees)),
            Op::EmptyCache => (&mut self.empty_caches, None),
        };
        all.0 += 1;
        all.1 += took.as_nanos();
        if let Some(bucket) = slow_bucket.filter(|_| slow) {
            bucket.0 += 1;
            bucket.1 += took.as_nanos();
        }
    }

    fn json(&self) -> String {
        let pair = |(n, ns): (u64, u128)| format!("[{n},{ns}]");
        format!(
            "{{\"allocs\":{},\"slow_allocs\":{},\"frees\":{},\"slow_frees\":{},\"empty_caches\":{},\"live_peak_bytes\":{}}}",
            pair(self.allocs),
            pair(self.slow_allocs),
            pair(self.frees),
            pair(self.slow_frees),
            pair(self.empty_caches),
            self.live_peak
        )
    }
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
    /// The cache's counters, for a breakdown: (front hits, core hits, misses, blocks lent).
    fn counters(&self) -> Option<[u64; 4]> {
        None
    }
    /// Bytes reserved now, if the allocator can say so without a lock (for `--at-peak`).
    fn reserved_now(&self) -> Option<usize> {
        None
    }
    /// What the reserve holds now, as a JSON object (for `--at-peak`).
    fn reserve_figures(&self) -> Option<String> {
        None
    }
}

/// The highest reserve seen after an allocation, and the figures read when it was seen.
#[derive(Default)]
struct PeakWatch {
    highest: AtomicUsize,
    figures: Mutex<Option<String>>,
}

impl PeakWatch {
    fn look<R: Replayer>(&self, replayer: &R) {
        let Some(now) = replayer.reserved_now() else { return };
        if now <= self.highest.load(Ordering::Relaxed) {
            return;
        }
        let mut figures = self.figures.lock().unwrap_or_else(PoisonError::into_inner);
        if now > self.highest.load(Ordering::Relaxed) {
            self.highest.store(now, Ordering::Relaxed);
            *figures = replayer.reserve_figures();
        }
    }

    fn into_figures(self) -> Option<String> {
        self.figures.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
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

    fn counters(&self) -> Option<[u64; 4]> {
        let s = self.0.stats();
        Some([s.front_hits, s.core_hits, s.misses, s.blocks_lent])
    }

    fn reserved_now(&self) -> Option<usize> {
        Some(self.0.reserved().current)
    }

    fn reserve_figures(&self) -> Option<String> {
        let s = self.0.stats();
        Some(format!(
            "{{\"reserved\":{},\"allocated\":{},\"requested\":{},\"parked\":{},\"pending\":{},\"free\":{},\"trimmable\":{},\"idle\":{},\"kept\":{},\"largest_free_block\":{},\"segments\":{}}}",
            s.reserved.current,
            s.allocated.current,
            s.requested.current,
            s.parked_bytes,
            s.pending_bytes,
            s.free_bytes,
            s.trimmable_bytes,
            s.idle_bytes,
            s.kept_bytes,
            s.largest_free_block,
            s.segments
        ))
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
fn replay<R: Replayer>(replayer: &R, workload: &Workload, breakdown: bool, at_peak: bool) -> Result<Measured> {
    let streams: Vec<Stream> = workload.lanes.iter().map(|_| Stream::non_blocking()).collect::<Result<_>>()?;
    let mut ns_per_op = [0.0; 2];
    let mut before = (0, None, None);
    let (mut spent_pass2, mut counters_before) = (None, None);
    let watch = PeakWatch::default();
    for (pass, ns) in ns_per_op.iter_mut().enumerate() {
        if pass == 1 {
            before = replayer.figures()?;
            counters_before = replayer.counters();
        }
        let timed = breakdown && pass == 1;
        let barrier = Barrier::new(streams.len());
        // Bytes live across all threads as they actually interleave (timed pass only).
        let (live_now, live_peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let times: Vec<Result<(Duration, Breakdown)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = workload
                .lanes
                .iter()
                .enumerate()
                .map(|(lane, ops)| {
                    let (streams, barrier, live_now, live_peak, watch) =
                        (&streams, &barrier, &live_now, &live_peak, &watch);
                    let count = |bytes: usize, alloc: bool| {
                        if alloc {
                            let now = live_now.fetch_add(bytes, Ordering::Relaxed) + bytes;
                            live_peak.fetch_max(now, Ordering::Relaxed);
                        } else {
                            live_now.fetch_sub(bytes, Ordering::Relaxed);
                        }
                    };
                    scope.spawn(move || -> Result<(Duration, Breakdown)> {
                        let stream = &streams[lane];
                        let mut live: Vec<Option<(R::Block, usize)>> = Vec::new();
                        let mut spent = Breakdown::default();
                        barrier.wait();
                        let start = Instant::now();
                        for op in &ops.ops {
                            let op_start = timed.then(Instant::now);
                            match *op {
                                Op::Alloc { id, bytes } => {
                                    let id = id as usize;
                                    if live.len() <= id {
                                        live.resize_with(id + 1, || None);
                                    }
                                    live[id] = Some((replayer.alloc(bytes as usize, stream)?, bytes as usize));
                                    if timed {
                                        count(bytes as usize, true);
                                    }
                                    if at_peak {
                                        watch.look(replayer);
                                    }
                                }
                                Op::Free { id } | Op::FreeOn { id, .. } => {
                                    let (block, bytes) = live[id as usize].take().expect("a live id");
                                    if timed {
                                        count(bytes, false);
                                    }
                                    match *op {
                                        Op::FreeOn { lane, .. } => {
                                            replayer.free_on(block, &streams[usize::from(lane)])?
                                        }
                                        _ => replayer.free(block)?,
                                    }
                                }
                                Op::EmptyCache => replayer.empty_cache()?,
                            }
                            if let Some(op_start) = op_start {
                                spent.note(op, op_start.elapsed());
                            }
                        }
                        let elapsed = start.elapsed();
                        stream.synchronize()?;
                        Ok((elapsed, spent))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a replay thread panicked")).collect()
        });
        let mut total = Duration::ZERO;
        let mut spent = Breakdown::default();
        for time in times {
            let (elapsed, lane) = time?;
            total += elapsed;
            spent.add(&lane);
        }
        if timed {
            spent.live_peak = live_peak.load(Ordering::Relaxed);
            spent_pass2 = Some(spent);
        }
        for stream in &streams {
            stream.synchronize()?;
        }
        *ns = total.as_nanos() as f64 / workload.ops() as f64;
    }
    let (peak_reserved, misses, releases) = replayer.figures()?;
    let counters = replayer.counters().zip(counters_before).map(|(after, before)| {
        let mut delta = [0; 4];
        for (d, (a, b)) in delta.iter_mut().zip(after.iter().zip(before)) {
            *d = a - b;
        }
        delta
    });
    Ok(Measured {
        ns_per_op,
        breakdown: spent_pass2.map(|spent| (spent, counters)),
        peak_reserved,
        misses_pass2: misses.zip(before.1).map(|(a, b)| a - b),
        releases_pass2: releases.zip(before.2).map(|(a, b)| a - b),
        at_peak: watch.into_figures(),
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
            "{head}{}{},\"ns_per_op\":{:.1},\"ns_per_op_pass1\":{:.1},\"peak_reserved_bytes\":{},\"peak_live_bytes\":{},\"reserved_over_live\":{:.4},\"misses_pass2\":{},\"releases_pass2\":{},\"allocations_pass2\":{},\"config\":\"{config}\",\"version\":\"cuda-mem {}\"}}",
            m.breakdown.map_or(String::new(), |(spent, counters)| format!(
                ",\"breakdown\":{},\"counters_pass2\":{}",
                spent.json(),
                counters.map_or("null".into(), |[front, core, misses, lent]| format!(
                    "{{\"front_hits\":{front},\"core_hits\":{core},\"misses\":{misses},\"lent\":{lent}}}"
                ))
            )),
            m.at_peak.map_or(String::new(), |figures| format!(",\"at_peak\":{figures}")),
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

/// The cache's parameters the rows compare: the default, and each with one choice changed;
/// choices joined by `+` apply in turn (`mappings_32+front_block_4`; `throughput` starts over).
fn named_config(name: &str) -> Option<Config> {
    name.split('+').try_fold(Config::default(), with_choice)
}

fn with_choice(default: Config, name: &str) -> Option<Config> {
    let mib = |prefix: &str| -> Option<usize> { Some(name.strip_prefix(prefix)?.parse::<usize>().ok()? << 20) };
    if let Some(bytes) = mib("front_block_") {
        return Some(Config { front_max_block: bytes, ..default });
    }
    if let Some(bytes) = mib("ahead_") {
        return Some(Config { map_ahead_bytes: bytes, ..default });
    }
    if let Some(bytes) = mib("own_range_") {
        return Some(Config { own_range_from: bytes, ..default });
    }
    Some(match name {
        "default" => default,
        "throughput" => Config::throughput(),
        "segments" => Config { expandable_segments: false, ..default },
        "front_unbounded" => Config { front_max_block: usize::MAX, ..default },
        "no_live_slack" => Config { live_slack_percent: 0, ..default },
        "live_slack_5" => Config { live_slack_percent: 5, ..default },
        "no_large_slot" => Config { front_large_slot: false, ..default },
        "neither" => Config { live_slack_percent: 0, front_large_slot: false, ..default },
        "lowest_pages" => Config { lowest_for_whole_pages: true, ..default },
        // Mappings of up to N MiB per new physical allocation (`mappings_8`, `mappings_64`, ..).
        _ => Config { max_mapping_bytes: mib("mappings_")?, ..default },
    })
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: workloads OUT [--only NAME,..] [--extra FILE..] [--configs NAME,..] [--breakdown] [--at-peak]";
    let out = std::path::PathBuf::from(args.next().ok_or(usage)?);
    let (mut only, mut extra, mut chosen, mut breakdown, mut at_peak) = (None, Vec::new(), None, false, false);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--only" => only = Some(args.next().ok_or("--only needs names")?),
            "--configs" => chosen = Some(args.next().ok_or("--configs needs names")?),
            "--extra" => extra.push(args.next().ok_or("--extra needs a file")?),
            "--breakdown" => breakdown = true,
            "--at-peak" => at_peak = true,
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
            report(workload, &format!("cuda_mem_cache_{name}"), name, replay(&cache, workload, breakdown, at_peak));
        }
        let pool = Pool(MemPool::retaining(device)?);
        // The pool may be one the process made before: start its figures from nothing.
        pool.0.trim_to(0)?;
        pool.0.reset_highs()?;
        report(workload, "cuda_mem_stream_pool", "MemPool::retaining", replay(&pool, workload, breakdown, at_peak));
    }
    Ok(())
}
