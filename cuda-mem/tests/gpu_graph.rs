//! GPU tests of CUDA graphs: capture, launch, update, graph memory, failure paths. Ignored where
//! no GPU exists. The compile-time half (borrows held by graphs) is the compile-fail doc tests
//! on `Graph` and `GraphExec`.
//!
//! A capture in `CaptureMode::Global` makes the runtime refuse unsafe calls (`cudaMalloc`,
//! `cudaMallocHost`, ...) on every thread of the process and invalidates a global capture that
//! meets one, so the tests that capture globally are `gpu_alone_global_*`: run one at a time,
//! after the others.

mod common;

use common::{KIB, assert_same, pattern};
use cuda_mem::*;

fn pinned_from(data: &[u32]) -> PinnedBuffer<u32> {
    PinnedBuffer::from_slice(data, HostAllocFlags::empty()).unwrap()
}

/// Input slot -> device -> output slot; every launch sees the input written before it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_capture_launch_and_verify_with_new_input_each_launch() {
    let stream = Stream::non_blocking().unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(64 * KIB).unwrap();
    let mut input = PinnedBuffer::<u32>::zeroed(device.len()).unwrap();
    let mut output = PinnedBuffer::<u32>::zeroed(device.len()).unwrap();
    let mut view = device.as_mut_slice();
    let (graph, (inp, out)) = stream
        .capture_with(CaptureMode::ThreadLocal, |s| {
            let inp = s.copy_from_host_slot(&mut view, &mut input)?;
            let out = s.copy_to_host_slot(&mut output, &view)?;
            Ok((inp, out))
        })
        .unwrap();
    assert!(!stream.is_capturing().unwrap());
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    for round in 0..8 {
        let want = pattern(64 * KIB, round);
        exec.host_mut(&inp).unwrap().copy_from_slice(&want);
        exec.launch(&stream).unwrap();
        assert_same(exec.host(&out).unwrap(), &want);
    }
    drop(exec);
    assert_eq!(device.to_vec().unwrap(), pattern(64 * KIB, 7), "the last launch's data stays");
}

/// Many launches queued in one `run`, each adding one step of a chain of copies.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_global_run_queues_many_launches_and_waits_once() {
    if common::skip_unless_alone() {
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let source = DeviceBuffer::from_slice(&pattern(4096, 9)).unwrap();
    let mut target = DeviceBuffer::<u32>::zeroed(4096).unwrap();
    let mut view = target.as_mut_slice();
    let graph = stream.capture(CaptureMode::Global, |s| s.copy_from_device(&mut view, source.as_slice())).unwrap();
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    let launched = exec
        .run(&stream, |l| {
            for _ in 0..1000 {
                l.launch()?;
            }
            Ok(1000)
        })
        .unwrap();
    assert_eq!(launched, 1000);
    drop(exec);
    assert_same(&target.to_vec().unwrap(), &pattern(4096, 9));
}

/// `update` to a graph of the same shape reads the new source; another shape is refused with
/// the runtime's reason and the executable graph keeps working.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_update_swaps_parameters_and_refusals_are_typed() {
    let stream = Stream::non_blocking().unwrap();
    let mut scratch = DeviceBuffer::<u32>::zeroed(1024).unwrap();
    let a = DeviceBuffer::from_slice(&pattern(1024, 1)).unwrap();
    let b = DeviceBuffer::from_slice(&pattern(1024, 2)).unwrap();
    let mut out_a = PinnedBuffer::<u32>::zeroed(1024).unwrap();
    let mut out_b = PinnedBuffer::<u32>::zeroed(1024).unwrap();
    let mut out_c = PinnedBuffer::<u32>::zeroed(1024).unwrap();
    let (graph, slot_a) =
        stream.capture_with(CaptureMode::ThreadLocal, |s| s.copy_to_host_slot(&mut out_a, a.as_slice())).unwrap();
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    exec.launch(&stream).unwrap();
    assert_same(exec.host(&slot_a).unwrap(), &pattern(1024, 1));

    let (graph_b, slot_b) =
        stream.capture_with(CaptureMode::ThreadLocal, |s| s.copy_to_host_slot(&mut out_b, b.as_slice())).unwrap();
    exec.update(graph_b).unwrap();
    exec.launch(&stream).unwrap();
    assert_same(exec.host(&slot_b).unwrap(), &pattern(1024, 2));

    let mut scratch_view = scratch.as_mut_slice();
    let other_shape = stream
        .capture(CaptureMode::ThreadLocal, |s| {
            s.copy_from_device(&mut scratch_view, a.as_slice())?;
            s.copy_to_host(&mut out_c, &scratch_view)
        })
        .unwrap();
    let err = exec.update(other_shape).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::GraphUpdateRefused(_)), "{err}");
    exec.host_mut(&slot_b).unwrap().fill(0);
    exec.launch(&stream).unwrap();
    assert_same(exec.host(&slot_b).unwrap(), &pattern(1024, 2));
}

