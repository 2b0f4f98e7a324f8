// replay.h: the shared core of the peers' workload replayers (torch_replay.py's C++ extension,
// rmm_replay.cu). C++17, header only.
//
// - cmwl::read_file / cmwl::parse: the workload file of the Rust crate cuda-mem-workloads
//   (src/format.rs), with bounds checks: a malformed or truncated file is a std::runtime_error,
//   never a crash or a huge allocation.
// - cmwl::shape: counts and the round-robin peak of live bytes (lanes run one op each in turn),
//   the same figure as the crate's Workload::shape().peak_live_round_robin.
// - cmwl::replay<A>: one thread per lane, each with its own stream, two passes (warm-up, measured)
//   over the whole workload with the same allocator instance; see "Method" below.
// - cmwl::CudaLanes (unless CMWL_NO_CUDA is defined): the lanes' non-blocking streams on device 0
//   and the hand-off of a block to another lane's stream, for allocators that run on CUDA.
//
// File format (little-endian):
//   header  "CMWL", u32 version (1), u32 lanes, u32 name length, name (UTF-8)
//   lane    u64 op count, then the ops
//   op      16 bytes: u8 kind, u8 0, u16 lane, u32 id, u64 bytes
//           kind 0 alloc (id, bytes), 1 free (id), 2 free after lane `lane`'s stream used the
//           block too, 3 empty cache
// Ids are the lane's own: allocated, freed once, then maybe allocated again.
//
// Method (the Rust replayer of cuda-mem follows the same; keep them in step):
// - peak_live_bytes: the most bytes live when the lanes run one op each in turn (op 0 of lane 0,
//   op 0 of lane 1, ..., op 1 of lane 0, ...; shorter lanes drop out). A property of the file.
// - Two passes over the whole workload with the same allocator instance: pass 1 warms up, pass 2
//   is measured. Before each pass every lane thread (and the main thread) waits on a barrier;
//   each thread then runs its lane's ops as fast as it can, timing itself from leaving the
//   barrier to its last op. After each pass all streams are synchronized, outside the timing.
// - ns_per_op = (sum over threads of the thread's time in pass 2) / (ops of pass 2); also
//   ns_per_op_pass1 the same way.
// - peak_reserved_bytes, misses: from the allocator's counters (Counters), read after each pass.
//
// The allocator type A (a template parameter, so the timed loop has no virtual calls):
//   using Block = ...;                 // what an allocation is held as (void*, c10::DataPtr, ...),
//                                      // default-constructible and movable
//   static bool live(const Block&);    // an allocation is held (not freed, not empty)
//   void open(std::size_t lanes);      // streams and per-lane state (CudaLanes does it)
//   void thread_begin(std::size_t lane);   // on the lane's own thread, before its first pass
//   void sync(std::size_t lane);       // wait for the lane's stream (outside timing)
//   void close();                      // after the last pass: streams destroyed
//   Block alloc(std::size_t lane, std::uint64_t bytes);            // on the lane's stream
//   void free(std::size_t lane, Block&, std::uint64_t bytes);      // on the lane's stream; leaves
//                                                                  // the Block empty
//   void free_on(std::size_t lane, Block&, std::uint64_t bytes, std::size_t other);
//       // the block was used by lane `other`'s stream too: it must not be reused before that
//       // stream's work; leaves the Block empty
//   void empty_cache(std::size_t lane);
//   Counters counters();               // called from the main thread between passes
// The lane index stands for the brief's stream arguments: the allocator knows each lane's stream,
// and torch needs the DataPtr (not a void*) to record another stream's use of a block.

#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#ifndef CMWL_NO_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cmwl {

enum Kind : std::uint8_t { ALLOC = 0, FREE = 1, FREE_ON = 2, EMPTY_CACHE = 3 };

// One op in memory. `slot` is the lane's id renumbered densely (0.. distinct ids of the lane), so
// a lane's table of blocks has one entry per distinct id whatever the ids are. For frees,
// `bytes` is filled in with the size the id was allocated with (deallocation needs it).
struct Op {
  std::uint8_t kind;
  std::uint16_t other;  // FREE_ON: the lane whose stream used the block
  std::uint32_t slot;
  std::uint64_t bytes;
};

struct Lane {
  std::vector<Op> ops;
  std::uint32_t slots = 0;  // distinct ids
};

