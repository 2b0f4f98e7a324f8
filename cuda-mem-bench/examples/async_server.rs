//! A GPU request server two ways, doing the same work per request: upload the request's input
//! (`--elements` f32, pinned) into a device buffer, `scale_f32` it in place, download it into the
//! request's output (pinned). Both variants allocate everything once: every request owns a pinned
//! input and output buffer, reused across rounds, and the device buffers (a few per variant) are
//! reused by each request served on them; no request creates a stream, allocates, zeroes or
//! frees memory.
//! Every result is verified on the host after each round (outside the timings), and every output
//! is zeroed before the next round.
//!
//! - Async: every request is a task on a `--threads`-thread tokio runtime, all spawned at once.
//!   A task takes a free slot (a device buffer and the stream its work ends on) from a fair
//!   semaphore, queues its three operations without waiting, awaits their completion and gives
//!   the slot back. No executor thread synchronizes. Two schedules (`--schedule`):
//!   - `per-stream` (the default): a request runs whole on one of `--streams` streams
//!     (`--depth` device buffers each), as in the threads variant, queued with `Stream::queue`
//!     (one event recorded after the three operations). What wakes the task (`--wake`):
//!     - `watcher` (the default): it awaits the `Pending` woken by cuda-mem's watcher thread
//!       (`WakeUp::WatcherThread`), which queries the event; no host function runs.
//!     - `stream`: it awaits `Stream::synchronize_async` queued right after its work (a host
//!       function, which the stream's later work waits for), then takes the buffers with
//!       `Pending::try_take`.
//!     - `pending`: it awaits the `Pending` woken by a host function (a helper stream waits for
//!       its event and runs it, so the slot's stream waits for nothing).
//!     - `poll` (a diagnostic): it queries the `Pending` and yields to the executor until done.
//!   - `pipeline`: `--streams` lanes, each an uploads stream and a stream for the kernels and
//!     downloads ordered after the request's upload by an event (`Pending::then_on`), over
//!     `--buffers` device buffers dealt to the lanes; the task awaits the `Pending` (woken by the
//!     watcher with `--wake watcher`, else by a host function). Uploads never wait for
//!     downloads, but on the H200 it moved less than the per-stream schedule, with one lane or
//!     several (measured on 2026-12-02 at commit 2436876; see docs/async-work.md).
//!
//!   Host functions cost the copies throughput on the H200 host: with them the async variant
//!   stayed behind the threads variant at any depth or stream count, and the threads variant
//!   fell to its level when it only added a host function per request that nothing waited for
//!   (`--threads-wait scope-host-func`; docs/async-work.md). Hence the watcher is the default.
//! - Threads: the requests dealt round-robin to `--threads` OS threads, each with its own stream
//!   and device buffer; a request is the same three operations in a blocking `try_scope`, whose
//!   end synchronizes the stream (`--threads-wait scope`, the default). Diagnostics: `pending`
//!   (`Stream::queue`, then `Pending::wait`), `host-func` (`Stream::queue`, then
//!   `synchronize_async` awaited with the thread parked: the async `--wake stream` work exactly)
//!   and `scope-host-func` (as `scope`, plus a host function per request on a helper stream).
//!
//! Both first serve one untimed round (the kernel module loads; the wake-ups' helper streams
//! and the watcher thread start), then `--rounds` timed rounds, the two variants' rounds
//! alternating (and which goes first alternating). The target is judged on the median of the
//! rounds' pairwise ratios (each async round against the threads round next to it); each variant
//! also prints its median round's requests per second and the time its serving threads spent
//! inside cuda-mem calls, split into enqueues (the copies and the kernel; for the async variant
//! also the event recorded after them, and queuing the host function or releasing the event)
//! and waits (the async variant's polls, which query or register and never block, and
//! `try_take`; the threads variant's waits, which block).
//!
//! ```text
//! cargo run --release -p cuda-mem-bench --example async_server -- [--requests 64] [--elements 4194304] [--threads 4]
//!     [--schedule per-stream|pipeline] [--streams 4] [--depth 1] [--wake watcher|stream|pending|poll] [--buffers 4]
//!     [--rounds 21] [--threads-wait scope|scope-host-func|pending|host-func]
//! ```

use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream, StreamScope, WakeUp};
use cuda_mem_kernels::scale_in_place_f32;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

