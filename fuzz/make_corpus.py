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
import zlib

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
    # sparse rows (byte 0 bit 7): pushes with rows sections (op 12: head,
    # the dense floats, [count | flags, first] and count x 2 rate indices),
    # PULL_ROWS (op 13), PULL_TABLE (op 14), state, a bad id
    for mode, optim in ((0, 3), (1, 0), (1, 4), (2, 3)):
        ops = b""
        for step in range(3):
            for w in (1, 2):
                ops += bytes([w | 12 << 2, step, 8, 1, 0]) + struct.pack("<6f", *g1)
                ops += bytes([2, step, 2, 10, 3, 11])  # ids step, step + 1
            ops += simple(1, 11, 0) + simple(2, 11, 0)
        ops += bytes([1 | 13 << 2, 0, 3, 1]) + simple(1, 11, 0)
        ops += simple(0, 14, 0, bytes([0x01, 0, 2]))  # PULL_TABLE: part 1, rows [0, +2)
        ops += simple(0, 14, 0, bytes([0x00, 2, 1]))  # part 0, rows [2, +1)
        # a client reads 40 bytes as the answer to rows [0, +2): the ask's head, 2 rows
        ops += simple(0, 14, 0, bytes([0x40, 0, 2, 40]) + struct.pack("<4I", 0, 0, 0, 2) + bytes(24))
        ops += simple(0, 11, 0, b"\x00")  # the chief reads the answers
        ops += simple(0, 5, 3, b"\x00")  # chief STATE_REQ
        ops += bytes([2 | 12 << 2, 4, 8, 1, 0]) + struct.pack("<6f", *g2) + bytes([2, 7, 1, 2, 3, 4])  # ids 7, 8: past the table
        ops += simple(0, 14, 0, bytes([0x00, 1, 3]))  # more than a chunk: refused
        ops += simple(0, 7, 0, b"\x00")
        put("fuzz_ps", "rows_%s_%s" % (names[mode], ["sgd", "", "", "adagrad", "adam"][optim]),
            bytes([0x80 | (mode + 5 * optim), 1]) + ops)
    # compression (byte 0 bits 0-6 / 30: 1 bf16, 2 fp16, 3 topk:0.3; from
    # 120 bf16 answers): coded pushes (op 15: head, [kind | count delta],
    # then bf16 values or (index, rate index) pairs), a bad one, replies read
    bf16 = bytes([0x80, 0x3F]) * 6  # 1.0 six times: the one-ps shard's 6
    for mode, b0, body in ((0, 3 * 30, bytes([0, 10, 3, 0])),  # topk: 2 pairs
                           (1, 1 * 30 + 1, bf16), (2, 2 * 30 + 2, bf16)):
        ops = b""
        for step in range(2):
            for w in (1, 2):
                ops += bytes([w | 15 << 2, step, 8, 1, 0, 0x04]) + body
            ops += simple(1, 11, 0) + simple(2, 11, 0)
        ops += bytes([1 | 15 << 2, 3, 8, 1, 0, 0x08]) + body + body  # a count one too many
        ops += bytes([2 | 15 << 2, 3, 8, 1, 0, 0x85, 1, 2, 3, 4, 5])  # arbitrary bytes
        ops += simple(0, 3, 0, b"\x00") + simple(0, 7, 0, b"\x00")
        put("fuzz_ps", "coded_%s" % ["topk", "bf16", "fp16"][mode], bytes([b0, 1]) + ops)
    ops = b""
    for step in range(2):
        ops += push(1, step, 8, 1, 0, g1) + simple(1, 11, 0)
    put("fuzz_ps", "reply_bf16", bytes([120, 0]) + ops)


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


