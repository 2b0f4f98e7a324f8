//! CUDA toolkit discovery: environment variables, `nvcc` on `PATH`, `/usr/local/cuda`, the folder
//! `cargo xtask` provisions, and the PyPI wheel layouts in Python's site-packages.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Variables that name a toolkit root, in the order they are tried.
pub const ROOT_VARS: [&str; 4] = ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"];

#[derive(Debug)]
pub struct Toolkit {
    pub root: PathBuf,
    pub include_dirs: Vec<PathBuf>,
    pub lib_dir: PathBuf,
    pub bin_dir: Option<PathBuf>,
    /// `CUDART_VERSION` from `cuda_runtime_api.h`, e.g. 13000.
    pub version: u32,
    pub found_by: String,
}

impl Toolkit {
    pub fn major(&self) -> u32 {
        self.version / 1000
    }
}

/// Reads an environment variable and tells cargo to rerun when it changes.
pub fn env_var(name: &str) -> Option<String> {
    if env::var_os("OUT_DIR").is_some() {
        // Only a build script (which has OUT_DIR) talks to cargo; `cargo xtask` shares this file.
        println!("cargo:rerun-if-env-changed={name}");
    }
    env::var(name).ok().filter(|v| !v.is_empty())
}

/// Every place tried, in order; the error lists them all.
pub fn find() -> Result<Toolkit, Vec<String>> {
    let mut tried = Vec::new();
    let attempt = |dir: PathBuf, how: String, tried: &mut Vec<String>| {
        let found = toolkit_at(&dir, &how);
        if found.is_none() {
            tried.push(format!("{how}: {}", dir.display()));
        }
        found
    };
    for var in ROOT_VARS {
        match env_var(var) {
            Some(dir) => {
                if let Some(t) = attempt(dir.into(), format!("${var}"), &mut tried) {
                    return Ok(t);
                }
            }
            None => tried.push(format!("${var}: not set")),
        }
    }
    let _ = env_var("PATH");
    match nvcc_on_path() {
        Some(nvcc) => {
            let root = nvcc.parent().and_then(Path::parent).map(Path::to_path_buf);
            if let Some(t) = root.and_then(|r| attempt(r, "nvcc on PATH".into(), &mut tried)) {
                return Ok(t);
            }
        }
        None => tried.push("nvcc on PATH: not found".into()),
    }
    if let Some(t) = attempt("/usr/local/cuda".into(), "default install".into(), &mut tried) {
        return Ok(t);
    }
    for dir in provisioned_dirs() {
        if let Some(t) = attempt(dir, "provisioned by `cargo xtask`".into(), &mut tried) {
            return Ok(t);
        }
    }
    for dir in python_site_packages() {
        if let Some(t) = attempt(dir, "Python site-packages (PyPI wheels)".into(), &mut tried) {
            return Ok(t);
        }
    }
    Err(tried)
}

/// Recognises a toolkit root, a wheel root (`nvidia/cu13`, or the CUDA 12 split into
/// `nvidia/cuda_runtime` + `nvidia/cuda_nvcc`), or a folder that holds `nvidia/` (site-packages or
/// a `pip install --target` folder).
pub fn toolkit_at(dir: &Path, how: &str) -> Option<Toolkit> {
    let has_header = |d: &Path| d.join("include/cuda_runtime_api.h").is_file();
    if has_header(dir) {
        let mut include_dirs = vec![dir.join("include")];
        // CUDA 12 wheels: the runtime header needs crt/host_defines.h from the nvcc wheel.
        let split_nvcc = dir.parent().map(|p| p.join("cuda_nvcc")).filter(|p| p.is_dir());
        if let Some(nvcc_root) = &split_nvcc {
            include_dirs.push(nvcc_root.join("include"));
        }
        let lib_dir = lib_dir(dir)?;
        let bin_dir = [Some(dir.to_path_buf()), split_nvcc]
            .into_iter()
            .flatten()
            .map(|r| r.join("bin"))
            .find(|b| b.join("nvcc").is_file());
        let version = cudart_version(&dir.join("include/cuda_runtime_api.h"))?;
        return Some(Toolkit {
            root: dir.to_path_buf(),
            include_dirs,
            lib_dir,
            bin_dir,
            version,
            found_by: how.to_string(),
        });
    }
    // The CUDA 12 nvcc wheel root (found through nvcc on PATH): the runtime is its sibling.
    if dir.ends_with("cuda_nvcc") {
        return toolkit_at(&dir.parent()?.join("cuda_runtime"), how);
    }
    ["nvidia/cu13", "nvidia/cu12", "nvidia/cuda_runtime"]
        .iter()
        .map(|sub| dir.join(sub))
        .find_map(|d| if has_header(&d) { toolkit_at(&d, how) } else { None })
}

fn lib_dir(root: &Path) -> Option<PathBuf> {
    ["lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"].iter().map(|sub| root.join(sub)).find(|d| {
        d.join("libcudart_static.a").is_file()
            || d.join("libcudart.so").exists()
            || std::fs::read_dir(d).is_ok_and(|mut entries| {
                entries.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcudart.so.")))
            })
    })
}

/// Parses `#define CUDART_VERSION 13000`.
pub fn cudart_version(header: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(header).ok()?;
    text.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("#define")?.trim_start();
        rest.strip_prefix("CUDART_VERSION")?.trim().parse().ok()
    })
}

fn nvcc_on_path() -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path).map(|dir| dir.join("nvcc")).find(|p| p.is_file())
}

/// `cargo xtask` installs the pinned wheels under `<target>/cuda/<version>`; the target folder is
/// an ancestor of `OUT_DIR`.
fn provisioned_dirs() -> Vec<PathBuf> {
    let Some(out_dir) = env::var_os("OUT_DIR") else { return Vec::new() };
    Path::new(&out_dir)
        .ancestors()
        .map(|a| a.join("cuda"))
        .filter(|d| d.is_dir())
        .take(1)
        .flat_map(|d| ["13.0", "12.9"].map(|v| d.join(v)))
        .collect()
}

fn python_site_packages() -> Vec<PathBuf> {
    let script = "import site, sysconfig\n\
                  paths = [sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]\n\
                  paths += site.getsitepackages() + [site.getusersitepackages()]\n\
                  print('\\n'.join(paths))";
    ["python3", "python"]
        .iter()
        .find_map(|py| Command::new(py).args(["-c", script]).output().ok().filter(|o| o.status.success()))
        .map(|out| String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from).collect())
        .unwrap_or_default()
}
