# The sections of `./run --bench OUT [--only SECTION,..]`, sourced by the bundle's `run` script
# (which sets `fail` and `gpus`). Each section writes its raw outputs to OUT/SECTION/ with a
# section.json (start, seconds, exit code, GPU, commit); a peer that cannot run writes
# OUT/SECTION/PEER.missing (why) instead of its rows. Then bench/bench_report turns every section
# folder under OUT into OUT/report/ (report.md, results.json, SVG plots); BENCH_REPORT=0 skips it.
#
# Peers come from $BENCH_PEERS (default: peers/ of the bundle): torch_alloc.py,
# torch_alloc_mt.py, torch_copies.py, torch_snapshot.py, torch_graph.py,
# torch_allreduce.py, workloads/ (torch_replay.py, run_training.sh,
# torch_training.py) and rmm/ (rmmbench, rmm_replay and their libraries, built on the build
# machine by peers/build_rmm.sh). Each program gets at most $BENCH_STEP_TIMEOUT seconds (300).

BENCH_SECTIONS="paired cache threads workloads training graphs async staged snapshot nccl sleep"
peers=${BENCH_PEERS:-peers}
step_timeout=${BENCH_STEP_TIMEOUT:-300}

# step FILE COMMAND...: COMMAND's stdout into FILE (appended), its stderr into FILE's .log; a
# failure fails the run. A step that finished leaves a mark in its section's folder, so that
# BENCH_RESUME=1 (see bench_suite) keeps it; one cut off (a device call's time limit) runs again
# from where its files stood when it began.
step() {
  local file=$1 rc log mark started
  shift
  log="${file%.*}.log"
  # Steps are numbered in the order a section runs them, the same in every run of one bundle.
  steps_begun=$((steps_begun + 1))
  mark="$(dirname "$file")/.step-$steps_begun"
  if [ -f "$mark.done" ]; then
    echo "== $* (finished by an earlier run: kept)"
    kept_seconds=$((kept_seconds + $(cat "$mark.done")))
    return 0
  fi
  if [ -f "$mark.from" ]; then
    read -r from_file from_log < "$mark.from"
    truncate -s "$from_file" "$file"
    truncate -s "$from_log" "$log"
  else
    echo "$(stat -c %s "$file" 2>/dev/null || echo 0) $(stat -c %s "$log" 2>/dev/null || echo 0)" > "$mark.from"
  fi
  started=$SECONDS
  echo "== $*" | tee -a "$log"
  timeout "$step_timeout" "$@" >> "$file" 2>> "$log"
  rc=$?
  echo "== exit code $rc" >> "$log"
  [ "$rc" = 0 ] || { echo "== $* failed ($rc): see $log"; fail=1; return "$rc"; }
  echo $((SECONDS - started)) > "$mark.done"
  rm -f "$mark.from"
}

# missing FILE WHY: the peer that would have written FILE did not run, because WHY.
missing() {
  echo "$2" > "${1%.*}.missing"
  echo "== peer not measured: $(basename "${1%.*}"): $2"
}

torch_ready() {
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1
}

# torch_peer FILE SCRIPT ARGS...: a PyTorch peer script, or FILE.missing saying why not.
torch_peer() {
  local file=$1 script=$2
  shift 2
  if [ ! -f "$script" ]; then missing "$file" "no $script in this bundle"; return; fi
  if ! torch_ready; then missing "$file" "PyTorch with CUDA is not installed for $(command -v python3 || echo 'python3 (none on PATH)')"; return; fi
  # A peer's failure is the peer's row (FILE.missing), not the section's exit code.
  local before=$fail
  step "$file" python3 "$script" "$@" || missing "$file" "$(basename "$script") failed: see $(basename "${file%.*}").log"
  fail=$before
}

# rmm_peer FILE PROGRAM ARGS...: an RMM peer program from $peers/rmm, or FILE.missing.
rmm_peer() {
  local file=$1 exe=$peers/rmm/$2
  shift 2
  if [ ! -x "$exe" ]; then missing "$file" "no $exe (build it with cuda-mem-bench/peers/build_rmm.sh on the build machine and carry the folder)"; return; fi
  local before=$fail
  step "$file" "$exe" "$@" || missing "$file" "$(basename "$exe") failed: see $(basename "${file%.*}").log"
  fail=$before
}

