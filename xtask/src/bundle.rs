//! `cargo xtask bundle`: GPU test executables and examples, built here, in one folder with a `run`
//! script, for a GPU host that has only a driver (no Rust).

use crate::provision;
use crate::util::{self, Result};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Stdio;

pub fn run() -> Result<PathBuf> {
    provision::toolkit()?;
    let dir = util::target_dir().join("bundle");
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["tests", "examples", "bench"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let tests =
        build(&["test", "--workspace", "--exclude", "xtask", "--no-run", "--release"], |kind| kind != "example")?;
    let examples =
        build(&["build", "--workspace", "--exclude", "xtask", "--examples", "--release"], |kind| kind == "example")?;
    let mut bench =
        build(&["bench", "-p", "cuda-mem-bench", "--features", "cudarc", "--no-run"], |kind| kind == "bench")?;
    bench.extend(build(&["build", "--release", "-p", "cuda-mem-bench", "--bin", "report"], |kind| kind == "bin")?);
    bench.push(util::target_dir().join("release").join("raw_reference"));
    for (sub, exes) in [("tests", tests), ("examples", examples), ("bench", bench)] {
        for exe in exes {
            let name = exe.file_name().expect("an executable has a name");
            let copy = dir.join(sub).join(name);
            std::fs::copy(&exe, &copy).map_err(|e| format!("copy {}: {e}", exe.display()))?;
            // Debug info triples the size; the bundle travels to GPU hosts with size limits.
            let _ = std::process::Command::new("strip").arg("--strip-debug").arg(&copy).status();
        }
    }
    let script = dir.join("run");
    std::fs::write(&script, RUN_SCRIPT).map_err(|e| format!("write {}: {e}", script.display()))?;
    make_executable(&script)?;
    Ok(dir)
}

/// Builds through cargo's JSON messages and returns the executables whose target kind matches.
fn build(args: &[&str], keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut child = util::cargo()
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cargo did not start: {e}"))?;
    let mut exes = Vec::new();
    let stdout = child.stdout.take().expect("piped stdout");
    for line in std::io::BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        let (Some(exe), Some(kind)) = (msg["executable"].as_str(), msg["target"]["kind"][0].as_str()) else {
            continue;
        };
        if keep(kind) {
            exes.push(PathBuf::from(exe));
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    Ok(exes)
}

fn make_executable(path: &Path) -> Result {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
}

const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# Runs the GPU suite on a host that has only the NVIDIA driver.
#   ./run                     every test executable (GPU tests included), then the examples
#   ./run --sanitize [TOOL]   the tests under compute-sanitizer TOOL (memcheck, racecheck,
#                             synccheck) or all three
#   ./run --bench OUT         raw C++ reference, criterion benchmarks, the same-process
#                             interleaved comparison (paired), its rows over target profiled
#                             through CUPTI (time inside CUDA calls; skipped without CUPTI), a second
#                             reference run of the allocation and managed rows (noise floor),
#                             and the report in OUT/report
# STRESS_SECONDS bounds the stress example (default 300); BENCH_RERUN=0 skips the second
# reference run.
set -u
cd "$(dirname "$0")"
skip=(--skip no_driver_)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "$gpus" -ge 2 ] || skip+=(--skip gpu2_)
fail=0
threads=4
run_tests() {
  for t in tests/*; do
    # The fat-binary check reads the static library in the build tree: a build-machine test.
    case "$t" in tests/embedded_fatbin-*) continue ;; esac
    # Under a sanitizer, skip the executables that make no CUDA call (the sanitizer only says
    # "terminated before first instrumented API call"): unit tests of pure-Rust code, the
    # no-driver tests (filtered out on a GPU host) and the report's tests.
    if [ -n "${sanitizing:-}" ]; then
      case "$t" in tests/cuda_mem_bench-*|tests/cuda_mem_kernels-*|tests/cuda_mem_sys-*|tests/no_driver-*|tests/report-*) continue ;; esac
    fi
    echo "== $* $t"
    local started=$SECONDS
    # GPU tests are ignored by default; the no-driver tests assert the absence of a GPU;
    # gpu2_ tests need two GPUs.
    "$@" "$t" --include-ignored "${skip[@]}" --test-threads="$threads" || fail=1
    echo "== $t took $((SECONDS - started)) s"
  done
}
example() {
  echo "== examples/$*"
  "examples/$1" "${@:2}" || fail=1
}
case "${1:-}" in
  --sanitize)
    sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
    # Tests shorten their slowest serial kernels under a sanitizer; each binary gets at most
    # SANITIZE_TIMEOUT seconds (default 600) per tool.
    export CUDA_MEM_UNDER_SANITIZER=1
    sanitizing=1
    for tool in ${2:-memcheck racecheck synccheck}; do
      extra=()
      [ "$tool" = memcheck ] && extra=(--leak-check full)
      # racecheck hung twice in gpu_kernels with tests running on 4 threads (and finished in 4 s
      # once): one test at a time under racecheck.
      threads=4
      [ "$tool" = racecheck ] && threads=1
      # The bad-input tests provoke API errors on purpose (out of memory, invalid values):
      # those are the tests' subject, not findings, so only memory and hazard errors count.
      run_tests timeout "${SANITIZE_TIMEOUT:-600}" "$sanitizer" --tool "$tool" --report-api-errors no \
        --error-exitcode 99 "${extra[@]}"
    done
    ;;
  --bench)
    out=${2:?usage: ./run --bench OUT}
    mkdir -p "$out"
    bench/raw_reference > "$out/raw.jsonl" || fail=1
    CRITERION_HOME="$out/criterion" bench/families-* --bench || fail=1
    bench/paired-* --bench > "$out/paired.jsonl" || fail=1
    # The rows that missed their target, profiled through CUPTI (time inside CUDA calls);
    # skipped where CUPTI is missing.
    profile=()
    if bench/paired-* --bench --api-time --missed "$out/paired.jsonl" > "$out/paired-api.jsonl"; then
      profile=(--paired-api "$out/paired-api.jsonl")
    fi
    rerun=()
    if [ "${BENCH_RERUN:-1}" = 1 ]; then
      bench/raw_reference alloc managed > "$out/raw-rerun.jsonl" || fail=1
      rerun=(--raw-rerun "$out/raw-rerun.jsonl")
    fi
    bench/report --raw "$out/raw.jsonl" "${rerun[@]}" "${profile[@]}" --paired "$out/paired.jsonl" \
      --criterion "$out/criterion" --cudarc "$out/criterion" --out "$out/report" || fail=1
    ;;
  *)
    run_tests
    for e in smoke device_memory pinned_memory mapped_and_registered managed_memory stream_ordered \
             inference_loop kernel_bandwidth; do
      example "$e"
    done
    example stress --threads 8 --streams 4 --ops 100000 --seconds "${STRESS_SECONDS:-300}"
    # A log recorded from a workload (one thread: the log's order is the statistics' order),
    # replayed against other resources: the peak must equal the stress run's "pool" peak.
    log=$(mktemp)
    example stress --threads 1 --streams 4 --ops 20000 --seconds 120 --log "$log"
    for r in device pool pinned-pool; do example replay "$log" "$r"; done
    rm -f "$log"
    example staged_tuning
    [ "$gpus" -ge 2 ] && example peer_bandwidth
    ;;
esac
exit $fail
"#;