/// Temporaries are graph memory: data flows through them, their address is the same at every
/// launch, and a view that escapes the capture is refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_temporaries_are_graph_memory_and_escaped_views_are_refused() {
    let stream = Stream::non_blocking().unwrap();
    let mut input = pinned_from(&pattern(8192, 5));
    let mut output = PinnedBuffer::<u32>::zeroed(8192).unwrap();
    let (graph, (escaped, out)) = stream
        .capture_with(CaptureMode::ThreadLocal, |s| {
            let mut first = s.temporary::<u32>(8192)?;
            let mut second = s.temporary::<u32>(8192)?;
            s.copy_from_host(&mut first, &input)?;
            s.copy_from_device(&mut second, &first)?;
            let out = s.copy_to_host_slot(&mut output, &second)?;
            Ok((second, out))
        })
        .unwrap();
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    for _ in 0..3 {
        exec.host_mut(&out).unwrap().fill(0);
        exec.launch(&stream).unwrap();
        assert_same(exec.host(&out).unwrap(), &pattern(8192, 5));
    }
    let err = escaped.to_vec().unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    let mut host = vec![0u32; 8192];
    let err = stream.try_scope(|s| s.copy_to_host(&mut host, &escaped)).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    drop(exec);
    input.fill(0); // the borrows end with the executable graph
}

/// A `StreamBuffer` allocated and freed inside the capture is an allocation and a free node:
/// the graph runs, and the stream is an ordinary stream again afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_stream_buffers_allocated_and_freed_in_a_capture_become_memory_nodes() {
    let stream = Stream::non_blocking().unwrap();
    let graph = stream
        .capture(CaptureMode::ThreadLocal, |s| {
            let mut buffer = StreamBuffer::<u32>::zeroed(s.stream(), 1 << 20)?;
            buffer.set_bytes_async(0x11)?;
            buffer.free()
        })
        .unwrap();
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    for _ in 0..4 {
        exec.launch(&stream).unwrap();
    }
    let eager = StreamBuffer::<u32>::zeroed(&stream, 16).unwrap();
    assert_eq!(eager.as_slice().to_vec().unwrap(), vec![0; 16]);
}

/// A synchronize inside a capture is the runtime's typed error; the capture fails, nothing
/// leaks, and the stream can be used and captured again.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_synchronize_inside_a_capture_is_a_typed_error_and_the_stream_recovers() {
    let stream = Stream::non_blocking().unwrap();
    let err = stream.capture(CaptureMode::ThreadLocal, |s| s.stream().synchronize()).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::STREAM_CAPTURE_UNSUPPORTED), "{err}");
    assert!(!stream.is_capturing().unwrap());
    stream_still_works(&stream);
}

/// A capture refuses `cudaMalloc` on its thread (and the refused call ends the capture), but not
/// `DeviceBuffer::uninit_relaxed`, whose memory, no part of the graph, outlives it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_relaxed_allocations_succeed_inside_a_capture_and_plain_ones_are_refused() {
    let stream = Stream::non_blocking().unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(KIB).unwrap();
    let mut view = device.as_mut_slice();
    let mut relaxed = None;
    let graph = stream
        .capture(CaptureMode::ThreadLocal, |s| {
            // SAFETY: written below before it is read.
            relaxed = Some(unsafe { DeviceBuffer::<u32>::uninit_relaxed(KIB) }?);
            s.set_bytes(&mut view, 7)
        })
        .unwrap();
    let mut relaxed = relaxed.unwrap();
    relaxed.as_mut_slice().copy_from_host(&pattern(KIB, 3)).unwrap();
    assert_same(&relaxed.to_vec().unwrap(), &pattern(KIB, 3));
    graph.instantiate(GraphFlags::empty()).unwrap().launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert!(device.to_vec().unwrap().iter().all(|&w| w == 0x0707_0707), "the graph ran");

    // SAFETY: never read (the allocation is refused).
    let err = stream.capture(CaptureMode::ThreadLocal, |_| unsafe { DeviceBuffer::<u32>::uninit(KIB) }.map(drop));
    let err = err.map(drop).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::STREAM_CAPTURE_UNSUPPORTED), "{err}");
    stream_still_works(&stream);
}

