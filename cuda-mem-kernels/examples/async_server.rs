//! A GPU request server two ways. Async: every request is a task on a multi-threaded tokio
//! runtime (host to device, `scale_f32`, device to host, all on owned buffers) that awaits its
//! `Pending`, so executor threads never wait for the GPU. Threads: the same requests spread over
//! OS threads, each with its own stream, each request a blocking `try_scope`. Every result is
//! verified. Both variants first serve one untimed round of full-size requests (the pool grows to
//! its working size, the kernel module loads), then `--rounds` timed rounds; each prints the median
//! requests per second and the time its serving threads spent inside cuda-mem calls, split into
//! enqueues (allocation, copies, kernel, free) and waits (the async variant's `Pending` polls,
//! which query events and never block; the threads variant's scope ends, which synchronize).
//!
//! ```text
//! cargo run --release -p cuda-mem-kernels --example async_server -- [--requests 64] [--elements 4194304] [--threads 4] [--rounds 5]
//! ```

use cuda_mem::{Pending, PinnedBuffer, Stream, StreamBuffer};
use cuda_mem_kernels::scale_in_place_f32;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

const SCALE: f32 = 2.0;

struct Config {
    requests: usize,
    elements: usize,
    threads: usize,
    rounds: usize,
}

impl Config {
    fn parse() -> Result<Self, String> {
        let mut values = [("--requests", 64usize), ("--elements", 1 << 22), ("--threads", 4), ("--rounds", 5)];
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let slot = values.iter_mut().find(|(name, _)| *name == flag).ok_or(format!("unknown argument {flag}"))?;
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            slot.1 = value.parse().map_err(|_| format!("{flag} must be a number"))?;
        }
        let [(_, requests), (_, elements), (_, threads), (_, rounds)] = values;
        if requests == 0 || elements == 0 || threads == 0 || rounds == 0 {
            return Err("every setting must be positive".into());
        }
        Ok(Self { requests, elements, threads, rounds })
    }
}

/// Time the serving threads spent inside cuda-mem: queuing work, and waiting for it.
#[derive(Default)]
struct InCudaMem {
    enqueue: AtomicU64,
    wait: AtomicU64,
}

/// The totals of one round.
#[derive(Clone, Copy)]
struct Inside {
    enqueue: Duration,
    wait: Duration,
}

impl InCudaMem {
    fn call<R>(&self, f: impl FnOnce() -> R) -> R {
        Self::timed(&self.enqueue, f)
    }

    fn wait<R>(&self, f: impl FnOnce() -> R) -> R {
        Self::timed(&self.wait, f)
    }

    fn timed<R>(counter: &AtomicU64, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let value = f();
        counter.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        value
    }

    fn totals(&self) -> Inside {
        let read = |c: &AtomicU64| Duration::from_nanos(c.load(Ordering::Relaxed));
        Inside { enqueue: read(&self.enqueue), wait: read(&self.wait) }
    }
}

/// A future whose every poll is timed as time inside cuda-mem (a `Pending`'s poll queries events
/// and arms its wake-up; it never blocks).
struct Timed<F> {
    inner: F,
    stats: Arc<InCudaMem>,
}

impl<F: Future + Unpin> Future for Timed<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let stats = Arc::clone(&self.stats);
        stats.wait(|| Pin::new(&mut self.inner).poll(cx))
    }
}

fn input_value(request: usize, i: usize) -> f32 {
    (request * 7 + i % 1000) as f32
}

fn make_inputs(config: &Config) -> cuda_mem::Result<Vec<PinnedBuffer<f32>>> {
    (0..config.requests)
        .map(|r| {
            let host: Vec<f32> = (0..config.elements).map(|i| input_value(r, i)).collect();
            PinnedBuffer::from_slice(&host, Default::default())
        })
        .collect()
}

