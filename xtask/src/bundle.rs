//! `cargo xtask bundle`: GPU test executables and examples, built here, in one folder with a `run`
//! script, for a GPU host that has only a driver (no Rust); and in `python/`, the Python module,
//! the PyTorch allocator and their Python tests (`./run --python`).

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
    // Test harnesses only: `cargo test` also builds the binaries its integration tests may run,
    // which are no test executables (`./run` would fail on their `--list`).
    let tests = artifacts(&["test", "--workspace", "--exclude", "xtask", "--no-run", "--release"], |msg| {
        let exe = msg["executable"].as_str()?;
        (msg["profile"]["test"].as_bool()? && msg["target"]["kind"][0].as_str()? != "example")
            .then(|| PathBuf::from(exe))
    })?;
    let examples =
        build(&["build", "--workspace", "--exclude", "xtask", "--examples", "--release"], |kind| kind == "example")?;
    let mut bench =
        build(&["bench", "-p", "cuda-mem-bench", "--features", "cudarc", "--no-run"], |kind| kind == "bench")?;
    bench.extend(build(
        &["build", "--release", "-p", "cuda-mem-bench", "--bin", "report", "--bin", "bench_report"],
        |kind| kind == "bin",
    )?);
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
    python(&dir)?;
    crate::bench_kit::add(&dir)?;
    let script = dir.join("run");
    std::fs::write(&script, RUN_SCRIPT).map_err(|e| format!("write {}: {e}", script.display()))?;
    make_executable(&script)?;
    Ok(dir)
}

/// Builds through cargo's JSON messages and returns the executables whose target kind matches.
fn build(args: &[&str], keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    artifacts(args, |msg| {
        let (exe, kind) = (msg["executable"].as_str()?, msg["target"]["kind"][0].as_str()?);
        keep(kind).then(|| PathBuf::from(exe))
    })
}

/// The shared libraries (`cdylib` targets) a build produces, with their library names.
pub(crate) fn libraries(args: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    artifacts(args, |msg| {
        if msg["target"]["kind"][0].as_str()? != "cdylib" {
            return None;
        }
        let name = msg["target"]["name"].as_str()?.replace('-', "_");
        let file = msg["filenames"].as_array()?.iter().filter_map(|f| f.as_str()).find(|f| f.ends_with(".so"))?;
        Some((name, PathBuf::from(file)))
    })
}

/// The `cuda_mem` package as the wheel holds it (`cuda-mem-py/package`, with the extension
/// `cuda_mem/_cuda_mem.abi3.so` and the PyTorch allocator `cuda_mem/libcuda_mem_torch_alloc.so`,
/// release builds with static cudart), importable from the folder, beside the Python tests
/// (`cuda-mem-py/python`).
fn python(dir: &Path) -> Result {
    let python = dir.join("python");
    let crate_dir = util::workspace_root().join("cuda-mem-py");
    copy_tree(&crate_dir.join("python"), &python)?;
    copy_tree(&crate_dir.join("package"), &python)?;
    for (name, file) in libraries(&["build", "--release", "-p", "cuda-mem-py", "-p", "cuda-mem-torch-alloc"])? {
        let installed = match name.as_str() {
            "cuda_mem_py" => "_cuda_mem.abi3.so".to_string(),
            other => format!("lib{other}.so"),
        };
        let copy = python.join("cuda_mem").join(installed);
        std::fs::copy(&file, &copy).map_err(|e| format!("copy {}: {e}", file.display()))?;
        let _ = std::process::Command::new("strip").arg("--strip-debug").arg(&copy).status();
    }
    Ok(())
}

