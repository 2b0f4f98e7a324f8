#!/usr/bin/env python3
"""Sleep and wake under PyTorch as RL post-training uses them: an inference engine (a policy's
weights tagged "engine-weights", its KV cache "engine-kv", a CUDA graph of its forward captured
once) and a trainer share the GPU. Each step trains the trainer's copy of the policy while the
engine sleeps (weights kept in pinned host memory, KV cache dropped), wakes the engine, copies the
new weights into it in place and runs the captured graph.

    python3 torch_sleep_wake.py [--steps N] [--width W] [--layers L] [--check]

Prints per step the device memory the sleep gave back and the sleep and wake times (for the
record: speed is measured in the bench, not here). With --check the same loop runs a second time
from the same seeds without sleeping, and the script prints "results identical: True" when the
losses and the engine's outputs are bit-identical (exit status 1 otherwise).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cuda_mem.torch as cmt  # noqa: E402 - the allocator must be installed before torch allocates

cmt.install()
import torch  # noqa: E402


def policy(width, layers):
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width, device="cuda"), torch.nn.GELU()]
    return torch.nn.Sequential(*blocks)


def used():
    free, total = torch.cuda.mem_get_info()
    return total - free


def run(steps, width, layers, sleeping):
    torch.manual_seed(0)
    trainer = policy(width, layers)
    optimizer = torch.optim.Adam(trainer.parameters(), lr=1e-4)
    with cmt.region("engine-weights"):
        engine = policy(width, layers)
        engine.load_state_dict(trainer.state_dict())
    with cmt.region("engine-kv"):
        kv = torch.zeros(64, 1024, width, device="cuda")
    prompt = torch.zeros(32, width, device="cuda")
    # The engine's forward, captured once; replays read the weights at their addresses.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        engine(prompt)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        answer = engine(prompt)
    losses, outputs, records = [], [], []
    for step in range(steps):
        batch = torch.randn(256, width, device="cuda")
        record = {"step": step}
        if sleeping:
            before = used()
            start = time.perf_counter()
            cmt.sleep("engine-weights")
            cmt.sleep("engine-kv", offload=False)
            record["sleep_s"] = time.perf_counter() - start
            record["given_back"] = before - used()
        loss = trainer(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
        if sleeping:
            start = time.perf_counter()
            cmt.wake()
            record["wake_s"] = time.perf_counter() - start
        with torch.no_grad():
            for mine, theirs in zip(engine.parameters(), trainer.parameters()):
                mine.copy_(theirs)
            prompt.copy_(batch[:32])
            graph.replay()
            kv[step % kv.shape[0]].zero_()[: answer.shape[0]].copy_(answer)
        outputs.append(answer.clone())
        records.append(record)
    torch.cuda.synchronize()
    del graph, engine, kv
    return torch.stack(losses).cpu(), torch.stack(outputs).cpu(), records


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--check", action="store_true", help="compare with a run that does not sleep")
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    losses, outputs, records = run(args.steps, args.width, args.layers, sleeping=True)
    for record in records:
        print(json.dumps(record))
    print(json.dumps({"regions": cmt.region_stats()}))
    if args.check:
        plain_losses, plain_outputs, _ = run(args.steps, args.width, args.layers, sleeping=False)
        identical = torch.equal(losses, plain_losses) and torch.equal(outputs, plain_outputs)
        print(f"results identical: {identical}")
        return 0 if identical else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
