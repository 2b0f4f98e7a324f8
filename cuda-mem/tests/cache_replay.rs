//! Memory efficiency: traces replayed through the allocator over the fake backend, as the
//! `replay` example replays them through `DeviceCache` (one stream, one thread), keep the
//! reserve within 1.15 times the peak of requested bytes. Bookkeeping only: segments are bare
//! addresses, so the traces' gigabytes need no host memory.

use cuda_mem_cache::fake::FakeBackend;
use cuda_mem_cache::{CachedBlock, CachingAllocator, CachingStats, Config, StreamKey};
use cuda_mem_workloads::log::ReplayEvent;
use cuda_mem_workloads::stress::{StressOp, StressSchedule};
use std::collections::HashMap;

const S: StreamKey = StreamKey(0x10);

/// Peaks of one replay.
struct Peaks {
    requested: usize,
    stats: CachingStats,
}

impl Peaks {
    fn ratio(&self) -> f64 {
        self.stats.reserved.peak as f64 / self.requested as f64
    }
}

impl std::fmt::Display for Peaks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.stats;
        write!(
            f,
            "requested peak {}, reserved peak {}, ratio {:.4}; {} segment allocations, {} releases, {} hits",
            self.requested,
            s.reserved.peak,
            self.ratio(),
            s.segment_allocations,
            s.segment_releases,
            s.front_hits + s.core_hits
        )
    }
}

fn replay(events: &[ReplayEvent], config: Config) -> Peaks {
    let cache = CachingAllocator::new(FakeBackend::address_only(), config).unwrap();
    let mut live: HashMap<u64, CachedBlock> = HashMap::new();
    let (mut requested, mut requested_peak) = (0usize, 0usize);
    for event in events {
        match *event {
            ReplayEvent::Allocate { id, bytes } => {
                let block = cache.alloc(bytes, &S).unwrap();
                assert!(live.insert(id, block).is_none(), "id {id} allocated twice");
                requested += bytes;
                requested_peak = requested_peak.max(requested);
            }
            ReplayEvent::Free { id, bytes } => {
                let block = live.remove(&id).expect("a free of a live id");
                requested -= bytes;
                // SAFETY: the fake backend's memory is never touched; the block is this cache's.
                unsafe { cache.free(block) };
            }
        }
    }
    assert!(live.is_empty());
    cache.check_invariants();
    let stats = cache.stats();
    assert_eq!(stats.requested.peak, requested_peak, "the cache counts what the replay asked for");
    Peaks { requested: requested_peak, stats }
}

/// The pool family's events of one thread of the `stress` example with `--streams 4 --ops OPS`:
/// the same schedule (six families, the pool the third), so with `--threads 1` the log the
/// example writes holds these allocations and frees in this order (with addresses for ids).
fn stress_pool_family(ops: usize, thread_seed: u64) -> Vec<ReplayEvent> {
    const POOL: usize = 2;
    let mut live: Vec<(u64, usize, usize)> = Vec::new(); // (id, family, bytes)
    let (mut events, mut next_id) = (Vec::new(), 0u64);
    let mut allocate = |events: &mut Vec<ReplayEvent>, live: &mut Vec<_>, family: usize, bytes: usize| {
        next_id += 1;
        if family == POOL {
            events.push(ReplayEvent::Allocate { id: next_id, bytes });
        }
        live.push((next_id, family, bytes));
    };
    for op in StressSchedule::new(thread_seed, 4, 6).take(ops) {
        match op {
            StressOp::Allocate { family, len, .. } => allocate(&mut events, &mut live, family, len * 4),
            StressOp::Copy { index, .. } => {
                let (_, family, bytes) = live[index];
                allocate(&mut events, &mut live, family, bytes);
            }
            StressOp::Free { index, .. } => {
                let (id, family, bytes) = live.swap_remove(index);
                if family == POOL {
                    events.push(ReplayEvent::Free { id, bytes });
                }
            }
            StressOp::Verify { .. } | StressOp::Idle { .. } => {}
        }
    }
    for (id, family, bytes) in live {
        if family == POOL {
            events.push(ReplayEvent::Free { id, bytes });
        }
    }
    events
}

/// PyTorch's segment sizes with none of the rules that keep the reserve close to its use.
fn fixed_segments() -> Config {
    Config {
        small_segment_divisor: 0,
        small_fit_divisor: 0,
        large_fit_slack: usize::MAX,
        release_idle_on_miss: false,
        ..Config::default()
    }
}

/// The corpus's serving workload as the `serving_trace` example writes it: one thread's log.
#[test]
#[cfg_attr(miri, ignore = "a long replay; the bookkeeping it uses is tested under miri elsewhere")]
fn the_serving_log_reserves_at_most_115_percent_of_its_peak() {
    for seed in [11, 12, 13] {
        let workload = cuda_mem_workloads::serving::Serving { seed, ..Default::default() }.workload();
        let events = cuda_mem_workloads::log::events_of(&workload);
        let (peaks, fixed) = (replay(&events, Config::default()), replay(&events, fixed_segments()));
        eprintln!("serving log, seed {seed}: {peaks} (fixed segments: {fixed})");
        assert!(peaks.ratio() <= 1.15, "seed {seed}: {peaks}");
    }
}

#[test]
#[cfg_attr(miri, ignore = "a long replay; the bookkeeping it uses is tested under miri elsewhere")]
fn the_stress_log_reserves_at_most_115_percent_of_its_peak() {
    // The log the bundle's run script records (thread seed 1), and other threads' schedules.
    for seed in 1..=8 {
        let events = stress_pool_family(20_000, seed);
        let (peaks, fixed) = (replay(&events, Config::default()), replay(&events, fixed_segments()));
        eprintln!("stress, thread seed {seed}: {peaks} (fixed segments: {fixed})");
        assert!(peaks.ratio() <= 1.15, "thread seed {seed}: {peaks}");
    }
}
