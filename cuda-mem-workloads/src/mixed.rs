//! Mixed sizes on many threads: each thread, on a stream of its own, allocates a block per round
//! whose size is drawn from the sizes a model's tensors take (log-uniform 512 B – 8 MiB, in
//! 256-byte steps), keeps its last `window` blocks, and frees the oldest. The shape of a
//! multi-threaded inference server's per-request temporaries, where no two requests look alike.

use crate::rng::Mt64;
use crate::{Script, Workload};
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
                let (mut s, mut live) = (Script::default(), VecDeque::new());
                for _ in 0..self.rounds {
                    live.push_back(s.alloc(rng.log_uniform(self.sizes.0, self.sizes.1, 256)));
                    if live.len() > self.window {
                        s.free(live.pop_front().expect("a live block"));
                    }
                }
                live.into_iter().for_each(|id| s.free(id));
                s.finish()
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
