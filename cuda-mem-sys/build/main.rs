//! Finds the CUDA toolkit, links the runtime, picks the committed bindings that match the headers
//! (or regenerates them with the `bindgen` feature), and exports the toolkit to dependents as
//! `DEP_CUDART_ROOT`, `DEP_CUDART_INCLUDE`, `DEP_CUDART_LIB`, `DEP_CUDART_BIN`, `DEP_CUDART_VERSION`.

mod find;

#[cfg(feature = "bindgen")]
mod bindgen_config;

use std::env;
use std::path::PathBuf;

/// Used when no toolkit is needed (docs.rs): the newest committed set.
const DEFAULT_VERSION: u32 = 13000;

fn main() {
    println!("cargo:rerun-if-changed=build");
    println!("cargo::rustc-check-cfg=cfg(cuda_major, values(\"12\", \"13\"))");
    println!("cargo::rustc-check-cfg=cfg(cuda_bindgen)");

    if find::env_var("DOCS_RS").is_some() {
        select_bindings(DEFAULT_VERSION);
        println!("cargo:version={DEFAULT_VERSION}");
        return;
    }

    let toolkit = find::find().unwrap_or_else(|tried| not_found(&tried));
    select_bindings(toolkit.version);
    #[cfg(feature = "bindgen")]
    regenerate(&toolkit);
    link(&toolkit);
    export(&toolkit);
}

fn not_found(tried: &[String]) -> ! {
    eprintln!("error: cuda-mem-sys could not find the CUDA toolkit (cuda_runtime_api.h and libcudart).");
    eprintln!("Places tried, in order:");
    for place in tried {
        eprintln!("  - {place}");
    }
    eprintln!(
        "Fix: set CUDA_PATH to a toolkit root (the folder holding include/cuda_runtime_api.h), put \
         nvcc on PATH, install the PyPI wheels (pip install \"cuda-toolkit[cudart,nvcc,crt,cccl]==13.0.2\" \
         \"nvidia-nvvm==13.0.88\"), or run `cargo xtask test`, which provisions them under target/cuda."
    );
    std::process::exit(1);
}

fn select_bindings(version: u32) {
    let major = version / 1000;
    if !matches!(major, 12 | 13) {
        eprintln!(
            "error: cuda-mem-sys has bindings for CUDA 12.x and 13.0; the headers found say \
             CUDART_VERSION {version}. Point CUDA_PATH at a 12.x or 13.0 toolkit, or build with \
             the `bindgen` feature."
        );
        std::process::exit(1);
    }
    println!("cargo:rustc-cfg=cuda_major=\"{major}\"");
}

#[cfg(feature = "bindgen")]
fn regenerate(toolkit: &find::Toolkit) {
    let version = format!("{}.{}", toolkit.version / 1000, toolkit.version % 1000 / 10);
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("bindings.rs");
    // bindgen itself reads LIBCLANG_PATH and BINDGEN_EXTRA_CLANG_ARGS.
    let bindings = bindgen_config::generate(&toolkit.include_dirs, &[], &version).unwrap_or_else(|e| {
        eprintln!("error: bindgen failed on {}: {e}", toolkit.root.display());
        eprintln!("bindgen needs libclang: set LIBCLANG_PATH or install libclang-dev.");
        std::process::exit(1);
    });
    std::fs::write(&out, bindings).expect("write bindings to OUT_DIR");
    println!("cargo:rustc-cfg=cuda_bindgen");
}

fn link(toolkit: &find::Toolkit) {
    println!("cargo:rustc-link-search=native={}", toolkit.lib_dir.display());
    let shared = env::var_os("CARGO_FEATURE_SHARED").is_some();
    if shared {
        if toolkit.lib_dir.join("libcudart.so").exists() {
            println!("cargo:rustc-link-lib=dylib=cudart");
        } else {
            // Wheels ship only the versioned name (libcudart.so.13).
            let soname = format!("libcudart.so.{}", toolkit.major());
            println!("cargo:rustc-link-lib=dylib:+verbatim={soname}");
        }
        return;
    }
    println!("cargo:rustc-link-lib=static=cudart_static");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        // cudart_static loads libcuda.so.1 at run time and uses threads and clocks.
        for lib in ["dl", "rt", "pthread"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
}

fn export(toolkit: &find::Toolkit) {
    let joined = |dirs: &[PathBuf]| env::join_paths(dirs).expect("paths without separators");
    println!("cargo:root={}", toolkit.root.display());
    println!("cargo:include={}", joined(&toolkit.include_dirs).to_string_lossy());
    println!("cargo:lib={}", toolkit.lib_dir.display());
    if let Some(bin) = &toolkit.bin_dir {
        println!("cargo:bin={}", bin.display());
    }
    println!("cargo:version={}", toolkit.version);
    println!("cargo:found_by={}", toolkit.found_by);
}
