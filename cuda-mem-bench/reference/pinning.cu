// How fast pinned host memory can be had: cudaHostAlloc against anonymous memory (transparent
// huge pages asked for, faulted in by several threads) registered with cudaHostRegister, and
// the copy bandwidth from each. Prints one JSON line per way.
//   pinning [GiB] [threads]
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(code));
    std::exit(1);
  }
}

static double copy_gbs(void* host, void* device, size_t bytes) {
  check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "warm-up copy");
  double start = now();
  check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "copy");
  return bytes / (now() - start) / 1e9;
}

int main(int argc, char** argv) {
  size_t gib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 8;
  int threads = argc > 2 ? std::atoi(argv[2]) : 8;
  size_t bytes = gib << 30;
  void* device = nullptr;
  check(cudaFree(nullptr), "context");
  check(cudaMalloc(&device, bytes), "cudaMalloc");

  double start = now();
  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  double took = now() - start;
  std::printf("{\"way\": \"cudaHostAlloc\", \"gib\": %zu, \"seconds\": %.3f, \"gb_per_s\": %.2f, \"d2h_gb_per_s\": %.2f}\n",
              gib, took, bytes / took / 1e9, copy_gbs(pinned, device, bytes));
  check(cudaFreeHost(pinned), "cudaFreeHost");

  for (int huge = 0; huge < 2; ++huge) {
    start = now();
    void* host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) { std::perror("mmap"); return 1; }
    if (huge) madvise(host, bytes, MADV_HUGEPAGE);
    std::vector<std::thread> workers;
    size_t share = (bytes / threads + 4095) / 4096 * 4096;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([=] {
        char* begin = static_cast<char*>(host) + t * share;
        char* end = static_cast<char*>(host) + std::min(bytes, (t + 1) * share);
        for (char* p = begin; p < end; p += 4096) *p = 0;
      });
    }
    for (auto& w : workers) w.join();
    double touched = now() - start;
    check(cudaHostRegister(host, bytes, cudaHostRegisterDefault), "cudaHostRegister");
    took = now() - start;
    std::printf("{\"way\": \"mmap%s+%d threads+cudaHostRegister\", \"gib\": %zu, \"seconds\": %.3f, \"touch_seconds\": %.3f, \"gb_per_s\": %.2f, \"d2h_gb_per_s\": %.2f}\n",
                huge ? "+THP" : "", threads, gib, took, touched, bytes / took / 1e9, copy_gbs(host, device, bytes));
    check(cudaHostUnregister(host), "cudaHostUnregister");
    munmap(host, bytes);
  }
  return 0;
}
