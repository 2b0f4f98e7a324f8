//! `cargo xtask test`: provision CUDA if missing, the tidy rules, fmt check, clippy `-D warnings`, and the whole
//! test suite (unit, integration, doc tests, the codegen check), the package dry-run, the GPU
//! bundle's release builds, the Python wheel installed into a fresh virtual environment and
//! tested, the published crates checked on their declared rust-version (MSRV), the allocator core
//! under Miri and a fuzz smoke of every target. On a
//! host with a GPU the GPU tests (ignored elsewhere) run too.

use crate::provision;
use crate::util::{self, Result};
use std::time::Instant;

pub fn run() -> Result {
    let started = Instant::now();
    let toolkit = provision::toolkit()?;
    eprintln!("CUDA {} found ({}): {}", toolkit.version, toolkit.found_by, toolkit.root.display());
    let libclang = provision::libclang()?;
    provision::rust_components()?;

    let with_env = |cmd: std::process::Command| libclang.apply(cmd);
    // The quick textual checks first: their failures read faster than a compile's.
    crate::tidy::run()?;
    util::run(util::cargo().args(["fmt", "--all", "--check"]))?;
    util::run(with_env(util::cargo()).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;

    let gpu = util::gpu_present();
    // Every pass runs even when one fails, so that each failing test is reported.
    let passes: Vec<Result> = test_passes(gpu)
        .into_iter()
        .map(|args| {
            let mut test = with_env(util::cargo());
            util::run(test.args(["test", "--workspace", "--all-targets", "--no-fail-fast"]).args(args))
        })
        .collect();
    passes.into_iter().collect::<Result>()?;
    // Doc tests run separately: `--all-targets` leaves them out.
    util::run(with_env(util::cargo()).args(["test", "--workspace", "--doc"]))?;

    check_other_configurations(&libclang)?;
    // Packaging is part of every test run, so a change that breaks `cargo publish` fails CI. The
    // tree is a fresh clone on CI; locally, uncommitted edits are what is being tested.
    crate::package::run(true)?;
    // The bundle is what GPU hosts run: its optimised builds (tests, examples, benchmarks, the
    // report) must link too, which the debug builds above do not prove.
    let bundle = crate::bundle::run()?;
    eprintln!("bundle built: {}", bundle.display());
    // The wheel as a new user gets it: built, installed into a fresh virtual environment,
    // imported, and the Python tests run from it (here without a GPU: the argument checks and
    // the no-driver errors).
    let wheel = crate::wheel::run()?;
    crate::wheel::check_installed(&wheel)?;
    // The published crates on their declared rust-version, the allocator core under Miri and a
    // short fuzz of every target (the last two bounded in time); last, as the only steps that need
    // toolchains or tools a machine may lack (said in one line), and the slowest.
    crate::msrv::ci()?;
    crate::miri::ci()?;
    compile_fail_codes(&libclang)?;
    crate::fuzz::smoke()?;

    let gpu_note = if gpu { "GPU tests included" } else { "no GPU: GPU tests reported as ignored" };
    eprintln!("cargo xtask test: all passed in {:.0} s ({gpu_note})", started.elapsed().as_secs_f64());
    Ok(())
}

/// The crates whose doc tests include `compile_fail` examples with error codes.
const COMPILE_FAIL_CRATES: [&str; 2] = ["cuda-mem", "cuda-mem-nccl"];

/// The doc tests again on the nightly toolchain, where rustdoc compares each `compile_fail,E0…`
/// example's error codes with the compiler's (stable's pass above proves only that they fail to
/// compile, for whatever reason). Skipped, with a line, where nightly cannot be had.
fn compile_fail_codes(libclang: &provision::Libclang) -> Result {
    if let Err(why) = provision::nightly(&[]) {
        eprintln!("compile-fail codes: skipped ({why})");
        return Ok(());
    }
    let toolkit = provision::toolkit()?;
    let target = util::workspace_root().join("target").join("nightly-doc");
    // The rustup proxy `cargo` (not $CARGO) understands `+nightly`.
    let mut cmd = libclang.apply(std::process::Command::new("cargo"));
    cmd.current_dir(util::workspace_root()).env("CUDA_PATH", &toolkit.root).env("CARGO_TARGET_DIR", target);
    cmd.args([&format!("+{}", provision::NIGHTLY), "test", "--doc", "--all-features"]);
    COMPILE_FAIL_CRATES.iter().for_each(|krate| {
        cmd.args(["-p", krate]);
    });
    util::run(&mut cmd)
}

/// GPU tests that need the device to themselves start with this (see `cuda-mem/tests/common/mod.rs`).
pub const ALONE: &str = "gpu_alone_";

/// The test harness arguments of each `cargo test` pass. Without a GPU, one pass (GPU tests
/// report ignored). With one: every test but the `gpu_alone_` ones in parallel, then those one at
/// a time; cargo runs test executables one after another, so nothing else runs beside them. No
/// other filter: the tests that cannot run on this host (`no_driver_` ones beside a driver,
/// `gpu2_` ones on one GPU) skip themselves with a line on stderr.
fn test_passes(gpu: bool) -> Vec<Vec<&'static str>> {
    if !gpu {
        return vec![vec![]];
    }
    let parallel = vec!["--", "--include-ignored", "--skip", ALONE];
    let alone = vec!["--", "--include-ignored", ALONE, "--test-threads=1"];
    vec![parallel, alone]
}

