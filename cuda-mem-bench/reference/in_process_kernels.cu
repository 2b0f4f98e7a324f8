// in_process_kernels.cu: the read batches of read_batches.cuh behind a C ABI, linked into the
// `paired` benchmark so that raw CUDA and cuda-mem kernel reads run interleaved in one process.
// Compiled by nvcc (through the cc crate); cudart comes from cuda-mem-sys.

#include "read_batches.cuh"

extern "C" {

int cm_raw_resident_blocks(unsigned* blocks) {
    return read_batches::resident_blocks(blocks);
}

int cm_raw_reads(const void* data, size_t bytes, void* sink, unsigned blocks, int prefetch_device, void* stream,
                 int k) {
    return read_batches::reads(data, bytes, static_cast<uint32_t*>(sink), blocks, prefetch_device,
                               static_cast<cudaStream_t>(stream), k);
}

}  // extern "C"
