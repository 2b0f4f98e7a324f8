//! The watcher over fake probes: what resolves a watch, who wakes it, and what becomes of watches
//! withdrawn or forgotten.

use super::*;
use crate::error::ErrorCode;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::thread::Thread;

/// A probe the test completes (or breaks) by hand.
#[derive(Default)]
struct Fake {
    /// 0 running, 1 complete, 2 failing.
    state: AtomicU8,
}

impl Fake {
    fn complete(&self) {
        self.state.store(1, Ordering::SeqCst);
    }
    fn fail(&self) {
        self.state.store(2, Ordering::SeqCst);
    }
}

impl Probe for Fake {
    fn is_complete(&self) -> Result<bool> {
        match self.state.load(Ordering::SeqCst) {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(CudaError::new(ErrorKind::Runtime(ErrorCode::NOT_SUPPORTED), "fake query")),
        }
    }
}

/// Unparks the test's thread and records which thread woke it.
struct Recorder {
    waiting: Thread,
    woken: AtomicBool,
    by: Mutex<Option<String>>,
}

impl std::task::Wake for Recorder {
    fn wake(self: Arc<Self>) {
        *lock(&self.by) = std::thread::current().name().map(str::to_owned);
        self.woken.store(true, Ordering::SeqCst);
        self.waiting.unpark();
    }
}

fn recorder() -> Arc<Recorder> {
    Arc::new(Recorder { waiting: std::thread::current(), woken: AtomicBool::new(false), by: Mutex::new(None) })
}

fn poll_with(watch: &mut Watch, recorder: &Arc<Recorder>) -> Poll<Result<()>> {
    let waker = Waker::from(Arc::clone(recorder));
    Pin::new(watch).poll(&mut Context::from_waker(&waker))
}

/// Parks until `recorder` is woken; a liveness bound, not a timing: ten seconds is ages.
fn until_woken(recorder: &Recorder) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !recorder.woken.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the watcher never woke the task");
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

fn probes(fakes: &[&Arc<Fake>]) -> Vec<Arc<dyn Probe>> {
    fakes.iter().map(|f| Arc::clone(f) as Arc<dyn Probe>).collect()
}

#[test]
fn a_watch_resolves_once_every_probe_has_completed_and_the_watcher_thread_wakes_it() {
    let watcher = Watcher::start().unwrap();
    let (first, second) = (Arc::new(Fake::default()), Arc::new(Fake::default()));
    let mut watch = watcher.watch(probes(&[&first, &second]));
    let recorder = recorder();
    assert!(poll_with(&mut watch, &recorder).is_pending());

    first.complete();
    // Many sweeps later the second probe still holds the watch back.
    std::thread::sleep(Duration::from_millis(20));
    assert!(!recorder.woken.load(Ordering::SeqCst), "woken with a probe still running");
    assert!(poll_with(&mut watch, &recorder).is_pending());

    second.complete();
    until_woken(&recorder);
    assert_eq!(lock(&recorder.by).as_deref(), Some("cuda-mem-watcher"));
    assert!(matches!(poll_with(&mut watch, &recorder), Poll::Ready(Ok(()))));
    assert_eq!(watcher.watching(), 0, "a fired watch leaves the list");
}

#[test]
fn a_failed_query_resolves_the_watch_with_its_error() {
    let watcher = Watcher::start().unwrap();
    let broken = Arc::new(Fake::default());
    let mut watch = watcher.watch(probes(&[&broken]));
    let recorder = recorder();
    assert!(poll_with(&mut watch, &recorder).is_pending());
    broken.fail();
    until_woken(&recorder);
    let Poll::Ready(Err(err)) = poll_with(&mut watch, &recorder) else { panic!("the failure was not reported") };
    assert_eq!(err.code(), Some(ErrorCode::NOT_SUPPORTED), "{err}");
}

#[test]
fn a_watch_of_completed_work_resolves_without_a_poll_before_it() {
    let watcher = Watcher::start().unwrap();
    let done = Arc::new(Fake::default());
    done.complete();
    let mut watch = watcher.watch(probes(&[&done]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while watcher.watching() != 0 {
        assert!(Instant::now() < deadline, "the watcher never swept the watch");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(poll_with(&mut watch, &recorder()), Poll::Ready(Ok(()))));
}

#[test]
fn a_dropped_watch_is_withdrawn_and_a_forgotten_one_leaves_once_complete() {
    let watcher = Watcher::start().unwrap();
    let running = Arc::new(Fake::default());
    let mut dropped = watcher.watch(probes(&[&running]));
    assert!(poll_with(&mut dropped, &recorder()).is_pending());
    drop(dropped);
    assert_eq!(watcher.watching(), 0);

    // Forgotten: its drop never runs. It is kept in a `ManuallyDrop` rather than leaked with
    // `mem::forget`, so that the test can check what a leak would leave and then free it: Miri's
    // leak check stays on for everything else.
    let forgotten = ManuallyDrop::new(watcher.watch(probes(&[&running])));
    assert_eq!(watcher.watching(), 1);
    running.complete();
    // The thread lets go of it: it leaves the list, and the thread's own reference goes too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while watcher.watching() != 0 || Arc::strong_count(&forgotten.watched) != 1 {
        assert!(Instant::now() < deadline, "a forgotten watch stayed after its work completed");
        std::thread::sleep(Duration::from_millis(1));
    }
    // So a forgotten watch leaks only what it owns itself; that is released here.
    drop(ManuallyDrop::into_inner(forgotten));
}

#[test]
fn watches_from_many_threads_all_resolve_in_any_completion_order() {
    const THREADS: usize = 4;
    const EACH: usize = 25;
    let watcher = Arc::new(Watcher::start().unwrap());
    let fakes: Vec<Arc<Fake>> = (0..THREADS * EACH).map(|_| Arc::new(Fake::default())).collect();
    std::thread::scope(|scope| {
        for share in fakes.chunks(EACH) {
            let watcher = Arc::clone(&watcher);
            scope.spawn(move || {
                for fake in share {
                    let mut watch = watcher.watch(probes(&[fake]));
                    let recorder = recorder();
                    if poll_with(&mut watch, &recorder).is_pending() {
                        until_woken(&recorder);
                    }
                    assert!(matches!(poll_with(&mut watch, &recorder), Poll::Ready(Ok(()))));
                }
            });
        }
        // Completed back to front, while the threads watch front to back.
        for fake in fakes.iter().rev() {
            fake.complete();
            std::thread::yield_now();
        }
    });
    assert_eq!(watcher.watching(), 0);
}
