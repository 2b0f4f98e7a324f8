//! `Pending<T>`: asynchronous work on buffers passed by value (the io_uring / tokio-uring
//! pattern). The `Pending` owns everything the work touches until the work has completed, then
//! gives it back through [`Pending::wait`], [`Pending::try_take`] or `.await`.

pub(crate) mod job;
mod ops;
pub(crate) mod owned;

use crate::error::Result;
use crate::scope::StreamScope;
use crate::stream::Event;
use crate::stream::Stream;
use crate::stream::notify::{Completion, polled_after_completion};
use crate::watcher::{Probe, Watch, Watcher};
use job::Job;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A host step run once the GPU work has completed, before the value is handed back (a staged
/// download copies its pinned block into the pageable `Vec`). It owns what the work still used
/// (the staging block), so it is dropped only after completion, or leaked with the value.
type Settle<T> = Box<dyn FnOnce(&mut T) + Send>;

/// What wakes a task awaiting a [`Pending`]: see [`Pending::woken_by`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WakeUp {
    /// A host function (`cudaLaunchHostFunc`) on a helper stream that waits for the work's
    /// events: no thread of cuda-mem's polls, but every wait puts a host function on the GPU's
    /// queues.
    #[default]
    HostFunction,
    /// cuda-mem's watcher thread, which queries the work's events (`cudaEventQuery`) and wakes
    /// the task: no host function runs. The thread keeps a core busy, yielding between its
    /// queries, while watched work is outstanding (and for a millisecond after each completion),
    /// then naps between queries; it sleeps while nothing is watched. The task's waker runs on
    /// that thread: one that blocks holds up every other watched wait.
    WatcherThread,
}

