#!/usr/bin/python3
"""Checkpoints load into PyTorch directly (docs/models.md, "Checkpoints and PyTorch").

Each preset below trains a model briefly with downpour, saves it with --save,
loads it into the equivalent torch.nn module with load_state_dict(strict=True)
and checks, with the module in eval mode (batch norm on its running
statistics):
- the test accuracy and mean loss equal what `downpour eval` reports;
- the log-softmax of a few records equals downpour's, class by class: a probe
  dataset holds each record once per label, and `downpour eval --test-size k`
  for k = 1, 2, ... gives each (record, label) loss, -log p_label, by
  differences.

Presets: mlp-bn on MNIST (batch norm over features), a conv + bn model
(BatchNorm2d after a conv), cnn-mnist's layers and a locally connected model
(applied with unfold and the documented (oh, ow, oc, c, kh, kw) layout), the
others on a small synthetic 4-class set.  A new preset is one function
decorated with @preset that returns a Case.  resnet-fashion (residual blocks,
BatchNorm2d, projection shortcuts) and vit-mnist (patches, positions, layer
norm over tokens, nn.MultiheadAttention, GELU) train on the same set.  Exits 77 (skipped) when PyTorch is not
installed; a preset on a dataset that is not there is skipped alone."""
import gzip
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("skipped: PyTorch is not installed for", sys.executable)
    sys.exit(77)

BIN = os.environ.get("DOWNPOUR_BIN", "downpour")
DATA = os.environ.get("DOWNPOUR_DATA", "data")
PROBE_RECORDS = 2  # records whose log-softmax is compared class by class


# ------------------------------------------------------------------ data

def read_idx(path):
    """An IDX file (plain or .gz) as (raw bytes after the header, dims)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return raw[4 + 4 * ndim:], dims


def find_idx(d, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return None


def write_idx(d, prefix, images, labels):
    """IDX files of 28x28 images (bytes, 784 a record) and labels."""
    n = len(labels)
    with open(os.path.join(d, prefix + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(images))
    with open(os.path.join(d, prefix + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))


def quadrants(d, n_train, n_test):
    """A 4-class set: a bright 6x6 square in one quadrant, plus noise."""
    g = torch.Generator().manual_seed(5)

    def records(n):
        c = torch.randint(4, (n,), generator=g)
        px = torch.randint(60, (n, 28, 28), generator=g)
        y0 = 3 + 14 * (c // 2) + torch.randint(4, (n,), generator=g)
        x0 = 3 + 14 * (c % 2) + torch.randint(4, (n,), generator=g)
        bright = 200 + torch.randint(56, (n, 28, 28), generator=g)
        rows, cols = torch.arange(28).view(1, 28, 1), torch.arange(28).view(1, 1, 28)
        square = ((rows >= y0.view(n, 1, 1)) & (rows < y0.view(n, 1, 1) + 6) &
                  (cols >= x0.view(n, 1, 1)) & (cols < x0.view(n, 1, 1) + 6))
        px = torch.where(square, bright, px)
        return px.to(torch.uint8).flatten().tolist(), c.tolist()

    write_idx(d, "train", *records(n_train))
    write_idx(d, "t10k", *records(n_test))


def test_split(d):
    """The dataset directory's test images (n, 1, 28, 28) in [0, 1] and labels."""
    img, dims = read_idx(find_idx(d, "t10k-images-idx3-ubyte"))
    lbl, _ = read_idx(find_idx(d, "t10k-labels-idx1-ubyte"))
    n = dims[0]
    x = torch.frombuffer(bytearray(img), dtype=torch.uint8).float().div(255)
    return x.reshape(n, 1, 28, 28), torch.frombuffer(bytearray(lbl), dtype=torch.uint8).long()


def load_safetensors(path):
    """A safetensors file read in plain Python: a JSON header, then raw
    little-endian floats."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        b, e = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + e]),
                                     dtype=torch.float32).reshape(t["shape"])
    return out


# --------------------------------------------------------------- modules

class MlpBn(nn.Module):
    """mlp-bn: 784-dense300-bn-relu-dense100-bn-relu-10."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(784, 300), nn.BatchNorm1d(300),
                                     nn.Linear(300, 100), nn.BatchNorm1d(100),
                                     nn.Linear(100, 10)])

    def forward(self, x):
        d1, b1, d2, b2, d3 = self.layers
        x = F.relu(b1(d1(x.flatten(1))))
        return d3(F.relu(b2(d2(x))))


