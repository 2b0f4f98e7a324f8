//! The workload corpus (`cuda-mem-workloads`) replayed through the allocator over the fake
//! backend: lanes one op each in turn, each lane on a stream of its own, the device keeping up
//! (every stream's work completes after each round). Two passes: the first warms the cache, the
//! second is steady state. Bookkeeping only: segments are bare addresses.

use super::fake::FakeBackend;
use super::*;
use cuda_mem_workloads::{Op, Workload};

/// What one replay measured.
#[derive(Debug)]
pub(super) struct Replayed {
    pub name: String,
    pub peak_live: usize,
    pub stats: CachingStats,
    pub allocations_pass2: u64,
    pub misses_pass2: u64,
    pub releases_pass2: u64,
}

impl Replayed {
    pub fn reserved_over_live(&self) -> f64 {
        self.stats.reserved.peak as f64 / self.peak_live as f64
    }

    pub fn miss_rate_pass2(&self) -> f64 {
        self.misses_pass2 as f64 / self.allocations_pass2 as f64
    }
}

impl std::fmt::Display for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.stats;
        write!(
            f,
            "{}: reserved/live {:.3} (reserved peak {} MiB, live peak {} MiB); pass 2: {} misses, {} releases in {} allocations ({:.3}%); front hits {}, core hits {}, adopted {}, lent {}, stream waits {}",
            self.name,
            self.reserved_over_live(),
            s.reserved.peak >> 20,
            self.peak_live >> 20,
            self.misses_pass2,
            self.releases_pass2,
            self.allocations_pass2,
            100.0 * self.miss_rate_pass2(),
            s.front_hits,
            s.core_hits,
            s.segments_adopted,
            s.blocks_lent,
            s.stream_waits,
        )
    }
}

/// Stream keys of lanes: away from 0, which the fake backend does not treat specially anyway.
fn lane_stream(lane: usize) -> StreamKey {
    StreamKey(0x100 + lane)
}

/// Pages of the driver's granularity, in ranges larger than any workload.
pub(super) fn paged() -> FakeBackend {
    FakeBackend::with_pages(2 << 20, 1 << 40)
}

pub(super) fn replay(workload: &Workload, config: Config) -> Replayed {
    replay_over(workload, config, FakeBackend::address_only())
}

pub(super) fn replay_over(workload: &Workload, config: Config, backend: FakeBackend) -> Replayed {
    replay_observed(workload, config, backend, &mut |_| {})
}

/// [`replay_over`], showing the cache to `observe` after every allocation.
fn replay_observed(
    workload: &Workload,
    config: Config,
    backend: FakeBackend,
    observe: &mut dyn FnMut(&CachingAllocator<FakeBackend>),
) -> Replayed {
    let cache = CachingAllocator::new(backend.clone(), config).unwrap();
    let lanes = workload.lanes.len();
    let mut live: Vec<Vec<Option<CachedBlock>>> = (0..lanes).map(|_| Vec::new()).collect();
    let mut pass = |cache: &CachingAllocator<FakeBackend>| {
        let mut ops_in_round = 0;
        for (lane, op) in workload.round_robin() {
            let stream = lane_stream(lane);
            match op {
                Op::Alloc { id, bytes } => {
                    let block = cache.alloc(bytes as usize, &stream).unwrap();
                    let slots = &mut live[lane];
                    if slots.len() <= id as usize {
                        slots.resize_with(id as usize + 1, || None);
                    }
                    assert!(slots[id as usize].replace(block).is_none());
                    observe(cache);
                }
                Op::Free { id } => {
                    let block = live[lane][id as usize].take().unwrap();
                    // SAFETY: fake memory, never touched; the block is this cache's.
                    unsafe { cache.free(block) };
                }
                Op::FreeOn { id, lane: other } => {
                    let block = live[lane][id as usize].take().unwrap();
                    backend.submit(lane_stream(other.into()));
                    // SAFETY: as above.
                    unsafe { cache.free_on(block, &lane_stream(other.into())).unwrap() };
                }
                Op::EmptyCache => {
                    cache.empty_cache();
                }
            }
            ops_in_round += 1;
            if ops_in_round == lanes {
                backend.complete_all();
                ops_in_round = 0;
            }
        }
        backend.complete_all();
    };
    pass(&cache);
    let first = cache.stats();
    pass(&cache);
    cache.check_invariants();
    let stats = cache.stats();
    let shape = workload.shape();
    Replayed {
        name: workload.name.clone(),
        peak_live: shape.peak_live_round_robin as usize,
        allocations_pass2: shape.allocations,
        misses_pass2: stats.misses - first.misses,
        releases_pass2: stats.segment_releases - first.segment_releases,
        stats,
    }
}