/// Work queued on buffers owned by value. The buffers come back once the work has completed:
/// [`Pending::wait`] blocks for it, [`Pending::try_take`] and [`Pending::is_done`] never block,
/// and `.await` (`Pending` is a [`Future`]) is woken through `cudaLaunchHostFunc` without
/// blocking any thread (or by cuda-mem's watcher thread: [`Pending::woken_by`]). More work on the
/// same buffers is queued with [`Pending::then`] without waiting, and independent `Pending`s
/// combine with [`Pending::join`].
///
/// - **Drop** blocks until the work has completed, then drops the buffers (in `async` code that
///   blocks the executor thread: await the `Pending` instead of dropping it unfinished).
/// - **`mem::forget`** leaks the buffers: nothing the GPU still uses is ever freed.
/// - **Errors** while waiting (a failed query or synchronize: the context is broken) leak the
///   buffers too, rather than free memory that work may still use.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{PinnedBuffer, Stream, StreamBuffer};
/// let stream = Stream::non_blocking()?;
/// let device = StreamBuffer::<f32>::zeroed(stream.clone(), 1 << 20)?;
/// let input = PinnedBuffer::from_slice(&vec![2.0f32; 1 << 20], Default::default())?;
/// let upload = stream.upload(device, input)?; // returns at once; the copy runs
/// // ... the CPU prepares the next step here ...
/// let back = PinnedBuffer::<f32>::zeroed(1 << 20)?;
/// let (device, input) = upload.wait()?;
/// let (back, device) = stream.download(back, device)?.wait()?;
/// assert_eq!(back[..], input[..]);
/// # drop(device); Ok(()) }
/// ```
///
/// A buffer inside a `Pending` cannot be touched: it was moved in.
///
/// ```compile_fail,E0382
/// # use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let device = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let mut host = PinnedBuffer::<u32>::zeroed(16).unwrap();
/// let pending = stream.upload(device, host).unwrap();
/// host[0] = 1; // error: `host` was moved into the pending copy
/// # pending.wait().unwrap();
/// ```
///
/// A view taken before the hand-over cannot be used after it:
///
/// ```compile_fail,E0505
/// # use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let mut device = DeviceBuffer::<u32>::zeroed(16).unwrap();
/// let view = device.as_mut_slice();
/// let pending = stream.upload(device, PinnedBuffer::<u32>::zeroed(16).unwrap()).unwrap();
/// let _ = view.to_vec(); // error: `device` was moved while borrowed
/// # pending.wait().unwrap();
/// ```
///
/// A stream-ordered buffer that borrows its stream cannot be handed over (forgetting the
/// `Pending` would end the borrow): give it an owned handle with `stream.clone()`.
///
/// ```compile_fail,E0597
/// # use cuda_mem::{PinnedBuffer, Stream, StreamBuffer};
/// let stream = Stream::non_blocking().unwrap();
/// let device = StreamBuffer::<u32>::zeroed(&stream, 16).unwrap();
/// let pending = stream.upload(device, PinnedBuffer::<u32>::zeroed(16).unwrap()).unwrap();
/// # pending.wait().unwrap();
/// ```
///
/// Inside [`Pending::then`] (and [`Stream::queue`]), memory lent to a copy stays lent: it cannot
/// be read or written on the host afterwards in the same closure.
///
/// ```compile_fail,E0502
/// # use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let buffers = (DeviceBuffer::<u32>::zeroed(16).unwrap(), PinnedBuffer::<u32>::zeroed(16).unwrap());
/// let pending = stream.queue(buffers, |s, (device, host)| {
///     s.copy_to_host(&mut host[..], device.as_slice())?;
///     let first = host[0]; // error: `host` is lent to the pending copy
///     Ok(())
/// }).unwrap();
/// # pending.wait().unwrap();
/// ```
///
/// Nor can memory from outside the `Pending` be lent to its work: only the value it owns.
///
/// ```compile_fail,E0597
/// # use cuda_mem::{DeviceBuffer, Stream};
/// # let stream = Stream::non_blocking().unwrap();
/// let outside = vec![1u32; 16];
/// let pending = stream.queue(DeviceBuffer::<u32>::zeroed(16).unwrap(), |s, device| {
///     s.copy_from_host(&mut device.as_mut_slice(), &outside) // error: `outside` would have to live for good
/// }).unwrap();
/// drop(outside);
/// # pending.wait().unwrap();
/// ```
#[must_use = "dropping a Pending blocks until its work has completed; wait for it or await it"]
pub struct Pending<T> {
    /// The buffers; `None` once handed back (or leaked).
    value: Option<T>,
    /// The stream the work was queued on, for [`Pending::then`] and the wake-up's device.
    stream: Stream,
    /// Events recorded after the GPU work on the value, on any stream; shared with a watcher
    /// thread's watch, which queries them.
    fences: Vec<Arc<Event>>,
    /// Host work on the value that runs on other threads; its events join `fences`.
    jobs: Vec<Arc<Job>>,
    settle: Option<Settle<T>>,
    /// What `.await` is woken by.
    woken_by: WakeUp,
    /// The wake-up armed at the first poll that found the work unfinished.
    wake: Option<Armed>,
    /// A job's failure, kept once taken from the job: its lanes' work may still be in flight, so
    /// the value is never handed back (see [`Pending::wait`]).
    failed: Option<Box<crate::CudaError>>,
}

/// A wake-up armed by a poll.
enum Armed {
    HostFunction(Completion),
    Watcher(Watch),
}

// The value is never pinned: `poll` moves it out by value.
impl<T> Unpin for Pending<T> {}

impl<T> fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("stream", &self.stream)
            .field("taken", &self.value.is_none())
            .field("fences", &self.fences.len())
            .field("jobs", &self.jobs.len())
            .finish()
    }
}

impl<T> Pending<T> {
    /// A pending value fenced by `fences` (GPU work) and `jobs` (host work on other threads).
    pub(crate) fn new(value: T, stream: Stream, fences: Vec<Event>, jobs: Vec<Arc<Job>>) -> Self {
        let fences = fences.into_iter().map(Arc::new).collect();
        Self {
            value: Some(value),
            stream,
            fences,
            jobs,
            settle: None,
            woken_by: WakeUp::default(),
            wake: None,
            failed: None,
        }
    }

    /// Chooses what wakes a task that awaits this `Pending` (before its first poll; a poll that
    /// already armed a wake-up keeps it). [`WakeUp::HostFunction`] is the default. Pendings made
    /// by [`Pending::join`] keep `self`'s choice; [`Pending::then`] starts afresh.
    ///
    /// ```no_run
    /// # async fn run() -> cuda_mem::Result<()> {
    /// use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream, WakeUp};
    /// let stream = Stream::non_blocking()?;
    /// let (device, host) = (DeviceBuffer::<u8>::zeroed(1 << 20)?, PinnedBuffer::<u8>::zeroed(1 << 20)?);
    /// let (device, host) = stream.upload(device, host)?.woken_by(WakeUp::WatcherThread).await?;
    /// # drop((device, host)); Ok(()) }
    /// ```
    pub fn woken_by(mut self, wake_up: WakeUp) -> Self {
        self.woken_by = wake_up;
        self
    }

