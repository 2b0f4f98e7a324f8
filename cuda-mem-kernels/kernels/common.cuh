// Helpers shared by the kernels of cuda-mem-kernels: grid-stride indexing, block-wide reductions,
// launch checks. Every kernel is written for any block size that is a multiple of 32 up to 1024;
// the host wrappers reject other sizes (the Rust launchers always pass `Geometry::BLOCK_THREADS`).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cmk {

constexpr unsigned kWarp = 32;
constexpr unsigned kMaxBlock = 1024;

// Index of this thread in the whole grid, and the number of threads in the grid (the stride of a
// grid-stride loop). Both are size_t so loops over more than 2^32 elements do not wrap.
__device__ __forceinline__ size_t global_thread() {
    return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t grid_threads() {
    return static_cast<size_t>(gridDim.x) * blockDim.x;
}

struct Sum {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

struct Xor {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a ^ b; }
};

// Reduces `value` over the block with `op` (associative and commutative); the result is valid in
// thread 0 only. Every thread of the block must call it.
template <typename T, typename Op>
__device__ T block_reduce(T value, Op op) {
    __shared__ T per_warp[kMaxBlock / kWarp];
    for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
        value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
    const unsigned lane = threadIdx.x % kWarp;
    const unsigned warp = threadIdx.x / kWarp;
    if (lane == 0) {
        per_warp[warp] = value;
    }
    __syncthreads();
    if (warp == 0) {
        const unsigned warps = blockDim.x / kWarp;
        value = lane < warps ? per_warp[lane] : T(0);
        for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
            value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
        }
    }
    return value;
}

// The wrappers' own check of what the Rust side computes: a grid of at least one block and a
// block of whole warps that the reductions above can hold.
inline bool valid_geometry(unsigned grid, unsigned block) {
    return grid > 0 && block > 0 && block <= kMaxBlock && block % kWarp == 0;
}

// Clears the calling thread's last-error slot before a launch, so that `finish_launch` reports
// this launch and not an earlier failed call whose error its caller already received.
inline void begin_launch() {
    (void)cudaGetLastError();
}

// The launch's own verdict (bad configuration, no kernel image for this device, sticky errors).
inline cudaError_t finish_launch() {
    return cudaGetLastError();
}

// Zeroes a small result on the stream before a kernel accumulates into it; leaves the last-error
// slot clear when it fails (the error is returned instead).
inline cudaError_t zero_async(void* dst, size_t bytes, cudaStream_t stream) {
    const cudaError_t status = cudaMemsetAsync(dst, 0, bytes, stream);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();
    }
    return status;
}

}  // namespace cmk
