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

# The modules live in the Python package (python/downpour/nets.py), which
# downpour.to_torch uses too.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from downpour.nets import CnnMnist, ConvBn, LocalNet, MlpBn, ResnetFashion, VitMnist  # noqa: E402

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
