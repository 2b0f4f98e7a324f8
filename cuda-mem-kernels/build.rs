//! Compiles `kernels/*.cu` with nvcc (through `cc`) into `libcuda_mem_kernels.a` in `OUT_DIR`.
//!
//! * nvcc: `$DEP_CUDART_BIN/nvcc` (the toolkit cuda-mem-sys links against), else `$NVCC`, else the
//!   first `nvcc` on `PATH`.
//! * Targets: `CUDA_MEM_ARCHS`, a comma-separated list of `sm_XY` (SASS) and `compute_XY` (PTX)
//!   entries; default `sm_80,sm_90,compute_90`. Each file is compiled on its own (whole-program
//!   mode, no `-rdc`), so the PTX in the library stays loadable by newer GPUs through the driver's
//!   JIT and no device-link step is needed.
//! * The CUDA runtime is not linked here (`cudart("none")`): cuda-mem-sys already links
//!   `cudart_static`, and a second copy would register the kernels with a different runtime.
//! * With `DOCS_RS` set nothing is compiled; the documentation builds without CUDA.
//!
//! Exports to the crate: `CUDA_MEM_KERNELS_TARGETS` (the normalised target list) and
//! `CUDA_MEM_KERNELS_LIB` (the library's path, read by the fat-binary test); to the build scripts
//! of dependents: `DEP_CUDA_MEM_KERNELS_NVCC`, the nvcc found here (cuda-mem-bench compiles its C++
//! reference with it), and `DEP_CUDA_MEM_KERNELS_TARGETS`.

use std::collections::VecDeque;
use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The variable that chooses the GPU targets.
const ARCHS_VAR: &str = "CUDA_MEM_ARCHS";
/// SASS for Ampere (A100) and Hopper (H100/H200), plus Hopper PTX that newer GPUs JIT-compile.
const DEFAULT_ARCHS: &str = "sm_80,sm_90,compute_90";
/// The static library's name (`lib<LIBRARY>.a`).
const LIBRARY: &str = "cuda_mem_kernels";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let sources = kernel_sources(&manifest_dir.join("kernels"));

    let archs = env_var(ARCHS_VAR);
    let targets = Targets::parse(archs.as_deref().unwrap_or(DEFAULT_ARCHS)).unwrap_or_else(|e| {
        fail(&format!("{ARCHS_VAR}={:?} is not a valid target list: {e}", archs.unwrap_or_default()))
    });
    println!("cargo:rustc-env=CUDA_MEM_KERNELS_TARGETS={}", targets.names().join(","));

    if env_var("DOCS_RS").is_some() {
        return;
    }

    let nvcc = find_nvcc().unwrap_or_else(|tried| {
        let mut message = String::from("cuda-mem-kernels could not find nvcc. Places tried, in order:");
        for place in tried {
            message.push_str("\n  - ");
            message.push_str(&place);
        }
        message.push_str("\nFix: set NVCC to the nvcc executable, put nvcc on PATH, or run `cargo xtask test`.");
        fail(&message)
    });
    // cc takes nvcc from the environment only; the target-specific name is the one it reads first,
    // so the nvcc chosen above wins over any other spelling of the variable.
    let target = env::var("TARGET").expect("cargo sets TARGET");
    // SAFETY: the build script is single-threaded here (the compile threads start below), so no
    // other thread reads or writes the environment concurrently.
    unsafe { env::set_var(format!("NVCC_{target}"), &nvcc) };

    let mut build = cc::Build::new();
    build
        .cuda(true)
        .cudart("none")
        // cc would pass `-G` in debug profiles, which turns off device optimisation: the probes
        // must measure optimised code in every profile. `-lineinfo` keeps profilers useful.
        .debug(false)
        .flag("-lineinfo")
        // nvcc (not only the host compiler, which `cc::Build::std` would reach) parses C++17.
        .flag("-std=c++17")
        .warnings(true);
    for dir in env_paths("DEP_CUDART_INCLUDE") {
        build.include(dir);
    }
    for flag in targets.gencode_flags() {
        build.flag(flag);
    }

    let objects = compile_each(&build, &sources);
    let library = build.try_create_archive(LIBRARY, &objects).unwrap_or_else(|e| fail(&e.to_string()));
    // The static library, the C++ runtime the host stubs need (`__cxa_guard_*` for the kernel
    // handles' thread-safe statics, `__gxx_personality_v0`), and nothing else: no cudart.
    cc::try_emit_link_directives(&build, &library).unwrap_or_else(|e| fail(&e.to_string()));
    println!("cargo:rustc-env=CUDA_MEM_KERNELS_LIB={}", library.display());
    println!("cargo:targets={}", targets.names().join(","));
    println!("cargo:nvcc={}", nvcc.display());
}

/// The `.cu` files of `dir`, sorted; every kernel source (`.cu`, `.cuh`) reruns the build.
fn kernel_sources(dir: &Path) -> Vec<PathBuf> {
    println!("cargo:rerun-if-changed={}", dir.display());
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| fail(&format!("reading {}: {e}", dir.display())));
    let mut sources = Vec::new();
    for entry in entries {
        let path = entry.unwrap_or_else(|e| fail(&format!("reading {}: {e}", dir.display()))).path();
        let extension = path.extension().and_then(|e| e.to_str());
        if matches!(extension, Some("cu" | "cuh")) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        if extension == Some("cu") {
            sources.push(path);
        }
    }
    sources.sort();
    if sources.is_empty() {
        fail(&format!("no .cu files in {}", dir.display()));
    }
    sources
}

