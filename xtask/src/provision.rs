//! Provisioning without root: the pinned CUDA wheels go under `target/cuda/<version>` through pip;
//! libclang (for bindgen) comes from Debian's libclang-dev when running as root, else from the
//! `libclang` wheel plus gcc's builtin headers; rustfmt and clippy, the nightly toolchain's
//! components Miri needs, and the published crates' declared rust-version (the MSRV check) come
//! through rustup; cargo-fuzz from crates.io under `target/tools`.

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

/// The pinned `maturin` (from PyPI, through pip) under `target/tools/maturin`: its executable.
pub fn maturin(pin: &str) -> Result<PathBuf> {
    let dir = util::target_dir().join("tools").join("maturin");
    let exe = dir.join("bin").join("maturin");
    let version = pin.rsplit("==").next().unwrap_or(pin);
    let installed = util::output(Command::new(&exe).arg("--version")).ok();
    if installed.as_deref().is_some_and(|v| v.split_whitespace().nth(1) == Some(version)) {
        return Ok(exe);
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("provisioning {pin} into {}", dir.display());
    pip_install(&dir, &[pin])?;
    if exe.exists() { Ok(exe) } else { Err(format!("pip installed {pin} but {} is missing", exe.display())) }
}

/// rustfmt and clippy, which the test run's first steps use: rustup's minimal profile (the one
/// the official Rust Docker images install) leaves both out.
pub fn rust_components() -> Result {
    for (subcommand, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
        let present = util::cargo().args([subcommand, "--version"]).output().is_ok_and(|o| o.status.success());
        if !present {
            util::run(Command::new("rustup").args(["component", "add", component])).map_err(|e| {
                format!("{e}\n`cargo {subcommand}` is missing: install it with `rustup component add {component}`")
            })?;
        }
    }
    Ok(())
}

/// The toolchain Miri needs (and the fuzz targets' AddressSanitizer): rustup's nightly.
pub const NIGHTLY: &str = "nightly";

/// The nightly toolchain with `components`, added through rustup where missing: [`toolchain`].
pub fn nightly(components: &[&str]) -> Result {
    toolchain(NIGHTLY, components)
}

/// The toolchain rustup names `name` (`nightly`, `1.88`) with `components`, added through rustup
/// where missing (the toolchain too, in rustup's minimal profile). An error is one line saying
/// what could not be had and why: some machines cannot fetch a toolchain, and CI then skips the
/// step that needs it.
pub fn toolchain(name: &str, components: &[&str]) -> Result {
    let installed = || rustup(&["component", "list", "--installed", "--toolchain", name]);
    let Ok(listed) = installed() else {
        let joined = components.join(",");
        let mut install = vec!["toolchain", "install", name, "--profile", "minimal"];
        if !components.is_empty() {
            install.extend(["--component", &joined]);
        }
        eprintln!("$ rustup {}", install.join(" "));
        return rustup(&install)
            .map(drop)
            .map_err(|e| format!("no {name} toolchain, and rustup could not install it: {e}"));
    };
    let missing = lacking(&listed, components);
    if missing.is_empty() {
        return Ok(());
    }
    let add = [&["component", "add", "--toolchain", name][..], &missing].concat();
    eprintln!("$ rustup {}", add.join(" "));
    rustup(&add)
        .map_err(|e| format!("the {name} toolchain lacks {}, and rustup could not add it: {e}", missing.join(", ")))?;
    match lacking(&installed()?, components)[..] {
        [] => Ok(()),
        ref still => {
            Err(format!("rustup added {} to {name} but does not list {}", missing.join(", "), still.join(", ")))
        }
    }
}

/// The components of `wanted` missing from rustup's `component list --installed`, which names
/// target-specific ones with their target (`miri-x86_64-unknown-linux-gnu`).
fn lacking<'a>(listed: &str, wanted: &[&'a str]) -> Vec<&'a str> {
    let has = |c: &str| listed.lines().any(|l| l.trim() == c || l.trim().starts_with(&format!("{c}-")));
    wanted.iter().copied().filter(|c| !has(c)).collect()
}

