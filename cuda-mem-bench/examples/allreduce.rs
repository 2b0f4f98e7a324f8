//! An NCCL all-reduce (sum of f32) over cuda-mem memory on every GPU: buffers from a memory
//! pool (`StreamBuffer`) and from the device caching allocator (`CachedBuffer`), registered with
//! the communicator where NCCL can (2.19+). Checks the sums, then times out-of-place and in-place
//! all-reduces and prints nccl-tests' figures: algBw = bytes / time and
//! busBw = algBw × 2(n−1)/n (with one rank NCCL only copies and the formula gives 0: busBw is
//! printed as null).
//!
//! ```text
//! allreduce [--mode procs|threads] [--gpus N] [--mib 256] [--iters 20] [--warmup 5] [--no-register]
//! ```
//! - `--mode procs` (default): one process per GPU. This process makes the NCCL unique id and
//!   starts this program again once per GPU with `--rank R --ranks N --id HEX`; each rank queues
//!   its collectives through `Communicator::all_reduce` in a `Stream::scope`.
//! - `--mode threads`: one process, `Communicator::init_all` over the GPUs, and one `Group` per
//!   launch from one thread.
//!
//! Prints one JSON line per source and placement (time per all-reduce: the mean over ranks, as
//! nccl-tests reports it), for comparison with `docs/reference/torch_allreduce.py` run in the
//! same device call. Sets `NCCL_NVLS_ENABLE=0` unless the environment sets it. Needs libnccl
//! (`CUDA_MEM_NCCL_LIB` names another copy).

use cuda_mem::{
    CachedBuffer, Device, DeviceCache, DeviceMemory, DeviceSlice, DeviceSliceMut, MemPool, PoolProps, Stream,
    StreamBuffer,
};
use cuda_mem_nccl::{Communicator, Group, ReduceOp, Registered, UniqueId};
use std::process::{Command, Stdio};
use std::time::Instant;

type Error = Box<dyn std::error::Error>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Procs,
    Threads,
}

#[derive(Debug, Clone)]
struct Args {
    mode: Mode,
    gpus: Option<usize>,
    mib: usize,
    iters: usize,
    warmup: usize,
    register: bool,
    /// A rank process of `--mode procs`: (rank, ranks, id).
    rank: Option<(usize, usize, String)>,
}

impl Args {
    fn parse() -> Result<Self, Error> {
        let mut args =
            Args { mode: Mode::Procs, gpus: None, mib: 256, iters: 20, warmup: 5, register: true, rank: None };
        let (mut rank, mut ranks, mut id) = (None, None, None);
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--mode" => {
                    args.mode = match value()?.as_str() {
                        "procs" => Mode::Procs,
                        "threads" => Mode::Threads,
                        other => return Err(format!("--mode {other}: procs or threads").into()),
                    }
                }
                "--gpus" => args.gpus = Some(value()?.parse()?),
                "--mib" => args.mib = value()?.parse()?,
                "--iters" => args.iters = value()?.parse()?,
                "--warmup" => args.warmup = value()?.parse()?,
                "--no-register" => args.register = false,
                "--rank" => rank = Some(value()?.parse()?),
                "--ranks" => ranks = Some(value()?.parse()?),
                "--id" => id = Some(value()?),
                other => return Err(format!("unknown argument {other} (see the example's docs)").into()),
            }
        }
        if let (Some(rank), Some(ranks), Some(id)) = (rank, ranks, id) {
            args.rank = Some((rank, ranks, id));
        }
        if args.iters == 0 || args.mib == 0 {
            return Err("--iters and --mib must be at least 1".into());
        }
        Ok(args)
    }

    fn elements(&self) -> usize {
        (self.mib << 20) / size_of::<f32>()
    }
}

/// Rank `rank`'s contribution: small integers, so the sum over a few ranks is exact in f32.
fn contribution(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (rank + 1) as f32 + (i % 97) as f32).collect()
}

fn sum_of(ranks: usize, len: usize) -> Vec<f32> {
    let base = (ranks * (ranks + 1) / 2) as f32;
    (0..len).map(|i| base + (ranks * (i % 97)) as f32).collect()
}

/// A buffer of f32 with views, whatever owns it.
trait Buffer {
    fn view(&self) -> DeviceSlice<'_, f32>;
    fn view_mut(&mut self) -> DeviceSliceMut<'_, f32>;
}

