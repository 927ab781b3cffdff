"""NumPy arrays as a dataset of libdownpour (dp_dataset_register): the
arrays are handed over by pointer, copied only where their layout or
dtype asks for it (docs/python.md, "Data")."""
import ctypes
import itertools
import os

from ._lib import Error, libs

_counter = itertools.count()


class _MemoryData(ctypes.Structure):
    _fields_ = [("train_x", ctypes.c_void_p), ("train_y", ctypes.c_void_p),
                ("n_train", ctypes.c_uint32),
                ("test_x", ctypes.c_void_p), ("test_y", ctypes.c_void_p),
                ("n_test", ctypes.c_uint32),
                ("rows", ctypes.c_uint32), ("cols", ctypes.c_uint32),
                ("channels", ctypes.c_uint32), ("is_float", ctypes.c_int),
                ("classes", ctypes.c_uint32)]


class _Err(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 512)]  # DP_ERR_MAX


def _np():
    try:
        import numpy
    except ImportError:
        raise Error("NumPy arrays as data need numpy (Debian: python3-numpy)", "data")
    return numpy


def is_arrays(data):
    return not isinstance(data, (str, os.PathLike))


def split_arrays(data):
    """(x_train, y_train, x_test, y_test) from data: (x, y), (x, y, x_test,
    y_test), ((x, y), (x_test, y_test)), or a mapping with x_train, y_train
    and optionally x_test, y_test (keras's mnist.npz)."""
    if hasattr(data, "keys"):
        missing = [k for k in ("x_train", "y_train") if k not in data]
        if missing:
            raise Error(f"data: a mapping needs x_train and y_train (and x_test, y_test for "
                        f"a test set); {', '.join(missing)} missing", "data")
        return data["x_train"], data["y_train"], data.get("x_test"), data.get("y_test")
    if isinstance(data, (tuple, list)):
        if len(data) == 2 and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in data):
            return data[0][0], data[0][1], data[1][0], data[1][1]
        if len(data) == 2:
            return data[0], data[1], None, None
        if len(data) == 4:
            return tuple(data)
    raise Error("data: a dataset name or path, or NumPy arrays: (x, y), (x, y, x_test, "
                "y_test), ((x, y), (x_test, y_test)) or a dict of x_train, y_train, x_test, "
                f"y_test; got {type(data).__name__}", "data")


def _records(np, x, what):
    """x as a C-contiguous uint8 or float32 array of records and its
    (rows, cols, channels): (n, d), (n, h, w) and (n, 1, h, w) as they are
    (zero-copy when contiguous), (n, c, h, w) with c > 1 stored pixel by
    pixel (HWC, a copy), as libdownpour's images of several channels."""
    x = np.asarray(x)
    if x.dtype not in (np.uint8, np.float32):
        hint = " (.astype(numpy.float32))" if x.dtype.kind == "f" else ""
        raise Error(f"data: {what} must be uint8 (pixels, scaled by 1/255) or float32 "
                    f"(used as they are), not {x.dtype}{hint}", "data")
    if x.ndim == 2:
        d = x.shape[1]
        k = int(round(d ** 0.5))
        rows, cols, ch = (k, k, 1) if k * k == d else (1, d, 1)
    elif x.ndim == 3:
        rows, cols, ch = x.shape[1], x.shape[2], 1
    elif x.ndim == 4:
        ch, rows, cols = x.shape[1], x.shape[2], x.shape[3]
        if ch > 1:
            x = x.transpose(0, 2, 3, 1)
    else:
        raise Error(f"data: {what} must be (n, features), (n, h, w) or (n, c, h, w); got "
                    f"shape {x.shape}", "data")
    if x.shape[0] == 0 or rows * cols * ch == 0:
        raise Error(f"data: {what} holds no values (shape {x.shape})", "data")
    return np.ascontiguousarray(x), (rows, cols, ch)


