//! `cargo xtask package`: `cargo publish --dry-run` of the publishable crates (packaged, then each
//! package built on its own from the packaged files), and a check that the packaged sys crate
//! carries its committed bindings, so that it builds without libclang.

use crate::provision;
use crate::util::{self, Result};

/// The crates published to crates.io, in dependency order.
pub const PUBLISHED: [&str; 4] = ["cuda-mem-sys", "cuda-mem-cache", "cuda-mem", "cuda-mem-kernels"];

/// Files the packaged sys crate must contain.
const SYS_BINDINGS: [&str; 2] = ["src/bindings/cuda_13_0.rs", "src/bindings/cuda_12_9.rs"];

pub fn run(allow_dirty: bool) -> Result {
    let toolkit = provision::toolkit()?;
    let listing = util::output(util::cargo().args(["package", "-p", "cuda-mem-sys", "--list", "--allow-dirty"]))?;
    let missing: Vec<_> = SYS_BINDINGS.iter().filter(|f| !listing.lines().any(|l| l == **f)).collect();
    if !missing.is_empty() {
        return Err(format!("the packaged cuda-mem-sys lacks its committed bindings: {missing:?}"));
    }
    let mut publish = util::cargo();
    publish.args(["publish", "--dry-run"]).env("CUDA_PATH", &toolkit.root);
    for name in PUBLISHED {
        publish.args(["-p", name]);
    }
    if allow_dirty {
        publish.arg("--allow-dirty");
    }
    util::run(&mut publish)?;
    eprintln!(
        "cargo xtask package: {} packaged and verified; cuda-mem-sys carries {SYS_BINDINGS:?}",
        PUBLISHED.join(", ")
    );
    Ok(())
}