/// The configurations the main run does not cover: cuda-mem-cache with no CUDA toolkit in sight
/// (it has no build script and no CUDA dependency; this proves it stays so), the CUDA 12.9 headers and runtime (bindings,
/// signatures that differ from 13, link, and the no-driver path against the 12.9 cudart), docs as
/// docs.rs builds them (no CUDA, warnings denied), and the `bindgen` feature that regenerates
/// bindings at build time. Separate target folders keep the
/// main build's artifacts untouched.
fn check_other_configurations(libclang: &provision::Libclang) -> Result {
    let target = util::target_dir();
    let mut cache = util::cargo();
    cache
        .args(["test", "-p", "cuda-mem-cache", "--all-features"])
        .env("CARGO_TARGET_DIR", target.join("check-no-cuda"));
    util::run(without_cuda(&mut cache))?;
    let cuda12 = provision::cuda12_pinned()?;
    util::run(
        util::cargo()
            .args(["test", "-p", "cuda-mem", "--test", "no_driver", "--lib"])
            .env("CUDA_PATH", &cuda12.root)
            .env("CARGO_TARGET_DIR", target.join("check-cuda-12.9")),
    )?;
    // docs.rs: no CUDA at all, and every public item documented.
    let mut docs = util::cargo();
    docs.args([
        "doc",
        "--no-deps",
        "-p",
        "cuda-mem-sys",
        "-p",
        "cuda-mem-cache",
        "-p",
        "cuda-mem",
        "-p",
        "cuda-mem-snapshot",
        "-p",
        "cuda-mem-kernels",
    ])
    .env("DOCS_RS", "1")
    .env("RUSTDOCFLAGS", "-D warnings")
    .env("CARGO_TARGET_DIR", target.join("check-docs-rs"));
    util::run(without_cuda(&mut docs))?;
    let cuda13 = provision::cuda13_pinned()?;
    util::run(
        libclang
            .apply(util::cargo())
            .args(["build", "-p", "cuda-mem-sys", "--features", "bindgen"])
            .env("CUDA_PATH", &cuda13.root)
            .env("CARGO_TARGET_DIR", target.join("check-bindgen-feature")),
    )
}

/// `cmd` with every variable that points at a CUDA toolkit removed.
fn without_cuda(cmd: &mut std::process::Command) -> &mut std::process::Command {
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "NVCC"] {
        cmd.env_remove(var);
    }
    cmd
}

/// The GPU test executables under compute-sanitizer's memcheck, racecheck and synccheck.
pub fn sanitize() -> Result {
    if !util::gpu_present() {
        return Err("`cargo xtask test --sanitize` needs a GPU host (nvidia-smi lists no GPU)".into());
    }
    provision::toolkit()?;
    let dir = crate::bundle::run()?;
    util::run(std::process::Command::new(dir.join("run")).arg("--sanitize"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What libtest runs with these arguments (after `--`): ignored tests (here the `gpu` ones)
    /// only with `--include-ignored`, then those some filter is a substring of (or all, without
    /// filters) and no `--skip` is.
    fn selected<'a>(args: &[&str], tests: &[&'a str]) -> Vec<&'a str> {
        let harness: Vec<&str> = args.iter().skip_while(|a| **a != "--").skip(1).copied().collect();
        let (mut filters, mut skips, mut include_ignored): (Vec<&str>, Vec<&str>, bool) = (vec![], vec![], false);
        let mut rest = harness.iter();
        while let Some(arg) = rest.next() {
            match *arg {
                "--include-ignored" => include_ignored = true,
                "--skip" => skips.extend(rest.next()),
                flag if flag.starts_with("--") => {}
                filter => filters.push(filter),
            }
        }
        tests
            .iter()
            .copied()
            .filter(|t| include_ignored || !t.starts_with("gpu"))
            .filter(|t| filters.is_empty() || filters.iter().any(|f| t.contains(f)))
            .filter(|t| !skips.iter().any(|s| t.contains(s)))
            .collect()
    }

    const TESTS: [&str; 5] =
        ["pool::tests::props", "no_driver_malloc", "gpu_round_trip", "gpu_alone_trim", "gpu2_peer"];

    #[test]
    fn without_a_gpu_one_pass_reports_gpu_tests_ignored() {
        let passes = test_passes(false);
        assert_eq!(passes.len(), 1);
        assert_eq!(selected(&passes[0], &TESTS), ["pool::tests::props", "no_driver_malloc"]);
    }

    /// The `no_driver_` and `gpu2_` tests run too: they skip themselves where they cannot pass.
    #[test]
    fn gpu_alone_tests_run_after_all_the_others_one_at_a_time() {
        let passes = test_passes(true);
        assert_eq!(passes.len(), 2);
        assert_eq!(
            selected(&passes[0], &TESTS),
            ["pool::tests::props", "no_driver_malloc", "gpu_round_trip", "gpu2_peer"],
            "{passes:?}"
        );
        assert!(!passes[0].iter().any(|a| a.starts_with("--test-threads")), "{passes:?}");
        assert_eq!(selected(&passes[1], &TESTS), ["gpu_alone_trim"], "{passes:?}");
        assert!(passes[1].contains(&"--test-threads=1"), "{passes:?}");
    }
}
