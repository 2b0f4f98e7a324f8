//! A decode-like step, run eagerly and as a replayed CUDA graph, verified both ways: an input
//! staged host-to-device and an output copied back through `PinnedPool` buffers, 16 temporaries
//! of varying sizes, and 32 small kernels (a scale and an axpy per temporary).
//!
//! `--replays N` (default 100000) launches of the graph: outputs verified on a sample, the
//! device's graph memory (used and reserved) flat after warm-up, the temporaries at the addresses
//! the capture gave them, and the CPU time to queue a step, eager against graph. `--replays 1000`
//! suits compute-sanitizer. Prints one line per figure; exits non-zero on any mismatch.

use cuda_mem::{
    CaptureMode, CudaError, Device, DeviceBuffer, DeviceSliceMut, ErrorKind, GraphFlags, HostAllocFlags, MemPool,
    PinnedPool, PoolProps, Result, Stream, StreamBuffer, StreamScope,
};
use cuda_mem_kernels::{axpy_f32, scale_f32};
use std::time::{Duration, Instant};

/// Elements per activation: small kernels, as in a decode step.
const HIDDEN: usize = 4096;
const TEMPORARIES: usize = 16;
/// Replays between two verified outputs (a prime, so the checks move through the input pattern).
const VERIFY_EVERY: usize = 997;
/// Launches before the memory figures are taken as the baseline.
const WARM_UP: usize = 16;

/// Temporary `i` holds this many elements; the kernels use the first `HIDDEN`.
fn temporary_len(i: usize) -> usize {
    HIDDEN * (1 + i % 4) + 64 * i
}

fn alpha(i: usize) -> f32 {
    1.0 - 1.0 / (i as f32 + 3.0)
}

fn beta(i: usize) -> f32 {
    0.25 + 0.125 * (i % 3) as f32
}

/// The input of step `step`.
fn input_value(step: usize, j: usize) -> f32 {
    ((step * 31 + j * 7) % 1009) as f32 * 0.001
}

/// What the GPU computes, on the CPU: per temporary `y = alpha * y`, then `y = beta * w + y`
/// with one rounding (`fmaf`, which `mul_add` reproduces).
fn expected(input: &[f32], weights: &[f32]) -> Vec<f32> {
    let mut y = input.to_vec();
    for i in 0..TEMPORARIES {
        for (y, w) in y.iter_mut().zip(weights) {
            *y = beta(i).mul_add(*w, alpha(i) * *y);
        }
    }
    y
}

/// The 32 kernels over the temporaries (the first `HIDDEN` elements of each), from `x` into the
/// last temporary. Works in a `Stream::scope` and in a capture alike.
fn layers<'scope, 'v: 'scope>(
    s: &StreamScope<'scope, '_>,
    x: &DeviceSliceMut<'v, f32>,
    temps: &mut [DeviceSliceMut<'v, f32>],
    weights: &'scope DeviceBuffer<f32>,
) -> Result<()> {
    let w = weights.as_slice();
    for i in 0..temps.len() {
        let (done, rest) = temps.split_at_mut(i);
        let dst = &mut rest[0];
        match done.last() {
            None => scale_f32(s, dst, x, alpha(i))?,
            Some(prev) => scale_f32(s, dst, prev, alpha(i))?,
        }
        axpy_f32(s, dst, beta(i), w)?;
    }
    Ok(())
}

fn mismatch(what: String) -> CudaError {
    CudaError::new(ErrorKind::InvalidArgument("the example's check failed"), what)
}

fn check_output(got: &[f32], input: &[f32], weights: &[f32], what: &str) -> Result<()> {
    let want = expected(input, weights);
    match got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        None => Ok(()),
        Some(at) => Err(mismatch(format!("{what}: element {at} is {}, expected {}", got[at], want[at]))),
    }
}

struct Args {
    replays: usize,
    eager_steps: usize,
}

fn args() -> Args {
    let mut args = Args { replays: 100_000, eager_steps: 2000 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().and_then(|v| v.parse().ok());
        match (flag.as_str(), value) {
            ("--replays", Some(n)) => args.replays = n,
            ("--eager-steps", Some(n)) => args.eager_steps = n,
            _ => {
                eprintln!("usage: decode_graph [--replays N] [--eager-steps N]");
                std::process::exit(2);
            }
        }
    }
    args.eager_steps = args.eager_steps.min(args.replays.max(1));
    args
}

