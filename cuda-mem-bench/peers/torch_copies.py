# Peer of the `staged` section: what a PyTorch user gets copying ordinary (pageable) host memory
# to and from the GPU, `device.copy_(host)` and `host.copy_(device)` into tensors allocated once,
# 256 MiB and 1 GiB, the median of 7 timed copies after one untimed, as `staged_tuning` times
# cuda-mem's StagedCopier and the driver's pageable path. Run it in the same device call:
#     python3 torch_copies.py > torch_copies.jsonl
import json, time, torch

torch.cuda.init()
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda}), flush=True)


def gbs(nbytes, copy):
    copy()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        copy()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return nbytes / sorted(times)[3] / 1e9


for mib in [256, 1024]:
    nbytes = mib << 20
    host = torch.ones(nbytes, dtype=torch.uint8)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = gbs(nbytes, lambda: device.copy_(host))
    d2h = gbs(nbytes, lambda: host.copy_(device))
    print(json.dumps({"row": f"torch_pageable_h2d_{mib}m", "gbs": h2d}), flush=True)
    print(json.dumps({"row": f"torch_pageable_d2h_{mib}m", "gbs": d2h}), flush=True)
