//! Compiles `reference/raw_reference.cu`, the raw CUDA C++ yardstick, with nvcc into an executable,
//! and tells the crate where it is (`RAW_REFERENCE_PATH`). A copy is placed at
//! `<target-dir>/<profile>/raw_reference` (next to the `report` binary) when that folder can be
//! recognised from `OUT_DIR`.
//!
//! Also compiles `reference/in_process.cpp` (the same C++ allocation and copy batches,
//! `alloc_batches.h` and `copy_batches.h`, behind a C ABI) into a static library for the `paired` benchmark, with the host C++ compiler and
//! the toolkit's headers (`DEP_CUDART_INCLUDE`); cudart itself comes from cuda-mem-sys.
//!
//! nvcc is taken from, in order: `$DEP_CUDART_BIN/nvcc` (exported by cuda-mem-sys, the toolkit the
//! workspace links against), `$NVCC`, `nvcc` on `PATH`. With `DOCS_RS` set nothing is compiled.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = "reference/raw_reference.cu";
const EXE: &str = "raw_reference";
const SHARED_HEADERS: [&str; 3] =
    ["reference/alloc_batches.h", "reference/copy_batches.h", "reference/read_batches.cuh"];
const IN_PROCESS: &str = "reference/in_process.cpp";
const IN_PROCESS_KERNELS: &str = "reference/in_process_kernels.cu";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed=build.rs");
    for header in SHARED_HEADERS {
        println!("cargo:rerun-if-changed={header}");
    }
    println!("cargo:rerun-if-changed={IN_PROCESS}");
    println!("cargo:rerun-if-changed={IN_PROCESS_KERNELS}");
    if env_var("DOCS_RS").is_some() {
        println!("cargo:rustc-env=RAW_REFERENCE_PATH=");
        return;
    }
    let nvcc = find_nvcc().unwrap_or_else(|tried| {
        eprintln!("error: cuda-mem-bench needs nvcc to compile {SOURCE}. Places tried, in order:");
        for place in tried {
            eprintln!("  - {place}");
        }
        eprintln!("Fix: set NVCC to the nvcc executable, put nvcc on PATH, or let cuda-mem-sys find a full toolkit.");
        std::process::exit(1);
    });
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let exe = out_dir.join(EXE);
    compile(&nvcc, &exe);
    compile_in_process();
    compile_in_process_kernels(&nvcc);

    let published = profile_dir(&out_dir)
        .map(|dir| dir.join(EXE))
        .filter(|stable| match std::fs::copy(&exe, stable) {
            Ok(_) => true,
            Err(e) => {
                println!("cargo:warning=could not copy raw_reference to {}: {e}", stable.display());
                false
            }
        })
        .unwrap_or(exe);
    println!("cargo:rustc-env=RAW_REFERENCE_PATH={}", published.display());
    // Also offered to dependents as DEP_CUDA_MEM_BENCH_RAW_REFERENCE.
    println!("cargo:raw_reference={}", published.display());
}

/// Reads an environment variable and asks cargo to rerun when it changes.
fn env_var(name: &str) -> Option<OsString> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var_os(name).filter(|v| !v.is_empty())
}

fn find_nvcc() -> Result<PathBuf, Vec<String>> {
    let mut tried = Vec::new();
    match env_var("DEP_CUDART_BIN") {
        Some(bin) => {
            let nvcc = Path::new(&bin).join("nvcc");
            if nvcc.is_file() {
                return Ok(nvcc);
            }
            tried.push(format!("$DEP_CUDART_BIN (from cuda-mem-sys): {} does not exist", nvcc.display()));
        }
        None => tried.push("$DEP_CUDART_BIN (from cuda-mem-sys): not set (its toolkit has no bin folder)".into()),
    }
    match env_var("NVCC") {
        Some(nvcc) if Path::new(&nvcc).is_file() => return Ok(nvcc.into()),
        Some(nvcc) => tried.push(format!("$NVCC: {} does not exist", Path::new(&nvcc).display())),
        None => tried.push("$NVCC: not set".into()),
    }
    if let Some(path) = env_var("PATH") {
        if let Some(nvcc) = env::split_paths(&path).map(|dir| dir.join("nvcc")).find(|p| p.is_file()) {
            return Ok(nvcc);
        }
    }
    tried.push("nvcc on PATH: not found".into());
    Err(tried)
}

