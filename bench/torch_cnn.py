#!/usr/bin/python3
"""PyTorch's training throughput for downpour's image presets (bench_cnn --torch).

cnn-mnist, resnet-fashion and vit-mnist, each the network docs/models.md
describes for the preset (python/downpour/nets.py, as downpour.to_torch
builds it).

The same network, batch, optimiser (Adam, lr 0.001) and thread count, data
already in memory as float tensors (on the GPU with --device cuda): prints the median samples/s of --repeats
timings of --steps steps each.  Run with Debian's /usr/bin/python3 (python3-torch)."""
import argparse
import time

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from downpour import nets  # noqa: E402


# The same modules downpour.to_torch gives (python/downpour/nets.py): one
# definition of each network for the interop tests and this benchmark.
MODELS = {"cnn-mnist": lambda: nets.CnnMnist(10), "resnet-fashion": nets.ResnetFashion,
          "vit-mnist": nets.VitMnist}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn-mnist")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    a = ap.parse_args()
    if a.model not in MODELS:
        raise SystemExit(f"torch_cnn.py: no PyTorch version of {a.model}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    dev = torch.device(a.device)
    model = MODELS[a.model]().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    n = 4096
    xs = torch.rand(n, 1, 28, 28, device=dev)
    ys = torch.randint(0, 10, (n,), device=dev)
    # A GPU runs the steps asynchronously: the clock is read once they are done.
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def steps(k):
        sync()
        t0 = time.perf_counter()
        for s in range(k):
            i = (s * a.batch) % (n - a.batch)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xs[i:i + a.batch]), ys[i:i + a.batch])
            loss.backward()
            opt.step()
        sync()
        return time.perf_counter() - t0

    steps(max(1, a.steps // 4))
    times = sorted(steps(a.steps) for _ in range(a.repeats))
    print(f"{a.batch * a.steps / times[len(times) // 2]:.1f}")


if __name__ == "__main__":
    main()
