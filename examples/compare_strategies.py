#!/usr/bin/python3
"""Several strategies on the same model and data, side by side, as a
notebook would run them: test accuracy and training time per strategy,
and a bar chart (strategies.png) when matplotlib is importable.
    PYTHONPATH=python /usr/bin/python3 examples/compare_strategies.py"""
import argparse
import time

import downpour

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--train-size", type=int, default=54000)
a = ap.parse_args()
common = dict(model="mlp-300-100", data="mnist", epochs=a.epochs, train_size=a.train_size,
              val_size=1000, quiet=True, echo=False)
runs = {"single": lambda: downpour.train(**common),
        "allreduce (2 workers)": lambda: downpour.launch(workers=2, strategy="allreduce", **common),
        "ps-async (2 workers)": lambda: downpour.launch(workers=2, ps=1, chief=True,
                                                        strategy="ps-async", **common),
        "ps-sync (2 workers)": lambda: downpour.launch(workers=2, ps=1, chief=True,
                                                       strategy="ps-sync", **common)}
rows = []
for name, run in runs.items():
    t0 = time.time()
    hist = run()
    done = hist.attrs["done"] if hasattr(hist, "attrs") else hist.done
    rows.append((name, done["test_accuracy"], time.time() - t0))
    print(f"{name:24s} test accuracy {rows[-1][1]:.4f}  {rows[-1][2]:6.1f} s")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh([r[0] for r in rows], [r[1] for r in rows])
    ax.set_xlabel("test accuracy")
    fig.tight_layout()
    fig.savefig("strategies.png")
    print("wrote strategies.png")
except ImportError:
    pass
