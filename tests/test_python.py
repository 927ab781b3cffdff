#!/usr/bin/python3
"""The Python package (python/downpour, docs/python.md), in seconds:

- downpour.train on mlp-300-100 from NumPy arrays (MNIST's first records)
  gives the same final weights, bit for bit, as `downpour train` on the
  same records with the same options;
- bad arguments raise downpour.Error naming the argument (an unknown
  option, a bad strategy or value, a wrong array shape or dtype, labels
  of another length);
- downpour.evaluate and to_torch() of a checkpoint give `downpour eval`'s
  test accuracy (to_torch skipped without PyTorch);
- downpour.launch runs a local cluster and returns its history;
- every ```python block of docs/python.md runs.

Exits 77 (skipped) when numpy or MNIST is missing."""
import gzip
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

try:
    import numpy as np
except ImportError:
    print("skipped: numpy is not installed for", sys.executable)
    sys.exit(77)

import downpour  # noqa: E402

DATA = os.environ.get("DOWNPOUR_DATA", os.path.join(ROOT, "data"))
MNIST = os.path.join(DATA, "mnist")
BIN = downpour.program_path()
os.environ["DOWNPOUR_DATA"] = os.path.abspath(DATA)
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAILED: ") + what)
    if not cond:
        failures.append(what)


def read_idx(stem):
    for name in (stem, stem + ".gz"):
        p = os.path.join(MNIST, name)
        if os.path.exists(p):
            with (gzip.open if p.endswith(".gz") else open)(p, "rb") as f:
                raw = f.read()
            nd = raw[3]
            dims = struct.unpack(">" + "I" * nd, raw[4:4 + 4 * nd])
            return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(dims)
    return None


def same_weights(a, b):
    wa, wb = downpour.load(a), downpour.load(b)
    return wa.keys() == wb.keys() and all(
        wa[k].dtype == wb[k].dtype and wa[k].shape == wb[k].shape and
        wa[k].view(np.uint32).tobytes() == wb[k].view(np.uint32).tobytes() for k in wa)


def expect_error(argument, **kw):
    kw.setdefault("echo", False)
    try:
        downpour.train(**kw)
    except downpour.Error as e:
        ok = e.argument == argument and str(e)
        check(ok, f"Error naming {argument}: {e} (argument {e.argument})")
        return
    check(False, f"no Error for {kw}")