fn check(request: usize, output: &[f32]) {
    let bad = output.iter().enumerate().position(|(i, &y)| y != SCALE * input_value(request, i));
    assert!(bad.is_none(), "request {request}: element {} is wrong", bad.unwrap_or_default());
}

/// One request as a task: upload, scale, download, all queued without waiting; then awaited.
async fn serve(stream: Stream, input: PinnedBuffer<f32>, stats: Arc<InCudaMem>) -> cuda_mem::Result<PinnedBuffer<f32>> {
    let n = input.len();
    let pending: Pending<(StreamBuffer<'static, f32>, PinnedBuffer<f32>)> = stats.call(|| {
        let device = StreamBuffer::<f32>::zeroed(stream.clone(), n)?;
        stream.upload(device, input)?.then(|s, (device, host)| {
            let mut view = device.as_mut_slice();
            scale_in_place_f32(s, &mut view, SCALE)?;
            s.copy_to_host(&mut host[..], &view)
        })
    })?;
    let (device, output) = Timed { inner: pending, stats: Arc::clone(&stats) }.await?;
    stats.call(|| drop(device)); // cudaFreeAsync: queued, not waited for
    Ok(output)
}

fn run_async(config: &Config) -> cuda_mem::Result<Vec<(Duration, Inside)>> {
    let streams = (0..config.requests).map(|_| Stream::non_blocking()).collect::<cuda_mem::Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let mut buffers = make_inputs(config)?;
    // Round 0 is the warm-up: the pool grows to the round's working set, the kernel module loads
    // and the helper streams the wake-ups use are created.
    let mut rounds = Vec::with_capacity(config.rounds);
    for round in 0..=config.rounds {
        let stats = Arc::new(InCudaMem::default());
        let (wall, outputs) = async_round(&runtime, &streams, std::mem::take(&mut buffers), Arc::clone(&stats));
        for (r, output) in outputs.into_iter().enumerate() {
            let mut output = output?;
            check(r, &output);
            refill(r, &mut output);
            buffers.push(output);
        }
        if round > 0 {
            rounds.push((wall, stats.totals()));
        }
    }
    Ok(rounds)
}

/// Writes request `r`'s input into a buffer that came back holding its output.
fn refill(request: usize, buffer: &mut PinnedBuffer<f32>) {
    for (i, x) in buffer.iter_mut().enumerate() {
        *x = input_value(request, i);
    }
}

/// Every request as a task at once; the wall time until all have finished, and their outputs.
fn async_round(
    runtime: &tokio::runtime::Runtime,
    streams: &[Stream],
    inputs: Vec<PinnedBuffer<f32>>,
    stats: Arc<InCudaMem>,
) -> (Duration, Vec<cuda_mem::Result<PinnedBuffer<f32>>>) {
    let device = streams[0].device();
    let start = Instant::now();
    let outputs = runtime.block_on(async {
        let tasks: Vec<_> = inputs
            .into_iter()
            .zip(streams)
            .map(|(input, stream)| {
                let (stream, stats) = (stream.clone(), Arc::clone(&stats));
                tokio::spawn(async move {
                    // A new executor thread starts on device 0: make the stream's device current.
                    stats.call(|| device.set_current())?;
                    serve(stream, input, stats).await
                })
            })
            .collect();
        let mut outputs = Vec::with_capacity(tasks.len());
        for task in tasks {
            outputs.push(task.await.expect("a request task panicked"));
        }
        outputs
    });
    (start.elapsed(), outputs)
}

/// The requests one OS thread serves: (input, output) pairs.
type Share<'a> = Vec<(&'a PinnedBuffer<f32>, &'a mut PinnedBuffer<f32>)>;

