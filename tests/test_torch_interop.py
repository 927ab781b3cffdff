#!/usr/bin/python3
"""Checkpoints load into PyTorch directly (docs/models.md, "Checkpoints and PyTorch").

Trains two image models briefly with downpour on a small synthetic IDX
dataset, saves them with --save, loads each into a PyTorch module with
load_state_dict(strict=True) and checks that PyTorch's test accuracy and loss
equal what `downpour eval` reports.  The second model has a locally connected
layer, applied in PyTorch with unfold and the documented (oh, ow, oc, c, kh, kw)
layout.  Exits 77 (skipped) when PyTorch is not installed."""
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("skipped: PyTorch is not installed for", sys.executable)
    sys.exit(77)

BIN = os.environ.get("DOWNPOUR_BIN", "downpour")


def write_idx(d, n_train, n_test):
    """A 4-class set: a bright 6x6 square in one quadrant, plus noise."""
    rng = random.Random(5)

    def images(n, path_img, path_lbl):
        img = bytearray(struct.pack(">IIII", 0x803, n, 28, 28))
        lbl = bytearray(struct.pack(">II", 0x801, n))
        for _ in range(n):
            c = rng.randrange(4)
            px = [rng.randrange(60) for _ in range(784)]
            y0, x0 = (3 + 14 * (c // 2) + rng.randrange(4), 3 + 14 * (c % 2) + rng.randrange(4))
            for y in range(y0, y0 + 6):
                for x in range(x0, x0 + 6):
                    px[y * 28 + x] = 200 + rng.randrange(56)
            img += bytes(px)
            lbl.append(c)
        open(os.path.join(d, path_img), "wb").write(img)
        open(os.path.join(d, path_lbl), "wb").write(lbl)
        return img, lbl

    images(n_train, "train-images-idx3-ubyte", "train-labels-idx1-ubyte")
    return images(n_test, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def load_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + e]),
                                     dtype=torch.float32).reshape(t["shape"])
    return out


class CnnMnist(nn.Module):
    """1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-10 (4 classes here)."""

    def __init__(self, classes):
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(1, 32, 5), nn.Conv2d(32, 64, 5),
                                     nn.Linear(1024, 128), nn.Linear(128, classes)])

    def forward(self, x):
        c1, c2, d1, d2 = self.layers
        x = F.max_pool2d(F.relu(c1(x)), 2)
        x = F.max_pool2d(F.relu(c2(x)), 2)
        return d2(F.relu(d1(x.flatten(1))))


class Local2d(nn.Module):
    """Locally connected: weight (oh, ow, oc, c, kh, kw), bias (oh, ow, oc)."""

    def __init__(self, c, oc, k, stride, out_hw):
        super().__init__()
        self.k, self.stride = k, stride
        self.weight = nn.Parameter(torch.zeros(out_hw, out_hw, oc, c, k, k))
        self.bias = nn.Parameter(torch.zeros(out_hw, out_hw, oc))

    def forward(self, x):
        oh, ow, oc = self.bias.shape
        cols = F.unfold(x, self.k, stride=self.stride)        # (b, c*k*k, oh*ow)
        w = self.weight.reshape(oh * ow, oc, -1)               # (p, oc, c*k*k)
        y = torch.einsum("bkp,pok->bop", cols, w) + self.bias.reshape(oh * ow, oc).t()
        return y.reshape(x.shape[0], oc, oh, ow)


class LocalNet(nn.Module):
    """1x28x28-local5x5x4s2-relu-conv3x3x8p1-relu-avgpool2-4."""

    def __init__(self, classes):
        super().__init__()
        self.layers = nn.ModuleList([Local2d(1, 4, 5, 2, 12), nn.Conv2d(4, 8, 3, padding=1),
                                     nn.Linear(8 * 6 * 6, classes)])

    def forward(self, x):
        l1, c2, d3 = self.layers
        x = F.relu(l1(x))
        x = F.avg_pool2d(F.relu(c2(x)), 2)
        return d3(x.flatten(1))


def check(d, spec, module, test_img, test_lbl):
    path = os.path.join(d, "model.safetensors")
    subprocess.run([BIN, "train", "--dataset", d, "--model", spec, "--epochs", "1", "--lr", "0.0002",
                    "--train-size", "400", "--val-size", "100", "--batch", "50", "--save", path,
                    "--quiet", "--no-progress", "--threads", "1"], check=True)
    ev = subprocess.run([BIN, "eval", "--checkpoint", path, "--dataset", d],
                        check=True, capture_output=True, text=True)
    acc = float(ev.stdout.split()[-1])
    m = re.search(r"test loss ([0-9.]+)", ev.stderr)
    assert m, ev.stderr
    loss = float(m.group(1))

    state = {k: v for k, v in load_safetensors(path).items() if k.startswith("layers.")}
    module.load_state_dict(state, strict=True)
    n = len(test_lbl) - 8
    x = torch.frombuffer(bytearray(test_img[16:]), dtype=torch.uint8).float().div(255)
    x = x.reshape(n, 1, 28, 28)
    y = torch.frombuffer(bytearray(test_lbl[8:]), dtype=torch.uint8).long()
    with torch.no_grad():
        logits = module(x)
    t_acc = (logits.argmax(1) == y).float().mean().item()
    t_loss = F.cross_entropy(logits, y).item()
    ok = abs(t_acc - acc) < 1e-4 + 1.0 / n and abs(t_loss - loss) < 2e-4
    print(f"{spec}: downpour accuracy {acc:.4f} loss {loss:.4f}; "
          f"PyTorch accuracy {t_acc:.4f} loss {t_loss:.4f}: {'same' if ok else 'DIFFERENT'}")
    return ok


def main():
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOWNPOUR_TEST_TMP")) as d:
        test_img, test_lbl = write_idx(d, 500, 200)
        ok = check(d, "1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-4",
                   CnnMnist(4), test_img, test_lbl)
        ok &= check(d, "1x28x28-local5x5x4s2-relu-conv3x3x8p1-relu-avgpool2-4", LocalNet(4),
                    test_img, test_lbl)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
