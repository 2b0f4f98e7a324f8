//! `cargo xtask wheel`: the `cuda-mem` wheel (`cuda-mem-py/pyproject.toml`), built by the same
//! PEP 517 backend `pip install ./cuda-mem-py` runs (`cuda-mem-py/build_backend`: the PyTorch
//! allocator's library built with cargo and placed in the package, then maturin), here with CUDA
//! provisioned if missing and maturin at the pyproject's pin. Also the checks CI runs: that wheel,
//! and the one pip builds from the source tree, each installed into a fresh virtual environment,
//! imported, and the Python tests run from it (without a GPU they check the arguments and the "no
//! driver" errors).

use crate::provision;
use crate::util::{self, Result};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The oldest glibc manylinux tags name for x86-64 (manylinux2014).
const OLDEST_GLIBC_MINOR: u32 = 17;

/// The backend's `build_wheel` hook, called as a PEP 517 frontend would (in the project folder),
/// with the output folder as its argument.
const BUILD_WHEEL: &str = "import sys, cuda_mem_backend; cuda_mem_backend.build_wheel(sys.argv[1])";

/// Builds the wheel into `target/wheels/` and returns its path.
pub fn run() -> Result<PathBuf> {
    let toolkit = provision::toolkit()?;
    let project = util::workspace_root().join("cuda-mem-py");
    let pyproject = project.join("pyproject.toml");
    let pyproject = std::fs::read_to_string(&pyproject).map_err(|e| format!("read {}: {e}", pyproject.display()))?;
    // pip installs the pin into the build environment; here, into target/tools/maturin.
    let maturin = provision::maturin(&maturin_pin(&pyproject)?)?;
    let tools = maturin.parent().and_then(Path::parent).ok_or("maturin's executable is in no bin/ folder")?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(tools.join("bin")).chain(std::env::split_paths(&path)))
        .map_err(|e| format!("PATH: {e}"))?;
    let python_path = std::env::join_paths([project.join("build_backend"), tools.to_path_buf()])
        .map_err(|e| format!("PYTHONPATH: {e}"))?;
    // maturin leaves its own copies in target/wheels: the hook writes elsewhere, and the wheel
    // moves there once those are cleared.
    let staging = util::target_dir().join("wheel-build");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format!("create {}: {e}", staging.display()))?;
    util::run(
        Command::new("python3")
            .args(["-c", BUILD_WHEEL])
            .arg(&staging)
            .current_dir(&project)
            .env("PATH", path)
            .env("PYTHONPATH", python_path)
            .env("CUDA_PATH", &toolkit.root)
            .env("CARGO_TARGET_DIR", util::target_dir()),
    )?;
    let built: Vec<PathBuf> = std::fs::read_dir(&staging)
        .map_err(|e| format!("read {}: {e}", staging.display()))?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    let [built] = &built[..] else {
        return Err(format!("the build backend wrote {} wheels into {}: {built:?}", built.len(), staging.display()));
    };
    let out = util::target_dir().join("wheels");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).map_err(|e| format!("create {}: {e}", out.display()))?;
    let wheel = out.join(built.file_name().expect("a wheel has a name"));
    std::fs::rename(built, &wheel).map_err(|e| format!("move {} to {}: {e}", built.display(), wheel.display()))?;
    let _ = std::fs::remove_dir_all(&staging);
    Ok(wheel)
}

/// The `maturin==X` pin of pyproject.toml's `[build-system] requires`.
fn maturin_pin(pyproject: &str) -> Result<String> {
    pyproject
        .lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix("requires")?.trim_start().strip_prefix('='))
        .and_then(|list| list.split('"').find(|item| item.starts_with("maturin==")))
        .map(str::to_string)
        .ok_or_else(|| "cuda-mem-py/pyproject.toml requires no pinned maturin (maturin==X)".to_string())
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

/// Whether a wheel's `WHEEL` file has a `Tag:` for manylinux_2_`minor`.
fn tagged_for_glibc(wheel_file: &str, minor: u32) -> bool {
    let platform = format!("-manylinux_2_{minor}_");
    wheel_file.lines().filter_map(|line| line.strip_prefix("Tag:")).any(|tag| tag.contains(&platform))
}

