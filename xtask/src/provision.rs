//! Provisioning without root: the pinned CUDA wheels go under `target/cuda/<version>` through pip;
//! libclang (for bindgen) comes from Debian's libclang-dev when running as root, else from the
//! `libclang` wheel plus gcc's builtin headers.

#[path = "../../cuda-mem-sys/build/find.rs"]
#[allow(dead_code)] // shared with the build script, which uses all of it
mod find;

pub use find::Toolkit;

use crate::util::{self, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pins: CUDA 13.0 (nvvm pinned too: pip would take 13.5, whose PTX ptxas 13.0 rejects).
const CUDA13_WHEELS: &[&str] = &["cuda-toolkit[cudart,nvcc,crt,cccl]==13.0.2", "nvidia-nvvm==13.0.88"];
/// CUDA 12.9: headers and runtime for the 12.x bindings and the build check against them.
const CUDA12_WHEELS: &[&str] = &["nvidia-cuda-runtime-cu12==12.9.79", "nvidia-cuda-nvcc-cu12==12.9.86"];
const LIBCLANG_WHEEL: &str = "libclang==18.1.1";

pub fn provisioned_dir(version: &str) -> PathBuf {
    util::target_dir().join("cuda").join(version)
}

/// The toolkit builds use: whatever discovery finds, else the pinned 13.0 wheels (installed now).
pub fn toolkit() -> Result<Toolkit> {
    if let Some(found) = find::toolkit_at(&provisioned_dir("13.0"), "provisioned") {
        return Ok(found);
    }
    match find::find() {
        Ok(found) => Ok(found),
        Err(_) => cuda13_pinned(),
    }
}

/// The pinned CUDA 13.0 wheels under target/cuda/13.0, installed if missing.
pub fn cuda13_pinned() -> Result<Toolkit> {
    pinned("13.0", CUDA13_WHEELS)
}

/// The pinned CUDA 12.9 wheels under target/cuda/12.9, installed if missing.
pub fn cuda12_pinned() -> Result<Toolkit> {
    pinned("12.9", CUDA12_WHEELS)
}

fn pinned(version: &str, wheels: &[&str]) -> Result<Toolkit> {
    let dir = provisioned_dir(version);
    if let Some(found) = find::toolkit_at(&dir, "provisioned") {
        return Ok(found);
    }
    eprintln!("provisioning CUDA {version} wheels into {}", dir.display());
    pip_install(&dir, wheels)?;
    find::toolkit_at(&dir, "provisioned")
        .ok_or_else(|| format!("pip installed {wheels:?} into {} but no toolkit was found there", dir.display()))
}

fn pip_install(dir: &Path, packages: &[&str]) -> Result {
    util::run(
        Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"])
            .arg("--target")
            .arg(dir)
            .args(packages),
    )
    .map_err(|e| format!("{e}\nprovisioning needs python3 with pip and access to PyPI"))
}

/// What bindgen needs to run: the folder to put in `LIBCLANG_PATH` (if the default search would
/// not find libclang) and extra clang arguments.
#[derive(Debug, Default, Clone)]
pub struct Libclang {
    pub path: Option<PathBuf>,
    pub clang_args: Vec<String>,
}

impl Libclang {
    /// Passes the settings to a child process (bindgen reads both variables).
    pub fn apply(&self, mut cmd: Command) -> Command {
        if let Some(path) = &self.path {
            cmd.env("LIBCLANG_PATH", path);
        }
        if !self.clang_args.is_empty() {
            cmd.env("BINDGEN_EXTRA_CLANG_ARGS", self.clang_args.join(" "));
        }
        cmd
    }
}

pub fn libclang() -> Result<Libclang> {
    if std::env::var_os("LIBCLANG_PATH").is_some() || system_libclang().is_some() {
        return Ok(Libclang::default());
    }
    if is_root() && Path::new("/usr/bin/apt-get").exists() {
        util::run(Command::new("apt-get").args(["update", "-qq"]))?;
        util::run(Command::new("apt-get").env("DEBIAN_FRONTEND", "noninteractive").args([
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "libclang-dev",
        ]))?;
        if system_libclang().is_some() {
            return Ok(Libclang::default());
        }
    }
    // The wheel ships libclang without clang's builtin headers (limits.h, stddef.h): borrow gcc's.
    let dir = util::target_dir().join("cuda").join("libclang");
    let native = dir.join("clang/native");
    if !native.join("libclang.so").exists() {
        pip_install(&dir, &[LIBCLANG_WHEEL])?;
    }
    let gcc_include = Command::new("gcc")
        .arg("-print-file-name=include")
        .output()
        .map_err(|e| format!("the libclang wheel needs gcc's builtin headers, but gcc did not run: {e}"))?;
    let gcc_include = String::from_utf8_lossy(&gcc_include.stdout).trim().to_string();
    Ok(Libclang { path: Some(native), clang_args: vec!["-isystem".into(), gcc_include] })
}

fn system_libclang() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
        .map(|e| e.path().join("lib"))
        .collect();
    dirs.extend(["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/lib"].map(PathBuf::from));
    dirs.into_iter().find(|d| {
        std::fs::read_dir(d).into_iter().flatten().flatten().any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // libclang-cpp.so.14 (the C++ library, installed without libclang-dev) is not libclang.
            let versioned = name.starts_with("libclang-") && !name.starts_with("libclang-cpp");
            name == "libclang.so" || name.starts_with("libclang.so.") || (versioned && name.contains(".so"))
        })
    })
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
