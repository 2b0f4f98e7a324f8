//! A GPU request server two ways. Async: every request is a task on a multi-threaded tokio
//! runtime (host to device, `scale_f32`, device to host, all on owned buffers) that awaits its
//! `Pending`, so executor threads never wait for the GPU. Threads: the same requests spread over
//! OS threads, each with its own stream, each request a blocking `try_scope`. Every result is
//! verified; each variant prints requests per second and the time its threads spent inside
//! cuda-mem calls (every call is timed on the threads that serve requests: the async variant's
//! are enqueues and non-blocking polls, the threads' include waiting for the GPU).
//!
//! ```text
//! cargo run --release -p cuda-mem-kernels --example async_server -- [--requests 64] [--elements 4194304] [--threads 4]
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
}

impl Config {
    fn parse() -> Result<Self, String> {
        let mut values = [("--requests", 64usize), ("--elements", 1 << 22), ("--threads", 4)];
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let slot = values.iter_mut().find(|(name, _)| *name == flag).ok_or(format!("unknown argument {flag}"))?;
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            slot.1 = value.parse().map_err(|_| format!("{flag} must be a number"))?;
        }
        let [(_, requests), (_, elements), (_, threads)] = values;
        if requests == 0 || elements == 0 || threads == 0 {
            return Err("every setting must be positive".into());
        }
        Ok(Self { requests, elements, threads })
    }
}

/// Time the serving threads spent inside cuda-mem (calls and polls).
#[derive(Default)]
struct InCudaMem(AtomicU64);

impl InCudaMem {
    fn call<R>(&self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let value = f();
        self.0.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        value
    }

    fn total(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
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
        stats.call(|| Pin::new(&mut self.inner).poll(cx))
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

fn run_async(config: &Config) -> cuda_mem::Result<(Duration, Duration)> {
    let streams = (0..config.requests).map(|_| Stream::non_blocking()).collect::<cuda_mem::Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    // Warm-up round with small requests, outside the timing: the kernel module, the pool, and
    // the helper streams the wake-ups use (created at the first concurrent waits).
    let small = make_inputs(&Config { elements: 1024, ..*config })?;
    let (_, outputs) = async_round(&runtime, &streams, small, Arc::default());
    for (r, output) in outputs.into_iter().enumerate() {
        check(r, &output?);
    }
    let inputs = make_inputs(config)?;
    let stats = Arc::new(InCudaMem::default());
    let (wall, outputs) = async_round(&runtime, &streams, inputs, Arc::clone(&stats));
    for (r, output) in outputs.into_iter().enumerate() {
        check(r, &output?);
    }
    Ok((wall, stats.total()))
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

fn run_threads(config: &Config) -> cuda_mem::Result<(Duration, Duration)> {
    let device = cuda_mem::Device::current()?;
    let inputs = make_inputs(config)?;
    let mut outputs = (0..config.requests)
        .map(|_| PinnedBuffer::<f32>::zeroed(config.elements))
        .collect::<cuda_mem::Result<Vec<_>>>()?;
    let stats = InCudaMem::default();
    let start = Instant::now();
    std::thread::scope(|scope| -> cuda_mem::Result<()> {
        let mut shares: Vec<Share<'_>> = (0..config.threads).map(|_| Vec::new()).collect();
        for (r, (input, output)) in inputs.iter().zip(&mut outputs).enumerate() {
            shares[r % config.threads].push((input, output));
        }
        let workers: Vec<_> = shares
            .into_iter()
            .map(|share| {
                let stats = &stats;
                scope.spawn(move || -> cuda_mem::Result<()> {
                    device.set_current()?;
                    let stream = Stream::non_blocking()?;
                    for (input, output) in share {
                        stats.call(|| {
                            let mut device = StreamBuffer::<f32>::zeroed(&stream, input.len())?;
                            let mut view = device.as_mut_slice();
                            stream.try_scope(|s| {
                                s.copy_from_host(&mut view, input)?;
                                scale_in_place_f32(s, &mut view, SCALE)?;
                                s.copy_to_host(output, &view)
                            })
                        })?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().expect("a request thread panicked"))
    })?;
    let wall = start.elapsed();
    for (r, output) in outputs.iter().enumerate() {
        check(r, output);
    }
    Ok((wall, stats.total()))
}

fn main() -> cuda_mem::Result<()> {
    let config = Config::parse().unwrap_or_else(|why| {
        eprintln!("async_server: {why}\nusage: async_server [--requests N] [--elements N] [--threads N]");
        std::process::exit(2)
    });
    let mib = (config.elements * 4) >> 20;
    println!("{} requests of {} f32 ({mib} MiB) each: upload, scale_f32, download", config.requests, config.elements);
    let (wall, inside) = run_async(&config)?;
    report(&format!("async ({} executor threads, a stream per request)", config.threads), &config, wall, inside);
    let (wall, inside) = run_threads(&config)?;
    report(&format!("threads ({} OS threads, a stream each, blocking)", config.threads), &config, wall, inside);
    println!("every result verified");
    Ok(())
}

fn report(name: &str, config: &Config, wall: Duration, inside: Duration) {
    println!(
        "{name}: {:.1} requests/s ({:.1} ms wall); serving threads inside cuda-mem calls {:.3} ms in all",
        config.requests as f64 / wall.as_secs_f64(),
        wall.as_secs_f64() * 1e3,
        inside.as_secs_f64() * 1e3
    );
}
