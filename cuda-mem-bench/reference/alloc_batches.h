// alloc_batches.h: one batch of K allocation + free pairs per family, in plain CUDA runtime calls.
//
// Shared by raw_reference.cu (its own process) and in_process.cu (linked into the `paired`
// benchmark, which interleaves these batches with cuda-mem's in one process), so both measure the
// same C++ code. Each function returns the first error, or cudaSuccess.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>

namespace alloc_batches {

// K times: `alloc(&ptr)`, then `release(ptr)`.
template <class Alloc, class Release>
inline cudaError_t pairs(int k, Alloc alloc, Release release) {
    for (int i = 0; i < k; ++i) {
        void* ptr = nullptr;
        cudaError_t code = alloc(&ptr);
        if (code == cudaSuccess) code = release(ptr);
        if (code != cudaSuccess) return code;
    }
    return cudaSuccess;
}

// cudaMalloc + cudaFree.
inline cudaError_t device(size_t bytes, int k) {
    return pairs(k, [=](void** p) { return cudaMalloc(p, bytes); }, cudaFree);
}

// cudaMallocHost + cudaFreeHost.
inline cudaError_t malloc_host(size_t bytes, int k) {
    return pairs(k, [=](void** p) { return cudaMallocHost(p, bytes); }, cudaFreeHost);
}

// cudaHostAlloc(flags) + cudaFreeHost.
inline cudaError_t host_alloc(size_t bytes, unsigned flags, int k) {
    return pairs(k, [=](void** p) { return cudaHostAlloc(p, bytes, flags); }, cudaFreeHost);
}

// cudaMallocManaged + memset on the host (every page touched, as cuda-mem's zeroed
// ManagedBuffer does) + cudaFree.
inline cudaError_t managed(size_t bytes, int k) {
    return pairs(
        k, [=](void** p) { return cudaMallocManaged(p, bytes, cudaMemAttachGlobal); },
        [=](void* p) {
            std::memset(p, 0, bytes);
            return cudaFree(p);
        });
}

// cudaMallocAsync (or cudaMallocFromPoolAsync when `pool` is not null) + cudaFreeAsync on
// `stream`; a synchronize after each pair when `sync_each`, else one at the end of the batch.
inline cudaError_t stream_ordered(size_t bytes, cudaMemPool_t pool, cudaStream_t stream, bool sync_each, int k) {
    cudaError_t code = pairs(
        k,
        [=](void** p) {
            return pool != nullptr ? cudaMallocFromPoolAsync(p, bytes, pool, stream)
                                   : cudaMallocAsync(p, bytes, stream);
        },
        [=](void* p) {
            cudaError_t freed = cudaFreeAsync(p, stream);
            return freed == cudaSuccess && sync_each ? cudaStreamSynchronize(stream) : freed;
        });
    return code == cudaSuccess && !sync_each ? cudaStreamSynchronize(stream) : code;
}

}  // namespace alloc_batches
