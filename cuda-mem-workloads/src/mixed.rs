//! Mixed sizes on many threads: each thread, on a stream of its own, allocates a block per round
//! whose size is drawn from the sizes a model's tensors take (log-uniform 512 B – 8 MiB, in
//! 256-byte steps), keeps its last `window` blocks, and frees the oldest. The shape of a
//! multi-threaded inference server's per-request temporaries, where no two requests look alike.

use crate::rng::Mt64;
use crate::{Ids, Lane, Op, Workload};
use std::collections::VecDeque;

/// The parameters; the same seed gives the same workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Mixed {
    pub seed: u64,
    pub threads: usize,
    pub rounds: usize,
    /// Blocks each thread keeps live.
    pub window: usize,
    /// Smallest and largest block.
    pub sizes: (usize, usize),
}

impl Default for Mixed {
    fn default() -> Self {
        Self { seed: 7, threads: 8, rounds: 50_000, window: 8, sizes: (512, 8 << 20) }
    }
}

impl Mixed {
    pub fn workload(&self) -> Workload {
        let lanes = (0..self.threads)
            .map(|t| {
                let mut rng = Mt64::new(self.seed.wrapping_mul(1000).wrapping_add(t as u64));
                let (mut ids, mut live, mut lane) = (Ids::default(), VecDeque::new(), Lane::default());
                for _ in 0..self.rounds {
                    let id = ids.take();
                    lane.ops.push(Op::Alloc { id, bytes: rng.log_uniform(self.sizes.0, self.sizes.1, 256) as u64 });
                    live.push_back(id);
                    if live.len() > self.window {
                        let old = live.pop_front().expect("a live block");
                        lane.ops.push(Op::Free { id: old });
                        ids.give(old);
                    }
                }
                lane.ops.extend(live.into_iter().map(|id| Op::Free { id }));
                lane
            })
            .collect();
        Workload { name: "mixed".into(), lanes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_allocates_once_a_round() {
        let w = Mixed { rounds: 1000, ..Mixed::default() }.workload();
        let shape = w.shape();
        assert_eq!(w.lanes.len(), 8);
        assert_eq!(shape.allocations, 8000);
        assert!(shape.largest <= 8 << 20);
        assert_ne!(w.lanes[0], w.lanes[1], "threads draw their own sizes");
    }
}
