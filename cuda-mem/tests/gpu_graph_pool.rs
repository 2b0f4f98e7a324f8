//! GPU tests of graph pools: captures allocating from a private pool (`CaptureScope::cached`),
//! graphs sharing one pool, the pool kept from eager users of the cache, and turns between graphs
//! of one pool. Ignored where no GPU exists.

mod common;

use common::{KIB, MIB, assert_same, pattern};
use cuda_mem::*;

/// The block sizes (in u32 elements) of the larger graph and the smaller one: a decode step's
/// activations at two batch sizes, the larger captured first (as with PyTorch's shared pools).
const LARGE: [usize; 4] = [6 * MIB, 3 * MIB, 768 * KIB, 64 * KIB];
const SMALL: [usize; 4] = [4 * MIB, 2 * MIB, 512 * KIB, 32 * KIB];

/// A graph that copies its input slot through every block of `sizes` (the first `len` elements of
/// each) into its output slot; the pool's blocks are the only device memory it uses.
struct Chain<'env> {
    exec: GraphExec<'env>,
    input: HostSlot<u32>,
    output: HostSlot<u32>,
}

fn capture_chain<'env>(
    stream: &'env Stream,
    pool: &GraphPool,
    sizes: &[usize],
    input: &'env mut [u32],
    output: &'env mut [u32],
) -> Result<Chain<'env>> {
    let len = input.len();
    let (graph, (input, output)) = stream.capture_with(CaptureMode::ThreadLocal, |s| {
        let mut views = Vec::new();
        for &elems in sizes {
            views.push(s.cached::<u32>(pool, elems)?.slice_mut(..len)?);
        }
        let input = s.copy_from_host_slot(&mut views[0], input)?;
        for i in 1..views.len() {
            let (done, rest) = views.split_at_mut(i);
            s.copy_from_device(&mut rest[0], &done[i - 1])?;
        }
        let last = views.last().expect("sizes are not empty");
        let output = s.copy_to_host_slot(output, last)?;
        Ok((input, output))
    })?;
    Ok(Chain { exec: graph.instantiate(GraphFlags::empty())?, input, output })
}

impl Chain<'_> {
    /// One launch with input `seed`, its output checked.
    fn launch_and_check(&mut self, stream: &Stream, seed: u32) {
        let len = self.exec.host(&self.input).unwrap().len();
        let want = pattern(len, seed);
        self.exec.host_mut(&self.input).unwrap().copy_from_slice(&want);
        self.exec.launch(stream).unwrap();
        assert_same(self.exec.host(&self.output).unwrap(), &want);
    }
}

fn pinned(len: usize) -> PinnedBuffer<u32> {
    PinnedBuffer::<u32>::zeroed(len).unwrap()
}

/// Two graphs in one pool peak at the larger one's need (within a tenth), measured against
/// each alone in a pool of its own; both keep computing right, launched in turn many times on
/// two streams.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_two_graphs_sharing_a_pool_peak_at_the_larger() {
    let cache = DeviceCache::new(Device::current().unwrap()).unwrap();
    let (s1, s2) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
    let len = 16 * KIB;
    let (mut in_a, mut out_a, mut in_b, mut out_b) = (pinned(len), pinned(len), pinned(len), pinned(len));

    let peak_alone = |sizes: &[usize]| {
        let pool = cache.graph_pool().unwrap();
        let (mut input, mut output) = (pinned(len), pinned(len));
        let mut chain = capture_chain(&s1, &pool, sizes, &mut input, &mut output).unwrap();
        chain.launch_and_check(&s1, 1);
        pool.stats().reserved.peak
    };
    let (alone_large, alone_small) = (peak_alone(&LARGE), peak_alone(&SMALL));

    let shared = cache.graph_pool().unwrap();
    let mut a = capture_chain(&s1, &shared, &LARGE, &mut in_a, &mut out_a).unwrap();
    let mut b = capture_chain(&s2, &shared, &SMALL, &mut in_b, &mut out_b).unwrap();
    for round in 0..50 {
        a.launch_and_check(&s1, 2 * round);
        b.launch_and_check(&s2, 2 * round + 1);
    }
    let stats = shared.stats();
    let larger = alone_large.max(alone_small);
    println!(
        "graph pool reserved peak: large alone {alone_large}, small alone {alone_small}, shared {} ({:.3} x the larger)",
        stats.reserved.peak,
        stats.reserved.peak as f64 / larger as f64
    );
    assert!(stats.reserved.peak * 10 <= larger * 11, "shared {} vs larger {larger}", stats.reserved.peak);
    assert!(stats.reserved.peak < alone_large + alone_small);
    assert_eq!(stats.allocated.current, 0, "no block is held once the captures ended");
}

