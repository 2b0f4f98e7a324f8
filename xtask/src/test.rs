//! `cargo xtask test`: provision CUDA if missing, fmt check, clippy `-D warnings`, and the whole
//! test suite (unit, integration, doc tests, the codegen check), the package dry-run and the GPU
//! bundle's release builds. On a host with a GPU the GPU tests (ignored elsewhere) run too.

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
    util::run(util::cargo().args(["fmt", "--all", "--check"]))?;
    util::run(with_env(util::cargo()).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;

    let gpu = util::gpu_present();
    let mut test = with_env(util::cargo());
    test.args(["test", "--workspace", "--all-targets", "--no-fail-fast"]);
    if gpu {
        test.args(["--", "--include-ignored", "--skip", "no_driver_"]);
        if util::gpu_count() < 2 {
            test.args(["--skip", "gpu2_"]);
        }
    }
    util::run(&mut test)?;
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

    let gpu_note = if gpu { "GPU tests included" } else { "no GPU: GPU tests reported as ignored" };
    eprintln!("cargo xtask test: all passed in {:.0} s ({gpu_note})", started.elapsed().as_secs_f64());
    Ok(())
}

/// The configurations the main run does not cover: the CUDA 12.9 headers and runtime (bindings,
/// signatures that differ from 13, link, and the no-driver path against the 12.9 cudart), docs as
/// docs.rs builds them (no CUDA, warnings denied), and the `bindgen` feature that regenerates
/// bindings at build time. Separate target folders keep the
/// main build's artifacts untouched.
fn check_other_configurations(libclang: &provision::Libclang) -> Result {
    let cuda12 = provision::cuda12_pinned()?;
    let target = util::target_dir();
    util::run(
        util::cargo()
            .args(["test", "-p", "cuda-mem", "--test", "no_driver", "--lib"])
            .env("CUDA_PATH", &cuda12.root)
            .env("CARGO_TARGET_DIR", target.join("check-cuda-12.9")),
    )?;
    // docs.rs: no CUDA at all, and every public item documented.
    let mut docs = util::cargo();
    docs.args(["doc", "--no-deps", "-p", "cuda-mem-sys", "-p", "cuda-mem", "-p", "cuda-mem-kernels"])
        .env("DOCS_RS", "1")
        .env("RUSTDOCFLAGS", "-D warnings")
        .env("CARGO_TARGET_DIR", target.join("check-docs-rs"));
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "NVCC"] {
        docs.env_remove(var);
    }
    util::run(&mut docs)?;
    let cuda13 = provision::cuda13_pinned()?;
    util::run(
        libclang
            .apply(util::cargo())
            .args(["build", "-p", "cuda-mem-sys", "--features", "bindgen"])
            .env("CUDA_PATH", &cuda13.root)
            .env("CARGO_TARGET_DIR", target.join("check-bindgen-feature")),
    )
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

/// Each target with its input size cap (the resource and log targets run many operations per byte).
const FUZZ_TARGETS: [(&str, u32); 5] = [
    ("size_classes", 2048),
    ("staged_plan", 2048),
    ("pinned_cache", 2048),
    ("resource_adaptors", 512),
    ("replay_log", 512),
];

/// Each fuzz target for `runs` executions (needs the nightly toolchain and cargo-fuzz).
pub fn fuzz(runs: u64) -> Result {
    let toolkit = provision::toolkit()?;
    for (target, max_len) in FUZZ_TARGETS {
        util::run(
            std::process::Command::new("cargo")
                .current_dir(util::workspace_root().join("fuzz"))
                .env("CUDA_PATH", &toolkit.root)
                .args(["+nightly", "fuzz", "run", "-O", target, "--"])
                .arg(format!("-runs={runs}"))
                .arg(format!("-max_len={max_len}")),
        )?;
    }
    Ok(())
}

/// The unit tests of cuda-mem under miri, minus the few that call the CUDA runtime (FFI).
pub fn miri() -> Result {
    let toolkit = provision::toolkit()?;
    // The rustup proxy `cargo` (not $CARGO) understands `+nightly`.
    util::run(
        std::process::Command::new("cargo")
            .current_dir(util::workspace_root())
            .env("CUDA_PATH", &toolkit.root)
            // Backtrace capture (the tracking adaptor's test) reads the working directory.
            .env("MIRIFLAGS", "-Zmiri-disable-isolation")
            .args(["+nightly", "miri", "test", "-p", "cuda-mem", "--lib", "--", "--skip", "raw::tests"]),
    )
}
