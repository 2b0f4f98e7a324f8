// read_batches.cuh: the streaming-read kernel and one batch of K reads, in plain CUDA, shared by
// raw_reference.cu and in_process.cu like alloc_batches.h. Functions return the first error, or
// cudaSuccess.
//
// The kernel: 16-byte loads, grid-stride, grid = SMs x resident blocks of 256 threads. It does
// the same work per launch as cuda-mem-kernels' stream_read_u32, which the Rust side launches
// (loop unrolled four times, XOR of every element reduced per block, one atomicXor per block,
// the 4-byte sink zeroed with cudaMemsetAsync before each launch), so that the rows compare the
// launch path, not two different kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace read_batches {

constexpr unsigned READ_BLOCK = 256;

__device__ __forceinline__ uint32_t fold(uint4 v) {
    return v.x ^ v.y ^ v.z ^ v.w;
}

__device__ __forceinline__ uint32_t warp_xor(uint32_t v) {
    for (unsigned offset = 16; offset > 0; offset /= 2) {
        v ^= __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

__global__ void stream_read(const uint4* __restrict__ data, size_t count, uint32_t* sink) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    uint32_t acc = 0;
    for (; i + 3 * stride < count; i += 4 * stride) {
        const uint4 a = data[i];
        const uint4 b = data[i + stride];
        const uint4 c = data[i + 2 * stride];
        const uint4 d = data[i + 3 * stride];
        acc ^= fold(a) ^ fold(b) ^ fold(c) ^ fold(d);
    }
    for (; i < count; i += stride) {
        acc ^= fold(data[i]);
    }
    __shared__ uint32_t per_warp[32];
    const unsigned lane = threadIdx.x % 32;
    const unsigned warp = threadIdx.x / 32;
    acc = warp_xor(acc);
    if (lane == 0) {
        per_warp[warp] = acc;
    }
    __syncthreads();
    if (warp == 0) {
        acc = warp_xor(lane < blockDim.x / 32 ? per_warp[lane] : 0u);
        if (lane == 0 && acc != 0) {
            atomicXor(sink, acc);
        }
    }
}

// Blocks of READ_BLOCK threads the current device holds at once: the largest grid a read uses.
inline cudaError_t resident_blocks(unsigned* blocks) {
    int device = 0, sms = 0, threads = 0;
    cudaError_t code = cudaGetDevice(&device);
    if (code == cudaSuccess) code = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (code == cudaSuccess) code = cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device);
    *blocks = static_cast<unsigned>(sms) * (static_cast<unsigned>(threads) / READ_BLOCK);
    return code;
}

// Queues one read of `bytes` (a multiple of 16) at `data` on `stream`: zero the sink, launch.
inline cudaError_t launch(const void* data, size_t bytes, uint32_t* sink, unsigned blocks, cudaStream_t stream) {
    const size_t count = bytes / sizeof(uint4);
    const size_t needed = (count + READ_BLOCK - 1) / READ_BLOCK;
    const unsigned grid = static_cast<unsigned>(needed < blocks ? needed : blocks);
    cudaError_t code = cudaMemsetAsync(sink, 0, sizeof *sink, stream);
    if (code != cudaSuccess) return code;
    stream_read<<<grid, READ_BLOCK, 0, stream>>>(static_cast<const uint4*>(data), count, sink);
    return cudaGetLastError();
}

// Prefetches managed memory to `device` on `stream`.
inline cudaError_t prefetch(const void* data, size_t bytes, int device, cudaStream_t stream) {
#if CUDART_VERSION >= 13000
    return cudaMemPrefetchAsync(data, bytes, {cudaMemLocationTypeDevice, device}, 0, stream);
#else
    return cudaMemPrefetchAsync(data, bytes, device, stream);
#endif
}

// K times: (prefetch to `prefetch_device` when it is >= 0) + read + cudaStreamSynchronize.
inline cudaError_t reads(const void* data, size_t bytes, uint32_t* sink, unsigned blocks, int prefetch_device,
                         cudaStream_t stream, int k) {
    for (int i = 0; i < k; ++i) {
        cudaError_t code = prefetch_device >= 0 ? prefetch(data, bytes, prefetch_device, stream) : cudaSuccess;
        if (code == cudaSuccess) code = launch(data, bytes, sink, blocks, stream);
        if (code == cudaSuccess) code = cudaStreamSynchronize(stream);
        if (code != cudaSuccess) return code;
    }
    return cudaSuccess;
}

}  // namespace read_batches
