// The capture filter PyTorch passes to a pluggable allocator's begin_allocate_to_pool hook: a
// std::function<bool(cudaStream_t)> that tells whether a stream belongs to the capture. The hook
// itself is a Rust function (src/lib.rs, exported from the library); it keeps a copy of the
// filter, made, called and deleted here.
#include <functional>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace {
using Filter = std::function<bool(CUstream_st*)>;
}  // namespace

extern "C" {
// A heap copy of the filter `filter` points to, or null when copying threw.
void* cuda_mem_torch_filter_copy(const void* filter) noexcept {
  try {
    return new Filter(*static_cast<const Filter*>(filter));
  } catch (...) {
    return nullptr;
  }
}

// 1 when the filter accepts `stream`, 0 when not, -1 when it threw.
int cuda_mem_torch_filter_accepts(void* filter, void* stream) noexcept {
  try {
    return (*static_cast<Filter*>(filter))(static_cast<CUstream_st*>(stream)) ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

void cuda_mem_torch_filter_drop(void* filter) noexcept { delete static_cast<Filter*>(filter); }
}
