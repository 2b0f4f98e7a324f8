"""Replays cuda-mem-workloads files (.cmwl) through PyTorch's CUDA caching allocator, timed in C++.

    python3 torch_replay.py FILE.cmwl [FILE...]                 # allocator "torch_native"
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \\
        python3 torch_replay.py FILE.cmwl [FILE...]             # allocator "torch_expandable"

Prints one JSON line per workload on stdout (see README.md beside this file). The core (file
parser, round-robin peak, one thread and one non-blocking stream per lane, two passes, timing)
is replay.h beside this file, compiled into a C++ extension with load_inline, so no Python runs
inside the timed loops. Run each allocator configuration in a process of its own: the allocator
reads PYTORCH_CUDA_ALLOC_CONF once, at CUDA initialization. Within the process each workload
starts from an empty cache (synchronize, empty_cache, reset_peak_memory_stats).

Exit code: 0 when every row is a measurement, 1 when some row is an {"error": ...}.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# The allocator, for replay.h (see the interface there).
#
# Blocks are c10::DataPtr from the allocator's DataPtr API (CUDAAllocator::allocate), made with
# the lane's stream current (setCurrentCUDAStream on the lane's thread), so the block belongs to
# that stream as with raw_alloc_with_stream. Free = DataPtr::clear(), which runs the allocator's
# deleter (the same free as raw_delete).
#
# Hand-off (free_on): PyTorch's record-stream mechanism. recordStream(dataptr, other lane's
# stream), then clear: the allocator records an event on each recorded stream at the free and
# does not reuse the block before those events complete. recordStream needs the DataPtr (it
# checks the deleter is the allocator's own), which is why every block is a DataPtr rather than a
# raw_alloc_with_stream pointer: there is no raw-pointer recordStream, and making the lane's own
# stream wait for the other one before raw_delete would serialize the streams instead of using
# torch's mechanism. The DataPtr API costs a current-device and current-stream lookup per
# allocation over raw_alloc_with_stream; the cache logic is the same malloc/free.
#
# Counters: DeviceStats (c10/core/CachingDeviceAllocator.h in 2.11):
#   reserved_bytes[StatType::AGGREGATE].peak  -> peak_reserved_bytes
#   num_device_alloc (cudaMalloc calls, and expandable segments' map calls) -> misses
SRC = r"""
#include <torch/extension.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "replay.h"

#include <string>
#include <vector>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

struct TorchLanes : cmwl::CudaLanes {
  using Block = c10::DataPtr;
  static bool live(const c10::DataPtr& p) { return p.get() != nullptr; }

  std::vector<c10::cuda::CUDAStream> cstreams;
  cca::CUDAAllocator* allocator = nullptr;

  void open(std::size_t lanes)
  {
    cmwl::CudaLanes::open(lanes);
    allocator = cca::get();
    if (allocator == nullptr) throw std::runtime_error("no CUDA caching allocator (torch.cuda not initialized?)");
    cstreams.clear();
    for (std::size_t l = 0; l < lanes; ++l)
      cstreams.push_back(c10::cuda::getStreamFromExternal(streams_[l], c10::DeviceIndex(device)));
  }
  void thread_begin(std::size_t l)
  {
    cmwl::CudaLanes::thread_begin(l);
    c10::cuda::setCurrentCUDAStream(cstreams[l]);  // thread-local: this lane's thread only
  }
  c10::DataPtr alloc(std::size_t, std::uint64_t bytes) { return allocator->allocate(bytes); }
  void free(std::size_t, c10::DataPtr& b, std::uint64_t) { b.clear(); }
  void free_on(std::size_t, c10::DataPtr& b, std::uint64_t, std::size_t other)
  {
    cca::recordStream(b, cstreams[other]);
    b.clear();
  }
  void empty_cache(std::size_t) { cca::emptyCache(); }
  cmwl::Counters counters()
  {
    auto stats = cca::getDeviceStats(c10::DeviceIndex(device));
    auto agg   = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return cmwl::Counters{stats.reserved_bytes[agg].peak, stats.num_device_alloc};
  }
};

// Replays one file; returns its JSON line (an error row on failure).
std::string replay_file(const std::string& path, const std::string& allocator, const std::string& version,
                        const std::string& config)
{
  cmwl::Workload w;
  try {
    w = cmwl::read_file(path);
  } catch (std::exception const& e) {
    return cmwl::json_error(path, allocator, e.what());
  }
  const cmwl::Shape shape = cmwl::shape(w);
  cmwl::Result r;
  try {
    TorchLanes a;
    r = cmwl::replay(w, a);
  } catch (std::exception const& e) {
    r.error = e.what();
  }
  return cmwl::json_row(w, shape, allocator, r, version, "done", config);
}

std::vector<int> cuda_versions()
{
  int rt = 0, drv = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = -1;
  if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = -1;
  return {rt, drv};
}

bool expandable_segments() { return cca::CUDAAllocatorConfig::expandable_segments(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
  // The replay's threads never touch Python: let go of the GIL while they run.
  m.def("replay_file", &replay_file, py::call_guard<py::gil_scoped_release>());
  m.def("cuda_versions", &cuda_versions);
  m.def("expandable_segments", &expandable_segments);
}
"""


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 0 if len(argv) >= 2 else 2
    files = argv[1:]
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
    name = "torch_expandable" if "expandable_segments:True" in conf.replace(" ", "") else "torch_native"

    import torch
    from torch.utils.cpp_extension import load_inline

    def fail_all(why):
        for f in files:
            print(json.dumps({"workload": f, "allocator": name, "error": why}), flush=True)
        return 1

    if not torch.cuda.is_available():
        return fail_all("torch.cuda.is_available() is False")
    try:
        m = load_inline(
            name="cmwl_torch_replay",
            cpp_sources=[SRC],
            with_cuda=True,
            extra_include_paths=[HERE],
            extra_cflags=["-O2"],
            verbose=False,
        )
    except Exception as e:  # the compiler's output is on stderr
        return fail_all(f"building the extension: {type(e).__name__}: {e}")

    torch.cuda.init()
    torch.cuda.set_device(0)
    # Initialize the caching allocator on device 0 with one allocation, then empty it.
    torch.empty(1, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    rt, drv = m.cuda_versions()
    version = f"torch {torch.__version__} / cuda {torch.version.cuda} / cudart {rt} / driver {drv}"
    config = (
        f"c10::cuda::CUDACachingAllocator, PYTORCH_CUDA_ALLOC_CONF={conf!r}, "
        f"expandable_segments={m.expandable_segments()}; alloc = CUDAAllocator::allocate with the lane's "
        "stream current, free = DataPtr drop, free_on = recordStream(other lane's stream) + drop, "
        "empty_cache = emptyCache(); peak_reserved = reserved_bytes[AGGREGATE].peak, "
        "misses = num_device_alloc delta"
    )
    errors = 0
    for f in files:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        line = m.replay_file(f, name, version, config)
        errors += '"error":' in line
        print(line, flush=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