/// The same with a thread per lane, all at once (no empty-cache ops: those are the
/// round-robin replay's); returns (peak reserved, misses, releases) over both passes.
pub(super) fn replay_threads(workload: &Workload, config: Config) -> (usize, u64, u64) {
    replay_threads_over(workload, config, FakeBackend::address_only())
}

pub(super) fn replay_threads_over(workload: &Workload, config: Config, backend: FakeBackend) -> (usize, u64, u64) {
    let cache = CachingAllocator::new(backend.clone(), config).unwrap();
    for _pass in 0..2 {
        std::thread::scope(|scope| {
            for (lane, ops) in workload.lanes.iter().enumerate() {
                let (cache, backend) = (&cache, &backend);
                scope.spawn(move || {
                    let stream = lane_stream(lane);
                    let mut live: Vec<Option<CachedBlock>> = Vec::new();
                    for op in &ops.ops {
                        match *op {
                            Op::Alloc { id, bytes } => {
                                if live.len() <= id as usize {
                                    live.resize_with(id as usize + 1, || None);
                                }
                                live[id as usize] = Some(cache.alloc(bytes as usize, &stream).unwrap());
                            }
                            Op::Free { id } | Op::FreeOn { id, .. } => {
                                // SAFETY: fake memory, never touched; the block is this cache's.
                                unsafe { cache.free(live[id as usize].take().unwrap()) };
                            }
                            Op::EmptyCache => {}
                        }
                        backend.complete(stream);
                    }
                });
            }
        });
    }
    cache.check_invariants();
    let stats = cache.stats();
    assert_eq!(stats.allocated.current, 0, "every block returned");
    (stats.reserved.peak, stats.misses, stats.segment_releases)
}

/// Regression bounds of the default parameters over a backend with pages (as the CUDA one where
/// the driver manages virtual memory), at the figures the replays gave on 2026-12-06 (with a
/// little room): (workload, reserved over live, miss rate after warm-up, driver calls over both
/// passes as `FakeBackend::driver_calls` counts them). The targets are 1.05 and 0.1%: serving's
/// misses come from its `EmptyCache` ops (every free page goes, and comes back on the next
/// misses); lent blocks took its misses from 3.1% to 2.0% and mixed's from 6.5% to under 0.02%.
/// Mappings of up to 64 MiB for misses of 16 MiB and more (`Config::max_mapping_bytes`) took
/// serving's driver calls from 267,894 (a mapping per page) to 28,379 and its reserve from 1.073
/// to 1.162 times live, and churn's from 1.093 to 1.133: a mapping goes back only whole. (For
/// every miss, not only large ones: 20,068 calls at 1.170, churn 1.176 and mixed 1.339.)
/// A miss that first returns every shard's completed pending blocks took mixed's misses from 60
/// to 21 and its driver calls from 2,867 to 1,756, its reserve from 1.241 to 1.257 here (and on
/// threads, below, from 1.44-1.70 to 1.14-1.36 in ten runs each on 2026-12-06).
/// A trim that unmaps only the whole mappings a miss lacks (from the end of a free run) rather
/// than whole runs took serving's driver calls from 28,380 to 24,260 and churn's from 3,443 to
/// 3,210 here; its reserve moved from 1.161 to 1.177 and mixed's from 1.257 to 1.273, within
/// what the choice between blocks of equal size moves them by (serving 1.157-1.177 over variants
/// that change only block numbering). Over six seeds of each (2026-12-06): serving 1.154 to
/// 1.147 times live at 27,519 to 25,900 calls, churn 1.108 to 1.113 at 3,246 to 2,800, mixed
/// 1.221 to 1.208.
/// A large miss below the reserve's peak mapping up to 64 MiB ahead (`Config::map_ahead_bytes`)
/// took serving's misses after warm-up from 1,606 to 708 and its driver calls from 25,900 to
/// 17,733 over six seeds, at 1.147 to 1.152 times live (here 1.177 to 1.181, 24,260 to 17,503
/// calls); the other workloads never sit below their peak in a round robin.
const BOUNDS: [(&str, f64, f64, u64); 4] = [
    ("training", 1.02, 0.0001, 2_000),
    ("serving", 1.19, 0.004, 19_000),
    ("churn", 1.14, 0.0003, 3_600),
    ("mixed", 1.29, 0.0003, 2_200),
];