section_paired() {
  local d=$1 profile=() rerun=()
  step "$d/raw.jsonl" bench/raw_reference
  CRITERION_HOME="$d/criterion" step "$d/criterion.txt" bench/families-* --bench
  step "$d/paired.jsonl" bench/paired-* --bench
  # The rows that missed their target, profiled through CUPTI; skipped where CUPTI is missing.
  if timeout "$step_timeout" bench/paired-* --bench --api-time --missed "$d/paired.jsonl" > "$d/paired-api.jsonl" 2> "$d/paired-api.log"; then
    profile=(--paired-api "$d/paired-api.jsonl")
  fi
  if [ "${BENCH_RERUN:-1}" = 1 ]; then
    step "$d/raw-rerun.jsonl" bench/raw_reference alloc managed && rerun=(--raw-rerun "$d/raw-rerun.jsonl")
  fi
  step "$d/report.txt" bench/report --date "$(date -u +%F)" --raw "$d/raw.jsonl" "${rerun[@]}" "${profile[@]}" \
    --paired "$d/paired.jsonl" --criterion "$d/criterion" --out "$d/report"
}

section_cache() {
  local d=$1
  step "$d/cache_pairs.jsonl" examples/cache_pairs --only pairs
  torch_peer "$d/torch.jsonl" "$peers/torch_alloc.py"
  rmm_peer "$d/rmm.jsonl" rmmbench --only 1
}

section_threads() {
  local d=$1 counts=${BENCH_THREADS:-1,2,4,8,16}
  step "$d/cache_pairs.jsonl" examples/cache_pairs --only threads --threads "$counts"
  torch_peer "$d/torch_mt.jsonl" "$peers/torch_alloc_mt.py" --threads "$counts"
  rmm_peer "$d/rmm.jsonl" rmmbench --only 2 --threads "$counts"
}

# replay_peers DIR FILE...: the workload files through cuda-mem's replays' peers (RMM, PyTorch
# native and with expandable segments), rows into DIR.
replay_peers() {
  local d=$1
  shift
  rmm_peer "$d/rmm.jsonl" rmm_replay "$@"
  torch_peer "$d/torch.jsonl" "$peers/workloads/torch_replay.py" "$@"
  # One process per file: with expandable segments, PyTorch 2.11 on these hosts fails in
  # empty_cache() after a replay ("invalid device context"), which would end the other files.
  local f
  for f in "$@"; do
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torch_peer "$d/torch_exp.jsonl" "$peers/workloads/torch_replay.py" "$f"
  done
}

# A section whose steps share a temporary folder runs whole, also when resumed.
run_whole() {
  find "$1" -mindepth 1 -maxdepth 1 ! -name .started ! -name .on -exec rm -rf {} +
}

