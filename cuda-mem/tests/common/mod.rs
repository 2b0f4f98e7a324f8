//! Helpers shared by the GPU test binaries (cuda-mem-kernels' and cuda-mem-nccl's include this file
//! by path).
//!
//! GPU tests that need the device to themselves are named `gpu_alone_*`: those that assert on a
//! pool's reserve (the driver trims every pool of the process when an allocation fails for lack
//! of memory), those that make an allocation fail so, and those that no other test's synchronizing
//! call may disturb. Each starts with [`skip_unless_alone`], so that `cargo test --
//! --include-ignored` passes: there they skip with a line on stderr. `cargo xtask test` and the
//! bundle's `run` run every other test first (`--skip gpu_alone_`), then the `gpu_alone_` tests
//! one at a time (`gpu_alone_ --test-threads=1`). Test executables run one after another, so
//! nothing else uses the device meanwhile: the runners enforce it, where a lock would bind only the
//! tests that take it. Tests named `gpu2_*` need two GPUs and start with [`skip_unless_two_gpus`].
#![allow(dead_code)] // each test binary uses a different subset

/// A deterministic, non-trivial pattern (no zeros runs that would hide unwritten memory).
pub fn pattern(len: usize, seed: u32) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        })
        .collect()
}

/// FNV-1a over the words.
pub fn checksum(data: &[u32]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

/// Asserts equality by checksum first (cheap message), then by content.
#[track_caller]
pub fn assert_same(got: &[u32], want: &[u32]) {
    assert_eq!(got.len(), want.len(), "length");
    if checksum(got) != checksum(want) {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!("data differs first at element {first}: got {:#x}, want {:#x}", got[first], want[first]);
    }
}

/// Says on stderr that the running test is skipped and why. Written to the stream itself, past the
/// harness's capture of `eprintln!`, so that a plain `cargo test` shows it.
pub fn say_skipped(why: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("this test");
    let _ = writeln!(std::io::stderr(), "{test}: skipped: {why}");
}

/// For a `gpu2_` test: true (the test returns at once, having said why) on a host with fewer than
/// two GPUs, so that `cargo test -- --include-ignored` passes on a one-GPU host.
pub fn skip_unless_two_gpus() -> bool {
    let gpus = cuda_mem::Device::count().expect("counting the GPUs");
    if gpus >= 2 {
        return false;
    }
    say_skipped(&format!("needs two CUDA GPUs, this host has {gpus}"));
    true
}

/// For a `gpu_alone_` test: true (the test returns at once, having said how to run it) unless the
/// harness runs one test at a time, as no other test may use the device meanwhile.
pub fn skip_unless_alone() -> bool {
    if harness_runs_one_test_at_a_time() {
        return false;
    }
    say_skipped("needs the device to itself; run alone: cargo test -- --include-ignored gpu_alone_ --test-threads=1");
    true
}

/// libtest's thread count is 1: `--test-threads=1` or `--test-threads 1` (which wins over the
/// environment), else `RUST_TEST_THREADS=1`.
fn harness_runs_one_test_at_a_time() -> bool {
    let mut args = std::env::args().skip(1);
    let mut threads = None;
    while let Some(arg) = args.next() {
        if arg == "--test-threads" {
            threads = args.next();
        } else if let Some(value) = arg.strip_prefix("--test-threads=") {
            threads = Some(value.to_owned());
        }
    }
    let threads = threads.or_else(|| std::env::var("RUST_TEST_THREADS").ok());
    threads.is_some_and(|n| n.parse() == Ok(1usize))
}

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// Polls `future` on this thread until it is ready, parking in between (no async runtime): the
/// tests of cuda-mem's futures need nothing else. Returns the output and the thread the last wake
/// came from (a wake from the CUDA runtime's host-function thread shows the GPU woke the task).
pub fn block_on<F: std::future::Future>(future: F) -> (F::Output, Option<std::thread::ThreadId>) {
    block_on_then(future, || {})
}

/// [`block_on`], running `after_first_poll` once the first poll has returned (and registered the
/// waker): releasing a [`Gate`] there makes the wake come from the GPU deterministically.
pub fn block_on_then<F: std::future::Future>(
    future: F,
    after_first_poll: impl FnOnce(),
) -> (F::Output, Option<std::thread::ThreadId>) {
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark {
        thread: std::thread::Thread,
        woken_from: Mutex<Option<std::thread::ThreadId>>,
    }
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            *self.woken_from.lock().unwrap() = Some(std::thread::current().id());
            self.thread.unpark();
        }
    }

    let unpark = Arc::new(Unpark { thread: std::thread::current(), woken_from: Mutex::new(None) });
    let waker = Waker::from(Arc::clone(&unpark));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    let mut after_first_poll = Some(after_first_poll);
    loop {
        let polled = future.as_mut().poll(&mut cx);
        if let Some(after) = after_first_poll.take() {
            after();
        }
        if let Poll::Ready(output) = polled {
            return (output, *unpark.woken_from.lock().unwrap());
        }
        std::thread::park();
    }
}

