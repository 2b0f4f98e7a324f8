// raw_reference: the raw CUDA C++ yardstick for cuda-mem-bench. Plain CUDA runtime calls, no
// Rust, measured the way the benchmarks measure cuda-mem (the method: src/lib.rs), so that each row
// of the report is a ratio taken in one run on one machine.
//
// Output: one JSON object per line. First the machine:
//   {"key":"env","device":"NVIDIA H200","driver":"13.0","runtime":"13.0","cc":"9.0",...}
// then one line per row ("k" and "samples" let the report check them against its catalogue):
//   {"key":"malloc_4k","value":61.2,"unit":"us","detail":"...","k":200,"samples":30}
// Every CUDA return code is checked; a failure prints one line to stderr and exits with status 1.

#include <cuda_runtime.h>

#include "alloc_batches.h"
#include "copy_batches.h"
#include "read_batches.cuh"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

#define CHECK(call) check((call), #call, __LINE__)

void check(cudaError_t code, const char* what, int line) {
    if (code != cudaSuccess) {
        std::fprintf(stderr, "raw_reference: %s failed (line %d): %s: %s\n", what, line, cudaGetErrorName(code),
                     cudaGetErrorString(code));
        std::exit(1);
    }
}

// K operations per sample and the number of samples of each row: build.rs writes plans.h from
// the row catalogue, src/rows.rs, so that both sides run the same plans.
struct Plan {
    const char* key;
    int k;
    int samples;
};

const Plan PLANS[] = {
#include "plans.h"
};

constexpr size_t MIB = size_t{1} << 20;
constexpr size_t GIB = 1024 * MIB;
constexpr size_t COPY_BYTES = 256 * MIB;

