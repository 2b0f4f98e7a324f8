//! A synthetic allocation trace of an LLM serving loop, to measure allocators on a workload that
//! mixes long-lived KV blocks with per-step temporaries. The `serving_trace` example writes it
//! as a log that [`parse_log`](crate::log::parse_log) and the `replay` example read.

use crate::log::ReplayEvent;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// The model of a serving loop whose allocations [`ServingTrace::events`] lists; the same seed
/// gives the same trace. Time runs in steps (one forward pass of the running batch):
///
/// 1. **Finished requests** free their KV blocks (in allocation order), so a KV block lives from
///    its allocation to its request's end.
/// 2. **Prefill burst**, with chance `prefill_chance` per step: 1..=`max_burst` requests arrive.
///    Each decodes for a lifetime drawn log-uniformly from 1..=`max_lifetime` steps, allocates
///    its prompt's KV cache as 1..=4 blocks log-uniform in `prompt_kv`, and 1..=3 prefill
///    activations log-uniform in `activation`, which live until the end of the step.
/// 3. **Decode KV**: every running request appends one KV block every `kv_append_every` steps of
///    its life, of a size in `kv` whose base-2 logarithm is `log2(min) + span * u^kv_skew` (`u`
///    uniform in 0..1): skewed toward small blocks, up to the largest.
/// 4. **Temporaries**: `temporaries` per step, log-uniform in `temporary`; each is freed after
///    1..=4 later temporaries were allocated (a window like a layer's scratch), the rest at the
///    end of the step, after the activations.
///
/// Sizes are multiples of 256 bytes (tensor shapes are multiples of a model's head and hidden
/// sizes). Ids are never reused. The defaults keep about 80 requests running at once, with
/// lifetimes of 1–1000 steps and KV blocks of 16 KiB–64 MiB.
#[derive(Debug, Clone, PartialEq)]
pub struct ServingTrace {
    /// Seed of the generator.
    pub seed: u64,
    /// Steps to run; the requests still running at the end free their blocks after the last.
    pub steps: usize,
    /// Chance of a prefill burst at a step.
    pub prefill_chance: f64,
    /// Most requests in one burst.
    pub max_burst: usize,
    /// Longest decode, in steps (the shortest is 1).
    pub max_lifetime: usize,
    /// Bytes of one prompt KV block: smallest and largest.
    pub prompt_kv: (usize, usize),
    /// Bytes of one decode KV block: smallest and largest.
    pub kv: (usize, usize),
    /// Exponent skewing decode KV sizes toward the smallest (1: log-uniform).
    pub kv_skew: f64,
    /// A running request appends a decode KV block every this many steps.
    pub kv_append_every: usize,
    /// Bytes of one prefill activation: smallest and largest.
    pub activation: (usize, usize),
    /// Temporaries allocated per step.
    pub temporaries: usize,
    /// Bytes of one temporary: smallest and largest.
    pub temporary: (usize, usize),
}

impl Default for ServingTrace {
    fn default() -> Self {
        Self {
            seed: 1,
            steps: 3000,
            prefill_chance: 0.25,
            max_burst: 4,
            max_lifetime: 1000,
            prompt_kv: (256 * KIB, 16 * MIB),
            kv: (16 * KIB, 64 * MIB),
            kv_skew: 3.0,
            kv_append_every: 8,
            activation: (16 * MIB, 256 * MIB),
            temporaries: 32,
            temporary: (4 * KIB, 8 * MIB),
        }
    }
}

/// A running request: when it ends and the ids of its KV blocks.
struct Request {
    arrived: usize,
    ends: usize,
    blocks: Vec<(u64, usize)>,
}

/// Builds the event list: ids are handed out in order, sizes kept for the frees.
struct Trace {
    events: Vec<ReplayEvent>,
    next_id: u64,
}

impl Trace {
    fn allocate(&mut self, bytes: usize) -> (u64, usize) {
        self.next_id += 1;
        self.events.push(ReplayEvent::Allocate { id: self.next_id, bytes });
        (self.next_id, bytes)
    }

    fn free(&mut self, (id, bytes): (u64, usize)) {
        self.events.push(ReplayEvent::Free { id, bytes });
    }
}

