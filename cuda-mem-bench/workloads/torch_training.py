#!/usr/bin/env python3
"""Workload (a) of the allocator corpus: PyTorch training with variable shapes, through PyTorch's
native allocator (with or without expandable segments) or through cuda-mem's pluggable allocator,
one allocator per process (it must be chosen before PyTorch's first CUDA allocation).

The model is a 6-layer GPT-like transformer written by hand (token and position embeddings,
pre-norm blocks with causal self-attention through scaled_dot_product_attention, a 4x GELU MLP, a
head tied to the token embedding), trained with bf16 autocast and a foreach AdamW. Each step draws
its batch size in [4, 16] and its sequence length among the multiples of 64 in [128, 1024] from a
seeded random.Random, and its tokens from a seeded CPU generator: every process sees the same
shapes and data, and (with deterministic algorithms, the default) computes the same losses bit for
bit whatever the allocator.

One JSON line on stdout at the end (everything else goes to stderr):

    python3 torch_training.py --allocator native                     # expandable segments if
                                                                      # PYTORCH_CUDA_ALLOC_CONF says so
    python3 torch_training.py --allocator cuda-mem --cuda-mem-python BUNDLE/python [--backend cache]
    python3 torch_training.py --allocator native --record-trace training_torch.cmwl

`--record-trace` records PyTorch's allocation trace (torch.cuda.memory._record_memory_history) and
writes it in cuda-mem-workloads' file format (`snapshot_to_workload`, importable without torch).
"""
import argparse
import ctypes
import heapq
import json
import math
import os
import random
import statistics
import struct
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the trace converter works without torch
    torch = nn = F = None

WORKLOAD_NAME = "training_torch"
FORMAT_VERSION = 1
KIND_ALLOC, KIND_FREE, KIND_FREE_ON, KIND_EMPTY_CACHE = 0, 1, 2, 3
_HEADER = struct.Struct("<4sIII")
_COUNT = struct.Struct("<Q")
_OP = struct.Struct("<BBHIQ")
DEFAULT_SEED = 1234
MAX_TRACE_ENTRIES = 10_000_000


# --------------------------------------------------------------------------------------------
# PyTorch's allocation trace -> cuda-mem-workloads' file format (no torch needed)
# --------------------------------------------------------------------------------------------

def encode_workload(name, lanes):
    """The file format of cuda-mem-workloads/src/format.rs: b"CMWL", u32 version 1, u32 lanes,
    u32 name length, the name (UTF-8); per lane a u64 op count, then 16-byte ops (u8 kind, u8 0,
    u16 lane, u32 id, u64 bytes), little-endian. `lanes` is a list of lists of (kind, id, bytes)
    or (kind, id, bytes, lane) tuples."""
    encoded_name = name.encode("utf-8")
    parts = [_HEADER.pack(b"CMWL", FORMAT_VERSION, len(lanes), len(encoded_name)), encoded_name]
    for ops in lanes:
        parts.append(_COUNT.pack(len(ops)))
        body = bytearray(_OP.size * len(ops))
        for i, op in enumerate(ops):
            kind, ident, nbytes = op[0], op[1], op[2]
            other = op[3] if len(op) > 3 else 0
            _OP.pack_into(body, i * _OP.size, kind, 0, other, ident, nbytes)
        parts.append(bytes(body))
    return b"".join(parts)


class _Ids:
    """Small ids, the smallest freed one first (as cuda-mem-workloads' `Ids`)."""

    def __init__(self):
        self.free = []
        self.next = 0
        self.high = 0

    def take(self):
        if self.free:
            return heapq.heappop(self.free)
        self.next += 1
        self.high = self.next
        return self.next - 1

    def give(self, ident):
        heapq.heappush(self.free, ident)


