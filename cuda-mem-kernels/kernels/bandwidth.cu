// Bandwidth probes. Both split the buffer into a head (elements before the first 16-byte
// boundary), a body of 16-byte vectors (uint4) walked by a grid-stride loop unrolled four times so
// each thread keeps several loads or stores in flight, and a tail (fewer than four elements).
//
// stream_read reads every element and XORs them into one u32: the result depends on every load,
// so the compiler keeps them all, and it is checkable on the CPU. Per block, one atomicXor.
// stream_write stores `value` to every element.
#include "common.cuh"

namespace {

struct Split {
    size_t head;  // scalar elements before the 16-byte-aligned body
    size_t vectors;  // uint4 vectors in the body
    size_t tail_start;  // first element after the body
};

// `addr` is 4-byte aligned (a u32 pointer), so the head holds 0 to 3 elements.
__device__ __forceinline__ Split split(uintptr_t addr, size_t n) {
    size_t head = ((16 - (addr & 15)) & 15) / sizeof(uint32_t);
    if (head > n) {
        head = n;
    }
    const size_t vectors = (n - head) / 4;
    return Split{head, vectors, head + vectors * 4};
}

__device__ __forceinline__ uint32_t fold(uint4 v) {
    return v.x ^ v.y ^ v.z ^ v.w;
}

__global__ void stream_read_u32(const uint32_t* data, size_t n, uint32_t* sink) {
    const Split s = split(reinterpret_cast<uintptr_t>(data), n);
    const uint4* body = reinterpret_cast<const uint4*>(data + s.head);
    const size_t stride = cmk::grid_threads();
    size_t i = cmk::global_thread();
    uint32_t acc = 0;
    for (; i + 3 * stride < s.vectors; i += 4 * stride) {
        const uint4 a = body[i];
        const uint4 b = body[i + stride];
        const uint4 c = body[i + 2 * stride];
        const uint4 d = body[i + 3 * stride];
        acc ^= fold(a) ^ fold(b) ^ fold(c) ^ fold(d);
    }
    for (; i < s.vectors; i += stride) {
        acc ^= fold(body[i]);
    }
    // At most three head and three tail elements, taken by the first threads of the grid.
    const size_t t = cmk::global_thread();
    if (t < s.head) {
        acc ^= data[t];
    }
    if (t < n - s.tail_start) {
        acc ^= data[s.tail_start + t];
    }
    acc = cmk::block_reduce(acc, cmk::Xor{});
    if (threadIdx.x == 0 && acc != 0) {
        atomicXor(sink, acc);
    }
}

__global__ void stream_write_u32(uint32_t* data, size_t n, uint32_t value) {
    const Split s = split(reinterpret_cast<uintptr_t>(data), n);
    uint4* body = reinterpret_cast<uint4*>(data + s.head);
    const uint4 v = make_uint4(value, value, value, value);
    const size_t stride = cmk::grid_threads();
    size_t i = cmk::global_thread();
    for (; i + 3 * stride < s.vectors; i += 4 * stride) {
        body[i] = v;
        body[i + stride] = v;
        body[i + 2 * stride] = v;
        body[i + 3 * stride] = v;
    }
    for (; i < s.vectors; i += stride) {
        body[i] = v;
    }
    const size_t t = cmk::global_thread();
    if (t < s.head) {
        data[t] = value;
    }
    if (t < n - s.tail_start) {
        data[s.tail_start + t] = value;
    }
}

}  // namespace

extern "C" {

// Zeroes *sink on the stream, then XORs every element of data[0..n) into it.
cudaError_t cmk_stream_read_u32(const uint32_t* data, size_t n, uint32_t* sink, unsigned grid,
                                unsigned block, cudaStream_t stream) {
    if (!cmk::valid_geometry(grid, block)) {
        return cudaErrorInvalidValue;
    }
    const cudaError_t zeroed = cmk::zero_async(sink, sizeof *sink, stream);
    if (zeroed != cudaSuccess || n == 0) {
        return zeroed;
    }
    cmk::begin_launch();
    stream_read_u32<<<grid, block, 0, stream>>>(data, n, sink);
    return cmk::finish_launch();
}

// Writes `value` to every element of data[0..n).
cudaError_t cmk_stream_write_u32(uint32_t* data, size_t n, uint32_t value, unsigned grid,
                                 unsigned block, cudaStream_t stream) {
    if (!cmk::valid_geometry(grid, block)) {
        return cudaErrorInvalidValue;
    }
    cmk::begin_launch();
    stream_write_u32<<<grid, block, 0, stream>>>(data, n, value);
    return cmk::finish_launch();
}

}  // extern "C"
