// Pointer chase: one thread follows idx = ring[idx] for `steps` hops and writes the final index.
// Each load's address depends on the previous load, so the time per hop is the memory's latency
// (device, mapped host or managed memory, whatever `ring` points to). Indices are reduced modulo
// the ring's length before use, so any contents stay in bounds; the reduction is a branch the
// rings from `chase_ring` never take.
#include "common.cuh"

namespace {

__device__ __forceinline__ uint32_t in_ring(uint32_t idx, uint32_t len) {
    if (__builtin_expect(idx >= len, 0)) {
        idx %= len;
    }
    return idx;
}

__global__ void pointer_chase_u32(const uint32_t* ring, uint32_t len, uint32_t start,
                                  unsigned long long steps, uint32_t* out) {
    uint32_t idx = in_ring(start, len);
    for (unsigned long long step = 0; step < steps; ++step) {
        idx = in_ring(ring[idx], len);
    }
    *out = idx;
}

}  // namespace

extern "C" {

// *out = the index reached from `start % len` after `steps` hops idx = ring[idx] % len (len > 0).
cudaError_t cmk_pointer_chase_u32(const uint32_t* ring, uint32_t len, uint32_t start,
                                  unsigned long long steps, uint32_t* out, cudaStream_t stream) {
    if (len == 0) {
        return cudaErrorInvalidValue;
    }
    cmk::begin_launch();
    pointer_chase_u32<<<1, 1, 0, stream>>>(ring, len, start, steps, out);
    return cmk::finish_launch();
}

}  // extern "C"