def snapshot_to_workload(snapshot, device=0, name=WORKLOAD_NAME, free_action=None, drop_unfreed=False,
                         log=sys.stderr):
    """Converts PyTorch's memory snapshot (torch.cuda.memory._snapshot(), recorded with
    _record_memory_history(enabled="all")) into a one-lane workload file; returns (bytes, summary).

    Only `alloc` events and the frees matter; segment events (segment_alloc/free/map/unmap),
    snapshot and oom markers are left out. The free is `free_requested` when the trace has it:
    PyTorch records it when the program lets go of the tensor (its free call), before any wait
    for other streams that used the block (record_stream), where `free_completed` comes when the
    block is back in the cache; on one stream with no record_stream the two come together, but
    `free_requested` is the one that mirrors the program, which a replay should reproduce (the
    replayed allocator decides itself when memory may be reused). Older traces without
    `free_requested` use `free_completed` (`free_action` forces either).

    Addresses become ids (an address is live from its alloc to its free; freed ids are reused
    smallest first). A free with no alloc before it in the trace (the ring of `max_entries` began
    mid-way) is dropped; so is an alloc of 0 bytes (the format needs bytes > 0) with its free.
    Allocations still live at the end of the trace (parameters, optimizer state) are freed at
    the end, so every alloc has its free; with `drop_unfreed` they are left out instead. An
    alloc at an address that is still live (a free missing from the trace) frees the older one
    first. All ops go to lane 0; more than one stream in the trace is reported on `log`."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        raise ValueError(f"the snapshot has no trace for device {device} ({len(traces)} device traces)")
    events = traces[device]
    actions = {}
    for e in events:
        actions[e["action"]] = actions.get(e["action"], 0) + 1
    if free_action is None:
        free_action = "free_requested" if actions.get("free_requested") else "free_completed"
    if free_action not in ("free_requested", "free_completed"):
        raise ValueError(f"free_action must be free_requested or free_completed, not {free_action!r}")

    # Pass 1: pair each alloc with its free (by address).
    open_at = {}          # addr -> index of the live alloc event
    freed_by = {}         # alloc index -> index of its free event, or ("before", alloc index)
    free_of = {}          # free index -> alloc index
    implicit_before = {}  # alloc index -> [alloc indices to free just before it]
    unmatched_frees = 0
    reallocated_live = 0
    zero_size = set()
    streams = set()
    for i, e in enumerate(events):
        action = e["action"]
        if action == "alloc":
            addr = int(e["addr"])
            streams.add(e.get("stream", 0))
            if int(e["size"]) <= 0:
                zero_size.add(i)
            previous = open_at.get(addr)
            if previous is not None:
                reallocated_live += 1
                freed_by[previous] = ("before", i)
                implicit_before.setdefault(i, []).append(previous)
            open_at[addr] = i
        elif action == free_action:
            addr = int(e["addr"])
            j = open_at.pop(addr, None)
            if j is None:
                unmatched_frees += 1
                continue
            freed_by[j] = i
            free_of[i] = j
    unfreed = sorted(open_at.values())

    def kept(j):
        return j not in zero_size and (not drop_unfreed or j in freed_by)

    # Pass 2: ops with small ids.
    ids = _Ids()
    id_of = {}
    ops = []
    live = peak = 0
    allocs = frees = 0
    for i, e in enumerate(events):
        action = e["action"]
        if action == "alloc":
            for j in implicit_before.get(i, ()):
                if kept(j):
                    ops.append((KIND_FREE, id_of[j], 0))
                    ids.give(id_of.pop(j))
                    live -= int(events[j]["size"])
                    frees += 1
            if not kept(i):
                continue
            ident = ids.take()
            id_of[i] = ident
            size = int(e["size"])
            ops.append((KIND_ALLOC, ident, size))
            allocs += 1
            live += size
            peak = max(peak, live)
        elif i in free_of:
            j = free_of[i]
            if not kept(j):
                continue
            ops.append((KIND_FREE, id_of[j], 0))
            ids.give(id_of.pop(j))
            live -= int(events[j]["size"])
            frees += 1
    for j in unfreed:
        if kept(j):
            ops.append((KIND_FREE, id_of[j], 0))
            ids.give(id_of.pop(j))
            live -= int(events[j]["size"])
            frees += 1
    assert not id_of and live == 0 and allocs == frees

    summary = {
        "events": len(events),
        "actions": actions,
        "free_action": free_action,
        "ops": len(ops),
        "allocs": allocs,
        "frees": frees,
        "unmatched_frees_dropped": unmatched_frees,
        "unfreed_at_end": len([j for j in unfreed if j not in zero_size]),
        "unfreed_handling": "dropped" if drop_unfreed else "freed at the end",
        "zero_size_dropped": len(zero_size),
        "reallocated_while_live": reallocated_live,
        "streams": sorted(streams),
        "ids": ids.high,
        "peak_live_bytes": peak,
    }
    if log is not None:
        if len(streams) > 1:
            print(f"warning: the trace has {len(streams)} streams ({sorted(streams)}); every op goes to lane 0",
                  file=log)
        if unmatched_frees:
            print(f"trace: {unmatched_frees} frees without an alloc in the trace dropped "
                  "(the trace began after those allocations)", file=log)
        if summary["unfreed_at_end"]:
            what = "dropped" if drop_unfreed else "freed at the end"
            print(f"trace: {summary['unfreed_at_end']} allocations still live at the end {what}", file=log)
        if zero_size:
            print(f"trace: {len(zero_size)} allocations of 0 bytes dropped", file=log)
        if reallocated_live:
            print(f"warning: {reallocated_live} allocs at a live address (a free missing from the trace): "
                  "the older allocation is freed first", file=log)
    return encode_workload(name, [ops]), summary


def write_workload_from_snapshot(snapshot, path, device=0, name=WORKLOAD_NAME, log=sys.stderr):
    data, summary = snapshot_to_workload(snapshot, device=device, name=name, log=log)
    with open(path, "wb") as f:
        f.write(data)
    summary["file_bytes"] = len(data)
    return summary


# --------------------------------------------------------------------------------------------
# The model and the loop
# --------------------------------------------------------------------------------------------

def build_model(vocab, hidden, layers, heads, max_seq):
    """A GPT-like transformer: token + position embeddings, pre-norm blocks (causal attention
    through scaled_dot_product_attention, a 4x GELU MLP), a final norm and a head tied to the
    token embedding. No biases; GPT-2's initialization (normal 0.02, residual projections scaled
    by 1/sqrt(2 layers))."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(hidden, bias=False)
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.proj = nn.Linear(hidden, hidden, bias=False)
            self.norm2 = nn.LayerNorm(hidden, bias=False)
            self.up = nn.Linear(hidden, 4 * hidden, bias=False)
            self.down = nn.Linear(4 * hidden, hidden, bias=False)

        def forward(self, x):
            b, t, d = x.shape
            qkv = self.qkv(self.norm1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab, hidden)
            self.positions = nn.Embedding(max_seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(hidden, bias=False)
            self.head = nn.Linear(hidden, vocab, bias=False)
            self.head.weight = self.tokens.weight
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                    nn.init.normal_(p, mean=0.0, std=std)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return GPT()


def draw_shapes(seed, steps, batch, seq):
    """Each step's (batch, sequence length): batch uniform in [batch[0], batch[1]], sequence
    length uniform among the multiples of 64 in [seq[0], seq[1]]."""
    rng = random.Random(seed)
    lo, hi = -(-seq[0] // 64), seq[1] // 64
    return [(rng.randint(batch[0], batch[1]), 64 * rng.randint(lo, hi)) for _ in range(steps)]


def alloc_conf():
    """PyTorch's allocator settings from the environment (PYTORCH_ALLOC_CONF is the newer name)."""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        value = os.environ.get(var)
        if value:
            return var, value
    return None, ""


def expandable_from_env():
    _, value = alloc_conf()
    for option in value.split(","):
        key, _, setting = option.partition(":")
        if key.strip() == "expandable_segments":
            return setting.strip().lower() == "true"
    return False


def set_determinism(mode):
    """strict: torch.use_deterministic_algorithms(True) (flash attention's backward then runs its
    deterministic kernel; cuBLAS needs CUBLAS_WORKSPACE_CONFIG, set before CUDA starts); warn:
    the same with warn_only (flash attention's backward stays non-deterministic); off: nothing.
    Filling uninitialized memory is turned off either way: it would add a kernel per torch.empty."""
    if mode == "off":
        return
    torch.use_deterministic_algorithms(True, warn_only=(mode == "warn"))
    try:
        # `from ... import`, not `import torch.utils.deterministic`: the latter would bind `torch`
        # as a local name of this function, unbound at the line above.
        from torch.utils import deterministic

        deterministic.fill_uninitialized_memory = False
    except (ImportError, AttributeError):
        pass


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocator", choices=("native", "cuda-mem"), default="native")
    p.add_argument("--backend", default=None,
                   help="cuda-mem's backend (cache, cache-compact, pool); default: the wrapper's default")
    p.add_argument("--cuda-mem-python", metavar="DIR", default=None,
                   help="the folder holding cuda_mem_torch.py and libcuda_mem_torch_alloc.so (else PYTHONPATH)")
    p.add_argument("--cuda-mem-hooks", default="all", metavar="all|none|SETTER,..",
                   help="which of the pluggable allocator's optional hooks to set: all (install(), the "
                        "default), none (a bare CUDAPluggableAllocator), or a comma list of the setters "
                        "in cuda_mem.torch.HOOKS; for finding what a hook costs")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup-steps", type=int, default=20, help="the first steps, left out of the step timing")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, nargs=2, default=(4, 16), metavar=("MIN", "MAX"))
    p.add_argument("--seq", type=int, nargs=2, default=(128, 1024), metavar=("MIN", "MAX"))
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--deterministic", choices=("strict", "warn", "off"), default="strict",
                   help="torch.use_deterministic_algorithms: strict (default) for bit-identical losses")
    p.add_argument("--record-trace", metavar="FILE.cmwl", default=None,
                   help="native only: record PyTorch's allocation trace and write it as a workload file")
    p.add_argument("--trace-entries", type=int, default=MAX_TRACE_ENTRIES)
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke test of the loop")
    args = p.parse_args(argv)
    if args.record_trace and args.allocator != "native":
        p.error("--record-trace needs --allocator native (the trace is PyTorch's allocator's)")
    if args.backend and args.allocator != "cuda-mem":
        p.error("--backend is cuda-mem's")
    if args.cuda_mem_hooks != "all" and args.allocator != "cuda-mem":
        p.error("--cuda-mem-hooks is cuda-mem's")
    if args.steps < 1 or args.warmup_steps < 0:
        p.error("--steps must be >= 1 and --warmup-steps >= 0")
    if args.seq[0] < 64 or args.seq[1] < args.seq[0] or -(-args.seq[0] // 64) > args.seq[1] // 64:
        p.error("--seq must hold a multiple of 64 (>= 64)")
    return args


def install_cuda_mem(args):
    if args.cuda_mem_python:
        sys.path.insert(0, os.path.abspath(args.cuda_mem_python))
    import cuda_mem_torch

    if args.cuda_mem_hooks == "all":
        kwargs = {"backend": args.backend} if args.backend else {}
        alloc = cuda_mem_torch.install(**kwargs)
        print(f"cuda-mem: {alloc.path}, backend {alloc.backend}; hooks PyTorch lacks: {alloc.missing_hooks}",
              file=sys.stderr)
        return alloc
    return install_with_hooks(cuda_mem_torch, args.backend, args.cuda_mem_hooks)


def install_with_hooks(module, backend, hooks):
    """cuda-mem's allocator installed with only the named optional hooks ("none": a bare
    CUDAPluggableAllocator), through the module's own steps otherwise."""
    wanted = set() if hooks == "none" else set(hooks.split(","))
    known = {setter for setter, _ in module.HOOKS}
    if wanted - known:
        sys.exit(f"--cuda-mem-hooks: unknown setters {sorted(wanted - known)}; known: {sorted(known)}")
    alloc = module.Allocator()
    if alloc.lib.cuda_mem_torch_check_conf() != 0:
        sys.exit(f"CUDA_MEM_TORCH_ALLOC_CONF: {alloc.last_error()}")
    if backend:
        alloc.select_backend(backend)
    else:
        alloc.backend = module._conf_backend()
    alloc.torch_allocator = torch.cuda.memory.CUDAPluggableAllocator(
        alloc.path, "cuda_mem_torch_alloc", "cuda_mem_torch_free")
    native = alloc.torch_allocator.allocator()
    for setter, function in module.HOOKS:
        if setter in wanted:
            getattr(native, setter)(ctypes.cast(getattr(alloc.lib, function), ctypes.c_void_p).value)
    torch.cuda.memory.change_current_allocator(alloc.torch_allocator)
    print(f"cuda-mem: {alloc.path}, backend {alloc.backend}; hooks set: {sorted(wanted) or 'none'}", file=sys.stderr)
    return alloc


def start_trace(args, device):
    """Records every alloc and free (no stack traces: context=None). Checks with a probe tensor
    that the trace gets events; if not, records with context="alloc" (stack traces at allocs, slower)."""
    mem = torch.cuda.memory
    mem._record_memory_history(enabled="all", context=None, stacks="python", max_entries=args.trace_entries)
    probe = torch.empty(1, device=device)
    del probe
    events = mem._snapshot()["device_traces"][device.index or 0]
    if not any(e["action"] == "alloc" for e in events):
        print("warning: no trace events with context=None; recording with context='alloc'", file=sys.stderr)
        mem._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=args.trace_entries)
        return "alloc"
    return None


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if torch is None:
        sys.exit("torch_training.py: PyTorch is not installed")
    on_cuda = args.device.startswith("cuda")
    if args.deterministic != "off":
        # cuBLAS reads it when its handle is made: before PyTorch's first matmul.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    alloc = None
    conf_var, conf = alloc_conf()
    if args.allocator == "cuda-mem":
        if conf:
            print(f"warning: {conf_var}={conf} is set; cuda-mem's allocator ignores it", file=sys.stderr)
        alloc = install_cuda_mem(args)  # before any CUDA allocation
        label = f"cuda_mem:{alloc.backend}"
        if args.cuda_mem_hooks != "all":
            label += f" (hooks: {args.cuda_mem_hooks})"
    else:
        label = "torch_expandable" if expandable_from_env() else "torch_native"
    print(f"allocator {label}; {conf_var or 'PYTORCH_CUDA_ALLOC_CONF'}={conf!r}; torch {torch.__version__}",
          file=sys.stderr)

    device = torch.device(args.device)
    if on_cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    set_determinism(args.deterministic)
    trace_context = None
    if args.record_trace:
        if not on_cuda:
            sys.exit("--record-trace needs CUDA")
        trace_context = start_trace(args, device)

    started = time.perf_counter()
    torch.manual_seed(args.seed)
    shapes = draw_shapes(args.seed, args.steps, args.batch, args.seq)
    model = build_model(args.vocab, args.hidden, args.layers, args.heads, max(t for _, t in shapes))
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    data = torch.Generator().manual_seed(args.seed + 1)
    autocast_device = "cuda" if on_cuda else "cpu"

    def sync():
        if on_cuda:
            torch.cuda.synchronize(device)

    losses, times = [], []
    sync()
    for step, (b, t) in enumerate(shapes):
        start = time.perf_counter()
        tokens = torch.randint(0, args.vocab, (b, t + 1), generator=data).to(device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        with torch.autocast(autocast_device, dtype=torch.bfloat16):
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del tokens, inputs, targets, logits
        losses.append(loss.item())
        del loss
        sync()
        if step >= args.warmup_steps:
            times.append(time.perf_counter() - start)
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step}: batch {b}, length {t}, loss {losses[-1]:.6f}", file=sys.stderr)
    sync()
    run_s = time.perf_counter() - started

    result = {
        "workload": "training",
        "allocator": label,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "timed_steps": len(times),
        "step_ms_median": statistics.median(times) * 1e3 if times else None,
        "step_ms_mean": statistics.fmean(times) * 1e3 if times else None,
        "step_ms_min": min(times) * 1e3 if times else None,
        "step_ms_max": max(times) * 1e3 if times else None,
        "run_s": run_s,
    }
    notes = []
    if not on_cuda:
        result.update(peak_allocated_bytes=None, peak_reserved_bytes=None, peak_requested_bytes=None,
                      num_alloc_retries=None)
        notes.append(f"ran on {args.device}: no memory figures")
    elif alloc is None:
        stats = torch.cuda.memory_stats(device)
        result.update(
            peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
            peak_reserved_bytes=torch.cuda.max_memory_reserved(device),
            peak_requested_bytes=stats.get("requested_bytes.all.peak"),
            num_alloc_retries=stats.get("num_alloc_retries"),
            num_ooms=stats.get("num_ooms"),
            num_device_alloc=stats.get("num_device_alloc"),
            num_device_free=stats.get("num_device_free"),
        )
        notes.append("peak_allocated_bytes counts PyTorch's block sizes (rounded up to 512 B); "
                     "peak_requested_bytes the sizes asked for")
    else:
        stats = alloc.stats(device.index or 0)
        result.update(
            peak_allocated_bytes=stats["allocated_peak"],
            peak_reserved_bytes=stats["reserved_peak"],
            peak_requested_bytes=stats["allocated_peak"],
            num_alloc_retries=None,
            cuda_mem_stats=stats,
        )
        notes.append("cuda-mem counts the bytes PyTorch asks for: peak_allocated_bytes = peak_requested_bytes "
                     "= its allocated_peak (compare with native's peak_requested_bytes); num_alloc_retries has "
                     "no cuda-mem counterpart (null; its failed_count is in cuda_mem_stats)")
    peak_alloc, peak_res, peak_req = (result.get(k) for k in
                                      ("peak_allocated_bytes", "peak_reserved_bytes", "peak_requested_bytes"))
    result["reserved_over_allocated"] = peak_res / peak_alloc if peak_alloc and peak_res is not None else None
    result["reserved_over_requested"] = peak_res / peak_req if peak_req and peak_res is not None else None

    snapshot = None
    if args.record_trace:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    if on_cuda and alloc is None:
        # A cross-check of the label: the allocator's own setting, and its segments' kind.
        try:
            snap = snapshot if snapshot is not None else torch.cuda.memory._snapshot()
            setting = (snap.get("allocator_settings") or {}).get("expandable_segments")
            result["expandable_segments_setting"] = setting
            flags = [s.get("is_expandable") for s in snap.get("segments", [])]
            result["expandable_segments_seen"] = any(flags) if flags and None not in flags else None
            if setting is not None and bool(setting) != (label == "torch_expandable"):
                print(f"warning: the allocator says expandable_segments={setting}, the label is {label}",
                      file=sys.stderr)
        except Exception as err:
            print(f"warning: no snapshot to check expandable segments: {err}", file=sys.stderr)
    if args.record_trace:
        if snapshot["device_traces"] and len(snapshot["device_traces"][device.index or 0]) >= args.trace_entries:
            print("warning: the trace filled its ring (--trace-entries): its start is lost", file=sys.stderr)
        summary = write_workload_from_snapshot(snapshot, args.record_trace, device=device.index or 0)
        summary["file"] = args.record_trace
        summary["context"] = trace_context
        result["recording"] = True
        result["trace"] = summary
        print(f"trace: {json.dumps(summary)}", file=sys.stderr)
    snap = snapshot = None  # the trace's dicts can be large

    with torch.no_grad():
        weights = sum(p.detach().double().abs().sum().item() for p in model.parameters())
    result.update(
        final_loss=losses[-1],
        loss_checksum=float(sum(losses)),
        weights_checksum=weights,
        deterministic=args.deterministic,
        shapes_checksum=sum((i + 1) * b * t for i, (b, t) in enumerate(shapes)),
        tokens=sum(b * t for b, t in shapes),
        seed=args.seed,
        torch=torch.__version__,
        device_name=torch.cuda.get_device_name(device) if on_cuda else args.device,
    )
    if notes:
        result["note"] = "; ".join(notes)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
