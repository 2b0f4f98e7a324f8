// raw_reference: the raw CUDA C++ yardstick for cuda-mem-bench.
//
// Plain CUDA runtime calls, no Rust, measured exactly the way benches/families.rs measures the
// same operations through cuda-mem, so that each row of the report is a ratio taken in one run on
// one machine.
//
// Output: one JSON object per line on stdout. The first line describes the machine:
//   {"key":"env","device":"NVIDIA H200","driver":"13.0","runtime":"13.0","cc":"9.0",...}
// then one line per row:
//   {"key":"malloc_4k","value":61.2,"unit":"us","detail":"...","k":200,"samples":30}
// ("k" and "samples" are extra fields: the report checks them against its own row catalogue).
//
// Measurement method (identical in benches/families.rs):
//   * one warm-up sample (untimed), then `samples` samples;
//   * a sample runs an optional untimed setup, then K operations (K fixed per row) timed with the
//     host steady clock (std::chrono::steady_clock, CLOCK_MONOTONIC; Rust's Instant is the same);
//   * the row's figure is the MEDIAN over samples of (sample time / K): microseconds per operation
//     for "us" rows; bytes / that time (GB/s, 1 GB = 1e9 bytes, bytes counted once) for "GB/s"
//     rows.
// The K and sample counts of each row are in PLANS below and must equal the catalogue in
// src/rows.rs (a unit test of the crate compares the two tables).
//
// Every CUDA return code is checked; a failure prints one line to stderr and exits with status 1.
// Claim rows ("unit":"ok") record the result of the call under test instead of exiting: value 1
// for cudaSuccess, 0 otherwise, and the error's name in "detail".

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
#include <string>
#include <thread>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------
// Errors and output

void fail(const char* what, cudaError_t code, int line) {
    std::fprintf(stderr, "raw_reference: %s failed (line %d): %s: %s\n", what, line, cudaGetErrorName(code),
                 cudaGetErrorString(code));
    std::exit(1);
}

#define CHECK(call)                                 \
    do {                                            \
        cudaError_t check_code_ = (call);           \
        if (check_code_ != cudaSuccess) {           \
            fail(#call, check_code_, __LINE__);     \
        }                                           \
    } while (0)

std::string json_escape(const std::string& text) {
    std::string out;
    for (char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += c;
        }
    }
    return out;
}

void emit(const std::string& key, double value, const char* unit, const std::string& detail, int k, int samples) {
    std::printf("{\"key\":\"%s\",\"value\":%.9g,\"unit\":\"%s\",\"detail\":\"%s\",\"k\":%d,\"samples\":%d}\n",
                json_escape(key).c_str(), value, unit, json_escape(detail).c_str(), k, samples);
    std::fflush(stdout);
}

