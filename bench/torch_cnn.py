#!/usr/bin/python3
"""PyTorch's training throughput for downpour's image presets (bench_cnn --torch).

cnn-mnist, resnet-fashion and vit-mnist, each the network docs/models.md
describes for the preset.

The same network, batch, optimiser (Adam, lr 0.001) and thread count, data
already in memory as float tensors (on the GPU with --device cuda): prints the median samples/s of --repeats
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


class BasicBlock(nn.Module):
    """conv3x3 p1, bn, relu, conv3x3 p1, bn, plus the shortcut, then relu."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + self.shortcut(x))


class ResnetFashion(nn.Module):
    """downpour's resnet-fashion: stem conv3x3x16 + bn + relu, three stages of two
    basic blocks (16, 32, 64 channels; stride 2 and a projection entering stages 2
    and 3), global average pooling, dense 10."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU())
        blocks, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class VitMnist(nn.Module):
    """downpour's vit-mnist: 7x7 patches (16 tokens) embedded in 64 plus learned
    positions, two pre-norm transformer blocks (4 heads, MLP 128 with GELU), a
    final layer norm, the mean over tokens, dense 10."""

    def __init__(self, width=64, heads=4, mlp=128, depth=2):
        super().__init__()
        self.patch = nn.Conv2d(1, width, 7, 7)
        self.pos = nn.Parameter(torch.zeros(1, 16, width))
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(nn.ModuleDict({
                "ln1": nn.LayerNorm(width),
                "attn": nn.MultiheadAttention(width, heads, batch_first=True),
                "ln2": nn.LayerNorm(width),
                "mlp": nn.Sequential(nn.Linear(width, mlp), nn.GELU(), nn.Linear(mlp, width)),
            }))
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 10)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        for b in self.blocks:
            h = b["ln1"](t)
            t = t + b["attn"](h, h, h, need_weights=False)[0]
            t = t + b["mlp"](b["ln2"](t))
        return self.fc(self.ln(t).mean(1))


MODELS = {"cnn-mnist": CnnMnist, "resnet-fashion": ResnetFashion, "vit-mnist": VitMnist}


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
