//! `cargo xtask codegen [--check]`: the committed cuda-mem-sys bindings, one file per CUDA version,
//! generated from the pinned wheels' headers with the configuration in
//! `cuda-mem-sys/build/bindgen_config.rs`.

#[path = "../../cuda-mem-sys/build/bindgen_config.rs"]
mod bindgen_config;

use crate::provision::{self, Toolkit};
use crate::util::{self, Result};
use std::path::PathBuf;

struct BindingSet {
    label: &'static str,
    file: &'static str,
    toolkit: fn() -> Result<Toolkit>,
}

const SETS: [BindingSet; 2] = [
    BindingSet { label: "13.0", file: "cuda_13_0.rs", toolkit: provision::cuda13_pinned },
    BindingSet { label: "12.9", file: "cuda_12_9.rs", toolkit: provision::cuda12_pinned },
];

pub fn bindings_path(file: &str) -> PathBuf {
    util::workspace_root().join("cuda-mem-sys/src/bindings").join(file)
}

pub fn run(check: bool) -> Result {
    let libclang = provision::libclang()?;
    if let Some(path) = &libclang.path {
        if std::env::var_os("LIBCLANG_PATH").as_deref() != Some(path.as_os_str()) {
            // SAFETY: only `cargo xtask codegen` calls `run`, from its main thread before any other
            // thread exists; the test calls `check_or_write`, which leaves the environment alone.
            unsafe { std::env::set_var("LIBCLANG_PATH", path) };
        }
    }
    check_or_write(check, &libclang.clang_args)
}

/// Generates every binding set with the libclang the environment names (bindgen reads
/// `LIBCLANG_PATH` and `BINDGEN_EXTRA_CLANG_ARGS`), then compares or writes.
fn check_or_write(check: bool, clang_args: &[String]) -> Result {
    provision::require_libclang()?;
    let mut stale = Vec::new();
    for set in &SETS {
        let toolkit = (set.toolkit)()?;
        let text = generate(&toolkit, set.label, clang_args)?;
        let path = bindings_path(set.file);
        if check {
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != text {
                stale.push(path.display().to_string());
            }
        } else {
            std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the committed bindings differ from the generator's output: {}\nrun `cargo xtask codegen` and commit",
            stale.join(", ")
        ))
    }
}

fn generate(toolkit: &Toolkit, label: &str, clang_args: &[String]) -> Result<String> {
    let found = format!("{}.{}", toolkit.version / 1000, toolkit.version % 1000 / 10);
    if found != label {
        return Err(format!("expected CUDA {label} headers at {}, found {found}", toolkit.root.display()));
    }
    let bindings = bindgen_config::builder(&toolkit.include_dirs)
        .clang_args(clang_args)
        .raw_line(bindgen_config::preamble(label))
        .generate()
        .map_err(|e| format!("bindgen failed on the CUDA {label} headers: {e}"))?;
    Ok(bindings.to_string())
}

#[cfg(test)]
mod tests {
    /// A failure printed as the plain sentence it is (a returned error shows no backtrace, even
    /// under `RUST_BACKTRACE`).
    struct Failure(String);

    impl std::fmt::Debug for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    /// The suite fails when a committed binding was edited by hand or the generator changed, and,
    /// without libclang, with a sentence saying what to install. `cargo xtask test` provisions
    /// libclang before the suite runs (exporting `LIBCLANG_PATH` when it is the wheel's).
    #[test]
    fn committed_bindings_match_the_generator() -> Result<(), Failure> {
        super::check_or_write(true, &[]).map_err(Failure)
    }
}
