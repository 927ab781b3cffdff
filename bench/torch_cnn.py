#!/usr/bin/python3
"""PyTorch's training throughput for downpour's image presets (bench_cnn --torch).

The same network, batch, optimiser (Adam, lr 0.001) and thread count, data
already in memory as float tensors: prints the median samples/s of --repeats
timings of --steps steps each.  Run with Debian's /usr/bin/python3 (python3-torch)."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CnnMnist(nn.Module):
    """downpour's cnn-mnist: 1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-10."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(1, 32, 5), nn.Conv2d(32, 64, 5),
                                     nn.Linear(1024, 128), nn.Linear(128, 10)])

    def forward(self, x):
        c1, c2, d1, d2 = self.layers
        x = F.max_pool2d(F.relu(c1(x)), 2)
        x = F.max_pool2d(F.relu(c2(x)), 2)
        return d2(F.relu(d1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn-mnist")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    if a.model != "cnn-mnist":
        raise SystemExit(f"torch_cnn.py: no PyTorch version of {a.model}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = CnnMnist()
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    n = 4096
    xs = torch.rand(n, 1, 28, 28)
    ys = torch.randint(0, 10, (n,))

    def steps(k):
        t0 = time.perf_counter()
        for s in range(k):
            i = (s * a.batch) % (n - a.batch)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xs[i:i + a.batch]), ys[i:i + a.batch])
            loss.backward()
            opt.step()
        return time.perf_counter() - t0

    steps(max(1, a.steps // 4))
    times = sorted(steps(a.steps) for _ in range(a.repeats))
    print(f"{a.batch * a.steps / times[len(times) // 2]:.1f}")


if __name__ == "__main__":
    main()
