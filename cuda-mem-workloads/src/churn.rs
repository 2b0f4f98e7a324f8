//! Churn: the script of RMM's benchmark (`rmmbench`'s churn section, in the peers' folder),
//! operation for operation: one thread, sizes log-uniform from 256 B to 16 MiB, at most 1000
//! live, each step allocating or freeing a random live allocation with even chances. The same
//! engine and distributions (`std::mt19937_64`, libstdc++'s `uniform_real_distribution<double>`,
//! `llround(exp(u))`), so every allocator runs the identical sequence.

use crate::rng::Mt64;
use crate::{Script, Workload};

pub const SEED: u64 = 12345;
pub const OPS: usize = 200_000;
pub const MAX_LIVE: usize = 1000;
const MIB: f64 = (1 << 20) as f64;

/// The script with `ops` operations.
pub fn churn(seed: u64, ops: usize, max_live: usize) -> Workload {
    let mut rng = Mt64::new(seed);
    let (low, high) = (256f64.ln(), (16.0 * MIB).ln());
    // Live allocations in the order the C++ keeps them: a free swaps the last into the hole.
    let mut live: Vec<u32> = Vec::with_capacity(max_live);
    let mut s = Script::default();
    for _ in 0..ops {
        // C++ evaluates `live == 0 || (live < max && coin < 0.5)` left to right: the coin is
        // drawn only when neither bound forces the choice.
        let alloc = live.is_empty() || (live.len() < max_live && rng.uniform(0.0, 1.0) < 0.5);
        if alloc {
            live.push(s.alloc(rng.uniform(low, high).exp().round() as usize));
        } else {
            let victim = (rng.next_u64() % live.len() as u64) as usize;
            let id = live.swap_remove(victim);
            s.free(id);
        }
    }
    live.into_iter().for_each(|id| s.free(id));
    Workload { name: "churn".into(), lanes: vec![s.finish()] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Op;

    #[test]
    fn the_script_is_rmms() {
        let w = churn(SEED, OPS, MAX_LIVE);
        let shape = w.shape();
        assert_eq!(w.lanes.len(), 1);
        assert_eq!(shape.allocations, shape.frees);
        // Sizes within the bounds, and the first ops as rmmbench's generator gives them (the
        // figures printed by a C++ program running that generator with g++ 12 / libstdc++).
        assert!(
            w.lanes[0].ops.iter().all(|op| !matches!(op, Op::Alloc { bytes, .. } if !(256..=16 << 20).contains(bytes)))
        );
        let first = [
            Op::Alloc { id: 0, bytes: 13513 },
            Op::Alloc { id: 1, bytes: 535354 },
            Op::Free { id: 0 },
            Op::Alloc { id: 0, bytes: 352 },
            Op::Free { id: 0 },
            Op::Alloc { id: 0, bytes: 267 },
        ];
        assert_eq!(&w.lanes[0].ops[..6], &first);
        assert_eq!(shape.peak_live_round_robin, 732_910_350);
    }
}
