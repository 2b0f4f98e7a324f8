//! Allocation workloads shaped like the programs cuda-mem's users run, as scripts any allocator
//! can replay: cuda-mem's caches (over the CUDA runtime, or the CUDA-free fake backend in unit
//! tests), PyTorch's allocator and RAPIDS RMM (through the file format of [`format`]).
//!
//! A [`Workload`] is a set of [`Lane`]s: each lane is one thread with a stream of its own, and
//! runs its [`Op`]s in order; lanes run at the same time. Where each workload's shape comes from
//! is documented on its generator:
//!
//! | workload | generator |
//! |---|---|
//! | `training` | [`training::Training`]: a variable-shape transformer training loop |
//! | `serving` | [`serving::Serving`]: LLM serving, KV pages, prefill bursts, blocks handed between streams |
//! | `churn` | [`churn::churn`]: RMM benchmark's churn script, operation for operation |
//! | `mixed` | [`mixed::Mixed`]: mixed sizes on many threads with their own streams |
//!
//! Recorded traces (PyTorch's, through `cuda-mem-bench/workloads/torch_training.py`) are
//! workloads too: [`format::read`] loads them.
//!
//! Single-threaded event logs, the other shape a recorded program takes: [`log`] reads and writes
//! the logs of cuda-mem's `LoggingResource` and flattens any workload into one
//! ([`log::events_of`]); [`stress::StressSchedule`] is the `stress` example's threads' steps.

pub mod churn;
pub mod format;
pub mod log;
pub mod mixed;
pub mod rng;
pub mod serving;
pub mod stress;
pub mod training;

/// One step of a lane. Ids are the lane's own: an id is allocated, then freed once, and may be
/// allocated again after its free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Allocate `bytes` (> 0) for use on the lane's stream, named `id`.
    Alloc { id: u32, bytes: u64 },
    /// Free `id` on the lane's stream (its only user).
    Free { id: u32 },
    /// Free `id` after work on lane `lane`'s stream used it too: the block was handed to that
    /// stream (PyTorch's `record_stream`, cuda-mem's `free_on`, RMM's deallocate on that stream).
    FreeOn { id: u32, lane: u16 },
    /// Return cached memory to the driver (PyTorch's `empty_cache`), as some serving loops do.
    EmptyCache,
}

/// One thread's script, on a stream of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lane {
    pub ops: Vec<Op>,
}

/// Lanes that run together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// A short name, for reports (`training`, `serving`, ...).
    pub name: String,
    pub lanes: Vec<Lane>,
}

/// Counts of a workload, independent of any allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shape {
    pub allocations: u64,
    pub frees: u64,
    pub handoffs: u64,
    pub empty_caches: u64,
    /// The most bytes live at once when the lanes run one op each in turn (round robin): the
    /// yardstick of unit-test replays. Concurrent runs measure their own.
    pub peak_live_round_robin: u64,
    pub largest: u64,
}

impl Workload {
    /// Every op of every lane, interleaved one op per lane in turn, with the lane's index.
    pub fn round_robin(&self) -> impl Iterator<Item = (usize, Op)> + '_ {
        let longest = self.lanes.iter().map(|l| l.ops.len()).max().unwrap_or(0);
        (0..longest).flat_map(move |i| {
            self.lanes.iter().enumerate().filter_map(move |(lane, l)| l.ops.get(i).map(|&op| (lane, op)))
        })
    }

    /// The workload's counts; panics if a lane frees an id it did not allocate, or allocates a
    /// live id (a generator's bug, caught by this crate's tests).
    pub fn shape(&self) -> Shape {
        let mut shape = Shape::default();
        let mut live: Vec<std::collections::HashMap<u32, u64>> = vec![Default::default(); self.lanes.len()];
        let mut bytes = 0u64;
        for (lane, op) in self.round_robin() {
            match op {
                Op::Alloc { id, bytes: b } => {
                    assert!(b > 0, "{}: lane {lane} allocates 0 bytes", self.name);
                    assert!(live[lane].insert(id, b).is_none(), "{}: lane {lane} id {id} allocated twice", self.name);
                    shape.allocations += 1;
                    shape.largest = shape.largest.max(b);
                    bytes += b;
                    shape.peak_live_round_robin = shape.peak_live_round_robin.max(bytes);
                }
                Op::Free { id } | Op::FreeOn { id, .. } => {
                    let b = live[lane].remove(&id).unwrap_or_else(|| panic!("{}: lane {lane} frees {id}", self.name));
                    bytes -= b;
                    shape.frees += 1;
                    if let Op::FreeOn { lane: other, .. } = op {
                        assert!(usize::from(other) < self.lanes.len(), "{}: no lane {other}", self.name);
                        shape.handoffs += 1;
                    }
                }
                Op::EmptyCache => shape.empty_caches += 1,
            }
        }
        assert_eq!(bytes, 0, "{}: every allocation is freed by the end", self.name);
        shape
    }

    /// Total ops of every lane.
    pub fn ops(&self) -> usize {
        self.lanes.iter().map(|l| l.ops.len()).sum()
    }
}

/// A lane as a generator writes it: each allocation takes the smallest id not live, so ids stay
/// dense.
#[derive(Debug, Default)]
pub(crate) struct Script {
    lane: Lane,
    free_ids: std::collections::BTreeSet<u32>,
    next_id: u32,
}

impl Script {
    /// Allocates `bytes` (at least 1); returns the id.
    pub fn alloc(&mut self, bytes: usize) -> u32 {
        let id = self.free_ids.pop_first().unwrap_or_else(|| {
            self.next_id += 1;
            self.next_id - 1
        });
        self.lane.ops.push(Op::Alloc { id, bytes: bytes.max(1) as u64 });
        id
    }

    /// Frees `id` on the lane's stream, or after lane `on`'s stream used it.
    pub fn free_on(&mut self, id: u32, on: Option<u16>) {
        self.lane.ops.push(match on {
            Some(lane) => Op::FreeOn { id, lane },
            None => Op::Free { id },
        });
        self.free_ids.insert(id);
    }

    pub fn free(&mut self, id: u32) {
        self.free_on(id, None);
    }

    pub fn empty_cache(&mut self) {
        self.lane.ops.push(Op::EmptyCache);
    }

    pub fn finish(self) -> Lane {
        self.lane
    }
}

/// Every workload of the corpus with its default parameters, in report order.
pub fn corpus() -> Vec<Workload> {
    vec![
        training::Training::default().workload(),
        serving::Serving::default().workload(),
        churn::churn(churn::SEED, churn::OPS, churn::MAX_LIVE),
        mixed::Mixed::default().workload(),
    ]
}
