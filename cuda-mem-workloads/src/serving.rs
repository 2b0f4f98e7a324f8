//! LLM serving on many threads: each thread runs a batch of requests on a stream of its own.
//! Per step (one forward pass), following what serving engines allocate:
//!
//! - **Prefill bursts**: with chance `prefill_chance` a request arrives; its prompt allocates a
//!   prefill buffer of 24–96 MiB (log-uniform, freed at the end of the step) and its prompt's KV
//!   cache as 2 MiB pages.
//! - **Decode**: every running request appends a 2 MiB KV page every `tokens_per_page` steps;
//!   a request lives 50–800 steps (log-uniform), then its pages are freed, a quarter of the
//!   time after another thread's stream used them (a request handed over, e.g. for
//!   disaggregated decode: freed in order after that stream's work).
//! - **Per-step tensors**: activations sized by the batch's tokens (hidden 8192, bf16; three per
//!   step), logits (tokens × 32000 × 2 bytes), and fixed scratch (16 KiB, 256 KiB, 1 MiB, 4 MiB),
//!   all freed at the end of the step.
//! - Thread 0 empties the cache every `empty_cache_every` steps, as some engines do between
//!   batches.

use crate::rng::Mt64;
use crate::{Lane, Script, Workload};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// The parameters; the same seed gives the same workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Serving {
    pub seed: u64,
    pub threads: usize,
    pub steps: usize,
    pub prefill_chance: f64,
    pub tokens_per_page: usize,
    /// 0: never.
    pub empty_cache_every: usize,
}

impl Default for Serving {
    fn default() -> Self {
        Self { seed: 11, threads: 6, steps: 3000, prefill_chance: 0.15, tokens_per_page: 16, empty_cache_every: 100 }
    }
}

struct Request {
    pages: Vec<u32>,
    age: usize,
    lifetime: usize,
}

impl Serving {
    pub fn workload(&self) -> Workload {
        let lanes = (0..self.threads).map(|t| self.lane(t)).collect();
        Workload { name: "serving".into(), lanes }
    }

    fn lane(&self, thread: usize) -> Lane {
        let mut rng = Mt64::new(self.seed.wrapping_mul(1000).wrapping_add(thread as u64));
        let (mut s, mut running) = (Script::default(), Vec::<Request>::new());
        for step in 0..self.steps {
            let mut step_blocks = Vec::new();
            // Requests that finished free their pages.
            running.retain_mut(|r| {
                r.age += 1;
                if r.age < r.lifetime {
                    return true;
                }
                let handed = self.threads > 1 && rng.chance(0.25);
                let other = ((thread + 1 + rng.below(self.threads - 1)) % self.threads) as u16;
                for &page in &r.pages {
                    s.free_on(page, handed.then_some(other));
                }
                false
            });
            // A prefill.
            let mut tokens = running.len();
            if rng.chance(self.prefill_chance) {
                let prompt = rng.log_uniform(64, 4096, 16);
                tokens += prompt;
                step_blocks.push(s.alloc(rng.log_uniform(24 * MIB, 96 * MIB, 256)));
                let pages = prompt.div_ceil(self.tokens_per_page * 8);
                let pages = (0..pages).map(|_| s.alloc(2 * MIB)).collect();
                let lifetime = rng.log_uniform(50, 800, 1);
                running.push(Request { pages, age: 0, lifetime });
            }
            // Decode pages.
            for r in &mut running {
                if r.age % self.tokens_per_page == self.tokens_per_page - 1 {
                    r.pages.push(s.alloc(2 * MIB));
                }
            }
            // Per-step tensors.
            let tokens = tokens.max(1);
            for _ in 0..3 {
                step_blocks.push(s.alloc(tokens * 8192 * 2));
            }
            step_blocks.push(s.alloc(tokens.min(256) * 32000 * 2));
            for bytes in [16 * KIB, 256 * KIB, MIB, 4 * MIB] {
                step_blocks.push(s.alloc(bytes));
            }
            for id in step_blocks.into_iter().rev() {
                s.free(id);
            }
            if thread == 0 && self.empty_cache_every > 0 && step % self.empty_cache_every == self.empty_cache_every - 1
            {
                s.empty_cache();
            }
        }
        for r in running {
            for page in r.pages {
                s.free(page);
            }
        }
        s.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_hand_pages_between_streams_and_the_cache_is_emptied() {
        let w = Serving { steps: 600, ..Serving::default() }.workload();
        let shape = w.shape();
        assert_eq!(w.lanes.len(), 6);
        assert!(shape.handoffs > 0, "{shape:?}");
        assert_eq!(shape.empty_caches, 6);
        assert!(shape.largest >= 24 << 20);
    }
}