/// The capture records on a private stream: the stream `capture` was called on (and its clones,
/// on any thread) stays an ordinary stream while the closure runs, so work queued through it runs
/// now and none of it slips into the graph past the scope's borrow checks. (A synchronize of it
/// from the capturing thread is still refused by the runtime in thread-local and global modes,
/// and fails the capture: the H200 run of f40310b.) Before, a buffer freed through the outer stream inside the capture could be
/// handed out again while the graph, launched later, still wrote it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_work_on_the_captured_stream_itself_runs_now_and_stays_out_of_the_graph() {
    let stream = Stream::non_blocking().unwrap();
    let mut outer = StreamBuffer::<u32>::zeroed(&stream, 4096).unwrap();
    let mut inner = DeviceBuffer::<u32>::zeroed(4096).unwrap();
    let mut view = inner.as_mut_slice();
    let graph = stream
        .capture(CaptureMode::ThreadLocal, |s| {
            assert!(!stream.is_capturing()?, "the outer stream must not capture");
            assert!(s.stream().is_capturing()?, "the scope's stream captures");
            outer.set_bytes_async(0x5A)?; // queued on the outer stream: runs now
            s.set_bytes(&mut view, 0x11)
        })
        .unwrap();
    assert!(outer.as_slice().to_vec().unwrap().iter().all(|&x| x == 0x5A5A_5A5A), "outer work ran during the capture");
    outer.set_bytes_async(0).unwrap();
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert!(outer.as_slice().to_vec().unwrap().iter().all(|&x| x == 0), "the graph replayed outer work");
    drop(exec);
    assert!(inner.to_vec().unwrap().iter().all(|&x| x == 0x1111_1111), "the graph did its own work");
    stream_still_works(&stream);
}

/// A closure that fails or panics ends the capture and destroys the partial graph.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_global_failed_and_panicking_captures_end_the_capture() {
    if common::skip_unless_alone() {
        return;
    }
    let stream = Stream::non_blocking().unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(256).unwrap();
    let mut view = device.as_mut_slice();
    let mine = CudaError::new(ErrorKind::InvalidArgument("mine"), "test");
    let err = stream
        .capture(CaptureMode::Global, |s| {
            s.set_bytes(&mut view, 1)?;
            s.temporary::<u8>(4096)?;
            assert!(s.stream().capture_id().unwrap().is_some());
            assert_eq!(stream.capture_id().unwrap(), None, "the capture records on a stream of its own");
            Err(mine.clone())
        })
        .unwrap_err();
    assert_eq!(err, mine);
    assert!(!stream.is_capturing().unwrap());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = stream.capture(CaptureMode::Global, |s| -> Result<()> {
            s.temporary::<u8>(4096)?;
            panic!("inside the capture")
        });
    }));
    assert!(panicked.is_err());
    assert!(!stream.is_capturing().unwrap());
    assert_eq!(stream.capture_id().unwrap(), None);
    stream_still_works(&stream);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_global_builtin_streams_are_not_captured_and_slots_of_other_graphs_are_refused() {
    if common::skip_unless_alone() {
        return;
    }
    let legacy = Stream::legacy_default().unwrap();
    let err = legacy.capture(CaptureMode::Global, |_| Ok(())).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    let stream = Stream::non_blocking().unwrap();
    let src = DeviceBuffer::from_slice(&[1u32; 8]).unwrap();
    let (mut one, mut two) = (PinnedBuffer::<u32>::zeroed(8).unwrap(), PinnedBuffer::<u32>::zeroed(8).unwrap());
    let (g1, _) = stream.capture_with(CaptureMode::Global, |s| s.copy_to_host_slot(&mut one, src.as_slice())).unwrap();
    let (_g2, s2) =
        stream.capture_with(CaptureMode::Global, |s| s.copy_to_host_slot(&mut two, src.as_slice())).unwrap();
    let exec = g1.instantiate(GraphFlags::empty()).unwrap();
    let err = exec.host(&s2).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
}

