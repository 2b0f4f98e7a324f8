# Peer yardstick: PyTorch's C++ caching allocators, timed in C++ (no Python in the loop).
# Run it on the GPU host (its python3 has PyTorch, nvcc and ninja) in the SAME device call as
# your own benchmark, so the ratios come from one machine and one run:
#     python3 docs/reference/torch_alloc.py > torch.jsonl   (about 60 s: it compiles first)
# Device caching allocator (CUDACachingAllocator raw_alloc_with_stream + raw_delete) and the
# pinned-host caching allocator (getCachingHostAllocator()->allocate + DataPtr drop), alloc+free
# pairs after warm-up, medians of 15 samples of K pairs. Prints JSON lines.
import json, torch
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <chrono>
#include <algorithm>
#include <vector>
static double med(std::vector<double> v){ std::sort(v.begin(), v.end()); return v[v.size()/2]; }
double dev_pair_us(int64_t bytes, int64_t k) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  for (int i = 0; i < 100; ++i) { void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream); c10::cuda::CUDACachingAllocator::raw_delete(p); }
  std::vector<double> s;
  for (int r = 0; r < 15; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < k; ++i) { void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream); c10::cuda::CUDACachingAllocator::raw_delete(p); }
    auto t1 = std::chrono::steady_clock::now();
    s.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / k);
  }
  return med(s);
}
double host_pair_us(int64_t bytes, int64_t k) {
  auto* a = at::cuda::getCachingHostAllocator();
  for (int i = 0; i < 100; ++i) { auto p = a->allocate(bytes); }
  std::vector<double> s;
  for (int r = 0; r < 15; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < k; ++i) { auto p = a->allocate(bytes); }
    auto t1 = std::chrono::steady_clock::now();
    s.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / k);
  }
  return med(s);
}
"""
m = load_inline(name="torchalloc", cpp_sources=src, functions=["dev_pair_us", "host_pair_us"],
                with_cuda=True, extra_cflags=["-O2"], verbose=False)
torch.cuda.init()
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda}))
for name, size in [("4k", 4096), ("1m", 1 << 20), ("64m", 64 << 20)]:
    print(json.dumps({"row": f"torch_caching_device_pair_{name}", "us": m.dev_pair_us(size, 20000)}))
    print(json.dumps({"row": f"torch_caching_host_pair_{name}", "us": m.host_pair_us(size, 20000)}))
# What a Python user pays for the same pair (tensor creation and drop).
import time
for name, size in [("1m", 1 << 20)]:
    for dev in ["cuda"]:
        for _ in range(1000): torch.empty(size, dtype=torch.uint8, device=dev)
        t = time.perf_counter()
        for _ in range(20000): torch.empty(size, dtype=torch.uint8, device=dev)
        print(json.dumps({"row": f"torch_python_empty_cuda_{name}", "us": (time.perf_counter() - t) / 20000 * 1e6}))
    for _ in range(1000): torch.empty(size, dtype=torch.uint8, pin_memory=True)
    t = time.perf_counter()
    for _ in range(20000): torch.empty(size, dtype=torch.uint8, pin_memory=True)
    print(json.dumps({"row": f"torch_python_empty_pinned_{name}", "us": (time.perf_counter() - t) / 20000 * 1e6}))
# Pageable tensor copy to the GPU (what a PyTorch user gets without pin_memory), 256 MiB.
x = torch.ones(256 << 20, dtype=torch.uint8)
torch.cuda.synchronize()
for non_blocking in [False]:
    y = x.to("cuda"); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5): y = x.to("cuda")
    torch.cuda.synchronize()
    print(json.dumps({"row": "torch_pageable_h2d_256m", "gbs": 5 * (256 << 20) / (time.perf_counter() - t) / 1e9}))
