/* The mid-frame pause of the fault tests (stream.h; docs/faults.md,
 * "Testing"): a stream wrapper, so the live send path holds no hook.  It
 * follows the frames written through it from their headers and, in the
 * chosen frame, stops the process once enough of its payload is out, for
 * the test to kill it there. */
#include "stream.h"

#include "downpour/frame.h"
#include "downpour/testhooks.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Armed only in the task DOWNPOUR_TEST_PAUSE_TASK names (the launcher hands
 * every task the same environment), or in every task when that is unset;
 * the variables are read and checked once, by the test hooks' one reader
 * (downpour/testhooks.h). */
int dp_pause_hook_load(dp_pause_hook *h)
{
    long nth = 1;
    h->bytes = dp_hook_pause_midframe(getenv("DOWNPOUR_TASK"), &nth);
    atomic_store(&h->nth, h->bytes ? nth : 0);
    return h->bytes > 0;
}

void dp_pause_hook_progress(dp_pause_hook *h, const char *to, unsigned long long done,
                            unsigned long long len, int *counted)
{
    if (!h->bytes || len <= h->bytes)
        return;
    if (!*counted) {
        *counted = 1;
        if (atomic_fetch_sub(&h->nth, 1) != 1)
            return;
        *counted = 2; /* this frame is the one */
    }
    if (*counted != 2 || done < h->bytes)
        return;
    fprintf(stderr, "test hook: paused mid-frame to %s (%llu of %llu payload bytes sent)\n", to,
            done, len);
    fflush(stderr);
    for (;;) /* until the test kills it; SIGCONT would only stop it again */
        raise(SIGSTOP);
}

/* Payload bytes among the first w wire bytes of a frame (frame_codec.h's
 * layouts: header, then chunks with a CRC before each but the first, or
 * header and tag, then chunks each with a tag behind). */
static unsigned long long payload_at(int keyed, unsigned long long w)
{
    const unsigned long long C = DP_FRAME_CHUNK;
    if (keyed) {
        unsigned long long hl = DP_FRAME_HEADER_SIZE + DP_FRAME_TAG_SIZE;
        if (w <= hl)
            return 0;
        w -= hl;
        unsigned long long k = w / (C + DP_FRAME_TAG_SIZE), r = w % (C + DP_FRAME_TAG_SIZE);
        return k * C + (r < C ? r : C);
    }
    if (w <= DP_FRAME_HEADER_SIZE)
        return 0;
    w -= DP_FRAME_HEADER_SIZE;
    if (w <= C)
        return w;
    w -= C;
    unsigned long long k = w / (C + 4), r = w % (C + 4);
    return C + k * C + (r > 4 ? r - 4 : 0);
}

static ssize_t pause_read(dp_stream *bs, void *dst, size_t len, int wait, dp_err *err)
{
    dp_stream_pause *p = (dp_stream_pause *)bs;
    return dp_stream_read(p->inner, dst, len, wait, err);
}

static int pause_stalled(dp_stream *bs, double *secs)
{
    dp_stream_pause *p = (dp_stream_pause *)bs;
    return dp_stream_stalled(p->inner, secs);
}

static void pause_close(dp_stream *bs)
{
    dp_stream_pause *p = (dp_stream_pause *)bs;
    dp_stream_close(p->inner);
}

/* Follows the bytes of v (before the inner write consumes v): a new frame's
 * header gives its length and wire size. */
static void follow(dp_stream_pause *p, const struct iovec *v, int n)
{
    for (int i = 0; i < n; i++) {
        const unsigned char *b = v[i].iov_base;
        size_t len = v[i].iov_len;
        while (len) {
            if (p->wire_left == 0) { /* a header starts */
                size_t take = sizeof p->hdr - p->hdr_have;
                take = take < len ? take : len;
                memcpy(p->hdr + p->hdr_have, b, take);
                p->hdr_have += take;
                b += take;
                len -= take;
                if (p->hdr_have < sizeof p->hdr)
                    continue;
                p->hdr_have = 0;
                p->len = dp_get_u64(p->hdr + 32); /* length, frame.h's offset table */
                p->wire_done = DP_FRAME_HEADER_SIZE;
                p->wire_left = (p->keyed ? dp_frame_wire_size_mac(p->len)
                                         : dp_frame_wire_size(p->len)) -
                               DP_FRAME_HEADER_SIZE;
                p->counted = 0;
                continue;
            }
            size_t take = len < p->wire_left ? len : (size_t)p->wire_left;
            p->wire_left -= take;
            p->wire_done += take;
            b += take;
            len -= take;
        }
    }
}

static int pause_writev(dp_stream *bs, struct iovec *v, int n, dp_err *err)
{
    dp_stream_pause *p = (dp_stream_pause *)bs;
    follow(p, v, n);
    if (dp_stream_writev(p->inner, v, n, err))
        return -1;
    if (p->wire_left) /* the frame is cut here for now */
        dp_pause_hook_progress(p->hook, p->to, payload_at(p->keyed, p->wire_done), p->len,
                               &p->counted);
    return 0;
}

static const dp_stream_ops pause_ops = {pause_read, pause_writev, pause_stalled, pause_close};

void dp_stream_pause_init(dp_stream_pause *p, dp_stream *inner, dp_pause_hook *hook,
                          const char *to, int keyed)
{
    memset(p, 0, sizeof *p);
    p->base.ops = &pause_ops;
    p->inner = inner;
    p->hook = hook;
    p->to = to;
    p->keyed = keyed;
}