/// Graph memory shows in the device's figures while an executable graph holds it, stays flat
/// over launches, and goes back to the system on trim once the executable graph is gone.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_graph_memory_figures_follow_temporaries_and_trim() {
    if common::skip_unless_alone() {
        return;
    }
    let device = Device::current().unwrap();
    let stream = Stream::non_blocking().unwrap();
    device.graph_mem_trim().unwrap();
    device.reset_graph_mem_peaks().unwrap();
    let bytes = 3 << 20;
    let graph = stream
        .capture(CaptureMode::ThreadLocal, |s| {
            let mut t = s.temporary::<u8>(bytes)?;
            s.set_bytes(&mut t, 3)
        })
        .unwrap();
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    exec.launch(&stream).unwrap();
    let first = device.graph_mem_stats().unwrap();
    assert!(first.reserved.current >= bytes, "{first:?}");
    assert!(first.used.peak >= bytes, "{first:?}");
    exec.run(&stream, |l| (0..100).try_for_each(|_| l.launch())).unwrap();
    let later = device.graph_mem_stats().unwrap();
    assert_eq!(later.reserved.current, first.reserved.current, "flat over launches");
    assert_eq!(later.reserved.peak, first.reserved.peak);
    drop(exec);
    device.graph_mem_trim().unwrap();
    let trimmed = device.graph_mem_stats().unwrap();
    assert!(trimmed.reserved.current < first.reserved.current, "{trimmed:?} after {first:?}");
}

/// Captures a graph whose output is `len` words copied from the input slot: every launch writes
/// the output anew from what the slot holds.
fn output_graph<'env>(stream: &'env Stream, input: &'env mut [u32]) -> (Graph<'env>, HostSlot<u32>, GraphOutput<u32>) {
    let len = input.len();
    let (graph, (slot, key)) = stream
        .capture_with(CaptureMode::ThreadLocal, |s| {
            let (mut out, key) = s.output::<u32>(len)?;
            let slot = s.copy_from_host_slot(&mut out, input)?;
            Ok((slot, key))
        })
        .unwrap();
    (graph, slot, key)
}

/// Outputs exist only after a launch, hold what each launch wrote, can be written in place
/// between launches, and keys of other graphs are refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_graph_outputs_hold_each_launch_result_and_are_refused_before_the_first() {
    let stream = Stream::non_blocking().unwrap();
    let mut input = pinned_from(&pattern(4096, 1));
    let mut other_input = pinned_from(&pattern(4096, 9)); // outlives `exec`, which `update` may borrow it for
    let (graph, slot, key) = output_graph(&stream, &mut input);
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap(); // AUTO_FREE_ON_LAUNCH added
    let err = exec.output(&key).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    for round in 0..6 {
        let want = pattern(4096, round);
        exec.host_mut(&slot).unwrap().copy_from_slice(&want);
        exec.launch(&stream).unwrap();
        assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &want);
        exec.output_mut(&key).unwrap().copy_from_host(&[7; 4096]).unwrap();
        assert_eq!(exec.output(&key).unwrap().to_vec().unwrap(), vec![7; 4096]);
    }
    exec.run(&stream, |l| (0..50).try_for_each(|_| l.launch())).unwrap();
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &pattern(4096, 5));
    let err =
        exec.run(&stream, |l| l.launch().and(Err::<(), _>(CudaError::new(ErrorKind::InvalidArgument("mine"), "test"))));
    assert!(err.is_err());
    let err = exec.output(&key).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "a failed run leaves the output unknown: {err}");
    exec.launch(&stream).unwrap();
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &pattern(4096, 5));

    let (other, _, other_key) = output_graph(&stream, &mut other_input);
    let err = exec.output(&other_key).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    let err = exec.update(other).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &pattern(4096, 5));
}

