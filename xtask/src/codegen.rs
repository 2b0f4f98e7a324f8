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
            // SAFETY: `cargo xtask codegen` calls this from its only thread, before bindgen runs.
            // (`cargo xtask test` exports LIBCLANG_PATH to its children, so the test never gets here.)
            unsafe { std::env::set_var("LIBCLANG_PATH", path) };
        }
    }
    let mut stale = Vec::new();
    for set in &SETS {
        let toolkit = (set.toolkit)()?;
        let text = generate(&toolkit, set.label, &libclang.clang_args)?;
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
    /// The suite fails when a committed binding was edited by hand or the generator changed.
    #[test]
    fn committed_bindings_match_the_generator() {
        if let Err(message) = super::run(true) {
            panic!("{message}");
        }
    }
}