void emit_claim(const std::string& key, cudaError_t result, const std::string& what) {
    std::printf("{\"key\":\"%s\",\"value\":%d,\"unit\":\"ok\",\"detail\":\"%s\",\"what\":\"%s\"}\n",
                json_escape(key).c_str(), result == cudaSuccess ? 1 : 0, cudaGetErrorName(result),
                json_escape(what).c_str());
    std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Row plans: K operations per sample and the number of samples. Must equal src/rows.rs.

struct Plan {
    const char* key;
    int k;
    int samples;
};

// BEGIN PLANS (parsed by a unit test of cuda-mem-bench; one row per line)
const Plan PLANS[] = {
    {"malloc_4k", 200, 30},
    {"malloc_1m", 200, 30},
    {"malloc_64m", 200, 30},
    {"malloc_host_4k", 50, 20},
    {"malloc_host_1m", 50, 20},
    {"malloc_host_64m", 20, 10},
    {"host_alloc_portable_4k", 50, 20},
    {"host_alloc_portable_1m", 50, 20},
    {"host_alloc_portable_64m", 20, 10},
    {"host_alloc_mapped_4k", 50, 20},
    {"host_alloc_mapped_1m", 50, 20},
    {"host_alloc_mapped_64m", 20, 10},
    {"host_alloc_wc_4k", 50, 20},
    {"host_alloc_wc_1m", 50, 20},
    {"host_alloc_wc_64m", 20, 10},
    {"managed_4k", 200, 30},
    {"managed_1m", 100, 20},
    {"managed_64m", 10, 10},
    {"async_default_sync_4k", 200, 30},
    {"async_default_sync_1m", 200, 30},
    {"async_default_sync_64m", 200, 30},
    {"async_retain_sync_4k", 200, 30},
    {"async_retain_sync_1m", 200, 30},
    {"async_retain_sync_64m", 200, 30},
    {"async_retain_nosync_4k", 200, 50},
    {"async_retain_nosync_1m", 200, 50},
    {"async_retain_nosync_64m", 200, 50},
    {"pool_odd_16441", 200, 50},
    {"pool_odd_67121209", 200, 50},
    {"h2d_pageable", 1, 20},
    {"d2h_pageable", 1, 20},
    {"h2d_pinned", 1, 30},
    {"d2h_pinned", 1, 30},
    {"h2d_wc", 1, 30},
    {"d2h_wc", 1, 30},
    {"h2d_registered", 1, 30},
    {"d2h_registered", 1, 30},
    {"d2d", 10, 30},
    {"read_device_1g", 10, 30},
    {"read_mapped_256m", 1, 20},
    {"managed_first_read_fault_1g", 1, 10},
    {"managed_first_read_prefetch_1g", 1, 10},
    {"managed_first_read_advise_prefetch_1g", 1, 10},
    {"managed_resident_read_1g", 10, 30},
};
// END PLANS

const Plan& plan(const char* key) {
    for (const Plan& p : PLANS) {
        if (std::strcmp(p.key, key) == 0) {
            return p;
        }
    }
    std::fprintf(stderr, "raw_reference: no plan for row %s\n", key);
    std::exit(1);
}

constexpr size_t KIB = 1024;
constexpr size_t MIB = 1024 * KIB;
constexpr size_t GIB = 1024 * MIB;
constexpr size_t COPY_BYTES = 256 * MIB;

// ---------------------------------------------------------------------------------------------
// The measurement loop

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

// Runs one warm-up sample and `p.samples` samples; each sample calls `setup()` untimed, then
// times `batch(p.k)` (which performs K operations and whatever end-of-sample work the row
// prescribes). Returns the median seconds per operation.
template <class Setup, class Batch>
double measure(const Plan& p, Setup setup, Batch batch) {
    std::vector<double> per_op;
    for (int s = 0; s <= p.samples; ++s) {
        setup();
        auto start = Clock::now();
        batch(p.k);
        auto end = Clock::now();
        if (s > 0) {  // sample 0 is the warm-up
            per_op.push_back(std::chrono::duration<double>(end - start).count() / p.k);
        }
    }
    return median(per_op);
}

void no_setup() {}

void emit_us(const Plan& p, double seconds, const std::string& detail) {
    emit(p.key, seconds * 1e6, "us", detail, p.k, p.samples);
}

void emit_gbs(const Plan& p, size_t bytes, double seconds, const std::string& detail) {
    emit(p.key, static_cast<double>(bytes) / seconds / 1e9, "GB/s", detail, p.k, p.samples);
}

const char* size_suffix(size_t bytes) {
    switch (bytes) {
        case 4 * KIB:
            return "4k";
        case MIB:
            return "1m";
        case 64 * MIB:
            return "64m";
        default:
            return "?";
    }
}

const size_t ALLOC_SIZES[] = {4 * KIB, MIB, 64 * MIB};

// ---------------------------------------------------------------------------------------------
// The streaming-read kernel and its batches: read_batches.cuh (shared with the `paired` benchmark).

struct Reader {
    unsigned resident_blocks = 0;
    uint32_t* sink = nullptr;

    Reader() {
        CHECK(read_batches::resident_blocks(&resident_blocks));
        CHECK(cudaMalloc(&sink, sizeof *sink));
    }
    ~Reader() { cudaFree(sink); }

    // Queues one read of `bytes` (a multiple of 16) at `data` on `stream`.
    void launch(const void* data, size_t bytes, cudaStream_t stream) const {
        CHECK(read_batches::launch(data, bytes, sink, resident_blocks, stream));
    }

    // K times: (prefetch to `prefetch_device` if >= 0) + read + sync.
    void reads(const void* data, size_t bytes, int prefetch_device, cudaStream_t stream, int k) const {
        CHECK(read_batches::reads(data, bytes, sink, resident_blocks, prefetch_device, stream, k));
    }
};

cudaMemLocation device_location(int device) {
    cudaMemLocation loc{};
    loc.type = cudaMemLocationTypeDevice;
    loc.id = device;
    return loc;
}

void prefetch_to_device(const void* ptr, size_t bytes, int device, cudaStream_t stream) {
    CHECK(read_batches::prefetch(ptr, bytes, device, stream));
}

void advise_preferred_device(const void* ptr, size_t bytes, int device) {
#if CUDART_VERSION >= 13000
    CHECK(cudaMemAdvise(ptr, bytes, cudaMemAdviseSetPreferredLocation, device_location(device)));
#else
    CHECK(cudaMemAdvise(ptr, bytes, cudaMemAdviseSetPreferredLocation, device));
#endif
}

// ---------------------------------------------------------------------------------------------
// Section "alloc": one allocation + free pair per operation, microseconds.

void alloc_section(int device) {
    for (size_t bytes : ALLOC_SIZES) {
        const Plan& p = plan((std::string("malloc_") + size_suffix(bytes)).c_str());
        double t = measure(p, no_setup, [&](int k) {
            CHECK(alloc_batches::device(bytes, k));
        });
        emit_us(p, t, "cudaMalloc + cudaFree");
    }

    for (size_t bytes : ALLOC_SIZES) {
        const Plan& p = plan((std::string("malloc_host_") + size_suffix(bytes)).c_str());
        double t = measure(p, no_setup, [&](int k) {
            CHECK(alloc_batches::malloc_host(bytes, k));
        });
        emit_us(p, t, "cudaMallocHost + cudaFreeHost");
    }

    struct Flavour {
        const char* prefix;
        unsigned flags;
        const char* detail;
    };
    const Flavour flavours[] = {
        {"host_alloc_portable_", cudaHostAllocPortable, "cudaHostAlloc(cudaHostAllocPortable) + cudaFreeHost"},
        {"host_alloc_mapped_", cudaHostAllocMapped, "cudaHostAlloc(cudaHostAllocMapped) + cudaFreeHost"},
        {"host_alloc_wc_", cudaHostAllocWriteCombined, "cudaHostAlloc(cudaHostAllocWriteCombined) + cudaFreeHost"},
    };
    for (const Flavour& f : flavours) {
        for (size_t bytes : ALLOC_SIZES) {
            const Plan& p = plan((std::string(f.prefix) + size_suffix(bytes)).c_str());
            double t = measure(p, no_setup, [&](int k) {
                CHECK(alloc_batches::host_alloc(bytes, f.flags, k));
            });
            emit_us(p, t, f.detail);
        }
    }

    // cuda-mem's ManagedBuffer has only zeroed constructors (the CPU writes every byte), so the
    // raw side writes the bytes on the host too: this row is NOT the lazy 15-21 us pair.
    for (size_t bytes : ALLOC_SIZES) {
        const Plan& p = plan((std::string("managed_") + size_suffix(bytes)).c_str());
        double t = measure(p, no_setup, [&](int k) {
            CHECK(alloc_batches::managed(bytes, k));
        });
        emit_us(p, t,
                "cudaMallocManaged + memset on the host (every page touched) + cudaFree: cuda-mem's ManagedBuffer "
                "only has zeroed constructors, so both sides write the memory");
    }

    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaMemPool_t default_pool;
    CHECK(cudaDeviceGetDefaultMemPool(&default_pool, device));

    struct AsyncVariant {
        const char* prefix;
        uint64_t threshold;
        bool sync_each;
        const char* detail;
    };
    const AsyncVariant variants[] = {
        {"async_default_sync_", 0, true,
         "cudaMallocAsync + cudaFreeAsync (device default pool, release threshold 0), cudaStreamSynchronize after "
         "each free"},
        {"async_retain_sync_", UINT64_MAX, true,
         "cudaMallocAsync + cudaFreeAsync (device default pool, release threshold UINT64_MAX), cudaStreamSynchronize "
         "after each free"},
        {"async_retain_nosync_", UINT64_MAX, false,
         "cudaMallocAsync + cudaFreeAsync (device default pool, release threshold UINT64_MAX), one "
         "cudaStreamSynchronize per sample (timed)"},
    };
    for (const AsyncVariant& v : variants) {
        uint64_t threshold = v.threshold;
        CHECK(cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &threshold));
        for (size_t bytes : ALLOC_SIZES) {
            const Plan& p = plan((std::string(v.prefix) + size_suffix(bytes)).c_str());
            double t = measure(p, no_setup, [&](int k) {
                CHECK(alloc_batches::stream_ordered(bytes, nullptr, stream, v.sync_each, k));
            });
            emit_us(p, t, v.detail);
        }
    }
    uint64_t retain = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &retain));

    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location = device_location(device);
    cudaMemPool_t pool;
    CHECK(cudaMemPoolCreate(&pool, &props));
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &retain));
    for (size_t bytes : {size_t{16441}, size_t{67121209}}) {
        const Plan& p = plan(("pool_odd_" + std::to_string(bytes)).c_str());
        double t = measure(p, no_setup, [&](int k) {
            CHECK(alloc_batches::stream_ordered(bytes, pool, stream, false, k));
        });
        emit_us(p, t,
                "cudaMallocFromPoolAsync + cudaFreeAsync (created pool, release threshold UINT64_MAX), one "
                "cudaStreamSynchronize per sample (timed)");
    }
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemPoolDestroy(pool));
    CHECK(cudaStreamDestroy(stream));
}

