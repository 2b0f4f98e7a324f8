"""cuda-mem's PyTorch allocator, each test in a fresh process (the allocator is chosen before
PyTorch's first CUDA allocation)."""
import json
import os
import subprocess
import sys

from helpers import BUNDLE_PYTHON, PACKAGE_ROOT, SLEEP_CYCLES, need_allocator, run_script

STATS_KEYS = {
    "allocated_current", "allocated_peak", "reserved_current", "reserved_peak", "alloc_count", "free_count",
    "failed_count", "limit", "cache_hits", "cache_misses", "segments", "segment_releases", "alloc_retries",
    "inactive_split_bytes",
}


def test_the_allocator_serves_pytorch_and_counts():
    need_allocator()
    result = run_script(
        """
        a = torch.randn(1024, 1024, device="cuda")            # 4 MiB
        b = torch.randn(1024, 1024, device="cuda")
        c = a @ b
        expected = a.cpu() @ b.cpu()
        close = torch.allclose(c.cpu(), expected, rtol=1e-3, atol=1e-3)
        during = alloc.stats(0)
        freed = {t.data_ptr() for t in (a, b, c)}
        del a, b, c
        torch.cuda.synchronize()
        after = alloc.stats(0)
        again = torch.empty(1024, 1024, device="cuda")          # a freed block, on its stream
        reused = again.data_ptr() in freed
        empty = torch.empty(0, device="cuda")                   # zero bytes: a unique address
        print(json.dumps({"close": close, "during": during, "after": after, "reused": reused,
                          "hits": alloc.stats(0)["cache_hits"], "backend": alloc.backend}))
        """
    )
    assert result["close"], "the matmul through cuda-mem's memory is wrong"
    during, after = result["during"], result["after"]
    assert set(during) == STATS_KEYS, sorted(during)
    assert result["backend"] == "cache"
    assert during["allocated_current"] >= 3 * (4 << 20), during
    assert during["reserved_current"] >= during["allocated_current"], during
    assert during["alloc_count"] >= 3 and during["failed_count"] == 0, during
    assert during["cache_misses"] >= 1 and during["segments"] >= 1, during
    assert after["allocated_current"] <= during["allocated_current"] - 3 * (4 << 20), after
    assert after["free_count"] >= 3 and after["allocated_peak"] >= 3 * (4 << 20), after
    assert after["reserved_current"] > 0, "the cache keeps its memory"
    # Which of the three: the thread's large-block slot keeps the first freed since its last miss.
    assert result["reused"], "a block freed on PyTorch's stream comes back there"
    assert result["hits"] > after["cache_hits"], result


def test_memory_stats_use_pytorchs_key_names():
    need_allocator()
    result = run_script(
        """
        x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        during = cuda_mem_torch.memory_stats()
        stats = alloc.stats(0)
        del x
        print(json.dumps({"during": during, "stats": stats, "after": cuda_mem_torch.memory_stats(0)}))
        """
    )
    during, stats, after = result["during"], result["stats"], result["after"]
    assert during["allocated_bytes.all.current"] == 3 << 20, during
    assert during["reserved_bytes.all.current"] >= 3 << 20, during
    assert during["allocation.all.current"] == 1 and during["num_device_alloc"] >= 1, during
    assert during["num_ooms"] == 0 and during["num_alloc_retries"] == 0, during
    assert during["reserved_bytes.all.peak"] == stats["reserved_peak"], (during, stats)
    assert after["allocated_bytes.all.current"] == 0 and after["allocated_bytes.all.peak"] >= 3 << 20, after
    assert "inactive_split_bytes.all.current" in after and "segment.all.current" in after, after


