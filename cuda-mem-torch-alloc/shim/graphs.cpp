// PyTorch's CUDA graph hooks for a pluggable allocator (set_begin_allocate_to_pool,
// set_end_allocate_to_pool_fn, set_release_pool). PyTorch calls them through function pointers
// of C++ types: a MempoolId_t (std::pair of two unsigned long long) and, at a capture's begin, a
// std::function that tells whether a stream belongs to the capture. They forward to the Rust
// functions of src/lib.rs, which keep the filter (as an opaque pointer) until the capture ends.
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace {
using Filter = std::function<bool(CUstream_st*)>;
using PoolId = std::pair<unsigned long long, unsigned long long>;
}  // namespace

extern "C" {
// src/lib.rs: 0 on success; the filter is the callee's in every case.
int cuda_mem_torch_graph_begin(int device, unsigned long long pool0, unsigned long long pool1, void* filter);
void cuda_mem_torch_graph_end(int device, unsigned long long pool0, unsigned long long pool1);
void cuda_mem_torch_graph_release(int device, unsigned long long pool0, unsigned long long pool1);
std::size_t cuda_mem_torch_last_error(char* buffer, std::size_t len);

// A capture into `pool` begins. A refusal is thrown: PyTorch then raises it and does not capture.
void cuda_mem_torch_begin_allocate_to_pool(int device, PoolId pool, Filter filter) {
  auto* owned = new Filter(std::move(filter));
  if (cuda_mem_torch_graph_begin(device, pool.first, pool.second, owned) != 0) {
    std::string message(cuda_mem_torch_last_error(nullptr, 0) + 1, '\0');
    message.resize(cuda_mem_torch_last_error(message.data(), message.size()));
    throw std::runtime_error("cuda-mem allocator: " + message);
  }
}

// Called after the capture ends, and from graph destructors: never throws.
void cuda_mem_torch_end_allocate_to_pool(int device, PoolId pool) noexcept {
  cuda_mem_torch_graph_end(device, pool.first, pool.second);
}

void cuda_mem_torch_release_pool(int device, PoolId pool) noexcept {
  cuda_mem_torch_graph_release(device, pool.first, pool.second);
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