/// What CI checks of the wheel, each installed into a fresh virtual environment under `target/`:
/// `wheel` (`cargo xtask wheel`'s), then the one `pip install ./cuda-mem-py` builds, through pip's
/// own PEP 517 build (build isolation, nothing from pip's cache; cargo's target folder is the
/// workspace's, so the Rust build is incremental). See [`check_in_fresh_venv`].
pub fn check_installed(wheel: &Path) -> Result {
    check_in_fresh_venv("wheel-check", &[wheel.as_os_str()], &[])?;
    let toolkit = provision::toolkit()?;
    let project = util::workspace_root().join("cuda-mem-py");
    let target = util::target_dir();
    let source = [OsStr::new("--no-cache-dir"), project.as_os_str()];
    check_in_fresh_venv(
        "pip-check",
        &source,
        &[("CUDA_PATH", toolkit.root.as_os_str()), ("CARGO_TARGET_DIR", target.as_os_str())],
    )
}

/// Installs `install` (pip's arguments, with `env`) into a fresh virtual environment under
/// `target/<venv>` and, with that environment's Python, imports the package, checks that the
/// allocator's library is inside it and the wheel's manylinux tag names the newest glibc either
/// library needs, and runs the Python tests from the source tree (which holds no package: they
/// import the installed one), after mypy's `stubtest` has checked the type stubs against the
/// extension. Without a GPU, every CUDA call must fail with `cuda_mem.NoDriverError` or
/// `CudaRuntimeError`, which the import check asserts.
fn check_in_fresh_venv(venv: &str, install: &[&OsStr], env: &[(&str, &OsStr)]) -> Result {
    let venv = util::target_dir().join(venv);
    let _ = std::fs::remove_dir_all(&venv);
    let python = venv.join("bin").join("python");
    // pip inside the environment, or (Debian's python3 without python3-venv has no ensurepip) an
    // environment without pip, filled by the system's pip.
    let own_pip = util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv)).is_ok();
    if !own_pip {
        let _ = std::fs::remove_dir_all(&venv);
        util::run(Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(&venv))?;
    }
    let pip_install = |what: &[&OsStr], env: &[(&str, &OsStr)]| {
        let mut pip = if own_pip { Command::new(&python) } else { Command::new("python3") };
        pip.args(["-m", "pip"]);
        if !own_pip {
            pip.arg("--python").arg(&python);
        }
        pip.args(["install", "--quiet", "--disable-pip-version-check", "--no-input"]).args(what);
        util::run(pip.envs(env.iter().copied()))
    };
    pip_install(install, env)?;
    let package = util::output(Command::new(&python).args(["-c", IMPORT_CHECK]).current_dir(std::env::temp_dir()))?;
    let package = PathBuf::from(package.lines().last().unwrap_or_default());
    eprintln!("{}: imported from {}", venv.display(), package.display());
    check_tag(&package)?;
    // The type stubs against the built extension: every name, signature and default (mypy needs
    // Python 3.10; an older one skips the step, saying so).
    let mypy_runs = Command::new(&python)
        .args(["-c", "import sys; sys.exit(sys.version_info < (3, 10))"])
        .status()
        .is_ok_and(|status| status.success());
    if mypy_runs {
        pip_install(&[MYPY.as_ref()], &[])?;
        util::run(
            Command::new(&python).args(["-m", "mypy.stubtest", "cuda_mem._cuda_mem"]).current_dir(std::env::temp_dir()),
        )?;
    } else {
        eprintln!("stubtest skipped: {MYPY} needs Python 3.10 or newer");
    }
    let tests = util::workspace_root().join("cuda-mem-py").join("python");
    util::run(Command::new(&python).arg(tests.join("run_tests.py")).current_dir(&tests))
}

