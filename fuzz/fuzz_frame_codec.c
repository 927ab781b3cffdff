/* libFuzzer target for the chunked frame codec (src/net/frame_codec.h)
 * over an in-memory stream (stream.h): any bytes, read as frames by a CRC,
 * keyed or encrypting receiver in pieces of any size, must give frames or a
 * named failure without crashing, reading out of bounds or sizing anything
 * from a length; and the input's tail, sent as a payload through a sender
 * and read back by a receiver of the same kind, must come back unchanged. */
#include "net/frame_codec.h"
#include "net/stream.h"

#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A stream over a buffer: reads hand out at most `piece` bytes (then EOF),
 * writes append (bounded). */
typedef struct mem {
    dp_stream base;
    const uint8_t *in;
    size_t in_len, in_pos, piece;
    uint8_t *out;
    size_t out_len, out_cap;
} mem;

static ssize_t mem_read(dp_stream *s, void *dst, size_t len, int wait, dp_err *err)
{
    mem *m = (mem *)s;
    (void)wait;
    (void)err;
    if (m->in_pos == m->in_len)
        return DP_STREAM_EOF;
    size_t n = m->in_len - m->in_pos;
    n = n < len ? n : len;
    n = n < m->piece ? n : m->piece;
    memcpy(dst, m->in + m->in_pos, n);
    m->in_pos += n;
    return (ssize_t)n;
}

static int mem_writev(dp_stream *s, struct iovec *v, int n, dp_err *err)
{
    mem *m = (mem *)s;
    for (int i = 0; i < n; i++) {
        if (v[i].iov_len > m->out_cap - m->out_len)
            return dp_errf(err, "full");
        memcpy(m->out + m->out_len, v[i].iov_base, v[i].iov_len);
        m->out_len += v[i].iov_len;
    }
    return 0;
}

static int mem_stalled(dp_stream *s, double *secs)
{
    (void)s;
    *secs = 0;
    return 1;
}

static const dp_stream_ops mem_ops = {mem_read, mem_writev, mem_stalled, NULL};

static const unsigned char key_a[32] = {1}, key_b[32] = {2};

/* Reads every frame of in (pieces of piece bytes) with a receiver of mode,
 * each payload in reads of step bytes; returns the last kind. */
static int drain(int mode, uint64_t max, const uint8_t *in, size_t len, size_t piece, size_t step,
                 uint8_t *sink, size_t sink_cap, uint8_t *got, size_t *got_len)
{
    dp_codec_stats st = {0};
    dp_codec c;
    dp_err why;
    if (dp_codec_init(&c, mode != 0, mode == 2, max, 0, "peer", &st, &why))
        abort(); /* out of memory: not the input's doing */
    dp_codec_key(&c, DP_FMAC_CHACHA, key_b, key_a, mode == 2, 0);
    mem m = {{&mem_ops}, in, len, 0, piece, NULL, 0, 0};
    int k;
    dp_frame_header h;
    if (got_len)
        *got_len = 0;
    for (;;) {
        k = dp_codec_next(&c, &m.base, 1, &h, &why);
        if (k != DP_CODEC_FRAME)
            break;
        if (h.length > max)
            abort(); /* refused from the header, before any read */
        k = 0;
        while (c.pay_pending) {
            size_t n = c.pay_left < step ? (size_t)c.pay_left : step;
            uint8_t *dst = sink;
            if (got && *got_len + n <= sink_cap)
                dst = got + *got_len;
            k = dp_codec_read(&c, &m.base, dst, n, &why);
            if (k != 0)
                break;
            if (got && dst != sink)
                *got_len += n;
        }
        if (k != 0)
            break;
    }
    if (k != DP_CODEC_NONE && k != DP_CODEC_BYE && (why.msg[0] == '\0'))
        abort(); /* every failure gives a reason */
    dp_codec_free(&c);
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        if (sodium_init() < 0)
            abort();
        ready = 1;
    }
    if (size < 4)
        return 0;
    int mode = data[0] % 3;                      /* CRC, MAC, MAC+encrypt */
    uint64_t max = (uint64_t)1 << (data[1] % 24); /* the receiver's bound */
    size_t piece = 1 + data[2] % 97, step = 1 + (size_t)data[3] * 37;
    data += 4;
    size_t len = size - 4;
    static uint8_t sink[1 << 16];
    drain(mode, max, data, len, piece, step, sink, sizeof sink, NULL, NULL);

    /* The input as a payload: sent, then read back the same. */
    dp_codec_stats st = {0};
    dp_codec tx;
    dp_err err;
    if (dp_codec_init(&tx, mode != 0, mode == 2, DP_FRAME_MAX_DEFAULT, 1, "me", &st, &err))
        abort();
    dp_codec_key(&tx, DP_FMAC_CHACHA, key_a, key_b, mode == 2, 0);
    size_t cap = (size_t)dp_frame_wire_size_mac(len) + 64;
    uint8_t *wire = malloc(cap), *back = malloc(len + 1);
    if (!wire || !back)
        abort();
    mem m = {{&mem_ops}, NULL, 0, 0, 1, wire, 0, cap};
    dp_frame_header h = {0};
    h.type = DP_FRAME_APP(2);
    struct iovec v[2] = {{(void *)data, len / 2}, {(void *)(data + len / 2), len - len / 2}};
    int nv = 0;
    struct iovec use[2];
    for (int i = 0; i < 2; i++)
        if (v[i].iov_len)
            use[nv++] = v[i];
    if (dp_codec_send(&tx, &m.base, 0, &h, use, nv, len, &err))
        abort();
    if (m.out_len != (mode ? dp_frame_wire_size_mac(len) : dp_frame_wire_size(len)))
        abort();
    size_t got = 0;
    int k = drain(mode, DP_FRAME_MAX_DEFAULT, wire, m.out_len, piece, step, sink, len, back, &got);
    if (k != DP_CODEC_NONE && k != DP_CODEC_END) /* END: the stream's end after the frame */
        abort();
    if (got != len || memcmp(back, data, len) != 0)
        abort();
    dp_codec_free(&tx);
    free(wire);
    free(back);
    return 0;
}
