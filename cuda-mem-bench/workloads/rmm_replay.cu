// rmm_replay: replays cuda-mem-workloads files (.cmwl) through RAPIDS RMM 26.x resources and raw
// cudaMallocFromPoolAsync, with replay.h's method (two passes, one thread and one non-blocking
// stream per lane, round-robin peak of live bytes). One JSON line per (workload, allocator) on
// stdout; see README.md beside this file. Built by build_rmm_replay.sh.
//
//   rmm_replay [--allocators rmm_pool,rmm_binning,rmm_arena,cuda_async,cuda_pool_raw] FILE.cmwl...
//
// Exit code: 0 when every row is a measurement, 1 when some row is an {"error":...} (the others
// still ran), 2 on bad usage or when there is no usable CUDA device (error rows say so).
//
// RMM calls go through rmm::device_async_resource_ref with the 26.x API
// (allocate(cuda::stream_ref, bytes, alignment) / deallocate(cuda::stream_ref, p, bytes,
// alignment), alignment 256), as ../peers/rmm/rmmbench.cu does. Each resource is made
// fresh for each workload and torn down after it.

#include "replay.h"

#include <rmm/aligned.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>
#include <rmm/resource_ref.hpp>
#include <rmm/version_config.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr std::size_t ALIGN = rmm::CUDA_ALLOCATION_ALIGNMENT;
constexpr int BIN_MIN_EXP = 18;  // RMM's own benchmarks (and rmmbench): bins 2^18..2^22 B
constexpr int BIN_MAX_EXP = 22;

// An RMM resource driven by replay.h. A hand-off (free_on) is RMM's stream-ordered way: record
// an event on the lane's stream, make the other lane's stream wait on it, and deallocate on the
// other lane's stream; the resource may then reuse the block on that stream at once (stream
// order), and on others only after their synchronization with it.
struct RmmLanes : cmwl::CudaLanes {
  using Block = void*;
  static bool live(void* const& p) { return p != nullptr; }

  rmm::device_async_resource_ref ref;
  std::function<cmwl::Counters()> read;  // the resource's counters
  cudaMemPool_t trim_pool = nullptr;     // empty_cache: cudaMemPoolTrimTo(pool, 0); none: ignored

  RmmLanes(rmm::device_async_resource_ref r, std::function<cmwl::Counters()> c, cudaMemPool_t trim)
    : ref(r), read(std::move(c)), trim_pool(trim)
  {
  }
  void* alloc(std::size_t l, std::uint64_t bytes)
  {
    return ref.allocate(cuda::stream_ref{streams_[l]}, bytes, ALIGN);
  }
  void free(std::size_t l, void*& b, std::uint64_t bytes)
  {
    void* p = b;
    b       = nullptr;
    ref.deallocate(cuda::stream_ref{streams_[l]}, p, bytes, ALIGN);
  }
  void free_on(std::size_t l, void*& b, std::uint64_t bytes, std::size_t other)
  {
    void* p = b;
    b       = nullptr;
    hand_off(l, other);
    ref.deallocate(cuda::stream_ref{streams_[other]}, p, bytes, ALIGN);
  }
  void empty_cache(std::size_t)
  {
    if (trim_pool) cmwl::cuda_check(cudaMemPoolTrimTo(trim_pool, 0), "cudaMemPoolTrimTo");
  }
  cmwl::Counters counters() { return read(); }
};

// Raw stream-ordered allocation on a pool of its own (no RMM): cudaMallocFromPoolAsync /
// cudaFreeAsync; hand-offs as above, with cudaFreeAsync on the other lane's stream.
struct RawPoolLanes : cmwl::CudaLanes {
  using Block = void*;
  static bool live(void* const& p) { return p != nullptr; }
  cudaMemPool_t pool;
  explicit RawPoolLanes(cudaMemPool_t p) : pool(p) {}
  void* alloc(std::size_t l, std::uint64_t bytes)
  {
    void* p = nullptr;
    cmwl::cuda_check(cudaMallocFromPoolAsync(&p, bytes, pool, streams_[l]), "cudaMallocFromPoolAsync");
    return p;
  }
  void free(std::size_t l, void*& b, std::uint64_t)
  {
    void* p = b;
    b       = nullptr;
    cmwl::cuda_check(cudaFreeAsync(p, streams_[l]), "cudaFreeAsync");
  }
  void free_on(std::size_t l, void*& b, std::uint64_t, std::size_t other)
  {
    void* p = b;
    b       = nullptr;
    hand_off(l, other);
    cmwl::cuda_check(cudaFreeAsync(p, streams_[other]), "cudaFreeAsync");
  }
  void empty_cache(std::size_t) { cmwl::cuda_check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo"); }
  cmwl::Counters counters()
  {
    std::uint64_t high = 0;
    cmwl::cuda_check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high), "cudaMemPoolGetAttribute");
    return cmwl::Counters{std::int64_t(high), -1};
  }
};

