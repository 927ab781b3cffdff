"""The PyTorch bridge (docs/python.md, "PyTorch"): any torch.nn.Module
trained under downpour's data-parallel strategies (single, allreduce,
ps-async, ps-sync, ps-ssp, ps-dssp, model-avg).

    import downpour.torch as dt
    hist = dt.train(model, torch.nn.functional.cross_entropy, loader,
                    strategy="ps-async", epochs=3, optimizer="sgd", lr=0.05)

The module's parameters are moved into one flat float32 tensor (each
parameter a view into it) and their gradients into a twin: libdownpour
reads and writes both in place, with no copies.  A step is the caller's
forward and backward on the loader's next batch; the update is downpour's
(the local optimiser, or the ps shards' on their slices), so the module's
own torch.optim optimiser is not used.  Run the same script as every task
of a cluster with `downpour launch --workers 2 --ps 1 -- python3 script.py
--strategy ps-async` (or downpour.torch.launch): each task learns its role
from DOWNPOUR_CONFIG, and every task must build the module from the same
seed (torch.manual_seed) so they start from the same weights."""
import ctypes
import itertools
import json
import os
import sys

import torch as _torch

from ._lib import Error, libs, run_command

__all__ = ["train", "task", "launch", "flatten", "shard", "STRATEGIES"]

# the strategies whose trainers hold a replica of the whole model
STRATEGIES = ("single", "allreduce", "ps-async", "ps-sync", "ps-ssp", "ps-dssp", "model-avg")

_NEXT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_COMPUTE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                            ctypes.POINTER(ctypes.c_int))
_EVALUATE = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                             ctypes.POINTER(ctypes.c_double))
_SAVE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_char_p)


class _External(ctypes.Structure):  # dp_external_model, include/downpour/external.h
    _fields_ = [("n_params", ctypes.c_size_t), ("params", ctypes.c_void_p),
                ("grads", ctypes.c_void_p), ("steps_per_epoch", ctypes.c_long),
                ("next", _NEXT), ("compute", _COMPUTE), ("evaluate", _EVALUATE),
                ("ctx", ctypes.c_void_p), ("n_buffers", ctypes.c_size_t),
                ("buffers", ctypes.c_void_p), ("save", _SAVE)]


def task():
    """This process's task, as (type, index): ("chief", 0), ("worker", 1),
    ("ps", 0) under downpour launch or run (DOWNPOUR_CONFIG, else TF_CONFIG),
    ("single", 0) alone; and the cluster's worker count as a third item."""
    for var in ("DOWNPOUR_CONFIG", "TF_CONFIG"):
        text = os.environ.get(var)
        if not text:
            continue
        try:
            spec = json.loads(text)
            t = spec["task"]
            return t["type"], int(t["index"]), len(spec["cluster"].get("worker", []))
        except (ValueError, KeyError, TypeError):
            raise Error(f"{var}: not a cluster spec with a task (docs/cluster.md)") from None
    return "single", 0, 1


def shard(dataset):
    """This worker's share of a map-style dataset (a torch Subset of every
    workers'th record from its index), for a DataLoader; the whole dataset
    alone."""
    kind, index, workers = task()
    if kind != "worker" or workers <= 1:
        return dataset
    return _torch.utils.data.Subset(dataset, range(index, len(dataset), workers))


def flatten(model):
    """Moves the module's trainable parameters into one flat float32 tensor
    (each parameter becomes a view into it, in model.parameters() order) and
    their gradients into a twin: returns (params, grads).  Called by train;
    idempotent on a module it already flattened."""
    got = getattr(model, "_downpour_flat", None)
    if got is not None:
        return got
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise Error("the module has no trainable parameters", "model")
    for p in params:
        if p.dtype != _torch.float32 or p.device.type != "cpu":
            raise Error(f"parameters must be float32 on the CPU (one is {p.dtype} on "
                        f"{p.device})", "model")
    n = sum(p.numel() for p in params)
    flat = _torch.empty(n, dtype=_torch.float32)
    grads = _torch.zeros(n, dtype=_torch.float32)
    off = 0
    with _torch.no_grad():
        for p in params:
            k = p.numel()
            flat[off:off + k].copy_(p.reshape(-1))
            p.data = flat[off:off + k].view_as(p)
            p.grad = grads[off:off + k].view_as(p)
            off += k
    model._downpour_flat = (flat, grads)
    model._downpour_views = [(p, off0) for p, off0 in
                             zip(params, itertools.accumulate([0] + [p.numel() for p in params]))]
    model._downpour_buffers = _flatten_buffers(model)
    return flat, grads