struct Workload {
  std::string name;
  std::vector<Lane> lanes;
  std::uint64_t ops() const
  {
    std::uint64_t n = 0;
    for (auto const& l : lanes) n += l.ops.size();
    return n;
  }
};

// ---- reading -----------------------------------------------------------------------------

namespace detail {
struct Reader {
  const unsigned char* p;
  std::size_t left;
  void need(std::size_t n, const char* what) const
  {
    if (left < n) throw std::runtime_error(std::string("workload file truncated (") + what + ")");
  }
  std::uint64_t le(std::size_t n, const char* what)
  {
    need(n, what);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(p[i]) << (8 * i);
    p += n;
    left -= n;
    return v;
  }
};
}  // namespace detail

// Parses a whole file held in memory; checks every bound and every lane's use of its ids: an id
// allocated while live, or freed while not live, is an error (it would make a replay free a
// wrong pointer). Ids still live at the end of a lane are allowed: replay frees them after each
// pass, outside the timing (the corpus frees everything; the crate's shape() insists).
inline Workload parse(const unsigned char* data, std::size_t len)
{
  detail::Reader r{data, len};
  r.need(4, "magic");
  if (std::memcmp(r.p, "CMWL", 4) != 0) throw std::runtime_error("not a workload file (no CMWL magic)");
  r.p += 4;
  r.left -= 4;
  std::uint64_t version = r.le(4, "version");
  if (version != 1)
    throw std::runtime_error("workload file version " + std::to_string(version) + ", this reader knows 1");
  std::uint64_t lanes    = r.le(4, "lanes");
  std::uint64_t name_len = r.le(4, "name length");
  if (name_len > 4096 || lanes > 65536) throw std::runtime_error("implausible header");
  r.need(name_len, "name");
  Workload w;
  w.name.assign(reinterpret_cast<const char*>(r.p), name_len);
  r.p += name_len;
  r.left -= name_len;
  w.lanes.resize(lanes);
  for (std::uint64_t l = 0; l < lanes; ++l) {
    std::uint64_t count = r.le(8, "op count");
    if (count > r.left / 16) throw std::runtime_error("workload file truncated (lane " + std::to_string(l) + "'s ops)");
    Lane& lane = w.lanes[l];
    lane.ops.reserve(count);
    std::unordered_map<std::uint32_t, std::uint32_t> slot_of;  // id -> slot
    std::vector<std::uint64_t> live;                           // slot -> bytes (0: not live)
    for (std::uint64_t i = 0; i < count; ++i) {
      const unsigned char* q = r.p;
      std::uint8_t kind  = q[0];
      std::uint16_t other = std::uint16_t(q[2] | (q[3] << 8));
      std::uint32_t id    = std::uint32_t(q[4]) | std::uint32_t(q[5]) << 8 | std::uint32_t(q[6]) << 16 |
                         std::uint32_t(q[7]) << 24;
      std::uint64_t bytes = 0;
      for (int b = 0; b < 8; ++b) bytes |= std::uint64_t(q[8 + b]) << (8 * b);
      r.p += 16;
      r.left -= 16;
      auto where = [&] { return "lane " + std::to_string(l) + " op " + std::to_string(i) + ": "; };
      Op op{kind, 0, 0, 0};
      if (kind == ALLOC) {
        if (bytes == 0) throw std::runtime_error(where() + "allocates 0 bytes");
        auto it = slot_of.find(id);
        std::uint32_t slot;
        if (it == slot_of.end()) {
          slot = std::uint32_t(live.size());
          slot_of.emplace(id, slot);
          live.push_back(0);
        } else {
          slot = it->second;
        }
        if (live[slot] != 0) throw std::runtime_error(where() + "allocates id " + std::to_string(id) + ", already live");
        live[slot] = bytes;
        op.slot    = slot;
        op.bytes   = bytes;
      } else if (kind == FREE || kind == FREE_ON) {
        if (kind == FREE_ON && other >= lanes)
          throw std::runtime_error(where() + "hands a block to lane " + std::to_string(other) + " of " +
                                   std::to_string(lanes));
        auto it = slot_of.find(id);
        if (it == slot_of.end() || live[it->second] == 0)
          throw std::runtime_error(where() + "frees id " + std::to_string(id) + ", not live");
        op.slot          = it->second;
        op.bytes         = live[it->second];
        op.other         = kind == FREE_ON ? other : 0;
        live[it->second] = 0;
      } else if (kind == EMPTY_CACHE) {
      } else {
        throw std::runtime_error(where() + "bad op kind " + std::to_string(kind));
      }
      lane.ops.push_back(op);
    }
    lane.slots = std::uint32_t(live.size());
  }
  return w;
}

