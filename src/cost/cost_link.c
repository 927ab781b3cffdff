/* The cost model's link measurement on loopback: plain TCP between two
 * threads, the bound the framed transport reaches 90-98 % of
 * (docs/benchmarks.md, "The transport"). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "downpour/clock.h"
#include "downpour/cost_model.h"

#define STREAM_BYTES ((size_t)64 << 20)
#define WRITE_BYTES ((size_t)1 << 20)
#define PINGS 2000

typedef struct peer {
    int fd;
    int ok;
} peer;

static int read_full(int fd, char *p, size_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The far end: drains the stream, then echoes the pings. */
static void *far_end(void *arg)
{
    peer *p = arg;
    char *buf = malloc(WRITE_BYTES);
    p->ok = 0;
    if (!buf)
        return NULL;
    size_t left = STREAM_BYTES;
    while (left > 0) {
        ssize_t r = read(p->fd, buf, left < WRITE_BYTES ? left : WRITE_BYTES);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            goto out;
        left -= (size_t)r;
    }
    if (write_full(p->fd, buf, 1) < 0) /* the stream's end, acknowledged */
        goto out;
    for (int i = 0; i < PINGS; i++)
        if (read_full(p->fd, buf, 64) < 0 || write_full(p->fd, buf, 64) < 0)
            goto out;
    p->ok = 1;
out:
    free(buf);
    return NULL;
}

int dp_cost_measure_loopback(double *bytes_per_s, double *latency_s, dp_err *err)
{
    int lfd = -1, a = -1, rc = -1;
    peer far = {-1, 0};
    char *buf = calloc(1, WRITE_BYTES);
    if (!buf)
        return dp_errf(err, "out of memory");
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof addr;
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 1) < 0 ||
        getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0) {
        dp_errf(err, "loopback measurement: listening on 127.0.0.1: %s", strerror(errno));
        goto out;
    }
    a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (a < 0 || connect(a, (struct sockaddr *)&addr, sizeof addr) < 0) {
        dp_errf(err, "loopback measurement: connecting to 127.0.0.1: %s", strerror(errno));
        goto out;
    }
    far.fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (far.fd < 0) {
        dp_errf(err, "loopback measurement: accept: %s", strerror(errno));
        goto out;
    }
    int one = 1;
    setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(far.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t th;
    if (pthread_create(&th, NULL, far_end, &far) != 0) {
        dp_errf(err, "loopback measurement: cannot start a thread");
        goto out;
    }
    double t0 = dp_now();
    int bad = 0;
    for (size_t sent = 0; !bad && sent < STREAM_BYTES; sent += WRITE_BYTES)
        bad = write_full(a, buf, WRITE_BYTES) < 0;
    bad = bad || read_full(a, buf, 1) < 0;
    double t1 = dp_now();
    for (int i = 0; !bad && i < PINGS; i++)
        bad = write_full(a, buf, 64) < 0 || read_full(a, buf, 64) < 0;
    double t2 = dp_now();
    shutdown(a, SHUT_RDWR);
    pthread_join(th, NULL);
    if (bad || !far.ok) {
        dp_errf(err, "loopback measurement: the transfer broke off: %s", strerror(errno));
        goto out;
    }
    *bytes_per_s = (double)STREAM_BYTES / (t1 - t0);
    *latency_s = (t2 - t1) / PINGS / 2.0;
    rc = 0;
out:
    if (a >= 0)
        close(a);
    if (far.fd >= 0)
        close(far.fd);
    if (lfd >= 0)
        close(lfd);
    free(buf);
    return rc;
}
