//! `cargo xtask miri`: cuda-mem's unit tests under Miri, with the nightly toolchain's `miri` and
//! `rust-src` added through rustup where missing. Tests Miri cannot run (they call the CUDA
//! runtime, spawn a process, or take long) are ignored under `cfg(miri)`, each with its reason.
//!
//! `cargo xtask test` runs [`ci`]: the same, bounded in time, so a test that calls CUDA without
//! `cfg_attr(miri, ignore)` fails CI the day it lands.

use crate::provision;
use crate::util::{self, Result};
use std::process::Command;
use std::time::{Duration, Instant};

const COMPONENTS: [&str; 2] = ["miri", "rust-src"];

/// Backtrace capture (the tracking adaptor's test) reads the working directory.
const MIRIFLAGS: &str = "-Zmiri-disable-isolation";

/// How long CI lets the Miri run take, build included, before it fails the run: about three times what
/// it takes on the 2-core build machine (docs/reliability.md), inside CI's limit.
pub const CI_BOUND: Duration = Duration::from_secs(30 * 60);

/// Every unit test of cuda-mem-cache and cuda-mem that Miri can run.
pub fn run() -> Result {
    provision::nightly(&COMPONENTS)?;
    util::run(&mut cache_test())?;
    util::run(&mut miri_test()?)
}

/// [`run`] for `cargo xtask test`, within [`CI_BOUND`]. Where the nightly toolchain or its
/// components cannot be had, says so in one line and passes: the rest of CI decides.
pub fn ci() -> Result {
    if let Err(why) = provision::nightly(&COMPONENTS) {
        eprintln!("miri: skipped ({why})");
        return Ok(());
    }
    let start = Instant::now();
    util::run_bounded(&mut cache_test(), CI_BOUND)?;
    util::run_bounded(&mut miri_test()?, CI_BOUND.saturating_sub(start.elapsed()))
}

/// `cargo +nightly miri test` over every unit test of cuda-mem-cache, with no CUDA toolkit in
/// sight: the crate needs none.
fn cache_test() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(util::workspace_root()).env_remove("CUDA_PATH").env("MIRIFLAGS", MIRIFLAGS).args([
        &format!("+{}", provision::NIGHTLY),
        "miri",
        "test",
        "-p",
        "cuda-mem-cache",
        "--lib",
    ]);
    cmd
}

/// `cargo +nightly miri test` over every unit test of cuda-mem.
fn miri_test() -> Result<Command> {
    let toolkit = provision::toolkit()?;
    // The rustup proxy `cargo` (not $CARGO) understands `+nightly`.
    let mut cmd = Command::new("cargo");
    cmd.current_dir(util::workspace_root()).env("CUDA_PATH", &toolkit.root).env("MIRIFLAGS", MIRIFLAGS).args([
        &format!("+{}", provision::NIGHTLY),
        "miri",
        "test",
        "-p",
        "cuda-mem",
        "--lib",
    ]);
    Ok(cmd)
}