inline Workload read_file(const std::string& path)
{
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("cannot read " + path);
  return parse(bytes.data(), bytes.size());
}

// ---- shape -------------------------------------------------------------------------------

struct Shape {
  std::uint64_t ops = 0, allocations = 0, frees = 0, handoffs = 0, empty_caches = 0;
  std::uint64_t peak_live_round_robin = 0, largest = 0;
};

// Counts, and the peak of live bytes in round-robin order. parse() has checked the ids, so the
// sum never underflows.
inline Shape shape(const Workload& w)
{
  Shape s;
  std::size_t longest = 0;
  for (auto const& l : w.lanes) longest = std::max(longest, l.ops.size());
  std::uint64_t live = 0;
  for (std::size_t i = 0; i < longest; ++i) {
    for (auto const& l : w.lanes) {
      if (i >= l.ops.size()) continue;
      Op const& op = l.ops[i];
      ++s.ops;
      switch (op.kind) {
        case ALLOC:
          ++s.allocations;
          s.largest = std::max(s.largest, op.bytes);
          live += op.bytes;
          s.peak_live_round_robin = std::max(s.peak_live_round_robin, live);
          break;
        case FREE_ON: ++s.handoffs; [[fallthrough]];
        case FREE:
          ++s.frees;
          live -= op.bytes;
          break;
        default: ++s.empty_caches;
      }
    }
  }
  return s;
}

// ---- replay ------------------------------------------------------------------------------

// What an allocator reports, read between passes. -1: not known.
struct Counters {
  std::int64_t reserved_peak  = -1;  // peak bytes reserved from the driver since it was made/reset
  std::int64_t device_allocs  = -1;  // times it went to the driver for memory (cumulative)
};

struct Result {
  double ns_per_op       = 0;  // pass 2
  double ns_per_op_pass1 = 0;
  std::uint64_t ops_pass2          = 0;
  std::uint64_t allocations_pass2  = 0;
  std::int64_t peak_reserved_bytes = -1;
  std::int64_t misses_pass2        = -1;  // -1: not known (JSON null)
  std::string error;                      // empty: no error
};

// A reusable spinning barrier (C++17 has no std::barrier). Spinning, so that threads leave it
// within microseconds of each other.
class SpinBarrier {
 public:
  explicit SpinBarrier(std::size_t n) : n_(n) {}
  void wait()
  {
    std::size_t gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
    } else {
      while (gen_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
    }
  }

 private:
  const std::size_t n_;
  std::atomic<std::size_t> count_{0};
  std::atomic<std::size_t> gen_{0};
};