cmwl::Counters pool_high(cudaMemPool_t pool)
{
  std::uint64_t high = 0;
  cmwl::cuda_check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high), "cudaMemPoolGetAttribute");
  return cmwl::Counters{std::int64_t(high), -1};
}

void reset_pool_high(cudaMemPool_t pool)
{
  std::uint64_t zero = 0;
  cmwl::cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero), "cudaMemPoolSetAttribute");
}

// The upstream of the suballocators: statistics_resource_adaptor(cuda_memory_resource). Its bytes
// counter's peak is the peak reserved from the driver (a pool's growth, the arena's up-front
// reserve), its allocations counter's total the number of trips to cudaMalloc.
std::function<cmwl::Counters()> stats_reader(rmm::mr::statistics_resource_adaptor stats)
{
  return [stats]() {
    return cmwl::Counters{stats.get_bytes_counter().peak, stats.get_allocations_counter().total};
  };
}

struct Row {
  std::string config;
  std::string empty_cache;  // "done" | "ignored"
  cmwl::Result result;
};

template <class A>
cmwl::Result run(const cmwl::Workload& w, A& a)
{
  cmwl::Result r = cmwl::replay(w, a);
  cudaError_t e  = cudaDeviceSynchronize();
  if (e != cudaSuccess && r.error.empty())
    r.error = std::string("cudaDeviceSynchronize after the replay: ") + cudaGetErrorString(e);
  return r;
}

// Builds allocator `name` fresh, replays `w` through it, tears it down (in reverse order of
// construction: locals). Throws on a failure to build.
Row replay_with(const std::string& name, const cmwl::Workload& w)
{
  using namespace rmm::mr;
  Row row;
  if (name == "rmm_pool") {
    statistics_resource_adaptor stats{cuda_memory_resource{}};
    pool_memory_resource pool{stats, 0};
    RmmLanes a{rmm::device_async_resource_ref{pool}, stats_reader(stats), nullptr};
    row.config = "rmm::mr::pool_memory_resource(statistics_resource_adaptor(cuda_memory_resource), initial=0, "
                 "max=none): growth only; misses = upstream allocations";
    row.empty_cache = "ignored";  // no safe release while allocations live
    row.result      = run(w, a);
  } else if (name == "rmm_binning") {
    statistics_resource_adaptor stats{cuda_memory_resource{}};
    pool_memory_resource pool{stats, 0};
    binning_memory_resource bins{pool, std::int8_t(BIN_MIN_EXP), std::int8_t(BIN_MAX_EXP)};
    RmmLanes a{rmm::device_async_resource_ref{bins}, stats_reader(stats), nullptr};
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "rmm::mr::binning_memory_resource(pool_memory_resource(statistics_resource_adaptor("
                  "cuda_memory_resource), initial=0), fixed-size bins 2^%d..2^%d B, larger -> pool); misses = "
                  "upstream allocations",
                  BIN_MIN_EXP, BIN_MAX_EXP);
    row.config      = buf;
    row.empty_cache = "ignored";
    row.result      = run(w, a);
  } else if (name == "rmm_arena") {
    statistics_resource_adaptor stats{cuda_memory_resource{}};
    arena_memory_resource arena{stats};
    RmmLanes a{rmm::device_async_resource_ref{arena}, stats_reader(stats), nullptr};
    row.config = "rmm::mr::arena_memory_resource(statistics_resource_adaptor(cuda_memory_resource), "
                 "arena_size=default: half of free device memory, reserved up front and counted in "
                 "peak_reserved_bytes); misses = upstream allocations";
    row.empty_cache = "ignored";
    row.result      = run(w, a);
  } else if (name == "cuda_async") {
    cuda_async_memory_resource async{std::nullopt, std::optional<std::size_t>{UINT64_MAX}};
    cudaMemPool_t h = async.pool_handle();
    reset_pool_high(h);
    RmmLanes a{rmm::device_async_resource_ref{async}, [h]() { return pool_high(h); }, h};
    row.config = "rmm::mr::cuda_async_memory_resource(initial=none, release_threshold=UINT64_MAX); "
                 "peak_reserved = cudaMemPoolAttrReservedMemHigh; empty_cache = cudaMemPoolTrimTo(pool, 0)";
    row.empty_cache = "done";
    row.result      = run(w, a);
  } else if (name == "cuda_pool_raw") {
    cudaMemPoolProps props{};
    props.allocType     = cudaMemAllocationTypePinned;
    props.handleTypes   = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id   = cmwl::CudaLanes::device;
    cudaMemPool_t pool  = nullptr;
    cmwl::cuda_check(cudaSetDevice(cmwl::CudaLanes::device), "cudaSetDevice");
    cmwl::cuda_check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    std::uint64_t threshold = UINT64_MAX;
    cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (e == cudaSuccess) {
      RawPoolLanes a{pool};
      row.config = "cudaMallocFromPoolAsync/cudaFreeAsync on a cudaMemPoolCreate pool, release_threshold=UINT64_MAX "
                   "(no RMM); peak_reserved = cudaMemPoolAttrReservedMemHigh; empty_cache = cudaMemPoolTrimTo(pool, 0)";
      row.empty_cache = "done";
      row.result      = run(w, a);
    }
    cudaDeviceSynchronize();
    cudaMemPoolDestroy(pool);
    cmwl::cuda_check(e, "cudaMemPoolSetAttribute(ReleaseThreshold)");
  } else {
    throw std::runtime_error("unknown allocator " + name);
  }
  return row;
}

