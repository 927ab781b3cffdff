#!/usr/bin/python3
"""The Python examples (examples/*.py, docs/python.md "Examples") run as a
user runs them, shortened by their own flags: Model 1 from Python, a
PyTorch CNN under ps-async on 2 workers, the strategies side by side.
Each must exit 0 and print its result.  Exits 77 (skipped) without numpy,
torch or MNIST for /usr/bin/python3."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
except ImportError:
    print("skipped: numpy or torch is not installed for", sys.executable)
    sys.exit(77)
DATA = os.environ.get("DOWNPOUR_DATA", os.path.join(ROOT, "data"))
if not any(os.path.exists(os.path.join(DATA, "mnist", "train-images-idx3-ubyte" + s))
           for s in ("", ".gz")):
    print("skipped: no MNIST under", DATA)
    sys.exit(77)

env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), DOWNPOUR_DATA=DATA)
tmp = os.environ.get("DOWNPOUR_TEST_TMP", "/tmp")
failures = 0
for script, args, want in [
        ("model1.py", ["--epochs", "1", "--train-size", "3000"], "test accuracy"),
        ("torch_cnn_ps_async.py", ["--epochs", "1", "--train-size", "2048", "--test-size", "500"],
         "Test accuracy"),
        ("compare_strategies.py", ["--epochs", "1", "--train-size", "2000"], "ps-sync (2 workers)")]:
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)] + args, env=env,
                       cwd=tmp, capture_output=True, text=True, timeout=240)
    ok = p.returncode == 0 and want in p.stdout + p.stderr
    print(f"{'ok' if ok else 'FAILED'}: examples/{script} {' '.join(args)}")
    if not ok:
        failures += 1
        print(p.stdout[-3000:], p.stderr[-3000:])
sys.exit(1 if failures else 0)