    /// The stream the work was queued on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Blocks until the work has completed and returns the buffers. On failure the buffers are
    /// leaked (see the type's docs) and the error returned.
    pub fn wait(mut self) -> Result<T> {
        if self.value.is_none() {
            return Err(already_handed_back());
        }
        match self.complete_blocking() {
            Ok(()) => Ok(self.hand_back()),
            Err(err) => Err(self.leak(err)),
        }
    }

    /// True once the work has completed; never blocks. An error means the work failed (the
    /// context is broken); [`Pending::wait`] returns it too.
    pub fn is_done(&self) -> Result<bool> {
        if self.value.is_none() {
            return Err(already_handed_back());
        }
        if self.failed.is_some() {
            return Ok(true);
        }
        for job in &self.jobs {
            match job.is_finished() {
                Some(true) => {}
                Some(false) => return Ok(false),
                // A failed job: `wait` reports its error, which a query cannot take out.
                None => return Ok(true),
            }
            if let Some(done) = job.with_events(all_complete)
                && !done?
            {
                return Ok(false);
            }
        }
        all_complete(&self.fences)
    }

    /// The buffers if the work has completed, else the `Pending` itself; never blocks. Errors
    /// stay for [`Pending::wait`] to return.
    pub fn try_take(mut self) -> Result<T, Self> {
        if !matches!(self.is_done(), Ok(true)) {
            return Err(self);
        }
        match self.complete_blocking() {
            Ok(()) => Ok(self.hand_back()),
            // `is_done` saw the work complete; only a failed job gets here, and `wait` says why.
            Err(_) => Err(self),
        }
    }

    /// Queues more work on the same buffers, ordered after the work so far, without waiting for
    /// it: `f` gets a scope on this `Pending`'s stream and the buffers, as in [`Stream::queue`].
    /// Work of other streams (a [`Pending::join`], a staged copy's lanes) is ordered with events.
    /// A `Pending` whose completion still has a host step (a download into a `Vec`) is waited for
    /// first, so the step's data is in place.
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{PinnedBuffer, Stream, StreamBuffer};
    /// let stream = Stream::non_blocking()?;
    /// let device = StreamBuffer::<u32>::zeroed(stream.clone(), 1024)?;
    /// let host = PinnedBuffer::from_slice(&[5u32; 1024], Default::default())?;
    /// let (device, host) = stream
    ///     .upload(device, host)?
    ///     .then(|s, (device, _)| s.set_bytes(&mut device.as_mut_slice(), 0))?
    ///     .then(|s, (device, host)| s.copy_to_host(&mut host[..], device.as_slice()))?
    ///     .wait()?;
    /// assert!(host.iter().all(|&x| x == 0));
    /// # drop(device); Ok(()) }
    /// ```
    pub fn then<F>(self, f: F) -> Result<Pending<T>>
    where
        T: 'static,
        F: for<'s> FnOnce(&'s StreamScope<'s, 's>, &'s mut T) -> Result<()>,
    {
        let stream = self.stream.clone();
        self.then_on(&stream, f)
    }

    /// [`Pending::then`] on another stream: `stream` waits (on the device, through events) for
    /// the work so far, then runs `f`'s work; the calling thread waits for nothing. This is how a
    /// pipeline keeps each copy direction on a stream of its own (uploads on one stream, kernels
    /// and downloads on another) without a thread blocked between its stages.
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{DeviceBuffer, PinnedBuffer, Stream};
    /// let (uploads, downloads) = (Stream::non_blocking()?, Stream::non_blocking()?);
    /// let buffers = (DeviceBuffer::<u32>::zeroed(1024)?, PinnedBuffer::from_slice(&[7u32; 1024], Default::default())?);
    /// let (device, host) = uploads
    ///     .upload(buffers.0, buffers.1)?
    ///     .then_on(&downloads, |s, (device, host)| s.copy_to_host(&mut host[..], device.as_slice()))?
    ///     .wait()?;
    /// assert!(host.iter().all(|&x| x == 7));
    /// # drop(device); Ok(()) }
    /// ```
    pub fn then_on<F>(mut self, stream: &Stream, f: F) -> Result<Pending<T>>
    where
        T: 'static,
        F: for<'s> FnOnce(&'s StreamScope<'s, 's>, &'s mut T) -> Result<()>,
    {
        if self.value.is_none() {
            return Err(already_handed_back());
        }
        // Refused while `self` still owns the value, whose drop then waits for its work.
        stream.require_outside_capture("Pending::then_on")?;
        if self.settle.is_some() {
            return stream.queue(self.wait()?, f);
        }
        // On failure `self` still owns the value: its drop waits for the work (or leaks).
        self.order_after_work(stream)?;
        let value = self.value.take().expect("a Pending holds its value until handed back");
        // The old fences are ordered before the new work by `stream`; the new Pending's fence
        // is recorded after it. Dropping `self` now waits for nothing (its value is gone).
        drop(self);
        stream.queue(value, f)
    }

