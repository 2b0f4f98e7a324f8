#!/usr/bin/env python3
"""PyTorch with its native allocator and with cuda-mem's (over its device caching allocator,
"cache" with the speed-first parameters and "cache-compact" with the defaults that keep the
reserve close to what is in use, and over a retaining pool, "pool"), each in a process of its own (the allocator must be
chosen before the first CUDA allocation):

- an MLP, forward + backward + SGD step, 100 steps (three repetitions, the best one timed);
- a transformer encoder block, forward, over varying sequence lengths (the best of two timed
  passes after an untimed one);
- torch.empty of 1 MiB and its free, 20000 pairs after a warm-up: the allocator's cost per pair
  as PyTorch sees it (the pluggable allocator's own bookkeeping included), before the
  deterministic settings below (which fill every new tensor).

Same seeds and deterministic settings everywhere, so the outputs must be bit-identical. The
allocators run in --rounds rounds in one invocation, their order rotating each round (the GPU's
clocks and the host's caches warm up the same for each); each round's ratio is against that
round's native run, and the table shows the median over rounds with the range. Also printed:
both peaks of reserved memory, and the cache's hits and misses.

    python3 torch_alloc_compare.py                    # 3 rounds of native, cache and pool
    python3 torch_alloc_compare.py --rounds 5 --allocators native,cache,cache-compact
    python3 torch_alloc_compare.py --run cache        # one run, JSON on stdout (used by the above)
"""
import argparse
import hashlib
import json
import os
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SEQUENCE_LENGTHS = [32, 512, 64, 384, 128, 100, 256, 17, 448, 200, 320, 48, 1024, 80, 160, 640]
ALLOCATORS = ("native", "cache", "cache-compact", "pool")
DEFAULT_ALLOCATORS = ("native", "cache", "pool")
PAIRS = 20000


def digest(tensors):
    """A hash of the tensors' float64 sums and norms (identical bits give identical hashes)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().double()
        h.update(struct.pack("<3d", t.sum().item(), t.norm().item(), t.abs().max().item()))
    return h.hexdigest()


def alloc_pair_us(torch, device):
    """Microseconds per torch.empty(1 MiB) and its free, after a warm-up."""
    for _ in range(1000):
        torch.empty(1 << 20, dtype=torch.uint8, device=device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(PAIRS):
        torch.empty(1 << 20, dtype=torch.uint8, device=device)
    return (time.perf_counter() - start) / PAIRS * 1e6


def run(allocator_name):
    import torch

    alloc = None
    if allocator_name != "native":
        sys.path.insert(0, HERE)
        import cuda_mem_torch

        alloc = cuda_mem_torch.install(backend=allocator_name)
    device = torch.device("cuda", 0)
    pair_us = alloc_pair_us(torch, device)

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)

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

    result = {
        "allocator": allocator_name,
        "mlp_hash": mlp_hash,
        "transformer_hash": tf_hash,
        "final_loss": losses[-1].item(),
        "mlp_seconds": min(mlp_times),
        "transformer_seconds": min(tf_times[1:]),
        "alloc_pair_us": pair_us,
    }
    if alloc is not None:
        stats = alloc.stats(0)
        result.update(
            peak_reserved=stats["reserved_peak"],
            peak_allocated=stats["allocated_peak"],
            cache_hits=stats["cache_hits"],
            cache_misses=stats["cache_misses"],
            segments=stats["segments"],
        )
    else:
        result.update(peak_reserved=torch.cuda.max_memory_reserved(0), peak_allocated=torch.cuda.max_memory_allocated(0))
    return result


def run_in_subprocess(allocator_name):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--run", allocator_name],
        env=env, check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def step_seconds(result):
    return result["mlp_seconds"] + result["transformer_seconds"]


def spread(values, fmt):
    """The median, with the range when there are several values."""
    median = fmt.format(statistics.median(values))
    if len(values) < 2:
        return median
    return f"{median} [{fmt.format(min(values))}..{fmt.format(max(values))}]"


def compare(allocators, rounds):
    """Every allocator in every round, the order rotating; returns {allocator: [result per round]}."""
    results = {name: [] for name in allocators}
    for r in range(rounds):
        order = allocators[r % len(allocators):] + allocators[:r % len(allocators)]
        for name in order:
            results[name].append(run_in_subprocess(name))
    return results


def report(results, rounds):
    names = list(results)
    mib = 1 << 20
    print(f"{rounds} round(s), the allocators' order rotating; medians, [min..max] over rounds")
    print(f"{'':24}" + "".join(f"{name:>30}" for name in names))
    for key, fmt in (("mlp_seconds", "{:.4f}"), ("transformer_seconds", "{:.4f}"), ("alloc_pair_us", "{:.3f}")):
        cells = [spread([r[key] for r in results[name]], fmt) for name in names]
        print(f"{key:24}" + "".join(f"{c:>30}" for c in cells))
    for key in ("peak_reserved", "peak_allocated"):
        cells = [spread([r[key] / mib for r in results[name]], "{:.1f}") for name in names]
        print(f"{key + ' (MiB)':24}" + "".join(f"{c:>30}" for c in cells))
    for name in names:
        if name.startswith("cache"):
            last = results[name][-1]
            print(f"{name}: {last['cache_hits']} hits, {last['cache_misses']} misses, {last['segments']} segments (last round)")
    summary = {}
    if "native" in results:
        native = results["native"]
        for name in names:
            if name == "native":
                continue
            ours = results[name]
            ratios = {
                "step": [step_seconds(o) / step_seconds(n) for o, n in zip(ours, native)],
                "mlp": [o["mlp_seconds"] / n["mlp_seconds"] for o, n in zip(ours, native)],
                "transformer": [o["transformer_seconds"] / n["transformer_seconds"] for o, n in zip(ours, native)],
                "alloc_pair": [o["alloc_pair_us"] / n["alloc_pair_us"] for o, n in zip(ours, native)],
                "peak_reserved": [o["peak_reserved"] / max(n["peak_reserved"], 1) for o, n in zip(ours, native)],
            }
            summary[name] = {k: statistics.median(v) for k, v in ratios.items()}
            print(f"{name} / native, same-round ratios: "
                  + ", ".join(f"{k} {spread(v, '{:.3f}')}" for k, v in ratios.items()))
        if "cache" in summary:
            print(f"step-time ratio (cuda-mem / native): {summary['cache']['step']:.3f} (target <= 1.05)")
        mlp_same = all(r["mlp_hash"] == native[0]["mlp_hash"] for rs in results.values() for r in rs)
        tf_same = all(r["transformer_hash"] == native[0]["transformer_hash"] for rs in results.values() for r in rs)
        print(f"outputs identical: mlp {mlp_same}, transformer {tf_same}")
        print(json.dumps({"ratios": summary, "results": results}))
        return mlp_same and tf_same
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", choices=ALLOCATORS, help="one run in this process, JSON on stdout")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every allocator (default 3)")
    parser.add_argument("--allocators", default=",".join(DEFAULT_ALLOCATORS),
                        help="comma-separated, from " + ",".join(ALLOCATORS))
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run(args.run)))
        return 0
    allocators = [a for a in args.allocators.split(",") if a]
    unknown = [a for a in allocators if a not in ALLOCATORS]
    if unknown or args.rounds < 1:
        parser.error(f"allocators from {','.join(ALLOCATORS)} and at least one round (got {unknown}, {args.rounds})")
    same = report(compare(allocators, args.rounds), args.rounds)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
