"""Safetensors files (what `train --save` writes) read in plain Python: an
8-byte little-endian header length, a JSON header, then the raw tensors.
No `safetensors` package (Debian ships none)."""
import json
import struct

_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4",
           "U8": "u1", "I8": "i1"}


def read_safetensors(path):
    """(header without __metadata__, metadata, raw bytes after the header)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    return header, meta, memoryview(raw)[8 + n:]


def load(path):
    """The weights of a safetensors file as a dict name -> numpy array (in the
    file's order); the file's metadata is in load.metadata(path)."""
    import numpy as np
    header, _, body = read_safetensors(path)
    out = {}
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dt = _DTYPES.get(t["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name}: dtype {t['dtype']} not supported")
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(body[b:e], dtype=dt).reshape(t["shape"]).copy()
    return out


def metadata(path):
    """The file's __metadata__ (model, dataset, strategy, ...) as a dict."""
    return read_safetensors(path)[1]