// ---------------------------------------------------------------------------------------------
// Section "bandwidth": synchronous 256 MiB copies, GB/s (bytes counted once).

void copy_pair(const char* h2d_key, const char* d2h_key, void* host, void* device_buf, const std::string& what) {
    const Plan& up = plan(h2d_key);
    double t_up = measure(up, no_setup, [&](int k) {
        CHECK(copy_batches::copies(device_buf, host, COPY_BYTES, cudaMemcpyHostToDevice, false, k));
    });
    emit_gbs(up, COPY_BYTES, t_up, "cudaMemcpy host to device, 256 MiB, from " + what);
    const Plan& down = plan(d2h_key);
    double t_down = measure(down, no_setup, [&](int k) {
        CHECK(copy_batches::copies(host, device_buf, COPY_BYTES, cudaMemcpyDeviceToHost, false, k));
    });
    emit_gbs(down, COPY_BYTES, t_down, "cudaMemcpy device to host, 256 MiB, into " + what);
}

void bandwidth_section() {
    void* device_buf = nullptr;
    CHECK(cudaMalloc(&device_buf, COPY_BYTES));
    CHECK(cudaMemset(device_buf, 1, COPY_BYTES));
    CHECK(cudaDeviceSynchronize());

    {
        void* host = std::malloc(COPY_BYTES);
        if (host == nullptr) {
            std::fprintf(stderr, "raw_reference: malloc of %zu bytes failed\n", COPY_BYTES);
            std::exit(1);
        }
        std::memset(host, 1, COPY_BYTES);  // touched, like the Rust side's filled Vec
        copy_pair("h2d_pageable", "d2h_pageable", host, device_buf, "pageable memory (malloc, touched)");
        std::free(host);
    }
    {
        void* host = nullptr;
        CHECK(cudaMallocHost(&host, COPY_BYTES));
        std::memset(host, 1, COPY_BYTES);
        copy_pair("h2d_pinned", "d2h_pinned", host, device_buf, "pinned memory (cudaMallocHost)");
        CHECK(cudaFreeHost(host));
    }
    {
        void* host = nullptr;
        CHECK(cudaHostAlloc(&host, COPY_BYTES, cudaHostAllocWriteCombined));
        std::memset(host, 1, COPY_BYTES);
        copy_pair("h2d_wc", "d2h_wc", host, device_buf, "write-combined pinned memory (cudaHostAllocWriteCombined)");
        CHECK(cudaFreeHost(host));
    }
    {
        void* host = std::malloc(COPY_BYTES);
        if (host == nullptr) {
            std::fprintf(stderr, "raw_reference: malloc of %zu bytes failed\n", COPY_BYTES);
            std::exit(1);
        }
        std::memset(host, 1, COPY_BYTES);
        CHECK(cudaHostRegister(host, COPY_BYTES, cudaHostRegisterDefault));  // once, outside the timing
        copy_pair("h2d_registered", "d2h_registered", host, device_buf,
                  "malloc memory registered once with cudaHostRegister (outside the timing)");
        CHECK(cudaHostUnregister(host));
        std::free(host);
    }
    {
        void* other = nullptr;
        CHECK(cudaMalloc(&other, COPY_BYTES));
        CHECK(cudaMemset(other, 2, COPY_BYTES));
        CHECK(cudaDeviceSynchronize());
        const Plan& p = plan("d2d");
        double t = measure(p, no_setup, [&](int k) {
            // cuda-mem's copy_from_device waits for the legacy stream (a device-to-device
            // cudaMemcpy may return before the copy ends); so does this batch.
            CHECK(copy_batches::copies(other, device_buf, COPY_BYTES, cudaMemcpyDeviceToDevice, true, k));
        });
        emit_gbs(p, COPY_BYTES, t,
                 "cudaMemcpy device to device, 256 MiB (counted once) + cudaStreamSynchronize(0) after each copy");
        CHECK(cudaFree(other));
    }
    CHECK(cudaFree(device_buf));
}

