// in_process.cu: the batches of alloc_batches.h, copy_batches.h, read_batches.cuh and
// graph_batches.h behind a C ABI, linked into the `paired` benchmark so that raw CUDA and cuda-mem
// run interleaved in one process. Compiled by nvcc, like raw_reference.cu; cudart comes from cuda-mem-sys.

#include "alloc_batches.h"
#include "copy_batches.h"
#include "graph_batches.h"
#include "read_batches.cuh"

extern "C" {

int cm_raw_device(size_t bytes, int k) { return alloc_batches::device(bytes, k); }

int cm_raw_malloc_host(size_t bytes, int k) { return alloc_batches::malloc_host(bytes, k); }

int cm_raw_host_alloc(size_t bytes, unsigned flags, int k) { return alloc_batches::host_alloc(bytes, flags, k); }

int cm_raw_managed(size_t bytes, int k) { return alloc_batches::managed(bytes, k); }

int cm_raw_stream_ordered(size_t bytes, void* pool, void* stream, int sync_each, int k) {
    return alloc_batches::stream_ordered(bytes, static_cast<cudaMemPool_t>(pool), static_cast<cudaStream_t>(stream),
                                         sync_each != 0, k);
}

int cm_raw_copy(void* dst, const void* src, size_t bytes, int kind, int sync_legacy, int k) {
    return copy_batches::copies(dst, src, bytes, static_cast<cudaMemcpyKind>(kind), sync_legacy != 0, k);
}

int cm_raw_reads(const void* data, size_t bytes, void* sink, int prefetch_device, void* stream, int k) {
    // The grid limit of the current device, queried once: in the first batch, an untimed warm-up.
    static const unsigned blocks = [] {
        unsigned found = 0;
        return read_batches::resident_blocks(&found) == cudaSuccess ? found : 0u;
    }();
    return read_batches::reads(data, bytes, static_cast<uint32_t*>(sink), blocks, prefetch_device,
                               static_cast<cudaStream_t>(stream), k);
}

int cm_raw_graph_build(void* buffer, size_t bytes, int nodes, void* stream, void** exec) {
    cudaGraphExec_t made = nullptr;
    int code = graph_batches::build(buffer, bytes, nodes, static_cast<cudaStream_t>(stream), &made);
    *exec = made;
    return code;
}

int cm_raw_graph_launches(void* exec, void* stream, int k) {
    return graph_batches::launches(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream), k);
}

int cm_raw_graph_destroy(void* exec) { return cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)); }

}  // extern "C"
