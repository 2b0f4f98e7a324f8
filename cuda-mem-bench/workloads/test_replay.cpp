// CPU test of replay.h (no CUDA): the parser's bounds and id checks, the round-robin peak, and the
// two-pass threaded replay through a checking fake allocator (every block freed once, by its own
// lane, with the size it was allocated with; hand-offs name a real lane).
//
//   g++ -std=c++17 -O2 -Wall -Wextra -DCMWL_NO_CUDA -pthread test_replay.cpp -o test_replay
//   ./test_replay FILE.cmwl [FILE...]     # prints each file's shape and a fake replay row
//   ./test_replay                          # only the built-in parser cases
#include "replay.h"

#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace {

int failures = 0, passes = 0;
void check(bool ok, const std::string& what)
{
  if (ok) {
    ++passes;
  } else {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

// Fake allocator: blocks are tokens; a map checks every free against its allocation.
struct Fake {
  using Block = std::uint64_t;
  static bool live(const Block& b) { return b != 0; }
  struct Held {
    std::uint64_t bytes;
    std::size_t lane;
  };
  std::mutex m;
  std::unordered_map<std::uint64_t, Held> held;
  std::uint64_t next = 1, live_bytes = 0, peak = 0, allocs = 0, bad = 0, empties = 0, handoffs = 0;
  std::size_t lanes = 0;
  std::vector<int> begun;

  void open(std::size_t n)
  {
    lanes = n;
    begun.assign(n, 0);
  }
  void thread_begin(std::size_t l) { begun[l] = 1; }
  void sync(std::size_t) {}
  void close() {}
  Block alloc(std::size_t l, std::uint64_t bytes)
  {
    std::lock_guard<std::mutex> g(m);
    Block b = next++;
    held.emplace(b, Held{bytes, l});
    live_bytes += bytes;
    peak = std::max(peak, live_bytes);
    ++allocs;
    return b;
  }
  void release(std::size_t l, Block& b, std::uint64_t bytes)
  {
    std::lock_guard<std::mutex> g(m);
    auto it = held.find(b);
    if (it == held.end() || it->second.bytes != bytes || it->second.lane != l) {
      ++bad;
    } else {
      live_bytes -= bytes;
      held.erase(it);
    }
    b = 0;
  }
  void free(std::size_t l, Block& b, std::uint64_t bytes) { release(l, b, bytes); }
  void free_on(std::size_t l, Block& b, std::uint64_t bytes, std::size_t other)
  {
    {
      std::lock_guard<std::mutex> g(m);
      if (other >= lanes) ++bad;
      ++handoffs;
    }
    release(l, b, bytes);
  }
  void empty_cache(std::size_t)
  {
    std::lock_guard<std::mutex> g(m);
    ++empties;
  }
  cmwl::Counters counters()
  {
    std::lock_guard<std::mutex> g(m);
    return cmwl::Counters{std::int64_t(peak), std::int64_t(allocs)};
  }
};

// A small file written by hand in the format.
struct Writer {
  std::vector<unsigned char> b;
  void le(std::uint64_t v, int n)
  {
    for (int i = 0; i < n; ++i) b.push_back((unsigned char)(v >> (8 * i)));
  }
  void header(std::uint32_t lanes, const std::string& name)
  {
    b.insert(b.end(), {'C', 'M', 'W', 'L'});
    le(1, 4);
    le(lanes, 4);
    le(name.size(), 4);
    b.insert(b.end(), name.begin(), name.end());
  }
  void op(std::uint8_t kind, std::uint16_t lane, std::uint32_t id, std::uint64_t bytes)
  {
    b.push_back(kind);
    b.push_back(0);
    le(lane, 2);
    le(id, 4);
    le(bytes, 8);
  }
};

bool parses(const std::vector<unsigned char>& b)
{
  try {
    cmwl::parse(b.data(), b.size());
    return true;
  } catch (std::runtime_error const&) {
    return false;
  }
}

void builtin_cases()
{
  // Two lanes: lane 0 allocs 7 (id 5), hands it to lane 1, empties the cache; lane 1 allocs 2^40
  // (id 3) and frees it. Round robin: +7, +2^40 -> peak 2^40 + 7.
  Writer w;
  w.header(2, "t");
  w.le(3, 8);
  w.op(0, 0, 5, 7);
  w.op(2, 1, 5, 0);
  w.op(3, 0, 0, 0);
  w.le(2, 8);
  w.op(0, 0, 3, std::uint64_t(1) << 40);
  w.op(1, 0, 3, 0);
  check(w.b.size() == 16 + 1 + 8 * 2 + 16 * 5, "size of the hand-written file");
  auto wl = cmwl::parse(w.b.data(), w.b.size());
  auto s  = cmwl::shape(wl);
  check(wl.name == "t" && wl.lanes.size() == 2, "header");
  check(s.peak_live_round_robin == (std::uint64_t(1) << 40) + 7, "round-robin peak of the hand-written file");
  check(s.allocations == 2 && s.frees == 2 && s.handoffs == 1 && s.empty_caches == 1, "counts");
  check(wl.lanes[0].ops[1].bytes == 7 && wl.lanes[0].ops[1].other == 1, "free_on carries size and lane");
  check(wl.lanes[0].slots == 1 && wl.lanes[1].slots == 1, "ids renumbered densely");
  for (std::size_t cut = 0; cut < w.b.size(); ++cut) {
    std::vector<unsigned char> t(w.b.begin(), w.b.begin() + cut);
    check(!parses(t), "truncated at " + std::to_string(cut));
  }
  auto bad = w.b;
  bad[16 + 1 + 8 + 16 + 2] = 9;  // lane 0's free_on names lane 9 of 2
  check(!parses(bad), "free_on to a lane that does not exist");
  bad = w.b;
  bad[16 + 1 + 8] = 7;  // kind 7
  check(!parses(bad), "bad kind");
  bad = w.b;
  bad[0] = 'X';
  check(!parses(bad), "bad magic");
  bad = w.b;
  bad[4] = 2;
  check(!parses(bad), "bad version");
  bad = w.b;
  bad[16 + 1] = 0xff;  // lane 0 claims far more ops than the file holds
  check(!parses(bad), "op count past the end");
  bad = w.b;
  for (int i = 0; i < 8; ++i) bad[16 + 1 + 8 + 8 + i] = 0;  // alloc of 0 bytes
  check(!parses(bad), "alloc of 0 bytes");

  // Id misuse: double alloc, free of a never-allocated id, double free.
  Writer d;
  d.header(1, "d");
  d.le(2, 8);
  d.op(0, 0, 1, 8);
  d.op(0, 0, 1, 8);
  check(!parses(d.b), "id allocated twice");
  Writer f;
  f.header(1, "f");
  f.le(1, 8);
  f.op(1, 0, 4, 0);
  check(!parses(f.b), "free of an id never allocated");
  Writer ff;
  ff.header(1, "ff");
  ff.le(3, 8);
  ff.op(0, 0, 4, 8);
  ff.op(1, 0, 4, 0);
  ff.op(1, 0, 4, 0);
  check(!parses(ff.b), "id freed twice");
  // An id reused after its free, and one left live at the end (allowed; replay frees it).
  Writer r;
  r.header(1, "r");
  r.le(4, 8);
  r.op(0, 0, 4000000000u, 8);
  r.op(1, 0, 4000000000u, 0);
  r.op(0, 0, 4000000000u, 16);
  r.op(0, 0, 9, 32);
  auto rw = cmwl::parse(r.b.data(), r.b.size());
  check(rw.lanes[0].slots == 2, "a huge id takes one slot");
  check(cmwl::shape(rw).peak_live_round_robin == 48, "peak with a reused id");
  Fake fake;
  auto res = cmwl::replay(rw, fake);
  check(res.error.empty() && fake.bad == 0 && fake.held.empty(), "left-over blocks freed with their sizes");
  check(res.allocations_pass2 == 3 && res.ops_pass2 == 4, "pass 2 counts");
}

}  // namespace

int main(int argc, char** argv)
{
  builtin_cases();
  for (int i = 1; i < argc; ++i) {
    cmwl::Workload w;
    try {
      w = cmwl::read_file(argv[i]);
    } catch (std::exception const& e) {
      check(false, std::string(argv[i]) + ": " + e.what());
      continue;
    }
    auto s = cmwl::shape(w);
    std::printf("%s lanes=%zu ops=%llu allocations=%llu peak_live_round_robin=%llu\n", w.name.c_str(),
                w.lanes.size(), (unsigned long long)s.ops, (unsigned long long)s.allocations,
                (unsigned long long)s.peak_live_round_robin);
    Fake fake;
    auto res = cmwl::replay(w, fake);
    bool all_begun = std::all_of(fake.begun.begin(), fake.begun.end(), [](int b) { return b == 1; });
    check(res.error.empty(), w.name + ": replay error " + res.error);
    check(fake.bad == 0, w.name + ": frees matched their allocations");
    check(fake.held.empty(), w.name + ": nothing held after the replay");
    check(all_begun, w.name + ": every lane thread began");
    check(fake.allocs == 2 * s.allocations, w.name + ": two passes of allocations");
    check(fake.handoffs == 2 * s.handoffs && fake.empties == 2 * s.empty_caches, w.name + ": hand-offs, empties");
    check(res.ops_pass2 == s.ops && res.allocations_pass2 == s.allocations, w.name + ": pass 2 counts");
    check(res.misses_pass2 == std::int64_t(s.allocations), w.name + ": misses = counter delta");
    // Lanes run concurrently, so the fake's peak depends on the interleaving; one lane's
    // must equal the round-robin peak exactly.
    if (w.lanes.size() == 1)
      check(res.peak_reserved_bytes == std::int64_t(s.peak_live_round_robin), w.name + ": one lane's peak");
    std::printf("%s\n", cmwl::json_row(w, s, "fake", res, "test", "done", "checking fake").c_str());
  }
  std::printf("%d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