# ---- shared-memory rings: byte 0 the ring (64 << b), byte 1 the largest
# frame (0: 1 MiB), then operations (fuzz_shm.c's switch on op % 12).  A
# small model of the ring places the publishes and reads so that every frame
# streams through whole, wraps included.
class ShmSeq:
    def __init__(self, ring_code, max_code=0):
        self.cap = 64 << ring_code
        self.b = bytearray([ring_code, max_code])
        self.queued = self.tail = self.head = self.pend = 0
        self.pad = 0
        self.lens = []  # frames queued, not yet taken

    def frame(self, length, seed, ty=None):
        if ty is not None:
            self.b += bytes([24, ty]) + struct.pack("<H", length & 0xFFFF)
        elif length > 0xFFFF:
            self.b += bytes([[36, 108, 168, 228][length & 3]]) + struct.pack("<H", length >> 4)
            length = (length >> 4) << 4 | (length & 3)
        else:
            self.b += b"\x00" + struct.pack("<H", length)
        self.b.append(seed)
        self.queued += (48 + length + 7) & ~7
        self.lens.append(length)

    def pump(self, n):
        n = min(n, self.cap - (self.tail - self.head), self.queued - self.tail)
        while n > 0:
            k = min(n, 256) if n < 16 or n <= 256 else n - n % 16
            if k <= 256:
                self.b += bytes([3, k - 1])
            else:
                self.b += bytes([0x87]) + struct.pack("<H", k >> 4)
            self.tail += k
            n -= k

    def avail(self):
        return self.tail - self.head

    def next(self):
        self.head += self.pad
        length = self.lens.pop(0)
        self.b.append(7)
        self.head += 48
        self.pend = length
        self.pad = -(48 + length) & 7

    def recv(self, mode, n):  # mode 0 copy, 1 add, 2 drop
        op = [104, 68, 80][mode] if n > 4096 else [8, 20, 32][mode]
        self.b += bytes([op]) + struct.pack("<H", n - 1)
        self.head += n
        self.pend -= n

    def stream(self, mode, piece):
        """Takes the next frame whole: header, then its payload as it is published."""
        self.pump(self.cap)
        self.next()
        while self.pend:
            if self.avail() == 0:
                self.pump(self.cap)
            n = min(self.pend, self.avail(), piece)
            if mode == 1:
                n -= n % 4
                if n == 0:
                    self.pump(self.cap)
                    continue
            self.recv(mode, n)
        if self.pad and self.avail() < self.pad:
            self.pump(self.cap)


def shm_corpus():
    s = ShmSeq(0)  # 64-byte ring: every header wraps
    for i, n in enumerate([0, 1, 7, 100, 8]):
        s.frame(n, i)
        s.stream(i % 3 if n % 4 == 0 else i % 2 * 2, 13)
    put("fuzz_shm", "ring64_small_frames", bytes(s.b))
    s = ShmSeq(6)  # 4 KiB ring, a frame of 10 000 bytes streams through it
    s.frame(10000, 3)
    s.frame(64, 4)
    s.stream(1, 4096)
    s.stream(0, 30)
    put("fuzz_shm", "ring4k_stream_add", bytes(s.b))
    s = ShmSeq(10, 0)  # 64 KiB ring, a frame of 200 000 bytes, copied out in odd pieces
    s.frame(200000, 9)
    s.stream(0, 4093)
    put("fuzz_shm", "ring64k_big_copy", bytes(s.b))
    s = ShmSeq(2, 1)  # largest frame 97 bytes: a frame of 200 is refused
    s.frame(40, 1)
    s.stream(2, 64)
    s.frame(200, 2)
    s.pump(256)
    s.b.append(7)
    put("fuzz_shm", "too_long", bytes(s.b))
    # our side sends frames while the peer reads them
    put("fuzz_shm", "send_and_read", bytes([1, 0]) + bytes([9, 100, 0, 10, 30]) +
        bytes([10]) + struct.pack("<H", 200) + bytes([9, 0x90, 1, 50, 200]) +
        bytes([10]) + struct.pack("<H", 2000) + bytes([9, 3, 0, 1, 1, 11]))
    # garbage where a header should be, an impossible write position
    put("fuzz_shm", "raw_header", bytes([0, 0, 2, 63]) + bytes(range(64)) + bytes([3, 63, 7]))
    put("fuzz_shm", "bad_tail", bytes([0, 0, 5, 3, 7, 11]))
    s = ShmSeq(1)
    s.frame(50, 1, ty=17)
    s.pump(128)
    s.b += bytes([8 + 12 * 0, 5, 0, 6, 64, 0, 1, 2, 3, 4, 5, 6, 7, 8, 7])
    put("fuzz_shm", "scribble_mid_frame", bytes(s.b))
    # a waiting sender takes the peer's frames off the ring (dp_shm_drain,
    # op 11 | 0x80 = 143), so reads come from its overflow, then the ring
    s = ShmSeq(4)  # 1 KiB ring
    s.frame(3000, 5)
    s.frame(16, 6)
    for _ in range(4):
        s.pump(s.cap)
        s.b.append(143)
        s.head = s.tail  # the overflow holds it; the ring is free
    s.head = 0  # reads below: the stream from its start
    s.tail = s.queued
    s.next()
    s.recv(1, 3000)
    s.next()
    s.recv(0, 16)
    put("fuzz_shm", "drained_overflow", bytes(s.b))
    # a float cut by the write position, then nothing more: the receiver
    # takes the two bytes and waits (it used to spin on them, never waiting)
    put("fuzz_shm", "add_partial_float", bytes([0, 0, 0, 8, 0, 1, 3, 49, 7, 20, 7, 0]))