const SCALE: f32 = 2.0;
/// The async variant's polls may take at most this share of its executor threads' time for the
/// "about zero time blocked" target (they never block; this bounds what they cost at all).
const POLL_SHARE_TARGET: f64 = 0.05;

struct Config {
    requests: usize,
    elements: usize,
    threads: usize,
    streams: usize,
    depth: usize,
    rounds: usize,
    wake: Wake,
    schedule: Schedule,
    buffers: usize,
    threads_wait: ThreadsWait,
}

/// How the async variant lays requests out on streams.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Schedule {
    /// A request runs whole on one of `--streams` streams (as in the threads variant), woken as
    /// `--wake` says.
    PerStream,
    /// Lanes of an uploads stream and a kernels-and-downloads stream, ordered after the
    /// request's upload with `Pending::then_on`, over `--buffers` device buffers: uploads never
    /// wait for downloads.
    Pipeline,
}

/// How an async request learns that its work has completed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// `Stream::synchronize_async` on the slot's own stream: a host function queued right after
    /// the work, so it runs once this request's work is done (work queued after it, another
    /// slot's request on the same stream, waits for the host function to return).
    Stream,
    /// Awaiting the `Pending` itself: a helper stream waits for its event, then runs the host
    /// function (built for streams that carry other work after it).
    Pending,
    /// Awaiting the `Pending` woken by cuda-mem's watcher thread (`WakeUp::WatcherThread`),
    /// which queries its event: no host function runs.
    Watcher,
    /// No host function: the task queries the `Pending` and yields to the executor until it is
    /// done (a diagnostic: it shows what the host functions cost the GPU, and spends executor
    /// time on queries).
    Poll,
}

/// How the threads variant waits for a request's work.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ThreadsWait {
    /// A blocking `try_scope`, whose end synchronizes the stream.
    Scope,
    /// As `Scope`, and each request also starts an `Event::wait_async` on an event recorded
    /// after its work and drops it at once: a host function per request runs on a helper stream,
    /// which the thread does not wait for (a diagnostic: what host functions alone cost the GPU).
    ScopeAndHostFunc,
    /// `Stream::queue` and `Pending::wait` (the async variant's fence event, waited for with a
    /// blocking event synchronize).
    Pending,
    /// `Stream::queue`, `Stream::synchronize_async` awaited by parking the thread, then
    /// `Pending::try_take`: on the GPU, exactly the async variant's work with `--wake stream`.
    HostFunc,
}

/// The names `--wake`, `--threads-wait` and `--schedule` take.
const WAKES: [(&str, Wake); 4] =
    [("watcher", Wake::Watcher), ("stream", Wake::Stream), ("pending", Wake::Pending), ("poll", Wake::Poll)];
const THREADS_WAITS: [(&str, ThreadsWait); 4] = [
    ("scope", ThreadsWait::Scope),
    ("scope-host-func", ThreadsWait::ScopeAndHostFunc),
    ("pending", ThreadsWait::Pending),
    ("host-func", ThreadsWait::HostFunc),
];
const SCHEDULES: [(&str, Schedule); 2] = [("per-stream", Schedule::PerStream), ("pipeline", Schedule::Pipeline)];

/// The option `value` names among `options`, or an error saying what `flag` takes.
fn choose<T: Copy>(flag: &str, value: &str, options: &[(&str, T)]) -> Result<T, String> {
    let found = options.iter().find(|(name, _)| *name == value).map(|&(_, option)| option);
    found.ok_or_else(|| {
        let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
        format!("{flag} is one of {}", names.join(", "))
    })
}

impl Config {
    fn parse() -> Result<Self, String> {
        let mut values = [
            ("--requests", 64usize),
            ("--elements", 1 << 22),
            ("--threads", 4),
            ("--streams", 4),
            ("--depth", 1),
            ("--rounds", 21),
            ("--buffers", 4),
        ];
        let mut wake = Wake::Watcher;
        let mut threads_wait = ThreadsWait::Scope;
        let mut schedule = Schedule::PerStream;
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--wake" => wake = choose(&flag, &value, &WAKES)?,
                "--threads-wait" => threads_wait = choose(&flag, &value, &THREADS_WAITS)?,
                "--schedule" => schedule = choose(&flag, &value, &SCHEDULES)?,
                _ => {
                    let slot =
                        values.iter_mut().find(|(name, _)| *name == flag).ok_or(format!("unknown argument {flag}"))?;
                    slot.1 = value.parse().map_err(|_| format!("{flag} must be a number"))?;
                }
            }
        }
        let [(_, requests), (_, elements), (_, threads), (_, streams), (_, depth), (_, rounds), (_, buffers)] = values;
        if [requests, elements, threads, streams, depth, rounds, buffers].contains(&0) {
            return Err("every setting must be positive".into());
        }
        Ok(Self { requests, elements, threads, streams, depth, rounds, wake, schedule, buffers, threads_wait })
    }
}

