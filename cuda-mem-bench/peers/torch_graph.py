# Peer of the `graphs` section: the `decode_graph` example's step written in PyTorch, launched
# eagerly and replayed as a CUDA graph (torch.cuda.CUDAGraph), timed the same way: the input
# copied in from pinned memory, 16 temporaries of 4096..16384+ floats from the caching allocator,
# per temporary `y = alpha * prev` then `y += beta * w` (32 kernels), the output copied back to
# pinned memory. CPU time to queue a step (before the synchronize) and wall time per step
# (synchronized every step), per step over the run. Run it in the same device call:
#     python3 torch_graph.py [--replays 100000] [--eager-steps 2000] > torch_graph.jsonl
import argparse, json, time, torch

HIDDEN, TEMPORARIES = 4096, 16
parser = argparse.ArgumentParser()
parser.add_argument("--replays", type=int, default=100_000)
parser.add_argument("--eager-steps", type=int, default=2000)
args = parser.parse_args()
torch.cuda.init()
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda}), flush=True)


def alpha(i):
    return 1.0 - 1.0 / (i + 3.0)


def beta(i):
    return 0.25 + 0.125 * (i % 3)


w = torch.rand(HIDDEN, device="cuda")
x_host = torch.rand(HIDDEN, pin_memory=True)
out_host = torch.empty(HIDDEN, pin_memory=True)
x_dev = torch.empty(HIDDEN, device="cuda")


def step():
    x_dev.copy_(x_host, non_blocking=True)
    prev = x_dev
    for i in range(TEMPORARIES):
        t = torch.empty(HIDDEN * (1 + i % 4) + 64 * i, device="cuda")[:HIDDEN]
        torch.mul(prev, alpha(i), out=t)
        t.add_(w, alpha=beta(i))
        prev = t
    out_host.copy_(prev, non_blocking=True)


def run(launch, steps):
    queue = wall = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        launch()
        queued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        queue += queued - start
        wall += done - start
    return queue / steps * 1e6, wall / steps * 1e6


side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        step()
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
eager_q, eager_w = run(step, args.eager_steps)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    step()
for _ in range(16):
    graph.replay()
torch.cuda.synchronize()
graph_q, graph_w = run(graph.replay, args.replays)
print(json.dumps({"row": "torch_eager", "queue_us_per_step": eager_q, "wall_us_per_step": eager_w,
                  "steps": args.eager_steps}), flush=True)
print(json.dumps({"row": "torch_graph", "queue_us_per_step": graph_q, "wall_us_per_step": graph_w,
                  "replays": args.replays}), flush=True)