/// The same over whole segments (`expandable_segments` off, or a driver without virtual memory
/// management): training misses one allocation in ten (its shapes change every step, and the
/// reserve is held at its high-water mark by releasing idle segments).
const SEGMENT_BOUNDS: [(&str, f64, f64); 4] =
    [("training", 1.04, 0.11), ("serving", 1.27, 0.023), ("churn", 1.27, 0.0001), ("mixed", 1.60, 0.0003)];

fn replayed_out_of(replayed: &Replayed, reserve: f64, misses: f64) -> bool {
    replayed.reserved_over_live() > reserve || replayed.miss_rate_pass2() > misses
}

#[test]
#[cfg_attr(miri, ignore = "long replays; the bookkeeping they use is tested under miri elsewhere")]
fn the_corpus_stays_within_its_bounds() {
    let mut failures = Vec::new();
    for workload in cuda_mem_workloads::corpus() {
        let backend = paged();
        let growable = replay_over(&workload, Config::default(), backend.clone());
        let calls = backend.driver_calls();
        let segments = replay(&workload, Config::default());
        eprintln!("default (pages): {growable}; driver calls {calls}\nsegments: {segments}");
        let &(_, reserve, misses, most_calls) =
            BOUNDS.iter().find(|b| b.0 == workload.name).expect("a bound per workload");
        if replayed_out_of(&growable, reserve, misses) || calls > most_calls {
            failures.push(format!("{growable}; driver calls {calls}"));
        }
        let &(_, reserve, misses) = SEGMENT_BOUNDS.iter().find(|b| b.0 == workload.name).expect("a bound per workload");
        if replayed_out_of(&segments, reserve, misses) {
            failures.push(segments.to_string());
        }
        for replayed in [&growable, &segments] {
            assert!(replayed.reserved_over_live() >= 1.0, "{replayed}");
        }
    }
    assert!(failures.is_empty(), "out of bounds:\n{}", failures.join("\n"));
}

/// What holds churn's and mixed's reserve above 1.05 times live in the round robin is the page:
/// the same defaults over pages of 64 KiB (finer than any driver's granularity for device
/// memory, 2 MiB on current GPUs) reserve 1.047 and 1.046 times live (2026-12-07), against
/// 1.099 and 1.208 over 2 MiB pages (at more misses: mixed's after warm-up 2,631 against 29):
/// free memory goes back only in whole pages, and what lies between live blocks is mostly parts
/// of pages. (Mixed with all eight lanes on one stream, over
/// 2 MiB pages: 1.192; so memory kept per stream is not what holds it.)
#[test]
#[cfg_attr(miri, ignore = "long replays; the bookkeeping they use is tested under miri elsewhere")]
fn over_finer_pages_churn_and_mixed_stay_within_five_percent() {
    for workload in cuda_mem_workloads::corpus().into_iter().filter(|w| w.name == "churn" || w.name == "mixed") {
        let fine = replay_over(&workload, Config::default(), FakeBackend::with_pages(64 << 10, 1 << 40));
        let pages = replay_over(&workload, Config::default(), paged());
        eprintln!("64 KiB pages: {fine}\n2 MiB pages: {pages}");
        assert!(fine.reserved_over_live() <= 1.05, "{fine}");
        assert!(fine.reserved_over_live() < pages.reserved_over_live(), "{fine}\n{pages}");
    }
}

