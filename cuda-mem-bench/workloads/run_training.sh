#!/usr/bin/env bash
# Workload (a): torch_training.py through each allocator, a process per run, on one GPU.
#
#   run_training.sh OUTDIR CUDA_MEM_PYTHON_DIR [ARGS for torch_training.py...]
#
# CUDA_MEM_PYTHON_DIR holds cuda_mem_torch.py and libcuda_mem_torch_alloc.so (the bundle's
# python/ folder: target/bundle/python after `cargo xtask bundle`). Runs, in this order:
#   native        PyTorch's allocator (PYTORCH_CUDA_ALLOC_CONF unset)
#   expandable    the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#   cuda-mem      cuda-mem's allocator, the wrapper's default backend (CUDA_MEM_BACKENDS="cache pool"
#                 runs one process per named backend instead)
# ROUNDS=N (default 3) runs native, expandable and cuda-mem N times, in turn, so that their step
# times come from interleaved processes (a process's step time moves by a few percent from one
# process to the next: one run each cannot tell allocators a few percent apart). Then once:
#   trace         native again, recording PyTorch's allocation trace to OUTDIR/training_torch.cmwl
#                 (its JSON line, whose step times include the recording, goes to
#                 OUTDIR/training_trace.jsonl rather than training.jsonl)
# Each run appends its JSON line to OUTDIR/training.jsonl and its stderr, then its exit code, to
# OUTDIR/training-NAME.log. A failed run does not stop the others; one that failed
# because deterministic algorithms were refused is run again with --deterministic warn. Exits 1
# if any run failed.
set -u
out=${1:?usage: run_training.sh OUTDIR CUDA_MEM_PYTHON_DIR [ARGS for torch_training.py...]}
cuda_mem_python=${2:?usage: run_training.sh OUTDIR CUDA_MEM_PYTHON_DIR [ARGS for torch_training.py...]}
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script="$here/torch_training.py"
python=${PYTHON:-python3}
rounds=${ROUNDS:-3}
limit=${RUN_TIMEOUT:-150}   # seconds per run (the trace run gets twice as long); 200 steps take ~30 s
mkdir -p "$out"
cuda_mem_python=$(cd "$cuda_mem_python" && pwd) || { echo "no folder $2" >&2; exit 2; }
failed=0

# one NAME DEST SECONDS [ENV=VALUE...] -- ARGS...: runs torch_training.py with ARGS under those
# variables (and no PyTorch allocator settings of the caller's), for at most SECONDS.
one() {
  local name=$1 dest=$2 seconds=$3
  shift 3
  local vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  local log="$out/training-$name.log" json="$out/.training-$name.json"
  local attempt rc start
  for attempt in 1 2; do
    local extra=()
    if [ "$attempt" = 2 ]; then extra=(--deterministic warn); fi
    echo "== $name: ${vars[*]:-} $python $script $* ${extra[*]:-}" | tee -a "$log" >&2
    start=$SECONDS
    env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF ${vars[@]+"${vars[@]}"} \
      timeout "$seconds" "$python" "$script" "$@" ${extra[@]+"${extra[@]}"} > "$json" 2>> "$log"
    rc=$?
    echo "== $name: exit code $rc after $((SECONDS - start)) s" | tee -a "$log" >&2
    if [ "$rc" = 0 ]; then
      grep '^{' "$json" | tail -n 1 >> "$dest"
      tail -n 1 "$json" >&2
      break
    fi
    if [ "$attempt" = 1 ] && grep -qE "does not have a deterministic implementation|Deterministic behavior was enabled" "$log"; then
      echo "== $name: deterministic algorithms refused: once more with --deterministic warn" | tee -a "$log" >&2
      continue
    fi
    failed=1
    break
  done
  rm -f "$json"
}

for _ in $(seq 1 "$rounds"); do
  one native "$out/training.jsonl" "$limit" -- --allocator native "$@"
  one expandable "$out/training.jsonl" "$limit" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- --allocator native "$@"
  if [ -n "${CUDA_MEM_BACKENDS:-}" ]; then
    for backend in $CUDA_MEM_BACKENDS; do
      one "cuda-mem-$backend" "$out/training.jsonl" "$limit" -- \
        --allocator cuda-mem --cuda-mem-python "$cuda_mem_python" --backend "$backend" "$@"
    done
  else
    one cuda-mem "$out/training.jsonl" "$limit" -- --allocator cuda-mem --cuda-mem-python "$cuda_mem_python" "$@"
  fi
done
one trace "$out/training_trace.jsonl" $((2 * limit)) -- --allocator native --record-trace "$out/training_torch.cmwl" "$@"
exit "$failed"
