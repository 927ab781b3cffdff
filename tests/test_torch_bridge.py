#!/usr/bin/python3
"""The PyTorch bridge, downpour.torch (docs/python.md, "PyTorch"), in
seconds, on a small torch MLP and synthetic records (tests/torch_bridge_task.py):

- strategy single equals plain torch (SGD, the same batches) within float noise;
- ps-sync on 2 workers at batch 32 equals one process at batch 64;
- allreduce on 2 workers at batch 32 equals one process at batch 64;
- a killed worker under ps-async (--max-restarts 0) is survived: the run
  ends and the chief reports;
- a killed worker restarted by launch (downpour.torch.launch) rejoins
  (under make test-long: a paced run);
- with buffers (a BatchNorm1d's running statistics): single equals plain
  torch and saves the state_dict (save=); ps-async on 1 worker equals one
  process and saves the same on the chief (worker 0's statistics); a run
  killed mid-epoch and resumed from its checkpoint ends with the weights
  and statistics of the uninterrupted run, exactly;
- errors: a strategy that cannot train it, sync_bn, dataset=, an exception in the
  loss function (raised again as it was).

Exits 77 (skipped) without torch or numpy for /usr/bin/python3."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
try:
    import numpy as np
    import torch
except ImportError:
    print("skipped: numpy or torch is not installed for", sys.executable)
    sys.exit(77)

import downpour  # noqa: E402
import downpour.torch as dt  # noqa: E402

sys.path.insert(0, HERE)
import torch_bridge_task as task  # noqa: E402

TASK = os.path.join(HERE, "torch_bridge_task.py")
BIN = downpour.program_path()
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += 0 if ok else 1


def run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
    check(p.returncode == 0, f"{what}: exit {p.returncode}")
    return p


def in_process(args, what):
    """The task script's main in this process (strategy single: no
    launch), saving a python and torch start each."""
    argv = sys.argv
    sys.argv = [TASK] + args
    try:
        task.main()
        check(True, f"{what}: in process")
    except Exception as e:  # noqa: BLE001 (reported as a failed check)
        check(False, f"{what}: {e!r}")
    finally:
        sys.argv = argv


def weights(path):
    return np.fromfile(path, np.float32) if os.path.exists(path) else np.zeros(0, np.float32)


def close(a, b, tol, what):
    d = float(np.abs(a - b).max()) if a.size and a.size == b.size else float("inf")
    check(d <= tol, f"{what}: max |difference| {d:.3g} (at most {tol:g})")


def plain_torch(batch, epochs, lr):
    """The same model, batches and SGD in torch alone."""
    x, y = task.data()
    model = task.net()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for k in range(0, task.N, batch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[k:k + batch]), y[k:k + batch]).backward()
            opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def plain_torch_bn(batch, epochs, lr):
    """The bn model in torch alone: its state_dict after SGD."""
    x, y = task.data()
    model = task.net(True)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for k in range(0, task.N, batch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[k:k + batch]), y[k:k + batch]).backward()
            opt.step()
    return model.state_dict()


def main():
    tmp = tempfile.mkdtemp(prefix="torch-bridge-", dir=os.environ.get("DOWNPOUR_TEST_TMP"))
    single = os.path.join(tmp, "single.bin")
    py = sys.executable
    in_process(["--batch", "64", "--out", single], "single")
    ref = weights(single)
    close(ref, plain_torch(64, 3, 0.1), 1e-5, "single equals plain torch")

    launch = [BIN, "launch"]
    out = os.path.join(tmp, "ps-sync.bin")
    try:  # downpour.launch(script=...): the task script as every task
        downpour.launch(workers=2, ps=1, chief=True, strategy="ps-sync", script=TASK,
                        args=["--batch", "32", "--out", out], echo=False)
        check(True, "ps-sync, 2 workers (downpour.launch(script=...))")
    except downpour.Error as e:
        check(False, f"ps-sync, 2 workers: {e}")
    close(weights(out), ref, 1e-5, "ps-sync on 2 workers at batch 32 equals single at 64")

    out = os.path.join(tmp, "allreduce.bin")
    # allreduce has no chief: worker 0 evaluates and holds the weights
    run(launch + ["--workers", "2", "--", py, TASK, "--strategy", "allreduce", "--batch", "32",
                  "--out", out, "--out-worker0"], "allreduce, 2 workers")
    close(weights(out), ref, 1e-5, "allreduce on 2 workers at batch 32 equals single at 64")

    # worker 1 dies at its step 5 (DOWNPOUR_FAULT_KILL_AT_STEP in its
    # environment only): ps-async goes on with worker 0 and ends
    out = os.path.join(tmp, "killed.bin")
    p = run(launch + ["--workers", "2", "--ps", "1", "--chief", "--", py, TASK, "--strategy",
                      "ps-async", "--batch", "32", "--epochs", "4", "--out", out,
                      "--kill-worker", "1", "--kill-at", "5"], "ps-async, a worker killed")
    check("Test accuracy" in p.stderr, "ps-async with a killed worker: the chief reports")
    check(os.path.exists(out), "ps-async with a killed worker: final weights written")

    # the same, restarted by launch (downpour.torch.launch, --max-restarts 1):
    # the new process rejoins at its step, its loader walked there.  Paced
    # (about 10 s): under make test-long, as the other paced fault runs
    if os.environ.get("DOWNPOUR_TEST_LONG") == "1":
        os.environ["DOWNPOUR_TEST_STEP_MS"] = "20"  # paced: the run outlasts the restart
        try:
            text = dt.launch(TASK, workers=2, ps=1, chief=True, max_restarts=1, echo=False,
                             args=["--strategy", "ps-async", "--batch", "32", "--epochs", "5",
                                   "--kill-worker", "1", "--kill-at", "5"])
            check("Worker 1: rejoined the run" in text and "Test accuracy" in text,
                  "ps-async: a killed worker restarted by launch rejoins")
        except downpour.Error as e:
            check(False, f"ps-async with a restarted worker: {e}")
        finally:
            del os.environ["DOWNPOUR_TEST_STEP_MS"]

    # buffers: a BatchNorm1d's running statistics.  single equals plain
    # torch, parameters and statistics.  ps-async on 1 worker equals
    # single: the chief gets worker 0's statistics (a BUFFERS frame) and
    # saves the same state_dict.  (The model without buffers runs under
    # ps-sync, allreduce and the killed worker above; these runs check its
    # parameters too, so one model serves both, a launch fewer each.)
    sd_single = os.path.join(tmp, "bn-single.pt")
    bn_single = os.path.join(tmp, "bn-single.bin")
    in_process(["--bn", "--batch", "64", "--out", bn_single, "--extra", f"save={sd_single}"],
               "bn: single")
    bn_ref = weights(bn_single)
    ref_sd = torch.load(sd_single) if os.path.exists(sd_single) else {}
    want = plain_torch_bn(64, 3, 0.1)
    check(set(ref_sd) == set(want), f"bn: save wrote the module's state_dict ({sorted(ref_sd)})")
    for k in want:
        if k in ref_sd and want[k].is_floating_point():
            close(ref_sd[k].numpy(), want[k].numpy(), 1e-5, f"bn: single equals plain torch, {k}")
    sd_async = os.path.join(tmp, "bn-ps-async.pt")
    out = os.path.join(tmp, "bn-ps-async.bin")
    run(launch + ["--workers", "1", "--ps", "1", "--chief", "--", py, TASK, "--bn", "--strategy",
                  "ps-async", "--batch", "64", "--out", out, "--extra", "push_behind=0",
                  f"save={sd_async}"], "ps-async, 1 worker")
    close(weights(out), bn_ref, 1e-6, "ps-async on 1 worker equals single")
    got = torch.load(sd_async) if os.path.exists(sd_async) else {}
    for k in ("0.weight", "1.running_mean", "1.running_var", "3.bias"):
        close(got[k].numpy() if k in got else np.zeros(0, np.float32), ref_sd[k].numpy()
              if k in ref_sd else np.ones(1, np.float32), 1e-6,
              f"bn: ps-async on 1 worker, the chief's saved {k} equals single's")

    # resume: killed after step 14 (3 epochs of 8 steps, a checkpoint
    # every 4), then resumed from step 12, mid-epoch: the loader is walked
    # to its place, and the weights and running statistics end as the
    # uninterrupted run's
    ck = os.path.join(tmp, "ck")
    out = os.path.join(tmp, "resumed.bin")
    sd_resumed = os.path.join(tmp, "bn-resumed.pt")
    args = [py, TASK, "--bn", "--batch", "64", "--out", out, "--extra", f"checkpoint_dir={ck}",
            "checkpoint_every=4", f"save={sd_resumed}"]
    p = subprocess.run(args + ["--kill-worker", "0", "--kill-at", "14"], capture_output=True,
                       text=True, timeout=240)
    check(p.returncode == -9 and not os.path.exists(out), f"killed at step 14: {p.returncode}")
    p = run(args + ["resume=True"], "resumed")
    check("Resuming from" in p.stderr and "step 12" in p.stderr, "resumed from step 12")
    close(weights(out), bn_ref, 0, "resumed run equals the uninterrupted one")
    got = torch.load(sd_resumed) if os.path.exists(sd_resumed) else {}
    for k in ("1.running_mean", "1.running_var", "3.weight"):
        close(got[k].numpy() if k in got else np.zeros(0, np.float32), ref_sd[k].numpy()
              if k in ref_sd else np.ones(1, np.float32), 0,
              f"bn: the resumed run's {k} equals the uninterrupted one's")

    # errors
    model = task.net()
    x, y = task.data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    try:
        dt.train(model, torch.nn.functional.cross_entropy, loader, strategy="lbfgs", echo=False)
        check(False, "lbfgs refused")
    except downpour.Error as e:
        check(e.argument == "strategy" and "allreduce" in str(e),
              f"lbfgs refused naming strategy: {e}")
    try:
        dt.train(task.net(True), torch.nn.functional.cross_entropy, loader, strategy="allreduce",
                 sync_bn=True, echo=False)
        check(False, "sync_bn refused")
    except downpour.Error as e:
        check("sync-bn" in str(e) and "external" in str(e), f"sync_bn refused: {e}")
    try:
        dt.train(model, torch.nn.functional.cross_entropy, loader, dataset="mnist", echo=False)
        check(False, "dataset refused")
    except downpour.Error as e:
        check(e.argument == "dataset", f"dataset refused naming it: {e}")

    def bad_loss(out, y):
        raise ValueError("bad loss")
    try:
        dt.train(model, bad_loss, loader, echo=False)
        check(False, "an exception in the loss is raised")
    except ValueError as e:
        check(str(e) == "bad loss", "an exception in the loss is raised again as it was")
    # the module still trains after them
    h = dt.train(model, torch.nn.functional.cross_entropy, loader, lr=0.1, epochs=1,
                 val_loader=loader, echo=False)
    rows = h.to_dict("records") if hasattr(h, "to_dict") else h
    check(len(rows) == 1 and rows[0]["val_accuracy"] > 0, "trains after the errors")
    print("failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
