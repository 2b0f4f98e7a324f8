# Peer of the `threads` section: PyTorch's CUDACachingAllocator on N C++ threads, each with its
# own stream from PyTorch's pool, alloc + free pairs of 1 MiB (raw_alloc_with_stream +
# raw_delete), timed in C++ as cuda-mem's `cache_pairs` times DeviceCache: every thread warms up
# for a tenth of a second, all start one common window together (a spin barrier), the rate is the
# sum of each thread's pairs over its own window; the median of 5 rounds, thread counts
# alternating in order. Run it in the same device call as `cache_pairs --only threads`:
#     python3 torch_alloc_mt.py [--threads 1,2,4,8,16] > torch_mt.jsonl
import argparse, json, torch
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
double threads_pairs_per_s(int64_t threads, int64_t bytes, double warm_up_s, double window_s) {
  std::atomic<int64_t> ready{0};
  std::vector<double> rates(threads, 0.0);
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      c10::cuda::CUDAGuard guard(0);
      auto stream = c10::cuda::getStreamFromPool(false, 0);
      auto pairs = [&](int n) {
        for (int i = 0; i < n; ++i) {
          void* p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
          c10::cuda::CUDACachingAllocator::raw_delete(p);
        }
      };
      using clock = std::chrono::steady_clock;
      auto seconds = [](clock::time_point since) { return std::chrono::duration<double>(clock::now() - since).count(); };
      auto warm = clock::now();
      while (seconds(warm) < warm_up_s) pairs(1000);
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      auto began = clock::now();
      int64_t done = 0;
      while (seconds(began) < window_s) { pairs(1000); done += 1000; }
      rates[t] = done / seconds(began);
    });
  }
  for (auto& w : workers) w.join();
  double total = 0;
  for (double r : rates) total += r;
  return total;
}
"""

parser = argparse.ArgumentParser()
parser.add_argument("--threads", default="1,2,4,8,16")
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
counts = [int(t) for t in args.threads.split(",") if t]
m = load_inline(name="torchallocmt", cpp_sources=src, functions=["threads_pairs_per_s"], with_cuda=True,
                extra_cflags=["-O2"], verbose=False)
torch.cuda.init()
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda}), flush=True)
rates = {n: [] for n in counts}
for r in range(args.rounds):
    for n in (counts if r % 2 == 0 else list(reversed(counts))):
        rates[n].append(m.threads_pairs_per_s(n, 1 << 20, 0.1, 0.3))
for n in counts:
    rounds = sorted(rates[n])
    print(json.dumps({"row": f"torch_caching_device_threads_{n}_1m", "pairs_per_s": round(rounds[len(rounds) // 2]),
                      "rounds": [round(x) for x in rates[n]]}), flush=True)