/// Compiles every source with its own `cc::Build` (one file per build keeps cc from switching to
/// relocatable device code), a few at a time.
fn compile_each(build: &cc::Build, sources: &[PathBuf]) -> Vec<PathBuf> {
    let queue = Mutex::new(sources.iter().collect::<VecDeque<_>>());
    let workers = std::thread::available_parallelism().map_or(1, usize::from).min(sources.len());
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    while let Some(source) = queue.lock().expect("no worker panics holding the lock").pop_front() {
                        let compiled = build.clone().file(source).try_compile_intermediates();
                        done.push(compiled.map_err(|e| format!("compiling {}: {e}", source.display())));
                    }
                    done
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("compile worker panicked")).collect::<Vec<_>>()
    });
    let mut objects = Vec::new();
    for result in results {
        objects.extend(result.unwrap_or_else(|e| fail(&e)));
    }
    objects.sort();
    objects
}

/// `$DEP_CUDART_BIN/nvcc`, then `$NVCC`, then `nvcc` on `PATH`; the error lists what was tried.
fn find_nvcc() -> Result<PathBuf, Vec<String>> {
    let exe = format!("nvcc{}", env::consts::EXE_SUFFIX);
    let mut tried = Vec::new();
    match env_var("DEP_CUDART_BIN") {
        Some(bin) => {
            let nvcc = Path::new(&bin).join(&exe);
            if nvcc.is_file() {
                return Ok(nvcc);
            }
            tried.push(format!("$DEP_CUDART_BIN (from cuda-mem-sys): {} does not exist", nvcc.display()));
        }
        None => tried.push("$DEP_CUDART_BIN: cuda-mem-sys found no nvcc next to the runtime".into()),
    }
    match env_var("NVCC") {
        Some(nvcc) if Path::new(&nvcc).is_file() => return Ok(nvcc.into()),
        Some(nvcc) => tried.push(format!("$NVCC: {nvcc} is not a file")),
        None => tried.push("$NVCC: not set".into()),
    }
    let on_path = env_var_os("PATH")
        .and_then(|path| env::split_paths(&path).map(|dir| dir.join(&exe)).find(|candidate| candidate.is_file()));
    on_path.ok_or_else(|| {
        tried.push("nvcc on PATH: not found".into());
        tried
    })
}

/// Reads a variable (empty counts as unset) and tells cargo to rerun when it changes.
fn env_var(name: &str) -> Option<String> {
    env_var_os(name).and_then(|v| v.into_string().ok())
}

fn env_var_os(name: &str) -> Option<OsString> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var_os(name).filter(|v| !v.is_empty())
}

/// The folders of a path-list variable (separated like `PATH`).
fn env_paths(name: &str) -> Vec<PathBuf> {
    env_var_os(name).map(|v| env::split_paths(&v).collect()).unwrap_or_default()
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}

/// One entry of `CUDA_MEM_ARCHS`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `sm_XY`: machine code (SASS) for that architecture.
    Sass(String),
    /// `compute_XY`: PTX for that virtual architecture, JIT-compiled by the driver on newer GPUs.
    Ptx(String),
}

impl Target {
    /// The architecture part, e.g. `90` or `90a`.
    fn arch(&self) -> &str {
        match self {
            Self::Sass(arch) | Self::Ptx(arch) => arch,
        }
    }

    fn name(&self) -> String {
        match self {
            Self::Sass(arch) => format!("sm_{arch}"),
            Self::Ptx(arch) => format!("compute_{arch}"),
        }
    }
}

/// The parsed target list, in the order given, without duplicates.
struct Targets(Vec<Target>);

impl Targets {
    fn parse(list: &str) -> Result<Self, String> {
        let mut targets: Vec<Target> = Vec::new();
        for item in list.split([',', ' ', ';']).map(str::trim).filter(|s| !s.is_empty()) {
            let target = if let Some(arch) = item.strip_prefix("sm_") {
                Target::Sass(arch.to_string())
            } else if let Some(arch) = item.strip_prefix("compute_") {
                Target::Ptx(arch.to_string())
            } else {
                return Err(format!("`{item}` is neither sm_XY (SASS) nor compute_XY (PTX)"));
            };
            let arch = target.arch();
            let digits = arch.trim_end_matches(['a', 'f']);
            if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) || arch.len() > digits.len() + 1 {
                return Err(format!("`{item}`: the architecture must be digits with an optional a/f suffix"));
            }
            if !targets.contains(&target) {
                targets.push(target);
            }
        }
        if targets.is_empty() {
            return Err("no targets (example: sm_80,sm_90,compute_90)".into());
        }
        Ok(Self(targets))
    }

    fn names(&self) -> Vec<String> {
        self.0.iter().map(Target::name).collect()
    }

    /// One `-gencode arch=compute_XY,code=[...]` per virtual architecture, in first-seen order.
    fn gencode_flags(&self) -> Vec<String> {
        let mut groups: Vec<(&str, Vec<String>)> = Vec::new();
        for target in &self.0 {
            let code = target.name();
            match groups.iter_mut().find(|(arch, _)| *arch == target.arch()) {
                Some((_, codes)) => codes.push(code),
                None => groups.push((target.arch(), vec![code])),
            }
        }
        groups
            .into_iter()
            .flat_map(|(arch, codes)| {
                ["-gencode".to_string(), format!("arch=compute_{arch},code=[{}]", codes.join(","))]
            })
            .collect()
    }
}