def main(tmp):
    x, y = read_idx("train-images-idx3-ubyte"), read_idx("train-labels-idx1-ubyte")
    xt, yt = read_idx("t10k-images-idx3-ubyte"), read_idx("t10k-labels-idx1-ubyte")
    if x is None or xt is None:
        print(f"skipped: MNIST not found in {MNIST} (scripts/fetch-data.sh)")
        return 77
    opts = ["--model", "mlp-300-100", "--epochs", "1", "--batch", "64", "--seed", "7",
            "--train-size", "3000", "--val-size", "500", "--test-size", "2000", "--threads",
            "1", "--lr", "0.002", "--quiet", "--no-progress"]

    # 1. the same weights as downpour train, bit for bit
    a, b = os.path.join(tmp, "cli.safetensors"), os.path.join(tmp, "py.safetensors")
    subprocess.run([BIN, "train", "--dataset", MNIST, "--save", a] + opts, check=True,
                   capture_output=True)
    xs, ys = x[:3500], y[:3500]  # views of the records: used in place
    hist = downpour.train(model="mlp-300-100", data=(xs, ys, xt, yt), epochs=1, batch=64,
                          seed=7, train_size=3000, val_size=500, test_size=2000, threads=1,
                          lr=0.002, quiet=True, no_progress=True, save=b, echo=False)
    check(same_weights(a, b), "downpour.train from NumPy arrays == downpour train, bit for bit")
    from downpour._data import MemoryDataset
    m = MemoryDataset((xs, ys, xt, yt))
    check(m.x.ctypes.data == xs.ctypes.data and m.y.ctypes.data == ys.ctypes.data and
          m.xt.ctypes.data == xt.ctypes.data, "contiguous uint8 arrays are used in place")
    f = np.zeros((10, 784), np.float32)
    check(MemoryDataset((f, np.zeros(10, np.uint8))).x.ctypes.data == f.ctypes.data,
          "float32 arrays are used in place")
    rows = hist.to_dict("records") if hasattr(hist, "to_dict") else list(hist)
    check(len(rows) == 1 and 0.5 < rows[0]["val_accuracy"] <= 1, f"history {rows}")
    # the same through (n, 1, 28, 28) arrays and a dataset path
    c = os.path.join(tmp, "py4.safetensors")
    downpour.train(model="mlp-300-100", data=(xs.reshape(-1, 1, 28, 28), ys.astype(np.int64)),
                   epochs=1, batch=64, seed=7, train_size=3000, val_size=500, threads=1,
                   lr=0.002, quiet=True, save=c, echo=False)
    check(same_weights(a, c), "(n, 1, 28, 28) uint8 and int64 labels: the same weights")
    d = os.path.join(tmp, "path.safetensors")
    downpour.train(model="mlp-300-100", data=MNIST, epochs=1, batch=64, seed=7,
                   train_size=3000, val_size=500, threads=1, lr=0.002, quiet=True, save=d,
                   echo=False)
    check(same_weights(a, d), "data=<path>: the same weights")

    # 2. bad arguments
    small = (x[:600], y[:600])
    expect_error("batchsize", model="mlp-128", data=small, batchsize=3)
    expect_error("strategy", model="mlp-128", data=small, strategy="ps-asyn")
    expect_error("batch", model="mlp-128", data=small, batch=0)
    expect_error("lr", model="mlp-128", data=small, lr=-1.0)
    expect_error("model", model="mlp-300-10O", data=small)
    expect_error("data", model="mlp-128", data=(x[:600].astype(np.float64), y[:600]))
    expect_error("data", model="mlp-128", data=(x[:600, :5], y[:600]))
    expect_error("data", model="mlp-128", data=(x[:600], y[:599]))
    expect_error("data", model="mlp-128", data=(x[:600], y[:600].reshape(-1, 1)))
    expect_error("data", model="mlp-128", data=(x[:600], y[:600].astype(np.float32)))
    expect_error("data", model="mlp-128", data="no-such-dataset")
    expect_error("quiet", model="mlp-128", data=small, quiet="yes")

    # 3. evaluate and to_torch against downpour eval
    r = subprocess.run([BIN, "eval", "--checkpoint", a, "--dataset", MNIST],
                       capture_output=True, text=True, check=True)
    acc = float(r.stdout.split()[-1])
    check(abs(downpour.evaluate(a, data=MNIST) - acc) < 1e-4, f"evaluate == downpour eval "
          f"({acc})")
    check(abs(downpour.evaluate(a, data=(xt, yt)) - acc) < 1e-4, "evaluate on arrays")
    try:
        import torch
    except ImportError:
        torch = None
        print("to_torch: skipped, PyTorch is not installed")
    if torch is not None:
        torch.set_num_threads(1)
        xf = torch.from_numpy(xt.astype(np.float32) / 255).reshape(-1, 1, 28, 28)
        for path, what in ((a, "mlp-300-100"), ):
            m = downpour.to_torch(path)
            with torch.no_grad():
                t_acc = (m(xf).argmax(1).numpy() == yt).mean()
            check(abs(t_acc - acc) <= 1e-4 + 1 / len(yt),
                  f"to_torch({what}) accuracy {t_acc:.4f} == downpour eval {acc:.4f}")
        cnn = os.path.join(tmp, "cnn.safetensors")
        downpour.train(model="cnn-mnist", data=(x[:600], y[:600], xt[:1000], yt[:1000]),
                       epochs=1, batch=50, threads=1, quiet=True, save=cnn, echo=False)
        r = subprocess.run([BIN, "eval", "--checkpoint", cnn, "--dataset", MNIST, "--test-size",
                            "1000"], capture_output=True, text=True, check=True)
        cacc = float(r.stdout.split()[-1])
        m = downpour.to_torch(cnn)
        with torch.no_grad():
            t_acc = (m(xf[:1000]).argmax(1).numpy() == yt[:1000]).mean()
        check(abs(t_acc - cacc) <= 1e-4 + 1 / 1000,
              f"to_torch(cnn-mnist) accuracy {t_acc:.4f} == downpour eval {cacc:.4f}")

    # 4. a local cluster
    h = downpour.launch(workers=2, strategy="allreduce", model="mlp-128", data=small,
                        epochs=2, quiet=True, echo=False)
    rows = h.to_dict("records") if hasattr(h, "to_dict") else list(h)
    check(len(rows) == 2 and [r["epoch"] for r in rows] == [1, 2], f"launch history {rows}")

    # 5. the examples of docs/python.md
    doc = open(os.path.join(ROOT, "docs", "python.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        for i, code in enumerate(blocks):
            try:
                exec(compile(code, f"docs/python.md block {i + 1}", "exec"),
                     {"__name__": "__doc__", "MNIST": MNIST})
                check(True, f"docs/python.md example {i + 1}")
            except Exception as e:  # noqa: BLE001
                check(False, f"docs/python.md example {i + 1}: {type(e).__name__}: {e}")
    finally:
        os.chdir(cwd)
    check(len(blocks) >= 3, f"docs/python.md has {len(blocks)} examples")
    return 1 if failures else 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOWNPOUR_TEST_TMP")) as t:
        rc = main(t)
    if failures:
        print(f"{len(failures)} check(s) failed")
    sys.exit(rc)
