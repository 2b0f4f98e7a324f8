//! The C entry points of `kernels/*.cu`. Each one checks its geometry, queues its kernel on
//! `stream` with `<<<grid, block, 0, stream>>>` and returns `cudaGetLastError()` (the launch's own
//! verdict: the kernel runs later, in stream order).

use cuda_mem::launch::{cudaError_t, cudaStream_t};

// SAFETY (for every declaration): the signatures match the `extern "C"` definitions in
// kernels/*.cu (`size_t` = usize, `unsigned` = u32, `unsigned long long` = u64, `cudaError_t` is
// an int-sized enum, which `cudaError` mirrors with `repr(transparent)` over `c_uint`).
unsafe extern "C" {
    pub(crate) fn cmk_fill_b32(
        dst: *mut u32,
        n: usize,
        bits: u32,
        grid: u32,
        block: u32,
        stream: cudaStream_t,
    ) -> cudaError_t;

    pub(crate) fn cmk_checksum_u32(
        data: *const u32,
        n: usize,
        out: *mut u64,
        grid: u32,
        block: u32,
        stream: cudaStream_t,
    ) -> cudaError_t;

    pub(crate) fn cmk_stream_read_u32(
        data: *const u32,
        n: usize,
        sink: *mut u32,
        grid: u32,
        block: u32,
        stream: cudaStream_t,
    ) -> cudaError_t;

    pub(crate) fn cmk_stream_write_u32(
        data: *mut u32,
        n: usize,
        value: u32,
        grid: u32,
        block: u32,
        stream: cudaStream_t,
    ) -> cudaError_t;

    pub(crate) fn cmk_touch_write_u32(
        data: *mut u32,
        n: usize,
        stride: usize,
        value: u32,
        grid: u32,
        block: u32,
        stream: cudaStream_t,
    ) -> cudaError_t;

    pub(crate) fn cmk_touch_read_u32(
        data: *const u32,
        n: usize,
        stride: usize,
        sink: *mut u32,
        grid: u32,
        block: u32,
        stream: cudaStream_t,
    ) -> cudaError_t;

    pub(crate) fn cmk_pointer_chase_u32(
        ring: *const u32,
        len: u32,
        start: u32,
        steps: u64,
        out: *mut u32,
        stream: cudaStream_t,
    ) -> cudaError_t;
}

/// The f32 kernels of one shape: `out` from `input` and `alpha` over `n` elements
/// (`dst = alpha * src`, `y = alpha * x + y`).
macro_rules! f32_kernels {
    ($($name:ident),+) => {
        // SAFETY: as for the block above.
        unsafe extern "C" {
            $(
                pub(crate) fn $name(
                    out: *mut f32,
                    input: *const f32,
                    n: usize,
                    alpha: f32,
                    grid: u32,
                    block: u32,
                    stream: cudaStream_t,
                ) -> cudaError_t;
            )+
        }
    };
}

f32_kernels!(cmk_scale_f32, cmk_axpy_f32);
