//! A data loader: pageable host pieces copied to the device with CPU work on every piece, run two
//! ways. Blocking: the CPU works on a piece, then copies it (`StagedCopier::copy_from_host`).
//! Overlapped: the piece is handed to `StagedCopier::copy_from_host_on` by value and the CPU works
//! on the next piece while the lanes copy it. Each of `--trials` trials runs blocking, overlapped,
//! blocking again; the trial's ratio is the overlapped wall time over max(copy, cpu) of the means
//! of its two blocking runs (the same work measured alone, on both sides, so that the host's speed
//! drifting between runs does not fall on one side of the ratio), and the target is judged on the
//! median trial. Every piece of every run is verified on the device with the checksum kernel.
//!
//! The CPU work runs on the main thread; each run also reports how long that thread waited for a
//! core and how often it was preempted (Linux's /proc/thread-self), so a starved CPU-work thread
//! shows, and how much slower its work ran while the lanes copied (memory bandwidth, and cores if
//! they are hyperthreads, the two share).
//!
//! ```text
//! cargo run --release -p cuda-mem-bench --example loader -- [--total-mib 4096] [--piece-mib 256] [--cpu-ms 10] [--lanes N] [--chunk-mib 4] [--trials 9]
//! ```
//! The same settings can come from `LOADER_TOTAL_MIB`, `LOADER_PIECE_MIB`, `LOADER_CPU_MS`,
//! `LOADER_LANES`, `LOADER_CHUNK_MIB` and `LOADER_TRIALS` (arguments win). Lanes default to a
//! quarter of the cores, 2 to 8, and chunks to 4 MiB. The lanes' copies into pinned memory and
//! the CPU work both stream through host memory: on the H200 host (16 cores) 4 lanes copied
//! almost as fast as 8 and left the CPU work more of it, so the overlapped run finished sooner
//! (measured on 2026-12-02 at commit 2436876; see docs/async-work.md).

use cuda_mem::{DeviceBuffer, StagedConfig, StagedCopier, Stream};
use cuda_mem_kernels::{checksum_cpu, checksum_u32};
use std::hint::black_box;
use std::time::{Duration, Instant};

const TARGET_RATIO: f64 = 1.10;

struct Config {
    total_mib: usize,
    piece_mib: usize,
    cpu_ms: u64,
    lanes: usize,
    chunk_mib: usize,
    trials: usize,
}

impl Config {
    fn parse() -> Result<Self, String> {
        let cores = std::thread::available_parallelism().map_or(4, std::num::NonZeroUsize::get);
        let env = |name: &str, default: String| std::env::var(name).unwrap_or(default);
        let mut values = [
            ("--total-mib", env("LOADER_TOTAL_MIB", "4096".into())),
            ("--piece-mib", env("LOADER_PIECE_MIB", "256".into())),
            ("--cpu-ms", env("LOADER_CPU_MS", "10".into())),
            ("--lanes", env("LOADER_LANES", (cores / 4).clamp(2, 8).to_string())),
            ("--chunk-mib", env("LOADER_CHUNK_MIB", "4".into())),
            ("--trials", env("LOADER_TRIALS", "9".into())),
        ];
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let slot = values.iter_mut().find(|(name, _)| *name == flag).ok_or(format!("unknown argument {flag}"))?;
            slot.1 = args.next().ok_or(format!("{flag} needs a value"))?;
        }
        let number = |i: usize| values[i].1.parse::<usize>().map_err(|_| format!("{} must be a number", values[i].0));
        let config = Self {
            total_mib: number(0)?,
            piece_mib: number(1)?,
            cpu_ms: number(2)? as u64,
            lanes: number(3)?,
            chunk_mib: number(4)?,
            trials: number(5)?,
        };
        if config.piece_mib == 0 || config.total_mib < config.piece_mib {
            return Err("need 0 < piece-mib <= total-mib".into());
        }
        if config.lanes == 0 || config.chunk_mib == 0 || config.trials == 0 {
            return Err("lanes, chunk-mib and trials must be positive".into());
        }
        Ok(config)
    }
}

/// CPU work on a piece: a checksum over as many of its words as take `cpu_ms` (calibrated), a
/// stand-in for decoding or preprocessing.
struct CpuWork {
    words: usize,
}

