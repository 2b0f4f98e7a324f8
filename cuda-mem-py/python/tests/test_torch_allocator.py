"""cuda-mem's PyTorch allocator, each test in a fresh process (the allocator is chosen before
PyTorch's first CUDA allocation)."""
import os
import subprocess
import sys

from helpers import BUNDLE_PYTHON, need_allocator, run_script


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
        del a, b, c
        torch.cuda.synchronize()
        after = alloc.stats(0)
        empty = torch.empty(0, device="cuda")                   # zero bytes: a unique address
        print(json.dumps({"close": close, "during": during, "after": after}))
        """
    )
    assert result["close"], "the matmul through cuda-mem's memory is wrong"
    during, after = result["during"], result["after"]
    assert during["allocated_current"] >= 3 * (4 << 20), during
    assert during["reserved_current"] >= during["allocated_current"], during
    assert during["alloc_count"] >= 3 and during["failed_count"] == 0, during
    assert after["allocated_current"] <= during["allocated_current"] - 3 * (4 << 20), after
    assert after["free_count"] >= 3 and after["allocated_peak"] >= 3 * (4 << 20), after
    assert after["reserved_current"] > 0, "the retaining pool keeps its memory"


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
    print(done.stdout)  # the step-time ratio and the peaks, for the record (no timing assertion)
    assert done.returncode == 0, f"outputs differ or a run failed\n{done.stdout}\n{done.stderr}"
    assert "outputs identical: mlp True, transformer True" in done.stdout, done.stdout