/// Where the reserve stands when it first reaches its peak (2 MiB pages, round robin, both
/// passes): free memory in whole pages, which a trim or a lend could hand on, and free memory in
/// parts of pages, which only a placement that keeps holes out of pages can save. Churn's and
/// mixed's excess over live is almost all in parts of pages (2026-12-07: 60 of 64 MiB free, and
/// 25 of 25); serving's is whole pages kept free (3,190 of 3,415 MiB).
#[test]
#[cfg_attr(miri, ignore = "long replays; the bookkeeping they use is tested under miri elsewhere")]
fn at_the_reserve_peak_churn_and_mixed_hold_parts_of_pages_and_serving_whole_pages() {
    const PAGE: usize = 2 << 20;
    for workload in cuda_mem_workloads::corpus().into_iter().filter(|w| w.name != "training") {
        // (reserved, free, free in whole pages) when the reserve first reached its highest.
        let mut at_peak = (0, 0, 0);
        replay_observed(&workload, Config::default(), paged(), &mut |cache| {
            let reserved = cache.reserved().current;
            if reserved > at_peak.0 {
                let (free, whole) = cache.free_in_pages(PAGE);
                at_peak = (reserved, free, whole);
            }
        });
        let (reserved, free, whole) = at_peak;
        let partial = free - whole;
        eprintln!(
            "{}: at the reserve peak ({} MiB) {} MiB free: {} MiB in whole pages, {} MiB in parts of pages",
            workload.name,
            reserved >> 20,
            free >> 20,
            whole >> 20,
            partial >> 20
        );
        if workload.name == "serving" {
            assert!(whole > 3 * partial, "{}", workload.name);
        } else {
            assert!(partial > 3 * whole && partial > 0, "{}", workload.name);
        }
    }
}

#[test]
#[cfg_attr(miri, ignore = "long replays; the bookkeeping they use is tested under miri elsewhere")]
fn the_mixed_workload_on_threads_keeps_its_reserve() {
    let workload = cuda_mem_workloads::mixed::Mixed::default().workload();
    let live = workload.shape().peak_live_round_robin as usize;
    let (reserved, misses, releases) = replay_threads(&workload, Config::default());
    eprintln!(
        "mixed on threads: reserved/live {:.3}, misses {misses}, releases {releases}",
        reserved as f64 / live as f64
    );
    let (paged_reserved, paged_maps, paged_unmaps) = replay_threads_over(&workload, Config::default(), paged());
    eprintln!(
        "mixed on threads, growable: reserved/live {:.3}, maps {paged_maps}, unmaps {paged_unmaps}",
        paged_reserved as f64 / live as f64
    );
    // The interleaving of threads decides the figures (segments 1.44-1.64, pages 1.14-1.36 in ten
    // runs each on 2026-12-06; before misses returned every shard's completed pending blocks,
    // 1.45-1.77 and 1.44-1.70): the bounds only catch a blow-up; the round-robin replay of
    // `the_corpus_stays_within_its_bounds` holds the tight ones.
    assert!(reserved as f64 <= 3.0 * live as f64, "reserved {reserved}, live {live}");
    assert!(paged_reserved as f64 <= 3.0 * live as f64, "growable: reserved {paged_reserved}, live {live}");
    assert!(misses >= 1 && releases <= misses, "{misses} misses, {releases} releases");
}