/// Graph memory of outputs stays flat over many launches (each frees the last one's outputs
/// before allocating its own) and is handed back once the executable graph drops (it frees what
/// the last launch left allocated) and the device's graph memory is trimmed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alone_graph_outputs_do_not_leak_across_launches_or_after_the_drop() {
    if common::skip_unless_alone() {
        return;
    }
    let device = Device::current().unwrap();
    let stream = Stream::non_blocking().unwrap();
    device.graph_mem_trim().unwrap();
    let before = device.graph_mem_stats().unwrap();
    let len = 1 << 20;
    let bytes = len * size_of::<u32>();
    let mut input = PinnedBuffer::<u32>::zeroed(len).unwrap();
    let (graph, slot, key) = output_graph(&stream, &mut input);
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    let mut held = None;
    for round in 0..10 {
        let want = pattern(len, round);
        exec.host_mut(&slot).unwrap().copy_from_slice(&want);
        exec.launch(&stream).unwrap();
        assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &want);
        let stats = device.graph_mem_stats().unwrap();
        assert!(stats.used.current >= before.used.current + bytes, "round {round}: {stats:?} after {before:?}");
        match held {
            None => held = Some(stats),
            Some(first) => {
                assert_eq!(stats.used.current, first.used.current, "used flat at round {round}: {stats:?}");
                assert_eq!(stats.reserved.current, first.reserved.current, "reserved flat at round {round}");
            }
        }
    }
    exec.run(&stream, |l| (0..200).try_for_each(|_| l.launch())).unwrap();
    let held = held.unwrap();
    let later = device.graph_mem_stats().unwrap();
    assert_eq!(later.used.current, held.used.current, "used flat over run: {later:?}");
    assert_eq!(later.reserved.current, held.reserved.current, "reserved flat over run: {later:?}");
    drop(exec); // frees the output on the launch stream
    stream.synchronize().unwrap();
    device.graph_mem_trim().unwrap();
    let after = device.graph_mem_stats().unwrap();
    assert_eq!(after.used.current, before.used.current, "{after:?}, before {before:?}, held {held:?}");
    assert!(after.reserved.current < held.reserved.current, "{after:?}, held {held:?}");
    input.fill(0); // the borrows end with the executable graph
}

fn stream_still_works(stream: &Stream) {
    let mut device = DeviceBuffer::<u32>::zeroed(512).unwrap();
    let mut back = vec![0u32; 512];
    let want = pattern(512, 4);
    let mut view = device.as_mut_slice();
    stream.try_scope(|s| s.copy_from_host(&mut view, &want).and_then(|()| s.copy_to_host(&mut back, &view))).unwrap();
    assert_same(&back, &want);
    let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.set_bytes(&mut view, 0)).unwrap();
    graph.instantiate(GraphFlags::empty()).unwrap().launch(stream).unwrap();
}

/// A stream for graphs that own everything they use (`GraphExec<'static>`): a capture borrows
/// its stream for the graph's `'env`.
fn static_stream() -> &'static Stream {
    Box::leak(Box::new(Stream::non_blocking().unwrap()))
}

/// Captures a graph that rotates `words` right by one word at every launch and copies the result
/// into its output: after k launches the output is `initial` rotated right by k, whatever the
/// streams or scopes the launches were queued in. No kernel: copies through a temporary.
fn rotating_graph<'env>(stream: &'env Stream, words: DeviceSliceMut<'env, u32>) -> (Graph<'env>, GraphOutput<u32>) {
    let n = words.len();
    stream
        .capture_with(CaptureMode::ThreadLocal, move |s| {
            let mut tmp = s.temporary::<u32>(n)?;
            s.copy_from_device(&mut tmp, &words)?;
            let (front, back) = tmp.split_at_mut(n - 1)?;
            let (mut first, mut rest) = words.split_at_mut(1)?;
            s.copy_from_device(&mut first, &back)?;
            s.copy_from_device(&mut rest, &front)?;
            let (out, key) = s.output::<u32>(n)?;
            let (mut out_first, mut out_rest) = out.split_at_mut(1)?;
            s.copy_from_device(&mut out_first, &first)?;
            s.copy_from_device(&mut out_rest, &rest)?;
            Ok(key)
        })
        .unwrap()
}

fn rotated(initial: &[u32], k: usize) -> Vec<u32> {
    let mut words = initial.to_vec();
    words.rotate_right(k % initial.len());
    words
}

