// alloc_batches.h: one batch of K allocation + free pairs per family, in plain CUDA runtime calls.
//
// Shared by raw_reference.cu (the reference program, its own process) and in_process.cpp (linked
// into the `paired` benchmark, which interleaves these batches with cuda-mem's in one process), so
// both measure the same C++ code. Each function returns the first error, or cudaSuccess.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>

namespace alloc_batches {

#define ALLOC_BATCHES_TRY(call)            \
    do {                                   \
        cudaError_t try_code_ = (call);    \
        if (try_code_ != cudaSuccess) {    \
            return try_code_;              \
        }                                  \
    } while (0)

// cudaMalloc + cudaFree.
inline cudaError_t device(size_t bytes, int k) {
    for (int i = 0; i < k; ++i) {
        void* ptr = nullptr;
        ALLOC_BATCHES_TRY(cudaMalloc(&ptr, bytes));
        ALLOC_BATCHES_TRY(cudaFree(ptr));
    }
    return cudaSuccess;
}

// cudaMallocHost + cudaFreeHost.
inline cudaError_t malloc_host(size_t bytes, int k) {
    for (int i = 0; i < k; ++i) {
        void* ptr = nullptr;
        ALLOC_BATCHES_TRY(cudaMallocHost(&ptr, bytes));
        ALLOC_BATCHES_TRY(cudaFreeHost(ptr));
    }
    return cudaSuccess;
}

// cudaHostAlloc(flags) + cudaFreeHost.
inline cudaError_t host_alloc(size_t bytes, unsigned flags, int k) {
    for (int i = 0; i < k; ++i) {
        void* ptr = nullptr;
        ALLOC_BATCHES_TRY(cudaHostAlloc(&ptr, bytes, flags));
        ALLOC_BATCHES_TRY(cudaFreeHost(ptr));
    }
    return cudaSuccess;
}

// cudaMallocManaged + memset on the host (every page touched, as cuda-mem's zeroed
// ManagedBuffer does) + cudaFree.
inline cudaError_t managed(size_t bytes, int k) {
    for (int i = 0; i < k; ++i) {
        void* ptr = nullptr;
        ALLOC_BATCHES_TRY(cudaMallocManaged(&ptr, bytes, cudaMemAttachGlobal));
        std::memset(ptr, 0, bytes);
        ALLOC_BATCHES_TRY(cudaFree(ptr));
    }
    return cudaSuccess;
}

// cudaMallocAsync (or cudaMallocFromPoolAsync when `pool` is not null) + cudaFreeAsync on
// `stream`; a synchronize after each pair when `sync_each`, else one at the end of the batch.
inline cudaError_t stream_ordered(size_t bytes, cudaMemPool_t pool, cudaStream_t stream, bool sync_each, int k) {
    for (int i = 0; i < k; ++i) {
        void* ptr = nullptr;
        if (pool != nullptr) {
            ALLOC_BATCHES_TRY(cudaMallocFromPoolAsync(&ptr, bytes, pool, stream));
        } else {
            ALLOC_BATCHES_TRY(cudaMallocAsync(&ptr, bytes, stream));
        }
        ALLOC_BATCHES_TRY(cudaFreeAsync(ptr, stream));
        if (sync_each) {
            ALLOC_BATCHES_TRY(cudaStreamSynchronize(stream));
        }
    }
    if (!sync_each) {
        ALLOC_BATCHES_TRY(cudaStreamSynchronize(stream));
    }
    return cudaSuccess;
}

#undef ALLOC_BATCHES_TRY

}  // namespace alloc_batches