/// rustup's stdout; an error is one line: rustup's own (`error: …`), or why it did not start.
fn rustup(args: &[&str]) -> Result<String> {
    let out = Command::new("rustup").args(args).output().map_err(|e| format!("rustup did not start: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut lines = stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    let reason = lines.clone().find(|l| l.starts_with("error")).or_else(|| lines.next());
    Err(reason.unwrap_or("rustup failed without a message").to_string())
}

/// cargo-fuzz, pinned as the fuzz runs in docs/reliability.md used it.
const CARGO_FUZZ: &str = "0.13.2";

/// The pinned cargo-fuzz under `target/tools/bin`, built from crates.io (`cargo install`) if
/// missing; returns the executable.
pub fn cargo_fuzz() -> Result<PathBuf> {
    let root = util::target_dir().join("tools");
    let exe = root.join("bin").join("cargo-fuzz");
    let version = || Command::new(&exe).args(["fuzz", "--version"]).output().ok().filter(|o| o.status.success());
    if version().is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_FUZZ)) {
        return Ok(exe);
    }
    eprintln!("provisioning cargo-fuzz {CARGO_FUZZ} into {}", root.display());
    util::run(
        util::cargo()
            .args(["install", "cargo-fuzz", "--locked", "--force", "--version", &format!("={CARGO_FUZZ}"), "--root"])
            .arg(&root),
    )
    .map_err(|e| format!("{e}\nprovisioning cargo-fuzz needs access to crates.io"))?;
    Ok(exe)
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

/// The libclang bindgen will load: the one the environment already offers, else Debian's
/// libclang-dev (as root), else the PyPI wheel under target/cuda/libclang.
pub fn libclang() -> Result<Libclang> {
    let search = LibclangSearch::from_env();
    // clang-sys looks nowhere else when LIBCLANG_PATH is set, so neither does provisioning.
    if search.libclang_path.is_some() || find_libclang(&search).is_some() {
        return require_libclang_in(&search).map(|()| Libclang::default());
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
        if find_libclang(&LibclangSearch::from_env()).is_some() {
            return Ok(Libclang::default());
        }
    }
    // The wheel ships libclang without clang's builtin headers (limits.h, stddef.h): borrow gcc's.
    let dir = util::target_dir().join("cuda").join("libclang");
    let native = dir.join("clang/native");
    let in_wheel =
        |native: &Path| find_libclang(&LibclangSearch { libclang_path: Some(native.into()), ..Default::default() });
    if in_wheel(&native).is_none() {
        pip_install(&dir, &[LIBCLANG_WHEEL])?;
    }
    if in_wheel(&native).is_none() {
        return Err(format!(
            "pip installed {LIBCLANG_WHEEL} into {} but {} holds no libclang",
            dir.display(),
            native.display()
        ));
    }
    let gcc_include = Command::new("gcc")
        .arg("-print-file-name=include")
        .output()
        .map_err(|e| format!("the libclang wheel needs gcc's builtin headers, but gcc did not run: {e}"))?;
    let gcc_include = String::from_utf8_lossy(&gcc_include.stdout).trim().to_string();
    Ok(Libclang { path: Some(native), clang_args: vec!["-isystem".into(), gcc_include] })
}

/// Fails, in one sentence saying what to install, where bindgen would find no libclang (bindgen
/// itself panics there). Provisions nothing: for the codegen check inside the test suite, whose
/// environment `cargo xtask test` has set up.
pub fn require_libclang() -> Result {
    require_libclang_in(&LibclangSearch::from_env())
}

fn require_libclang_in(search: &LibclangSearch) -> Result {
    if find_libclang(search).is_some() {
        return Ok(());
    }
    Err(match &search.libclang_path {
        Some(path) => format!(
            "libclang not found: LIBCLANG_PATH is {} but holds no {} (libclang-cpp is not libclang), so point it \
             at the folder holding libclang or unset it",
            path.display(),
            LIBCLANG_NAMES.join(", ")
        ),
        None => "libclang not found: install libclang-dev (`apt-get install libclang-dev`), or set LIBCLANG_PATH \
                 to the folder holding libclang.so, or run `cargo xtask test`, which provisions it"
            .into(),
    })
}

/// The file names clang-sys (which bindgen loads libclang through) accepts at run time on Linux,
/// as globs: clang-sys 1.9, `build/dynamic.rs`. It then drops names containing `-cpp.`
/// (`libclang-cpp.so.14` is clang's C++ library, left by any llvm package) and files that are
/// not ELF libraries of this target's word size.
const LIBCLANG_NAMES: [&str; 4] = ["libclang.so", "libclang-*.so", "libclang.so.*", "libclang-*.so.*"];

/// The folders clang-sys searches on Linux after `LIBCLANG_PATH`, `llvm-config --prefix` and the
/// library path variables, as globs: clang-sys 1.9, `build/common.rs`.
const LIBCLANG_DIRS: [&str; 7] = [
    "/usr/local/llvm*/lib*",
    "/usr/local/lib*/*/*",
    "/usr/local/lib*/*",
    "/usr/local/lib*",
    "/usr/lib*/*/*",
    "/usr/lib*/*",
    "/usr/lib*",
];

/// What clang-sys's search depends on, read from the environment (or made up by tests).
#[derive(Debug, Default)]
struct LibclangSearch {
    /// `LIBCLANG_PATH`: a folder, or a library file; when set, the only place searched.
    libclang_path: Option<PathBuf>,
    /// The first line of `llvm-config --prefix` (`LLVM_CONFIG_PATH` names another llvm-config).
    llvm_prefix: Option<PathBuf>,
    /// The folders of `LD_LIBRARY_PATH`, then of `LIBRARY_PATH`.
    library_paths: Vec<PathBuf>,
    /// Prefixed to [`LIBCLANG_DIRS`]: `/`, or a test's temporary folder.
    root: PathBuf,
}

impl LibclangSearch {
    fn from_env() -> Self {
        let llvm_config = std::env::var_os("LLVM_CONFIG_PATH").unwrap_or_else(|| "llvm-config".into());
        let llvm_prefix = Command::new(llvm_config)
            .arg("--prefix")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(PathBuf::from));
        let library_paths = ["LD_LIBRARY_PATH", "LIBRARY_PATH"]
            .iter()
            .filter_map(std::env::var_os)
            .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
            .collect();
        Self {
            libclang_path: std::env::var_os("LIBCLANG_PATH").map(PathBuf::from),
            llvm_prefix,
            library_paths,
            root: PathBuf::from("/"),
        }
    }
}

