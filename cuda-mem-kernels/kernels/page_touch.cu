// Strided page touch: one access every `stride` elements (the Rust side turns a stride in bytes
// into elements), one thread per touched element. On managed memory each touch of a
// non-resident page is a fault, so the time per touch measures fault handling and migration.
#include "common.cuh"

namespace {

// Element k * stride for every k with k * stride < n: ceil(n / stride) touches, none past n.
__device__ __forceinline__ size_t touches(size_t n, size_t stride) {
    return n / stride + (n % stride != 0);
}

__global__ void touch_write_u32(uint32_t* data, size_t n, size_t stride, uint32_t value) {
    const size_t count = touches(n, stride);
    for (size_t k = cmk::global_thread(); k < count; k += cmk::grid_threads()) {
        data[k * stride] = value;
    }
}

__global__ void touch_read_u32(const uint32_t* data, size_t n, size_t stride, uint32_t* sink) {
    const size_t count = touches(n, stride);
    uint32_t acc = 0;
    for (size_t k = cmk::global_thread(); k < count; k += cmk::grid_threads()) {
        acc ^= data[k * stride];
    }
    acc = cmk::block_reduce(acc, cmk::Xor{});
    if (threadIdx.x == 0 && acc != 0) {
        atomicXor(sink, acc);
    }
}

}  // namespace

extern "C" {

// Writes `value` to data[k * stride] for every k with k * stride < n (stride > 0).
cudaError_t cmk_touch_write_u32(uint32_t* data, size_t n, size_t stride, uint32_t value,
                                unsigned grid, unsigned block, cudaStream_t stream) {
    if (!cmk::valid_geometry(grid, block) || stride == 0) {
        return cudaErrorInvalidValue;
    }
    cmk::begin_launch();
    touch_write_u32<<<grid, block, 0, stream>>>(data, n, stride, value);
    return cmk::finish_launch();
}

// Zeroes *sink on the stream, then XORs data[k * stride] for every k with k * stride < n into it.
cudaError_t cmk_touch_read_u32(const uint32_t* data, size_t n, size_t stride, uint32_t* sink,
                               unsigned grid, unsigned block, cudaStream_t stream) {
    if (!cmk::valid_geometry(grid, block) || stride == 0) {
        return cudaErrorInvalidValue;
    }
    const cudaError_t zeroed = cmk::zero_async(sink, sizeof *sink, stream);
    if (zeroed != cudaSuccess || n == 0) {
        return zeroed;
    }
    cmk::begin_launch();
    touch_read_u32<<<grid, block, 0, stream>>>(data, n, stride, sink);
    return cmk::finish_launch();
}

}  // extern "C"