// ---------------------------------------------------------------------------------------------
// Sections "kernel" and "managed": the streaming-read kernel, one launch + cudaStreamSynchronize
// per operation, GB/s.

void kernel_section(const Reader& reader) {
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto read_batch = [&](const void* data, size_t bytes) {
        return [&reader, data, bytes, stream](int k) { reader.reads(data, bytes, -1, stream, k); };
    };
    {
        void* data = nullptr;
        CHECK(cudaMalloc(&data, GIB));
        CHECK(cudaMemset(data, 1, GIB));
        CHECK(cudaDeviceSynchronize());
        const Plan& p = plan("read_device_1g");
        double t = measure(p, no_setup, read_batch(data, GIB));
        emit_gbs(p, GIB, t, "streaming-read kernel over 1 GiB of cudaMalloc memory, launch + cudaStreamSynchronize");
        CHECK(cudaFree(data));
    }
    {
        void* host = nullptr;
        CHECK(cudaHostAlloc(&host, COPY_BYTES, cudaHostAllocMapped));
        std::memset(host, 1, COPY_BYTES);
        void* mapped = nullptr;
        CHECK(cudaHostGetDevicePointer(&mapped, host, 0));
        const Plan& p = plan("read_mapped_256m");
        double t = measure(p, no_setup, read_batch(mapped, COPY_BYTES));
        emit_gbs(p, COPY_BYTES, t,
                 "streaming-read kernel over 256 MiB of mapped pinned host memory (zero-copy, "
                 "cudaHostAllocMapped), launch + cudaStreamSynchronize");
        CHECK(cudaFreeHost(host));
    }
    CHECK(cudaStreamDestroy(stream));
}

