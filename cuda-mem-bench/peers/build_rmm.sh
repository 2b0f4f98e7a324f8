#!/usr/bin/env bash
# Builds the RAPIDS RMM peers of `./run --bench` on the build machine: rmmbench (rmm/rmmbench.cu:
# pairs, threads and churn of RMM's resources) and rmm_replay (../workloads/rmm_replay.cu: the
# workload corpus), against RMM from the PyPI wheels (librmm-cu13, rapids-logger), CUDA 13 nvcc,
# static cudart, for the GPU targets of CUDA_MEM_ARCHS (default sm_90: nvcc_archs.sh). Output:
# $OUT_DIR (default $CARGO_TARGET_DIR/peers/rmm, else <checkout>/target/peers/rmm), holding both
# programs with librmm.so and librapids_logger.so (rpath $ORIGIN), which `cargo xtask bundle`
# copies into the bundle's peers/rmm/. A GPU host needs only the driver to run them.
#
# Env: CUDA_ROOT (a CUDA 13 toolkit with bin/nvcc; default the checkout's
# target/cuda/13.0/nvidia/cu13), CUDA_MEM_ARCHS (sm_XY / compute_XY list, as cuda-mem-kernels
# reads it; unset: -arch=sm_90), OUT_DIR, RMM_VER, LOGGER_VER, DEPS (the wheel cache of
# ../workloads/build_rmm_replay.sh, shared).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export CUDA_ROOT="${CUDA_ROOT:-$ROOT/target/cuda/13.0/nvidia/cu13}"
export OUT_DIR="${OUT_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/peers/rmm}"
export DEPS="${DEPS:-$ROOT/cuda-mem-bench/workloads/deps}"
source "$HERE/nvcc_archs.sh"
nvcc_arch_flags
# rmm_replay, and the wheels unpacked under $DEPS.
bash "$ROOT/cuda-mem-bench/workloads/build_rmm_replay.sh"
RMM="$DEPS/librmm/librmm"
LOG="$DEPS/rapids_logger/rapids_logger"
# librmm's CCCL (include/rapids) must come before the toolkit's include/cccl.
"$CUDA_ROOT/bin/nvcc" -O2 -std=c++17 "${NVCC_ARCH_FLAGS[@]}" -ccbin g++ \
  -I"$RMM/include/rapids" -I"$RMM/include" -I"$LOG/include" \
  -cudart static \
  -o "$OUT_DIR/rmmbench" "$HERE/rmm/rmmbench.cu" \
  -L"$CUDA_ROOT/lib" -L"$RMM/lib64" -L"$LOG/lib64" -lrmm -lrapids_logger \
  -Xlinker -rpath -Xlinker '$ORIGIN' -Xlinker --enable-new-dtags -lpthread -ldl -lrt
strip --strip-unneeded "$OUT_DIR/rmmbench" || true
ls -la "$OUT_DIR"
du -sh "$OUT_DIR"