def _labels(np, y, n, what):
    y = np.asarray(y)
    if y.ndim != 1:
        raise Error(f"data: {what} must be one label a record (shape (n,)), got shape "
                    f"{y.shape}", "data")
    if len(y) != n:
        raise Error(f"data: {what} holds {len(y)} labels for {n} records", "data")
    if y.dtype.kind not in "iu":
        raise Error(f"data: {what} must be integer class labels, not {y.dtype}", "data")
    if n and (y.min() < 0 or y.max() > 255):
        raise Error(f"data: {what}: labels must be in [0, 255] (classes 0..C-1), "
                    f"found {y.min()}..{y.max()}", "data")
    return np.ascontiguousarray(y, dtype=np.uint8)


class MemoryDataset:
    """Registers arrays under a fresh name while in a `with`; .spec is the
    --dataset value ("mem:NAME"), .n_train the training records, .copied
    whether any array had to be copied."""

    def __init__(self, data, test_from=None):
        np = _np()
        x, y, xt, yt = split_arrays(data)
        x0 = np.asarray(x)
        self.x, shape = _records(np, x, "x")
        self.y = _labels(np, y, len(self.x), "y (the labels)")
        self.copied = self.x is not x0 and not np.shares_memory(self.x, x0)
        if (xt is None) != (yt is None):
            raise Error("data: x_test and y_test go together", "data")
        if xt is not None:
            self.xt, tshape = _records(np, xt, "x_test")
            if tshape != shape or self.xt.dtype != self.x.dtype:
                raise Error(f"data: x_test's records ({tuple(self.xt.shape[1:])} "
                            f"{self.xt.dtype}) differ from x's ({tuple(self.x.shape[1:])} "
                            f"{self.x.dtype})", "data")
            self.yt = _labels(np, yt, len(self.xt), "y_test")
        elif test_from is not None:
            # no test arrays: the records after the training ones test (the
            # validation records), or all of them when none are left
            k = test_from if test_from < len(self.x) else 0
            self.xt, self.yt = self.x[k:], self.y[k:]
        else:
            self.xt = self.yt = None
        self.shape = shape
        self.n_train = len(self.x)
        self.name = f"py{os.getpid()}-{next(_counter)}"
        self.spec = "mem:" + self.name

    def __enter__(self):
        core, _ = libs()
        d = _MemoryData()
        d.train_x = self.x.ctypes.data
        d.train_y = self.y.ctypes.data
        d.n_train = len(self.x)
        if self.xt is not None:
            d.test_x, d.test_y, d.n_test = self.xt.ctypes.data, self.yt.ctypes.data, len(self.xt)
        d.rows, d.cols, d.channels = self.shape
        d.is_float = int(self.x.dtype.kind == "f")
        err = _Err()
        core.dp_dataset_register.argtypes = [ctypes.c_char_p, ctypes.POINTER(_MemoryData),
                                             ctypes.POINTER(_Err)]
        if core.dp_dataset_register(self.name.encode(), ctypes.byref(d), ctypes.byref(err)) < 0:
            raise Error("data: " + err.msg.decode("utf-8", "replace"), "data")
        return self

    def __exit__(self, *exc):
        core, _ = libs()
        core.dp_dataset_unregister.argtypes = [ctypes.c_char_p]
        core.dp_dataset_unregister(self.name.encode())
        return False


def save_npz(data, path, test_from=None):
    """The arrays as an .npz of x_train, y_train[, x_test, y_test] (what
    --dataset reads in another process: downpour.launch)."""
    np = _np()
    m = MemoryDataset(data, test_from)
    arrays = {"x_train": m.x, "y_train": m.y}
    if m.xt is not None:
        arrays.update(x_test=m.xt, y_test=m.yt)

    rows, cols, ch = m.shape
    for k in ("x_train", "x_test"):
        if k in arrays:
            a = arrays[k]
            arrays[k] = a.reshape((len(a), rows, cols) + ((ch,) if ch > 1 else ()))
    np.savez(path, **arrays)
    return m.n_train
