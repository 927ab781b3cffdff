#!/usr/bin/env python3
"""PyTorch's GPU training throughput for downpour's GPU presets (docs/gpu.md).

The same network, batch (128), optimiser (Adam, lr 0.001, Keras's betas
0.9/0.999 and eps 1e-7), softmax cross-entropy and 54,000 training records,
with the data already on the device: MNIST from $DOWNPOUR_DATA/mnist (the
IDX files) when present, else random MNIST-shaped data.  One warm-up epoch
is not counted; the clock reads after torch.cuda.synchronize().  Prints

  torch_mlp_gpu: samples_per_second=... train_seconds=... device=<name>

and a line of details, and writes both to $OUT/torch_<model>.txt when OUT is
set.  Products and convolutions in FP32 (no TF32) unless --tf32."""
import argparse
import gzip
import os
import struct
import sys
import time

RECORDS = 54000


def read_idx(path):
    """An IDX file's dimensions and its bytes (plain or .gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    if magic >> 8 != 0x08:  # unsigned bytes
        raise ValueError(f"{path}: not an IDX file of bytes (magic {magic:#x})")
    ndim = magic & 0xFF
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    count = 1
    for d in dims:
        count *= d
    if len(body) != count:
        raise ValueError(f"{path}: {len(body)} bytes of data, the header says {count}")
    return dims, body


def find_mnist(root):
    """The train images and labels under root/mnist, or None."""
    d = os.path.join(root, "mnist")
    for suffix in ("", ".gz"):
        img = os.path.join(d, "train-images-idx3-ubyte" + suffix)
        lab = os.path.join(d, "train-labels-idx1-ubyte" + suffix)
        if os.path.exists(img) and os.path.exists(lab):
            return img, lab
    return None


def load(args, torch, dev):
    """(x, y, source) on dev: x (n, 784) float32 in [0, 1], y (n,) int64."""
    n = args.limit
    found = None if args.random else find_mnist(args.data)
    if found:
        (rows, h, w), img = read_idx(found[0])
        (lrows,), lab = read_idx(found[1])
        if rows < n or lrows < n or h * w != 784:
            raise SystemExit(f"torch_mlp_gpu: {found[0]} holds {rows} images of {h}x{w}; need {n} of 28x28")
        x = torch.frombuffer(bytearray(img[:n * 784]), dtype=torch.uint8).reshape(n, 784)
        y = torch.frombuffer(bytearray(lab[:n]), dtype=torch.uint8).long()
        return x.to(dev).float().div_(255.0), y.to(dev), "mnist"
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.rand(n, 784, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return x.to(dev), y.to(dev), "random"


def build(model, nn):
    if model == "mlp":
        return nn.Sequential(nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(),
                             nn.Linear(100, 10))
    if model == "cnn-mnist":
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                             nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10))
    raise SystemExit(f"torch_mlp_gpu: no model {model} (mlp, cnn-mnist)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn-mnist"])
    ap.add_argument("--epochs", type=int, default=25)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--limit", type=int, default=RECORDS, help="training records (54000)")
    ap.add_argument("--data", default=os.environ.get("DOWNPOUR_DATA", "data"))
    ap.add_argument("--random", action="store_true", help="random data even where MNIST is")
    ap.add_argument("--tf32", action="store_true", help="let products and convolutions use TF32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.epochs < 1 or args.batch < 1 or args.limit < 1:
        raise SystemExit("torch_mlp_gpu: --epochs, --batch and --limit must be positive")

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("torch_mlp_gpu: torch sees no GPU (use --device cpu)")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(args.seed)
    x, y, source = load(args, torch, dev)
    net = build(args.model, nn).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-7)
    n = x.shape[0]

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def epoch():
        perm = torch.randperm(n, device=dev)
        total = torch.zeros((), device=dev)
        for s in range(0, n, args.batch):  # the last batch may be short, as Keras does
            idx = perm[s:s + args.batch]
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach() * idx.numel()
        return total

    epoch()  # warm-up: kernels chosen, memory pools filled; not counted
    sync()
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        total = epoch()
    sync()
    seconds = time.perf_counter() - t0
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    lines = [
        f"torch_mlp_gpu: samples_per_second={args.epochs * n / seconds:.0f} train_seconds={seconds:.3f} device={name}",
        f"torch_mlp_gpu: model={args.model} epochs={args.epochs} batch={args.batch} records={n} data={source} "
        f"tf32={int(args.tf32)} last_epoch_loss={total.item() / n:.4f} torch={torch.__version__}",
    ]
    print("\n".join(lines), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"torch_{args.model}.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
