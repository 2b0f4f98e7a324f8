// copy_batches.h: one batch of K synchronous copies, in plain CUDA runtime calls, shared by
// raw_reference.cu and in_process.cu like alloc_batches.h. Returns the first error, or cudaSuccess.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace copy_batches {

// K cudaMemcpy calls of `bytes`; after each, a cudaStreamSynchronize(0) when `sync_legacy`
// (a device-to-device cudaMemcpy may return before the copy ends; cuda-mem's copy_from_device
// waits for it).
inline cudaError_t copies(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, bool sync_legacy, int k) {
    for (int i = 0; i < k; ++i) {
        cudaError_t code = cudaMemcpy(dst, src, bytes, kind);
        if (code == cudaSuccess && sync_legacy) code = cudaStreamSynchronize(0);
        if (code != cudaSuccess) return code;
    }
    return cudaSuccess;
}

}  // namespace copy_batches