// Measures and prints one row: one warm-up sample, then the plan's samples, each running `setup()`
// untimed and then `batch(K)` (K operations) timed with the steady clock (CLOCK_MONOTONIC, as
// Rust's Instant). The figure is the median over samples of (sample time / K): µs per operation,
// or, when `counted` bytes are given, bytes / that time in GB/s (1 GB = 1e9 bytes).
void measure(const std::string& key, size_t counted, const std::string& detail,
             const std::function<cudaError_t(int)>& batch, const std::function<void()>& setup = [] {}) {
    const Plan* p = std::find_if(std::begin(PLANS), std::end(PLANS), [&](const Plan& p) { return key == p.key; });
    if (p == std::end(PLANS)) {
        std::fprintf(stderr, "raw_reference: no plan for row %s\n", key.c_str());
        std::exit(1);
    }
    std::vector<double> per_op;
    for (int s = 0; s <= p->samples; ++s) {
        setup();
        auto start = std::chrono::steady_clock::now();
        CHECK(batch(p->k));
        std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        if (s > 0) per_op.push_back(took.count() / p->k);  // sample 0 is the warm-up
    }
    std::sort(per_op.begin(), per_op.end());
    size_t n = per_op.size();
    double median = n % 2 == 1 ? per_op[n / 2] : (per_op[n / 2 - 1] + per_op[n / 2]) / 2.0;
    double value = counted > 0 ? static_cast<double>(counted) / median / 1e9 : median * 1e6;
    std::printf("{\"key\":\"%s\",\"value\":%.9g,\"unit\":\"%s\",\"detail\":\"%s\",\"k\":%d,\"samples\":%d}\n",
                key.c_str(), value, counted > 0 ? "GB/s" : "us", detail.c_str(), p->k, p->samples);
    std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Section "alloc": one allocation + free pair per operation.

void alloc_section(int device) {
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaMemPool_t default_pool;
    CHECK(cudaDeviceGetDefaultMemPool(&default_pool, device));
    using Batch = std::function<cudaError_t(size_t, int)>;
    auto host = [](unsigned flags) -> Batch {
        return [flags](size_t bytes, int k) { return alloc_batches::host_alloc(bytes, flags, k); };
    };
    auto ordered = [&](bool sync_each) -> Batch {
        return [=](size_t bytes, int k) { return alloc_batches::stream_ordered(bytes, nullptr, stream, sync_each, k); };
    };
    const std::string pool = "(device default pool, release threshold ";
    struct Family {
        const char* prefix;
        bool sets_threshold;  // of the device's default pool, which the stream-ordered rows use
        uint64_t threshold;
        std::string detail;
        Batch batch;
    };
    const Family families[] = {
        {"malloc", false, 0, "cudaMalloc + cudaFree", alloc_batches::device},
        {"malloc_host", false, 0, "cudaMallocHost + cudaFreeHost", alloc_batches::malloc_host},
        {"host_alloc_portable", false, 0, "cudaHostAlloc(cudaHostAllocPortable) + cudaFreeHost",
         host(cudaHostAllocPortable)},
        {"host_alloc_mapped", false, 0, "cudaHostAlloc(cudaHostAllocMapped) + cudaFreeHost", host(cudaHostAllocMapped)},
        {"host_alloc_wc", false, 0, "cudaHostAlloc(cudaHostAllocWriteCombined) + cudaFreeHost",
         host(cudaHostAllocWriteCombined)},
        // cuda-mem's ManagedBuffer has only zeroed constructors, so the raw side writes the bytes
        // on the host too: not the lazy pair.
        {"managed", false, 0,
         "cudaMallocManaged + memset on the host (every page touched) + cudaFree: cuda-mem's ManagedBuffer only has "
         "zeroed constructors, so both sides write the memory",
         alloc_batches::managed},
        {"async_default_sync", true, 0,
         "cudaMallocAsync + cudaFreeAsync " + pool + "0), cudaStreamSynchronize after each free", ordered(true)},
        {"async_retain_sync", true, UINT64_MAX,
         "cudaMallocAsync + cudaFreeAsync " + pool + "UINT64_MAX), cudaStreamSynchronize after each free",
         ordered(true)},
        {"async_retain_nosync", true, UINT64_MAX,
         "cudaMallocAsync + cudaFreeAsync " + pool + "UINT64_MAX), one cudaStreamSynchronize per sample (timed)",
         ordered(false)},
    };
    for (const Family& f : families) {
        uint64_t threshold = f.threshold;
        if (f.sets_threshold) CHECK(cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &threshold));
        for (const auto& size : {std::pair{"4k", 4 * size_t{1024}}, {"1m", MIB}, {"64m", 64 * MIB}}) {
            size_t bytes = size.second;
            measure(std::string(f.prefix) + "_" + size.first, 0, f.detail, [&](int k) { return f.batch(bytes, k); });
        }
    }

    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t created;
    CHECK(cudaMemPoolCreate(&created, &props));
    uint64_t retain = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &retain));
    for (size_t bytes : {size_t{16441}, size_t{67121209}}) {
        measure("pool_odd_" + std::to_string(bytes), 0,
                "cudaMallocFromPoolAsync + cudaFreeAsync (created pool, release threshold UINT64_MAX), one "
                "cudaStreamSynchronize per sample (timed)",
                [&](int k) { return alloc_batches::stream_ordered(bytes, created, stream, false, k); });
    }
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemPoolDestroy(created));
    CHECK(cudaStreamDestroy(stream));
}

// ---------------------------------------------------------------------------------------------
// Section "bandwidth": synchronous 256 MiB copies (bytes counted once).

void copies(const char* kind, void* host, void* device_buf, const std::string& what) {
    measure(std::string("h2d_") + kind, COPY_BYTES, "cudaMemcpy host to device, 256 MiB, from " + what, [&](int k) {
        return copy_batches::copies(device_buf, host, COPY_BYTES, cudaMemcpyHostToDevice, false, k);
    });
    measure(std::string("d2h_") + kind, COPY_BYTES, "cudaMemcpy device to host, 256 MiB, into " + what, [&](int k) {
        return copy_batches::copies(host, device_buf, COPY_BYTES, cudaMemcpyDeviceToHost, false, k);
    });
}

