//! Compiles the raw CUDA C++ reference with nvcc: `reference/raw_reference.cu` into the
//! `raw_reference` executable (copied to `<target-dir>/<profile>/`, where the bundle takes it) and
//! `reference/in_process.cu`, the same batches behind a C ABI, into a static library for `paired`.
//! nvcc is the one cuda-mem-kernels' build script found (`DEP_CUDA_MEM_KERNELS_NVCC`); headers and
//! `cudart_static` are cuda-mem-sys's (`DEP_CUDART_*`). With `DOCS_RS` set nothing is compiled.

use std::env;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// SASS for Ampere and Hopper, plus Hopper PTX, like cuda-mem-kernels' default targets.
const GENCODE: [&str; 2] = ["-gencode=arch=compute_90,code=[sm_90,compute_90]", "-gencode=arch=compute_80,code=sm_80"];

fn main() {
    println!("cargo:rerun-if-changed=reference");
    println!("cargo:rerun-if-env-changed=DOCS_RS");
    if env::var_os("DOCS_RS").is_some() {
        return;
    }
    let nvcc: PathBuf = env::var_os("DEP_CUDA_MEM_KERNELS_NVCC")
        .map(PathBuf::from)
        .expect("cuda-mem-kernels' build script exports its nvcc");
    let dep = |name: &str| env::var_os(format!("DEP_CUDART_{name}")).unwrap_or_default();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    // plans.h: `{"key", K, SAMPLES},` for each row of src/rows.rs's ROWS, one per line there,
    // whose last two arguments are K and the sample count.
    let rows = std::fs::read_to_string("src/rows.rs").expect("src/rows.rs");
    let table = &rows[rows.find("pub const ROWS").expect("ROWS in src/rows.rs")..];
    let plans: String = table
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("];"))
        .map(|line| {
            let key = line.split('"').nth(1).unwrap_or_else(|| panic!("no key in ROWS line {line:?}"));
            let numbers: Vec<&str> = line.trim().trim_end_matches("),").rsplit(',').take(2).map(str::trim).collect();
            format!("{{\"{key}\", {}, {}}},\n", numbers[1], numbers[0])
        })
        .collect();
    std::fs::write(out_dir.join("plans.h"), plans).expect("writing plans.h");
    println!("cargo:rerun-if-changed=src/rows.rs");

    let exe = out_dir.join("raw_reference");
    let mut command = Command::new(&nvcc);
    command.args(["-O2", "-std=c++17", "-cudart", "static"]).args(GENCODE);
    if !dep("LIB").is_empty() {
        let mut flag = OsString::from("-L");
        flag.push(dep("LIB"));
        command.arg(flag);
    }
    command.arg("-I").arg(&out_dir).arg("-o").arg(&exe).arg("reference/raw_reference.cu");
    let output = command.output().unwrap_or_else(|e| panic!("could not run {}: {e}", nvcc.display()));
    if !output.status.success() {
        panic!(
            "nvcc failed to compile reference/raw_reference.cu ({command:?}):\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // OUT_DIR is <target-dir>/<profile>/build/cuda-mem-bench-<hash>/out.
    let profile = out_dir.ancestors().nth(3).expect("OUT_DIR lies three folders below the profile's");
    if let Err(e) = std::fs::copy(&exe, profile.join("raw_reference")) {
        println!("cargo:warning=could not copy raw_reference to {}: {e}", profile.display());
    }

    let target = env::var("TARGET").expect("cargo sets TARGET");
    // SAFETY: the build script is single-threaded here; cc reads NVCC_<target> to find nvcc.
    unsafe { env::set_var(format!("NVCC_{target}"), &nvcc) };
    let mut build = cc::Build::new();
    // `debug(false)`: cc passes `-G` (unoptimised device code) whenever the profile has debug
    // info, release included; the reference kernel must be optimised like raw_reference's.
    build.cuda(true).cudart("none").debug(false).flag("-std=c++17").flag("-O2");
    build.file("reference/in_process.cu").include("reference");
    for flag in GENCODE {
        build.flag(flag);
    }
    for dir in env::split_paths(&dep("INCLUDE")) {
        build.include(dir);
    }
    build.compile("cm_in_process");
}