/// Eager allocations from the cache made while the graphs live never land in the graph pool's
/// segments, `empty_cache` leaves them, and the graph still computes right afterwards, also after
/// the pool's own handle is gone (the executable graph keeps the pool).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_eager_cache_never_hands_out_graph_pool_memory() {
    let cache = DeviceCache::new(Device::current().unwrap()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let pool = cache.graph_pool().unwrap();
    let len = 16 * KIB;
    let (mut input, mut output) = (pinned(len), pinned(len));
    let mut chain = capture_chain(&stream, &pool, &LARGE, &mut input, &mut output).unwrap();
    chain.launch_and_check(&stream, 3);
    let segments = pool.segment_ranges();
    assert!(!segments.is_empty());

    let mut eager = Vec::new();
    for round in 0..4 {
        for &elems in LARGE.iter().chain(&SMALL) {
            let buffer = cache.zeroed::<u32>(&stream, elems).unwrap();
            assert!(!pool.contains(buffer.as_slice().as_device_ptr()), "an eager buffer in the graph pool");
            eager.push(buffer);
        }
        let block = cache.alloc_block(1 << (10 + round), &stream).unwrap();
        assert!(!pool.contains(block.ptr().as_ptr()), "an eager block in the graph pool");
        // SAFETY: never used.
        unsafe { cache.free_block(block) };
        chain.launch_and_check(&stream, 10 + round);
        if round % 2 == 1 {
            eager.clear();
            cache.empty_cache();
        }
    }
    drop(eager);
    cache.empty_cache();
    assert_eq!(pool.segment_ranges().len(), segments.len(), "the cache released nothing of the pool");
    drop(pool);
    chain.launch_and_check(&stream, 20);
}

/// Graphs of one pool never run at once: two threads launching graphs that share every block on
/// two streams each see their own data every time, and a launch of another graph of the pool
/// from inside `run` on the same thread is a typed error, not a deadlock.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_graphs_of_one_pool_take_turns() {
    let cache = DeviceCache::new(Device::current().unwrap()).unwrap();
    let (s1, s2) = (Stream::non_blocking().unwrap(), Stream::non_blocking().unwrap());
    let pool = cache.graph_pool().unwrap();
    let len = 256 * KIB;
    let sizes = [len, len];
    let (mut in_a, mut out_a, mut in_b, mut out_b) = (pinned(len), pinned(len), pinned(len), pinned(len));
    let mut a = capture_chain(&s1, &pool, &sizes, &mut in_a, &mut out_a).unwrap();
    let mut b = capture_chain(&s2, &pool, &sizes, &mut in_b, &mut out_b).unwrap();

    let nested = a.exec.run(&s1, |l| {
        l.launch()?;
        b.exec.launch(&s2)
    });
    let err = nested.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    assert!(!pool.same_pool(&cache.graph_pool().unwrap()));

    std::thread::scope(|scope| {
        scope.spawn(|| {
            for round in 0..200 {
                a.launch_and_check(&s1, 2 * round);
            }
        });
        scope.spawn(|| {
            for round in 0..200 {
                b.launch_and_check(&s2, 2 * round + 1);
            }
        });
    });
}

/// A pool of another device is refused in a capture; a failed capture gives its blocks back.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_failed_capture_returns_its_pool_blocks() {
    let cache = DeviceCache::new(Device::current().unwrap()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let pool = cache.graph_pool().unwrap();
    let result = stream.capture(CaptureMode::ThreadLocal, |s| {
        let _block = s.cached::<u32>(&pool, MIB)?;
        Err(CudaError::new(ErrorKind::InvalidArgument("the test fails the capture"), "test"))
    });
    assert!(result.is_err());
    assert_eq!(pool.stats().allocated.current, 0);
    assert!(!stream.is_capturing().unwrap());
    let misses = pool.stats().misses;
    let graph = stream.capture(CaptureMode::ThreadLocal, |s| s.cached::<u32>(&pool, MIB).map(drop)).unwrap();
    assert_eq!(pool.stats().misses, misses, "the failed capture's block is reused");
    graph.instantiate(GraphFlags::empty()).unwrap().launch(&stream).unwrap();
}