/// Time the serving threads spent inside cuda-mem (queuing work, and waiting for it), and when in
/// the round the first request's work was queued and the last request's completion was seen.
struct InCudaMem {
    start: Instant,
    enqueue: AtomicU64,
    wait: AtomicU64,
    /// Nanoseconds from `start` to the end of the first enqueue (the GPU has work from then on).
    first_queued: AtomicU64,
    /// Nanoseconds from `start` to the last time a request's completion was seen by its server.
    last_done: AtomicU64,
}

/// The totals of one round.
#[derive(Clone, Copy)]
struct Inside {
    enqueue: Duration,
    wait: Duration,
    first_queued: Duration,
    last_done: Duration,
}

impl InCudaMem {
    /// Counters for a round that starts now.
    fn starting_now() -> Self {
        Self {
            start: Instant::now(),
            enqueue: AtomicU64::new(0),
            wait: AtomicU64::new(0),
            first_queued: AtomicU64::new(u64::MAX),
            last_done: AtomicU64::new(0),
        }
    }

    /// Times `f` as an enqueue, and marks the first enqueue's end.
    fn call<R>(&self, f: impl FnOnce() -> R) -> R {
        let value = Self::timed(&self.enqueue, f);
        self.first_queued.fetch_min(self.since_start(), Ordering::Relaxed);
        value
    }

    fn wait<R>(&self, f: impl FnOnce() -> R) -> R {
        Self::timed(&self.wait, f)
    }

    /// Marks that a request's completion has been seen.
    fn done(&self) {
        self.last_done.fetch_max(self.since_start(), Ordering::Relaxed);
    }

    fn since_start(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn timed<R>(counter: &AtomicU64, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let value = f();
        Self::add(counter, start.elapsed());
        value
    }

    fn add(counter: &AtomicU64, time: Duration) {
        counter.fetch_add(time.as_nanos() as u64, Ordering::Relaxed);
    }

    fn totals(&self) -> Inside {
        let read = |c: &AtomicU64| Duration::from_nanos(c.load(Ordering::Relaxed));
        Inside {
            enqueue: read(&self.enqueue),
            wait: read(&self.wait),
            first_queued: read(&self.first_queued),
            last_done: read(&self.last_done),
        }
    }
}

/// A future whose every poll is timed as time inside cuda-mem (a `Pending`'s or `Completion`'s
/// poll queries the GPU's progress and arms its wake-up; it never blocks).
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

/// A request's buffers: its input and its output, both pinned, both reused across rounds.
struct Request {
    input: PinnedBuffer<f32>,
    output: PinnedBuffer<f32>,
}

fn make_requests(config: &Config) -> cuda_mem::Result<Vec<Request>> {
    (0..config.requests)
        .map(|r| {
            let host: Vec<f32> = (0..config.elements).map(|i| input_value(r, i)).collect();
            let input = PinnedBuffer::from_slice(&host, Default::default())?;
            Ok(Request { input, output: PinnedBuffer::zeroed(config.elements)? })
        })
        .collect()
}

/// Checks every output, then zeroes it for the next round.
fn check_and_clear(requests: &mut [Request]) {
    for (r, request) in requests.iter_mut().enumerate() {
        let bad = request.output.iter().enumerate().position(|(i, &y)| y != SCALE * input_value(r, i));
        assert!(bad.is_none(), "request {r}: element {} is wrong", bad.unwrap_or_default());
        request.output.fill(0.0);
    }
}

/// A device buffer and the streams a request served with it runs on: its upload's and the rest's
/// (the same stream but in the pipeline schedule).
struct Slot {
    upload: Stream,
    stream: Stream,
    device: DeviceBuffer<f32>,
}

/// `streams` streams with `depth` slots each (a `Stream` clone is the same stream).
fn make_slots(streams: usize, depth: usize, elements: usize) -> cuda_mem::Result<Vec<Slot>> {
    let streams: Vec<Stream> = (0..streams).map(|_| Stream::non_blocking()).collect::<cuda_mem::Result<_>>()?;
    // Interleaved, so that the first slots taken are on different streams.
    let on = (0..depth).flat_map(|_| streams.iter());
    on.map(|stream| {
        Ok(Slot { upload: stream.clone(), stream: stream.clone(), device: DeviceBuffer::zeroed(elements)? })
    })
    .collect()
}

/// The pipeline's slots: `lanes` pairs of streams (uploads, then kernels and downloads) and
/// `buffers` device buffers dealt to them in turn.
fn make_lanes(lanes: usize, buffers: usize, elements: usize) -> cuda_mem::Result<Vec<Slot>> {
    let pairs: Vec<(Stream, Stream)> =
        (0..lanes).map(|_| Ok((Stream::non_blocking()?, Stream::non_blocking()?))).collect::<cuda_mem::Result<_>>()?;
    (0..buffers)
        .map(|b| {
            let (upload, stream) = &pairs[b % lanes];
            Ok(Slot { upload: upload.clone(), stream: stream.clone(), device: DeviceBuffer::zeroed(elements)? })
        })
        .collect()
}

/// The async variant's free slots; a permit of `free` stands for one slot in `idle`.
struct Slots {
    free: Semaphore,
    idle: Mutex<Vec<Slot>>,
}

impl Slots {
    fn new(slots: Vec<Slot>) -> Self {
        Self { free: Semaphore::new(slots.len()), idle: Mutex::new(slots) }
    }

