// Element-wise kernels: fill (any 32-bit element), scale and axpy (f32). Grid-stride loops; the
// output may be the input as well (each element is read and written by the same thread).
#include "common.cuh"

namespace {

__global__ void fill_b32(uint32_t* dst, size_t n, uint32_t bits) {
    for (size_t i = cmk::global_thread(); i < n; i += cmk::grid_threads()) {
        dst[i] = bits;
    }
}

__global__ void scale_f32(float* dst, const float* src, size_t n, float alpha) {
    for (size_t i = cmk::global_thread(); i < n; i += cmk::grid_threads()) {
        dst[i] = alpha * src[i];
    }
}

// y = alpha * x + y with one rounding (fmaf), which the CPU reproduces with f32::mul_add.
__global__ void axpy_f32(float* y, const float* x, size_t n, float alpha) {
    for (size_t i = cmk::global_thread(); i < n; i += cmk::grid_threads()) {
        y[i] = fmaf(alpha, x[i], y[i]);
    }
}

}  // namespace

extern "C" {

// Writes `bits` to every one of the `n` 32-bit elements of `dst` (u32, f32 bit patterns, ...).
cudaError_t cmk_fill_b32(uint32_t* dst, size_t n, uint32_t bits, unsigned grid, unsigned block,
                         cudaStream_t stream) {
    if (!cmk::valid_geometry(grid, block)) {
        return cudaErrorInvalidValue;
    }
    cmk::begin_launch();
    fill_b32<<<grid, block, 0, stream>>>(dst, n, bits);
    return cmk::finish_launch();
}

// dst[i] = alpha * src[i] for i < n; dst may equal src.
cudaError_t cmk_scale_f32(float* dst, const float* src, size_t n, float alpha, unsigned grid,
                          unsigned block, cudaStream_t stream) {
    if (!cmk::valid_geometry(grid, block)) {
        return cudaErrorInvalidValue;
    }
    cmk::begin_launch();
    scale_f32<<<grid, block, 0, stream>>>(dst, src, n, alpha);
    return cmk::finish_launch();
}

// y[i] = fmaf(alpha, x[i], y[i]) for i < n; x may equal y.
cudaError_t cmk_axpy_f32(float* y, const float* x, size_t n, float alpha, unsigned grid,
                         unsigned block, cudaStream_t stream) {
    if (!cmk::valid_geometry(grid, block)) {
        return cudaErrorInvalidValue;
    }
    cmk::begin_launch();
    axpy_f32<<<grid, block, 0, stream>>>(y, x, n, alpha);
    return cmk::finish_launch();
}

}  // extern "C"
