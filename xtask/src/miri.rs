//! `cargo xtask miri`: cuda-mem's unit tests under Miri, with the nightly toolchain's `miri` and
//! `rust-src` added through rustup where missing. Tests Miri cannot run (they call the CUDA
//! runtime, spawn a process, or take long) are ignored under `cfg(miri)`, each with its reason.
//!
//! `cargo xtask test` runs [`ci`]: the CUDA-free allocator core only, within [`CI_BOUND`].

use crate::provision;
use crate::util::{self, Result};
use std::process::Command;
use std::time::Duration;

const COMPONENTS: [&str; 2] = ["miri", "rust-src"];

/// Backtrace capture (the tracking adaptor's test) reads the working directory.
const MIRIFLAGS: &str = "-Zmiri-disable-isolation";

/// The allocator core CI runs under Miri (test name filters): the caching allocator with its
/// size classes and front caches, the thread cache registry and spin lock, the pinned pool's
/// bookkeeping, the watcher thread and the stress schedule (the trace tooling's, which cuda-mem's
/// unit tests build without its feature).
const CORE: [&str; 5] = ["caching::", "thread_cache::", "pinned_pool::", "watcher::", "trace::stress_schedule::"];

/// How long CI lets the core's Miri run take, build included, before it fails the run: several
/// times what it takes on the 2-core build machine (docs/reliability.md), far inside CI's limit.
pub const CI_BOUND: Duration = Duration::from_secs(20 * 60);

/// Every unit test of cuda-mem that Miri can run.
pub fn run() -> Result {
    provision::nightly(&COMPONENTS)?;
    util::run(&mut miri_test(&[])?)
}

/// The allocator core under Miri, for `cargo xtask test`. Where the nightly toolchain or its
/// components cannot be had, says so in one line and passes: the rest of CI decides.
pub fn ci() -> Result {
    if let Err(why) = provision::nightly(&COMPONENTS) {
        eprintln!("miri: skipped ({why})");
        return Ok(());
    }
    util::run_bounded(&mut miri_test(&CORE)?, CI_BOUND)
}

/// `cargo +nightly miri test` over cuda-mem's unit tests, those `filters` name (all without).
fn miri_test(filters: &[&str]) -> Result<Command> {
    let toolkit = provision::toolkit()?;
    // The rustup proxy `cargo` (not $CARGO) understands `+nightly`.
    let mut cmd = Command::new("cargo");
    cmd.current_dir(util::workspace_root())
        .env("CUDA_PATH", &toolkit.root)
        .env("MIRIFLAGS", MIRIFLAGS)
        .args([&format!("+{}", provision::NIGHTLY), "miri", "test", "-p", "cuda-mem", "--lib", "--"])
        .args(filters);
    Ok(cmd)
}