def test_alloc_conf_sets_the_backend_and_bad_settings_raise_value_error():
    need_allocator()
    env = dict(os.environ, CUDA_MEM_TORCH_ALLOC_CONF="backend:pool,front_depth:2")
    script = (f"import sys, json, torch\nsys.path.insert(0, {PACKAGE_ROOT!r})\nimport cuda_mem_torch\n"
              "alloc = cuda_mem_torch.install()\nx = torch.ones(4, device='cuda')\n"
              "print(json.dumps({'backend': alloc.backend, 'segments': alloc.stats(0)['segments']}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"backend": "pool", "segments": 0}
    for bad, named in [("front_depth:lots", "front_depth:lots"), ("max_split_size_mb:64", "max_split_size_mb")]:
        env = dict(os.environ, CUDA_MEM_TORCH_ALLOC_CONF=bad)
        check = (f"import sys, torch\nsys.path.insert(0, {PACKAGE_ROOT!r})\nimport cuda_mem_torch\n"
                 "try:\n    cuda_mem_torch.install()\nexcept ValueError as e:\n    print('ValueError', e)\n")
        done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0 and "ValueError" in done.stdout and named in done.stdout, (bad, done.stdout, done.stderr)


def test_record_stream_empty_cache_and_the_memory_fraction_reach_the_allocator():
    need_allocator()
    result = run_script(
        f"""
        n = 1 << 22                                              # 16 MiB of float32
        # The kernels load (lazily) before the timed part: a first launch can take longer than
        # the sleep, and the side stream would be done before the allocation that is checked.
        warm = torch.full((n,), 7.0, device="cuda").sum().item()
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        x = torch.ones(n, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep({10 * SLEEP_CYCLES})               # the side stream reads x late
            total = x.sum()
        x.record_stream(side)
        address = x.data_ptr()
        del x                                                    # held back until side is done
        busy = not side.query()                                  # its recorded work still runs
        sevens = torch.full((n,), 7.0, device="cuda")            # must not land in x's memory
        reused_early = sevens.data_ptr() == address
        side.synchronize()
        correct = total.item() == float(n)
        del sevens, total
        torch.cuda.synchronize()
        before = alloc.stats(0)["reserved_current"]
        torch.cuda.empty_cache()
        after = alloc.stats(0)["reserved_current"]
        torch.cuda.set_per_process_memory_fraction(0.5)
        limit = alloc.stats(0)["limit"]
        total_memory = torch.cuda.mem_get_info()[1]
        print(json.dumps({{"correct": correct, "busy": busy, "reused_early": reused_early, "before": before,
                          "after": after, "limit": limit, "half": int(total_memory * 0.5),
                          "missing_hooks": alloc.missing_hooks}}))
        """
    )
    assert result["missing_hooks"] == [], result["missing_hooks"]
    assert result["correct"], "the side stream read memory reused before its work ended"
    assert result["busy"], "the side stream finished before the check: the test proves nothing"
    assert not result["reused_early"], "x's memory was reused while the recorded stream used it"
    # Everything went back but what PyTorch might keep itself (a small segment at most).
    assert result["before"] >= 32 << 20 and result["after"] <= 2 << 20, result
    assert result["limit"] == result["half"], result


def test_the_pool_backend_still_serves_and_refuses_record_stream():
    need_allocator()
    result = run_script(
        """
        alloc = cuda_mem_torch.install(backend="pool")
        a = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        ok = a.sum().item() == float((1 << 20) * ((1 << 20) - 1) // 2)
        try:
            a.record_stream(torch.cuda.Stream())
            refused = None
        except RuntimeError as err:
            refused = str(err)
        stats = alloc.stats(0)
        try:
            alloc.select_backend("cache")
            switched = True
        except RuntimeError:
            switched = False
        print(json.dumps({"ok": ok, "refused": refused, "stats": stats, "switched": switched}))
        """,
        install=False,
    )
    assert result["ok"]
    assert result["refused"] and "not supported by the pool backend" in result["refused"], result["refused"]
    stats = result["stats"]
    assert stats["reserved_current"] >= 4 << 20 and stats["cache_hits"] == 0 and stats["segments"] == 0, stats
    assert not result["switched"], "the backend changed after the first allocation"


def test_the_limit_makes_pytorch_raise_out_of_memory():
    need_allocator()
    result = run_script(
        """
        alloc.set_limit(0, 64 << 20)
        keep = torch.zeros(16 << 20, dtype=torch.uint8, device="cuda")     # 16 MiB, under the limit
        try:
            torch.empty(128 << 20, dtype=torch.uint8, device="cuda")       # 128 MiB: over it
            raised = None
        except RuntimeError as err:
            raised = [type(err).__name__, str(err)]
        after = torch.ones(1 << 20, device="cuda").sum().item()             # still usable
        stats = alloc.stats(0)
        alloc.set_limit(0, None)
        big = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")     # allowed again
        print(json.dumps({"raised": raised, "after": after, "stats": stats, "unlimited": alloc.stats(0)["limit"]}))
        """
    )
    assert result["raised"] is not None, "the allocation over the limit succeeded"
    assert "out of memory" in result["raised"][1].lower(), result["raised"]
    assert "limit of 67108864 bytes" in result["raised"][1], result["raised"]
    assert result["after"] == float(1 << 20)
    assert result["stats"]["failed_count"] == 1 and result["stats"]["limit"] == 64 << 20, result["stats"]
    assert result["unlimited"] is None


def test_training_and_inference_match_the_native_allocator():
    need_allocator()
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    done = subprocess.run(
        [sys.executable, os.path.join(BUNDLE_PYTHON, "torch_alloc_compare.py")],
        capture_output=True, text=True, timeout=1200, env=env,
    )
    print(done.stdout)  # the step-time ratios and the peaks, for the record (no timing assertion)
    assert done.returncode == 0, f"outputs differ or a run failed\n{done.stdout}\n{done.stderr}"
    assert "outputs identical: mlp True, transformer True" in done.stdout, done.stdout


GRAPH_SCRIPT = """
n = 1 << 20                                                    # 4 MiB of float32
x = torch.ones(n, device="cuda")
torch.cuda.synchronize()
out = {"missing_hooks": alloc.missing_hooks}
# A temporary freed inside g1's capture: g2's output must not be placed in it.
g1 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g1):
    t = x * 2
    y1 = t + 1
    t_ptr = t.data_ptr()
    del t
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g2):
    y2 = x * 5
out["y2_in_g1_temporary"] = y2.data_ptr() == t_ptr
g2.replay(); g1.replay(); torch.cuda.synchronize()
out["y1"], out["y2"] = y1.unique().tolist(), y2.unique().tolist()
# After a capture on s, an eager tensor on s must not get memory the graph writes.
s = torch.cuda.Stream()
g3 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g3, stream=s):
    u = x * 7
    v = u + 1
    u_ptr = u.data_ptr()
    del u
def filled_then_replayed(value):
    # A tensor made on s, then g3 replayed there: the replay must leave it alone.
    with torch.cuda.stream(s):
        made = torch.full((n,), value, device="cuda")
        g3.replay()
    torch.cuda.synchronize()
    return made
z = filled_then_replayed(4.0)
out["z_in_g3_temporary"], out["z"] = z.data_ptr() == u_ptr, z.unique().tolist()
# A graph output deleted while the graph lives: its memory stays the graph's.
v_ptr = v.data_ptr()
del v
q = filled_then_replayed(9.0)
out["q_in_g3_output"], out["q"] = q.data_ptr() == v_ptr, q.unique().tolist()
# A capture while a freed block waits for another stream's work (record_stream; the pool
# backend refuses record_stream).
side = torch.cuda.Stream()
a = torch.ones(n, device="cuda")
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    torch.cuda._sleep(%d)
    a.sum()
if alloc.backend == "cache":
    a.record_stream(side)
else:
    side.synchronize()
del a
g4 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g4):
    b = x * 3
g4.replay(); torch.cuda.synchronize()
out["b"] = b.unique().tolist()
# Every graph gone: their pools go back to the driver at empty_cache.
torch.cuda.empty_cache()
out["reserved_with_graphs"] = alloc.stats(0)["reserved_current"]
del g1, g2, g3, g4, y1, y2, q, z, b
torch.cuda.synchronize()
torch.cuda.empty_cache()
out["reserved_after"] = alloc.stats(0)["reserved_current"]
print(json.dumps(out))
"""


def test_cuda_graphs_keep_their_memory_from_other_tensors():
    need_allocator()
    for backend in ("cache", "pool"):
        result = run_script(
            f"alloc = cuda_mem_torch.install(backend={backend!r})\n" + GRAPH_SCRIPT % SLEEP_CYCLES, install=False
        )
        assert result["missing_hooks"] == [], result
        assert (result["y1"], result["y2"], result["z"], result["q"], result["b"]) == ([3.0], [5.0], [4.0], [9.0], [3.0]), (
            backend, result)
        assert not (result["y2_in_g1_temporary"] or result["z_in_g3_temporary"] or result["q_in_g3_output"]), (
            backend, result)
        # g1..g4 held at least six 4 MiB blocks (t, y1, y2, u, v, b) in their pools.
        assert result["reserved_after"] <= result["reserved_with_graphs"] - 6 * (4 << 20), (backend, result)