impl Buffer for StreamBuffer<'_, f32> {
    fn view(&self) -> DeviceSlice<'_, f32> {
        self.as_slice()
    }
    fn view_mut(&mut self) -> DeviceSliceMut<'_, f32> {
        self.as_mut_slice()
    }
}

impl Buffer for CachedBuffer<'_, f32> {
    fn view(&self) -> DeviceSlice<'_, f32> {
        self.as_slice()
    }
    fn view_mut(&mut self) -> DeviceSliceMut<'_, f32> {
        self.as_mut_slice()
    }
}

/// A buffer as registered with its rank's communicator, or plain where NCCL refused.
enum Held<'c, B: DeviceMemory<Elem = f32>> {
    Plain(B),
    Registered(Registered<'c, B>),
}

impl<'c, B: DeviceMemory<Elem = f32> + Buffer> Held<'c, B> {
    fn new(comm: &'c Communicator, buffer: B, register: bool) -> Self {
        if !register {
            return Held::Plain(buffer);
        }
        match comm.register(buffer) {
            Ok(registered) => Held::Registered(registered),
            Err(failed) => {
                eprintln!("rank {}: not registered: {}", comm.rank(), failed.error);
                Held::Plain(failed.buffer)
            }
        }
    }

    fn registered(&self) -> bool {
        matches!(self, Held::Registered(_))
    }
}

impl<B: DeviceMemory<Elem = f32> + Buffer> Buffer for Held<'_, B> {
    fn view(&self) -> DeviceSlice<'_, f32> {
        match self {
            Held::Plain(b) => b.view(),
            Held::Registered(r) => r.as_slice(),
        }
    }
    fn view_mut(&mut self) -> DeviceSliceMut<'_, f32> {
        match self {
            Held::Plain(b) => b.view_mut(),
            Held::Registered(r) => r.as_mut_slice(),
        }
    }
}

/// The ranks this process drives: a communicator and a stream each.
struct Local<'c> {
    comm: &'c Communicator,
    stream: Stream,
}

/// Queues `times` all-reduces on every local rank (out of place: send → recv) and waits: in a
/// scope for one rank, in groups for several.
fn all_reduce<B: Buffer>(
    locals: &[Local<'_>],
    buffers: &mut [(B, B)],
    in_place: bool,
    times: usize,
) -> cuda_mem::Result<()> {
    if let ([local], [(send, recv)]) = (locals, &mut *buffers) {
        let (comm, send) = (local.comm, send.view());
        let mut dst = recv.view_mut();
        return local.stream.try_scope(|s| {
            for _ in 0..times {
                if in_place {
                    comm.all_reduce_in_place(s, &mut dst, ReduceOp::Sum)?;
                } else {
                    comm.all_reduce(s, send, &mut dst, ReduceOp::Sum)?;
                }
            }
            Ok(())
        });
    }
    let mut views: Vec<(DeviceSlice<'_, f32>, DeviceSliceMut<'_, f32>)> =
        buffers.iter_mut().map(|(send, recv)| (send.view(), recv.view_mut())).collect();
    let mut group = Group::new();
    for (local, (send, recv)) in locals.iter().zip(views.iter_mut()) {
        if in_place {
            group.all_reduce_in_place(local.comm, &local.stream, recv, ReduceOp::Sum)?;
        } else {
            group.all_reduce(local.comm, &local.stream, *send, recv, ReduceOp::Sum)?;
        }
    }
    group.run_repeated(times)
}

/// One timing: the source, the placement, whether every buffer was registered, and seconds per
/// all-reduce.
struct Timing {
    source: &'static str,
    in_place: bool,
    registered: bool,
    seconds: f64,
}

/// Checks the sums (out of place, then in place), then times both placements, for buffers that
/// `make` allocates on each local rank.
fn measure<'a, B: DeviceMemory<Elem = f32> + Buffer>(
    source: &'static str,
    locals: &'a [Local<'a>],
    ranks: usize,
    first_rank: usize,
    args: &Args,
    mut make: impl FnMut(usize) -> cuda_mem::Result<B>,
) -> Result<Vec<Timing>, Error> {
    let len = args.elements();
    let mut buffers = Vec::new();
    for (i, local) in locals.iter().enumerate() {
        let (send, recv) = (make(i)?, make(i)?);
        buffers.push((Held::new(local.comm, send, args.register), Held::new(local.comm, recv, args.register)));
    }
    let registered = buffers.iter().all(|(s, r)| s.registered() && r.registered());
    let want = sum_of(ranks, len);
    for in_place in [false, true] {
        for (i, (send, recv)) in buffers.iter_mut().enumerate() {
            let mine = contribution(first_rank + i, len);
            send.view_mut().copy_from_host(&mine)?;
            if in_place {
                recv.view_mut().copy_from_host(&mine)?;
            } else {
                recv.view_mut().set_bytes(0)?;
            }
        }
        all_reduce(locals, &mut buffers, in_place, 1)?;
        for (i, (_, recv)) in buffers.iter().enumerate() {
            let got = recv.view().to_vec()?;
            if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
                let placement = if in_place { "in place" } else { "out of place" };
                return Err(format!(
                    "rank {}: {source}, {placement}: element {at} is {}, expected {}",
                    first_rank + i,
                    got[at],
                    want[at]
                )
                .into());
            }
        }
    }
    let mut timings = Vec::new();
    for in_place in [false, true] {
        all_reduce(locals, &mut buffers, in_place, args.warmup)?;
        let start = Instant::now();
        all_reduce(locals, &mut buffers, in_place, args.iters)?;
        let seconds = start.elapsed().as_secs_f64() / args.iters as f64;
        timings.push(Timing { source, in_place, registered, seconds });
    }
    Ok(timings)
}

