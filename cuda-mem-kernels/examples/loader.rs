//! A data loader: pageable host pieces copied to the device with CPU work on every piece, run two
//! ways. Blocking: the CPU works on a piece, then copies it (`StagedCopier::copy_from_host`).
//! Overlapped: the piece is handed to `StagedCopier::copy_from_host_on` by value and the CPU works
//! on the next piece while the lanes copy it. Prints wall, copy and CPU times and wall / max(copy,
//! cpu) for each; the blocking run's copy and CPU totals are the yardstick of both (the same work
//! measured alone). Every piece is verified on the device with the checksum kernel.
//!
//! ```text
//! cargo run --release -p cuda-mem-kernels --example loader -- [--total-mib 4096] [--piece-mib 256] [--cpu-ms 10] [--lanes N]
//! ```
//! The same settings can come from `LOADER_TOTAL_MIB`, `LOADER_PIECE_MIB`, `LOADER_CPU_MS` and
//! `LOADER_LANES` (arguments win). Lanes default to one per core but one, which the CPU work uses.

use cuda_mem::{DeviceBuffer, StagedConfig, StagedCopier, Stream};
use cuda_mem_kernels::{checksum_cpu, checksum_u32};
use std::hint::black_box;
use std::time::{Duration, Instant};

struct Config {
    total_mib: usize,
    piece_mib: usize,
    cpu_ms: u64,
    lanes: usize,
}

impl Config {
    fn parse() -> Result<Self, String> {
        let cores = std::thread::available_parallelism().map_or(4, std::num::NonZeroUsize::get);
        let env = |name: &str| std::env::var(name).ok();
        let mut values = [
            ("--total-mib", env("LOADER_TOTAL_MIB").unwrap_or_else(|| "4096".into())),
            ("--piece-mib", env("LOADER_PIECE_MIB").unwrap_or_else(|| "256".into())),
            ("--cpu-ms", env("LOADER_CPU_MS").unwrap_or_else(|| "10".into())),
            ("--lanes", env("LOADER_LANES").unwrap_or_else(|| (cores - 1).clamp(2, 16).to_string())),
        ];
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let slot = values.iter_mut().find(|(name, _)| *name == flag).ok_or(format!("unknown argument {flag}"))?;
            slot.1 = args.next().ok_or(format!("{flag} needs a value"))?;
        }
        let number = |i: usize| values[i].1.parse::<usize>().map_err(|_| format!("{} must be a number", values[i].0));
        let config =
            Self { total_mib: number(0)?, piece_mib: number(1)?, cpu_ms: number(2)? as u64, lanes: number(3)? };
        if config.piece_mib == 0 || config.total_mib < config.piece_mib || config.lanes == 0 {
            return Err("need 0 < piece-mib <= total-mib and lanes > 0".into());
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
    fn calibrate(target: Duration, sample: &[u32]) -> Self {
        let mut words = 1 << 16;
        loop {
            let start = Instant::now();
            black_box(checksum_cpu(&sample[..words.min(sample.len())]));
            let took = start.elapsed();
            if took >= target / 4 || words >= sample.len() {
                let per_word = took.as_secs_f64() / words.min(sample.len()) as f64;
                return Self { words: (target.as_secs_f64() / per_word) as usize };
            }
            words *= 2;
        }
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

struct Run {
    wall: Duration,
    copy: Duration,
    cpu: Duration,
}

fn main() -> cuda_mem::Result<()> {
    let config = Config::parse().unwrap_or_else(|why| {
        eprintln!("loader: {why}\nusage: loader [--total-mib N] [--piece-mib N] [--cpu-ms N] [--lanes N]");
        std::process::exit(2)
    });
    let words = config.piece_mib << 18; // u32 words in a piece
    let count = config.total_mib / config.piece_mib;
    println!(
        "loader: {count} pieces of {} MiB ({} MiB pageable), {} ms of CPU work per piece, {} lanes",
        config.piece_mib,
        count * config.piece_mib,
        config.cpu_ms,
        config.lanes
    );
    let mut pieces: Vec<Vec<u32>> = (0..count).map(|k| make_piece(words, k as u32)).collect();
    let sums: Vec<u64> = pieces.iter().map(|p| checksum_cpu(p)).collect();
    let work = CpuWork::calibrate(Duration::from_millis(config.cpu_ms), &pieces[0]);
    let copier = StagedCopier::new(StagedConfig { lanes: config.lanes, ..StagedConfig::default() })?;
    let stream = Stream::non_blocking()?;
    let mut devices = (0..count).map(|_| DeviceBuffer::<u32>::zeroed(words)).collect::<cuda_mem::Result<Vec<_>>>()?;
    // Warm-up: the lanes' staging slots and the kernel module, outside the timings.
    copier.copy_from_host(&mut devices[0].as_mut_slice(), &pieces[0])?;

    let blocking = run_blocking(&copier, &work, &pieces, &mut devices)?;
    verify("blocking", &stream, &devices, &sums)?;
    for device in &mut devices {
        device.as_mut_slice().set_bytes(0)?;
    }
    let overlapped;
    (overlapped, pieces, devices) = run_overlapped(&copier, &stream, &work, pieces, devices)?;
    verify("overlapped", &stream, &devices, &sums)?;
    drop(pieces);

    let yardstick = blocking.copy.max(blocking.cpu);
    for (name, run) in [("blocking", &blocking), ("overlapped", &overlapped)] {
        println!(
            "{name:>10}: wall {:8.1} ms, copy {:8.1} ms, cpu {:8.1} ms, wall / max(copy, cpu) = {:.3}",
            ms(run.wall),
            ms(run.copy),
            ms(run.cpu),
            run.wall.as_secs_f64() / yardstick.as_secs_f64()
        );
    }
    let ratio = overlapped.wall.as_secs_f64() / yardstick.as_secs_f64();
    println!(
        "max(copy, cpu) is the blocking run's {:.1} ms; overlapped copy is submit-to-last-completion; target overlapped ratio <= 1.10: {}",
        ms(yardstick),
        if ratio <= 1.10 { "met" } else { "missed" }
    );
    Ok(())
}

/// CPU work on a piece, then its copy, one piece after another.
fn run_blocking(
    copier: &StagedCopier,
    work: &CpuWork,
    pieces: &[Vec<u32>],
    devices: &mut [DeviceBuffer<u32>],
) -> cuda_mem::Result<Run> {
    let (mut copy, mut cpu) = (Duration::ZERO, Duration::ZERO);
    let start = Instant::now();
    for (piece, device) in pieces.iter().zip(devices) {
        let t0 = Instant::now();
        work.run(piece);
        let t1 = Instant::now();
        copier.copy_from_host(&mut device.as_mut_slice(), piece)?;
        copy += t1.elapsed();
        cpu += t1 - t0;
    }
    Ok(Run { wall: start.elapsed(), copy, cpu })
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
    let (mut pieces, mut devices) = (Vec::new(), Vec::new());
    for done in pending {
        let (device, piece) = done.wait()?;
        devices.push(device);
        pieces.push(piece);
    }
    let wall = start.elapsed();
    let copy = first_submit.map_or(Duration::ZERO, |t| t.elapsed());
    Ok((Run { wall, copy, cpu }, pieces, devices))
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
    println!("{name}: all {} pieces verified on the device (checksum kernel)", devices.len());
    Ok(())
}

/// A deterministic, non-constant piece.
fn make_piece(words: usize, seed: u32) -> Vec<u32> {
    (0..words as u32).map(|i| i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(0x9e37_79b9)).collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
