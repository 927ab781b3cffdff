/* libFuzzer target for the all-reduce's messages (src/strategy/ring.c, and
 * src/strategy/reducer.c above it): rank 1 of a ring of 3 or 4 in-process
 * endpoints runs a real all-reduce (or a reducer's buckets, threaded or not),
 * while everything it receives from its ring predecessor (rank 0) is decoded
 * from the fuzz bytes: the segments it expects, with their payload floats
 * from the input, segments with one header field changed, frames of any
 * type, segments left out, and a crash or a cut of the predecessor.  The
 * predecessor always crashes after its last frame, so the all-reduce either
 * completes or fails at once, with a message; never a crash, an
 * out-of-bounds write, a leak or a hang.
 *
 * Input: byte 0 bit 0 the ring size (3 or 4), bits 1-7 the floats (1..128);
 * byte 1 bits 0-3 the segment (1..16 floats), bit 4 through a reducer, bit 5
 * its thread; byte 2 the reducer's bucket (1..48 floats); then one operation
 * per byte (the switch below). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "downpour/inproc.h"
#include "downpour/log.h"
#include "downpour/reducer.h"
#include "downpour/ring.h"
#include "downpour/wire.h"
#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define STEP 7
#define MAX_SEGS 1024

typedef struct seg {
    uint64_t offset; /* element offset within the bucket's buffer */
    size_t count;    /* floats */
} seg;

static size_t chunk_lo(size_t len, int n, int c) { return (size_t)((uint64_t)len * (unsigned)c / (unsigned)n); }

/* What position p of an n-ring receives from its predecessor during one
 * all-reduce of len floats in segments of sg, in order (ring.c's schedule). */
static int expect(seg *out, int k, size_t len, int n, int p, size_t sg)
{
    for (int phase = 0; phase < 2; phase++)
        for (int s = 0; s < n - 1; s++) {
            int in = phase == 0 ? (p - s - 1 + 2 * n) % n : (p - s + n) % n;
            for (size_t i = chunk_lo(len, n, in), hi = chunk_lo(len, n, in + 1); i < hi;) {
                size_t c = hi - i < sg ? hi - i : sg;
                if (k < MAX_SEGS)
                    out[k++] = (seg){i, c};
                i += c;
            }
        }
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        dp_log_set_level(DP_LOG_ERROR);
        quiet = 1;
    }
    if (size < 3 || size > 8192)
        return 0;
    fz_in in = {data, size, 0};
    uint8_t b0 = fz_u8(&in), b1 = fz_u8(&in), b2 = fz_u8(&in);
    int n = 3 + (b0 & 1);
    size_t len = 1 + (b0 >> 1);
    size_t sg = 1 + (b1 & 15);
    int use_reducer = (b1 >> 4) & 1, overlap = (b1 >> 5) & 1;
    size_t bucket = 1 + b2 % 48;

    static seg exp[MAX_SEGS];
    int n_exp = 0;
    if (use_reducer) /* buckets from the end, each its own all-reduce */
        for (size_t hi = len; hi > 0; hi = hi > bucket ? hi - bucket : 0)
            n_exp = expect(exp, n_exp, hi - (hi > bucket ? hi - bucket : 0), n, 1, sg);
    else
        n_exp = expect(exp, 0, len, n, 1, sg);

    dp_transport *ts[4];
    dp_err err;
    if (dp_inproc_open(ts, n, &err) != 0)
        abort();
    dp_transport *prev = ts[0];
    int cursor = 0, killed = 0;
    float pay[64];
    while (fz_left(&in) > 0 && !killed) {
        uint8_t o = fz_u8(&in);
        switch (o & 7) {
        case 0: case 1: case 2: /* the next segment, as expected */
            if (cursor < n_exp) {
                fz_bytes(&in, pay, exp[cursor].count * sizeof(float));
                (void)dp_transport_send(prev, 1, DP_WIRE_RING, STEP, exp[cursor].offset, pay,
                                        exp[cursor].count * sizeof(float), &err);
                cursor++;
            }
            break;
        case 3: { /* the next segment with one field changed */
            seg e = cursor < n_exp ? exp[cursor++] : (seg){0, 1};
            unsigned type = DP_WIRE_RING;
            uint64_t step = STEP, offset = e.offset;
            size_t bytes = e.count * sizeof(float);
            int8_t d = (int8_t)fz_u8(&in);
            switch ((o >> 3) & 3) {
            case 0: type = DP_FRAME_APP_FIRST + (uint8_t)(type - DP_FRAME_APP_FIRST + d) % 240; break;
            case 1: step = (uint64_t)((int64_t)step + d); break;
            case 2: offset = (uint64_t)((int64_t)offset + d); break;
            default: bytes = (size_t)((int)bytes + d) % sizeof pay; break;
            }
            fz_bytes(&in, pay, bytes);
            (void)dp_transport_send(prev, 1, type, step, offset, pay, bytes, &err);
            break;
        }
        case 4: { /* a frame from a rank that is not the predecessor */
            int from = 2 + (o >> 3) % (n - 2);
            size_t bytes = fz_u8(&in) % sizeof pay;
            fz_bytes(&in, pay, bytes);
            (void)dp_transport_send(ts[from], 1, DP_WIRE_RING, STEP, fz_u8(&in), pay, bytes, &err);
            break;
        }
        case 5: /* a segment left out */
            cursor++;
            break;
        case 6: { /* any frame from the predecessor */
            unsigned type = DP_FRAME_APP_FIRST + fz_u8(&in) % (DP_FRAME_COUNT - DP_FRAME_APP_FIRST);
            uint64_t step = fz_u8(&in), offset = fz_u8(&in);
            size_t bytes = fz_u8(&in) % sizeof pay;
            fz_bytes(&in, pay, bytes);
            (void)dp_transport_send(prev, 1, type, step, offset, pay, bytes, &err);
            break;
        }
        default: /* the predecessor goes down now */
            (void)dp_inproc_kill(prev, (o >> 3) & 1 ? DP_INPROC_CUT : DP_INPROC_CRASH, &err);
            killed = 1;
            break;
        }
    }
    if (!killed) /* after its last frame, so nothing is ever waited for */
        (void)dp_inproc_kill(prev, DP_INPROC_CRASH, &err);

    int ranks[4] = {0, 1, 2, 3};
    float buf[128];
    for (size_t i = 0; i < len; i++)
        buf[i] = (float)i;
    dp_ring ring;
    if (dp_ring_init(&ring, ts[1], ranks, n, 5.0, sg * sizeof(float), &err) != 0)
        abort();
    int rc;
    err.msg[0] = '\0';
    if (use_reducer) {
        dp_reducer *red;
        dp_overlap mode = overlap ? DP_OVERLAP_ON : DP_OVERLAP_OFF;
        if (dp_reducer_open(&red, &ring, buf, len, bucket * sizeof(float), mode, 1, &err) != 0)
            abort();
        dp_reducer_begin(red, STEP, 0.5f);
        dp_reducer_ready(red, len / 2);
        dp_reducer_ready(red, 0);
        rc = dp_reducer_finish(red, &err);
        dp_reducer_close(red);
    } else {
        rc = dp_ring_allreduce(&ring, buf, len, STEP, 0, &err);
    }
    if (rc != 0 && ((rc != -1 && rc != DP_RING_BROKEN) || err.msg[0] == '\0'))
        abort(); /* a failure (or a broken ring) says why */
    dp_ring_free(&ring);
    for (int i = 0; i < n; i++)
        dp_transport_close(ts[i]);
    return 0;
}