class ConvBn(nn.Module):
    """1x28x28-conv5x5x8s2-bn-relu-maxpool2-dense32-bn-relu-4."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(1, 8, 5, stride=2), nn.BatchNorm2d(8),
                                     nn.Linear(8 * 6 * 6, 32), nn.BatchNorm1d(32),
                                     nn.Linear(32, 4)])

    def forward(self, x):
        c1, b1, d2, b2, d3 = self.layers
        x = F.max_pool2d(F.relu(b1(c1(x))), 2)
        return d3(F.relu(b2(d2(x.flatten(1)))))


class CnnMnist(nn.Module):
    """1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-<classes>."""

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

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Local2d(1, 4, 5, 2, 12), nn.Conv2d(4, 8, 3, padding=1),
                                     nn.Linear(8 * 6 * 6, 4)])

    def forward(self, x):
        l1, c2, d3 = self.layers
        x = F.relu(l1(x))
        x = F.avg_pool2d(F.relu(c2(x)), 2)
        return d3(x.flatten(1))


def conv_then_bn(c_in, c_out, k, stride):
    """A conv then a bn, as the spec's conv...-bn (padding k // 2)."""
    return [nn.Conv2d(c_in, c_out, k, stride, padding=k // 2), nn.BatchNorm2d(c_out)]


class ResnetFashion(nn.Module):
    """resnet-fashion (docs/models.md): parameter layers layers.{i} in spec
    order, a block's main branch (conv, bn, conv, bn) then its projection
    shortcut's (conv, bn)."""

    def __init__(self):
        super().__init__()
        layers, self.blocks = conv_then_bn(1, 16, 3, 1), []
        c_in = 16
        for c, stride in [(16, 1), (16, 1), (32, 2), (32, 1), (64, 2), (64, 1)]:
            first = len(layers)
            layers += conv_then_bn(c_in, c, 3, stride) + conv_then_bn(c, c, 3, 1)
            if stride != 1:
                layers += conv_then_bn(c_in, c, 1, stride)
            self.blocks.append((first, stride != 1))
            c_in = c
        self.layers = nn.ModuleList(layers + [nn.Linear(64, 10)])

    def forward(self, x):
        L = self.layers
        x = F.relu(L[1](L[0](x)))
        for i, proj in self.blocks:
            y = L[i + 3](L[i + 2](F.relu(L[i + 1](L[i](x)))))
            x = F.relu(y + (L[i + 5](L[i + 4](x)) if proj else x))
        return L[-1](x.mean((2, 3)))


class PosEmbedding(nn.Module):
    """pos: a learned (1, T, D) added to the tokens."""

    def __init__(self, T, D):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.zeros(1, T, D))

    def forward(self, t):
        return t + self.pos_embedding


class VitMnist(nn.Module):
    """vit-mnist (docs/models.md): patches by a strided conv, positions, two
    pre-norm blocks (ln, mha4, residual; ln, 1x1 conv 128, gelu, 1x1 conv 64,
    residual), ln, the mean over tokens, dense 10; tokens in NHWC order."""

    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(1, 64, 7, stride=7), PosEmbedding(16, 64)]
        for _ in range(2):
            layers += [nn.LayerNorm(64), nn.MultiheadAttention(64, 4, batch_first=True),
                       nn.LayerNorm(64), nn.Conv2d(64, 128, 1), nn.Conv2d(128, 64, 1)]
        self.layers = nn.ModuleList(layers + [nn.LayerNorm(64), nn.Linear(64, 10)])

    def forward(self, x):
        L = self.layers
        t = L[1](L[0](x).flatten(2).transpose(1, 2))       # (batch, 16, 64)
        for i in (2, 7):
            h = L[i](t)
            t = t + L[i + 1](h, h, h, need_weights=False)[0]
            h = L[i + 2](t).transpose(1, 2).reshape(-1, 64, 4, 4)
            h = L[i + 4](F.gelu(L[i + 3](h)))
            t = t + h.flatten(2).transpose(1, 2)
        return L[13](L[12](t).mean(1))


# --------------------------------------------------------------- presets

@dataclass
class Case:
    name: str
    model: str            # downpour's --model: a preset or a spec
    dataset: str          # a directory of IDX files
    module: nn.Module     # the torch.nn equivalent, named layers.{i} as the file
    classes: int
    train_args: list = field(default_factory=list)


PRESETS = []


def preset(fn):
    """Registers a preset: fn(tmp) returns a Case, or None to skip (saying why)."""
    PRESETS.append(fn)
    return fn


def quadrant_dir(tmp):
    d = os.path.join(tmp, "quadrants")
    if not os.path.isdir(d):
        os.mkdir(d)
        quadrants(d, 500, 200)
    return d


QUADRANT_TRAIN = ["--train-size", "400", "--val-size", "100", "--batch", "50", "--lr", "0.0002"]


@preset
def mlp_bn(tmp):
    d = os.path.join(DATA, "mnist")
    if not find_idx(d, "t10k-images-idx3-ubyte"):
        print(f"mlp-bn: skipped, MNIST not found in {d} (run scripts/fetch-data.sh)")
        return None
    return Case("mlp-bn", "mlp-bn", d, MlpBn(), 10,
                ["--train-size", "3000", "--val-size", "0", "--batch", "50"])