/// The first libclang clang-sys would accept, searched where it searches.
fn find_libclang(search: &LibclangSearch) -> Option<PathBuf> {
    if let Some(path) = &search.libclang_path {
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name())
            && let Some(file) = libclang_in(dir).into_iter().find(|f| f.file_name() == Some(name))
        {
            return Some(file);
        }
        return libclang_in(path).into_iter().next();
    }
    let prefix_dirs = search.llvm_prefix.iter().flat_map(|p| ["bin", "lib", "lib64"].map(|sub| p.join(sub)));
    let root = glob::Pattern::escape(&search.root.to_string_lossy());
    let options =
        glob::MatchOptions { case_sensitive: false, require_literal_separator: true, ..glob::MatchOptions::new() };
    let fixed_dirs = LIBCLANG_DIRS
        .iter()
        .filter_map(|dir| glob::glob_with(&format!("{}/{}", root.trim_end_matches('/'), &dir[1..]), options).ok())
        .flat_map(|dirs| dirs.filter_map(std::result::Result::ok).filter(|d| d.is_dir()));
    prefix_dirs
        .chain(search.library_paths.iter().cloned())
        .chain(fixed_dirs)
        .find_map(|dir| libclang_in(&dir).into_iter().next())
}

/// The files in `dir` that clang-sys accepts as libclang.
fn libclang_in(dir: &Path) -> Vec<PathBuf> {
    let dir = glob::Pattern::escape(&dir.to_string_lossy());
    let options = glob::MatchOptions { require_literal_separator: true, ..glob::MatchOptions::new() };
    LIBCLANG_NAMES
        .iter()
        .filter_map(|name| glob::glob_with(&format!("{dir}/{name}"), options).ok())
        .flat_map(|files| files.filter_map(std::result::Result::ok))
        .filter(|file| file.file_name().is_some_and(|n| !n.to_string_lossy().contains("-cpp.")))
        .filter(|file| is_native_elf(file))
        .collect()
}

