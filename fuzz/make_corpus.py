#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets under fuzz/corpus/<target>/:
valid inputs, so that fuzzing starts deep instead of at the first check.
Rerun it after changing a target's input format; the files are committed.
    python3 fuzz/make_corpus.py
The handshake and TCP targets write their own valid seeds, since a valid
transcript depends on the protocol in src/net/auth.c (see docs/fuzzing.md)."""
import gzip
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- cluster specs: byte 0 picks a --task override (0: none, 1 worker:0,
# 2 chief, 3 ps:1, 4 worker:4095), the rest is the spec.
def spec(name, override, obj):
    put("fuzz_cluster_spec", name, bytes([override]) + json.dumps(obj).encode())


def cluster_specs():
    spec("tf_config_full", 0, {"cluster": {"chief": ["h0:2222"], "worker": ["h3:2222", "h4:2222", "h5:2222"],
                                           "ps": ["h1:2222", "h2:2222"]},
                               "task": {"type": "worker", "index": 2}})
    spec("tf_config_workers", 0, {"cluster": {"worker": ["localhost:2223", "localhost:2224"]},
                                  "task": {"type": "worker", "index": 1}})
    spec("tf_config_ps_task", 0, {"cluster": {"ps": ["localhost:2222"],
                                              "worker": ["localhost:2223", "localhost:2224", "localhost:2225"]},
                                  "task": {"type": "ps", "index": 0}})
    spec("ipv6_override", 1, {"cluster": {"worker": ["[::1]:2222", "[fe80::1%eth0]:2222", "[2001:db8::7]:65535"]},
                              "task": {"type": "worker", "index": 0}})
    spec("tf_extra_keys_chief", 2, {"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                                    "environment": "cloud", "rpc_layer": "grpc"})
    spec("override_ps", 3, {"cluster": {"chief": ["c:1"], "worker": ["w0:2", "w1:3"], "ps": ["p0:4", "p1:5"]}})
    # downpour's own form: dp_cluster_to_json writes compact JSON, chief first
    put("fuzz_cluster_spec", "downpour_compact",
        b"\x00" + b'{"cluster":{"chief":["127.0.0.1:40001"],"worker":["127.0.0.1:40002",'
        b'"127.0.0.1:40003"],"ps":["127.0.0.1:40004"]},"task":{"type":"chief","index":0}}')
    spec("launcher_local", 0, {"cluster": {"chief": ["127.0.0.1:5000"],
                                           "worker": ["127.0.0.1:%d" % p for p in range(5001, 5005)],
                                           "ps": ["127.0.0.1:5005", "127.0.0.1:5006"]},
                               "task": {"type": "ps", "index": 1}})


# ---- IDX files, raw and gzip.
def idx(dims, data):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


def idx_files():
    files = {
        "labels_r1": idx([10], range(10)),
        "images_r3": idx([3, 4, 4], [(i * 37) & 255 for i in range(48)]),
        "matrix_r2": idx([5, 7], [(i * 11) & 255 for i in range(35)]),
        "tensor_r4": idx([2, 2, 3, 2], range(24)),
        "single": idx([1], [255]),
    }
    for name, raw in files.items():
        put("fuzz_idx", name, raw)
        put("fuzz_idx", name + ".gz", gzip.compress(raw, 9, mtime=0))
    # two gzip members in one file are one stream to zlib
    raw = files["images_r3"]
    put("fuzz_idx", "two_members.gz", gzip.compress(raw[:20], mtime=0) + gzip.compress(raw[20:], mtime=0))


# ---- dataset cache: byte 0 flags (bit 0 XOR onto the real cache the target
# builds, bit 1 re-sign the header, bit 2 DOWNPOUR_CACHE_VERIFY, bit 3 cut).
def xor_at(flags, edits, length=0):
    n = max([length] + [off + 1 for off in edits])
    b = bytearray(n)
    for off, v in edits.items():
        b[off] ^= v
    return bytes([flags]) + bytes(b)


def dataset_cache():
    put("fuzz_dataset_cache", "valid", b"\x01")
    put("fuzz_dataset_cache", "valid_resigned", b"\x03")
    put("fuzz_dataset_cache", "valid_verify", b"\x05")
    put("fuzz_dataset_cache", "version", xor_at(0x03, {8: 0x02}))
    put("fuzz_dataset_cache", "n_train", xor_at(0x03, {16: 0x01}))
    put("fuzz_dataset_cache", "rows", xor_at(0x03, {24: 0x03}))
    put("fuzz_dataset_cache", "classes", xor_at(0x03, {32: 0x01}))
    put("fuzz_dataset_cache", "payload_len", xor_at(0x03, {40: 0x10}))
    put("fuzz_dataset_cache", "dir_hash", xor_at(0x03, {48: 0x01}))
    put("fuzz_dataset_cache", "source_mtime", xor_at(0x03, {64: 0x01}))
    put("fuzz_dataset_cache", "label_byte", xor_at(0x03, {4096 + 12: 0x07}))
    put("fuzz_dataset_cache", "image_byte", xor_at(0x03, {4096: 0x01}))
    put("fuzz_dataset_cache", "truncated", xor_at(0x09, {}, 200))
    put("fuzz_dataset_cache", "trailing", xor_at(0x03, {4200: 0x01}))
    put("fuzz_dataset_cache", "raw_magic", b"\x00DPCACHE\x1a" + bytes(200))


# ---- ps server: byte 0 mode (+ 5 * optimiser), byte 1 workers-1 and flags,
# then ops [o, step, args]: o bits 0-1 sender (0 chief, k worker k-1), bits 2-7 op.
NP = 6


def push(sender, step, records, want, lr_idx, floats):
    return bytes([sender | 0 << 2, step, records, want, lr_idx]) + struct.pack("<%df" % len(floats), *floats)


def simple(sender, op, step, extra=b""):
    return bytes([sender | op << 2, step]) + extra


def ps_corpus():
    g1 = [0.5, -1.0, 0.25, 2.0, 0.0, 1.0]
    g2 = [1.0, 1.0, -0.5, 0.0, 3.0, -2.0]
    names = ["async", "sync", "ssp", "dssp", "avg"]
    for mode in range(5):
        for optim in (0, 4):  # sgd, adam
            b0 = mode + 5 * optim
            b1 = 1  # two workers, one ps task
            ops = b""
            for step in range(3):
                ops += push(1, step, 32, 1, 0, g1) + push(2, step, 16, 1, 0, g2)
                ops += simple(1, 11, 0) + simple(2, 11, 0)  # both read their replies
                ops += simple(0, 10, 10)  # the clock moves 0.1 s
            ops += simple(0, 3, 0, b"\x00")  # chief PULL
            ops += simple(0, 4, 0, b"\x00")  # chief PULL_AVERAGE
            ops += simple(0, 5, 3, b"\x00")  # chief STATE_REQ
            ops += simple(1, 6, 0, b"\x00") + simple(2, 6, 0, b"\x00")  # workers DONE
            ops += simple(0, 7, 0, b"\x00")  # chief SHUTDOWN
            put("fuzz_ps", "%s_%s" % (names[mode], ["sgd", "", "", "", "adam"][optim]), bytes([b0, b1]) + ops)
        # three workers, two ps tasks, moving average, a lost worker
        b1 = 2 | 4 | 8 | (1 << 4) | (2 << 6)
        ops = b""
        for step in range(2):
            for w in (1, 2, 3):
                ops += push(w % 4, step, 8, 1, 0, g1[:3])
        ops += simple(3, 9, 0)  # worker 2 crashes
        ops += push(1, 2, 8, 1, 0, g1[:3]) + simple(1, 11, 0)
        put("fuzz_ps", "%s_two_shards_lost" % names[mode], bytes([mode, b1]) + ops)


# ---- ring: byte 0 bit 0 size (3, 4), bits 1-7 floats - 1; byte 1 segment - 1,
# bit 4 reducer, bit 5 its thread; byte 2 bucket - 1; ops: 0 the next expected
# segment with its floats, then the predecessor crashes.
def chunk_lo(length, n, c):
    return length * c // n


def expected(length, n, p, sg):
    out = []
    for phase in range(2):
        for s in range(n - 1):
            c = (p - s - 1 + 2 * n) % n if phase == 0 else (p - s + n) % n
            i, hi = chunk_lo(length, n, c), chunk_lo(length, n, c + 1)
            while i < hi:
                k = min(sg, hi - i)
                out.append(k)
                i += k
    return out


def ring_corpus():
    for n in (3, 4):
        for length in (1, 8, 30, 128):
            for sg in (1, 4, 16):
                for red in (0, 1, 2):  # plain, reducer, threaded reducer
                    bucket = 12
                    if red:
                        counts = []
                        hi = length
                        while hi > 0:
                            lo = max(hi - bucket, 0)
                            counts += expected(hi - lo, n, 1, sg)
                            hi = lo
                    else:
                        counts = expected(length, n, 1, sg)
                    head = bytes([(n - 3) | (length - 1) << 1, (sg - 1) | (16 if red else 0) | (32 if red == 2 else 0),
                                  bucket - 1])
                    ops = b"".join(b"\x00" + struct.pack("<%df" % k, *[float(j + 1) for j in range(k)])
                                   for k in counts)
                    if sg == 4 and length in (8, 128) or (sg == 16 and length == 30):
                        put("fuzz_ring", "n%d_len%d_seg%d_%s" % (n, length, sg, ["plain", "reducer", "threaded"][red]),
                            head + ops)


# ---- TCP receive path: byte 0 how payloads are read (0 whole, 1 in pieces of
# bits 3-7 + 1, 2 skipped, 3 left) and bit 2 the keyed transport (the harness
# tags its frames there: wire version 3); then ops: kind 1 an encoded frame,
# 2 a chunked frame, 3 the transport's own types.
def tcp_frame(ty, step, offset, payload, extra=0):
    return bytes([1 | 4 | extra, ty]) + struct.pack("<HBBH", 0, step, offset, len(payload)) + payload


HEARTBEAT = bytes([3 | 5 << 2])
BYE = bytes([3 | 6 << 2])


def tcp_corpus():
    body = bytes(range(256)) * 2
    frames = tcp_frame(0, 1, 0, body[:100]) + HEARTBEAT + tcp_frame(3, 2, 40, body[:400]) + \
        tcp_frame(84, 3, 0, b"")
    put("fuzz_tcp", "frames_whole_bye", b"\x00" + frames + BYE)
    put("fuzz_tcp", "frames_pieces_eof", bytes([1 | 6 << 3]) + frames)
    put("fuzz_tcp", "frames_skipped_bye", b"\x02" + frames + BYE)
    put("fuzz_tcp", "frames_left_bye", b"\x03" + frames + BYE)
    put("fuzz_tcp", "chunked_bye", b"\x00" + bytes([2 | 1 << 4]) + struct.pack("<HB", 100, 0xAB) + BYE)
    put("fuzz_tcp", "chunked_bad_crc", b"\x00" + bytes([2 | 2 << 2]) + struct.pack("<HB", 7, 1) + BYE)
    put("fuzz_tcp", "keyed_frame", b"\x04" + tcp_frame(0, 1, 0, body[:64]) + BYE)
    put("fuzz_tcp", "keyed_frames_pieces_eof", bytes([4 | 1 | 6 << 3]) + frames)
    put("fuzz_tcp", "keyed_frames_left_bye", b"\x07" + frames + BYE)
    put("fuzz_tcp", "keyed_chunked_bye", b"\x04" + bytes([2 | 1 << 4]) + struct.pack("<HB", 100, 0xAB) + BYE)
    put("fuzz_tcp", "keyed_chunk1_bad_tag", b"\x04" + bytes([2 | 2 << 2]) + struct.pack("<HB", 7, 1) + BYE)
    put("fuzz_tcp", "keyed_bad_tag", b"\x04" + tcp_frame(0, 1, 0, body[:64], 32) + b"\x05" + BYE)
    put("fuzz_tcp", "keyed_payload_crc", b"\x04" + tcp_frame(0, 1, 0, body[:64], 128) + BYE)
    put("fuzz_tcp", "hello_after_handshake", b"\x00" + bytes([3 | 0 << 2]))


# ---- frame headers: 8 bytes of maximum length, the 48-byte header, the
# payload.  The version is read from frame.h, so the seeds follow it.
def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def frame_version():
    import re
    h = os.path.join(os.path.dirname(ROOT), "..", "include", "downpour", "frame.h")
    with open(h) as f:
        return int(re.search(r"#define DP_FRAME_VERSION (\d+)", f.read()).group(1))


def frame_header(ty, flags, source, step, offset, length, pcrc):
    h = struct.pack("<IHHIIQQQI", 0x46575044, frame_version(), ty, flags, source, step, offset, length, pcrc)
    return h + struct.pack("<I", crc32c(h))


def frame_corpus():
    big = (1 << 24) - 1  # the target keeps the low 24 bits of the maximum
    pay = bytes(range(64))
    put("fuzz_frame", "app_frame", struct.pack("<Q", big) + frame_header(17, 3, 2, 9, 40, len(pay), crc32c(pay)) + pay)
    put("fuzz_frame", "heartbeat", struct.pack("<Q", big) + frame_header(5, 0, 1, 0, 0, 0, 0))
    chunk = bytes(64)
    put("fuzz_frame", "chunked", struct.pack("<Q", big) +
        frame_header(16, 0x10000, 0, 1, 0, (1 << 20) + 5, crc32c(chunk)) + chunk)
    put("fuzz_frame", "too_long", struct.pack("<Q", 100) + frame_header(16, 0, 0, 0, 0, 101, 0))


if __name__ == "__main__":
    frame_corpus()
    tcp_corpus()
    cluster_specs()
    idx_files()
    dataset_cache()
    ps_corpus()
    ring_corpus()
