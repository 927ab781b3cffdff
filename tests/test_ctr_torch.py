#!/usr/bin/python3
"""Click-through checkpoints load into PyTorch (docs/models.md, "Click-through
models" and "Checkpoints and PyTorch").

A small synthetic set (`downpour data synth ctr`: 3 categorical features, the
last multi-valued, 2 numeric); two models trained briefly and saved, one of
wide-deep's shape (sum and mean bags, a residual block summing a deep MLP and
a linear part) and one of dlrm's (bags, lead layers, dot); each file loaded
into the torch modules with load_state_dict(strict=True) -- nn.EmbeddingBag
for each bag, nn.Linear for dense and lead -- and run on the test records:
its mean binary cross-entropy and its AUC (by ranks, ties averaged) equal
what `downpour eval` reports.  Exits 77 (skipped) without PyTorch."""
import json
import os
import shutil
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


def run(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"downpour {' '.join(args)}: exit {r.returncode}: {r.stderr}")
    return r.stdout


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


def read_csv(path):
    rows = [line.strip().split(",") for line in open(path)][1:]
    y = torch.tensor([int(r[0]) for r in rows], dtype=torch.float64)
    x = [[float(v) for v in r[1:]] for r in rows]
    return x, y


# ids of one feature: places [col, col + m) of each record, -1 empty
def bag_input(x, col, m):
    ids, offsets = [], []
    for r in x:
        offsets.append(len(ids))
        ids += [int(v) for v in r[col:col + m] if v >= 0]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(offsets, dtype=torch.long)


class Ctr(nn.Module):
    """bags (N, D, places, mode), then `rest` applied to [numeric, e1, ...]."""

    def __init__(self, bags, n_num):
        super().__init__()
        self.places = [b[2] for b in bags]
        self.n_num = n_num
        self.layers = nn.ModuleList(nn.EmbeddingBag(n, d, mode=mode) for n, d, _, mode in bags)

    def features(self, x):
        col, embs = 0, []
        for bag, m in zip(self.layers[:len(self.places)], self.places):
            ids, off = bag_input(x, col, m)
            embs.append(bag(ids, off))
            col += m
        num = torch.tensor([r[col:col + self.n_num] for r in x], dtype=torch.float32)
        return torch.cat([num] + embs, dim=1)


class WideDeep(Ctr):
    def __init__(self, bags, n_num, width, hidden):
        super().__init__(bags, n_num)
        self.layers.extend([nn.Linear(width, hidden), nn.Linear(hidden, 1), nn.Linear(width, 1)])

    def forward(self, x):
        f = self.features(x)
        k = len(self.places)
        deep = self.layers[k + 1](F.relu(self.layers[k](f)))
        return (deep + self.layers[k + 2](f)).squeeze(1)


class Dlrm(Ctr):
    def __init__(self, bags, n_num, bottom, top):
        super().__init__(bags, n_num)
        d = bags[0][1]
        n = len(bags) + 1
        self.layers.extend([nn.Linear(n_num, bottom), nn.Linear(bottom, d),
                            nn.Linear(d + n * (n - 1) // 2, top), nn.Linear(top, 1)])

    def forward(self, x):
        f = self.features(x)
        k = len(self.places)
        z0 = F.relu(self.layers[k + 1](self.layers[k](f[:, :self.n_num])))  # lead, lead relu
        z = torch.cat([z0, f[:, self.n_num:]], dim=1).reshape(len(x), -1, z0.shape[1])
        dots = torch.bmm(z, z.transpose(1, 2))
        i, j = torch.tril_indices(z.shape[1], z.shape[1], offset=-1)  # (1,0), (2,0), (2,1), ...
        inter = torch.cat([z0, dots[:, i, j]], dim=1)
        return self.layers[k + 3](F.relu(self.layers[k + 2](inter))).squeeze(1)


def auc(p, y):
    """By ranks, ties averaged (docs/metrics.md)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    ranks = [0.0] * len(p)
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and p[order[j]] == p[order[i]]:
            j += 1
        for q in range(i, j):
            ranks[order[q]] = (i + 1 + j) / 2
        i = j
    pos = sum(y)
    neg = len(y) - pos
    return (sum(r for r, t in zip(ranks, y) if t) - pos * (pos + 1) / 2) / (pos * neg)


def main():
    tmp = tempfile.mkdtemp(dir=os.environ.get("DOWNPOUR_TEST_TMP"))
    data = os.path.join(tmp, "ctr")
    run("data", "synth", "ctr", "--to", data, "--rows", "4000", "--test-rows", "600",
        "--categorical", "3", "--ids", "40,9,25", "--multi", "1", "--places", "3",
        "--numeric", "2", "--seed", "5")
    x, y = read_csv(os.path.join(data, "ctr-test-00000-of-00001.csv"))
    bags = [(40, 4, 1, "sum"), (9, 4, 1, "sum"), (25, 4, 3, "mean")]
    cases = [
        ("wide-deep", "7-bag40x4-bag9x4-bag25x4m3mean-res(dense8-relu-dense1|dense1)-bce",
         WideDeep(bags, 2, 14, 8)),
        ("dlrm", "7-bag40x4-bag9x4-bag25x4m3mean-lead2x8-lead8x4relu-dot4-6-dense1-bce",
         Dlrm(bags, 2, 8, 6)),
    ]
    failed = 0
    for name, spec, module in cases:
        ckpt = os.path.join(tmp, name + ".safetensors")
        metrics = os.path.join(tmp, name + ".jsonl")
        run("train", "--dataset", data, "--model", spec, "--epochs", "2", "--batch", "32",
            "--lr", "0.01",
            "--train-size", "3000", "--val-size", "1000", "--threads", "1", "--quiet",
            "--save", ckpt)
        run("eval", "--checkpoint", ckpt, "--dataset", data, "--metrics", metrics)
        done = json.loads(open(metrics).read().splitlines()[-1])
        module.load_state_dict(load_safetensors(ckpt), strict=True)
        module.eval()
        with torch.no_grad():
            z = module(x).double()
        loss = F.binary_cross_entropy_with_logits(z, y).item()
        p = torch.sigmoid(z).float().tolist()  # downpour's probabilities are floats
        a = auc(p, y.tolist())
        ok = abs(loss - done["test_log_loss"]) < 1e-5 and abs(a - done["test_auc"]) < 1e-6
        print(f"{name}: torch log loss {loss:.6f}, AUC {a:.6f}; downpour eval "
              f"{done['test_log_loss']:.6f}, {done['test_auc']:.6f}: {'ok' if ok else 'DIFFER'}")
        failed += not ok
    if not failed:
        shutil.rmtree(tmp)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