/// A block released inside the capture serves the capture's next allocation: the graph orders
/// the later work after the earlier, so the data flows through one block twice, right.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_release_cached_reuses_the_block_within_one_capture() {
    let cache = DeviceCache::new(Device::current().unwrap()).unwrap();
    let stream = Stream::non_blocking().unwrap();
    let pool = cache.graph_pool().unwrap();
    let len = 64 * KIB;
    let (mut input, mut output) = (pinned(len), pinned(len));
    let (graph, (inp, out, first, again, grown)) = stream
        .capture_with(CaptureMode::ThreadLocal, |s| {
            let mut x = s.cached::<u32>(&pool, len)?;
            let first = x.as_device_ptr() as usize;
            let inp = s.copy_from_host_slot(&mut x, &mut input)?;
            let mut y = s.cached::<u32>(&pool, len)?;
            s.copy_from_device(&mut y, &x)?;
            s.release_cached(x)?;
            let segments = pool.stats().segment_allocations;
            let mut z = s.cached::<u32>(&pool, len)?;
            let grown = pool.stats().segment_allocations - segments;
            let again = z.as_device_ptr() as usize;
            s.copy_from_device(&mut z, &y)?;
            let (half, _) = y.split_at_mut(len / 2)?;
            let wrong = s.release_cached(half); // a sub-view: the block stays the capture's
            assert!(matches!(wrong.unwrap_err().kind(), ErrorKind::InvalidArgument(_)));
            let out = s.copy_to_host_slot(&mut output, &z)?;
            Ok((inp, out, first, again, grown))
        })
        .unwrap();
    assert_eq!(first, again, "the released block serves the next allocation of the capture");
    assert_eq!(grown, 0, "the third allocation took no new segment");
    let mut exec = graph.instantiate(GraphFlags::empty()).unwrap();
    for round in 0..20 {
        let want = pattern(len, round);
        exec.host_mut(&inp).unwrap().copy_from_slice(&want);
        exec.launch(&stream).unwrap();
        assert_same(exec.host(&out).unwrap(), &want);
    }
}

/// A graph that owns everything it uses (`GraphExec<'static>`): it fills one block of `pool` with
/// `byte`, copies it through a second block into its output, and returns the first block's address.
fn filling_graph(
    stream: &'static Stream,
    pool: &GraphPool,
    len: usize,
    byte: u8,
) -> (GraphExec<'static>, GraphOutput<u32>, usize) {
    let (graph, (key, at)) = stream
        .capture_with(CaptureMode::ThreadLocal, |s| {
            let mut x = s.cached::<u32>(pool, len)?;
            let at = x.as_device_ptr() as usize;
            s.set_bytes(&mut x, byte)?;
            let mut y = s.cached::<u32>(pool, len)?;
            s.copy_from_device(&mut y, &x)?;
            let (mut out, key) = s.output::<u32>(len)?;
            s.copy_from_device(&mut out, &y)?;
            Ok((key, at))
        })
        .unwrap();
    (graph.instantiate(GraphFlags::empty()).unwrap(), key, at)
}

/// Graphs of one pool launched without host waits on two streams never overlap: while a gate
/// holds the first stream, the other graph's launch on the second stream waits behind it on the
/// device; each output holds its own graph's bytes every round, also mixed with waiting `run`s;
/// and a launch in a scope from inside a `run` of the pool is a typed error.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_graphs_of_one_pool_launched_without_waits_stay_apart() {
    let cache = DeviceCache::new(Device::current().unwrap()).unwrap();
    let s1: &'static Stream = Box::leak(Box::new(Stream::non_blocking().unwrap()));
    let s2 = Stream::non_blocking().unwrap();
    let pool = cache.graph_pool().unwrap();
    let len = 16 * MIB;
    let (mut a, key_a, at_a) = filling_graph(s1, &pool, len, 0xAA);
    let (mut b, key_b, at_b) = filling_graph(s1, &pool, len, 0xBB);
    assert_eq!(at_a, at_b, "the graphs share their blocks");
    let (want_a, want_b) = (vec![0xAAAA_AAAAu32; len], vec![0xBBBB_BBBBu32; len]);

    for attempt in 0.. {
        assert!(attempt < 5, "the gate ran out of time in 5 attempts");
        let gate = common::Gate::hold(s1);
        let pending_a = a.launch_pending(s1).unwrap();
        let pending_b = b.launch_pending(&s2).unwrap();
        let b_waits = !pending_b.is_done().unwrap();
        let held = gate.release();
        (a, b) = (pending_a.wait().unwrap(), pending_b.wait().unwrap());
        if held {
            assert!(b_waits, "the second graph of the pool ran while the first was held");
            break;
        }
    }
    for round in 0..10 {
        let (first, second) = if round % 2 == 0 { (s1, &s2) } else { (&s2, s1) };
        let pending_a = a.launch_pending(first).unwrap();
        let pending_b = b.launch_pending(second).unwrap();
        let pending_a = pending_a.then(|s, exec| exec.launches_in(s)?.launch()).unwrap();
        b = pending_b.wait().unwrap();
        b.run(first, |l| l.launch()).unwrap(); // ordered after `a`'s launches on the device
        assert_same(&b.output(&key_b).unwrap().to_vec().unwrap(), &want_b);
        a = pending_a.wait().unwrap();
        assert_same(&a.output(&key_a).unwrap().to_vec().unwrap(), &want_a);
    }

    let nested = a.run(s1, |_| s1.try_scope(|s| b.launches_in(s)?.launch()));
    let err = nested.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
    b.launch(&s2).unwrap();
    assert_same(&b.output(&key_b).unwrap().to_vec().unwrap(), &want_b);
}
