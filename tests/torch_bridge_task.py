"""One task of tests/test_torch_bridge.py's runs: a small torch MLP on
synthetic records, trained through downpour.torch.  Run alone (strategy
single) or as every task under `downpour launch ... -- python3 THIS`.
Each worker takes its contiguous slice of every global batch, so W
workers at batch B see together what one process sees at batch W*B; the
process that ends with the final weights (the chief, or the one process)
writes them to --out as raw float32 (and, given --extra save=PATH, its
state_dict to PATH through downpour's --save)."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import downpour.torch as dt  # noqa: E402

N, D, H, C = 512, 20, 16, 4


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D, generator=g)
    y = (x @ torch.randn(D, C, generator=g)).argmax(1)
    return x, y


def net(bn=False):
    torch.manual_seed(0)  # every task the same initial weights
    if bn:  # buffers beside the parameters: the running statistics
        return torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.BatchNorm1d(H),
                                   torch.nn.ReLU(), torch.nn.Linear(H, C))
    return torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.ReLU(), torch.nn.Linear(H, C))


class Slices(torch.utils.data.Dataset):
    """Worker w of W at batch b: records [k*W*b + w*b, ... + b) of each global batch k."""

    def __init__(self, x, y, w, workers, b):
        idx = [k * workers * b + w * b + i for k in range(N // (workers * b)) for i in range(b)]
        self.x, self.y = x[idx], y[idx]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="single")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--out")
    ap.add_argument("--bn", action="store_true", help="a BatchNorm1d after the first layer")
    ap.add_argument("--extra", nargs="*", default=[])
    ap.add_argument("--out-worker0", action="store_true", help="worker 0 writes (allreduce)")
    ap.add_argument("--kill-worker", type=int, default=-1)
    ap.add_argument("--kill-at", type=int, default=0)
    a = ap.parse_args()
    kind, index, workers = dt.task()
    if kind in ("worker", "single") and index == a.kill_worker:  # the loop's fault hook, here only
        os.environ["DOWNPOUR_FAULT_KILL_AT_STEP"] = str(a.kill_at)
    x, y = data()
    w = index if kind == "worker" else 0
    W = workers if kind in ("worker", "chief", "ps") else 1
    ds = Slices(x, y, w, W, a.batch)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=False)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256)
    model = net(a.bn)
    extra = {k: True if v == "True" else v for k, v in (e.split("=", 1) for e in a.extra)}
    dt.train(model, torch.nn.functional.cross_entropy, loader, strategy=a.strategy,
             epochs=a.epochs, lr=a.lr, val_loader=val, quiet=True, **extra)
    writer = ("worker", 0) if a.out_worker0 else None
    if a.out and (kind in ("single", "chief") or (kind, index) == writer):
        flat, _ = dt.flatten(model)
        flat.numpy().tofile(a.out)


if __name__ == "__main__":
    main()
