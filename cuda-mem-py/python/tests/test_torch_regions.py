"""Tagged regions of cuda-mem's PyTorch allocator: sleep and wake, each test in a fresh process."""
import os
import subprocess
import sys

from helpers import BUNDLE_PYTHON, need_allocator, run_script

MIB = 1 << 20

CYCLE_SCRIPT = """
import cuda_mem.torch as cmt
MIB = 1 << 20
cycles = %d
def used():
    free, total = torch.cuda.mem_get_info()
    return total - free
x = torch.randn(64, 1024, device="cuda")
torch.nn.functional.linear(x, torch.randn(1024, 1024, device="cuda"))   # cuBLAS set up, untagged
with cmt.region("weights"):
    weights = [torch.randn(n, device="cuda") for n in (1 << 18, 3 << 20, 50 << 20, 1000)]
    lin = torch.nn.Linear(1024, 1024, device="cuda")
with cmt.region("kv"):
    kv = torch.ones(64 << 20, device="cuda")
expected = [w.clone() for w in weights] + [lin.weight.detach().clone()]
ptrs = [w.data_ptr() for w in weights] + [lin.weight.data_ptr(), kv.data_ptr()]
# A graph that reads the tagged weights, captured once.
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    lin(x)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    y = lin(x)
graph.replay()
torch.cuda.synchronize()
reference = y.clone()
awake = cmt.region_stats()
before = used()
out = {"awake": awake, "tagged_bytes": sum(w.numel() * 4 for w in weights) + lin.weight.numel() * 4 + lin.bias.numel() * 4}
out["slept_weights"] = cmt.sleep("weights")
out["slept_kv"] = cmt.sleep("kv", offload=False)
out["given_back"] = before - used()
out["asleep"] = cmt.region_stats()
def error_of(call, *args, **kwargs):
    try:
        call(*args, **kwargs)
    except (RuntimeError, ValueError, TypeError) as err:
        return f"{type(err).__name__}: {err}"
    return None
def allocate_in(tag):
    with cmt.region(tag):
        return torch.empty(1024, device="cuda")
out["alloc_asleep"] = error_of(allocate_in, "weights")
out["double_sleep"] = error_of(cmt.sleep, "weights")
out["unknown_tag"] = error_of(cmt.sleep, "no-such-tag")
out["bad_tag"] = error_of(allocate_in, "two words")
out["untagged_while_asleep"] = float(torch.ones(4, device="cuda").sum())
# A tensor of the sleeping region freed: its free waits for the wake.
freed_ptr = weights[3].data_ptr()
del weights[3], expected[3]
ptrs.remove(freed_ptr)
out["woke"] = cmt.wake()
out["wake_awake"] = error_of(cmt.wake, "weights")
out["same_addresses"] = [w.data_ptr() for w in weights] + [lin.weight.data_ptr(), kv.data_ptr()] == ptrs
out["equal_after_wake"] = all(torch.equal(a, b) for a, b in zip(weights + [lin.weight], expected))
graph.replay()
torch.cuda.synchronize()
out["graph_after_wake"] = torch.equal(y, reference)
out["blocks_after_wake"] = cmt.region_stats()["weights"]["blocks"]
# Cycles: contents bit-identical after every wake, device and pinned memory flat.
used_asleep, host = [], []
bad_cycles = 0
for cycle in range(cycles):
    weights[0].add_(1.0); expected[0].add_(1.0)   # work on the tensor between cycles
    cmt.sleep("weights")
    cmt.sleep("kv", offload=False)
    used_asleep.append(used())
    host.append(cmt.region_stats()["weights"]["host_backup"])
    cmt.wake()
    if not all(torch.equal(a, b) for a, b in zip(weights + [lin.weight], expected)):
        bad_cycles += 1
graph.replay()
torch.cuda.synchronize()
out["graph_after_cycles"] = torch.equal(y, reference)
out["bad_cycles"] = bad_cycles
out["used_asleep_spread"] = max(used_asleep) - min(used_asleep) if used_asleep else 0
out["host_spread"] = max(host) - min(host) if host else 0
out["final"] = cmt.region_stats()
out["released_backups"] = cmt.release_host_backups()
out["after_release"] = cmt.region_stats()
print(json.dumps(out))
"""


def test_a_region_sleeps_and_wakes_at_the_same_addresses_with_its_graph():
    need_allocator()
    r = run_script(CYCLE_SCRIPT % 1000)
    awake, asleep = r["awake"], r["asleep"]
    assert set(awake) == {"weights", "kv"}, awake
    assert awake["weights"]["state"] == "awake" and awake["weights"]["allocated"] >= r["tagged_bytes"], awake
    # Everything the two regions held went back to the device, and nothing else moved.
    held = awake["weights"]["reserved"] + awake["kv"]["reserved"]
    assert asleep["weights"]["reserved"] == 0 and asleep["kv"]["reserved"] == 0, asleep
    assert r["given_back"] >= held - 2 * 2 * MIB, r
    assert (asleep["weights"]["state"], asleep["kv"]["state"]) == ("kept", "dropped"), asleep
    assert r["slept_weights"] >= r["tagged_bytes"] and r["slept_kv"] >= 256 * MIB, r
    # Pinned memory for the kept bytes only, within 1%.
    assert 0 < asleep["weights"]["host_backup"] <= 1.01 * r["slept_weights"], asleep
    assert asleep["kv"]["host_backup"] == 0, asleep
    # Refusals are typed and change nothing.
    assert r["alloc_asleep"].startswith("RuntimeError") and "sleeping region" in r["alloc_asleep"], r
    assert "sleep of a sleeping region" in r["double_sleep"], r
    assert "no region has this tag" in r["unknown_tag"], r
    assert r["bad_tag"].startswith("ValueError"), r
    assert "wake of an awake region" in r["wake_awake"], r
    assert r["untagged_while_asleep"] == 4.0, r
    # The wake: same addresses, same bytes, the graph replays without re-capture; the tensor
    # freed while asleep was freed at the wake.
    assert r["woke"] >= r["slept_weights"] + r["slept_kv"] - 2 * MIB, r
    assert r["same_addresses"] and r["equal_after_wake"] and r["graph_after_wake"], r
    assert r["blocks_after_wake"] == awake["weights"]["blocks"] - 1, r
    assert r["bad_cycles"] == 0 and r["graph_after_cycles"], r
    assert r["used_asleep_spread"] <= 2 * MIB and r["host_spread"] == 0, r
    assert r["final"]["weights"]["state"] == "awake", r
    # The backups kept for the next sleep go back on request.
    assert r["released_backups"] >= r["final"]["weights"]["host_backup"] > 0, r
    assert all(stats["host_backup"] == 0 for stats in r["after_release"].values()), r


def test_sleeping_between_training_and_inference_changes_no_result():
    need_allocator()
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    done = subprocess.run(
        [sys.executable, os.path.join(BUNDLE_PYTHON, "torch_sleep_wake.py"), "--steps", "4", "--check"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    print(done.stdout)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "results identical: True" in done.stdout, done.stdout
