# The copy ceiling of async_server's work on this host: 64 copies of 16 MiB (pinned <-> device)
# one way alone, and both ways at once on two streams. Median of 7 of each, wall time per set.
import statistics, time, torch
n, size = 64, 16 << 20
up_src = [torch.empty(size, dtype=torch.uint8).pin_memory() for _ in range(n)]
down_dst = [torch.empty(size, dtype=torch.uint8).pin_memory() for _ in range(n)]
dev = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(8)]
dev2 = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(8)]
s_up, s_down = torch.cuda.Stream(), torch.cuda.Stream()

def run(up, down):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(n):
        if up:
            with torch.cuda.stream(s_up):
                dev[i % 8].copy_(up_src[i], non_blocking=True)
        if down:
            with torch.cuda.stream(s_down):
                down_dst[i].copy_(dev2[i % 8], non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - start

for name, up, down in [("h2d alone", 1, 0), ("d2h alone", 0, 1), ("both at once", 1, 1)]:
    run(up, down)
    t = statistics.median(run(up, down) for _ in range(7))
    print(f"{name}: {t*1e3:.2f} ms for {n} x 16 MiB each way used, {n*size/t/1e9:.1f} GB/s per direction")