/// A host function that holds a stream until [`Gate::release`] (or the gate's drop), so work
/// queued behind it stays pending while the test thread makes its first poll.
///
/// The hold is bounded by [`GATE_LIMIT`]. A host function must not wait for anything that needs a
/// CUDA call to happen first, and an unbounded gate does: while it holds the stream, another test
/// thread's `cudaFree` or `cudaFreeHost` waits for the device to drain and blocks every other
/// thread's CUDA calls meanwhile, the gating thread's included, so nobody ever releases it. A
/// bounded gate turns that deadlock into a stall; [`Gate::release`] says whether the gate was
/// still closed, and [`until_held`] retries a check whose gate opened by itself.
pub struct Gate(std::sync::Arc<(std::sync::Mutex<GateState>, std::sync::Condvar)>);

/// How long a gate holds its stream at most.
pub const GATE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateState {
    Closed,
    Released,
    TimedOut,
}

impl Gate {
    /// Holds `stream` until the gate is released, or for [`GATE_LIMIT`].
    pub fn hold(stream: &cuda_mem::Stream) -> Gate {
        type State = (std::sync::Mutex<GateState>, std::sync::Condvar);
        unsafe extern "C" fn wait(data: *mut std::ffi::c_void) {
            // SAFETY: `data` came from `Arc::into_raw` below, handed to this one call.
            let state = unsafe { std::sync::Arc::from_raw(data.cast_const().cast::<State>()) };
            let guard = state.0.lock().unwrap();
            let (mut gate, _) =
                state.1.wait_timeout_while(guard, GATE_LIMIT, |gate| *gate == GateState::Closed).unwrap();
            if *gate == GateState::Closed {
                *gate = GateState::TimedOut;
            }
        }
        let state = std::sync::Arc::new((std::sync::Mutex::new(GateState::Closed), std::sync::Condvar::new()));
        let data = std::sync::Arc::into_raw(std::sync::Arc::clone(&state)).cast_mut().cast();
        // SAFETY: a valid stream, a callback that makes no CUDA call and waits a bounded time,
        // and one Arc reference as data, reclaimed by the callback.
        let code = unsafe { cuda_mem::sys::cudaLaunchHostFunc(stream.as_raw(), Some(wait), data) };
        assert_eq!(code, cuda_mem::sys::cudaError::cudaSuccess, "cudaLaunchHostFunc");
        Gate(state)
    }

    /// Lets the stream go on. True when the gate was still closed, so the stream was held until
    /// now; false when its time ran out first.
    pub fn release(&self) -> bool {
        let mut gate = self.0.0.lock().unwrap();
        let held = *gate == GateState::Closed;
        if held {
            *gate = GateState::Released;
        }
        self.0.1.notify_all();
        held
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}

/// Runs `attempt` (which returns whether its gate held, and its value) until its gate held, at
/// most 5 times: an attempt whose gate ran out of time before the test got there proves nothing.
pub fn until_held<T>(mut attempt: impl FnMut() -> (bool, T)) -> T {
    for _ in 0..5 {
        let (held, value) = attempt();
        if held {
            return value;
        }
    }
    panic!("the gate ran out of time in 5 attempts: the test thread was blocked for {GATE_LIMIT:?} each time");
}

/// Holds `stream` for `millis` milliseconds with a host function that sleeps, so the work queued
/// behind it is surely pending meanwhile (the host function makes no CUDA call).
pub fn hold_stream(stream: &cuda_mem::Stream, millis: u64) {
    unsafe extern "C" fn sleep(data: *mut std::ffi::c_void) {
        std::thread::sleep(std::time::Duration::from_millis(data as u64));
    }
    // SAFETY: a valid stream, a callback that makes no CUDA call, and a plain number as data.
    let code = unsafe { cuda_mem::sys::cudaLaunchHostFunc(stream.as_raw(), Some(sleep), millis as *mut _) };
    assert_eq!(code, cuda_mem::sys::cudaError::cudaSuccess, "cudaLaunchHostFunc");
}