def _flatten_buffers(model):
    """Moves the module's float32 CPU buffers (a BatchNorm's running_mean
    and running_var) into one flat tensor, each buffer a view into it, in
    model.buffers() order: downpour handles them as its own models' buffers
    (docs/strategies.md, "Buffers"): worker 0's reach the chief, which
    evaluates and saves with them, and checkpoints hold them.  Buffers of
    other types (BatchNorm's num_batches_tracked, an int64 that only
    momentum=None reads) stay each task's own.  None when there are none."""
    bufs = [b for b in model.buffers() if b.dtype == _torch.float32 and b.device.type == "cpu"]
    n = sum(b.numel() for b in bufs)
    if not n:
        return None
    flat = _torch.empty(n, dtype=_torch.float32)
    off = 0
    for b in bufs:
        k = b.numel()
        flat[off:off + k].copy_(b.reshape(-1))
        b.data = flat[off:off + k].view_as(b)
        off += k
    return flat


def _records(batch):
    x = batch[0] if isinstance(batch, (list, tuple)) else batch
    return int(x.shape[0]) if hasattr(x, "shape") else len(x)


def _split(batch):
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise Error("the loader's batches must be (inputs, targets)", "loader")


class _Bridge:
    """The callbacks libdownpour calls (external.h).  An exception in one is
    kept and raised again when the run returns; the C side sees -1."""

    def __init__(self, model, loss_fn, loader, val_loader, test_loader):
        self.model, self.loss_fn, self.loader = model, loss_fn, loader
        self.val_loader, self.test_loader = val_loader, test_loader
        self.flat, self.grads = flatten(model)
        self.it = None
        self.batch = None
        self.error = None
        self.epoch = 0

    def _fail(self):
        if self.error is None:
            self.error = sys.exc_info()[1]

    def next(self, _ctx):
        try:
            if self.it is None:
                self.it = iter(self.loader)
            try:
                self.batch = next(self.it)
            except StopIteration:  # the loader's epoch is over: the next one
                self.epoch += 1
                sampler = getattr(self.loader, "sampler", None)
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(self.epoch)
                self.it = iter(self.loader)
                self.batch = next(self.it, None)
                if self.batch is None:
                    return 0
            return _records(self.batch)
        except BaseException:
            self._fail()
            return -1

    def _views_ok(self):
        """Re-points any gradient torch replaced (an optimizer's zero_grad
        with set_to_none, a hook) at the flat buffer, copying it there."""
        for p, off in self.model._downpour_views:
            g = p.grad
            if g is None:
                self.grads[off:off + p.numel()].zero_()
            elif g.data_ptr() != self.grads[off:off + p.numel()].data_ptr():
                self.grads[off:off + p.numel()].copy_(g.reshape(-1))
            else:
                continue
            p.grad = self.grads[off:off + p.numel()].view_as(p)

    def compute(self, _ctx, loss_out, correct_out):
        try:
            x, y = _split(self.batch)
            self.grads.zero_()
            self.model.train()
            out = self.model(x)
            loss = self.loss_fn(out, y)
            loss.backward()
            self._views_ok()
            loss_out[0] = float(loss.detach())
            correct_out[0] = _correct(out, y)
            return 0
        except BaseException:
            self._fail()
            return -1

    def evaluate(self, _ctx, weights, test, loss_out):
        try:
            loader = (self.test_loader or self.val_loader) if test else \
                (self.val_loader or self.test_loader)
            saved = None
            if weights and weights != self.flat.data_ptr():  # the EMA, the best epoch's
                w = (ctypes.c_float * self.flat.numel()).from_address(weights)
                saved = self.flat.clone()
                self.flat.copy_(_torch.frombuffer(w, dtype=_torch.float32))
            was = self.model.training
            self.model.eval()
            total = right = 0
            loss_sum = 0.0
            try:
                with _torch.no_grad():
                    for batch in loader:
                        x, y = _split(batch)
                        out = self.model(x)
                        n = _records(batch)
                        loss_sum += float(self.loss_fn(out, y)) * n
                        right += _correct(out, y)
                        total += n
            finally:
                self.model.train(was)
                if saved is not None:
                    self.flat.copy_(saved)
            loss_out[0] = loss_sum / total if total else 0.0
            return right / total if total else 0.0
        except BaseException:
            self._fail()
            return -1.0


    def save(self, _ctx, weights, buffers, path):
        """torch.save of the module's state_dict with `weights` (and
        `buffers`) in it, the module's own left as they were."""
        try:
            path = path.decode()
            bufs = self.model._downpour_buffers
            saved = self.flat.clone(), (bufs.clone() if bufs is not None else None)
            try:
                if weights and weights != self.flat.data_ptr():
                    w = (ctypes.c_float * self.flat.numel()).from_address(weights)
                    self.flat.copy_(_torch.frombuffer(w, dtype=_torch.float32))
                if bufs is not None and buffers and buffers != bufs.data_ptr():
                    b = (ctypes.c_float * bufs.numel()).from_address(buffers)
                    bufs.copy_(_torch.frombuffer(b, dtype=_torch.float32))
                _torch.save(self.model.state_dict(), path)
            finally:
                self.flat.copy_(saved[0])
                if bufs is not None:
                    bufs.copy_(saved[1])
            return 0
        except BaseException:
            self._fail()
            return -1