impl CpuWork {
    /// Sizes the work on a small sample first, then rescales it on `fresh`, a piece not read
    /// lately: the work streams from memory, which runs slower than the cached sample.
    fn calibrate(target: Duration, sample: &[u32], fresh: &[u32]) -> Self {
        let mut words = 1 << 16;
        let mut work = loop {
            let start = Instant::now();
            black_box(checksum_cpu(&sample[..words.min(sample.len())]));
            let took = start.elapsed();
            if took >= target / 4 || words >= sample.len() {
                let per_word = took.as_secs_f64() / words.min(sample.len()) as f64;
                break Self { words: (target.as_secs_f64() / per_word) as usize };
            }
            words *= 2;
        };
        let start = Instant::now();
        work.run(fresh);
        let scale = target.as_secs_f64() / start.elapsed().as_secs_f64().max(1e-9);
        work.words = ((work.words as f64 * scale) as usize).max(1);
        work
    }

    /// Runs the work on `piece` (wrapping around it if it is shorter than the work).
    fn run(&self, piece: &[u32]) -> u64 {
        let mut left = self.words;
        let mut sum = 0u64;
        while left > 0 {
            let take = left.min(piece.len());
            sum = sum.wrapping_add(checksum_cpu(&piece[..take]));
            left -= take;
        }
        black_box(sum)
    }
}

/// What Linux says of this thread's scheduling so far: how long it waited for a core while
/// runnable (/proc/thread-self/schedstat) and how often it was preempted (involuntary context
/// switches, /proc/thread-self/status). `None` where a figure is unavailable (a schedstat whose
/// run time reads 0 is taken as switched off).
#[derive(Clone, Copy)]
struct Sched {
    waited: Option<Duration>,
    preempted: Option<u64>,
}

impl Sched {
    fn now() -> Self {
        let waited = std::fs::read_to_string("/proc/thread-self/schedstat").ok().and_then(|stat| {
            let mut fields = stat.split_whitespace().map(str::parse::<u64>);
            match (fields.next()?.ok()?, fields.next()?.ok()?) {
                (0, _) => None,
                (_, waited) => Some(Duration::from_nanos(waited)),
            }
        });
        let preempted = std::fs::read_to_string("/proc/thread-self/status").ok().and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("nonvoluntary_ctxt_switches:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        });
        Self { waited, preempted }
    }

    /// What happened between `earlier` and now.
    fn since(earlier: Self) -> Self {
        let now = Self::now();
        Self {
            waited: now.waited.zip(earlier.waited).map(|(a, b)| a.saturating_sub(b)),
            preempted: now.preempted.zip(earlier.preempted).map(|(a, b)| a.saturating_sub(b)),
        }
    }

    fn describe(self) -> String {
        let waited = self.waited.map_or("n/a".into(), |d| format!("{:.1} ms", ms(d)));
        let preempted = self.preempted.map_or("n/a".into(), |n| n.to_string());
        format!("waited {waited} for a core, preempted {preempted} times")
    }
}

struct Run {
    wall: Duration,
    copy: Duration,
    cpu: Duration,
    /// The CPU-work thread's scheduling during the run (the overlapped run's: until its last
    /// piece's CPU work is done and only the copies are left).
    sched: Sched,
}

/// One trial: a blocking run on each side of the overlapped one, and the overlapped wall time
/// over max(copy, cpu) of the two blocking runs' means (the host's speed drifts between runs, and a
/// blocking run on each side cancels a steady drift).
struct Trial {
    blocking: Run,
    overlapped: Run,
    blocking_after: Run,
}

impl Trial {
    fn yardstick(&self) -> Duration {
        let (before, after) = (&self.blocking, &self.blocking_after);
        ((before.copy + after.copy) / 2).max((before.cpu + after.cpu) / 2)
    }

