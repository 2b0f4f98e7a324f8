// What each virtual-memory driver call costs, for the device cache's page layer: a miss that
// creates, maps and releases each page (the page layer before 2026-12-06) against one that maps
// kept handles, unmapping, and creating and releasing alone. Prints one JSON object per row
// (median of `rounds`).
// Build: nvcc -O2 -std=c++17 -arch=sm_90 vmm_calls.cu -o vmm_calls (static cudart; the driver's
// functions come through cudaGetDriverEntryPoint, so no libcuda is needed at link time).
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define LOOKUP(name) \
  static decltype(&name) p_##name = [] { \
    void* fn = nullptr; cudaDriverEntryPointQueryResult q; \
    if (cudaGetDriverEntryPoint(#name, &fn, cudaEnableDefault, &q) != cudaSuccess || !fn) { \
      std::fprintf(stderr, "no %s\n", #name); std::exit(1); } \
    return reinterpret_cast<decltype(&name)>(fn); }()

static void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) { std::fprintf(stderr, "%s failed: %d\n", what, int(r)); std::exit(1); }
}

static double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  cudaFree(nullptr);
  LOOKUP(cuMemCreate); LOOKUP(cuMemRelease); LOOKUP(cuMemMap); LOOKUP(cuMemUnmap);
  LOOKUP(cuMemSetAccess); LOOKUP(cuMemAddressReserve); LOOKUP(cuMemAddressFree);
  LOOKUP(cuMemGetAllocationGranularity);
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t page = 0;
  check(p_cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity");
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const size_t run_pages = 48;  // a 96 MiB prefill buffer of 2 MiB pages
  const size_t run = run_pages * page;
  CUdeviceptr base = 0;
  check(p_cuMemAddressReserve(&base, 4 * run, page, 0, 0), "reserve");

  auto row = [&](const char* name, std::vector<double>& us) {
    std::sort(us.begin(), us.end());
    std::printf("{\"row\":\"%s\",\"pages\":%zu,\"page_bytes\":%zu,\"median_us\":%.2f,\"min_us\":%.2f,\"max_us\":%.2f}\n",
                name, run_pages, page, us[us.size() / 2], us.front(), us.back());
  };
  std::vector<double> create_map_page, unmap_page, remap_kept_page, unmap_kept_page, create_page_only,
      release_page_only;
  bool whole_unmap_refused = false;
  for (int r = 0; r < rounds; ++r) {
    // 1. Today's miss: per page create + map + release, then one access call over the run.
    double t = now_us();
    for (size_t i = 0; i < run_pages; ++i) {
      CUmemGenericAllocationHandle h;
      check(p_cuMemCreate(&h, page, &prop, 0), "create");
      check(p_cuMemMap(base + i * page, page, 0, h, 0), "map");
      check(p_cuMemRelease(h), "release");
    }
    check(p_cuMemSetAccess(base, run, &access, 1), "access");
    create_map_page.push_back(now_us() - t);
    t = now_us();
    // One call over several mappings, as raw::vmm::unmap tries first; page by page if refused.
    if (p_cuMemUnmap(base, run) != CUDA_SUCCESS) {
      whole_unmap_refused = true;
      for (size_t i = 0; i < run_pages; ++i) check(p_cuMemUnmap(base + i * page, page), "unmap page");
    }
    unmap_page.push_back(now_us() - t);
    // 2. Kept handles (one per page) mapped again elsewhere: a miss served from kept pages. A
    // part of a larger handle cannot be mapped (cuMemMap's offset must be 0: 801 on 2026-12-06),
    // so each page that may be unmapped alone is its own allocation.
    std::vector<CUmemGenericAllocationHandle> kept(run_pages);
    for (auto& h : kept) check(p_cuMemCreate(&h, page, &prop, 0), "create kept");
    t = now_us();
    for (size_t i = 0; i < run_pages; ++i) check(p_cuMemMap(base + run + i * page, page, 0, kept[i], 0), "remap");
    check(p_cuMemSetAccess(base + run, run, &access, 1), "access remap");
    remap_kept_page.push_back(now_us() - t);
    t = now_us();
    if (p_cuMemUnmap(base + run, run) != CUDA_SUCCESS) {
      for (size_t i = 0; i < run_pages; ++i) check(p_cuMemUnmap(base + run + i * page, page), "unmap kept");
    }
    unmap_kept_page.push_back(now_us() - t);
    for (auto& h : kept) check(p_cuMemRelease(h), "release kept");
    // 5. Create and release alone, a page.
    std::vector<CUmemGenericAllocationHandle> hs(run_pages);
    t = now_us();
    for (auto& h : hs) check(p_cuMemCreate(&h, page, &prop, 0), "create only");
    create_page_only.push_back(now_us() - t);
    t = now_us();
    for (auto& h : hs) check(p_cuMemRelease(h), "release only");
    release_page_only.push_back(now_us() - t);
  }
  row("create_map_release_per_page_then_access", create_map_page);
  row(whole_unmap_refused ? "unmap_per_page_mappings_page_by_page" : "unmap_per_page_mappings_one_call", unmap_page);
  row("map_kept_handle_per_page_access", remap_kept_page);
  row("unmap_kept_per_page", unmap_kept_page);
  row("create_per_page_only", create_page_only);
  row("release_per_page_only", release_page_only);
  // The same miss through cudaMalloc, for scale.
  std::vector<double> malloc_run;
  for (int r = 0; r < rounds; ++r) {
    void* p = nullptr;
    double t = now_us();
    cudaMalloc(&p, run);
    malloc_run.push_back(now_us() - t);
    cudaFree(p);
  }
  row("cudaMalloc_run", malloc_run);
  // 6. Larger handles: the run as handles of `chunk` pages each, created, mapped (one call per
  // handle) and given one access call; then unmapped and released.
  for (size_t chunk : {size_t(4), size_t(16), run_pages}) {
    std::vector<double> map_chunks, unmap_chunks;
    for (int r = 0; r < rounds; ++r) {
      std::vector<CUmemGenericAllocationHandle> hs(run_pages / chunk);
      double t = now_us();
      for (size_t i = 0; i < hs.size(); ++i) {
        check(p_cuMemCreate(&hs[i], chunk * page, &prop, 0), "create chunk");
        check(p_cuMemMap(base + i * chunk * page, chunk * page, 0, hs[i], 0), "map chunk");
      }
      check(p_cuMemSetAccess(base, run, &access, 1), "access chunks");
      map_chunks.push_back(now_us() - t);
      t = now_us();
      for (size_t i = 0; i < hs.size(); ++i) {
        check(p_cuMemUnmap(base + i * chunk * page, chunk * page), "unmap chunk");
        check(p_cuMemRelease(hs[i]), "release chunk");
      }
      unmap_chunks.push_back(now_us() - t);
    }
    char name[96];
    std::snprintf(name, sizeof name, "create_map_access_handles_of_%zu_pages", chunk);
    row(name, map_chunks);
    std::snprintf(name, sizeof name, "unmap_release_handles_of_%zu_pages", chunk);
    row(name, unmap_chunks);
  }
  check(p_cuMemAddressFree(base, 4 * run), "free");
  return 0;
}
