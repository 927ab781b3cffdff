/* The socket stream (stream.h): a connected blocking socket whose send and
 * receive timeouts are the transport's slice, so no wait outlasts a
 * liveness check.  A frame then costs one system call each way. */
#include "stream.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static ssize_t sock_read(dp_stream *bs, void *dst, size_t len, int wait, dp_err *err)
{
    dp_stream_socket *s = (dp_stream_socket *)bs;
    for (;;) {
        ssize_t n = recv(s->fd, dst, len, wait ? 0 : MSG_DONTWAIT);
        if (n > 0)
            return n;
        if (n == 0)
            return DP_STREAM_EOF;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return DP_STREAM_NONE;
        dp_errf(err, "%s", strerror(errno));
        return DP_STREAM_ERR;
    }
}

static int sock_stalled(dp_stream *bs, double *secs)
{
    dp_stream_socket *s = (dp_stream_socket *)bs;
    *secs = 0;
    return s->silent ? s->silent(s->ctx, secs) : 0;
}

static int sock_writev(dp_stream *bs, struct iovec *v, int n, dp_err *err)
{
    dp_stream_socket *s = (dp_stream_socket *)bs;
    while (n > 0) {
        ssize_t w;
        if (n == 1) {
            w = send(s->fd, v->iov_base, v->iov_len, MSG_NOSIGNAL);
        } else {
            struct msghdr m = {0};
            m.msg_iov = v;
            m.msg_iovlen = (size_t)n;
            w = sendmsg(s->fd, &m, MSG_NOSIGNAL);
        }
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return dp_errf(err, "%s", strerror(errno));
            /* The send timeout (one slice) expired: is the peer still there? */
            double silent;
            if (sock_stalled(bs, &silent))
                return dp_errf(err, "peer stopped reading and has been silent for %.1f s",
                               silent);
            continue;
        }
        size_t done = (size_t)w;
        while (n > 0 && done >= v->iov_len) {
            done -= v->iov_len;
            v++;
            n--;
        }
        if (n > 0) {
            v->iov_base = (char *)v->iov_base + done;
            v->iov_len -= done;
        }
    }
    return 0;
}

static void sock_close(dp_stream *bs)
{
    dp_stream_socket *s = (dp_stream_socket *)bs;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

static const dp_stream_ops sock_ops = {sock_read, sock_writev, sock_stalled, sock_close};

void dp_stream_socket_init(dp_stream_socket *s, int fd, dp_stream_silent_fn silent, void *ctx)
{
    s->base.ops = &sock_ops;
    s->fd = fd;
    s->silent = silent;
    s->ctx = ctx;
}
