//! `cargo xtask bench`: on a GPU host, the raw CUDA C++ reference, the criterion benchmarks and
//! the report in `target/cuda-mem-report/` (the same sequence as the bundle's `run --bench`).

use crate::util::{self, Result};
use std::process::Command;

pub fn run() -> Result {
    if !util::gpu_present() {
        return Err("no NVIDIA GPU is visible on this host (`nvidia-smi -L` lists none), so there is nothing to \
                    benchmark: run `cargo xtask bench` on a GPU host, or `cargo xtask bundle` here and \
                    `target/bundle/run --bench OUT` there"
            .into());
    }
    let bundle = crate::bundle::run()?;
    let out = util::target_dir().join("cuda-mem-report");
    util::run(Command::new(bundle.join("run")).arg("--bench").arg(&out))?;
    println!("report written to {}", out.join("report").join("report.md").display());
    Ok(())
}
