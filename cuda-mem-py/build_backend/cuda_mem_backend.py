"""The PEP 517 build backend of the `cuda-mem` wheel (pyproject.toml: `build-backend`,
`backend-path`): maturin's backend, with the PyTorch allocator's library built first.

maturin builds the extension `cuda_mem._cuda_mem` (this crate) but knows nothing of
`libcuda_mem_torch_alloc.so`, a separate cdylib of the workspace (cuda-mem-torch-alloc) that
`cuda_mem.torch` and `cuda_mem.cupy` load. Before maturin runs, this backend builds that library
with cargo (the profile and target maturin builds for, in the target folder cargo picks: the
workspace's `target/` unless `CARGO_TARGET_DIR` says otherwise, so rebuilds are incremental),
strips its debug info, and places it in `package/cuda_mem/`, which maturin packages
(`[tool.maturin] include`). The wheel's platform tag is the lowest manylinux tag both libraries
meet: maturin picks one for the extension, and the wheel is built again with the allocator's where
that one needs a newer glibc.

`pip install ./cuda-mem-py` and `pip install "git+<repository>#subdirectory=cuda-mem-py"` run
this backend in the source tree (pip >= 21.3), beside the workspace it needs; `cargo xtask wheel`
calls `build_wheel` here too, with its pinned maturin. A source distribution of this folder cannot
hold the workspace, so `build_sdist` refuses, saying how to build a wheel instead.

Needs cargo (on `PATH`), a C++ compiler, binutils (`strip`, `objdump`) and a
CUDA toolkit, which cuda-mem-sys's build script finds (`CUDA_PATH`, `CUDA_HOME`, `CUDA_ROOT`,
`CUDA_TOOLKIT_ROOT_DIR`, `nvcc` on `PATH`, `/usr/local/cuda`, ...) or names every place it tried.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import maturin

# The hooks maturin's backend implements as they are.
from maturin import prepare_metadata_for_build_editable, prepare_metadata_for_build_wheel  # noqa: F401

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

# maturin warns where `build-backend` is not maturin itself, which is this backend's design.
os.environ.setdefault("MATURIN_NO_MISSING_BUILD_BACKEND_WARNING", "1")

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKSPACE = os.path.dirname(PROJECT)
ALLOCATOR_CRATE = "cuda-mem-torch-alloc"
ALLOCATOR = "libcuda_mem_torch_alloc.so"
PACKAGE = os.path.join(PROJECT, "package", "cuda_mem")
# The oldest glibc the manylinux tags name for x86-64 and aarch64 (manylinux2014).
OLDEST_GLIBC_MINOR = 17
INSTALL_HINT = (
    'Install from a clone of the repository (pip install ./cuda-mem-py, pip >= 21.3) or with pip install '
    '"git+<repository>#subdirectory=cuda-mem-py"; cargo xtask wheel builds a wheel to redistribute.'
)


def get_requires_for_build_wheel(config_settings=None):
    # Checked before anything is installed: without cargo, maturin would ask for a Rust installer
    # (puccinialin) that gives maturin a Rust but not this backend.
    _cargo()
    _workspace()
    return maturin.get_requires_for_build_wheel(config_settings)


get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    args = maturin.get_maturin_pep517_args(config_settings)
    glibc_minor = _place_allocator(args)
    if _names_platform(args):
        return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)
    # `--compatibility` without a value: the lowest manylinux tag the extension meets (maturin
    # audits the extension only).
    auto = _with_args(config_settings, ["--compatibility", *args])
    name = maturin.build_wheel(wheel_directory, auto, metadata_directory)
    tagged = _tag_glibc_minor(name)
    if glibc_minor is None or tagged is None or tagged >= glibc_minor:
        return name
    # The allocator needs a newer glibc than the extension: its tag (which the extension meets).
    _log(f"{ALLOCATOR} needs glibc 2.{glibc_minor}: building the wheel again for manylinux_2_{glibc_minor}")
    os.remove(os.path.join(wheel_directory, name))
    tag = ["--compatibility", f"manylinux_2_{glibc_minor}"]
    return maturin.build_wheel(wheel_directory, _with_args(config_settings, [*tag, *args]), metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # The editable wheel points at package/, where the allocator is placed.
    _place_allocator(maturin.get_maturin_pep517_args(config_settings))
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_sdist(sdist_directory, config_settings=None):
    _fail(
        "cuda-mem-py has no source distribution: its wheel also holds the PyTorch allocator's "
        f"library, built from the workspace's {ALLOCATOR_CRATE} crate, which a source distribution "
        "of cuda-mem-py cannot hold. Build the wheel from the source tree instead (python -m build "
        "--wheel, uv build --wheel, pip wheel). " + INSTALL_HINT
    )


def _place_allocator(maturin_args):
    """Builds the allocator's library, strips its debug info, places it in package/cuda_mem/, and
    returns the newest glibc minor version it needs (None where it names none)."""
    workspace = _workspace()
    cargo = _cargo()
    command = [cargo, "build", "-p", ALLOCATOR_CRATE, "--lib", "--message-format=json-render-diagnostics"]
    profile = _option(maturin_args, "--profile")
    command += ["--profile", profile] if profile else ["--release"]  # maturin's PEP 517 default
    target = _option(maturin_args, "--target")
    if target:
        command += ["--target", target]
    _log("building the PyTorch allocator's library: " + shlex.join(command))
    # Progress and diagnostics go to stderr; stdout carries one JSON message a line.
    proc = subprocess.run(command, cwd=workspace, stdout=subprocess.PIPE, text=True)
    built = [path for line in proc.stdout.splitlines() for path in _cdylib(line)]
    if proc.returncode != 0 or len(built) != 1:
        _fail(
            f"`{shlex.join(command)}` failed ({proc.returncode}) in {workspace}. If cuda-mem-sys "
            "could not find the CUDA toolkit, set CUDA_PATH (or CUDA_HOME) to the toolkit's root, "
            "the folder holding include/cuda_runtime_api.h."
            if proc.returncode != 0
            else f"`{shlex.join(command)}` built {len(built)} {ALLOCATOR} files: {built}"
        )
    # Written beside, then renamed over the old one: a process may have the old one loaded (an
    # editable install), which a copy in place would change under it.
    fd, staged = tempfile.mkstemp(prefix=".staged-", suffix=".so", dir=PACKAGE)
    os.close(fd)
    try:
        shutil.copyfile(built[0], staged)
        os.chmod(staged, 0o755)
        # Debug info would multiply the library's size (maturin strips only the extension).
        _run_tool("strip", ["--strip-debug", staged])
        glibc_minor = _newest_glibc_minor(_run_tool("objdump", ["-T", staged]))
        os.replace(staged, os.path.join(PACKAGE, ALLOCATOR))
    finally:
        if os.path.exists(staged):
            os.remove(staged)
    _log(f"placed {os.path.join(PACKAGE, ALLOCATOR)} (built at {built[0]})")
    return glibc_minor


def _cdylib(line):
    """The allocator's shared library named in one line of cargo's JSON messages ([] if none)."""
    try:
        message = json.loads(line)
    except ValueError:
        return []
    target = message.get("target") or {}
    if message.get("reason") != "compiler-artifact" or "cdylib" not in target.get("kind", []):
        return []
    if target.get("name", "").replace("-", "_") != "cuda_mem_torch_alloc":
        return []
    return [f for f in message.get("filenames", []) if f.endswith(".so")]


def _newest_glibc_minor(objdump):
    """The largest N of the GLIBC_2.N symbol versions in `objdump -T`'s output, at least the
    oldest a manylinux tag names (None where it names none)."""
    minors = [int(m) for m in re.findall(r"\bGLIBC_2\.(\d+)", objdump)]
    return max([OLDEST_GLIBC_MINOR, *minors]) if minors else None


def _tag_glibc_minor(wheel_name):
    """The glibc minor version a wheel's platform tag names (None for a tag that names none)."""
    platform = wheel_name[: -len(".whl")].split("-")[-1]
    legacy = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
    minors = [int(m) for m in re.findall(r"manylinux_2_(\d+)_", platform)]
    minors += [minor for name, minor in legacy.items() if f"{name}_" in platform]
    return min(minors) if minors else None