fn main() -> Result<()> {
    let args = args();
    let device = Device::current()?;
    let stream = Stream::non_blocking()?;
    let weights_host: Vec<f32> = (0..HIDDEN).map(|j| ((j % 97) as f32 - 48.0) * 0.01).collect();
    let weights = DeviceBuffer::from_slice(&weights_host)?;
    let pool = MemPool::new(PoolProps::new(device))?;
    let staging = PinnedPool::new(HostAllocFlags::empty());

    // Eager: every step allocates its temporaries, launches 32 kernels, frees, stages I/O.
    let mut eager_queue = Duration::ZERO;
    let eager_started = Instant::now();
    for step in 0..args.eager_steps {
        let mut input = staging.alloc::<f32>(HIDDEN)?;
        input.iter_mut().enumerate().for_each(|(j, x)| *x = input_value(step, j));
        let mut output = staging.alloc::<f32>(HIDDEN)?;
        let queued = Instant::now();
        let mut x_buffer = StreamBuffer::<f32>::zeroed_from(&pool, &stream, HIDDEN)?;
        let mut temps = (0..TEMPORARIES)
            .map(|i| StreamBuffer::<f32>::zeroed_from(&pool, &stream, temporary_len(i)))
            .collect::<Result<Vec<_>>>()?;
        let mut x = x_buffer.as_mut_slice();
        let mut views = temps.iter_mut().map(|t| t.as_mut_slice().slice_mut(..HIDDEN)).collect::<Result<Vec<_>>>()?;
        stream.try_scope(|s| {
            s.copy_from_host(&mut x, &input)?;
            layers(s, &x, &mut views, &weights)?;
            s.copy_to_host(&mut output, views.last().expect("16 temporaries"))?;
            eager_queue += queued.elapsed();
            Ok(())
        })?;
        drop(views);
        drop(temps);
        if step % VERIFY_EVERY == 0 || step + 1 == args.eager_steps {
            check_output(&output, &input, &weights_host, &format!("eager step {step}"))?;
        }
    }
    let eager_wall = eager_started.elapsed();

    // Graph: the same step captured once, its I/O buffers lent to the graph through slots.
    let mut input = staging.alloc::<f32>(HIDDEN)?;
    let mut output = staging.alloc::<f32>(HIDDEN)?;
    let mut addresses = Vec::new();
    let (graph, (input_slot, output_slot)) = stream.capture_with(CaptureMode::ThreadLocal, |s| {
        let mut x = s.temporary::<f32>(HIDDEN)?;
        let mut temps = (0..TEMPORARIES)
            .map(|i| s.temporary::<f32>(temporary_len(i)).and_then(|t| t.slice_mut(..HIDDEN)))
            .collect::<Result<Vec<_>>>()?;
        addresses = temps.iter().map(|t| t.as_device_ptr() as usize).collect();
        let input_slot = s.copy_from_host_slot(&mut x, &mut input)?;
        layers(s, &x, &mut temps, &weights)?;
        let output_slot = s.copy_to_host_slot(&mut output, temps.last().expect("16 temporaries"))?;
        Ok((input_slot, output_slot))
    })?;
    let mut exec = graph.instantiate(GraphFlags::AUTO_FREE_ON_LAUNCH)?;
    let mut baseline = None;
    let mut graph_queue = Duration::ZERO;
    let mut verified = 0;
    let mut host_input = vec![0.0f32; HIDDEN];
    let graph_started = Instant::now();
    for step in 0..args.replays {
        let verify = step % VERIFY_EVERY == 0 || step + 1 == args.replays;
        if verify {
            host_input.iter_mut().enumerate().for_each(|(j, x)| *x = input_value(step, j));
            exec.host_mut(&input_slot)?.copy_from_slice(&host_input);
        }
        exec.run(&stream, |l| {
            let queued = Instant::now();
            l.launch()?;
            graph_queue += queued.elapsed();
            Ok(())
        })?;
        if verify {
            check_output(exec.host(&output_slot)?, &host_input, &weights_host, &format!("replay {step}"))?;
            verified += 1;
        }
        if step + 1 == WARM_UP {
            baseline = Some(device.graph_mem_stats()?);
        }
    }
    let graph_wall = graph_started.elapsed();
    let after = device.graph_mem_stats()?;
    let moved = baseline.is_some_and(|b| b.used != after.used || b.reserved != after.reserved);
    if moved {
        return Err(mismatch(format!("graph memory moved after warm-up: {baseline:?} then {after:?}")));
    }
    drop(exec);

    let per = |d: Duration, n: usize| d.as_secs_f64() * 1e6 / n.max(1) as f64;
    let (eager_q, graph_q) = (per(eager_queue, args.eager_steps), per(graph_queue, args.replays));
    println!(
        "eager: {} steps verified on a sample, {:.2} us queueing per step, {:.2} us wall per step",
        args.eager_steps,
        eager_q,
        per(eager_wall, args.eager_steps)
    );
    println!(
        "graph: {} replays, {verified} outputs verified, {:.2} us queueing per step, {:.2} us wall per step",
        args.replays,
        graph_q,
        per(graph_wall, args.replays)
    );
    println!("graph memory after warm-up and at the end: used {:?}, reserved {:?}", after.used, after.reserved);
    println!("temporaries at fixed graph addresses: {:#x?}", &addresses[..4]);
    println!("CPU queueing time per step, eager / graph: {:.1}x (target >= 5x)", eager_q / graph_q);
    Ok(())
}
