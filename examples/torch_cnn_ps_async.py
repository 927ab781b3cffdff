#!/usr/bin/python3
"""A PyTorch CNN (no torchvision) trained on MNIST with Downpour SGD:
ps-async, 2 workers, 1 parameter server and a chief, all on this machine.

Run it plainly and it launches the cluster, with itself as every task:
    PYTHONPATH=python /usr/bin/python3 examples/torch_cnn_ps_async.py
Each task finds its role (downpour.torch.task()); the workers train on
their shards of the records, the ps task applies Adam to its slice of the
flat parameter buffer, the chief evaluates after each epoch."""
import argparse
import gzip
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn

import downpour
import downpour.torch as dt


def idx(name):
    """An MNIST IDX file, plain or gzipped, as an array."""
    path = os.path.join(os.environ.get("DOWNPOUR_DATA", "data"), "mnist", name)
    raw = open(path, "rb").read() if os.path.exists(path) else gzip.open(path + ".gz").read()
    dims = struct.unpack(">" + "I" * raw[3], raw[4:4 + 4 * raw[3]])
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * raw[3]).reshape(dims)


def records(images, labels, n):
    x = torch.from_numpy(idx(images)[:n].astype(np.float32) / 255.0).unsqueeze(1)
    return torch.utils.data.TensorDataset(x, torch.from_numpy(idx(labels)[:n].astype(np.int64)))


def net():
    torch.manual_seed(0)  # every task starts from the same weights
    return nn.Sequential(nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))


def task(a):
    train = records("train-images-idx3-ubyte", "train-labels-idx1-ubyte", a.train_size)
    test = records("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", a.test_size)
    loader = torch.utils.data.DataLoader(dt.shard(train), batch_size=64, shuffle=True,
                                         drop_last=True)
    dt.train(net(), nn.functional.cross_entropy, loader, strategy="ps-async",
             epochs=a.epochs, optimizer="adam", lr=0.001,
             test_loader=torch.utils.data.DataLoader(test, batch_size=500), quiet=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-size", type=int, default=60000)
    ap.add_argument("--test-size", type=int, default=10000)
    ap.add_argument("--strategy", default="ps-async")  # read by launch
    a = ap.parse_args()
    if dt.task()[0] == "single":  # started by hand: launch the cluster
        dt.launch(os.path.abspath(__file__), workers=2, ps=1, chief=True,
                  args=sys.argv[1:] + ["--strategy", "ps-async"])
    else:
        task(a)
