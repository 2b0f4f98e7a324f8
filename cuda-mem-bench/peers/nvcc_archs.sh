# Sourced by build_rmm.sh and ../workloads/build_rmm_replay.sh: sets NVCC_ARCH_FLAGS, the nvcc
# target flags for the RMM peers, from CUDA_MEM_ARCHS, read as cuda-mem-kernels' build script reads
# it (cuda-mem-kernels/build.rs): a list of sm_XY (machine code) and compute_XY (PTX) entries,
# separated by commas, spaces or semicolons, an architecture being digits with an optional a/f
# suffix; one `-gencode arch=compute_XY,code=[...]` per architecture, in first-seen order.
# Unset or empty: `-arch=sm_90` (sm_90 machine code and compute_90 PTX), what the peers have always
# been built for; cuda-mem-kernels' own default (sm_80,sm_90,compute_90) is not applied here.
nvcc_arch_flags() {
  NVCC_ARCH_FLAGS=()
  if [ -z "${CUDA_MEM_ARCHS:-}" ]; then
    NVCC_ARCH_FLAGS=(-arch=sm_90)
    return 0
  fi
  local item arch archs=() codes=() items=() i found
  IFS=', ;' read -r -a items <<< "$CUDA_MEM_ARCHS"
  for item in "${items[@]}"; do
    [ -n "$item" ] || continue
    case "$item" in
      sm_*) arch=${item#sm_} ;;
      compute_*) arch=${item#compute_} ;;
      *) echo "CUDA_MEM_ARCHS=\"$CUDA_MEM_ARCHS\": \`$item\` is neither sm_XY (SASS) nor compute_XY (PTX)" >&2; return 1 ;;
    esac
    if ! [[ "$arch" =~ ^[0-9]{2,}[af]?$ ]]; then
      echo "CUDA_MEM_ARCHS=\"$CUDA_MEM_ARCHS\": \`$item\`: the architecture must be digits with an optional a/f suffix" >&2
      return 1
    fi
    found=""
    for i in "${!archs[@]}"; do
      if [ "${archs[$i]}" = "$arch" ]; then
        found=1
        case ",${codes[$i]}," in *",$item,"*) ;; *) codes[$i]="${codes[$i]},$item" ;; esac
      fi
    done
    if [ -z "$found" ]; then
      archs+=("$arch")
      codes+=("$item")
    fi
  done
  if [ "${#archs[@]}" -eq 0 ]; then
    echo "CUDA_MEM_ARCHS=\"$CUDA_MEM_ARCHS\": no targets (example: sm_80,sm_90,compute_90)" >&2
    return 1
  fi
  for i in "${!archs[@]}"; do
    NVCC_ARCH_FLAGS+=(-gencode "arch=compute_${archs[$i]},code=[${codes[$i]}]")
  done
}
