//! `cargo xtask package`: `cargo publish --dry-run` of the publishable crates (packaged, then each
//! package built on its own from the packaged files), and checks that every package carries the
//! licence texts and the sys crate its committed bindings, so that it builds without libclang.

use crate::provision;
use crate::util::{self, Result};

/// The crates published to crates.io, in dependency order.
pub const PUBLISHED: [&str; 5] =
    ["cuda-mem-sys", "cuda-mem-cache", "cuda-mem", "cuda-mem-snapshot", "cuda-mem-kernels"];

/// Files the packaged sys crate must contain.
const SYS_BINDINGS: [&str; 2] = ["src/bindings/cuda_13_0.rs", "src/bindings/cuda_12_9.rs"];

/// The licence texts every published package carries (`license = "MIT OR Apache-2.0"`).
const LICENCES: [&str; 2] = ["LICENSE-MIT", "LICENSE-APACHE"];

pub fn run(allow_dirty: bool) -> Result {
    let toolkit = provision::toolkit()?;
    for name in PUBLISHED {
        let listing = util::output(util::cargo().args(["package", "-p", name, "--list", "--allow-dirty"]))?;
        let lacks = |files: &[&'static str]| -> Vec<&'static str> {
            files.iter().copied().filter(|f| !listing.lines().any(|l| l == *f)).collect()
        };
        let licences = lacks(&LICENCES);
        if !licences.is_empty() {
            return Err(format!("the packaged {name} lacks its licence texts: {licences:?}"));
        }
        if name == "cuda-mem-sys" && !lacks(&SYS_BINDINGS).is_empty() {
            return Err(format!("the packaged cuda-mem-sys lacks its committed bindings: {:?}", lacks(&SYS_BINDINGS)));
        }
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
        "cargo xtask package: {} packaged with {LICENCES:?} and verified; cuda-mem-sys carries {SYS_BINDINGS:?}",
        PUBLISHED.join(", ")
    );
    Ok(())
}