void bandwidth_section() {
    void* device_buf = nullptr;
    CHECK(cudaMalloc(&device_buf, COPY_BYTES));
    CHECK(cudaMemset(device_buf, 1, COPY_BYTES));
    CHECK(cudaDeviceSynchronize());
    {
        std::vector<char> host(COPY_BYTES, 1);  // every page touched, like the Rust side's filled Vec
        copies("pageable", host.data(), device_buf, "pageable memory (malloc, touched)");
    }
    void* pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, COPY_BYTES));
    std::memset(pinned, 1, COPY_BYTES);
    copies("pinned", pinned, device_buf, "pinned memory (cudaMallocHost)");
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaHostAlloc(&pinned, COPY_BYTES, cudaHostAllocWriteCombined));
    std::memset(pinned, 1, COPY_BYTES);
    copies("wc", pinned, device_buf, "write-combined pinned memory (cudaHostAllocWriteCombined)");
    CHECK(cudaFreeHost(pinned));
    {
        std::vector<char> host(COPY_BYTES, 1);
        CHECK(cudaHostRegister(host.data(), COPY_BYTES, cudaHostRegisterDefault));  // once, outside the timing
        copies("registered", host.data(), device_buf,
               "malloc memory registered once with cudaHostRegister (outside the timing)");
        CHECK(cudaHostUnregister(host.data()));
    }
    void* other = nullptr;
    CHECK(cudaMalloc(&other, COPY_BYTES));
    CHECK(cudaMemset(other, 2, COPY_BYTES));
    CHECK(cudaDeviceSynchronize());
    // cuda-mem's copy_from_device waits for the legacy stream (a device-to-device cudaMemcpy may
    // return before the copy ends); so does this batch.
    measure("d2d", COPY_BYTES,
            "cudaMemcpy device to device, 256 MiB (counted once) + cudaStreamSynchronize(0) after each copy",
            [&](int k) {
                return copy_batches::copies(other, device_buf, COPY_BYTES, cudaMemcpyDeviceToDevice, true, k);
            });
    CHECK(cudaFree(other));
    CHECK(cudaFree(device_buf));
}

// ---------------------------------------------------------------------------------------------
// Sections "kernel" and "managed": the streaming-read kernel of read_batches.cuh; per operation,
// (a prefetch to the device,) one launch and a cudaStreamSynchronize.

