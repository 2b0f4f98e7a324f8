//! A variable-shape training loop, as a GPT-like model trained with mixed precision allocates:
//! batch and sequence length are drawn anew every step (bucketed by 64 tokens, as padding-free
//! loaders do), so the activations' sizes change every step, which is what defeats allocators
//! tuned for a fixed shape.
//!
//! Per step: for each layer the forward keeps the tensors backward needs (norms, qkv,
//! attention probabilities, MLP input and activation, bf16) and frees its temporaries (attention
//! scores, casts of the weights); the loss's logits are fp32; backward walks the layers in reverse,
//! allocating gradient temporaries and freeing the saved tensors; parameter gradients (fp32) live
//! from their first use in backward to the optimizer step, which allocates temporaries of each
//! parameter's size (as a foreach AdamW does). Parameters and the optimizer's two states are
//! allocated once, before the first step. A recorded PyTorch trace of the same kind of loop
//! (`cuda-mem-bench/workloads/torch_training.py`) is the ground truth beside it.

use crate::rng::Mt64;
use crate::{Script, Workload};

/// The model and loop.
#[derive(Debug, Clone, PartialEq)]
pub struct Training {
    pub seed: u64,
    pub steps: usize,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub vocab: usize,
    /// Batch size range.
    pub batch: (usize, usize),
    /// Sequence length range (multiples of 64).
    pub sequence: (usize, usize),
}

impl Default for Training {
    fn default() -> Self {
        Self {
            seed: 3,
            steps: 200,
            layers: 6,
            hidden: 1024,
            heads: 16,
            vocab: 32000,
            batch: (4, 16),
            sequence: (128, 1024),
        }
    }
}

impl Training {
    pub fn workload(&self) -> Workload {
        let mut rng = Mt64::new(self.seed);
        let mut l = Script::default();
        let d = self.hidden;
        // Per layer: qkv (3d²), out (d²), mlp (8d²), two norms (2d); fp32.
        let layer_params = [3 * d * d, d * d, 4 * d * d, 4 * d * d, d, d];
        let mut params: Vec<usize> = vec![self.vocab * d];
        for _ in 0..self.layers {
            params.extend(layer_params);
        }
        let mut persistent = Vec::new();
        for &p in &params {
            persistent.push(l.alloc(p * 4));
        }
        for &p in &params {
            persistent.push(l.alloc(p * 4)); // exp_avg
            persistent.push(l.alloc(p * 4)); // exp_avg_sq
        }
        for _ in 0..self.steps {
            let b = self.batch.0 + rng.below(self.batch.1 - self.batch.0 + 1);
            let t = (self.sequence.0 + rng.below(self.sequence.1 - self.sequence.0 + 1)) / 64 * 64;
            let n = b * t.max(64);
            let bf16 = |elements: usize| elements * 2;
            let tokens = l.alloc(n * 8);
            let embed = l.alloc(bf16(n * d));
            let mut saved = Vec::new();
            for _ in 0..self.layers {
                let casts: Vec<u32> = layer_params[..4].iter().map(|&p| l.alloc(bf16(p))).collect();
                let norm = l.alloc(bf16(n * d));
                let qkv = l.alloc(bf16(3 * n * d));
                let scores = l.alloc(bf16(b * self.heads * t * t));
                let probs = l.alloc(bf16(b * self.heads * t * t));
                l.free(scores);
                let attn = l.alloc(bf16(n * d));
                let norm2 = l.alloc(bf16(n * d));
                let up = l.alloc(bf16(4 * n * d));
                let act = l.alloc(bf16(4 * n * d));
                let down = l.alloc(bf16(n * d));
                for c in casts {
                    l.free(c);
                }
                saved.push([norm, qkv, probs, attn, norm2, up, act, down]);
            }
            let logits = l.alloc(n * self.vocab * 4);
            let loss = l.alloc(4);
            // Backward.
            let grad_logits = l.alloc(n * self.vocab * 4);
            l.free(logits);
            let mut grads: Vec<u32> = Vec::new();
            grads.push(l.alloc(self.vocab * d * 4));
            let mut grad_h = l.alloc(bf16(n * d));
            l.free(grad_logits);
            for layer in saved.into_iter().rev() {
                for &p in layer_params.iter().rev() {
                    grads.push(l.alloc(p * 4));
                }
                let g_act = l.alloc(bf16(4 * n * d));
                let g_up = l.alloc(bf16(4 * n * d));
                l.free(g_act);
                let g_scores = l.alloc(bf16(b * self.heads * t * t));
                let g_qkv = l.alloc(bf16(3 * n * d));
                l.free(g_scores);
                l.free(g_up);
                let next = l.alloc(bf16(n * d));
                l.free(g_qkv);
                l.free(grad_h);
                grad_h = next;
                for id in layer.into_iter().rev() {
                    l.free(id);
                }
            }
            l.free(grad_h);
            l.free(embed);
            l.free(tokens);
            l.free(loss);
            // Optimizer: foreach temporaries per parameter, then gradients set to None.
            for &p in &params {
                let tmp = l.alloc(p * 4);
                l.free(tmp);
            }
            for g in grads {
                l.free(g);
            }
        }
        for id in persistent {
            l.free(id);
        }
        Workload { name: "training".into(), lanes: vec![l.finish()] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_frees_what_it_allocates_and_its_peak_moves_with_the_shapes() {
        let w = Training { steps: 20, ..Training::default() }.workload();
        let shape = w.shape();
        assert!(shape.allocations > 20 * 100);
        assert!(shape.peak_live_round_robin > 1 << 30, "{shape:?}");
    }
}
