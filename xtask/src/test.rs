//! `cargo xtask test`: provision CUDA if missing, fmt check, clippy `-D warnings`, and the whole
//! test suite (unit, integration, doc tests, the codegen check). On a host with a GPU the GPU tests
//! (ignored elsewhere) run too.

use crate::provision;
use crate::util::{self, Result};
use std::time::Instant;

pub fn run() -> Result {
    let started = Instant::now();
    let toolkit = provision::toolkit()?;
    eprintln!("CUDA {} found ({}): {}", toolkit.version, toolkit.found_by, toolkit.root.display());
    let libclang = provision::libclang()?;

    let with_env = |mut cmd: std::process::Command| {
        if let Some(path) = &libclang.path {
            cmd.env("LIBCLANG_PATH", path);
        }
        cmd
    };
    util::run(util::cargo().args(["fmt", "--all", "--check"]))?;
    util::run(with_env(util::cargo()).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;

    let gpu = util::gpu_present();
    let mut test = with_env(util::cargo());
    test.args(["test", "--workspace", "--all-targets", "--no-fail-fast"]);
    if gpu {
        test.args(["--", "--include-ignored", "--skip", "no_driver_"]);
    }
    util::run(&mut test)?;
    // Doc tests run separately: `--all-targets` leaves them out.
    util::run(with_env(util::cargo()).args(["test", "--workspace", "--doc"]))?;

    let gpu_note = if gpu { "GPU tests included" } else { "no GPU: GPU tests reported as ignored" };
    eprintln!("cargo xtask test: all passed in {:.0} s ({gpu_note})", started.elapsed().as_secs_f64());
    Ok(())
}