    /// One `Pending` for two: it completes when both have, and hands back both values.
    /// [`Pending::then`] on it queues on `self`'s stream, ordered after both.
    ///
    /// A `Pending` already awaited to completion has nothing left to join:
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) (the other is dropped, which waits
    /// for its work).
    pub fn join<U>(mut self, mut other: Pending<U>) -> Result<Pending<(T, U)>>
    where
        T: 'static,
        U: 'static,
    {
        if self.value.is_none() || other.value.is_none() {
            // Both are dropped as they are: the one still holding its value waits for its work.
            return Err(already_handed_back());
        }
        let (Some(a), Some(b)) = (self.value.take(), other.value.take()) else { unreachable!("both checked above") };
        let settle = match (self.settle.take(), other.settle.take()) {
            (None, None) => None,
            (first, second) => Some(Box::new(move |(a, b): &mut (T, U)| {
                if let Some(first) = first {
                    first(a);
                }
                if let Some(second) = second {
                    second(b);
                }
            }) as Settle<(T, U)>),
        };
        let mut fences = std::mem::take(&mut self.fences);
        fences.append(&mut other.fences);
        let mut jobs = std::mem::take(&mut self.jobs);
        jobs.append(&mut other.jobs);
        let failed = self.failed.take().or(other.failed.take());
        Ok(Pending {
            value: Some((a, b)),
            stream: self.stream.clone(),
            fences,
            jobs,
            settle,
            woken_by: self.woken_by,
            wake: None,
            failed,
        })
    }

    /// Keeps `kept` (memory the work still uses, e.g. a staging block) until completion, where
    /// `settle` may read it into the value; the value becomes what `split` leaves.
    pub(crate) fn keep_apart<U, K>(
        mut self,
        split: impl FnOnce(T) -> (U, K),
        settle: Option<fn(&K, &mut U)>,
    ) -> Pending<U>
    where
        U: 'static,
        K: Send + 'static,
    {
        debug_assert!(self.settle.is_none(), "only fresh work is split");
        let value = self.value.take().expect("a Pending holds its value until handed back");
        let (value, kept) = split(value);
        let settle: Settle<U> = Box::new(move |value: &mut U| {
            if let Some(settle) = settle {
                settle(&kept, value);
            }
        });
        let (fences, jobs) = (std::mem::take(&mut self.fences), std::mem::take(&mut self.jobs));
        let failed = self.failed.take();
        Pending {
            value: Some(value),
            stream: self.stream.clone(),
            fences,
            jobs,
            settle: Some(settle),
            woken_by: self.woken_by,
            wake: None,
            failed,
        }
    }

    /// Blocks until every job and every fence has completed.
    fn complete_blocking(&mut self) -> Result<()> {
        self.join_jobs()?;
        self.fences.iter().try_for_each(|fence| fence.synchronize())
    }

    /// Makes `stream` wait (on the device) for all the work on the value; jobs are joined first
    /// (their host part must be done before their events exist).
    fn order_after_work(&mut self, stream: &Stream) -> Result<()> {
        self.join_jobs()?;
        self.fences.iter().try_for_each(|fence| stream.wait_event(fence))
    }

    /// Blocks until every job has finished and keeps their events as fences. A failure is kept
    /// (see `failed`) and returned now and by every later wait.
    fn join_jobs(&mut self) -> Result<()> {
        while let Some(job) = self.jobs.pop() {
            match job.join() {
                Ok(events) => self.fences.extend(events.into_iter().map(Arc::new)),
                Err(err) => self.failed = Some(Box::new(err)),
            }
        }
        match &self.failed {
            Some(err) => Err((**err).clone()),
            None => Ok(()),
        }
    }

    /// The value, after its host step; called once the work has completed.
    fn hand_back(&mut self) -> T {
        let mut value = self.value.take().expect("a Pending holds its value until handed back");
        if let Some(settle) = self.settle.take() {
            settle(&mut value);
        }
        value
    }

    /// A wake-up for when every fence has completed, as `woken_by` says.
    fn arm(&self) -> Result<Armed> {
        match self.woken_by {
            WakeUp::HostFunction => {
                let fences: Vec<&Event> = self.fences.iter().map(|fence| &**fence).collect();
                Completion::after_events(self.stream.device(), &fences).map(Armed::HostFunction)
            }
            WakeUp::WatcherThread => {
                let probes = self.fences.iter().map(|fence| Arc::clone(fence) as Arc<dyn Probe>).collect();
                Ok(Armed::Watcher(Watcher::global()?.watch(probes)))
            }
        }
    }

    /// Leaks the value and what the work still used, and returns `err`.
    fn leak(&mut self, err: crate::CudaError) -> crate::CudaError {
        std::mem::forget(self.value.take());
        std::mem::forget(self.settle.take());
        err
    }
}

