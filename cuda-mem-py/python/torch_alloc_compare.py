#!/usr/bin/env python3
"""PyTorch with its native allocator and with cuda-mem's, in separate processes (the allocator
must be chosen before the first CUDA allocation):

- an MLP, forward + backward + SGD step, 100 steps (three repetitions, the best one timed);
- a transformer encoder block, forward, over varying sequence lengths.

Same seeds and deterministic settings in both, so the outputs must be bit-identical. Prints the
step-time ratio (cuda-mem / native) and both peaks of reserved memory.

    python3 torch_alloc_compare.py                   # both runs and the comparison
    python3 torch_alloc_compare.py --run cuda_mem    # one run, JSON on stdout (used by the above)
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SEQUENCE_LENGTHS = [32, 512, 64, 384, 128, 100, 256, 17, 448, 200, 320, 48, 1024, 80, 160, 640]


def digest(tensors):
    """A hash of the tensors' float64 sums and norms (identical bits give identical hashes)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().double()
        h.update(struct.pack("<3d", t.sum().item(), t.norm().item(), t.abs().max().item()))
    return h.hexdigest()


def run(allocator_name):
    import torch

    alloc = None
    if allocator_name == "cuda_mem":
        sys.path.insert(0, HERE)
        import cuda_mem_torch

        alloc = cuda_mem_torch.install()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda", 0)

    # MLP training.
    mlp_times, mlp_hash, losses = [], None, []
    for _ in range(3):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.GELU(),
            torch.nn.Linear(4096, 4096), torch.nn.GELU(),
            torch.nn.Linear(4096, 1024),
        ).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        gen = torch.Generator(device=device).manual_seed(1)
        losses = []
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(100):
            x = torch.randn(512, 1024, device=device, generator=gen)
            y = torch.randn(512, 1024, device=device, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.cuda.synchronize()
        mlp_times.append(time.perf_counter() - start)
        mlp_hash = digest(list(model.parameters()) + losses)
        del model, opt

    # Transformer block inference over varying sequence lengths.
    torch.manual_seed(2)
    block = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
    block = block.to(device).eval()
    gen = torch.Generator(device=device).manual_seed(3)
    outputs, tf_times = [], []
    with torch.no_grad():
        for rep in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for length in SEQUENCE_LENGTHS:
                x = torch.randn(16, length, 512, device=device, generator=gen)
                out = block(x)
                if rep == 0:
                    outputs.append(out)
            torch.cuda.synchronize()
            tf_times.append(time.perf_counter() - start)
    tf_hash = digest(outputs)

    if alloc is not None:
        stats = alloc.stats(0)
        peak_reserved, peak_allocated = stats["reserved_peak"], stats["allocated_peak"]
    else:
        peak_reserved, peak_allocated = torch.cuda.max_memory_reserved(0), torch.cuda.max_memory_allocated(0)
    return {
        "allocator": allocator_name,
        "mlp_hash": mlp_hash,
        "transformer_hash": tf_hash,
        "final_loss": losses[-1].item(),
        "mlp_seconds": min(mlp_times),
        "transformer_seconds": min(tf_times[1:]),
        "peak_reserved": peak_reserved,
        "peak_allocated": peak_allocated,
    }


def run_in_subprocess(allocator_name):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--run", allocator_name],
        env=env, check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare():
    native = run_in_subprocess("native")
    ours = run_in_subprocess("cuda_mem")
    mib = 1 << 20
    print(f"{'':22}{'native':>14}{'cuda-mem':>14}{'ratio':>8}")
    for key in ("mlp_seconds", "transformer_seconds"):
        print(f"{key:22}{native[key]:14.4f}{ours[key]:14.4f}{ours[key] / native[key]:8.3f}")
    for key in ("peak_reserved", "peak_allocated"):
        print(f"{key + ' (MiB)':22}{native[key] / mib:14.1f}{ours[key] / mib:14.1f}{ours[key] / max(native[key], 1):8.3f}")
    step_ratio = (ours["mlp_seconds"] + ours["transformer_seconds"]) / (
        native["mlp_seconds"] + native["transformer_seconds"]
    )
    print(f"step-time ratio (cuda-mem / native): {step_ratio:.3f} (target <= 1.05)")
    print(f"outputs identical: mlp {native['mlp_hash'] == ours['mlp_hash']}, "
          f"transformer {native['transformer_hash'] == ours['transformer_hash']}")
    return native, ours


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", choices=["native", "cuda_mem"], help="one run in this process, JSON on stdout")
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run(args.run)))
        return 0
    native, ours = compare()
    same = native["mlp_hash"] == ours["mlp_hash"] and native["transformer_hash"] == ours["transformer_hash"]
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