# ---- TFRecord files (fuzz_tfrecord: byte 0 the flags, docs/fuzzing.md) and
# tf.train.Example records with PNG images (fuzz_example: byte 0 bit 0 a PNG).
def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(records):
    out = b""
    for r in records:
        head = struct.pack("<Q", len(r))
        out += head + struct.pack("<I", masked_crc(head)) + r + struct.pack("<I", masked_crc(r))
    return out


def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


def ld(field, body):  # a length-delimited field
    return varint(field << 3 | 2) + varint(len(body)) + body


def example(features):  # [(name, kind, values)], kind "bytes", "float" or "int64", packed
    entries = b""
    for name, kind, values in features:
        if kind == "bytes":
            lst = ld(1, b"".join(ld(1, v) for v in values))
        elif kind == "float":
            lst = ld(2, ld(1, b"".join(struct.pack("<f", v) for v in values)))
        else:
            lst = ld(3, ld(1, b"".join(varint(v) for v in values)))
        entries += ld(1, ld(1, name.encode()) + ld(2, lst))
    return ld(1, entries)


def png(width, height, color, depth, pixels, palette=None):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    stride = (width * channels * depth + 7) // 8
    rows = b"".join(b"\0" + bytes(pixels[y * stride:(y + 1) * stride]) for y in range(height))
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0))
    if palette:
        out += chunk(b"PLTE", palette)
    return out + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def tfrecord_corpus():
    digit = png(28, 28, 0, 8, [(i * 37 + (i // 28) * 11) & 0xFF for i in range(784)])
    mnist = example([("image", "bytes", [digit]), ("label", "int64", [3])])
    recs = [mnist, b"", b"downpour", bytes(range(200))]
    raw = tfrecord(recs)
    gz = gzip.compress(raw, mtime=0)
    put("fuzz_tfrecord", "raw_auto", b"\x00" + raw)
    put("fuzz_tfrecord", "gzip_auto", b"\x00" + gz)
    put("fuzz_tfrecord", "raw_option", b"\x01" + raw)
    put("fuzz_tfrecord", "gzip_option", b"\x02" + gz)
    put("fuzz_tfrecord", "limit_100", b"\x04" + raw)
    put("fuzz_tfrecord", "two_members.gz", b"\x00" + gzip.compress(raw[:30], mtime=0) + gzip.compress(raw[30:], mtime=0))
    put("fuzz_tfrecord", "cut", b"\x00" + raw[:-3])
    small = b"".join(bytes([len(r)]) + r for r in [b"abc", b"", b"x" * 40, b"downpour"])
    put("fuzz_tfrecord", "framed_raw", b"\x08" + b"\x00\x00\x01" + small)
    put("fuzz_tfrecord", "framed_gzip", b"\x18" + b"\x00\x00\x01" + small)
    put("fuzz_tfrecord", "framed_xor", b"\x28" + b"\x14\x00\x40" + small)
    put("fuzz_tfrecord", "framed_cut", b"\x48" + b"\x1e\x00\x01" + small)
    put("fuzz_tfrecord", "framed_gzip_xor", b"\x38" + b"\x1e\x00\x02" + small)
    put("fuzz_tfrecord", "framed_gzip_cut", b"\x58" + b"\x1e\x00\x01" + small)


def example_corpus():
    digit = png(28, 28, 0, 8, [(i * 37 + (i // 28) * 11) & 0xFF for i in range(784)])
    rgb = png(4, 3, 2, 8, list(range(36)))
    put("fuzz_example", "mnist", b"\x00" + example([("image", "bytes", [digit]), ("label", "int64", [3])]))
    put("fuzz_example", "kinds", b"\x00" + example([("f", "float", [1.0, -2.5, 0.0]), ("i", "int64", [-1, 300, 0]),
                                                      ("b", "bytes", [b"hi", b"", rgb])]))
    # unpacked repeats, as test_example.c builds them by hand
    unpacked_i = ld(3, b"".join(varint(1 << 3) + varint(v) for v in [1, -1, 300]))
    unpacked_f = ld(2, b"".join(bytes([0x0D]) + struct.pack("<f", v) for v in [1.0, -2.5]))
    put("fuzz_example", "unpacked", b"\x00" + ld(1, ld(1, ld(1, b"a") + ld(2, unpacked_i)) +
                                                  ld(1, ld(1, b"b") + ld(2, unpacked_f))))
    put("fuzz_example", "png_gray", b"\x01" + digit)
    put("fuzz_example", "png_rgb", b"\x01" + rgb)
    put("fuzz_example", "png_gray_alpha", b"\x01" + png(3, 2, 4, 8, list(range(12))))
    put("fuzz_example", "png_rgba", b"\x01" + png(2, 2, 6, 8, list(range(16))))
    put("fuzz_example", "png_16bit", b"\x01" + png(2, 2, 0, 16, list(range(8))))
    put("fuzz_example", "png_1bit", b"\x01" + png(8, 2, 0, 1, [0xA5, 0x5A]))
    put("fuzz_example", "png_palette", b"\x01" + png(2, 2, 3, 8, [0, 1, 1, 0], palette=bytes(range(6))))
# ---- NumPy: byte 0 picks what the rest is (0 .npy, 1 .npz opened at member
# "a", 2/3 a .npy the harness wraps stored/deflated), the read pattern (bits
# 2-3) and labels (bit 4); byte 1 + 1 is the class count; the rest the file,
# as numpy writes it.
def npy(descr, shape, data, version=1, fortran=False):
    sh = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, sh)
    pre = 10 if version == 1 else 12
    total = (pre + len(d) + 1 + 63) // 64 * 64
    hdr = (d + " " * (total - pre - len(d) - 1) + "\n").encode()
    ln = struct.pack("<H", len(hdr)) if version == 1 else struct.pack("<I", len(hdr))
    return b"\x93NUMPY" + bytes([version, 0]) + ln + hdr + data


def npz(members, compress):
    import io
    import zipfile
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", compression=method) as zf:
        for name, data in members:
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # reproducible seeds
            zi.compress_type = method
            with zf.open(zi, "w", force_zip64=True) as f:  # as numpy.savez does
                f.write(data)
    return buf.getvalue()


def npy_corpus():
    img = npy("|u1", (3, 4, 4), bytes((i * 37) % 256 for i in range(48)))
    lab = npy("<i8", (3,), struct.pack("<3q", 1, 0, 2))
    put("fuzz_npy", "u1_images", b"\x00\x09" + img)
    put("fuzz_npy", "i8_labels", b"\x10\x09" + lab)
    put("fuzz_npy", "f4_v2_rows", b"\x04\x09" + npy("<f4", (4, 2), struct.pack("<8f", *range(8)), 2))
    put("fuzz_npy", "f8_be_v3", b"\x08\x09" + npy(">f8", (2, 2), struct.pack(">4d", 1, -2, 3.5, 0), 3))
    put("fuzz_npy", "i2_be", b"\x0c\x09" + npy(">i2", (5,), struct.pack(">5h", -1, 2, 3, 400, 5)))
    put("fuzz_npy", "b1_fortran", b"\x10\x09" + npy("|b1", (4, 1), bytes([0, 1, 1, 0]), fortran=True))
    put("fuzz_npy", "u8_empty", b"\x00\x09" + npy("<u8", (0, 3), b""))
    put("fuzz_npy", "npz_stored", b"\x01\x09" + npz([("a.npy", img), ("b.npy", lab)], False))
    put("fuzz_npy", "npz_deflated", b"\x05\x09" + npz([("b.npy", lab), ("a.npy", img)], True))
    put("fuzz_npy", "npz_labels", b"\x11\x09" + npz([("a.npy", lab)], True))
    put("fuzz_npy", "wrap_stored", b"\x02\x09" + img)
    put("fuzz_npy", "wrap_deflated", b"\x0b\x09" + npy("<f4", (4, 2), struct.pack("<8f", *range(8))))
    put("fuzz_npy", "wrap_labels", b"\x13\x09" + lab)


# ---- CSV: byte 0 the configuration (bit 0 no header, bits 1-2 the label
# column: default, "label", "b", index byte 1 % 4; bit 3 ';'; bit 4 a 64-byte
# record limit), byte 2 % 16 + 1 the class count; the rest the file.
def csv_corpus():
    put("fuzz_csv", "label_first", b"\x00\x00\x09label,a,b\n1,2.5,3\n0,-1,1e3\n")
    put("fuzz_csv", "crlf_quoted", b"\x02\x00\x09\xef\xbb\xbf\"x, 1\",label\r\n 4 ,\"2\"\r\n\r\n")
    put("fuzz_csv", "by_name_b", b"\x04\x00\x09a,b,c\n1,2,3\n4,5,6\n")
    put("fuzz_csv", "no_header", b"\x07\x02\x09" b"1,2,3\n\n4,5,6")
    put("fuzz_csv", "semicolons", b"\x08\x00\x09label;\"a\"\"q\";b\n1;2;3\n")
    put("fuzz_csv", "short_limit", b"\x10\x00\x09label,a\n1,2\n" + b"3," + b"9" * 70 + b"\n")
    put("fuzz_csv", "multiline_name", b"\x00\x00\x09\"a\nb\",label\n1,2\n")


# ---- the record files' cache (version 3): byte 0 flags (bit 0 XOR onto the
# real cache the target builds, bit 1 re-sign the header, bit 2 re-sign the
# payload's CRCs, bit 3 cut, bit 4 the float dataset, bit 5 a window: u16
# offset then the bytes XORed there).  The header is 104 bytes and 64 a file
# (3 files), its CRC at 296, the payload at 4096: train values, test values,
# train labels (5), test labels (2); a record is 12 bytes, or 5 floats.
def files_window(flags, off, xor):
    return bytes([flags | 0x21]) + struct.pack("<H", off) + bytes(xor)


def dataset_files_cache():
    t = "fuzz_dataset_files_cache"
    put(t, "valid", b"\x01")
    put(t, "valid_f32", b"\x11")
    put(t, "valid_resigned", b"\x07")
    put(t, "version", files_window(0x02, 8, [0x01]))
    put(t, "header_len", files_window(0x02, 16, [0x40]))
    put(t, "kind", files_window(0x02, 24, [0x01]))
    put(t, "rows_cols_same_dim", files_window(0x02, 28, [3 ^ 2, 0, 0, 0, 4 ^ 6]))
    put(t, "classes_up", files_window(0x02, 40, [0x02]))
    put(t, "classes_down", files_window(0x02, 40, [0x04]))
    put(t, "n_train", files_window(0x02, 56, [0x01]))
    put(t, "dataset_key", files_window(0x02, 80, [0x01]))
    put(t, "section_crc", files_window(0x00, 88, [0x01]))
    put(t, "file_records_moved", files_window(0x02, 104, [3 ^ 2] + [0] * 63 + [2 ^ 3]))
    put(t, "file_records_moved_damaged", files_window(0x02, 104, [3 ^ 2] + [0] * 63 + [2 ^ 3]) +
        bytes(4096 - 104 - 65) + b"\x01")
    put(t, "file_mtime", files_window(0x02, 104 + 16, [0x01]))
    put(t, "labels_file", files_window(0x02, 104 + 32, [0x01]))
    put(t, "names_hash", files_window(0x02, 104 + 56, [0x01]))
    put(t, "header_crc", files_window(0x00, 296, [0x01]))
    put(t, "padding", files_window(0x00, 1000, [0xff]))
    put(t, "value_byte", files_window(0x00, 4096, [0x01]))
    put(t, "value_float", files_window(0x10, 4096 + 3, [0x80]))
    put(t, "label_byte", files_window(0x00, 4096 + 84, [0x02]))
    put(t, "label_resigned", files_window(0x06, 4096 + 84, [0x02]))
    put(t, "label_over_classes", files_window(0x06, 4096 + 84, [0x40]))
    put(t, "truncated", b"\x09" + bytes(200))
    put(t, "cut_payload", files_window(0x08, 4100, []))
    put(t, "trailing", files_window(0x00, 4096 + 91, [0x01]))
    put(t, "raw_magic", b"\x00DPCACHE\x1a" + struct.pack("<I", 3) + bytes(200))


# ---- datasets of record files: byte 0 bits 0-1 the format (0 TFRecord,
# 1 an .npy pair: u16 length of x_train.npy, it, then y_train.npy; 2 CSV;
# 3 one .npz), bit 2 the test split a copy (else a fixed file of 2x2 bytes,
# or of 4 CSV features), bit 3 10 classes, bit 4 TFRecord records the
# harness frames (each a u16 length and its bytes), bits 5-7 the skip of the
# second reading.
def framed(records):
    return b"".join(struct.pack("<H", len(r)) + r for r in records)


def records_corpus():
    t = "fuzz_records"
    raw = lambda i: example([("height", "int64", [2]), ("image", "bytes", [bytes([i, i + 1, i + 2, i + 3])]),
                             ("label", "int64", [i % 10]), ("width", "int64", [2])])
    put(t, "tfrecord_raw", b"\x00" + tfrecord([raw(i) for i in range(6)]))
    put(t, "tfrecord_raw_copy_skip2", b"\x44" + tfrecord([raw(i) for i in range(6)]))
    square = example([("image", "bytes", [bytes([7, 7, 7, 7])]), ("label", "float", [3.0])])
    put(t, "tfrecord_square_float_label", b"\x08" + tfrecord([square, square]))
    digit = png(2, 2, 0, 8, [10, 20, 30, 40])
    pngs = [example([("image", "bytes", [digit]), ("label", "int64", [i])]) for i in range(3)]
    put(t, "tfrecord_png", b"\x20" + tfrecord(pngs))
    floats = [example([("image", "float", [0.5, -1, 2, i]), ("label", "int64", [1])]) for i in range(4)]
    put(t, "tfrecord_floats_copy_skip3", b"\x64" + tfrecord(floats))
    ints = [example([("image", "int64", [1, 2, 3, 4]), ("label", "int64", [0])])]
    put(t, "tfrecord_int64_copy", b"\x04" + tfrecord(ints))
    put(t, "tfrecord_bad_second", b"\x20" + tfrecord([raw(1), b"junk", raw(2)]))
    put(t, "framed_raw", b"\x10" + framed([raw(i) for i in range(5)]))
    put(t, "framed_png_copy_skip2", b"\x54" + framed(pngs))
    put(t, "framed_floats", b"\x18" + framed(floats + ints))
    put(t, "framed_mixed_png_raw", b"\x10" + framed([pngs[0], raw(3), pngs[1]]))
    wrap = example([("height", "int64", [1 << 32]), ("image", "bytes", [b"\x01\x02\x03\x04"]),
                    ("label", "int64", [1]), ("width", "int64", [1 << 32])])
    put(t, "framed_sides_wrap", b"\x10" + framed([wrap]))  # divided by 0 before the fix
    x = npy("|u1", (5, 2, 2), bytes(range(20)))
    y = npy("<i8", (5,), struct.pack("<5q", 1, 0, 2, 9, 4))
    put(t, "npy_pair", b"\x01" + struct.pack("<H", len(x)) + x + y)
    put(t, "npy_pair_copy_skip3", b"\x65" + struct.pack("<H", len(x)) + x + y)
    xf = npy("<f4", (3, 4), struct.pack("<12f", *range(12)))
    yb = npy("|u1", (3, 1), bytes([1, 2, 3]))
    put(t, "npy_floats_copy", b"\x05" + struct.pack("<H", len(xf)) + xf + yb)
    big = npy("|u1", (70000, 1), bytes(70000))[:600]  # the harness cuts it: a truncated array
    put(t, "npy_truncated", b"\x01" + struct.pack("<H", len(big)) + big + y)
    put(t, "csv", b"\x02label,a,b,c,d\n0,1,2,3,4\n1,5,6,7,8\n2,9,10,11,12\n")
    put(t, "csv_copy_skip2_crlf", b"\x46\xef\xbb\xbfa,label,c\r\n1,2,3\r\n\r\n4,5,6\r\n7,\"8\",9\r\n")
    put(t, "csv_no_header_copy", b"\x06" b"1,2,3\n\n4,5,6\n7,8,9")
    put(t, "csv_bad_row", b"\x22label,a,b,c,d\n0,1,2,3,4\n1,x,6,7,8\n2,9,10,11,12\n")
    members = [("x_train.npy", x), ("y_train.npy", y), ("x_test.npy", npy("|u1", (1, 2, 2), bytes(4))),
               ("y_test.npy", npy("<i8", (1,), struct.pack("<q", 1)))]
    put(t, "npz_stored", b"\x03" + npz(members, False))
    put(t, "npz_deflated_skip2", b"\x43" + npz(members, True))


if __name__ == "__main__":
    frame_corpus()
    tcp_corpus()
    cluster_specs()
    idx_files()
    dataset_cache()
    ps_corpus()
    ring_corpus()
    shm_corpus()
    tfrecord_corpus()
    example_corpus()
    npy_corpus()
    csv_corpus()
    dataset_files_cache()
    records_corpus()