/// `launch_pending` returns while its stream is held by a gate (so it queued without a host
/// wait), and the executable graph comes back through `wait`; more launches are queued without
/// waits through `then`, `then_on` another stream and `Stream::queue`, and through `.await`;
/// every result counts every launch, and the waiting `launch` still works afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_launch_pending_queues_without_a_host_wait_and_gives_the_graph_back() {
    let stream = static_stream();
    let other = Stream::non_blocking().unwrap();
    let initial = pattern(4096, 3);
    let words: &'static mut DeviceBuffer<u32> = Box::leak(Box::new(DeviceBuffer::from_slice(&initial).unwrap()));
    let (graph, key) = rotating_graph(stream, words.as_mut_slice());
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    let mut launches = 0;
    for attempt in 0.. {
        assert!(attempt < 5, "the gate ran out of time in 5 attempts");
        let gate = common::Gate::hold(stream);
        let pending = exec.launch_pending(stream).unwrap();
        launches += 1;
        let unfinished = !pending.is_done().unwrap();
        let held = gate.release();
        exec = pending.wait().unwrap();
        if held {
            assert!(unfinished, "the launch ran behind the closed gate");
            break;
        }
    }
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &rotated(&initial, launches));

    let pending = exec.launch_pending(stream).unwrap();
    let pending = pending.then(|s, exec| exec.launches_in(s)?.launch()).unwrap();
    let pending = pending
        .then_on(&other, |s, exec| {
            let l = exec.launches_in(s)?;
            (0..3).try_for_each(|_| l.launch())
        })
        .unwrap();
    let mut exec = pending.wait().unwrap();
    launches += 5;
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &rotated(&initial, launches));

    let (back, _) = common::block_on(stream.queue(exec, |s, exec| exec.launches_in(s)?.launch()).unwrap());
    exec = back.unwrap();
    launches += 1;
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &rotated(&initial, launches));
    exec.launch(stream).unwrap();
    launches += 1;
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &rotated(&initial, launches));
}

/// A forgotten `Pending` leaks the executable graph and what it uses, nothing worse: the stream
/// goes on. A dropped one waits for its launch before the graph is dropped. Launches in a capture
/// scope are refused.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_forgotten_and_dropped_pending_launches_are_safe() {
    let stream = static_stream();
    let initial = pattern(4096, 8);
    let words: &'static mut DeviceBuffer<u32> = Box::leak(Box::new(DeviceBuffer::from_slice(&initial).unwrap()));
    let (graph, key) = rotating_graph(stream, words.as_mut_slice());
    let exec = graph.instantiate(GraphFlags::empty()).unwrap();
    let exec = exec.launch_pending(stream).unwrap().wait().unwrap();
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &rotated(&initial, 1));
    let pending = exec.launch_pending(stream).unwrap();
    let pending = pending
        .then(|s, exec| {
            let l = exec.launches_in(s)?;
            (0..10).try_for_each(|_| l.launch())
        })
        .unwrap();
    std::mem::forget(pending);
    stream.synchronize().unwrap();
    stream_still_works(stream);

    let mut words = DeviceBuffer::from_slice(&initial).unwrap();
    let (graph, key) = rotating_graph(stream, words.as_mut_slice());
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    let refused = stream.capture(CaptureMode::ThreadLocal, |s| exec.launches_in(s).map(drop));
    let err = refused.map(drop).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    exec.launch(stream).unwrap();
    assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &rotated(&initial, 1));
    drop(exec);
    assert_same(&words.to_vec().unwrap(), &rotated(&initial, 1));

    let static_words: &'static mut DeviceBuffer<u32> = Box::leak(Box::new(DeviceBuffer::from_slice(&initial).unwrap()));
    let (graph, _) = rotating_graph(stream, static_words.as_mut_slice());
    let exec = graph.instantiate(GraphFlags::empty()).unwrap();
    drop(exec.launch_pending(stream).unwrap()); // waits, then frees the output
    stream_still_works(stream);
}

/// A borrowing graph's launches queued in a scope run without a wait each; the scope's end waits
/// once, and the results count every launch.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_launches_in_a_scope_are_waited_for_once_at_its_end() {
    let stream = Stream::non_blocking().unwrap();
    let initial = pattern(64 * KIB, 2);
    let mut words = DeviceBuffer::from_slice(&initial).unwrap();
    let (graph, key) = rotating_graph(&stream, words.as_mut_slice());
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    let mut launches = 0;
    for round in 1..=4 {
        stream
            .try_scope(|s| {
                let l = exec.launches_in(s)?;
                (0..round).try_for_each(|_| l.launch())
            })
            .unwrap();
        launches += round;
        assert_same(&exec.output(&key).unwrap().to_vec().unwrap(), &rotated(&initial, launches));
    }
    drop(exec);
    assert_same(&words.to_vec().unwrap(), &rotated(&initial, launches));
}