void managed_section(const Reader& reader, int device) {
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    struct Variant {
        const char* key;
        bool advise;
        bool prefetch;
        const char* detail;
    };
    const Variant variants[] = {
        {"managed_first_read_fault_1g", false, false,
         "1 GiB cudaMallocManaged, CPU memset (untimed), then timed: streaming read on the GPU (page faults) + sync"},
        {"managed_first_read_prefetch_1g", false, true,
         "1 GiB cudaMallocManaged, CPU memset (untimed), then timed: cudaMemPrefetchAsync to the device + streaming "
         "read + sync"},
        {"managed_first_read_advise_prefetch_1g", true, true,
         "1 GiB cudaMallocManaged, cudaMemAdviseSetPreferredLocation(device) once, CPU memset (untimed), then timed: "
         "cudaMemPrefetchAsync to the device + streaming read + sync"},
    };
    for (const Variant& v : variants) {
        void* data = nullptr;
        CHECK(cudaMallocManaged(&data, GIB, cudaMemAttachGlobal));
        if (v.advise) {
            advise_preferred_device(data, GIB, device);
        }
        const Plan& p = plan(v.key);
        double t = measure(
            p, [&] { std::memset(data, 1, GIB); },
            [&](int k) { reader.reads(data, GIB, v.prefetch ? device : -1, stream, k); });
        emit_gbs(p, GIB, t, v.detail);
        CHECK(cudaFree(data));
    }
    {
        void* data = nullptr;
        CHECK(cudaMallocManaged(&data, GIB, cudaMemAttachGlobal));
        std::memset(data, 1, GIB);
        prefetch_to_device(data, GIB, device, stream);
        reader.launch(data, GIB, stream);
        CHECK(cudaStreamSynchronize(stream));
        const Plan& p = plan("managed_resident_read_1g");
        double t = measure(p, no_setup, [&](int k) { reader.reads(data, GIB, -1, stream, k); });
        emit_gbs(p, GIB, t,
                 "1 GiB managed, already resident on the device (prefetched and read once, untimed): streaming read + "
                 "sync");
        CHECK(cudaFree(data));
    }
    CHECK(cudaStreamDestroy(stream));
}

// ---------------------------------------------------------------------------------------------
// Claims of the source document, checked with the call under test.

