//! `cargo xtask fuzz`: every target in `fuzz/` through cargo-fuzz (pinned, provisioned under
//! `target/tools`), with AddressSanitizer on the nightly toolchain; where no nightly toolchain
//! can be had, on the default toolchain without a sanitizer, said in one line.
//!
//! `cargo xtask test` runs [`smoke`]: [`SMOKE_RUNS`] executions of each target.

use crate::provision;
use crate::util::{self, Result};
use std::process::Command;
use std::time::Duration;

/// Each target with its input size cap (the resource and log targets run many operations per byte).
const TARGETS: [(&str, u32); 6] = [
    ("size_classes", 2048),
    ("staged_plan", 2048),
    ("pinned_cache", 2048),
    ("device_cache", 2048),
    ("resource_adaptors", 512),
    ("replay_log", 512),
];

/// Executions per target in `cargo xtask test`: enough to build every target and walk each one's
/// input decoding and invariant checks, a few seconds each.
pub const SMOKE_RUNS: u64 = 5_000;

/// How long CI lets the smoke take, builds included, before it fails the run.
pub const SMOKE_BOUND: Duration = Duration::from_secs(20 * 60);

/// Each target for `runs` executions.
pub fn run(runs: u64) -> Result {
    let fuzzer = Fuzzer::provision()?;
    TARGETS.iter().try_for_each(|&(target, max_len)| util::run(&mut fuzzer.command(target, max_len, runs)))
}

/// [`SMOKE_RUNS`] executions of each target, for `cargo xtask test`; the targets together within
/// [`SMOKE_BOUND`]. Where cargo-fuzz cannot be had, says so in one line and passes: the rest of CI
/// decides.
pub fn smoke() -> Result {
    let fuzzer = match Fuzzer::provision() {
        Ok(fuzzer) => fuzzer,
        Err(why) => {
            eprintln!("fuzz smoke: skipped ({})", why.replace('\n', "; "));
            return Ok(());
        }
    };
    let started = std::time::Instant::now();
    for (target, max_len) in TARGETS {
        let left = SMOKE_BOUND.saturating_sub(started.elapsed());
        util::run_bounded(&mut fuzzer.command(target, max_len, SMOKE_RUNS), left)?;
    }
    Ok(())
}

/// What runs the targets: cargo-fuzz, the toolchain, the sanitizer and the CUDA headers.
struct Fuzzer {
    cargo_fuzz: std::path::PathBuf,
    toolchain: &'static str,
    sanitizer: &'static str,
    cuda: std::path::PathBuf,
}

impl Fuzzer {
    fn provision() -> Result<Self> {
        let cuda = provision::toolkit()?.root;
        let cargo_fuzz = provision::cargo_fuzz()?;
        // AddressSanitizer is a nightly flag (`-Zsanitizer`); the coverage instrumentation is not.
        let (toolchain, sanitizer) = match provision::nightly(&[]) {
            Ok(()) => (provision::NIGHTLY, "address"),
            Err(why) => {
                eprintln!("fuzz: without AddressSanitizer, on the default toolchain ({why})");
                ("", "none")
            }
        };
        Ok(Self { cargo_fuzz, toolchain, sanitizer, cuda })
    }

    /// `cargo fuzz run` of one target for `runs` executions of inputs up to `max_len` bytes.
    fn command(&self, target: &str, max_len: u32, runs: u64) -> Command {
        let mut cmd = Command::new(&self.cargo_fuzz);
        // cargo-fuzz runs `cargo` and `rustc` through the rustup proxies, which read the toolchain
        // from RUSTUP_TOOLCHAIN; `cargo xtask`'s own cargo and rustc must not leak in.
        for var in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
            cmd.env_remove(var);
        }
        if !self.toolchain.is_empty() {
            cmd.env("RUSTUP_TOOLCHAIN", self.toolchain);
        }
        cmd.current_dir(util::workspace_root().join("fuzz"))
            .env("CUDA_PATH", &self.cuda)
            .args(["fuzz", "run", "-O", "--sanitizer", self.sanitizer, target, "--"])
            .arg(format!("-runs={runs}"))
            .arg(format!("-max_len={max_len}"));
        cmd
    }
}