/// The installed wheel's tag (its `WHEEL` file, beside the package) names the newest glibc the
/// extension or the allocator's library needs, as `cargo xtask wheel`'s always did.
fn check_tag(package: &Path) -> Result {
    let minor = ["_cuda_mem.abi3.so", "libcuda_mem_torch_alloc.so"]
        .iter()
        .map(|lib| glibc_minor_needed(&package.join(lib)))
        .collect::<Result<Vec<u32>>>()?
        .into_iter()
        .fold(OLDEST_GLIBC_MINOR, u32::max);
    let site = package.parent().ok_or("the package is in no folder")?;
    let dist_info = std::fs::read_dir(site)
        .map_err(|e| format!("read {}: {e}", site.display()))?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("cuda_mem-")) && path.is_dir())
        .ok_or_else(|| format!("no cuda_mem-*.dist-info in {}", site.display()))?;
    let wheel_file = dist_info.join("WHEEL");
    let wheel_file = std::fs::read_to_string(&wheel_file).map_err(|e| format!("read {}: {e}", wheel_file.display()))?;
    if tagged_for_glibc(&wheel_file, minor) {
        Ok(())
    } else {
        Err(format!(
            "the wheel's tags are not for manylinux_2_{minor}, the newest glibc its libraries need:\n{wheel_file}"
        ))
    }
}

/// mypy for its `stubtest`, pinned: a newer release may check more and fail a commit that passed.
/// It needs Python 3.10 or newer.
const MYPY: &str = "mypy==2.4.1";

/// What a new user's first lines do, checked: the package, the allocator's library inside it,
/// the former module name, and either a GPU or an error that says there is none. The last line
/// printed is the package's folder.
const IMPORT_CHECK: &str = r#"
import ctypes, os, cuda_mem, cuda_mem_torch, cuda_mem.cupy
assert cuda_mem_torch is cuda_mem.torch
assert "site-packages" in cuda_mem.__file__, cuda_mem.__file__
package = os.path.dirname(cuda_mem.__file__)
assert os.path.dirname(cuda_mem.torch.DEFAULT_PATH) == package, cuda_mem.torch.DEFAULT_PATH
assert os.path.isfile(cuda_mem.torch.DEFAULT_PATH), f"the wheel lacks {cuda_mem.torch.DEFAULT_PATH}"
ctypes.CDLL(cuda_mem.torch.DEFAULT_PATH)
try:
    print(f"cuda_mem {cuda_mem.__version__}: {cuda_mem.device_count()} GPU(s)")
except cuda_mem.CudaRuntimeError as err:
    assert isinstance(err, cuda_mem.NoDriverError) or "no CUDA-capable device" in str(err), err
    print(f"cuda_mem {cuda_mem.__version__}: no GPU ({err})")
print(package)
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

    #[test]
    fn the_wheel_tag_is_matched_against_a_glibc_version() {
        let wheel = "Wheel-Version: 1.0\nGenerator: maturin (1.9.6)\nRoot-Is-Purelib: false\n\
                     Tag: cp39-abi3-manylinux_2_34_x86_64\n";
        assert!(tagged_for_glibc(wheel, 34));
        assert!(!tagged_for_glibc(wheel, 3));
        assert!(!tagged_for_glibc(wheel, 17));
        let both = "Tag: cp39-abi3-manylinux_2_17_x86_64\nTag: cp39-abi3-manylinux2014_x86_64\n";
        assert!(tagged_for_glibc(both, 17));
        assert!(!tagged_for_glibc("Tag: cp39-abi3-linux_x86_64\n", 34));
    }

    /// The pin `cargo xtask wheel` installs is the one pip installs: pyproject.toml's.
    #[test]
    fn maturin_is_pinned_in_pyproject() {
        let pyproject = std::fs::read_to_string(util::workspace_root().join("cuda-mem-py/pyproject.toml")).unwrap();
        let pin = maturin_pin(&pyproject).unwrap();
        assert!(pin.starts_with("maturin==1."), "{pin}");
        assert_eq!(maturin_pin("[build-system]\nrequires = [\"maturin==1.9.6\"]\n").unwrap(), "maturin==1.9.6");
        assert!(
            maturin_pin("[build-system]\nrequires = [\"maturin>=1.9,<2\"]\nrequires-python = \">=3.9\"\n").is_err()
        );
    }
}
