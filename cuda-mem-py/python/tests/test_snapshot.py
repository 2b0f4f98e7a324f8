"""Snapshots of cuda-mem's PyTorch allocator, opened with PyTorch's own memory viewer."""
import os
import pickle
import subprocess
import sys
import tempfile

from helpers import need_allocator, run_script

# What PyTorch's snapshot documents (torch/cuda/memory.py) and its viewer reads.
SEGMENT_KEYS = {"address", "total_size", "stream", "segment_type", "allocated_size", "active_size", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
ENTRY_KEYS = {"action", "addr", "size", "stream", "frames"}


def test_snapshots_open_in_pytorchs_memory_viewer():
    need_allocator()
    folder = tempfile.mkdtemp(prefix="cuda-mem-snapshot-")
    snap, oom, html = (os.path.join(folder, n) for n in ("snap.pickle", "oom.pickle", "snap.html"))
    live = run_script(
        f"""
        alloc.record_history(0, 100_000)
        alloc.dump_on_oom({oom!r})
        xs = [torch.randn(1 << 18, device="cuda") for _ in range(8)]   # 1 MiB each
        del xs[::2]
        alloc.set_limit(0, 64 << 20)
        try:
            torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        except RuntimeError:
            pass
        alloc.set_limit(0, None)
        torch.cuda.synchronize()
        alloc.snapshot({snap!r})
        print(json.dumps([x.data_ptr() for x in xs]))
        """
    )
    with open(snap, "rb") as f:
        data = pickle.load(f)
    segments, trace = data["segments"], data["device_traces"][0]
    addresses = {s["address"] for s in segments}
    assert set(live) <= addresses, "every live tensor is a segment"
    for seg in segments:
        assert SEGMENT_KEYS <= set(seg), seg.keys()
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert all(BLOCK_KEYS <= set(b) for b in seg["blocks"])
    assert all(ENTRY_KEYS <= set(e) for e in trace)
    actions = [e["action"] for e in trace]
    assert actions.count("alloc") >= 8 and actions.count("free_completed") >= 4 and actions.count("oom") == 1
    oom_entry = next(e for e in trace if e["action"] == "oom")
    assert oom_entry["size"] == 256 << 20 and "device_free" in oom_entry
    with open(oom, "rb") as f:
        dumped = pickle.load(f)
    assert [e["action"] for e in dumped["device_traces"][0]][-1] == "oom", "dumped at the refusal"

    from torch.cuda import _memory_viz

    text = _memory_viz.trace(data)
    assert "raise OutOfMemoryError" in text and "del " in text, text[-2000:]
    assert "segments:" in _memory_viz.segsum(data)
    done = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", snap, "-o", html],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    with open(html) as f:
        page = f.read()
    assert "snapshot.pickle" in page and len(page) > 1000
    # Keep the rendered page and its snapshot when asked (the committed example in docs/).
    keep = os.environ.get("CUDA_MEM_SNAPSHOT_OUT")
    if keep:
        import shutil
        for name in (snap, html):
            shutil.copy(name, keep)


def test_snapshot_keys_cover_pytorchs_own():
    """A native snapshot of the same PyTorch, for its keys: ours must hold every documented one;
    newer keys PyTorch adds are printed."""
    need_allocator()
    native = run_script(
        """
        torch.cuda.memory._record_memory_history(max_entries=1000)
        x = torch.randn(1 << 20, device="cuda")
        del x
        s = torch.cuda.memory._snapshot()
        seg = s["segments"][0]
        entry = next(e for e in s["device_traces"][0] if e["action"] == "alloc")
        print(json.dumps({"top": sorted(s), "segment": sorted(seg), "block": sorted(seg["blocks"][0]),
                          "entry": sorted(entry)}))
        """,
        install=False,
    )
    ours = {
        "top": {"segments", "device_traces", "allocator_settings"},
        "segment": SEGMENT_KEYS | {"device", "requested_size", "segment_pool_id", "is_expandable", "frames"},
        "block": BLOCK_KEYS,
        "entry": ENTRY_KEYS | {"time_us"},
    }
    for part, keys in native.items():
        missing = set(keys) - ours[part]
        print(f"{part}: PyTorch has {sorted(keys)}; not written by cuda-mem: {sorted(missing)}")
    assert {"segments", "device_traces"} <= set(native["top"])
    assert SEGMENT_KEYS <= set(native["segment"]) and BLOCK_KEYS <= set(native["block"])
    assert ENTRY_KEYS <= set(native["entry"]), "PyTorch's entries changed: update the snapshot writer"