/// The same with page calls that take time and run one at a time, as the driver's: misses of
/// the eight threads then overlap. Deciding one at a time, each counting what the ones before it
/// are about to map, keeps the reserve: means of three runs 1.38-1.59 times live in twelve
/// tries on 2026-12-06, where misses that decided at once reserved 1.84-2.06 (1.57-2.37 a run),
/// misses under their shard's lock (before 4de150c) 1.54, and misses that decided and mapped
/// one at a time 1.24-1.34 (but on an H100 that doubled mixed's time per op). Misses within the
/// budget map without waiting for the others' decisions (only misses past it decide in turn):
/// means 1.44-1.54 in four tries on 2026-12-06.
#[test]
#[cfg_attr(miri, ignore = "real-time latencies")]
fn the_mixed_workload_on_threads_with_slow_page_calls_keeps_its_reserve() {
    let workload = cuda_mem_workloads::mixed::Mixed::default().workload();
    let live = workload.shape().peak_live_round_robin as f64;
    let runs: Vec<f64> = (0..3)
        .map(|_| {
            let backend = paged();
            backend.set_page_call_latency(std::time::Duration::from_micros(30));
            let (reserved, _, _) = replay_threads_over(&workload, Config::default(), backend);
            reserved as f64 / live
        })
        .collect();
    let mean = runs.iter().sum::<f64>() / runs.len() as f64;
    eprintln!("mixed on threads, slow page calls: reserved/live {runs:.3?}, mean {mean:.3}");
    assert!(mean <= 1.7, "reserved/live {runs:.3?}");
}

/// `Config::own_range_from` at 16 MiB (the smallest class whose misses map large allocations)
/// over the corpus, round robin, 2 MiB pages: serving's reserve falls from 1.174 to 1.072 times
/// live (2026-12-07), as its KV-cache pages no longer keep prefill buffers' mappings from going
/// back whole; the training replay pays for it, 1.014 to 1.044 times live and 22 misses after
/// warm-up instead of none, as its activations' sizes cross the line from step to step. Why the
/// option is not the default.
#[test]
#[cfg_attr(miri, ignore = "long replays; the bookkeeping they use is tested under miri elsewhere")]
fn apart_ranges_lower_servings_reserve_and_cost_training_misses() {
    let apart = Config { own_range_from: 16 << 20, ..Config::default() };
    for workload in cuda_mem_workloads::corpus().into_iter().filter(|w| w.name == "serving" || w.name == "training") {
        let default = replay_over(&workload, Config::default(), paged());
        let kept_apart = replay_over(&workload, apart.clone(), paged());
        eprintln!("default: {default}\nown_range_from 16 MiB: {kept_apart}");
        if workload.name == "serving" {
            assert!(kept_apart.reserved_over_live() <= 1.09, "{kept_apart}");
            assert!(kept_apart.reserved_over_live() + 0.05 <= default.reserved_over_live(), "{kept_apart}\n{default}");
        } else {
            assert!(kept_apart.misses_pass2 > default.misses_pass2, "{kept_apart}\n{default}");
        }
    }
}

/// `Config::lowest_for_whole_pages` over the corpus, round robin, 2 MiB pages (2026-12-07):
/// serving's reserve falls from 1.174 to 1.116 times live (seed 4: 1.140 to 1.070; over five
/// seeds the mean went from 1.157 to 1.107, every seed lower), as its KV-cache pages pack at the
/// start of each stream's range and no longer pin the mappings prefill buffers free; churn,
/// mixed and training move within what other seeds move them by (churn 1.099 to 1.113, mixed
/// 1.208 to 1.224, training 1.014 both, no miss added; over five seeds the means of churn and
/// mixed moved by less than 0.003).
#[test]
#[cfg_attr(miri, ignore = "long replays; the bookkeeping they use is tested under miri elsewhere")]
fn whole_pages_at_the_lowest_address_lower_servings_reserve() {
    let lowest = Config { lowest_for_whole_pages: true, ..Config::default() };
    let mut corpus = cuda_mem_workloads::corpus();
    corpus.push(cuda_mem_workloads::serving::Serving { seed: 4, ..Default::default() }.workload());
    for workload in corpus {
        let default = replay_over(&workload, Config::default(), paged());
        let packed = replay_over(&workload, lowest.clone(), paged());
        eprintln!("default: {default}\nlowest_for_whole_pages: {packed}");
        let (before, after) = (default.reserved_over_live(), packed.reserved_over_live());
        match workload.name.as_str() {
            "serving" => assert!(after + 0.04 <= before, "{packed}\n{default}"),
            "training" => {
                assert!(after <= before + 0.005, "{packed}\n{default}");
                assert_eq!(packed.misses_pass2, default.misses_pass2, "{packed}\n{default}");
            }
            _ => assert!(after <= before + 0.03, "{packed}\n{default}"),
        }
    }
}