section_workloads() {
  local d=$1 corpus
  run_whole "$d"
  # The corpus files are large: written outside OUT, so they do not travel back.
  corpus=$(mktemp -d)
  step "$d/cuda_mem.jsonl" examples/workloads "$corpus"
  replay_peers "$d" "$corpus"/*.cmwl
  rm -rf "$corpus"
}

section_training() {
  local d=$1 trace
  run_whole "$d"
  if ! torch_ready; then
    missing "$d/training.jsonl" "PyTorch with CUDA is not installed: the training loop needs it"
    return
  fi
  trace=$(mktemp -d)
  step "$d/run_training.txt" bash "$peers/workloads/run_training.sh" "$trace" python
  cp "$trace"/training.jsonl "$d/" 2>/dev/null || missing "$d/training.jsonl" "run_training.sh wrote no rows: see run_training.log"
  cp "$trace"/training-*.log "$d/" 2>/dev/null
  # The loop's recorded allocation trace, replayed by every allocator.
  if [ -f "$trace/training_torch.cmwl" ]; then
    step "$d/cuda_mem.jsonl" examples/workloads "$(mktemp -d)" --only training_torch --extra "$trace/training_torch.cmwl"
    replay_peers "$d" "$trace/training_torch.cmwl"
  fi
  rm -rf "$trace"
}

section_graphs() {
  step "$1/decode_graph.txt" examples/decode_graph
  torch_peer "$1/torch_graph.jsonl" "$peers/torch_graph.py"
}

section_async() {
  step "$1/async_server.txt" examples/async_server
  step "$1/loader.txt" examples/loader
}

section_staged() {
  step "$1/staged_tuning.txt" examples/staged_tuning
  torch_peer "$1/torch_copies.jsonl" "$peers/torch_copies.py"
}

section_snapshot() {
  step "$1/snapshot_dump.txt" examples/snapshot_dump
  torch_peer "$1/torch_snapshot.jsonl" "$peers/torch_snapshot.py"
}

section_nccl() {
  local d=$1
  if [ -z "${CUDA_MEM_NCCL_LIB:-}" ] && ! { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libnccl\.so\.2'; then
    missing "$d/allreduce.jsonl" "no libnccl.so.2 on this host (set CUDA_MEM_NCCL_LIB to use another copy)"
    missing "$d/torch_allreduce.jsonl" "no libnccl.so.2 on this host"
    return
  fi
  step "$d/allreduce.jsonl" examples/allreduce --mode procs
  step "$d/allreduce.jsonl" examples/allreduce --mode threads
  torch_peer "$d/torch_allreduce.jsonl" "$peers/torch_allreduce.py"
}

# 40 GiB slept and woken (BENCH_SLEEP_GIB to change it): a DeviceCache, then PyTorch's tagged
# memory beside torch_memory_saver (its wheel from peers/, where the bundle carries one: `pip
# download torch-memory-saver==0.0.10 --no-deps -d target/peers` before `cargo xtask bundle`),
# vLLM's per-allocation copies and one pinned copy, each in a process of its own.
section_sleep() {
  local d=$1 gib=${BENCH_SLEEP_GIB:-40} wheel saved=${PYTHONPATH:-}
  step "$d/sleep_wake.jsonl" examples/sleep_wake "$gib" 3
  wheel=$(ls "$peers"/torch_memory_saver-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    missing "$d/tms.jsonl" "no torch_memory_saver wheel in $peers (pip download torch-memory-saver==0.0.10 --no-deps -d target/peers before cargo xtask bundle)"
  elif python3 -m pip install --no-deps --no-index --quiet --target "$d/tms-package" "$wheel" > "$d/tms-install.log" 2>&1; then
    export PYTHONPATH="$d/tms-package${saved:+:$saved}"
  else
    missing "$d/tms.jsonl" "its wheel did not install: see tms-install.log"
  fi
  torch_peer "$d/torch_sleep_wake.jsonl" python/sleep_wake_compare.py --gib "$gib" --cycles 3
  if [ -n "$saved" ]; then export PYTHONPATH=$saved; else unset PYTHONPATH; fi
}

# bench_suite OUT SECTIONS: the named sections (comma-separated, or `all`), then the report. With
# BENCH_RESUME=1 a section that succeeded before (its section.json) is kept, and one that failed or
# was cut off goes on from its first step that did not finish, its seconds counting every run: a
# whole report in several device calls, each under a time limit.
bench_suite() {
  local out=$1 only=${2:-all} name d started rc gpu commit kept_seconds steps_begun
  [ "$only" = all ] && only=${BENCH_SECTIONS// /,}
  for name in ${only//,/ }; do
    case " $BENCH_SECTIONS " in
      *" $name "*) ;;
      *) echo "./run --bench: no section '$name' (sections: $BENCH_SECTIONS)"; return 2 ;;
    esac
  done
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  commit=$(cat commit.txt 2>/dev/null)
  for name in ${only//,/ }; do
    d="$out/$name"
    if [ "${BENCH_RESUME:-0}" = 1 ] && grep -qs '"rc":0,' "$d/section.json"; then
      echo "== section $name finished before: kept"
      continue
    fi
    [ "${BENCH_RESUME:-0}" = 1 ] || rm -rf "$d"
    mkdir -p "$d"
    [ -f "$d/.started" ] || date -u +%FT%TZ > "$d/.started"
    started=$(cat "$d/.started")
    # A resumed section must have run on this GPU and commit.
    if [ -f "$d/.on" ] && [ "$(cat "$d/.on")" != "$gpu $commit" ]; then
      echo "./run --bench: $d was begun on $(cat "$d/.on"), not $gpu $commit: remove it or resume there"
      return 2
    fi
    echo "$gpu $commit" > "$d/.on"
    SECONDS_BEFORE=$SECONDS
    kept_seconds=0
    steps_begun=0
    echo "== section $name"
    local before=$fail
    fail=0
    "section_$name" "$d"
    rc=$fail
    fail=$((before | rc))
    # A section that failed keeps its marks for a resumed run, which redoes only what did not
    # succeed; otherwise they go (they would travel with the raw outputs).
    if [ "$rc" = 0 ] || [ "${BENCH_RESUME:-0}" != 1 ]; then rm -f "$d"/.step-* "$d/.started" "$d/.on"; fi
    printf '{"section":"%s","started":"%s","seconds":%d,"rc":%d,"gpu":"%s","commit":"%s","gpus":%d}\n' \
      "$name" "$started" $((SECONDS - SECONDS_BEFORE + kept_seconds)) "$rc" "$gpu" "$commit" "${gpus:-0}" > "$d/section.json"
    echo "== section $name took $((SECONDS - SECONDS_BEFORE + kept_seconds)) s (exit code $rc)"
  done
  if [ "${BENCH_REPORT:-1}" = 1 ]; then
    bench/bench_report --raw "$out" --out "$out/report" --date "$(date -u +%F)" || fail=1
  fi
}
