#!/usr/bin/python3
"""The PyTorch bridge's overhead (docs/python.md, "PyTorch"): samples/s of a
torch MLP 784-300-100-10 at batch 128 on synthetic records, printed, not
asserted:

  plain torch, one process             vs  downpour.torch single and ps-async (1 worker, 1 ps)
  torch DDP over gloo, 2 processes     vs  downpour.torch allreduce (2 workers)

Every process computes with one thread (torch.set_num_threads(1),
OPENBLAS_NUM_THREADS=1), so the figures compare the exchange, not thread
counts.  Run from a build tree:
    PYTHONPATH=python /usr/bin/python3 bench/torch_bridge.py [--steps 300]"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def _coretype():
    """The OpenBLAS kernels libdownpour picks for this CPU (src/nn/blas.c,
    fix_kernels), for every process here: on a CPU OpenBLAS 0.3.21 takes for
    a Prescott, a plain torch process would otherwise run the generic
    kernels, ~3x slower, and the bridge's tasks the fixed ones."""
    try:
        flags = set(next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split())
    except (OSError, StopIteration):
        return None
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    return "Haswell" if {"avx2", "fma"} <= flags else None


if _coretype():
    os.environ.setdefault("OPENBLAS_CORETYPE", _coretype())  # before torch loads OpenBLAS
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
BATCH = 128


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, 300), torch.nn.ReLU(),
                               torch.nn.Linear(300, 100), torch.nn.ReLU(),
                               torch.nn.Linear(100, 10))


def loader(steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(steps * BATCH, 784, generator=g)
    y = torch.randint(0, 10, (steps * BATCH,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)


def plain(steps):
    torch.set_num_threads(1)
    model, data = net(), loader(steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.perf_counter()
    for x, y in data:  # the loader, as the bridge's tasks
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return steps * BATCH / (time.perf_counter() - t0)


def ddp_task(rank, steps, port, q):
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = loader(steps, rank)
    dist.barrier()
    t0 = time.perf_counter()
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.barrier()
    if rank == 0:
        q.put(2 * steps * BATCH / (time.perf_counter() - t0))
    dist.destroy_process_group()


def ddp(steps):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(ddp_task, args=(steps, port, q), nprocs=2, join=True)
    return q.get()


def bridge_task(strategy, steps, out):
    """One task of a downpour run (alone, or under downpour launch)."""
    import downpour.torch as dt
    torch.set_num_threads(1)
    kind, index, _ = dt.task()
    h = dt.train(net(), torch.nn.functional.cross_entropy, loader(steps, index),
                 strategy=strategy, epochs=1, lr=0.01, quiet=True, echo=False,
                 **({"push_behind": 0} if strategy == "ps-async" else {}))
    done = h.attrs["done"] if hasattr(h, "attrs") else (h.done if h is not None else None)
    if done and kind in ("single", "chief") or (kind, index) == ("worker", 0) and done:
        with open(out, "w") as f:
            f.write(str(done["samples_per_second"]))


def bridge(strategy, steps, workers=0, ps=0):
    import downpour
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sps")
        me = [sys.executable, os.path.abspath(__file__), "--task", strategy, "--steps",
              str(steps), "--out", out]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        if workers:
            cmd = [downpour.program_path(), "launch", "--workers", str(workers)]
            cmd += (["--ps", str(ps), "--chief"] if ps else []) + ["--"] + me
        else:
            cmd = me
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return float(open(out).read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the best is shown")
    ap.add_argument("--task")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.task:
        return bridge_task(a.task, a.steps, a.out)
    runs = [("plain torch, 1 process", lambda: plain(a.steps)),
            ("downpour.torch single", lambda: bridge("single", a.steps)),
            ("downpour.torch ps-async, 1 worker + 1 ps", lambda: bridge("ps-async", a.steps, 1, 1)),
            ("downpour.torch ps-async, 2 workers + 1 ps", lambda: bridge("ps-async", a.steps, 2, 1)),
            ("torch DDP gloo, 2 processes", lambda: ddp(a.steps)),
            ("downpour.torch allreduce, 2 workers", lambda: bridge("allreduce", a.steps, 2))]
    best = {name: 0.0 for name, _ in runs}
    for _ in range(a.repeat):  # interleaved: a busy spell hits every row alike
        for name, fn in runs:
            best[name] = max(best[name], fn())
    print(f"torch MLP 784-300-100-10, batch {BATCH}, {a.steps} steps per worker, 1 thread "
          f"per process, {os.cpu_count()} CPUs, best of {a.repeat}, OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE')}")
    for name, _ in runs:
        print(f"  {name:45s} {best[name]:10.0f} samples/s")


if __name__ == "__main__":
    main()
