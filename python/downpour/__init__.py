"""downpour from Python (docs/python.md): train, launch a local cluster,
load, evaluate and convert checkpoints, with NumPy arrays or any dataset
`downpour train` reads.

    import downpour
    hist = downpour.train(model="mlp-300-100", data="mnist", epochs=2, lr=0.001)
    w = downpour.load("model.safetensors")          # name -> numpy array

Pure Python over libdownpour.so (ctypes).  From a build tree without
installing: PYTHONPATH=python (the package finds build/libdownpour.so), or
DOWNPOUR_LIB=path/to/libdownpour.so."""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

from ._lib import Error, library_path, program_path, run_command
from .weights import load, metadata

__all__ = ["Error", "train", "launch", "Cluster", "evaluate", "load", "metadata", "to_torch",
           "options", "library_path", "program_path"]

_options = {}


def _parse_help(text):
    """{name: takes_value} from a command's --help."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^  --([a-z0-9][a-z0-9-]*)(?: ([A-Z][A-Z0-9:|_-]*))?(?:\s|$)", line)
        if m and m.group(1) != "help":
            out[m.group(1)] = m.group(2) is not None
    return out


def options(command="train"):
    """The options of `downpour COMMAND` (train, launch, eval) as keyword
    names (underscores for dashes) -> whether each takes a value (False: a
    flag, given as True).  Read from the command's own --help, the one table
    they are declared in."""
    if command not in _options:
        if command == "launch":
            r = subprocess.run([program_path(), "launch", "--help"], capture_output=True,
                               text=True)
            text = r.stdout
        else:
            rc, text, _ = run_command(command, ["--help"], echo=False)
        _options[command] = {k.replace("-", "_"): v for k, v in _parse_help(text).items()}
    return dict(_options[command])


def _suggest(word, names):
    import difflib
    near = difflib.get_close_matches(word, names, n=1, cutoff=0.7)
    return f"; did you mean {near[0]}?" if near else ""


def _argv(kwargs, table, command):
    """--name value pairs for the keywords, each checked against the table."""
    args = []
    for key, value in kwargs.items():
        if key not in table:
            raise Error(f"{key}: unknown option of downpour {command}"
                        f"{_suggest(key, list(table))} (downpour.options('{command}') "
                        f"lists them)", key, 2)
        if value is None or value is False and not table[key]:
            continue
        flag = "--" + key.replace("_", "-")
        if not table[key]:
            if value is not True:
                raise Error(f"{key}: a flag: give True (or leave it out), not {value!r}", key, 2)
            args.append(flag)
            continue
        if isinstance(value, bool):
            raise Error(f"{key}: takes a value, not {value!r}", key, 2)
        if isinstance(value, float):
            value = repr(value)
        args += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return args


def _error_from(text, status, rename=None):
    """downpour's message (the lines of a refusal) as an Error naming the
    option it names first, as a keyword."""
    lines = [l for l in text.strip().splitlines() if l.strip()]
    # a task's own refusal ([worker 0] downpour train: ...) says more than
    # the launcher's account of its exit
    msgs = ([l for l in lines if re.match(r"^(\[[a-z]+ \d+\] )?downpour train:", l)][:1] or
            [l for l in lines if l.startswith("downpour") or "error" in l.lower()] or
            lines[-1:])
    msg = "\n".join(msgs) if msgs else f"exit status {status}"
    arg = None
    m = re.search(r"--([a-z][a-z0-9-]*)", msg)
    if m:
        arg = m.group(1).replace("-", "_")
        arg = (rename or {}).get(arg, arg)
    return Error(msg, arg, status)


class History(list):
    """The per-epoch metrics (the "epoch" events: epoch, val_accuracy,
    val_loss, train_loss, seconds, step, lr), with .done, the run's final
    "done" event (test_accuracy, train_seconds, samples_per_second, ...)."""
    done = None


def _history(path):
    epochs, done = History(), None
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            ev = e.pop("event", None)
            for k in ("t", "wall"):
                e.pop(k, None)
            if ev == "epoch":
                epochs.append(e)
            elif ev == "done":
                done = e
    epochs.done = done
    try:
        import pandas
    except ImportError:
        return epochs
    df = pandas.DataFrame(list(epochs))
    df.attrs["done"] = done
    return df


def _dataset_kwargs(data, kwargs):
    if "dataset" in kwargs:
        if data is not None:
            raise Error("data and dataset name the same thing: give one", "dataset", 2)
        data = kwargs.pop("dataset")
    return data


def _array_sizes(data, kw):
    """Without train_size, the arrays' last tenth validates (val_size's
    default): sets both in kw; returns where the test records start when
    data has no test arrays (the records after the training ones)."""
    from . import _data
    x = _data.split_arrays(data)[0]
    n = len(x)
    if kw.get("train_size") is None:
        val = kw.get("val_size")
        val = n // 10 if val is None else val
        kw["val_size"] = val
        kw["train_size"] = max(n - int(val), 1)
    try:
        return int(kw["train_size"])
    except (TypeError, ValueError):
        return None


def train(model=None, data=None, strategy=None, epochs=None, echo=True, **options_):
    """Trains in this process as `downpour train` would, and returns the
    history: per-epoch metrics (a pandas.DataFrame when pandas is importable,
    else a list of dicts), with the final "done" event as .done
    (DataFrame: .attrs["done"]).

    model: a preset or spec (--model); data: a dataset name or path
    (--dataset), or NumPy arrays (x, y), (x, y, x_test, y_test) or a dict of
    x_train, y_train, x_test, y_test; strategy (--strategy), epochs
    (--epochs); every other option of `downpour train` as a keyword,
    underscores for dashes (lr=0.01, train_size=5000, save="m.safetensors",
    quiet=True).  Arrays: x uint8 (pixels, scaled by 1/255) or float32 of
    shape (n, features), (n, h, w) or (n, c, h, w), y integer labels; they
    are used in place when C-contiguous.  Without train_size / val_size the
    last tenth of the arrays' records validate.  echo: forward downpour's
    lines to sys.stderr as they come.  Raises downpour.Error (.argument:
    the keyword it names) on a bad argument or a failed run."""
    from . import _data
    data = _dataset_kwargs(data, options_)
    kw = dict(options_)
    for k, v in (("model", model), ("strategy", strategy), ("epochs", epochs)):
        if v is not None:
            kw[k] = v
    table = options("train")
    arrays = data is not None and _data.is_arrays(data)
    mem = _data.MemoryDataset(data, _array_sizes(data, kw)) if arrays else None
    if mem is None and data is not None:
        kw["dataset"] = os.fspath(data)
    user_metrics = kw.get("metrics")
    with tempfile.TemporaryDirectory(prefix="downpour-py") as tmp:
        kw["metrics"] = user_metrics or os.path.join(tmp, "metrics.jsonl")
        args = _argv(kw, table, "train")
        if mem is not None:
            args = ["--dataset", mem.spec] + args
            with mem:
                rc, out, err = run_command("train", args, echo)
        else:
            rc, out, err = run_command("train", args, echo)
        if rc not in (0, 3):
            if mem is not None:
                err = err.replace("dataset " + mem.spec, "the arrays (data)")
                err = err.replace(mem.spec, "the arrays (data)")
            e = _error_from(err, rc, {"dataset": "data"})
            if e.argument is None and "(data)" in e.message or "dataset" in e.message:
                e.argument = e.argument or "data"
            raise e
        return _history(kw["metrics"])


def evaluate(path, data="mnist", test_size=None, echo=False):
    """The test accuracy of a checkpoint (`downpour eval`) on a dataset name
    or path, or on NumPy arrays (their test split: (x_test, y_test) alone,
    or any form train takes)."""
    from . import _data
    with tempfile.TemporaryDirectory(prefix="downpour-py") as tmp:
        metrics = os.path.join(tmp, "eval.jsonl")
        args = ["--checkpoint", os.fspath(path), "--metrics", metrics]
        if test_size:
            args += ["--test-size", str(int(test_size))]
        if _data.is_arrays(data):
            x, y, xt, yt = _data.split_arrays(data)
            if xt is None:
                xt, yt = x, y  # the arrays given are the records to test
            mem = _data.MemoryDataset((x, y, xt, yt))
            with mem:
                rc, out, err = run_command("eval", args + ["--dataset", mem.spec], echo)
        else:
            rc, out, err = run_command("eval", args + ["--dataset", os.fspath(data)], echo)
        if rc != 0:
            raise _error_from(err, rc, {"dataset": "data", "checkpoint": "path"})
        with open(metrics) as f:
            return json.loads(f.readline())["test_accuracy"]


def _forward(stream, sink, keep):
    for line in iter(stream.readline, ""):
        keep.append(line)
        if sink is not None:
            sink.write(line)
            sink.flush()


def _launch_script(script, workers, ps, chief, args, echo, launch_options):
    """`downpour launch ... -- python3 SCRIPT ARGS` with this interpreter
    (downpour.torch's scripts: docs/python.md, "PyTorch")."""
    cmd = [program_path(), "launch", "--workers", str(workers)]
    if ps:
        cmd += ["--ps", str(ps)]
    if chief:
        cmd.append("--chief")
    cmd += _argv(launch_options, options("launch"), "launch")
    cmd += ["--", sys.executable, os.fspath(script)] + [str(a) for a in args]
    p = subprocess.run(cmd, stdout=None if echo else subprocess.PIPE,
                       stderr=None if echo else subprocess.PIPE, text=True)
    if p.returncode not in (0, 3):
        raise Error(f"downpour launch exited {p.returncode}" +
                    (f": {p.stderr.strip().splitlines()[-1]}" if p.stderr else ""),
                    None, p.returncode)
    return None if echo else p.stderr


def launch(workers=2, ps=None, chief=None, strategy=None, model=None, data=None, epochs=None,
           echo=True, script=None, args=(), **options_):
    """Runs a local cluster as `downpour launch --workers N [--ps P] [--chief]
    -- train ...` does (the program, as a subprocess: the same ports, secret,
    restarts and fault handling), and returns the history of the merged
    metrics, as train's.  Launch's own options (max_restarts, grace,
    log_level, verbose) and every train option are keywords; NumPy arrays
    are written to an .npz the tasks read.

    script: a Python file to run as every task instead of train (one that
    trains through downpour.torch), with args its arguments (strategy, when
    given, is passed as --strategy S among them, so launch knows it); only
    launch's options are keywords then.  Returns None with echo, else the
    tasks' stderr."""
    if script is not None:
        args = list(args) + (["--strategy", strategy] if strategy else [])
        given = {"model": model, "data": data, "epochs": epochs}
        bad = [k for k, v in given.items() if v is not None]
        if bad:
            raise Error(f"{bad[0]}: with script=, give it among the script's args", bad[0], 2)
        return _launch_script(script, workers, ps, chief, args, echo, options_)
    from . import _data
    data = _dataset_kwargs(data, options_)
    ltable = options("launch")
    lkw = {k: options_.pop(k) for k in list(options_) if k in ltable and k not in ("ps",)}
    lkw["workers"] = workers
    if ps is not None:
        lkw["ps"] = ps
    if chief:
        lkw["chief"] = True
    kw = dict(options_)
    for k, v in (("model", model), ("strategy", strategy), ("epochs", epochs)):
        if v is not None:
            kw[k] = v
    table = options("train")
    with tempfile.TemporaryDirectory(prefix="downpour-py") as tmp:
        if data is not None and _data.is_arrays(data):
            path = os.path.join(tmp, "data.npz")
            _data.save_npz(data, path, _array_sizes(data, kw))
            kw["dataset"] = path
        elif data is not None:
            kw["dataset"] = os.fspath(data)
        kw["metrics"] = kw.get("metrics") or os.path.join(tmp, "metrics.jsonl")
        for k in kw:
            if k not in table:
                raise Error(f"{k}: unknown option of downpour launch or train"
                            f"{_suggest(k, list(table) + list(ltable))}", k, 2)
        args = ([program_path(), "launch"] + _argv(lkw, ltable, "launch") + ["--", "train"] +
                _argv(kw, table, "train"))
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = [], []
        threads = [threading.Thread(target=_forward, args=(p.stdout, sys.stdout if echo else None,
                                                           out)),
                   threading.Thread(target=_forward, args=(p.stderr, sys.stderr if echo else None,
                                                           err))]
        for t in threads:
            t.start()
        try:
            rc = p.wait()
        except KeyboardInterrupt:
            p.send_signal(2)  # launch forwards it to every task
            rc = p.wait()
            raise
        finally:
            for t in threads:
                t.join()
        if rc not in (0, 3):
            raise _error_from("".join(err), rc, {"dataset": "data"})
        return _history(kw["metrics"])


class Cluster:
    """A cluster's shape and spec.  Cluster(workers=2, ps=1, chief=True)
    .launch(**train options) runs it locally (downpour.launch); .spec(hosts)
    gives the {"cluster": {...}} JSON of docs/cluster.md for tasks on given
    addresses, and .save(path, ...) writes it, for `downpour run`."""

    def __init__(self, workers=2, ps=0, chief=False):
        self.workers, self.ps, self.chief = int(workers), int(ps), bool(chief)

    def __repr__(self):
        return f"Cluster(workers={self.workers}, ps={self.ps}, chief={self.chief})"

    def launch(self, **train_options):
        return launch(workers=self.workers, ps=self.ps or None, chief=self.chief,
                      **train_options)

    def spec(self, host="127.0.0.1", port=2222):
        """Each task on host, ports from `port` up (chief, ps, workers)."""
        ports = iter(range(port, port + 1 + self.ps + self.workers))
        c = {}
        if self.chief:
            c["chief"] = [f"{host}:{next(ports)}"]
        if self.ps:
            c["ps"] = [f"{host}:{next(ports)}" for _ in range(self.ps)]
        c["worker"] = [f"{host}:{next(ports)}" for _ in range(self.workers)]
        return {"cluster": c}

    def save(self, path, host="127.0.0.1", port=2222):
        with open(path, "w") as f:
            json.dump(self.spec(host, port), f)
        return path


def to_torch(path_or_weights, model=None):
    """An equivalent torch.nn.Module (eval mode) with the weights loaded
    (load_state_dict strict): path_or_weights a checkpoint path or a dict of
    arrays (downpour.load); model the spec or preset, read from the
    checkpoint's metadata when not given.  Dense stacks (mlp-300-100, ...),
    cnn-mnist, mlp-bn, resnet-fashion and vit-mnist."""
    import torch
    from . import nets
    name = None
    if isinstance(path_or_weights, (str, os.PathLike)):
        meta = metadata(path_or_weights)
        weights = load(path_or_weights)
        name = meta.get("model_name")
        if model is None:
            model = meta.get("model")
    else:
        weights = path_or_weights
        if model is None:
            raise Error("to_torch: give model= with a dict of weights", "model")
    try:
        module = nets.module_for(model, name)
    except ValueError as e:
        raise Error(str(e), "model") from None
    state = {k: torch.from_numpy(v.copy()) for k, v in weights.items() if k.startswith("layers.")}
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise Error(f"to_torch: the weights do not fit model {model}: {e}", "model") from None
    return module.eval()