void claims_section(int device) {
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));

    {
        // "Pools must be 32 MB aligned in size": odd sizes from a created pool.
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location = device_location(device);
        cudaMemPool_t pool;
        CHECK(cudaMemPoolCreate(&pool, &props));
        void* small = nullptr;
        void* large = nullptr;
        cudaError_t result = cudaMallocFromPoolAsync(&small, 16441, pool, a);
        if (result == cudaSuccess) {
            result = cudaMallocFromPoolAsync(&large, 67121209, pool, a);
        }
        if (small != nullptr) {
            CHECK(cudaFreeAsync(small, a));
        }
        if (large != nullptr) {
            CHECK(cudaFreeAsync(large, a));
        }
        CHECK(cudaStreamSynchronize(a));
        (void)cudaGetLastError();
        CHECK(cudaMemPoolDestroy(pool));
        emit_claim("claim_pool_odd_sizes", result,
                   "cudaMallocFromPoolAsync of 16441 and 67121209 bytes from a created pool");
    }
    {
        // "Freeing on another stream causes a segfault": ordered cross-stream free.
        void* ptr = nullptr;
        CHECK(cudaMallocAsync(&ptr, MIB, a));
        CHECK(cudaMemsetAsync(ptr, 0, MIB, a));
        cudaEvent_t ready;
        CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        CHECK(cudaEventRecord(ready, a));
        CHECK(cudaStreamWaitEvent(b, ready, 0));
        cudaError_t result = cudaFreeAsync(ptr, b);
        if (result == cudaSuccess) {
            result = cudaStreamSynchronize(b);
        }
        CHECK(cudaStreamSynchronize(a));
        CHECK(cudaEventDestroy(ready));
        emit_claim("claim_cross_stream_free", result,
                   "cudaMallocAsync on stream A, cudaEventRecord on A, cudaStreamWaitEvent(B), cudaFreeAsync on B");
    }
    {
        // "Pinned memory is only accessible by the thread that allocated it".
        void* pinned = nullptr;
        cudaError_t alloc_result = cudaSuccess;
        std::thread allocator([&] {
            alloc_result = cudaSetDevice(device);
            if (alloc_result == cudaSuccess) {
                alloc_result = cudaMallocHost(&pinned, MIB);
            }
            if (alloc_result == cudaSuccess) {
                std::memset(pinned, 7, MIB);
            }
        });
        allocator.join();
        cudaError_t result = alloc_result;
        if (result == cudaSuccess) {
            std::thread user([&] {
                void* dev = nullptr;
                result = cudaSetDevice(device);
                if (result == cudaSuccess) {
                    result = cudaMalloc(&dev, MIB);
                }
                if (result == cudaSuccess) {
                    result = cudaMemcpy(dev, pinned, MIB, cudaMemcpyHostToDevice);
                }
                if (dev != nullptr) {
                    cudaFree(dev);
                }
            });
            user.join();
            CHECK(cudaFreeHost(pinned));
        }
        emit_claim("claim_pinned_other_thread", result,
                   "cudaMallocHost in one std::thread, cudaMemcpy from it in another thread");
    }
    CHECK(cudaStreamDestroy(a));
    CHECK(cudaStreamDestroy(b));
}

// ---------------------------------------------------------------------------------------------

std::string version_string(int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
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
        "{\"key\":\"env\",\"device\":\"%s\",\"driver\":\"%s\",\"runtime\":\"%s\",\"cc\":\"%d.%d\",\"sms\":%d,"
        "\"concurrent_managed_access\":%d,\"pageable_memory_access\":%d}\n",
        json_escape(props.name).c_str(), version_string(driver).c_str(), version_string(runtime).c_str(), props.major,
        props.minor, props.multiProcessorCount, concurrent, pageable);
    std::fflush(stdout);
}

bool wanted(int argc, char** argv, const char* section) {
    if (argc < 2) {
        return true;
    }
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], section) == 0) {
            return true;
        }
    }
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
            std::printf(
                "usage: raw_reference [SECTION...]\n"
                "Runs the raw CUDA C++ reference rows (all sections by default: alloc bandwidth kernel managed "
                "claims)\nand prints one JSON object per line to stdout.\n");
            return 0;
        }
    }
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

    if (wanted(argc, argv, "alloc")) {
        alloc_section(device);
    }
    if (wanted(argc, argv, "bandwidth")) {
        bandwidth_section();
    }
    if (wanted(argc, argv, "kernel") || wanted(argc, argv, "managed")) {
        Reader reader;
        if (wanted(argc, argv, "kernel")) {
            kernel_section(reader);
        }
        if (wanted(argc, argv, "managed")) {
            managed_section(reader, device);
        }
    }
    if (wanted(argc, argv, "claims")) {
        claims_section(device);
    }
    return 0;
}