/// Every timing of the ranks this process drives, pool buffers first, then cached ones.
fn run_ranks(comms: &[&Communicator], ranks: usize, first_rank: usize, args: &Args) -> Result<Vec<Timing>, Error> {
    let locals: Vec<Local<'_>> = comms
        .iter()
        .map(|&comm| Ok(Local { comm, stream: Stream::on_device(comm.device())? }))
        .collect::<cuda_mem::Result<_>>()?;
    let pools: Vec<MemPool> =
        comms.iter().map(|c| MemPool::new(PoolProps::new(c.device()))).collect::<cuda_mem::Result<_>>()?;
    let caches: Vec<DeviceCache> =
        comms.iter().map(|c| DeviceCache::new(c.device())).collect::<cuda_mem::Result<_>>()?;
    let len = args.elements();
    let mut timings = measure("pool", &locals, ranks, first_rank, args, |i| {
        StreamBuffer::<f32>::zeroed_from(&pools[i], &locals[i].stream, len)
    })?;
    timings.extend(measure("cache", &locals, ranks, first_rank, args, |i| {
        caches[i].zeroed::<f32>(&locals[i].stream, len)
    })?);
    Ok(timings)
}

fn print_figures(mode: Mode, ranks: usize, args: &Args, source: &str, in_place: bool, registered: bool, seconds: f64) {
    let bytes = args.elements() * size_of::<f32>();
    // One rank in place moves no data (NCCL returns at once): no bandwidth to speak of.
    let algbw = (ranks > 1 || !in_place).then(|| bytes as f64 / seconds / 1e9);
    let busbw = algbw.filter(|_| ranks > 1).map(|a| a * 2.0 * (ranks - 1) as f64 / ranks as f64);
    let gbs = |v: Option<f64>| v.map_or("null".to_string(), |b| format!("{b:.2}"));
    let version = cuda_mem_nccl::version().map(|((a, b, c), _)| format!("{a}.{b}.{c}")).unwrap_or_default();
    println!(
        "{{\"tool\":\"cuda-mem-nccl\",\"mode\":\"{}\",\"ranks\":{ranks},\"source\":\"{source}\",\"registered\":{registered},\
         \"placement\":\"{}\",\"bytes\":{bytes},\"iters\":{},\"time_us\":{:.1},\"algbw_gbs\":{},\"busbw_gbs\":{},\
         \"verified\":true,\"nccl\":\"{version}\"}}",
        if mode == Mode::Procs { "procs" } else { "threads" },
        if in_place { "in-place" } else { "out-of-place" },
        args.iters,
        seconds * 1e6,
        gbs(algbw),
        gbs(busbw),
    );
    let alg = algbw.map_or("algBw n/a: one rank in place moves no data".to_string(), |a| format!("algBw {a:.2} GB/s"));
    let bus =
        busbw.map_or("busBw n/a: one rank (NCCL copies; 2(n-1)/n = 0)".to_string(), |b| format!("busBw {b:.2} GB/s"));
    eprintln!(
        "{ranks} rank(s), {source}{}, {}: {:.1} us, {alg}, {bus}",
        if registered { " (registered)" } else { "" },
        if in_place { "in place" } else { "out of place" },
        seconds * 1e6
    );
}

