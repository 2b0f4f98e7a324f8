//! `cargo xtask bench`: the benchmarks, on a GPU host.

use crate::provision;
use crate::util::{self, Result};

pub fn run() -> Result {
    if !util::gpu_present() {
        return Err("no NVIDIA GPU is visible on this host (`nvidia-smi -L` lists none), so there is nothing to \
                    benchmark: run `cargo xtask bench` on a GPU host, or `cargo xtask bundle` here and \
                    target/bundle/run there"
            .into());
    }
    provision::toolkit()?;
    // Until the criterion suite lands, the main job is the GPU smoke check.
    util::run(util::cargo().args(["run", "--release", "-p", "cuda-mem", "--example", "smoke"]))
}
