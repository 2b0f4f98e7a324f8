// Checksum: sum over i of x[i] * (2i + 1), wrapping modulo 2^64. Position-dependent (a moved or
// swapped element changes it) yet order-independent to compute (addition modulo 2^64 commutes),
// so every thread accumulates its grid-stride share, blocks reduce, and one atomicAdd per block
// lands in the device u64. The Rust crate mirrors it on the CPU (`checksum_cpu`).
#include "common.cuh"

namespace {

__global__ void checksum_u32(const uint32_t* data, size_t n, unsigned long long* out) {
    unsigned long long acc = 0;
    for (size_t i = cmk::global_thread(); i < n; i += cmk::grid_threads()) {
        const unsigned long long weight = 2ull * static_cast<unsigned long long>(i) + 1ull;
        acc += static_cast<unsigned long long>(data[i]) * weight;
    }
    acc = cmk::block_reduce(acc, cmk::Sum{});
    if (threadIdx.x == 0 && acc != 0) {
        atomicAdd(out, acc);
    }
}

}  // namespace

extern "C" {

// Zeroes *out on the stream, then adds the checksum of data[0..n) into it (n == 0 leaves 0).
cudaError_t cmk_checksum_u32(const uint32_t* data, size_t n, unsigned long long* out,
                             unsigned grid, unsigned block, cudaStream_t stream) {
    if (!cmk::valid_geometry(grid, block)) {
        return cudaErrorInvalidValue;
    }
    const cudaError_t zeroed = cmk::zero_async(out, sizeof *out, stream);
    if (zeroed != cudaSuccess || n == 0) {
        return zeroed;
    }
    cmk::begin_launch();
    checksum_u32<<<grid, block, 0, stream>>>(data, n, out);
    return cmk::finish_launch();
}

}  // extern "C"