void reads_section(int device, bool kernel, bool managed) {
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    unsigned blocks = 0;
    CHECK(read_batches::resident_blocks(&blocks));
    uint32_t* sink = nullptr;
    CHECK(cudaMalloc(&sink, sizeof *sink));
    auto reads = [&](const void* data, size_t bytes, int prefetch_device, int k) {
        return read_batches::reads(data, bytes, sink, blocks, prefetch_device, stream, k);
    };
    // K reads of `bytes` at `data` per sample, each after a prefetch to `prefetch_device` if >= 0.
    auto row = [&](const char* key, const void* data, size_t bytes, const char* detail, int prefetch_device = -1,
                   const std::function<void()>& setup = [] {}) {
        measure(key, bytes, detail, [&](int k) { return reads(data, bytes, prefetch_device, k); }, setup);
    };
    void* data = nullptr;
    if (kernel) {
        CHECK(cudaMalloc(&data, GIB));
        CHECK(cudaMemset(data, 1, GIB));
        CHECK(cudaDeviceSynchronize());
        row("read_device_1g", data, GIB,
            "streaming-read kernel over 1 GiB of cudaMalloc memory, launch + cudaStreamSynchronize");
        CHECK(cudaFree(data));
        CHECK(cudaHostAlloc(&data, COPY_BYTES, cudaHostAllocMapped));
        std::memset(data, 1, COPY_BYTES);
        void* mapped = nullptr;
        CHECK(cudaHostGetDevicePointer(&mapped, data, 0));
        row("read_mapped_256m", mapped, COPY_BYTES,
            "streaming-read kernel over 256 MiB of mapped pinned host memory (zero-copy, cudaHostAllocMapped), "
            "launch + cudaStreamSynchronize");
        CHECK(cudaFreeHost(data));
    }
    if (managed) {
        struct Variant {
            const char* key;
            bool advise;
            bool prefetch;
            const char* detail;
        };
        const Variant variants[] = {
            {"managed_first_read_fault_1g", false, false,
             "1 GiB cudaMallocManaged, CPU memset (untimed), then timed: streaming read on the GPU (page faults) + "
             "sync"},
            {"managed_first_read_prefetch_1g", false, true,
             "1 GiB cudaMallocManaged, CPU memset (untimed), then timed: cudaMemPrefetchAsync to the device + "
             "streaming read + sync"},
            {"managed_first_read_advise_prefetch_1g", true, true,
             "1 GiB cudaMallocManaged, cudaMemAdviseSetPreferredLocation(device) once, CPU memset (untimed), then "
             "timed: cudaMemPrefetchAsync to the device + streaming read + sync"},
        };
        for (const Variant& v : variants) {
            CHECK(cudaMallocManaged(&data, GIB, cudaMemAttachGlobal));
            if (v.advise) {
#if CUDART_VERSION >= 13000
                CHECK(cudaMemAdvise(data, GIB, cudaMemAdviseSetPreferredLocation, {cudaMemLocationTypeDevice, device}));
#else
                CHECK(cudaMemAdvise(data, GIB, cudaMemAdviseSetPreferredLocation, device));
#endif
            }
            row(v.key, data, GIB, v.detail, v.prefetch ? device : -1, [&] { std::memset(data, 1, GIB); });
            CHECK(cudaFree(data));
        }
        CHECK(cudaMallocManaged(&data, GIB, cudaMemAttachGlobal));
        std::memset(data, 1, GIB);
        CHECK(reads(data, GIB, device, 1));  // prefetched and read once: resident from here on
        row("managed_resident_read_1g", data, GIB,
            "1 GiB managed, already resident on the device (prefetched and read once, untimed): streaming read + sync");
        CHECK(cudaFree(data));
    }
    CHECK(cudaFree(sink));
    CHECK(cudaStreamDestroy(stream));
}

void print_env(int device) {
    cudaDeviceProp props;
    CHECK(cudaGetDeviceProperties(&props, device));
    int driver = 0, runtime = 0, concurrent = 0, pageable = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device));
    CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device));
    std::printf(
        "{\"key\":\"env\",\"device\":\"%s\",\"driver\":\"%d.%d\",\"runtime\":\"%d.%d\",\"cc\":\"%d.%d\",\"sms\":%d,"
        "\"concurrent_managed_access\":%d,\"pageable_memory_access\":%d}\n",
        props.name, driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10, props.major, props.minor,
        props.multiProcessorCount, concurrent, pageable);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> sections(argv + 1, argv + argc);
    if (std::find(sections.begin(), sections.end(), "--help") != sections.end()) {
        std::printf("usage: raw_reference [SECTION...]\nRuns the raw CUDA C++ reference rows (all sections by default: "
                    "alloc bandwidth kernel managed)\nand prints one JSON object per line to stdout.\n");
        return 0;
    }
    auto wanted = [&](const char* section) {
        return sections.empty() || std::find(sections.begin(), sections.end(), section) != sections.end();
    };
    int count = 0;
    cudaError_t code = cudaGetDeviceCount(&count);
    if (code != cudaSuccess || count == 0) {
        std::fprintf(stderr, "raw_reference: no usable CUDA GPU (cudaGetDeviceCount: %s): run it on a GPU host\n",
                     code == cudaSuccess ? "0 devices" : cudaGetErrorName(code));
        return 1;
    }
    const int device = 0;
    CHECK(cudaSetDevice(device));
    CHECK(cudaFree(nullptr));  // create the context outside any timing
    print_env(device);
    if (wanted("alloc")) alloc_section(device);
    if (wanted("bandwidth")) bandwidth_section();
    if (wanted("kernel") || wanted("managed")) reads_section(device, wanted("kernel"), wanted("managed"));
    return 0;
}