// Replays `w` twice through `a` (see Method above). Errors (exceptions from the allocator) end
// that lane's pass, skip pass 2, and come back in Result::error; blocks still held are freed.
template <class A>
Result replay(const Workload& w, A& a)
{
  using clk = std::chrono::steady_clock;
  using Block = typename A::Block;
  const std::size_t n = w.lanes.size();
  Result res;
  if (n == 0) return res;
  try {
    a.open(n);
  } catch (std::exception const& e) {
    res.error = std::string("open: ") + e.what();
    try {
      a.close();
    } catch (std::exception const&) {
    }
    return res;
  }
  SpinBarrier barrier(n + 1);
  std::atomic<bool> failed{false};
  std::vector<std::string> errors(n);
  std::vector<double> ns[2] = {std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  std::vector<std::uint64_t> done[2] = {std::vector<std::uint64_t>(n, 0), std::vector<std::uint64_t>(n, 0)};
  std::vector<std::uint64_t> allocs[2] = {std::vector<std::uint64_t>(n, 0), std::vector<std::uint64_t>(n, 0)};

  auto lane_thread = [&](std::size_t l) {
    const std::vector<Op>& ops = w.lanes[l].ops;
    std::vector<Block> blocks(w.lanes[l].slots);
    auto fail = [&](const char* what) {
      if (errors[l].empty()) errors[l] = std::string("lane ") + std::to_string(l) + ": " + what;
      failed.store(true);
    };
    bool ok = true;
    try {
      a.thread_begin(l);
    } catch (std::exception const& e) {
      fail(e.what());
      ok = false;
    }
    for (int pass = 0; pass < 2; ++pass) {
      barrier.wait();  // start
      if (ok && !failed.load()) {
        std::size_t i = 0;
        std::uint64_t k = 0;
        auto t0 = clk::now();
        try {
          for (; i < ops.size(); ++i) {
            Op const& op = ops[i];
            switch (op.kind) {
              case ALLOC:
                blocks[op.slot] = a.alloc(l, op.bytes);
                ++k;
                break;
              case FREE: a.free(l, blocks[op.slot], op.bytes); break;
              case FREE_ON: a.free_on(l, blocks[op.slot], op.bytes, op.other); break;
              default: a.empty_cache(l);
            }
          }
        } catch (std::exception const& e) {
          fail(e.what());
          ok = false;
        }
        auto t1 = clk::now();
        ns[pass][l]     = double(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
        done[pass][l]   = i;
        allocs[pass][l] = k;
      }
      // Outside the timing: free what is still held (ids live at the lane's end, or after an
      // error), with the size each was allocated with (found again from the ops run, so the
      // timed loop stores nothing but the block).
      bool held = false;
      for (auto const& b : blocks) held = held || A::live(b);
      if (held) {
        std::vector<std::uint64_t> size(blocks.size(), 0);
        for (std::size_t j = 0; j < ops.size() && j <= done[pass][l]; ++j)
          if (ops[j].kind == ALLOC) size[ops[j].slot] = ops[j].bytes;
        for (std::size_t s = 0; s < blocks.size(); ++s) {
          if (!A::live(blocks[s])) continue;
          try {
            a.free(l, blocks[s], size[s]);
          } catch (std::exception const& e) {
            fail(e.what());
            ok = false;
            blocks[s] = Block{};  // give up on it
          }
        }
      }
      barrier.wait();  // end
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(n);
  for (std::size_t l = 0; l < n; ++l) threads.emplace_back(lane_thread, l);
  Counters after[2];
  auto sync_all = [&] {
    for (std::size_t l = 0; l < n; ++l) {
      try {
        a.sync(l);
      } catch (std::exception const& e) {
        if (errors[l].empty()) errors[l] = std::string("sync: ") + e.what();
        failed.store(true);
      }
    }
  };
  for (int pass = 0; pass < 2; ++pass) {
    barrier.wait();  // start
    barrier.wait();  // end
    sync_all();
    try {
      after[pass] = a.counters();
    } catch (std::exception const& e) {
      if (res.error.empty()) res.error = std::string("counters: ") + e.what();
      failed.store(true);
    }
  }
  for (auto& t : threads) t.join();
  try {
    a.close();
  } catch (std::exception const& e) {
    if (res.error.empty()) res.error = std::string("close: ") + e.what();
  }
  for (auto const& e : errors)
    if (!e.empty() && res.error.empty()) res.error = e;
  if (!res.error.empty()) return res;

  double sum[2] = {0, 0};
  std::uint64_t count[2] = {0, 0};
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t l = 0; l < n; ++l) {
      sum[pass] += ns[pass][l];
      count[pass] += done[pass][l];
    }
  for (std::size_t l = 0; l < n; ++l) res.allocations_pass2 += allocs[1][l];
  res.ops_pass2       = count[1];
  res.ns_per_op       = count[1] ? sum[1] / double(count[1]) : 0;
  res.ns_per_op_pass1 = count[0] ? sum[0] / double(count[0]) : 0;
  res.peak_reserved_bytes = after[1].reserved_peak;
  if (after[0].device_allocs >= 0 && after[1].device_allocs >= 0)
    res.misses_pass2 = after[1].device_allocs - after[0].device_allocs;
  return res;
}

// ---- output ------------------------------------------------------------------------------

inline std::string json_str(const std::string& v)
{
  std::string o = "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += char(c);
    }
  }
  return o + "\"";
}

// One JSON line (no newline) for a (workload, allocator) replay.
inline std::string json_row(const Workload& w, const Shape& s, const std::string& allocator, const Result& r,
                            const std::string& version, const std::string& empty_cache, const std::string& config)
{
  if (!r.error.empty())
    return "{\"workload\":" + json_str(w.name) + ",\"allocator\":" + json_str(allocator) +
           ",\"error\":" + json_str(r.error) + ",\"version\":" + json_str(version) +
           ",\"config\":" + json_str(config) + "}";
  char ratio[64] = "null", misses[32] = "null";
  if (r.peak_reserved_bytes >= 0 && s.peak_live_round_robin > 0)
    std::snprintf(ratio, sizeof ratio, "%.4f", double(r.peak_reserved_bytes) / double(s.peak_live_round_robin));
  if (r.misses_pass2 >= 0) std::snprintf(misses, sizeof misses, "%lld", (long long)r.misses_pass2);
  char reserved[32] = "null";
  if (r.peak_reserved_bytes >= 0) std::snprintf(reserved, sizeof reserved, "%lld", (long long)r.peak_reserved_bytes);
  char nums[512];
  std::snprintf(nums, sizeof nums,
                ",\"lanes\":%zu,\"ops\":%llu,\"ns_per_op\":%.2f,\"ns_per_op_pass1\":%.2f,"
                "\"peak_reserved_bytes\":%s,\"peak_live_bytes\":%llu,\"reserved_over_live\":%s,"
                "\"misses_pass2\":%s,\"allocations_pass2\":%llu",
                w.lanes.size(), (unsigned long long)r.ops_pass2, r.ns_per_op, r.ns_per_op_pass1, reserved,
                (unsigned long long)s.peak_live_round_robin, ratio, misses, (unsigned long long)r.allocations_pass2);
  return "{\"workload\":" + json_str(w.name) + ",\"allocator\":" + json_str(allocator) + nums + ",\"version\":" + json_str(version) + ",\"empty_cache\":" + json_str(empty_cache) +
         ",\"config\":" + json_str(config) + "}";
}

inline std::string json_error(const std::string& workload, const std::string& allocator, const std::string& error)
{
  return "{\"workload\":" + json_str(workload) + ",\"allocator\":" + json_str(allocator) +
         ",\"error\":" + json_str(error) + "}";
}

// ---- CUDA lanes --------------------------------------------------------------------------

#ifndef CMWL_NO_CUDA
inline void cuda_check(cudaError_t e, const char* what)
{
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Per-lane non-blocking streams on device 0, and one event per lane for hand-offs. Allocators
// derive from it and add alloc/free/free_on/empty_cache/counters.
class CudaLanes {
 public:
  static constexpr int device = 0;
  void open(std::size_t lanes)
  {
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    streams_.assign(lanes, nullptr);
    events_.assign(lanes, nullptr);
    for (std::size_t l = 0; l < lanes; ++l) {
      cuda_check(cudaStreamCreateWithFlags(&streams_[l], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      cuda_check(cudaEventCreateWithFlags(&events_[l], cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
  }
  void thread_begin(std::size_t) { cuda_check(cudaSetDevice(device), "cudaSetDevice"); }
  void sync(std::size_t lane) { cuda_check(cudaStreamSynchronize(streams_[lane]), "cudaStreamSynchronize"); }
  void close()
  {
    cudaError_t first = cudaSuccess;
    for (auto s : streams_) {
      if (!s) continue;
      cudaError_t e = cudaStreamSynchronize(s);
      if (first == cudaSuccess) first = e;
      e = cudaStreamDestroy(s);
      if (first == cudaSuccess) first = e;
    }
    for (auto ev : events_)
      if (ev) cudaEventDestroy(ev);
    streams_.clear();
    events_.clear();
    cuda_check(first, "closing the lanes' streams");
  }
  cudaStream_t stream(std::size_t lane) const { return streams_[lane]; }
  // Orders lane `other`'s stream after everything lane `lane`'s stream has queued so far (the
  // block's uses there): record the lane's event, make the other stream wait on it. The event is
  // the lane's own and only its thread records it; cudaStreamWaitEvent takes the event's state at
  // the call, so re-recording it later is safe.
  void hand_off(std::size_t lane, std::size_t other)
  {
    cuda_check(cudaEventRecord(events_[lane], streams_[lane]), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(streams_[other], events_[lane], 0), "cudaStreamWaitEvent");
  }

 protected:
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
};
#endif

}  // namespace cmwl