    /// Waits (asynchronously, never blocking the executor thread) for a free slot and takes it.
    async fn take(&self) -> Slot {
        let permit = self.free.acquire().await.expect("the semaphore is never closed");
        let slot = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        // The permit comes back with the slot (`give_back`); a failed request's slot is lost, and
        // its permit with it.
        permit.forget();
        slot.expect("a permit stands for an idle slot")
    }

    fn give_back(&self, slot: Slot) {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(slot);
        self.free.add_permits(1);
    }
}

/// One request as a task: take a slot, queue upload, scale and download on its stream without
/// waiting, await their completion as `wake` says, give the slot back.
async fn serve(slots: Arc<Slots>, request: Request, wake: Wake, stats: Arc<InCudaMem>) -> cuda_mem::Result<Request> {
    let Slot { upload, stream, device } = slots.take().await;
    let Request { input, output } = request;
    let pending = stats.call(|| {
        stream.queue((device, input, output), |s, (device, input, output)| queue_request(s, device, input, output))
    })?;
    let (device, input, output) = match wake {
        Wake::Stream => {
            let completion = stats.call(|| stream.synchronize_async())?;
            Timed { inner: completion, stats: Arc::clone(&stats) }.await?;
            // The stream has passed the work's event: taking the buffers back does not block
            // (were it ever unfinished, the blocking wait is counted as a wait).
            stats.wait(|| pending.try_take().or_else(cuda_mem::Pending::wait))?
        }
        Wake::Pending | Wake::Watcher => {
            let pending = if wake == Wake::Watcher { pending.woken_by(WakeUp::WatcherThread) } else { pending };
            let mut awaited = Timed { inner: pending, stats: Arc::clone(&stats) };
            let done = (&mut awaited).await;
            stats.call(|| drop(awaited)); // releases the fence event (and the wake-up's state)
            done?
        }
        Wake::Poll => loop {
            match stats.wait(|| pending.is_done()) {
                Ok(false) => tokio::task::yield_now().await,
                // Done, or failed: `wait` returns the buffers or the error.
                _ => break stats.wait(|| pending.wait())?,
            }
        },
    };
    stats.done();
    slots.give_back(Slot { upload, stream, device });
    Ok(Request { input, output })
}

/// One request as a task in the pipeline: take a slot, queue the upload on the slot's uploads
/// stream and, ordered after it through an event (`then_on`), the kernel and the download on its
/// downloads stream; await the `Pending` (a helper stream runs the wake-up, so no lane waits for
/// a host function); give the slot back.
async fn serve_pipelined(
    slots: Arc<Slots>,
    request: Request,
    wake_up: WakeUp,
    stats: Arc<InCudaMem>,
) -> cuda_mem::Result<Request> {
    let Slot { upload, stream, device } = slots.take().await;
    let Request { input, output } = request;
    let pending = stats.call(|| {
        let uploaded = upload.queue((device, input, output), |s, (device, input, _)| {
            s.copy_from_host(&mut device.as_mut_slice(), input)
        })?;
        uploaded.then_on(&stream, |s, (device, _, output)| {
            let mut view = device.as_mut_slice();
            scale_in_place_f32(s, &mut view, SCALE)?;
            s.copy_to_host(&mut output[..], &view)
        })
    })?;
    let mut awaited = Timed { inner: pending.woken_by(wake_up), stats: Arc::clone(&stats) };
    let done = (&mut awaited).await;
    stats.call(|| drop(awaited)); // releases the fence event
    let (device, input, output) = done?;
    stats.done();
    slots.give_back(Slot { upload, stream, device });
    Ok(Request { input, output })
}

/// The async variant's state, kept across rounds.
struct AsyncServer {
    runtime: tokio::runtime::Runtime,
    slots: Arc<Slots>,
    requests: Vec<Request>,
}

impl AsyncServer {
    fn new(config: &Config) -> cuda_mem::Result<Self> {
        let device = cuda_mem::Device::current()?;
        let mut slots = match config.schedule {
            Schedule::PerStream => make_slots(config.streams, config.depth, config.elements)?,
            Schedule::Pipeline => make_lanes(config.streams, config.buffers, config.elements)?,
        };
        slots.reverse(); // `Slots::take` pops from the end
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.threads)
            .on_thread_start(move || {
                // Kernels launch on the current device: make it the streams' device, once per thread.
                if let Err(err) = device.set_current() {
                    eprintln!("async_server: an executor thread could not make the device current: {err}");
                    std::process::exit(1);
                }
            })
            .build()
            .expect("a tokio runtime");
        Ok(Self { runtime, slots: Arc::new(Slots::new(slots)), requests: make_requests(config)? })
    }

