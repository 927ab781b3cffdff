#!/usr/bin/python3
"""The source experiment's Model 1 from Python: the 784-300-100-10 MLP on
MNIST (54,000 / 6,000 / 10,000), batch 128, 25 epochs, Adam.
Run from the repository: PYTHONPATH=python /usr/bin/python3 examples/model1.py
(`--epochs N --train-size N` make it shorter, as the tests run it)."""
import argparse

import downpour

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=25)
ap.add_argument("--train-size", type=int, default=54000)
a = ap.parse_args()
hist = downpour.train(model="mlp-300-100", data="mnist", epochs=a.epochs, batch=128,
                      train_size=a.train_size, optimizer="adam", quiet=True)
done = hist.attrs["done"] if hasattr(hist, "attrs") else hist.done
print(f"test accuracy {done['test_accuracy']:.4f} after {a.epochs} epochs")