fn compile(nvcc: &Path, exe: &Path) {
    let mut cmd = Command::new(nvcc);
    cmd.args(["-O2", "-std=c++17"])
        .args(["-gencode", "arch=compute_90,code=[sm_90,compute_90]"])
        .args(["-gencode", "arch=compute_80,code=sm_80"])
        .args(["-cudart", "static"]);
    if let Some(lib) = env_var("DEP_CUDART_LIB") {
        let mut flag = OsString::from("-L");
        flag.push(lib);
        cmd.arg(flag);
    }
    cmd.arg("-o").arg(exe).arg(SOURCE);
    let output = cmd.output().unwrap_or_else(|e| {
        eprintln!("error: could not run {}: {e}", nvcc.display());
        std::process::exit(1);
    });
    if !output.status.success() {
        eprintln!("error: nvcc failed to compile {SOURCE} ({}): {cmd:?}", output.status);
        eprintln!("{}", String::from_utf8_lossy(&output.stdout));
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        std::process::exit(1);
    }
}

/// The C ABI over `alloc_batches.h` and `copy_batches.h` (library `cm_in_process`, linked into this crate).
fn compile_in_process() {
    let mut build = cc::Build::new();
    build.cpp(true).std("c++17").opt_level(2).warnings(true).file(IN_PROCESS).include("reference");
    if let Some(includes) = env_var("DEP_CUDART_INCLUDE") {
        for dir in env::split_paths(&includes) {
            build.include(dir);
        }
    }
    // Host-only code with no C++ runtime use: nothing to link beyond cudart (from cuda-mem-sys).
    build.cpp_link_stdlib(None).compile("cm_in_process");
}

/// The C ABI over `read_batches.cuh` (library `cm_in_process_kernels`): device code, so nvcc
/// compiles it, for the same targets as `raw_reference`.
fn compile_in_process_kernels(nvcc: &Path) {
    let target = env::var("TARGET").expect("cargo sets TARGET");
    // SAFETY: build scripts are single-threaded here; cc reads NVCC_<target> to find nvcc.
    unsafe { env::set_var(format!("NVCC_{target}"), nvcc) };
    let mut build = cc::Build::new();
    build
        .cuda(true)
        .cudart("none")
        // cc passes `-G` (device code unoptimised) whenever the profile has debug info, release
        // included (`debug = "line-tables-only"`): the reference kernel must be optimised like
        // raw_reference's.
        .debug(false)
        .flag("-std=c++17")
        .flag("-O2")
        .flag("-gencode=arch=compute_90,code=[sm_90,compute_90]")
        .flag("-gencode=arch=compute_80,code=sm_80")
        .file(IN_PROCESS_KERNELS)
        .include("reference");
    if let Some(includes) = env_var("DEP_CUDART_INCLUDE") {
        for dir in env::split_paths(&includes) {
            build.include(dir);
        }
    }
    build.compile("cm_in_process_kernels");
}

/// `<target-dir>/<profile>` (or `<target-dir>/<triple>/<profile>`) from
/// `OUT_DIR = <that>/build/cuda-mem-bench-<hash>/out`, checked against that shape.
fn profile_dir(out_dir: &Path) -> Option<PathBuf> {
    let package_dir = out_dir.parent()?;
    let build_dir = package_dir.parent()?;
    let is_shape = out_dir.file_name()? == "out"
        && package_dir.file_name()?.to_str()?.starts_with("cuda-mem-bench-")
        && build_dir.file_name()? == "build";
    let profile = build_dir.parent()?;
    (is_shape && profile.is_dir()).then(|| profile.to_path_buf())
}
