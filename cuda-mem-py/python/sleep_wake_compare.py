#!/usr/bin/env python3
"""Sleep and wake of tagged PyTorch memory, cuda-mem beside the tools people use today, each in a
process of its own on the same tensors (sizes 1 MiB to 512 MiB from a fixed seed, --gib in all):

- `cuda_mem`: `cuda_mem.torch.region("weights")`, `sleep("weights")` (bytes kept in pinned host
  memory), `wake("weights")`;
- `tms`: torch_memory_saver (`region(tag, enable_cpu_backup=True)`, `pause`, `resume`, its
  "torch" hook mode), when it is importable;
- `per_tensor_copy`: what vLLM's `CuMemAllocator` does to each allocation at a sleep and a wake:
  a pinned host tensor made for it and one synchronous copy each way. Only the copies are timed:
  the unmap and remap it does as well are not, so this row is a lower bound on its time;
- `pinned_copy`: one large copy each way between a device buffer and pinned host memory, the
  bandwidth the others are compared with.

Every run checks each tensor's checksum after every wake and prints a JSON line; the parent
prints a table with GB/s (10^9 bytes per second) for the first and the warm cycles.

    python3 sleep_wake_compare.py [--gib 40] [--cycles 3] [--runs cuda_mem,tms,per_tensor_copy,pinned_copy]
    python3 sleep_wake_compare.py --run cuda_mem --gib 4      # one run, JSON on stdout
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
RUNS = ("cuda_mem", "tms", "per_tensor_copy", "pinned_copy")


def tensor_sizes(total, seed=7):
    """Sizes in bytes, 1 MiB to 512 MiB (most small, a few large, as a model's weights), adding
    up to about `total`."""
    rng = random.Random(seed)
    sizes, left = [], total
    while left >= MIB:
        band = rng.random()
        low, high = (1, 16) if band < 0.7 else (16, 128) if band < 0.95 else (128, 512)
        size = min(rng.randint(low, high) * MIB, left)
        sizes.append(size)
        left -= size
    return sizes


def used(torch):
    free, total = torch.cuda.mem_get_info()
    return total - free


def make(torch, sizes):
    """The tensors, uninitialized (made inside a tool's region: nothing else is allocated there)."""
    return [torch.empty(size, dtype=torch.uint8, device="cuda") for size in sizes]


def fill(torch, tensors):
    """Distinct contents in every tensor (outside the region: the temporaries are untagged)."""
    for i, t in enumerate(tensors):
        t.view(torch.int32).copy_(torch.arange(t.numel() // 4, dtype=torch.int32, device="cuda") * (2 * i + 1))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return tensors


def checksums(torch, tensors):
    return torch.stack([t.view(torch.int32).sum(dtype=torch.int64) for t in tensors]).cpu().tolist()


def cycle_times(torch, tensors, sleep, wake, cycles):
    """Times each sleep and wake (the device idle before each), checking every tensor after every
    wake; returns the records and the device bytes given back by the first sleep."""
    expected = checksums(torch, tensors)
    records, given_back = [], None
    for cycle in range(cycles):
        torch.cuda.synchronize()
        before = used(torch)
        start = time.perf_counter()
        sleep()
        torch.cuda.synchronize()
        slept = time.perf_counter()
        if given_back is None:
            given_back = before - used(torch)
        wake()
        torch.cuda.synchronize()
        woke = time.perf_counter()
        records.append({"cycle": cycle, "sleep_s": slept - start, "wake_s": woke - slept,
                        "intact": checksums(torch, tensors) == expected})
    return records, given_back


def run_cuda_mem(torch, sizes, cycles):
    import cuda_mem.torch as cmt

    with cmt.region("weights"):
        tensors = make(torch, sizes)
    fill(torch, tensors)
    records, given_back = cycle_times(torch, tensors, lambda: cmt.sleep("weights"), lambda: cmt.wake("weights"), cycles)
    cmt.sleep("weights")
    host = cmt.region_stats()["weights"]["host_backup"]
    cmt.wake("weights")
    return records, given_back, host


def run_tms(torch, sizes, cycles):
    from torch_memory_saver import torch_memory_saver as tms

    tms.hook_mode = "torch"
    with tms.region(tag="weights", enable_cpu_backup=True):
        tensors = make(torch, sizes)
    fill(torch, tensors)
    records, given_back = cycle_times(torch, tensors, lambda: tms.pause("weights"), lambda: tms.resume("weights"), cycles)
    return records, given_back, None


def run_per_tensor_copy(torch, sizes, cycles):
    tensors = fill(torch, make(torch, sizes))
    backups = []

    def sleep():
        for t in tensors:
            backup = torch.empty(t.numel(), dtype=torch.uint8, pin_memory=True)
            backup.copy_(t)               # synchronous, as cudaMemcpy
            backups.append(backup)

    def wake():
        for t, backup in zip(tensors, backups):
            t.copy_(backup)
            torch.cuda.synchronize()
        backups.clear()

    records, _ = cycle_times(torch, tensors, sleep, wake, cycles)
    return records, None, None


def run_pinned_copy(torch, sizes, cycles):
    total = sum(sizes)
    chunk = min(total, 8 << 30)
    device = torch.empty(chunk, dtype=torch.uint8, device="cuda")
    host = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
    device.fill_(3)
    copies = -(-total // chunk)
    records = []
    for cycle in range(cycles):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(copies):
            host.copy_(device)
        torch.cuda.synchronize()
        down = time.perf_counter()
        for _ in range(copies):
            device.copy_(host)
        torch.cuda.synchronize()
        up = time.perf_counter()
        scale = total / (copies * chunk)
        records.append({"cycle": cycle, "sleep_s": (down - start) * scale, "wake_s": (up - down) * scale, "intact": True})
    return records, None, None


def one_run(name, gib, cycles):
    if name == "cuda_mem":
        import cuda_mem.torch as cmt

        cmt.install()
    import torch

    sizes = tensor_sizes(int(gib * (1 << 30)))
    runner = {"cuda_mem": run_cuda_mem, "tms": run_tms, "per_tensor_copy": run_per_tensor_copy,
              "pinned_copy": run_pinned_copy}[name]
    records, given_back, host = runner(torch, sizes, cycles)
    return {"run": name, "tensors": len(sizes), "bytes": sum(sizes), "records": records, "given_back": given_back,
            "host_backup": host, "device": torch.cuda.get_device_name(), "version": version(name, torch)}


def version(name, torch):
    """The measured tool's version, as the report names its peer."""
    if name == "tms":
        from importlib.metadata import version as installed

        return f"torch_memory_saver {installed('torch_memory_saver')}"
    return f"torch {torch.__version__}"


def table(results):
    lines = ["run              tensors   GiB  first sleep  first wake  warm sleep GB/s  warm wake GB/s  vs pinned (sleep, wake)  given back GiB  pinned/kept  intact"]
    pinned = next((r for r in results if r.get("run") == "pinned_copy" and "records" in r), None)

    def warm(r, key):
        rows = r["records"][1:] or r["records"]
        return r["bytes"] / min(row[key] for row in rows) / 1e9

    for r in results:
        if "records" not in r:
            lines.append(f"{r['run']:<16} not measured: {r['error']}")
            continue
        first = r["records"][0]
        sleep_gbs, wake_gbs = warm(r, "sleep_s"), warm(r, "wake_s")
        ratio = f"{sleep_gbs / warm(pinned, 'sleep_s'):.3f}, {wake_gbs / warm(pinned, 'wake_s'):.3f}" if pinned else "-"
        given = "-" if r["given_back"] is None else f"{r['given_back'] / (1 << 30):.2f}"
        host = "-" if r["host_backup"] is None else f"{r['host_backup'] / r['bytes']:.4f}"
        intact = all(row["intact"] for row in r["records"])
        lines.append(f"{r['run']:<16} {r['tensors']:>7} {r['bytes'] / (1 << 30):>5.1f}  {first['sleep_s']:>9.2f} s  "
                     f"{first['wake_s']:>8.2f} s  {sleep_gbs:>15.2f}  {wake_gbs:>14.2f}  {ratio:>23}  {given:>14}  "
                     f"{host:>11}  {intact}")
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=40.0)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--run", choices=RUNS, help="one run in this process (JSON on stdout)")
    args = parser.parse_args(argv)
    if args.run:
        print(json.dumps(one_run(args.run, args.gib, args.cycles)), flush=True)
        return 0
    results = []
    for name in args.runs.split(","):
        done = subprocess.run([sys.executable, __file__, "--run", name, "--gib", str(args.gib), "--cycles",
                               str(args.cycles)], capture_output=True, text=True, timeout=1800)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if lines:
            results.append(json.loads(lines[-1]))
            if done.returncode != 0:      # measured, then failed (at exit, say): say so
                results[-1]["exit"] = f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}"
        else:
            results.append({"run": name, "error": (done.stderr.strip().splitlines() or ["failed"])[-1]})
        print(json.dumps(results[-1]), flush=True)
    print(table(results))
    for r in results:
        if "exit" in r:
            print(f"{r['run']}: measured, then {r['exit']}")
    return 0 if all(all(row["intact"] for row in r.get("records", [])) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