/// An ELF file of this target's word size (class 2 for 64-bit), as clang-sys checks.
fn is_native_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut header = [0u8; 5];
    let class = if cfg!(target_pointer_width = "64") { 2 } else { 1 };
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut header)).is_ok()
        && header[..4] == *b"\x7fELF"
        && header[4] == class
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `rustup component list --installed` prints: target-specific components carry their
    /// target, the others (rust-src) do not.
    #[test]
    fn components_are_found_with_or_without_their_target() {
        let listed =
            "cargo-x86_64-unknown-linux-gnu\nmiri-x86_64-unknown-linux-gnu\nrust-std-x86_64-unknown-linux-gnu\n";
        assert_eq!(lacking(listed, &["miri", "rust-src"]), ["rust-src"]);
        assert_eq!(lacking(&format!("{listed}rust-src\n"), &["miri", "rust-src"]), [] as [&str; 0]);
        assert_eq!(lacking("rust-std-x86_64-unknown-linux-gnu\n", &["rust-src"]), ["rust-src"]);
    }

    /// A temporary folder standing for `/`, removed on drop.
    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("xtask-libclang-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            FakeRoot(dir)
        }

        /// Writes `path` (relative to the root) starting with `header`.
        fn file(&self, path: &str, header: &[u8]) -> PathBuf {
            let file = self.0.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, header).unwrap();
            file
        }

        fn search(&self) -> LibclangSearch {
            LibclangSearch { root: self.0.clone(), ..Default::default() }
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The start of a 64-bit ELF file.
    const ELF64: &[u8] = b"\x7fELF\x02\x01\x01";

    /// What `libclang-cpp14` leaves on Debian 12: clang's C++ library, which bindgen cannot load.
    #[test]
    fn libclang_cpp_alone_is_not_libclang() {
        let root = FakeRoot::new("cpp");
        root.file("usr/lib/x86_64-linux-gnu/libclang-cpp.so.14", ELF64);
        root.file("usr/lib/llvm-14/lib/libclang-cpp.so.14", ELF64);
        assert_eq!(find_libclang(&root.search()), None);
        let only_cpp = LibclangSearch { libclang_path: Some(root.0.join("usr/lib/llvm-14/lib")), ..root.search() };
        assert_eq!(find_libclang(&only_cpp), None);
        let message = require_libclang_in(&root.search()).unwrap_err();
        assert!(
            message.starts_with("libclang not found: install libclang-dev (`apt-get install libclang-dev`)"),
            "{message}"
        );
        let message = require_libclang_in(&only_cpp).unwrap_err();
        assert!(message.contains("LIBCLANG_PATH is ") && message.contains("unset it"), "{message}");
        root.file("usr/lib/llvm-14/lib/libclang.so.1", ELF64);
        assert_eq!(require_libclang_in(&root.search()), Ok(()));
    }

    /// What `libclang1-14` installs next to it, found in either folder.
    #[test]
    fn versioned_libclang_is_found_next_to_libclang_cpp() {
        for dir in ["usr/lib/x86_64-linux-gnu", "usr/lib/llvm-14/lib", "usr/local/lib", "usr/local/llvm-18/lib64"] {
            let root = FakeRoot::new("versioned");
            root.file(&format!("{dir}/libclang-cpp.so.14"), ELF64);
            let lib = root.file(&format!("{dir}/libclang-14.so.1"), ELF64);
            assert_eq!(find_libclang(&root.search()), Some(lib), "in {dir}");
        }
    }

    #[test]
    fn every_name_clang_sys_loads_is_accepted_and_no_other() {
        for (name, accepted) in [
            ("libclang.so", true),
            ("libclang.so.1", true),
            ("libclang.so.18.1.1", true),
            ("libclang-14.so", true),
            ("libclang-14.0.6.so", true),
            ("libclang-14.so.13", true),
            ("libclang-cpp.so", false),
            ("libclang-cpp.so.14", false),
            ("libclangBasic.a", false),
            ("libclang.a", false),
            ("LibClang.so", false),
            ("libclang-14.a", false),
        ] {
            let root = FakeRoot::new("names");
            let lib = root.file(&format!("usr/lib/{name}"), ELF64);
            assert_eq!(find_libclang(&root.search()), accepted.then_some(lib), "{name}");
        }
    }

    #[test]
    fn only_native_elf_libraries_count() {
        let root = FakeRoot::new("elf");
        root.file("usr/lib/libclang.so", b"/* GNU ld script */");
        root.file("usr/lib/x86_64-linux-gnu/libclang-14.so.1", b"\x7fELF\x01\x01\x01");
        assert_eq!(find_libclang(&root.search()), None);
        let lib = root.file("usr/lib/llvm-14/lib/libclang.so.1", ELF64);
        assert_eq!(find_libclang(&root.search()), Some(lib));
    }

    /// With `LIBCLANG_PATH` set, clang-sys searches there only: a folder, or the library itself.
    #[test]
    fn libclang_path_is_the_only_place_searched() {
        let root = FakeRoot::new("env");
        let system = root.file("usr/lib/llvm-14/lib/libclang.so", ELF64);
        let elsewhere = root.0.join("wheel/clang/native");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let pointed = |path: &Path| LibclangSearch { libclang_path: Some(path.into()), ..root.search() };
        assert_eq!(find_libclang(&pointed(&elsewhere)), None);
        let wheel = root.file("wheel/clang/native/libclang.so", ELF64);
        assert_eq!(find_libclang(&pointed(&elsewhere)), Some(wheel.clone()));
        assert_eq!(find_libclang(&pointed(&wheel)), Some(wheel));
        assert_eq!(find_libclang(&pointed(&system)), Some(system));
    }

    #[test]
    fn llvm_config_prefix_and_library_paths_are_searched() {
        let root = FakeRoot::new("prefix");
        let from_prefix = root.file("opt/llvm/lib64/libclang.so", ELF64);
        let prefixed = LibclangSearch { llvm_prefix: Some(root.0.join("opt/llvm")), ..root.search() };
        assert_eq!(find_libclang(&prefixed), Some(from_prefix));
        let from_path = root.file("somewhere/libclang-17.so.17", ELF64);
        let listed =
            LibclangSearch { library_paths: vec![root.0.join("elsewhere"), root.0.join("somewhere")], ..root.search() };
        assert_eq!(find_libclang(&listed), Some(from_path));
    }
}