def _correct(out, y):
    """Correct predictions of a classifier's logits (0 for anything else)."""
    if out.dim() == 2 and y.dim() == 1 and not y.is_floating_point():
        return int((out.argmax(1) == y).sum())
    return 0


def train(model, loss_fn, loader, strategy="single", epochs=1, optimizer="sgd", lr=None,
          val_loader=None, test_loader=None, echo=True, **options):
    """Trains `model` (a torch.nn.Module, float32 on the CPU) on `loader`'s
    (inputs, targets) batches with loss_fn(model(inputs), targets), under
    downpour's `strategy`, and returns the history as downpour.train does.

    The update is downpour's: optimizer (sgd, momentum, nesterov, adagrad,
    adam, adamw) with lr, on the local replica (single, allreduce) or on the
    ps shards' slices (ps-async, ps-sync, ps-ssp, ps-dssp, model-avg).
    Steps per epoch are len(loader): every worker's loader must have as
    many batches (its own shard of the records: downpour.torch.shard).
    val_loader / test_loader: evaluated by the evaluator (the chief, or the
    one process) after each epoch and at the end; without them the run
    reports no accuracy.  Every other option of `downpour train` is a
    keyword (quiet=True, log_every=10, push_behind=0, metrics="m.jsonl",
    ema=0.99, keep_best=True, checkpoint_dir="ck", resume=True: the
    checkpoints hold the flat buffers, and a resumed run walks the loader
    to its position), save="model.pt" (the evaluator writes the module's
    state_dict there with torch.save: the final weights, or the best
    epoch's with keep_best, and the buffers it evaluated with).  Float32
    buffers (a BatchNorm's running statistics) follow downpour's rule for
    its own models' buffers (docs/strategies.md, "Buffers"); sync_bn is
    refused.  In a cluster (under downpour launch)
    every task calls train with the same arguments; a ps task needs no
    loader batches and the chief only the evaluation loaders.  Errors:
    downpour.Error; an exception raised in the model or the loader is
    raised again as it was."""
    from . import _argv, _error_from, _history, options as _options
    import tempfile
    if not isinstance(model, _torch.nn.Module):
        raise Error(f"model: a torch.nn.Module, not {type(model).__name__}", "model")
    if strategy not in STRATEGIES:
        raise Error(f"strategy: {strategy!r} cannot train an external model (a torch "
                    f"module); these can: {', '.join(STRATEGIES)}", "strategy", 2)
    kind, _, _ = task()
    bridge = _Bridge(model, loss_fn, loader, val_loader, test_loader)
    try:
        steps = len(loader) if loader is not None else 0
    except TypeError:
        raise Error("loader: needs a len() (the steps of an epoch)", "loader") from None
    if kind != "ps" and steps < 1:
        raise Error("loader: no batches", "loader")
    batch = getattr(loader, "batch_size", None) or 1
    ext = _External()
    ext.n_params = bridge.flat.numel()
    ext.params = bridge.flat.data_ptr()
    ext.grads = bridge.grads.data_ptr()
    ext.steps_per_epoch = steps
    bufs = model._downpour_buffers
    if bufs is not None:
        ext.n_buffers, ext.buffers = bufs.numel(), bufs.data_ptr()
    cbs = [_SAVE(bridge.save)]
    ext.save = cbs[0]
    if kind in ("single", "worker"):
        cbs += [_NEXT(bridge.next), _COMPUTE(bridge.compute)]
        ext.next, ext.compute = cbs[-2], cbs[-1]
    if val_loader is not None or test_loader is not None:
        cbs.append(_EVALUATE(bridge.evaluate))
        ext.evaluate = cbs[-1]
    # under launch, torch takes the threads launch gives each task's BLAS
    if kind != "single" and "OMP_NUM_THREADS" not in os.environ and \
            os.environ.get("OPENBLAS_NUM_THREADS", "").isdigit():
        _torch.set_num_threads(max(1, int(os.environ["OPENBLAS_NUM_THREADS"])))
    core, _ = libs()
    # the spec a checkpoint records, the same in every run of the script
    # (one run at a time in a process: run_command's lock)
    name = f"torch-{bridge.flat.numel()}"
    err = ctypes.create_string_buffer(8192)  # a dp_err (DP_ERR_MAX)
    core.dp_external_register.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]
    if core.dp_external_register(name.encode(), ctypes.byref(ext), err) != 0:
        raise Error(err.value.decode(errors="replace"))
    kw = dict(options)
    kw.update(model="external:" + name, strategy=strategy, epochs=epochs, optimizer=optimizer,
              batch=batch)
    if lr is not None:
        kw["lr"] = lr
    if kw.get("dataset"):
        raise Error("dataset: not for a torch module (docs/python.md, \"PyTorch\")", "dataset", 2)
    try:
        with tempfile.TemporaryDirectory(prefix="downpour-torch") as tmp:
            kw["metrics"] = kw.get("metrics") or os.path.join(tmp, "metrics.jsonl")
            args = _argv(kw, _options("train"), "train")
            rc, out, errtext = run_command("train", args, echo)
            if bridge.error is not None:
                raise bridge.error
            if rc not in (0, 3):
                raise _error_from(errtext, rc)
            path = kw["metrics"]
            if kind not in ("single", "chief") and not os.path.exists(path):
                return None
            return _history(path) if os.path.exists(path) else None
    finally:
        core.dp_external_register(name.encode(), None, err)
        del cbs


def launch(script, workers=2, ps=None, chief=None, args=(), echo=True, **launch_options):
    """Runs `script` (a Python file) as every task of a local cluster:
    `downpour launch --workers N [--ps P] [--chief] -- python3 SCRIPT ARGS`,
    with this interpreter.  args: the script's own arguments (give
    "--strategy", S among them so launch knows the strategy); launch's
    options (max_restarts, grace, log_level) as keywords.  With echo the
    tasks' lines go to this process's stdout and stderr and it returns
    None; without, it returns what they wrote on stderr (downpour's lines,
    prefixed with the task).  Raises downpour.Error when launch fails."""
    from . import _launch_script
    return _launch_script(script, workers, ps, chief, args, echo, launch_options)
