// graph_batches.h: a CUDA graph built by stream capture and launched K times, in plain CUDA
// runtime calls, for the `graph_launch_*` rows of the `paired` benchmark (through in_process.cu),
// which times cuda-mem's GraphExec against these launches in one process. Each function returns
// the first error, or cudaSuccess.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace graph_batches {

// Captures `nodes` memsets of the `bytes` at `buffer` on `stream` (byte value i & 0xff for the
// i-th), the same work cuda-mem's side captures, and instantiates the graph into `*exec`.
inline cudaError_t build(void* buffer, size_t bytes, int nodes, cudaStream_t stream, cudaGraphExec_t* exec) {
    cudaError_t code = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (code != cudaSuccess) return code;
    for (int i = 0; i < nodes && code == cudaSuccess; ++i) code = cudaMemsetAsync(buffer, i & 0xff, bytes, stream);
    cudaGraph_t graph = nullptr;
    cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (code == cudaSuccess) code = ended;
    if (code == cudaSuccess) code = cudaGraphInstantiateWithFlags(exec, graph, 0);
    if (graph != nullptr) {
        cudaError_t destroyed = cudaGraphDestroy(graph);
        if (code == cudaSuccess) code = destroyed;
    }
    return code;
}

// K launches of `exec` on `stream`, then one synchronize: the per-launch cost once K is large.
inline cudaError_t launches(cudaGraphExec_t exec, cudaStream_t stream, int k) {
    for (int i = 0; i < k; ++i) {
        cudaError_t code = cudaGraphLaunch(exec, stream);
        if (code != cudaSuccess) return code;
    }
    return cudaStreamSynchronize(stream);
}

}  // namespace graph_batches
