/* A byte stream: what the frame codec (frame_codec.h) reads and writes,
 * whatever carries the bytes.  An opaque handle with a table of operations,
 * as nng's nng_stream, so the codec never sees a connection, a socket or a
 * test hook: the socket stream (stream_socket.c), and the mid-frame pause
 * of the fault tests (stream_pause.c) wrapped around it, fill the table.
 * The stream does not own the bytes' meaning; the caller serialises writes
 * (one frame at a time) and reads (one receiving thread). */
#ifndef DOWNPOUR_NET_STREAM_H
#define DOWNPOUR_NET_STREAM_H

#include "downpour/status.h"

#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct dp_stream dp_stream;

/* read's results besides a byte count (> 0) */
enum {
    DP_STREAM_NONE = 0,  /* nothing within the wait (or now, without one) */
    DP_STREAM_ERR = -1,  /* failed: err says why */
    DP_STREAM_EOF = -2,  /* the other end closed its side */
};

typedef struct dp_stream_ops {
    /* Up to len (> 0) bytes into dst.  wait: block up to the stream's slice
     * (a socket's receive timeout); else only what is there now. */
    ssize_t (*read)(dp_stream *s, void *dst, size_t len, int wait, dp_err *err);
    /* All of v[0..n) (v is consumed), waiting for room while the other end
     * is alive.  0, or -1 with err. */
    int (*writev)(dp_stream *s, struct iovec *v, int n, dp_err *err);
    /* After a read that waited a whole slice for nothing: has the other end
     * been silent too long?  1 (seconds in *secs) or 0. */
    int (*stalled)(dp_stream *s, double *secs);
    /* Releases what the stream holds (a socket stream closes its fd). */
    void (*close)(dp_stream *s);
} dp_stream_ops;

struct dp_stream {
    const dp_stream_ops *ops;
};

static inline ssize_t dp_stream_read(dp_stream *s, void *dst, size_t len, int wait, dp_err *err)
{
    return s->ops->read(s, dst, len, wait, err);
}
static inline int dp_stream_writev(dp_stream *s, struct iovec *v, int n, dp_err *err)
{
    return s->ops->writev(s, v, n, err);
}
static inline int dp_stream_stalled(dp_stream *s, double *secs)
{
    return s->ops->stalled(s, secs);
}
static inline void dp_stream_close(dp_stream *s)
{
    if (s && s->ops->close)
        s->ops->close(s);
}

/* ---- the socket stream (stream_socket.c) ----
 * A connected blocking socket whose SO_RCVTIMEO/SO_SNDTIMEO are the slice.
 * silent (may be NULL: never) answers "has the peer been silent too long"
 * for stalled and for a write that waits on a full send buffer. */
typedef int (*dp_stream_silent_fn)(void *ctx, double *secs);

typedef struct dp_stream_socket {
    dp_stream base;
    int fd;
    dp_stream_silent_fn silent;
    void *ctx;
} dp_stream_socket;

void dp_stream_socket_init(dp_stream_socket *s, int fd, dp_stream_silent_fn silent, void *ctx);

/* ---- the mid-frame pause (stream_pause.c), a test hook ----
 * docs/faults.md, "Testing": DOWNPOUR_TEST_PAUSE_MIDFRAME=BYTES (and
 * DOWNPOUR_TEST_PAUSE_FRAME, DOWNPOUR_TEST_PAUSE_TASK) stop the process with
 * SIGSTOP once BYTES of the chosen frame's payload are written.  Read once
 * by dp_pause_hook_load at open; the transport then wraps each connection's
 * stream in a dp_stream_pause, so the live send path holds no hook. */
typedef struct dp_pause_hook {
    unsigned long long bytes; /* 0: off */
    _Atomic long nth;         /* frames larger than bytes still to pass (all connections) */
} dp_pause_hook;

/* Fills h from the environment; returns 1 when the hook is armed here. */
int dp_pause_hook_load(dp_pause_hook *h);
/* Called with a frame's payload progress (done of len bytes, done < len):
 * stops the process in the chosen frame.  *counted starts at 0 per frame.
 * For paths that write frames without a stream (the shared-memory rings). */
void dp_pause_hook_progress(dp_pause_hook *h, const char *to, unsigned long long done,
                            unsigned long long len, int *counted);

/* A stream that passes everything to inner and follows the frames written
 * through it (headers decoded, keyed or not), calling the hook after each
 * write that leaves a frame unfinished. */
typedef struct dp_stream_pause {
    dp_stream base;
    dp_stream *inner;
    dp_pause_hook *hook;
    const char *to; /* the peer's name, for the log line */
    int keyed;
    unsigned long long wire_left, wire_done, len; /* the frame being written */
    unsigned char hdr[48];
    size_t hdr_have;
    int counted;
} dp_stream_pause;

void dp_stream_pause_init(dp_stream_pause *p, dp_stream *inner, dp_pause_hook *hook,
                          const char *to, int keyed);

#endif