/// `--mode threads`: every GPU in this process, one clique, groups from this thread.
fn threads(args: &Args) -> Result<(), Error> {
    let devices: Vec<Device> = Device::all()?.into_iter().take(args.gpus.unwrap_or(usize::MAX)).collect();
    let clique = Communicator::init_all(&devices)?;
    let comms: Vec<&Communicator> = clique.comms().iter().collect();
    let timings = run_ranks(&comms, devices.len(), 0, args)?;
    for t in &timings {
        print_figures(Mode::Threads, devices.len(), args, t.source, t.in_place, t.registered, t.seconds);
    }
    drop(comms);
    clique.destroy()?;
    Ok(())
}

/// A rank process of `--mode procs`: prints `rank R SOURCE in|out REGISTERED SECONDS` lines.
fn rank_process(args: &Args, rank: usize, ranks: usize, id: &str) -> Result<(), Error> {
    let device = Device::new(rank)?;
    // This process works on its rank's device only (blocking copies use the current one).
    device.set_current()?;
    let comm = Communicator::init_rank(device, ranks, &UniqueId::from_hex(id)?, rank)?;
    let timings = run_ranks(&[&comm], ranks, rank, args)?;
    for t in &timings {
        println!("rank {rank} {} {} {} {:e}", t.source, if t.in_place { "in" } else { "out" }, t.registered, t.seconds);
    }
    comm.destroy()?;
    Ok(())
}

/// `--mode procs`: makes the id, starts one rank process per GPU, and reports the mean over ranks.
fn procs(args: &Args) -> Result<(), Error> {
    let ranks = Device::count()?.min(args.gpus.unwrap_or(usize::MAX));
    let id = UniqueId::new()?;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for rank in 0..ranks {
        let mut command = Command::new(&exe);
        command.args(["--rank", &rank.to_string(), "--ranks", &ranks.to_string(), "--id", &id.to_hex()]);
        command.args(["--mib", &args.mib.to_string(), "--iters", &args.iters.to_string()]);
        command.args(["--warmup", &args.warmup.to_string()]);
        if !args.register {
            command.arg("--no-register");
        }
        children.push(command.stdout(Stdio::piped()).spawn()?);
    }
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let output = child.wait_with_output()?;
        if !output.status.success() {
            failed.push(rank);
        }
        lines.extend(String::from_utf8_lossy(&output.stdout).lines().map(str::to_string));
    }
    if !failed.is_empty() {
        return Err(format!("rank process(es) {failed:?} failed (their errors are above)").into());
    }
    for source in ["pool", "cache"] {
        for placement in ["out", "in"] {
            let rows: Vec<(bool, f64)> = lines
                .iter()
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    match fields[..] {
                        ["rank", _, s, p, registered, seconds] if s == source && p == placement => {
                            Some((registered == "true", seconds.parse().ok()?))
                        }
                        _ => None,
                    }
                })
                .collect();
            if rows.len() != ranks {
                return Err(format!("{source}/{placement}: {} of {ranks} ranks reported", rows.len()).into());
            }
            let registered = rows.iter().all(|r| r.0);
            let mean = rows.iter().map(|r| r.1).sum::<f64>() / ranks as f64;
            print_figures(Mode::Procs, ranks, args, source, placement == "in", registered, mean);
        }
    }
    Ok(())
}

fn main() {
    let outcome = Args::parse().and_then(|args| {
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: no other thread runs yet (neither NCCL nor CUDA has been called), so
            // nothing reads the environment concurrently.
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
        match (&args.rank, args.mode) {
            (Some((rank, ranks, id)), _) => rank_process(&args, *rank, *ranks, id),
            (None, Mode::Procs) => procs(&args),
            (None, Mode::Threads) => threads(&args),
        }
    });
    if let Err(err) = outcome {
        eprintln!("allreduce: {err}");
        std::process::exit(1);
    }
}