    /// Serves every request once; verifies the results outside the timing.
    fn round(&mut self, config: &Config) -> cuda_mem::Result<(Duration, Inside)> {
        let stats = Arc::new(InCudaMem::starting_now());
        let slots = &self.slots;
        let requests = std::mem::take(&mut self.requests);
        let served = self.runtime.block_on(async {
            let tasks: Vec<_> = requests
                .into_iter()
                .map(|request| {
                    let (slots, stats) = (Arc::clone(slots), Arc::clone(&stats));
                    match config.schedule {
                        Schedule::Pipeline => {
                            let wake_up =
                                if config.wake == Wake::Watcher { WakeUp::WatcherThread } else { WakeUp::HostFunction };
                            tokio::spawn(serve_pipelined(slots, request, wake_up, stats))
                        }
                        Schedule::PerStream => tokio::spawn(serve(slots, request, config.wake, stats)),
                    }
                })
                .collect();
            let mut served = Vec::with_capacity(tasks.len());
            for task in tasks {
                served.push(task.await.expect("a request task panicked"));
            }
            served
        });
        let wall = stats.start.elapsed();
        self.requests = served.into_iter().collect::<cuda_mem::Result<_>>()?;
        check_and_clear(&mut self.requests);
        Ok((wall, stats.totals()))
    }
}

/// The threads variant's state, kept across rounds.
struct ThreadServer {
    requests: Vec<Request>,
    slots: Vec<Slot>,
}

impl ThreadServer {
    fn new(config: &Config) -> cuda_mem::Result<Self> {
        Ok(Self { requests: make_requests(config)?, slots: make_slots(config.threads, 1, config.elements)? })
    }