/// Copies the files under `from` to `to`, leaving out Python caches.
fn copy_tree(from: &Path, to: &Path) -> Result {
    std::fs::create_dir_all(to).map_err(|e| format!("create {}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("read {}: {e}", from.display()))?.flatten() {
        let (path, name) = (entry.path(), entry.file_name());
        if name == "__pycache__" || name == ".pytest_cache" || name.to_string_lossy().ends_with(".so") {
            continue;
        }
        if path.is_dir() {
            copy_tree(&path, &to.join(&name))?;
        } else {
            std::fs::copy(&path, to.join(&name)).map_err(|e| format!("copy {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// Runs cargo with JSON messages and keeps what `pick` takes from each message.
fn artifacts<T>(args: &[&str], pick: impl Fn(&serde_json::Value) -> Option<T>) -> Result<Vec<T>> {
    let mut child = util::cargo()
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cargo did not start: {e}"))?;
    let mut picked = Vec::new();
    let stdout = child.stdout.take().expect("piped stdout");
    for line in std::io::BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        picked.extend(pick(&msg));
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    Ok(picked)
}

fn make_executable(path: &Path) -> Result {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
}

pub(crate) const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# Runs the GPU suite on a host that has only the NVIDIA driver.
#   ./run                     every test executable (GPU tests included), then the examples
#   ./run --tests             the test executables only
#   ./run --examples          the examples only
#   ./run --sanitize [TOOL]   the tests under compute-sanitizer TOOL (memcheck, racecheck,
#                             synccheck) or all three
#   ./run --python [ARGS]     the Python tests in python/ (pytest, else python/run_tests.py),
#                             ARGS passed on (e.g. -k torch)
#   ./run --python-wheel WHEEL [ARGS]
#                             the same tests over the package a wheel installs (the one
#                             `pip wheel ./cuda-mem-py` builds, carried beside the bundle), not
#                             over python/'s own copy
#   ./run --bench OUT [--only SECTION,..]
#                             the main job's benchmarks, each section into OUT/SECTION with the
#                             peers measured beside cuda-mem (PyTorch, RMM, raw C++, cudarc),
#                             then the report in OUT/report (bench/sections.sh lists the sections);
#                             BENCH_RESUME=1 keeps the sections that succeeded in OUT and goes on
#                             with the rest from their first unfinished step (a report over several
#                             device calls, each under a time limit)
#   ./run --replay OUT        memory efficiency: the serving workload's log and the stress
#                             example's log, written to OUT, replayed against the caching
#                             allocator (cache) and the retaining pool (pool); prints peak
#                             reserved / peak requested of each (OUT/replay.jsonl)
# STRESS_SECONDS bounds the stress example (default 300); BENCH_RERUN=0 skips the second
# reference run.
set -u
# Paths given as arguments are the caller's.
caller=$PWD
cd "$(dirname "$0")"
# NCCL's NVLink multicast stays off unless the caller chose (the GPU hosts' notes require it).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# GPU tests are ignored by default: run with --include-ignored. The tests that cannot pass on
# this host (no_driver_ ones beside a driver, gpu2_ ones on one GPU) skip themselves with a line
# on stderr; only --sanitize filters them out (below).
skip=()
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fail=0
threads=4
# The tests, each executable under the command in "$@" (a sanitizer, or none): all but the
# gpu_alone_ ones on $threads threads, then the gpu_alone_ ones one at a time. Those assert on pool
# reserves, make allocations fail for lack of memory (the driver then trims every pool), or must
# not see another test's synchronizing calls (cuda-mem/tests/common/mod.rs). Executables run one
# after another, so nothing else runs beside a gpu_alone_ test.
run_tests() {
  run_pass "$threads" --skip gpu_alone_ -- "$@"
  run_pass 1 gpu_alone_ -- "$@"
}
# run_pass THREADS FILTER... -- COMMAND...: in every executable, the tests that $skip (empty
# but under a sanitizer) and FILTERs select, on THREADS threads.
run_pass() {
  local pass_threads=$1 filters=() t listing started
  shift
  while [ "$1" != -- ]; do filters+=("$1"); shift; done
  shift
  for t in tests/*; do
    # The fat-binary check reads the static library in the build tree: a build-machine test.
    case "$t" in tests/embedded_fatbin-*) continue ;; esac
    # Under a sanitizer, skip the executables that make no CUDA call (the sanitizer only says
    # "terminated before first instrumented API call" and fails): unit tests of pure-Rust code
    # (cuda-mem-cache's, the workload corpus's, the cache replays over the fake backend) and the
    # reports' tests.
    # The NCCL tests are skipped there too: their device work is NCCL's own kernels and copies
    # (spin-waiting on peers by design), not cuda-mem's.
    if [ -n "${sanitizing:-}" ]; then
      case "$t" in tests/cuda_mem_bench-*|tests/cuda_mem_kernels-*|tests/cuda_mem_sys-*|tests/cuda_mem_torch_alloc-*|tests/report-*) continue ;; esac
      case "$t" in tests/cuda_mem_cache-*|tests/cuda_mem_workloads-*|tests/cache_replay-*|tests/suite_report-*) continue ;; esac
      case "$t" in tests/cuda_mem_nccl-*|tests/gpu_nccl-*|tests/nccl_loading-*) continue ;; esac
    fi
    # An executable whose every test is filtered out (most in the gpu_alone_ pass; under a
    # sanitizer, the no-driver one and, on one GPU, the two-GPU ones) makes no CUDA call either:
    # not run.
    if ! listing=$("$t" --list --include-ignored "${skip[@]}" "${filters[@]}" 2>&1); then
      echo "== $t --list failed: $listing"
      fail=1
      continue
    fi
    if ! grep -q ': test$' <<< "$listing"; then
      echo "== $t: no test selected by ${skip[*]} ${filters[*]}"
      continue
    fi
    echo "== $* $t ${filters[*]}"
    started=$SECONDS
    # gpu_async, gpu_graph and gpu_owners leak on purpose: their mem::forget tests (a forgotten
    # Pending of a copy, of a graph's launches, of a cached buffer) must leak rather than free
    # memory queued work still uses, graphs that launch without a wait own what they use for good
    # (leaked buffers and streams), and the process-wide staging pool lives until exit. Memcheck's
    # leak count there would only count those, so they run without `--leak-check full`; their
    # access checks still run.
    local command=() arg drop_next=0
    for arg in "$@"; do
      if [ "$drop_next" = 1 ]; then drop_next=0; continue; fi
      case "$t:$arg" in tests/gpu_async-*:--leak-check|tests/gpu_graph-*:--leak-check|tests/gpu_owners-*:--leak-check) drop_next=1; continue ;; esac
      command+=("$arg")
    done
    "${command[@]}" "$t" --include-ignored "${skip[@]}" "${filters[@]}" --test-threads="$pass_threads" || fail=1
    echo "== $t took $((SECONDS - started)) s"
  done
}
example() {
  echo "== examples/$*"
  "examples/$1" "${@:2}" || fail=1
}
# replays OUT: writes the serving trace and a stress log (one thread: the log's order is the
# statistics' order) to OUT, replays each against the cache and the pool, and lists the ratios of
# peak reserved to peak requested (issue 20 asks for at most 1.15 from the cache).
replays() {
  local dir=$1 log r line
  mkdir -p "$dir"
  : > "$dir/replay.txt"
  example serving_trace "$dir/serving-trace.jsonl"
  example stress --threads 1 --streams 4 --ops 20000 --seconds 120 --log "$dir/stress-log.jsonl"
  for log in serving-trace stress-log; do
    for r in cache pool; do
      echo "== examples/replay $dir/$log.jsonl $r"
      line=$(examples/replay "$dir/$log.jsonl" "$r") || fail=1
      echo "$line"
      echo "$line" >> "$dir/replay.txt"
    done
  done
  grep '^{' "$dir/replay.txt" > "$dir/replay.jsonl"
  echo "== peak reserved / peak requested"
  sed -n 's/.*"replay":"\([^"]*\)","resource":"\([^"]*\)".*"reserved_over_requested":\([^,]*\),.*/\1 \2 \3/p' \
    "$dir/replay.jsonl"
}
run_examples() {
  # The numbered lessons of cuda-mem/examples, then the kernels crate's.
  for e in smoke 01_allocate 02_copy_in_a_scope 03_stream_ordered 04_device_cache 05_pending_and_await \
           06_resources 07_graphs 08_dlpack 09_pinned_memory 10_mapped_and_registered 11_managed_memory \
           inference_loop kernel_bandwidth; do
    example "$e"
  done
  example stress --threads 8 --streams 4 --ops 100000 --seconds "${STRESS_SECONDS:-300}"
  # A log recorded from a workload (one thread: the log's order is the statistics' order),
  # replayed against other resources: the peak must equal the stress run's "pool" peak.
  log=$(mktemp)
  example stress --threads 1 --streams 4 --ops 20000 --seconds 120 --log "$log"
  for r in device pool cache pinned-pool; do example replay "$log" "$r"; done
  rm -f "$log"
  example staged_tuning
  example loader
  example async_server
  example decode_graph
  # Sleep and wake of 4 GiB of tensors, two cycles (exits 1 if a byte changed).
  example sleep_wake 4 2
  # Pickling a PyTorch memory snapshot of 100k trace entries (prints the time).
  example snapshot_dump
  [ "$gpus" -ge 2 ] && example peer_bandwidth
  # NCCL all-reduce over every GPU, both ways (one rank on a one-GPU host); needs libnccl.
  if [ -n "${CUDA_MEM_NCCL_LIB:-}" ] || { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libnccl\.so\.2'; then
    example allreduce --mode procs
    example allreduce --mode threads
  else
    echo "== examples/allreduce skipped: no libnccl.so.2 (set CUDA_MEM_NCCL_LIB to use another copy)"
  fi
}
# python_tests ARGS: the Python tests of the current folder (pytest, else run_tests.py).
python_tests() {
  if python3 -c "import pytest" 2>/dev/null; then
    python3 -m pytest -v -s -rs -p no:cacheprovider tests "$@" || fail=1
  else
    python3 run_tests.py "$@" || fail=1
  fi
}
case "${1:-}" in
  --python)
    # The Python module's tests (PyTorch, CuPy, JAX where installed) and the PyTorch allocator's.
    cd python
    python_tests "${@:2}"
    ;;
  --python-wheel)
    case "${2:-}" in /*) wheel=${2:-} ;; *) wheel=$caller/${2:-} ;; esac
    [ -f "$wheel" ] || { echo "./run --python-wheel WHEEL: no wheel at '${2:-}'"; exit 2; }
    # python/ (the tests and the scripts they run) without the modules the wheel installs,
    # which would shadow the installed ones.
    tests=$(mktemp -d)
    for f in python/*; do
      case "${f#python/}" in cuda_mem|cuda_mem_torch.py) ;; *) cp -r "$f" "$tests"/ ;; esac
    done
    python3 -m pip install --no-deps --no-index --quiet --target "$tests/site" "$wheel" || exit 1
    cd "$tests"
    PYTHONPATH="$tests/site${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import cuda_mem; print('cuda_mem from', cuda_mem.__file__)" || exit 1
    PYTHONPATH="$tests/site${PYTHONPATH:+:$PYTHONPATH}" python_tests "${@:3}"
    ;;
  --sanitize)
    sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
    # Tests shorten their slowest serial kernels under a sanitizer; each binary gets at most
    # SANITIZE_TIMEOUT seconds (default 600) per tool.
    export CUDA_MEM_UNDER_SANITIZER=1
    sanitizing=1
    # A test that skips itself checks nothing under a sanitizer, and an executable left with only
    # such tests may make no instrumented CUDA call, which fails the sanitizer: filtered out.
    skip=(--skip no_driver_)
    [ "$gpus" -ge 2 ] || skip+=(--skip gpu2_)
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
    out=${2:?usage: ./run --bench OUT [--only SECTION,..]}
    only=all
    if [ "${3:-}" = --only ]; then only=${4:?usage: ./run --bench OUT --only SECTION,..}; fi
    source bench/sections.sh
    bench_suite "$out" "$only" || fail=1
    ;;
  --replay)
    replays "${2:?usage: ./run --replay OUT}"
    ;;
  --tests)
    run_tests
    ;;
  --examples)
    run_examples
    ;;
  *)
    run_tests
    run_examples
    ;;
esac
exit $fail
"#;

/// `PATH` with `dir` searched first: the tests' stand-ins for the GPU host's programs.
#[cfg(test)]
pub(crate) fn path_with_first(dir: &Path) -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path))).expect("a valid PATH")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Stands in for a libtest executable: lists and "runs" the tests named in `tests=(…)` with
    /// libtest's filter rules, logging each test it runs with its thread count and sanitizer.
    const FAKE_TEST: &str = r#"#!/usr/bin/env bash
list=0 threads=default filters=() skips=()
while [ $# -gt 0 ]; do
  case $1 in
    --list) list=1 ;;
    --skip) skips+=("$2"); shift ;;
    --test-threads=*) threads=${1#--test-threads=} ;;
    -*) ;;
    *) filters+=("$1") ;;
  esac
  shift
done
for name in "${tests[@]}"; do
  selected=$((${#filters[@]} == 0))
  for f in "${filters[@]}"; do [[ $name == *"$f"* ]] && selected=1; done
  for s in "${skips[@]}"; do [[ $name == *"$s"* ]] && selected=0; done
  [ "$selected" = 1 ] || continue
  if [ "$list" = 1 ]; then echo "$name: test"; continue; fi
  echo "$name threads=$threads ${SANITIZER_TOOL:-none}" >> "$FAKE_LOG"
  [ "$name" = "${FAKE_FAIL:-}" ] && { echo "test $name ... FAILED"; exit 101; }
  echo "test $name ... ok"
done
"#;

    /// Stands in for compute-sanitizer, failing as it does on a program that makes no CUDA call
    /// (here: runs no test).
    const FAKE_SANITIZER: &str = r#"#!/usr/bin/env bash
while [ $# -gt 0 ]; do
  case $1 in --tool) export SANITIZER_TOOL=$2; shift ;; tests/*) break ;; esac
  shift
done
out=$("$@") || { echo "$out"; exit 99; }
echo "$out"
grep -q '^test .* ok$' <<< "$out" || { echo "Target application terminated before first instrumented API call"; exit 1; }
"#;

    /// The examples the script runs: each stands in as a program that succeeds.
    const EXAMPLES: [&str; 25] = [
        "smoke",
        "01_allocate",
        "02_copy_in_a_scope",
        "03_stream_ordered",
        "04_device_cache",
        "05_pending_and_await",
        "06_resources",
        "07_graphs",
        "08_dlpack",
        "09_pinned_memory",
        "10_mapped_and_registered",
        "11_managed_memory",
        "inference_loop",
        "kernel_bandwidth",
        "stress",
        "replay",
        "serving_trace",
        "staged_tuning",
        "loader",
        "async_server",
        "decode_graph",
        "sleep_wake",
        "snapshot_dump",
        "peer_bandwidth",
        "allreduce",
    ];

    /// A bundle of stand-ins in a temporary folder, on a host with `gpus` GPUs.
    struct FakeBundle {
        dir: PathBuf,
    }

    impl FakeBundle {
        fn new(name: &str, gpus: usize) -> Self {
            let dir = std::env::temp_dir().join(format!("xtask-bundle-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let alone = |rest: &str| format!("{}{rest}", crate::test::ALONE);
            let executables = [
                ("tests/cuda_mem-1111", vec!["raw::tests::check_keeps_code".into()]),
                ("tests/cuda_mem_bench-2222", vec!["stats::tests::median".into()]),
                ("tests/embedded_fatbin-3333", vec!["every_object_holds_sass".into()]),
                ("tests/gpu_pools-4444", vec!["gpu_alloc_on_a".into(), alone("pool_statistics"), alone("max_size")]),
                ("tests/gpu_peer-5555", vec!["gpu2_peer_access".into()]),
                ("tests/no_driver-6666", vec!["no_driver_malloc_fails".into()]),
                ("tests/cuda_mem_cache-7777", vec!["fake::tests::frees_by_address".into()]),
            ];
            for (path, tests) in executables {
                write(&dir.join(path), &FAKE_TEST.replacen("\n", &format!("\ntests=({})\n", tests.join(" ")), 1));
            }
            for example in EXAMPLES {
                write(&dir.join("examples").join(example), "#!/bin/sh\nexit 0\n");
            }
            let gpu_list: String =
                (0..gpus).map(|i| format!("echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n")).collect();
            write(&dir.join("bin/nvidia-smi"), &format!("#!/bin/sh\n{gpu_list}"));
            write(&dir.join("bin/compute-sanitizer"), FAKE_SANITIZER);
            write(&dir.join("run"), RUN_SCRIPT);
            FakeBundle { dir }
        }

        /// Runs `./run ARGS`; returns whether it succeeded and each test run, in order.
        fn run(&self, args: &[&str], fail: &str) -> (bool, Vec<String>) {
            let (ok, runs, _) = self.run_with_output(args, fail);
            (ok, runs)
        }

        /// The same, with the script's standard output.
        fn run_with_output(&self, args: &[&str], fail: &str) -> (bool, Vec<String>, String) {
            let log = self.dir.join("log");
            let _ = std::fs::remove_file(&log);
            let path = crate::bundle::path_with_first(&self.dir.join("bin"));
            let output = Command::new(self.dir.join("run"))
                .args(args)
                .env("PATH", path)
                .env("FAKE_LOG", &log)
                .env("FAKE_FAIL", fail)
                .env("STRESS_SECONDS", "1")
                .output()
                .unwrap();
            let runs = std::fs::read_to_string(&log).unwrap_or_default().lines().map(str::to_string).collect();
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
            (output.status.success(), runs, stdout)
        }
    }

    impl Drop for FakeBundle {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        make_executable(path).unwrap();
    }

    /// Stands in for the replay example: one line for people, one JSON object, a ratio from the
    /// resource's name.
    const FAKE_REPLAY: &str = r#"#!/bin/sh
[ -f "$1" ] || { echo "no log $1" >&2; exit 1; }
case $2 in cache) ratio=1.0300 ;; *) ratio=2.0000 ;; esac
echo "2 events against $2"
echo "{\"replay\":\"$1\",\"resource\":\"$2\",\"events\":2,\"peak_reserved\":1,\"reserved_over_requested\":$ratio,\"unmatched_frees\":0}"
"#;

    /// Stands in for the examples that write logs: the file named after `--log` or last.
    const FAKE_LOG_WRITER: &str = "#!/bin/sh\nlast=\nfor a; do last=$a; done\necho '{}' > \"$last\"\n";

    #[test]
    fn replay_writes_both_logs_and_lists_each_ratio_against_the_cache_and_the_pool() {
        let bundle = FakeBundle::new("replay", 1);
        write(&bundle.dir.join("examples/replay"), FAKE_REPLAY);
        for writer in ["serving_trace", "stress"] {
            write(&bundle.dir.join("examples").join(writer), FAKE_LOG_WRITER);
        }
        let out = bundle.dir.join("out");
        let (ok, _, stdout) = bundle.run_with_output(&["--replay", out.to_str().unwrap()], "");
        assert!(ok, "{stdout}");
        let summary: Vec<&str> = stdout.lines().skip_while(|l| !l.starts_with("== peak reserved")).skip(1).collect();
        let log = |name: &str| out.join(name).display().to_string();
        assert_eq!(
            summary,
            [
                format!("{} cache 1.0300", log("serving-trace.jsonl")),
                format!("{} pool 2.0000", log("serving-trace.jsonl")),
                format!("{} cache 1.0300", log("stress-log.jsonl")),
                format!("{} pool 2.0000", log("stress-log.jsonl")),
            ]
        );
        assert_eq!(std::fs::read_to_string(out.join("replay.jsonl")).unwrap().lines().count(), 4);
        write(&bundle.dir.join("examples/replay"), "#!/bin/sh\nexit 1\n");
        let (ok, _, _) = bundle.run_with_output(&["--replay", out.to_str().unwrap()], "");
        assert!(!ok, "a failed replay fails the run");
    }

    #[test]
    fn run_runs_gpu_alone_tests_one_at_a_time_after_all_others() {
        let bundle = FakeBundle::new("plain", 1);
        let (ok, runs) = bundle.run(&[], "");
        assert!(ok, "{runs:?}");
        assert_eq!(
            runs,
            [
                "raw::tests::check_keeps_code threads=4 none",
                "stats::tests::median threads=4 none",
                "fake::tests::frees_by_address threads=4 none",
                // Not filtered out: on one GPU, and beside a driver, these skip themselves.
                "gpu2_peer_access threads=4 none",
                "gpu_alloc_on_a threads=4 none",
                "no_driver_malloc_fails threads=4 none",
                "gpu_alone_pool_statistics threads=1 none",
                "gpu_alone_max_size threads=1 none",
            ]
        );
        let (ok, runs) = bundle.run(&[], "gpu_alone_max_size");
        assert!(!ok && runs.len() == 8, "a failing gpu_alone_ test fails the run: {runs:?}");
    }

    #[test]
    fn tests_and_examples_each_run_alone() {
        let bundle = FakeBundle::new("parts", 1);
        write(&bundle.dir.join("examples/smoke"), "#!/bin/sh\necho example smoke >> \"$FAKE_LOG\"\n");
        let (ok, runs) = bundle.run(&["--tests"], "");
        assert!(ok && runs.len() == 8 && !runs.iter().any(|r| r.starts_with("example")), "{runs:?}");
        let (ok, runs) = bundle.run(&["--examples"], "");
        assert!(ok, "{runs:?}");
        assert_eq!(runs, ["example smoke"]);
        write(&bundle.dir.join("examples/01_allocate"), "#!/bin/sh\nexit 1\n");
        let (ok, _) = bundle.run(&["--examples"], "");
        assert!(!ok, "a failing example fails the run");
        let (ok, runs) = bundle.run(&[], "");
        assert!(!ok && runs.len() == 9, "the plain run runs both: {runs:?}");
    }

    /// Under a sanitizer the no-driver tests, and on one GPU the two-GPU ones, are filtered out,
    /// leaving their executables without tests: the sanitizer must not run those, nor any
    /// executable in the `gpu_alone_` pass that has none, so that clean runs exit 0.
    #[test]
    fn sanitize_runs_only_executables_left_with_tests() {
        let one_gpu = FakeBundle::new("sanitize1", 1);
        let (ok, runs) = one_gpu.run(&["--sanitize", "memcheck"], "");
        assert!(ok, "{runs:?}");
        assert_eq!(
            runs,
            [
                "raw::tests::check_keeps_code threads=4 memcheck",
                "gpu_alloc_on_a threads=4 memcheck",
                "gpu_alone_pool_statistics threads=1 memcheck",
                "gpu_alone_max_size threads=1 memcheck",
            ]
        );
        let two_gpus = FakeBundle::new("sanitize2", 2);
        let (ok, runs) = two_gpus.run(&["--sanitize", "racecheck"], "");
        assert!(ok, "{runs:?}");
        assert_eq!(
            runs,
            [
                "raw::tests::check_keeps_code threads=1 racecheck",
                "gpu2_peer_access threads=1 racecheck",
                "gpu_alloc_on_a threads=1 racecheck",
                "gpu_alone_pool_statistics threads=1 racecheck",
                "gpu_alone_max_size threads=1 racecheck",
            ]
        );
        let (ok, _) = two_gpus.run(&["--sanitize", "synccheck"], "gpu2_peer_access");
        assert!(!ok, "a failing test under the sanitizer fails the run");
    }
}