/// The error of using a `Pending` whose value was already handed back (by `.await`).
fn already_handed_back() -> crate::CudaError {
    polled_after_completion("Pending (its buffers were already handed back)")
}

/// True when every event has completed.
fn all_complete<E: std::borrow::Borrow<Event>>(events: &[E]) -> Result<bool> {
    for event in events {
        if !event.borrow().is_complete()? {
            return Ok(false);
        }
    }
    Ok(true)
}

impl<T> Future for Pending<T> {
    type Output = Result<T>;

    /// Resolves with the buffers once the work has completed. Host work of a staged copy wakes
    /// the task from its lane thread; GPU work through `cudaLaunchHostFunc` on a helper stream
    /// that waits for the fences, so nothing queued later on the stream delays the wake-up (or
    /// through the watcher thread: [`Pending::woken_by`]). With a host function the waker must
    /// not call CUDA inline (see [`Completion`]). Polling again after `Ready` gives an
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) error.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = self.get_mut();
        if this.value.is_none() {
            return Poll::Ready(Err(polled_after_completion("Pending")));
        }
        while let Some(job) = this.jobs.last() {
            match job.poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(events)) => {
                    this.jobs.pop();
                    this.fences.extend(events.into_iter().map(Arc::new));
                }
                Poll::Ready(Err(err)) => {
                    this.jobs.pop();
                    this.failed = Some(Box::new(err));
                }
            }
        }
        if let Some(err) = this.failed.clone() {
            return Poll::Ready(Err(this.leak(*err)));
        }
        // Armed at an earlier poll: the wake-up alone says when the work is done.
        if this.wake.is_none() {
            match all_complete(&this.fences) {
                Ok(true) => return Poll::Ready(Ok(this.hand_back())),
                Ok(false) => {}
                Err(err) => return Poll::Ready(Err(this.leak(err))),
            }
            match this.arm() {
                Ok(wake) => this.wake = Some(wake),
                Err(err) => return Poll::Ready(Err(this.leak(err))),
            }
        }
        let done = match this.wake.as_mut().expect("armed above") {
            Armed::HostFunction(completion) => Pin::new(completion).poll(cx),
            Armed::Watcher(watch) => Pin::new(watch).poll(cx),
        };
        match done {
            Poll::Pending => Poll::Pending,
            // The helper stream ran the wake-up after waiting for every fence, or the watcher saw
            // every fence complete (all of them: the jobs were drained before it was armed), so
            // no query is needed.
            Poll::Ready(Ok(())) => Poll::Ready(Ok(this.hand_back())),
            Poll::Ready(Err(err)) => Poll::Ready(Err(this.leak(err))),
        }
    }
}

impl<T> Drop for Pending<T> {
    /// Blocks until the work has completed, then drops the buffers; on failure leaks them.
    fn drop(&mut self) {
        if self.value.is_none() {
            return;
        }
        if self.complete_blocking().is_err() {
            std::mem::forget(self.value.take());
            std::mem::forget(self.settle.take());
        }
    }
}