def _names_platform(args):
    return any(a.split("=")[0] in ("--compatibility", "--manylinux") for a in args)


def _option(args, name):
    """The value of `--name VALUE` or `--name=VALUE` in maturin's arguments (the last one)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value


def _with_args(config_settings, args):
    settings = {k: v for k, v in (config_settings or {}).items() if k not in ("build-args", "maturin.build-args")}
    settings["maturin.build-args"] = args
    return settings


def _workspace():
    if os.path.isfile(os.path.join(WORKSPACE, ALLOCATOR_CRATE, "Cargo.toml")):
        return WORKSPACE
    _fail(
        f"{PROJECT} is not inside the cuda-mem workspace ({ALLOCATOR_CRATE}/Cargo.toml is not in "
        f"{WORKSPACE}): the wheel's PyTorch allocator is built from it. pip older than 21.3 copies "
        "the folder elsewhere before building; upgrade pip (python -m pip install -U pip). "
        + INSTALL_HINT
    )


def _cargo():
    # The cargo maturin runs (on PATH), so that both libraries come from one toolchain.
    cargo = shutil.which("cargo") or os.environ.get("CARGO")
    if cargo:
        return cargo
    _fail(
        "cargo was not found on PATH: building cuda-mem needs Rust 1.88 or newer. Install it with "
        "rustup (https://rustup.rs) and open a new shell, or put ~/.cargo/bin on PATH."
    )


def _run_tool(tool, args):
    if shutil.which(tool) is None:
        _fail(f"{tool} was not found on PATH: building the wheel needs binutils (strip, objdump).")
    proc = subprocess.run([tool, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        _fail(f"`{shlex.join([tool, *args])}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _log(message):
    sys.stderr.write(f"cuda-mem build: {message}\n")
    sys.stderr.flush()


def _fail(message):
    sys.stderr.write(f"\nerror: {message}\n\n")
    sys.stderr.flush()
    raise SystemExit(1)