    fn ratio(&self, run: &Run) -> f64 {
        run.wall.as_secs_f64() / self.yardstick().as_secs_f64()
    }
}

fn main() -> cuda_mem::Result<()> {
    let config = Config::parse().unwrap_or_else(|why| {
        eprintln!(
            "loader: {why}\nusage: loader [--total-mib N] [--piece-mib N] [--cpu-ms N] [--lanes N] [--chunk-mib N] [--trials N]"
        );
        std::process::exit(2)
    });
    let words = config.piece_mib << 18; // u32 words in a piece
    let count = config.total_mib / config.piece_mib;
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    println!(
        "loader: {count} pieces of {} MiB ({} MiB pageable), {} ms of CPU work per piece, {} lanes, {} MiB chunks, \
         {} trials, {cores} cores",
        config.piece_mib,
        count * config.piece_mib,
        config.cpu_ms,
        config.lanes,
        config.chunk_mib,
        config.trials
    );
    let mut pieces: Vec<Vec<u32>> = (0..count).map(|k| make_piece(words, k as u32)).collect();
    let sums: Vec<u64> = pieces.iter().map(|p| checksum_cpu(p)).collect();
    let work = CpuWork::calibrate(Duration::from_millis(config.cpu_ms), &pieces[0], &pieces[count / 2]);
    let staged = StagedConfig { lanes: config.lanes, chunk_bytes: config.chunk_mib << 20, ..StagedConfig::default() };
    let copier = StagedCopier::new(staged)?;
    let stream = Stream::non_blocking()?;
    let mut devices = (0..count).map(|_| DeviceBuffer::<u32>::zeroed(words)).collect::<cuda_mem::Result<Vec<_>>>()?;
    // Warm-up: the lanes' staging slots and the kernel module, outside the timings.
    copier.copy_from_host(&mut devices[0].as_mut_slice(), &pieces[0])?;

    let mut trials = Vec::with_capacity(config.trials);
    for k in 1..=config.trials {
        clear(&mut devices)?;
        let blocking = run_blocking(&copier, &work, &pieces, &mut devices)?;
        verify("blocking", &stream, &devices, &sums)?;
        clear(&mut devices)?;
        let overlapped;
        (overlapped, pieces, devices) = run_overlapped(&copier, &stream, &work, pieces, devices)?;
        verify("overlapped", &stream, &devices, &sums)?;
        clear(&mut devices)?;
        let blocking_after = run_blocking(&copier, &work, &pieces, &mut devices)?;
        verify("blocking", &stream, &devices, &sums)?;
        let trial = Trial { blocking, overlapped, blocking_after };
        println!(
            "trial {k}: blocking wall {:.1} ms (copy {:.1}, cpu {:.1}); overlapped wall {:.1} ms (cpu {:.1}); \
             blocking again wall {:.1} ms (copy {:.1}, cpu {:.1}); overlapped / max(copy, cpu) = {:.3}",
            ms(trial.blocking.wall),
            ms(trial.blocking.copy),
            ms(trial.blocking.cpu),
            ms(trial.overlapped.wall),
            ms(trial.overlapped.cpu),
            ms(trial.blocking_after.wall),
            ms(trial.blocking_after.copy),
            ms(trial.blocking_after.cpu),
            trial.ratio(&trial.overlapped)
        );
        trials.push(trial);
    }
    println!("every piece of every run verified on the device (checksum kernel)");

    trials.sort_by(|a, b| a.ratio(&a.overlapped).total_cmp(&b.ratio(&b.overlapped)));
    let median = &trials[trials.len() / 2];
    println!("the median trial of {}:", trials.len());
    let runs = [("blocking", &median.blocking), ("overlapped", &median.overlapped), ("again", &median.blocking_after)];
    for (name, run) in runs {
        println!(
            "{name:>10}: wall {:8.1} ms, copy {:8.1} ms, cpu {:8.1} ms, wall / max(copy, cpu) = {:.3}; \
             CPU-work thread {}",
            ms(run.wall),
            ms(run.copy),
            ms(run.cpu),
            median.ratio(run),
            run.sched.describe()
        );
    }
    println!(
        "CPU work while the lanes copied: {:.3} x its time alone (the mean of both blocking runs)",
        median.overlapped.cpu.as_secs_f64() * 2.0 / (median.blocking.cpu + median.blocking_after.cpu).as_secs_f64()
    );
    let ratios: Vec<String> = trials.iter().map(|t| format!("{:.3}", t.ratio(&t.overlapped))).collect();
    let ratio = median.ratio(&median.overlapped);
    println!(
        "max(copy, cpu) is the blocking runs' {:.1} ms; overlapped copy is submit-to-last-completion; \
         sorted trial ratios [{}]; target median overlapped ratio <= {TARGET_RATIO:.2}: {}",
        ms(median.yardstick()),
        ratios.join(", "),
        if ratio <= TARGET_RATIO { "met" } else { "missed" }
    );
    Ok(())
}

/// Zeroes every device buffer, so each run's verification sees only its own copies.
fn clear(devices: &mut [DeviceBuffer<u32>]) -> cuda_mem::Result<()> {
    devices.iter_mut().try_for_each(|device| device.as_mut_slice().set_bytes(0))
}

/// CPU work on a piece, then its copy, one piece after another.
fn run_blocking(
    copier: &StagedCopier,
    work: &CpuWork,
    pieces: &[Vec<u32>],
    devices: &mut [DeviceBuffer<u32>],
) -> cuda_mem::Result<Run> {
    let (mut copy, mut cpu) = (Duration::ZERO, Duration::ZERO);
    let before = Sched::now();
    let start = Instant::now();
    for (piece, device) in pieces.iter().zip(devices) {
        let t0 = Instant::now();
        work.run(piece);
        let t1 = Instant::now();
        copier.copy_from_host(&mut device.as_mut_slice(), piece)?;
        copy += t1.elapsed();
        cpu += t1 - t0;
    }
    let wall = start.elapsed();
    let sched = Sched::since(before);
    Ok(Run { wall, copy, cpu, sched })
}

/// An overlapped run's figures, with the pieces and device buffers its `Pending`s gave back.
type Returned = (Run, Vec<Vec<u32>>, Vec<DeviceBuffer<u32>>);

/// Each piece handed to the lanes by value while the CPU works on the next one; all waited for
/// at the end. Returns the pieces and buffers the `Pending`s gave back.
fn run_overlapped(
    copier: &StagedCopier,
    stream: &Stream,
    work: &CpuWork,
    pieces: Vec<Vec<u32>>,
    devices: Vec<DeviceBuffer<u32>>,
) -> cuda_mem::Result<Returned> {
    let mut cpu = Duration::ZERO;
    let mut pending = Vec::with_capacity(pieces.len());
    let before = Sched::now();
    let start = Instant::now();
    let mut first_submit = None;
    let mut queue = pieces.into_iter().zip(devices).peekable();
    if let Some((piece, _)) = queue.peek() {
        let t0 = Instant::now();
        work.run(piece);
        cpu += t0.elapsed();
    }
    while let Some((piece, device)) = queue.next() {
        first_submit.get_or_insert_with(Instant::now);
        pending.push(copier.copy_from_host_on(stream, device, piece)?);
        if let Some((next, _)) = queue.peek() {
            let t0 = Instant::now();
            work.run(next);
            cpu += t0.elapsed();
        }
    }
    let sched = Sched::since(before);
    let (mut pieces, mut devices) = (Vec::new(), Vec::new());
    for done in pending {
        let (device, piece) = done.wait()?;
        devices.push(device);
        pieces.push(piece);
    }
    let wall = start.elapsed();
    let copy = first_submit.map_or(Duration::ZERO, |t| t.elapsed());
    Ok((Run { wall, copy, cpu, sched }, pieces, devices))
}

/// Checks every device buffer against its piece's checksum, computed on the device.
fn verify(name: &str, stream: &Stream, devices: &[DeviceBuffer<u32>], sums: &[u64]) -> cuda_mem::Result<()> {
    let mut out = DeviceBuffer::<u64>::zeroed(1)?;
    for (k, (device, &want)) in devices.iter().zip(sums).enumerate() {
        let mut view = out.as_mut_slice();
        stream.try_scope(|s| checksum_u32(s, device.as_slice(), &mut view))?;
        let got = out.to_vec()?[0];
        assert_eq!(got, want, "{name}: piece {k} differs on the device");
    }
    Ok(())
}

/// A deterministic, non-constant piece.
fn make_piece(words: usize, seed: u32) -> Vec<u32> {
    (0..words as u32).map(|i| i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(0x9e37_79b9)).collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
