# Peer of the `snapshot` section: PyTorch taking and pickling its own allocator's memory snapshot
# with a trace of 100k entries, as the `snapshot_dump` example times cuda-mem's: the trace is
# recorded from 33,334 alloc + free pairs (about three entries each: alloc, free requested, free
# completed) with no stack frames, then `torch.cuda.memory._snapshot()` + `pickle.dumps`, best of
# 10. Run it in the same device call:
#     python3 torch_snapshot.py > torch_snapshot.jsonl
import json, pickle, time, torch

torch.cuda.init()
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda}), flush=True)
entries = 100_000
torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=entries)
for i in range(entries // 3 + 1):
    x = torch.empty(4096 + i % 7 * 512, dtype=torch.uint8, device="cuda")
    del x
torch.cuda.synchronize()
best, size, traced = float("inf"), 0, 0
for _ in range(10):
    start = time.perf_counter()
    snapshot = torch.cuda.memory._snapshot()
    data = pickle.dumps(snapshot)
    best = min(best, time.perf_counter() - start)
    size = len(data)
    traced = sum(len(t) for t in snapshot["device_traces"])
torch.cuda.memory._record_memory_history(enabled=None)
print(json.dumps({"row": "torch_snapshot_pickle", "ms": best * 1e3, "bytes": size, "trace_entries": traced,
                  "segments": len(snapshot["segments"])}), flush=True)