@preset
def conv_bn(tmp):
    return Case("conv + bn", "1x28x28-conv5x5x8s2-bn-relu-maxpool2-dense32-bn-relu-4",
                quadrant_dir(tmp), ConvBn(), 4, QUADRANT_TRAIN[:-2])


@preset
def cnn_mnist(tmp):
    return Case("cnn-mnist layers",
                "1x28x28-conv5x5x32-relu-maxpool2-conv5x5x64-relu-maxpool2-128-4",
                quadrant_dir(tmp), CnnMnist(4), 4, QUADRANT_TRAIN)


@preset
def local_net(tmp):
    return Case("local", "1x28x28-local5x5x4s2-relu-conv3x3x8p1-relu-avgpool2-4",
                quadrant_dir(tmp), LocalNet(), 4, QUADRANT_TRAIN)


@preset
def resnet_fashion(tmp):
    return Case("resnet-fashion", "resnet-fashion", quadrant_dir(tmp), ResnetFashion(), 10,
                QUADRANT_TRAIN[:-2] + ["--lr", "0.002"])


@preset
def vit_mnist(tmp):
    return Case("vit-mnist", "vit-mnist", quadrant_dir(tmp), VitMnist(), 10,
                QUADRANT_TRAIN[:-2] + ["--lr", "0.002"])


# ----------------------------------------------------------------- check

def downpour_eval(path, dataset, test_size, metrics):
    """`downpour eval`'s test accuracy and mean loss, at full precision."""
    if os.path.exists(metrics):
        os.remove(metrics)
    args = [BIN, "eval", "--checkpoint", path, "--dataset", dataset, "--metrics", metrics]
    if test_size:
        args += ["--test-size", str(test_size)]
    subprocess.run(args, check=True, capture_output=True)
    with open(metrics) as f:
        done = json.loads(f.readline())
    return done["test_accuracy"], done["test_loss"]


def probe_losses(tmp, path, x, classes):
    """Downpour's -log p_c for each probe record and class c, from a dataset
    holding each record once per label (record-major)."""
    d = tempfile.mkdtemp(prefix="probe", dir=tmp)  # its own cache of decoded records
    img = (x[:PROBE_RECORDS] * 255).round().to(torch.uint8).flatten(1)
    images, labels = bytearray(), bytearray()
    for r in range(PROBE_RECORDS):
        for c in range(classes):
            images += bytes(img[r].tolist())
            labels.append(c)
    for prefix in ("train", "t10k"):
        write_idx(d, prefix, images, labels)
    out, prev = [], 0.0
    for k in range(1, PROBE_RECORDS * classes + 1):
        _, mean = downpour_eval(path, d, k, os.path.join(tmp, "probe.jsonl"))
        out.append(mean * k - prev)
        prev = mean * k
    return torch.tensor(out, dtype=torch.float64).reshape(PROBE_RECORDS, classes)


def check(tmp, case):
    path = os.path.join(tmp, "model.safetensors")
    subprocess.run([BIN, "train", "--dataset", case.dataset, "--model", case.model, "--epochs",
                    "1", "--save", path, "--quiet", "--no-progress", "--threads", "1"]
                   + case.train_args, check=True, capture_output=True)
    acc, loss = downpour_eval(path, case.dataset, 0, os.path.join(tmp, "eval.jsonl"))

    state = {k: v for k, v in load_safetensors(path).items() if k.startswith("layers.")}
    case.module.load_state_dict(state, strict=True)
    case.module.eval()
    x, y = test_split(case.dataset)
    with torch.no_grad():
        logits = case.module(x)
    n = len(y)
    t_acc = (logits.argmax(1) == y).float().mean().item()
    t_loss = F.cross_entropy(logits, y).item()
    t_logp = F.log_softmax(logits[:PROBE_RECORDS].double(), 1)
    logp_diff = (t_logp + probe_losses(tmp, path, x, case.classes)).abs().max().item()
    ok = abs(t_acc - acc) < 1e-4 + 1.0 / n and abs(t_loss - loss) < 2e-4 and logp_diff < 2e-4
    print(f"{case.name}: downpour test accuracy {acc:.4f} loss {loss:.5f}; PyTorch accuracy "
          f"{t_acc:.4f} loss {t_loss:.5f} on {n} records; log-softmax of {PROBE_RECORDS} "
          f"records within {logp_diff:.2g}: {'same' if ok else 'DIFFERENT'}")
    return ok


def main():
    torch.set_num_threads(1)
    ok = True
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOWNPOUR_TEST_TMP")) as tmp:
        for fn in PRESETS:
            case = fn(tmp)
            if case is not None:
                ok &= check(tmp, case)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