fn run_threads(config: &Config) -> cuda_mem::Result<Vec<(Duration, Inside)>> {
    let device = cuda_mem::Device::current()?;
    let inputs = make_inputs(config)?;
    let mut outputs = (0..config.requests)
        .map(|_| PinnedBuffer::<f32>::zeroed(config.elements))
        .collect::<cuda_mem::Result<Vec<_>>>()?;
    let streams = (0..config.threads).map(|_| Stream::non_blocking()).collect::<cuda_mem::Result<Vec<_>>>()?;
    let mut rounds = Vec::with_capacity(config.rounds);
    for round in 0..=config.rounds {
        let stats = InCudaMem::default();
        let start = Instant::now();
        std::thread::scope(|scope| -> cuda_mem::Result<()> {
            let mut shares: Vec<Share<'_>> = (0..config.threads).map(|_| Vec::new()).collect();
            for (r, (input, output)) in inputs.iter().zip(&mut outputs).enumerate() {
                shares[r % config.threads].push((input, output));
            }
            let workers: Vec<_> = shares
                .into_iter()
                .zip(&streams)
                .map(|(share, stream)| {
                    let stats = &stats;
                    scope.spawn(move || -> cuda_mem::Result<()> {
                        device.set_current()?;
                        for (input, output) in share {
                            serve_blocking(stream, input, output, stats)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| w.join().expect("a request thread panicked"))
        })?;
        let wall = start.elapsed();
        for (r, output) in outputs.iter_mut().enumerate() {
            check(r, output);
            output.fill(0.0);
        }
        // Round 0 is the warm-up, as in the async variant.
        if round > 0 {
            rounds.push((wall, stats.totals()));
        }
    }
    Ok(rounds)
}

/// One request in a blocking scope; the scope's end (its synchronize) is the wait.
fn serve_blocking(
    stream: &Stream,
    input: &PinnedBuffer<f32>,
    output: &mut PinnedBuffer<f32>,
    stats: &InCudaMem,
) -> cuda_mem::Result<()> {
    let mut device = stats.call(|| StreamBuffer::<f32>::zeroed(stream, input.len()))?;
    let mut view = device.as_mut_slice();
    let mut queued = Duration::ZERO;
    let scope = Instant::now();
    stream.try_scope(|s| {
        let start = Instant::now();
        let result = s
            .copy_from_host(&mut view, input)
            .and_then(|()| scale_in_place_f32(s, &mut view, SCALE))
            .and_then(|()| s.copy_to_host(output, &view));
        queued = start.elapsed();
        result
    })?;
    let total = scope.elapsed();
    stats.enqueue.fetch_add(queued.as_nanos() as u64, Ordering::Relaxed);
    stats.wait.fetch_add((total - queued).as_nanos() as u64, Ordering::Relaxed);
    stats.call(|| drop(device));
    Ok(())
}

fn main() -> cuda_mem::Result<()> {
    let config = Config::parse().unwrap_or_else(|why| {
        eprintln!("async_server: {why}\nusage: async_server [--requests N] [--elements N] [--threads N] [--rounds N]");
        std::process::exit(2)
    });
    let mib = (config.elements * 4) >> 20;
    println!("{} requests of {} f32 ({mib} MiB) each: upload, scale_f32, download", config.requests, config.elements);
    println!("after one untimed full-size round, the median of {} timed rounds:", config.rounds);
    let rounds = run_async(&config)?;
    report(&format!("async ({} executor threads, a stream per request)", config.threads), &config, rounds);
    let rounds = run_threads(&config)?;
    report(&format!("threads ({} OS threads, a stream each, blocking)", config.threads), &config, rounds);
    println!("every result verified");
    Ok(())
}

/// The round of median wall time: its requests per second and its time inside cuda-mem.
fn report(name: &str, config: &Config, mut rounds: Vec<(Duration, Inside)>) {
    rounds.sort_by_key(|(wall, _)| *wall);
    let (wall, inside) = rounds[rounds.len() / 2];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name}: {:.1} requests/s ({:.1} ms wall); serving threads inside cuda-mem: enqueues {:.3} ms, waits {:.3} ms",
        config.requests as f64 / wall.as_secs_f64(),
        ms(wall),
        ms(inside.enqueue),
        ms(inside.wait)
    );
}