std::string version_string()
{
  int rt = 0, drv = 0;
  if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = -1;
  if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = -1;
  char buf[256];
  std::snprintf(buf, sizeof buf, "rmm %s / cccl %d / cudart %d (static) / driver %d / nvcc %d.%d", RMM_VERSION,
                int(CCCL_VERSION), rt, drv, __CUDACC_VER_MAJOR__, __CUDACC_VER_MINOR__);
  return buf;
}

std::vector<std::string> split(const std::string& s)
{
  std::vector<std::string> v;
  std::size_t at = 0;
  while (at <= s.size()) {
    std::size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    if (comma > at) v.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return v;
}

void usage()
{
  std::fprintf(stderr,
               "usage: rmm_replay [--allocators A,B,..] FILE.cmwl [FILE...]\n"
               "  allocators: rmm_pool rmm_binning rmm_arena cuda_async cuda_pool_raw (default: all)\n"
               "  prints one JSON line per (workload, allocator) on stdout\n");
}

}  // namespace

int main(int argc, char** argv)
{
  std::vector<std::string> allocators{"rmm_pool", "rmm_binning", "rmm_arena", "cuda_async", "cuda_pool_raw"};
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--allocators" && i + 1 < argc) {
      allocators = split(argv[++i]);
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      usage();
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (files.empty() || allocators.empty()) {
    usage();
    return 2;
  }
  const std::string version = version_string();
  // No driver or no device: say so on every row and stop (a resource torn down without a driver
  // asserts inside RMM).
  int devices   = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::string why = std::string("no usable CUDA device: cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" +
                      cudaGetErrorString(e) + "), " + std::to_string(devices) + " devices; " + version;
    for (auto const& file : files)
      for (auto const& name : allocators) std::printf("%s\n", cmwl::json_error(file, name, why).c_str());
    return 2;
  }
  bool any_error = false;
  for (auto const& file : files) {
    cmwl::Workload w;
    try {
      w = cmwl::read_file(file);
    } catch (std::exception const& e) {
      for (auto const& name : allocators) std::printf("%s\n", cmwl::json_error(file, name, e.what()).c_str());
      std::fflush(stdout);
      any_error = true;
      continue;
    }
    const cmwl::Shape shape = cmwl::shape(w);
    for (auto const& name : allocators) {
      std::string line;
      try {
        Row row = replay_with(name, w);
        line    = cmwl::json_row(w, shape, name, row.result, version, row.empty_cache, row.config);
        any_error = any_error || !row.result.error.empty();
      } catch (std::exception const& e) {
        line      = cmwl::json_error(w.name, name, e.what());
        any_error = true;
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }
  return any_error ? 1 : 0;
}
