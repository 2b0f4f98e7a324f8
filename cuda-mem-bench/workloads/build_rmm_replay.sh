#!/usr/bin/env bash
# Build rmm_replay (rmm_replay.cu + replay.h) against RAPIDS RMM from PyPI wheels (librmm-cu13 +
# rapids-logger), CUDA 13 nvcc, static cudart, for the GPU targets of CUDA_MEM_ARCHS (default
# sm_90), the way ../peers/build_rmm.sh (which runs this script first) builds rmmbench. Output:
# $OUT_DIR (default $CARGO_TARGET_DIR/peers/rmm, else <checkout>/target/peers/rmm, git-ignored)
# holding rmm_replay + librmm.so + librapids_logger.so; the binary's rpath is $ORIGIN, so the folder
# runs as it is on a GPU host that has only the driver.
#
# Env overrides: CUDA_ROOT (toolkit with bin/nvcc, include/, lib/libcudart_static.a; default the
#                checkout's target/cuda/13.0/nvidia/cu13 from `cargo xtask provision`),
#                CUDA_MEM_ARCHS (sm_XY / compute_XY list, as cuda-mem-kernels reads it; unset:
#                -arch=sm_90; see ../peers/nvcc_archs.sh), RMM_VER, LOGGER_VER, OUT_DIR, DEPS
#                (wheel cache; default deps/ beside this script, git-ignored).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CUDA_ROOT="${CUDA_ROOT:-$ROOT/target/cuda/13.0/nvidia/cu13}"
RMM_VER="${RMM_VER:-26.10.0}"
LOGGER_VER="${LOGGER_VER:-0.3.0}"
OUT_DIR="${OUT_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/peers/rmm}"
DEPS="${DEPS:-$HERE/deps}"
source "$ROOT/cuda-mem-bench/peers/nvcc_archs.sh"
nvcc_arch_flags
if [ ! -x "$CUDA_ROOT/bin/nvcc" ]; then
  echo "no nvcc under CUDA_ROOT=$CUDA_ROOT (set CUDA_ROOT to a CUDA 13 toolkit; cargo xtask provision puts one at target/cuda/13.0/nvidia/cu13)" >&2
  exit 1
fi

# 1. wheels (downloaded once; pip picks the manylinux x86_64 wheel)
mkdir -p "$DEPS/whl"
if ! ls "$DEPS"/whl/librmm_cu13-"$RMM_VER"-*.whl >/dev/null 2>&1; then
  python3 -m pip download "librmm-cu13==$RMM_VER" --no-deps -d "$DEPS/whl"
fi
if ! ls "$DEPS"/whl/rapids_logger-"$LOGGER_VER"-*.whl >/dev/null 2>&1; then
  python3 -m pip download "rapids-logger==$LOGGER_VER" --no-deps -d "$DEPS/whl"
fi
# 2. unpack (wheels are zips)
unpack() { # wheel-glob dest
  local whl; whl=$(ls $1 | head -1)
  if [ ! -f "$2/.unpacked-$(basename "$whl")" ]; then
    rm -rf "$2"; mkdir -p "$2"
    python3 -c 'import sys,zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$whl" "$2"
    touch "$2/.unpacked-$(basename "$whl")"
  fi
}
unpack "$DEPS/whl/librmm_cu13-$RMM_VER-*.whl" "$DEPS/librmm"
unpack "$DEPS/whl/rapids_logger-$LOGGER_VER-*.whl" "$DEPS/rapids_logger"

RMM="$DEPS/librmm/librmm"
LOG="$DEPS/rapids_logger/rapids_logger"
# librmm ships its own CCCL (3.5) under include/rapids; it must win over the toolkit's
# include/cccl (3.0), which nvcc adds as -isystem (searched after -I). The link checks it: the
# librmm.so symbols carry CCCL's ABI namespace.
INC=(-I"$RMM/include/rapids" -I"$RMM/include" -I"$LOG/include" -I"$HERE")

mkdir -p "$OUT_DIR"
export PATH="$CUDA_ROOT/bin:$PATH"
set -x
nvcc -O2 -std=c++17 "${NVCC_ARCH_FLAGS[@]}" -ccbin g++ \
  "${INC[@]}" \
  -cudart static \
  -o "$OUT_DIR/rmm_replay" "$HERE/rmm_replay.cu" \
  -L"$CUDA_ROOT/lib" -L"$RMM/lib64" -L"$LOG/lib64" -lrmm -lrapids_logger \
  -Xlinker -rpath -Xlinker '$ORIGIN' -Xlinker --enable-new-dtags \
  -lpthread -ldl -lrt
set +x
cp -f "$RMM/lib64/librmm.so" "$LOG/lib64/librapids_logger.so" "$OUT_DIR/"
strip --strip-unneeded "$OUT_DIR/rmm_replay" || true
ls -la "$OUT_DIR"
du -sh "$OUT_DIR"