    /// Serves every request once, dealt round-robin to the threads; verifies outside the timing.
    fn round(&mut self, config: &Config) -> cuda_mem::Result<(Duration, Inside)> {
        let device = cuda_mem::Device::current()?;
        let stats = InCudaMem::starting_now();
        let mut shares: Vec<Vec<(usize, Request)>> = (0..config.threads).map(|_| Vec::new()).collect();
        for (r, request) in std::mem::take(&mut self.requests).into_iter().enumerate() {
            shares[r % config.threads].push((r, request));
        }
        let slots = std::mem::take(&mut self.slots);
        let served = std::thread::scope(|scope| {
            let workers: Vec<_> = shares
                .into_iter()
                .zip(slots)
                .map(|(share, slot)| {
                    let stats = &stats;
                    scope.spawn(move || -> cuda_mem::Result<(Slot, Vec<(usize, Request)>)> {
                        device.set_current()?;
                        let mut slot = slot;
                        let mut served = Vec::with_capacity(share.len());
                        for (r, request) in share {
                            let (back, request) = serve_blocking(slot, request, config.threads_wait, stats)?;
                            slot = back;
                            served.push((r, request));
                        }
                        Ok((slot, served))
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("a request thread panicked")).collect::<Vec<_>>()
        });
        let wall = stats.start.elapsed();
        let mut all = Vec::with_capacity(config.requests);
        for worker in served {
            let (slot, requests) = worker?;
            self.slots.push(slot);
            all.extend(requests);
        }
        all.sort_by_key(|(r, _)| *r);
        self.requests = all.into_iter().map(|(_, request)| request).collect();
        check_and_clear(&mut self.requests);
        Ok((wall, stats.totals()))
    }
}

/// Each timed round's wall time and time inside cuda-mem.
type Rounds = Vec<(Duration, Inside)>;

/// Rounds of both variants, alternating (which goes first alternates too), so that drift in the
/// host's or the GPU's speed during the run falls on both alike. Round 0 of each is the warm-up
/// (the kernel module loads; with `--wake pending` the wake-ups' helper streams are made).
fn run_both(config: &Config) -> cuda_mem::Result<(Rounds, Rounds)> {
    let (mut server, mut threads) = (AsyncServer::new(config)?, ThreadServer::new(config)?);
    let (mut async_rounds, mut thread_rounds) = (Vec::new(), Vec::new());
    for round in 0..=config.rounds {
        let (a, t) = if round % 2 == 0 {
            let a = server.round(config)?;
            (a, threads.round(config)?)
        } else {
            let t = threads.round(config)?;
            (server.round(config)?, t)
        };
        if round > 0 {
            async_rounds.push(a);
            thread_rounds.push(t);
        }
    }
    Ok((async_rounds, thread_rounds))
}

/// One request on a thread, waited for as `how` says (the wait is what follows the enqueues).
fn serve_blocking(
    slot: Slot,
    request: Request,
    how: ThreadsWait,
    stats: &InCudaMem,
) -> cuda_mem::Result<(Slot, Request)> {
    let Slot { upload, stream, mut device } = slot;
    let Request { mut input, mut output } = request;
    if matches!(how, ThreadsWait::Scope | ThreadsWait::ScopeAndHostFunc) {
        let mut queued = Duration::ZERO;
        let scope = Instant::now();
        stream.try_scope(|s| {
            let start = Instant::now();
            let result = stats.call(|| {
                queue_request(s, &mut device, &input, &mut output)?;
                if how == ThreadsWait::ScopeAndHostFunc {
                    drop(stream.record_event()?.wait_async()?);
                }
                Ok(())
            });
            queued = start.elapsed();
            result
        })?;
        InCudaMem::add(&stats.wait, scope.elapsed() - queued);
    } else {
        let pending = stats.call(|| {
            stream.queue((device, input, output), |s, (device, input, output)| queue_request(s, device, input, output))
        })?;
        (device, input, output) = match how {
            ThreadsWait::HostFunc => {
                let completion = stats.call(|| stream.synchronize_async())?;
                stats.wait(|| park_until(completion))?;
                stats.wait(|| pending.try_take().or_else(cuda_mem::Pending::wait))?
            }
            _ => stats.wait(|| pending.wait())?,
        };
    }
    stats.done();
    Ok((Slot { upload, stream, device }, Request { input, output }))
}

/// A request's three operations on `s`: upload, scale in place, download.
fn queue_request<'s>(
    s: &StreamScope<'s, '_>,
    device: &'s mut DeviceBuffer<f32>,
    input: &'s [f32],
    output: &'s mut [f32],
) -> cuda_mem::Result<()> {
    let mut view = device.as_mut_slice();
    s.copy_from_host(&mut view, input)?;
    scale_in_place_f32(s, &mut view, SCALE)?;
    s.copy_to_host(output, &view)
}

/// Polls `future` on this thread, parking it between polls (a minimal `block_on`).
fn park_until<F: Future + Unpin>(mut future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(value) = Pin::new(&mut future).poll(&mut cx) {
            return value;
        }
        std::thread::park();
    }
}

fn main() -> cuda_mem::Result<()> {
    let config = Config::parse().unwrap_or_else(|why| {
        eprintln!(
            "async_server: {why}\nusage: async_server [--requests N] [--elements N] [--threads N] [--streams N] [--depth N] \
             [--rounds N] [--wake watcher|stream|pending|poll] [--threads-wait scope|scope-host-func|pending|host-func] \
             [--schedule per-stream|pipeline] [--buffers N]"
        );
        std::process::exit(2)
    });
    let mib = (config.elements * 4) >> 20;
    println!("{} requests of {} f32 ({mib} MiB) each: upload, scale_f32, download", config.requests, config.elements);
    println!("after one untimed full-size round, the median of {} timed rounds, alternating:", config.rounds);
    let wake = WAKES.iter().find(|(_, w)| *w == config.wake).map_or("?", |(name, _)| name);
    let name = match config.schedule {
        Schedule::PerStream => format!(
            "async ({} executor threads, {} streams x {} device buffers, a task per request, wake {wake})",
            config.threads, config.streams, config.depth
        ),
        Schedule::Pipeline => format!(
            "async pipeline ({} executor threads, {} lanes of an uploads and a downloads stream, {} device buffers, a \
             task per request, awaiting its Pending)",
            config.threads, config.streams, config.buffers
        ),
    };
    let (async_rounds, thread_rounds) = run_both(&config)?;
    let mut paired: Vec<f64> =
        async_rounds.iter().zip(&thread_rounds).map(|((a, _), (t, _))| t.as_secs_f64() / a.as_secs_f64()).collect();
    paired.sort_by(f64::total_cmp);
    let (async_wall, async_inside) = report(&name, &config, async_rounds);
    let wait = match config.threads_wait {
        ThreadsWait::Scope => "a scope each",
        ThreadsWait::ScopeAndHostFunc => "a scope each, and a host function not waited for",
        ThreadsWait::Pending => "Stream::queue, Pending::wait",
        ThreadsWait::HostFunc => "Stream::queue, synchronize_async, parked",
    };
    let name = format!("threads ({} OS threads, a stream each, blocking: {wait})", config.threads);
    let (threads_wall, _) = report(&name, &config, thread_rounds);
    println!("every result verified");

    // Each timed round of one variant ran next to one of the other: their ratio is taken under
    // the same host and GPU speed, which drift during a run by more than the variants differ.
    let ratio = paired[paired.len() / 2];
    let listed: Vec<String> = paired.iter().map(|r| format!("{r:.3}")).collect();
    println!(
        "async / threads throughput of each pair of rounds run one after the other, sorted: [{}]",
        listed.join(", ")
    );
    println!(
        "target async throughput >= threads throughput: {} (median pair: async / threads = {ratio:.3}; the median \
         rounds' ratio is {:.3})",
        if ratio >= 1.0 { "met" } else { "missed" },
        threads_wall.as_secs_f64() / async_wall.as_secs_f64()
    );
    let executor_time = async_wall.as_secs_f64() * config.threads as f64;
    let share = async_inside.wait.as_secs_f64() / executor_time;
    println!(
        "target executor threads about 0 time blocked in CUDA synchronization: {} (no synchronize on them; their \
         polls took {:.3} ms, {:.1}% of {} threads x wall; target < {:.0}%)",
        if share < POLL_SHARE_TARGET { "met" } else { "missed" },
        async_inside.wait.as_secs_f64() * 1e3,
        share * 100.0,
        config.threads,
        POLL_SHARE_TARGET * 100.0
    );
    Ok(())
}

/// Prints the round of median wall time: its requests per second and its time inside cuda-mem.
/// Returns that round's wall time and time inside cuda-mem.
fn report(name: &str, config: &Config, mut rounds: Vec<(Duration, Inside)>) -> (Duration, Inside) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let median = |mut values: Vec<Duration>| {
        values.sort();
        values[values.len() / 2]
    };
    let head = median(rounds.iter().map(|(_, inside)| inside.first_queued).collect());
    let tail = median(rounds.iter().map(|(wall, inside)| wall.saturating_sub(inside.last_done)).collect());
    rounds.sort_by_key(|(wall, _)| *wall);
    let (wall, inside) = rounds[rounds.len() / 2];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name}: {:.1} requests/s ({:.1} ms wall); serving threads inside cuda-mem: enqueues {:.3} ms, waits {:.3} ms; \
         medians over the rounds: first work queued {:.0} us after the round began, the round ended {:.0} us after \
         the last completion was seen",
        config.requests as f64 / wall.as_secs_f64(),
        ms(wall),
        ms(inside.enqueue),
        ms(inside.wait),
        us(head),
        us(tail)
    );
    (wall, inside)
}
