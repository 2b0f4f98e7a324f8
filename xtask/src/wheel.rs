//! `cargo xtask wheel`: the `cuda-mem` wheel (`cuda-mem-py/pyproject.toml`, built by maturin): the
//! `cuda_mem` package with its extension and the PyTorch allocator's library inside it. Also the
//! check CI runs: the wheel installed into a fresh virtual environment, imported, and the Python
//! tests run from it (without a GPU they check the arguments and the "no driver" errors).

use crate::provision;
use crate::util::{self, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// maturin from PyPI, pinned: a wheel's contents and tags depend on its version, and a release
/// that changed either would change what users install without a commit here.
const MATURIN: &str = "maturin==1.9.6";
/// The oldest glibc manylinux tags name for x86-64 (manylinux2014).
const OLDEST_GLIBC_MINOR: u32 = 17;

/// Builds the wheel into `target/wheels/` and returns its path.
pub fn run() -> Result<PathBuf> {
    let toolkit = provision::toolkit()?;
    let maturin = provision::maturin(MATURIN)?;
    let root = util::workspace_root();
    let package = root.join("cuda-mem-py").join("package").join("cuda_mem");
    let libraries =
        crate::bundle::libraries(&["build", "--release", "-p", "cuda-mem-py", "-p", "cuda-mem-torch-alloc"])?;
    let library = |name: &str| {
        libraries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, path)| path.clone())
            .ok_or_else(|| format!("cargo built no {name} library"))
    };
    let allocator = package.join("libcuda_mem_torch_alloc.so");
    std::fs::copy(library("cuda_mem_torch_alloc")?, &allocator)
        .map_err(|e| format!("copy the allocator's library to {}: {e}", allocator.display()))?;
    util::run(Command::new("strip").arg("--strip-debug").arg(&allocator))?;
    // The tag says the newest glibc either library needs (maturin audits only the extension).
    let minor = [library("cuda_mem_py")?, allocator.clone()]
        .iter()
        .map(|lib| glibc_minor_needed(lib))
        .collect::<Result<Vec<u32>>>()?
        .into_iter()
        .fold(OLDEST_GLIBC_MINOR, u32::max);
    let out = util::target_dir().join("wheels");
    let _ = std::fs::remove_dir_all(&out);
    util::run(
        Command::new(&maturin)
            .args(["build", "--release", "--manifest-path"])
            .arg(root.join("cuda-mem-py").join("Cargo.toml"))
            .arg("--out")
            .arg(&out)
            .args(["--compatibility", &format!("manylinux_2_{minor}")])
            .env("CUDA_PATH", &toolkit.root)
            .env("CARGO_TARGET_DIR", util::target_dir()),
    )?;
    let wheel = std::fs::read_dir(&out)
        .map_err(|e| format!("read {}: {e}", out.display()))?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| format!("maturin wrote no wheel into {}", out.display()))?;
    Ok(wheel)
}

/// The newest `GLIBC_2.N` symbol version `library` needs (its dynamic symbols, through objdump).
fn glibc_minor_needed(library: &Path) -> Result<u32> {
    let symbols = util::output(Command::new("objdump").arg("-T").arg(library))?;
    Ok(newest_glibc_minor(&symbols))
}

/// The largest N of the `GLIBC_2.N` versions named in objdump's output (0 when none).
fn newest_glibc_minor(objdump: &str) -> u32 {
    objdump
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|word| word.strip_prefix("GLIBC_2."))
        .filter_map(|rest| rest.split('.').next()?.parse::<u32>().ok())
        .max()
        .unwrap_or(0)
}

/// Installs `wheel` into a fresh virtual environment under `target/wheel-check` and, with that
/// environment's Python, imports the package and runs the Python tests from the source tree
/// (which holds no package: they import the installed one), after mypy's `stubtest` has checked
/// the type stubs against the extension. Without a GPU, every CUDA call must fail with
/// `cuda_mem.NoDriverError` or `CudaRuntimeError`, which the import check asserts.
pub fn check_installed(wheel: &Path) -> Result {
    let venv = util::target_dir().join("wheel-check");
    let _ = std::fs::remove_dir_all(&venv);
    let python = venv.join("bin").join("python");
    // pip inside the environment, or (Debian's python3 without python3-venv has no ensurepip) an
    // environment without pip, filled by the system's pip.
    let own_pip = util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv)).is_ok();
    if !own_pip {
        let _ = std::fs::remove_dir_all(&venv);
        util::run(Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(&venv))?;
    }
    let install = |what: &std::ffi::OsStr| {
        let mut pip = if own_pip { Command::new(&python) } else { Command::new("python3") };
        pip.args(["-m", "pip"]);
        if !own_pip {
            pip.arg("--python").arg(&python);
        }
        util::run(pip.args(["install", "--quiet", "--disable-pip-version-check", "--no-input"]).arg(what))
    };
    install(wheel.as_os_str())?;
    util::run(Command::new(&python).args(["-c", IMPORT_CHECK]).current_dir(std::env::temp_dir()))?;
    // The type stubs against the built extension: every name, signature and default (mypy needs
    // Python 3.10; an older one skips the step, saying so).
    let mypy_runs = Command::new(&python)
        .args(["-c", "import sys; sys.exit(sys.version_info < (3, 10))"])
        .status()
        .is_ok_and(|status| status.success());
    if mypy_runs {
        install(MYPY.as_ref())?;
        util::run(
            Command::new(&python).args(["-m", "mypy.stubtest", "cuda_mem._cuda_mem"]).current_dir(std::env::temp_dir()),
        )?;
    } else {
        eprintln!("stubtest skipped: {MYPY} needs Python 3.10 or newer");
    }
    let tests = util::workspace_root().join("cuda-mem-py").join("python");
    util::run(Command::new(&python).arg(tests.join("run_tests.py")).current_dir(&tests))
}

/// mypy for its `stubtest`, pinned: a newer release may check more and fail a commit that passed.
/// It needs Python 3.10 or newer.
const MYPY: &str = "mypy==2.4.1";

/// What a new user's first lines do, checked: the package, the allocator's library inside it,
/// the former module name, and either a GPU or an error that says there is none.
const IMPORT_CHECK: &str = r#"
import ctypes, os, cuda_mem, cuda_mem_torch, cuda_mem.cupy
assert cuda_mem_torch is cuda_mem.torch
assert "site-packages" in cuda_mem.__file__, cuda_mem.__file__
ctypes.CDLL(cuda_mem.torch.DEFAULT_PATH)
try:
    print(f"cuda_mem {cuda_mem.__version__}: {cuda_mem.device_count()} GPU(s)")
except cuda_mem.CudaRuntimeError as err:
    assert isinstance(err, cuda_mem.NoDriverError) or "no CUDA-capable device" in str(err), err
    print(f"cuda_mem {cuda_mem.__version__}: no GPU ({err})")
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_glibc_version_is_read_from_objdump() {
        let objdump = "0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.34) pthread_key_create\n\
                       0000000000000000      DF *UND*  0000000000000000  GLIBC_2.2.5 malloc\n\
                       0000000000000000      DF *UND*  0000000000000000 (GLIBCXX_3.4.30) _ZSt4cout\n";
        assert_eq!(newest_glibc_minor(objdump), 34);
        assert_eq!(newest_glibc_minor("no versions"), 0);
    }
}