impl ServingTrace {
    /// The trace: every allocation is freed by its end.
    pub fn events(&self) -> Vec<ReplayEvent> {
        let mut rng = SplitMix(self.seed);
        let mut trace = Trace { events: Vec::new(), next_id: 0 };
        let mut running: Vec<Request> = Vec::new();
        for step in 0..self.steps {
            let (finished, still): (Vec<_>, Vec<_>) = running.into_iter().partition(|r| r.ends <= step);
            running = still;
            for request in finished {
                request.blocks.into_iter().for_each(|b| trace.free(b));
            }
            let mut step_held = Vec::new();
            if rng.chance(self.prefill_chance) {
                for _ in 0..rng.between(1, self.max_burst.max(1)) {
                    let lifetime = rng.log_uniform(1, self.max_lifetime.max(1));
                    let blocks = (0..rng.between(1, 4)).map(|_| trace.allocate(rng.sized(self.prompt_kv))).collect();
                    running.push(Request { arrived: step, ends: step + lifetime, blocks });
                    for _ in 0..rng.between(1, 3) {
                        step_held.push(trace.allocate(rng.sized(self.activation)));
                    }
                }
            }
            let every = self.kv_append_every.max(1);
            for request in &mut running {
                let age = step - request.arrived;
                if age > 0 && age.is_multiple_of(every) {
                    let bytes = rng.skewed(self.kv, self.kv_skew);
                    request.blocks.push(trace.allocate(bytes));
                }
            }
            let mut window: Vec<((u64, usize), usize)> = Vec::new();
            for i in 0..self.temporaries {
                window.retain(|&(block, free_at)| {
                    let keep = free_at > i;
                    if !keep {
                        trace.free(block);
                    }
                    keep
                });
                let block = trace.allocate(rng.sized(self.temporary));
                window.push((block, i + rng.between(1, 4)));
            }
            step_held.into_iter().for_each(|b| trace.free(b));
            window.into_iter().for_each(|(b, _)| trace.free(b));
        }
        for request in running {
            request.blocks.into_iter().for_each(|b| trace.free(b));
        }
        trace.events
    }
}

/// SplitMix64: small, fast and good enough for a workload model; no dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: usize, high: usize) -> usize {
        low + (self.next() % (high - low + 1) as u64) as usize
    }

    /// Log-uniform in `low..=high` (`low` ≥ 1).
    fn log_uniform(&mut self, low: usize, high: usize) -> usize {
        self.skewed_in(low, high, 1.0)
    }

    /// In `low..=high`, with log2 of the value at `log2(low) + span * u^skew`.
    fn skewed_in(&mut self, low: usize, high: usize, skew: f64) -> usize {
        let (low_log, high_log) = ((low as f64).log2(), (high as f64).log2());
        let value = (low_log + (high_log - low_log) * self.unit().powf(skew)).exp2();
        (value as usize).clamp(low, high)
    }

    /// Bytes log-uniform in `range`, a multiple of 256.
    fn sized(&mut self, range: (usize, usize)) -> usize {
        self.skewed(range, 1.0)
    }

    /// Bytes in `range` skewed by `skew`, a multiple of 256.
    fn skewed(&mut self, (low, high): (usize, usize), skew: f64) -> usize {
        self.skewed_in(low.max(1), high.max(low).max(1), skew).next_multiple_of(256)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn small() -> ServingTrace {
        ServingTrace { steps: 400, max_lifetime: 200, ..ServingTrace::default() }
    }

    #[test]
    #[cfg_attr(miri, ignore = "generates whole traces, minutes each under Miri; the generator has no unsafe code")]
    fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
        assert_eq!(small().events(), small().events());
        assert_ne!(small().events(), ServingTrace { seed: 2, ..small() }.events());
    }

    #[test]
    #[cfg_attr(miri, ignore = "generates whole traces, minutes each under Miri; the generator has no unsafe code")]
    fn every_allocation_is_freed_once_with_its_size_and_sizes_stay_in_range() {
        let model = small();
        let events = model.events();
        let mut live: HashMap<u64, usize> = HashMap::new();
        let (mut allocations, mut largest, mut smallest) = (0, 0, usize::MAX);
        for event in &events {
            match *event {
                ReplayEvent::Allocate { id, bytes } => {
                    assert!(live.insert(id, bytes).is_none(), "id {id} reused");
                    assert!(bytes.is_multiple_of(256));
                    (allocations, largest, smallest) = (allocations + 1, largest.max(bytes), smallest.min(bytes));
                }
                ReplayEvent::Free { id, bytes } => assert_eq!(live.remove(&id), Some(bytes), "free of {id}"),
            }
        }
        assert!(live.is_empty());
        assert!(allocations >= model.steps * model.temporaries);
        assert!(smallest >= model.temporary.0 && largest <= model.activation.1, "{smallest} {largest}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "generates whole traces, minutes each under Miri; the generator has no unsafe code")]
    fn kv_blocks_outlive_steps_and_temporaries_do_not() {
        // Count how many steps' worth of temporaries each allocation outlived: KV blocks span
        // many steps, the rest of the trace stays within one.
        let model = small();
        let events = model.events();
        let mut born: HashMap<u64, usize> = HashMap::new();
        let (mut allocated, mut longest) = (0usize, 0usize);
        for event in &events {
            match *event {
                ReplayEvent::Allocate { id, .. } => {
                    born.insert(id, allocated);
                    allocated += 1;
                }
                ReplayEvent::Free { id, .. } => longest = longest.max(allocated - born[&id]),
            }
        }
        assert!(longest > 50 * model.temporaries, "some blocks live for many steps: {longest}");
    }
}
