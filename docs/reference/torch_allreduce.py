# Peer yardstick for cuda-mem-nccl's `allreduce` example: the same all-reduce (sum of f32,
# 256 MiB by default, one process per GPU) through torch.distributed's NCCL backend, with the same
# check of the sums and the same figures (nccl-tests' algBw = bytes / time and
# busBw = algBw * 2(n-1)/n; null with one rank). torch.distributed.all_reduce works in place, so
# only the in-place rows compare. Run it on the GPU host in the SAME device call as the example:
#     examples/allreduce --mode procs > cuda-mem.jsonl
#     python3 docs/reference/torch_allreduce.py --against cuda-mem.jsonl > torch.jsonl
# `--against` prints, per cuda-mem source, time(cuda-mem) / time(PyTorch) for the in-place rows
# of the same size and rank count (the target: at most 1.02). Prints which libnccl
# PyTorch loaded; point CUDA_MEM_NCCL_LIB at it to compare one NCCL against itself.
# NCCL_NVLS_ENABLE=0 unless the environment sets it (as the hosts' notes ask).
import argparse, json, os, socket, sys, time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def nccl_library():
    """The libnccl file this process mapped (PyTorch's own copy, or the system's)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libnccl" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return ""


def rank_main(rank, ranks, port, args, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=ranks, device_id=device)
    elements = (args.mib << 20) // 4
    index = torch.arange(elements, device=device, dtype=torch.int64) % 97
    mine = (index + (rank + 1)).to(torch.float32)
    want = (index * ranks + ranks * (ranks + 1) // 2).to(torch.float32)
    data = mine.clone()
    dist.all_reduce(data)
    torch.cuda.synchronize()
    verified = bool(torch.equal(data, want))
    for _ in range(args.warmup):
        dist.all_reduce(data)
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(data)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.iters
    # The mean over ranks, as nccl-tests and the Rust example report it.
    total = torch.tensor([seconds, 0.0 if verified else 1.0], device=device, dtype=torch.float64)
    dist.all_reduce(total)
    if rank == 0:
        results.put((total[0].item() / ranks, total[1].item() == 0, nccl_library()))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--against", help="JSON lines of cuda-mem-nccl's allreduce example")
    args = parser.parse_args()
    ranks = args.gpus
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(rank_main, args=(ranks, free_port(), args, results), nprocs=ranks, start_method="spawn")
    seconds, verified, library = results.get()
    nbytes = (args.mib << 20) // 4 * 4
    algbw = nbytes / seconds / 1e9
    busbw = algbw * 2 * (ranks - 1) / ranks if ranks > 1 else None
    version = torch.cuda.nccl.version()  # a tuple in recent PyTorch, an int code in older ones
    version = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    row = {
        "tool": "torch", "mode": "procs", "ranks": ranks, "source": "torch", "registered": False,
        "placement": "in-place", "bytes": nbytes, "iters": args.iters, "time_us": round(seconds * 1e6, 1),
        "algbw_gbs": round(algbw, 2), "busbw_gbs": None if busbw is None else round(busbw, 2),
        "verified": verified, "nccl": version, "nccl_lib": library, "torch": torch.__version__,
    }
    print(json.dumps(row), flush=True)
    bus = "busBw n/a: one rank (NCCL copies; 2(n-1)/n = 0)" if busbw is None else f"busBw {busbw:.2f} GB/s"
    print(f"{ranks} rank(s), torch, in place: {seconds * 1e6:.1f} us, algBw {algbw:.2f} GB/s, {bus}; "
          f"NCCL {version} from {library or 'an unknown file'}", file=sys.stderr)
    if not verified:
        print("torch_allreduce: the sums are wrong", file=sys.stderr)
        sys.exit(1)
    if args.against:
        with open(args.against) as rows:
            for line in rows:
                try:
                    ours = json.loads(line)
                except ValueError:
                    continue
                if ours.get("placement") == "in-place" and ours.get("ranks") == ranks and ours.get("bytes") == nbytes:
                    ratio = ours["time_us"] / (seconds * 1e6)
                    print(json.dumps({"ratio": "cuda-mem time / torch time", "mode": ours.get("mode"),
                                      "source": ours.get("source"), "registered": ours.get("registered"),
                                      "ranks": ranks, "bytes": nbytes, "value": round(ratio, 4)}), flush=True)


if __name__ == "__main__":
    main()
